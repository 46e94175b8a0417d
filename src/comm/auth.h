/*
 * auth.h - the run token, and the handshake that starts every connection of
 * a run (rendezvous store, data transports, elastic controller and agents).
 *
 * The token is a secret shared by the processes of one run. It comes from a
 * file (SLICETRAIN_TOKEN_FILE: the path of a file readable by its owner
 * only, holding the token; surrounding whitespace ignored) or, second, from
 * the environment (SLICETRAIN_TOKEN). It never crosses the wire, never
 * appears on a command line or in a log line. Tokens shorter than 16 bytes
 * or longer than 4096 are refused. The key is SHA-256 of the token.
 *
 * Handshake (mutual, HMAC-SHA256 over fresh nonces from both sides, so that
 * a captured exchange cannot be replayed), fixed-size messages:
 *   server -> client  "STA1" | ns (32 random bytes)                 36 bytes
 *   client -> server  "STA1" | nc (32) | HMAC(key, "c" | ns | nc)    68 bytes
 *   server -> client  HMAC(key, "s" | ns | nc)                      32 bytes
 * The server drops a client whose proof is wrong (and logs it, once per
 * peer address and reason); the client refuses a server whose proof is
 * wrong. MAC comparisons are constant-time.
 *
 * Without a token (st_token.set == 0) the handshake still runs, with a key
 * of zeros: it then proves nothing, and a group refuses to listen on any
 * address but loopback (st_auth_check_bind).
 *
 * Blocking use (a client, or a server thread that may block):
 *   rc = st_auth_client(fd, &tok, deadline);   // 0, or ST_EAUTH / ST_EPEER
 *   rc = st_auth_server(fd, &tok, deadline);
 * Non-blocking use (a server's poll loop): st_auth_srv_start fills the first
 * message; st_auth_srv_feed takes the client's bytes as they come and, once
 * it has all 68, verifies them and fills the answer (see below).
 */
#ifndef ST_COMM_AUTH_H
#define ST_COMM_AUTH_H

#include <stddef.h>
#include <stdint.h>

enum { ST_AUTH_KEY = 32, ST_AUTH_NONCE = 32, ST_AUTH_MAC = 32,
       ST_AUTH_HELLO = 4 + ST_AUTH_NONCE,                  /* 36: server's first message */
       ST_AUTH_PROOF = 4 + ST_AUTH_NONCE + ST_AUTH_MAC,    /* 68: client's answer */
       ST_AUTH_MIN_TOKEN = 16, ST_AUTH_MAX_TOKEN = 4096 };

typedef struct st_token {
	int set;                          /* 0: no token (loopback only) */
	uint8_t key[ST_AUTH_KEY];         /* SHA-256 of the token */
	char source[64];                  /* "SLICETRAIN_TOKEN_FILE", "SLICETRAIN_TOKEN" or "none" (for messages) */
} st_token;

/* Load the run's token (SLICETRAIN_TOKEN_FILE, else SLICETRAIN_TOKEN, else
 * none: set = 0 and 0 returned). ST_EINVAL: the file is unreadable, readable
 * by group or others, or the token is too short or too long. */
int st_token_load(st_token *t);

/* 0 when listening on host is allowed: a loopback address (127.0.0.0/8,
 * ::1, "localhost"), or any address when the token is set. Else ST_EINVAL
 * with a message naming the address and saying why. */
int st_auth_check_bind(const st_token *t, const char *host);

/* Blocking handshakes on a connected socket, bounded by deadline
 * (CLOCK_MONOTONIC ns). 0; ST_EAUTH: the peer's proof is wrong; ST_EPEER:
 * the peer closed, sent garbage or the deadline passed. */
int st_auth_client(int fd, const st_token *t, int64_t deadline);
int st_auth_server(int fd, const st_token *t, int64_t deadline);

/* The server side as a state machine, for poll loops. */
typedef struct st_auth_srv {
	uint8_t ns[ST_AUTH_NONCE];
	uint8_t in[ST_AUTH_PROOF];
	size_t have;
	int done;                         /* 1 once the proof was accepted */
} st_auth_srv;
/* A new connection: fresh nonce; out (ST_AUTH_HELLO bytes) is what to send. */
int st_auth_srv_start(st_auth_srv *a, uint8_t out[ST_AUTH_HELLO]);
/* Bytes from the client. Takes at most what completes the proof (*used);
 * returns 0 while more is needed, 1 when the proof is complete and right
 * (out, ST_AUTH_MAC bytes, is then the answer to send; bytes after the
 * proof are the protocol's own), ST_EAUTH when it is wrong. */
int st_auth_srv_feed(st_auth_srv *a, const st_token *t, const uint8_t *in, size_t n, size_t *used,
		     uint8_t out[ST_AUTH_MAC]);

#endif
