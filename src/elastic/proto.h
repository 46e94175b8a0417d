/*
 * proto.h - the elastic layer's wire protocol: controller <-> agents (and
 * `slicetrain nodes` -> controller).
 *
 * One controller per run; one agent per host. An agent connects to the
 * controller over TCP, says which slice and host it is and how many devices
 * it drives, then starts and stops its host's worker processes
 * (`slicetrain train ...`) when the controller says so, and reports what
 * happens to them. Everything works across machines; on one machine
 * everything listens on loopback.
 *
 * Framing: one JSON object per line ("\n"-terminated, UTF-8), at most
 * ST_PROTO_MAX_LINE bytes including the newline. Every object has a string
 * "type". A peer that sends a longer line, invalid JSON, a non-object, an
 * unknown "type", a missing field or a field of the wrong type is dropped
 * and logged (never a crash, never an unbounded allocation).
 *
 * Authentication: every connection starts with the run token's handshake
 * (comm/auth.h: the controller's 36-byte hello, the client's 68-byte proof,
 * the controller's 32-byte answer), before any line. A client whose proof
 * is wrong, or that does not complete it within the controller's hello
 * timeout, is dropped and logged; a client refuses a controller whose
 * answer is wrong.
 *
 * agent -> controller
 *   {"type":"hello","version":2,"slice":S,"host":H,"hosts_per_slice":N,
 *    "devices":D,"pid":P,"addr":"A","port":Q,"build":"B","release":"V"}
 *                                            first message; D devices on this host, whose
 *                                            processes bind address A; Q a port free there
 *                                            (the coordinator's when the host holds rank 0);
 *                                            B the workers' build id (base/version.h)
 *   {"type":"ready"} / {"type":"unfit","why":"..."}
 *                                            after the welcome: the probe file was read back
 *                                            (the host joins) / it was not (the agent stops)
 *   {"type":"heartbeat"[,"port":Q]}          every ST_PROTO_HEARTBEAT_MS; Q as in hello
 *   {"type":"started","gen":G,"workers":[{"rank":R,"pid":P},...]}
 *   {"type":"exit","gen":G,"rank":R,"pid":P,"status":X,"signal":N}
 *                                            a worker of generation G ended: exit
 *                                            status X (-1 if killed) or signal N (0 if none);
 *                                            pid 0, status 127: the agent could not fork it
 *   {"type":"output","gen":G,"rank":R,"stream":"out"|"err","text":"..."}
 *                                            one line a worker printed (without "\n"; longer
 *                                            lines in 4 KiB pieces; dropped, then counted in
 *                                            a later line, while the agent's send queue holds
 *                                            over 4 MiB)
 *   {"type":"notice","signal":15}            the agent itself got SIGTERM (its host is
 *                                            being preempted); it has already passed the
 *                                            notice on to its workers
 *
 * controller -> agent
 *   {"type":"welcome","version":2,"run_dir":"D","probe":"F","nonce":"N"}
 *                                            F, a file in the run directory D, must hold N
 *   {"type":"refused","why":"..."}           instead of the welcome: another build, a slice
 *                                            or host out of range, a host already taken
 *   {"type":"start","gen":G,"ranks":[R,...],"env":{"NAME":"VALUE",...},
 *    "args":[...],"threads":T,"config":"{...}"}
 *                                            start one worker per rank R (its devices in
 *                                            order), each as `slicetrain train CONFIG ARGS`
 *                                            (CONFIG: the resolved config, JSON, in a memfd)
 *                                            with ENV added and SLICETRAIN_RANK=R,
 *                                            SLICETRAIN_ADDR=A, OMP_NUM_THREADS=T;
 *                                            1 to D distinct ranks not running in G; "env"
 *                                            may be left out (none), "threads" too (the
 *                                            agent's --threads-per-device)
 *   {"type":"stop","gen":G,"how":"resize"|"notice"|"kill"}
 *                                            resize: SIGUSR1 to every worker of G (save at the
 *                                            next step boundary and exit); notice: SIGTERM
 *                                            (preemption: the same, counted as preemption);
 *                                            kill: SIGKILL
 *   {"type":"kill","gen":G,"rank":R}         SIGKILL one worker (fault injection)
 *   {"type":"shutdown"}                      kill every worker, reap them, exit 0
 *
 * status client -> controller (a connection whose first message is this)
 *   {"type":"status"}  ->  {"type":"status","state":"running","gen":G,"step":N,
 *                           "mesh":"...","slices":[{"slice":S,"state":"...","since":T,
 *                           "hosts":[{"host":H,"pid":P,"last_heartbeat":T,"workers":[...]}]}]}
 *
 * The worker contract (environment the agent passes to each worker, besides
 * the worker group's own SLICETRAIN_RANK / _WORLD_SIZE / _NUM_SLICES /
 * _COORDINATOR, see comm/env.c):
 *   SLICETRAIN_ELASTIC_MAX_DEVICES  the group's device count at the maximum size: the
 *                                   worker keeps the global batch of that size (more
 *                                   gradient accumulation on fewer devices), unless
 *                                   elastic_batch=scale
 *   SLICETRAIN_GENERATION           the generation number (logs; its checkpoints carry it
 *                                   and are fenced by it: ckpt.h)
 * Worker exit statuses the controller reads: 0 finished; 2 bad input (the
 * run cannot go on: the controller stops with it); 3 a peer failed; 128+N
 * stopped by signal N: 143 after a preemption notice (SIGTERM), 138 after a
 * resize request (SIGUSR1), both after saving a checkpoint at the step they
 * stopped after.
 */
