/*
 * frame.h - what the worker group's peers send each other outside the
 * collectives' payload, as pure functions (no sockets, no group): the
 * 40-byte frames of control connections and connection hellos, and the
 * acceptor's side of a new connection (the run token's handshake on TCP,
 * then the hello). group.c drives them from its monitor thread;
 * fuzz/fuzz_frame.c feeds them bytes. Host byte order (little-endian hosts
 * only, like the rest of the group protocol).
 *
 * A connection to a process's listener:
 *   TCP:  handshake (comm/auth.h), then a hello frame: F_HELLO_CTRL (a
 *         control connection from a higher rank on another host) or
 *         F_HELLO_DATA (a communicator's data connection; raw collective
 *         bytes follow, which the acceptor never reads here).
 *   unix: (same host; the acceptor checked SO_PEERCRED: the run's own user)
 *         a hello frame F_HELLO_CTRL; frames follow, F_FD ones with a memfd.
 * A hello is accepted when its magic, generation and group nonce are right,
 * its rank is another member, and it carries that member's pid (from its
 * endpoint). Every frame carries the generation: one of another (a worker
 * of an older generation, come back after a partition) is refused.
 */
#ifndef ST_COMM_FRAME_H
#define ST_COMM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "comm/auth.h"

enum { ST_FRAME_MAGIC = 0x53544331u /* "STC1" */ };
enum {
	F_HELLO_CTRL = 1, /* first frame of a control connection; aux = sender's pid */
	F_HELLO_DATA = 2, /* first frame of a communicator's data connection; key = comm key, aux = pid */
	F_HB = 3,         /* heartbeat */
	F_BYE = 4,        /* leaving normally */
	F_ABORT = 5,      /* my group failed: aux = reason, key = failed rank */
	F_FD = 6,         /* carries a memfd (SCM_RIGHTS); key = comm key */
};
typedef struct st_frame {
	uint32_t magic, type;
	int32_t rank;   /* sender */
	uint32_t aux;
	uint64_t nonce; /* group nonce */
	uint64_t key;
	uint64_t gen;   /* the group's elastic generation (0: not elastic) */
} st_frame;
_Static_assert(sizeof(st_frame) == 40, "frames are 40 bytes on the wire");

/* A frame from exactly sizeof(st_frame) bytes. 0, or -1 with *why (a
 * static string): wrong size or magic. */
int st_frame_decode(const uint8_t *b, size_t n, st_frame *f, const char **why);

/* What a member knows to judge a hello. */
typedef struct st_hello_rules {
	int self, size;      /* this process's rank, the group's size */
	uint64_t nonce;      /* the group's nonce */
	uint64_t gen;        /* the group's generation (0: not elastic) */
	/* the pid that rank r published (r in [0, size)) */
	int32_t (*pid_of)(const void *ctx, int r);
	const void *ctx;
} st_hello_rules;
/* F_HELLO_CTRL or F_HELLO_DATA when f is an acceptable hello on a unix
 * (is_unix) or TCP connection; else -1 with *why: wrong magic, an older
 * or newer generation, another group's nonce,
 * rank out of range or this process's, a pid that is not that rank's, a
 * control hello from a lower rank (the higher rank connects), a data hello
 * on a unix socket, not a hello. */
int st_hello_check(const st_hello_rules *r, const st_frame *f, int is_unix, const char **why);

/* A frame on rank from's control connection: its type (F_HB, F_BYE,
 * F_ABORT, F_FD; a hello type; 0 for an unknown type, to ignore), or -1
 * with *why when the magic, generation, nonce or sender is wrong (the
 * connection is then dropped). For F_ABORT, *abort_reason and *abort_rank say what
 * failed: the frame's own when valid (reason 1..max_reason, rank < size),
 * else (0, from). */
int st_ctrl_frame_check(const st_frame *f, uint64_t nonce, uint64_t gen, int from, int size, int max_reason,
			int *abort_reason, int *abort_rank, const char **why);

/* The acceptor's side of a new connection until its hello. */
typedef struct st_accept {
	int need_auth;       /* TCP: the token's handshake comes first */
	st_auth_srv auth;
	uint8_t buf[sizeof(st_frame)];
	size_t n;
} st_accept;
enum { ST_ACCEPT_MORE = 0, ST_ACCEPT_ANSWER = 1, ST_ACCEPT_HELLO = 2 };
/* Start: with need_auth, hello (ST_AUTH_HELLO bytes) is what to send first.
 * 0, or ST_EIO without randomness. */
int st_accept_start(st_accept *a, int need_auth, uint8_t hello[ST_AUTH_HELLO]);
/* How many bytes to read next: never more than completes the proof or the
 * hello, so that what follows stays in the socket for its owner. */
size_t st_accept_want(const st_accept *a);
/* Bytes from the peer (n may be 0); takes what it needs (*used). Returns
 * ST_ACCEPT_MORE (more bytes needed), ST_ACCEPT_ANSWER (the proof is right:
 * send answer, ST_AUTH_MAC bytes, then go on with the rest), ST_ACCEPT_HELLO
 * (*f is the hello frame, decoded but not judged: st_hello_check), or
 * ST_EAUTH with a message (a wrong proof: drop the connection). */
int st_accept_feed(st_accept *a, const st_token *t, const uint8_t *in, size_t n, size_t *used,
		   uint8_t answer[ST_AUTH_MAC], st_frame *f);

#endif