#ifndef ST_ELASTIC_PROTO_H
#define ST_ELASTIC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "comm/auth.h"

#define ST_PROTO_VERSION 3

/*
 * Heartbeats also go as UDP datagrams, every ST_PROTO_BEAT_MS, from each
 * agent to the controller's port (the same number as its TCP listener):
 * each datagram stands alone, so packet loss delays none of them the way a
 * lost TCP segment holds back the ones behind it (docs/failures.md). 48
 * bytes: "STB1" | slice (u32) | host (u32) | 0 (u32) | session (u64, from
 * the welcome's "beat") | seq (u64, increasing) | the first 16 bytes of
 * HMAC-SHA256(the token's key, the 32 bytes before), all little-endian.
 */
#define ST_PROTO_BEAT_MS 100
#define ST_PROTO_BEAT_LEN 48
typedef struct st_proto_beat {
	uint32_t slice, host;
	uint64_t session, seq;
} st_proto_beat;
void st_proto_beat_make(uint8_t out[ST_PROTO_BEAT_LEN], const st_token *t, const st_proto_beat *b);
/* 0 and *b for a datagram of exactly ST_PROTO_BEAT_LEN bytes, the magic and
 * a MAC made with t's key; -1 for anything else (dropped, no message). */
int st_proto_beat_parse(const uint8_t *in, size_t n, const st_token *t, st_proto_beat *b);
#define ST_PROTO_MAX_LINE (64 << 10)
#define ST_PROTO_HEARTBEAT_MS 200
#define ST_PROTO_MAX_QUEUE (16 << 20)

/* A connection carrying protocol lines, non-blocking. The receive buffer is
 * ST_PROTO_MAX_LINE bytes (allocated once); the send queue grows up to
 * ST_PROTO_MAX_QUEUE bytes, past which the peer counts as not reading. */
typedef struct st_proto_conn {
	int fd;             /* -1 when closed */
	char *rbuf;         /* bytes received: rbuf[roff, rlen) not yet returned */
	size_t roff, rlen, rcap;
	size_t rscan;       /* rbuf[roff, rscan) is known to hold no newline */
	char *wbuf;         /* bytes queued, not yet sent */
	size_t wlen, wcap;
	st_auth_srv *auth;  /* server side: the handshake until the proof is in (then NULL) */
	const st_token *tok;
} st_proto_conn;

#define ST_PROTO_CONN_INIT { .fd = -1 }

/* Take ownership of a connected socket (made non-blocking): a client's,
 * whose handshake st_proto_connect did. */
int st_proto_conn_init(st_proto_conn *c, int fd);
/* The same for an accepted connection: queues the handshake's hello; the
 * first st_proto_recv calls take the client's proof (ST_EAUTH when wrong)
 * before any line. tok must outlive the connection. */
int st_proto_conn_init_server(st_proto_conn *c, int fd, const st_token *tok);
/* Close the socket and free the buffers; safe on ST_PROTO_CONN_INIT. */
void st_proto_conn_release(st_proto_conn *c);

/* Read what the socket has. Returns 1 and *msg (a JSON object with a string
 * "type"; json_decref it) for each whole line, 0 when no whole line is there
 * yet, ST_EPEER when the peer closed, ST_EPROTO (with a message) for a line
 * that breaks the framing rules above. Call until it returns 0. */
int st_proto_recv(st_proto_conn *c, json_t **msg);
/* Queue msg as one line and send what the socket takes now. ST_EINVAL if
 * its line would be longer than ST_PROTO_MAX_LINE (nothing queued), ST_EPEER
 * if the connection failed or the queue would pass ST_PROTO_MAX_QUEUE. */
int st_proto_send(st_proto_conn *c, const json_t *msg);
/* The same, taking the reference to msg (json_decref'd here); msg NULL (a
 * failed json_pack) is ST_ENOMEM. */
int st_proto_send_new(st_proto_conn *c, json_t *msg);
/* Send queued bytes; 1 if some remain (poll for POLLOUT), 0 if none, <0 error. */
int st_proto_flush(st_proto_conn *c);
/* Flush until the queue is empty or deadline (st_mono_ns): 0, ST_EPEER. */
int st_proto_flush_until(st_proto_conn *c, int64_t deadline);

/* Field access with type checks: ST_EPROTO naming the field when it is
 * missing or of the wrong type (an integer out of [lo, hi] too). */
int st_proto_get_int(const json_t *msg, const char *key, long long lo, long long hi, long long *out);
int st_proto_get_str(const json_t *msg, const char *key, const char **out);
/* A reform's "env": an object of at most max entries, each
 * SLICETRAIN_NAME: "VALUE" where NAME is 1 to ST_PROTO_ENV_NAME_MAX of
 * A-Z, 0-9 and _, and VALUE a string without NUL; ST_EPROTO naming the
 * first entry that is not. */
#define ST_PROTO_ENV_NAME_MAX 64
int st_proto_get_env(const json_t *msg, size_t max, const json_t **env);

/* ---- addresses and sockets (both sides) ---- */

/* "host:port" or "[v6]:port" -> host, port. 0, or ST_EINVAL with a message. */
int st_proto_parse_addr(const char *addr, char *host, size_t hostcap, int *port);
/* Connect to "host:port" until deadline (st_mono_ns) and prove the run
 * token tok (comm/auth.h): a blocking, CLOEXEC, TCP_NODELAY socket for
 * st_proto_conn_init. ST_EINVAL for a bad address, ST_EPEER when nothing
 * answers by then, ST_EAUTH when the controller refuses our proof or its
 * own is wrong. */
int st_proto_connect(const char *addr, const st_token *tok, int64_t deadline, int *fd);
/* Listen on host:port (port 0: the kernel picks one; host NULL, "" or "*":
 * every address). *fd is CLOEXEC; *bound_port the port. 0, ST_EINVAL for a
 * host that does not resolve, ST_EIO when bind/listen fail. */
int st_proto_listen(const char *host, int port, int *fd, int *bound_port);
/* Accept one connection (CLOEXEC, TCP_NODELAY) from a listening socket:
 * 1 and *fd, 0 when none is pending (non-blocking listener), ST_EIO. */
int st_proto_accept(int lfd, int *fd);

#endif
