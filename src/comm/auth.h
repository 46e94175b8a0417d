/*
 * auth.h - the run token, and the handshake that starts every connection of
 * a run (rendezvous store, data transports, elastic controller and agents).
 *
 * The token is a secret shared by the processes of one run. It comes from a
 * file (SLICETRAIN_TOKEN_FILE: the path of a regular file, symbolic links
 * followed, that grants nothing to group or others (mode 0600 or 0400),
 * holding the token; surrounding whitespace ignored) or, second, from the
 * environment (SLICETRAIN_TOKEN). It never crosses the wire, never appears
 * on a command line or in a log line. Tokens shorter than 16 bytes or
 * longer than 4096 are refused. The key is SHA-256 of the token; the
 * token's bytes are not kept. docs/auth.md says how to give one to workers
 * started by other launchers.
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
 * it has all 68, verifies them and fills the answer (see below). The
 * client's two steps are st_auth_cli_answer and st_auth_cli_verify (tests
 * and fuzzers use them to hold the token).
 *
 * Implementation: OpenSSL's libcrypto (SHA256, HMAC with EVP_sha256,
 * CRYPTO_memcmp), nonces from getrandom(2).
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
 * none: set = 0 and 0 returned). ST_EINVAL: the file is missing, unreadable,
 * not a regular file, grants any permission to group or others, or the
 * token is too short or too long (also an empty variable). The message
 * names the variable and the path, never the token. */
int st_token_load(st_token *t);
/* The token of the file path that a command-line option names (e.g.
 * "--token-file"), with the checks of SLICETRAIN_TOKEN_FILE's; messages
 * and t->source name the option ("--token-file PATH: cannot open the token
 * file: ..."). */
int st_token_load_file(st_token *t, const char *path, const char *option);
/* Forget the key (cleansed). */
void st_token_clear(st_token *t);

/* 0 when listening on host is allowed: a loopback address (127.0.0.0/8,
 * ::1, "localhost", a name that resolves to loopback addresses only), or
 * any address when the token is set. Else ST_EINVAL with a message naming
 * the address and saying why. host NULL, "" or "*" means every address. */
int st_auth_check_bind(const st_token *t, const char *host);
/* HMAC-SHA256(the token's key, msg); a missing token means a key of zeros. */
void st_auth_hmac(const st_token *t, const void *msg, size_t n, uint8_t out[ST_AUTH_MAC]);
/* 1 when host is a loopback address or a name of loopback addresses only. */
int st_auth_host_is_loopback(const char *host);

/* Blocking handshakes on a connected socket, bounded by deadline
 * (CLOCK_MONOTONIC ns). t may be NULL (no token). 0; ST_EAUTH: the peer's
 * proof is wrong, or (client) the peer closed the connection right after
 * our proof, i.e. refused it; ST_EPEER: the peer closed before, sent
 * garbage, or the deadline passed. */
int st_auth_client(int fd, const st_token *t, int64_t deadline);
int st_auth_server(int fd, const st_token *t, int64_t deadline);

/* The client side in two steps. st_auth_cli_answer: from the server's hello,
 * the proof to send (fresh nonce); ST_EPEER when hello is not "STA1", ST_EIO
 * without randomness. st_auth_cli_verify: the server's answer; 0, or
 * ST_EAUTH when it is wrong. */
typedef struct st_auth_cli {
	uint8_t ns[ST_AUTH_NONCE], nc[ST_AUTH_NONCE];
} st_auth_cli;
int st_auth_cli_answer(st_auth_cli *a, const st_token *t, const uint8_t hello[ST_AUTH_HELLO],
		       uint8_t out[ST_AUTH_PROOF]);
int st_auth_cli_verify(const st_auth_cli *a, const st_token *t, const uint8_t mac[ST_AUTH_MAC]);

/* The server side as a state machine, for poll loops. */
typedef struct st_auth_srv {
	uint8_t ns[ST_AUTH_NONCE];
	uint8_t in[ST_AUTH_PROOF];
	size_t have;
	int done;                         /* 1 once the proof was accepted */
} st_auth_srv;
/* A new connection: fresh nonce; out (ST_AUTH_HELLO bytes) is what to send.
 * 0, or ST_EIO when no randomness could be had. */
int st_auth_srv_start(st_auth_srv *a, uint8_t out[ST_AUTH_HELLO]);
/* Bytes from the client (n may be 0). Takes at most what completes the
 * proof (*used); returns 0 while more is needed, 1 when the proof is
 * complete and right (out, ST_AUTH_MAC bytes, is then the answer to send;
 * bytes after the proof are the protocol's own; later calls return 1 and
 * take nothing), ST_EAUTH when it is wrong or not a proof at all (the
 * message says which; the connection must then be dropped). */
int st_auth_srv_feed(st_auth_srv *a, const st_token *t, const uint8_t *in, size_t n, size_t *used,
		     uint8_t out[ST_AUTH_MAC]);

/* Logging of dropped connections, rate-limited: the first
 * ST_DROP_LOG_BURST drops of each ST_DROP_LOG_WINDOW_S window are logged,
 * one line each ("slicetrain: warning: WHERE: connection dropped from PEER:
 * WHY", on every rank, whatever st_log_quiet says), the rest counted and
 * summed up in one line when the next window starts. One st_drop_log per
 * listener, used by one thread; zero-initialized. */
enum { ST_DROP_LOG_BURST = 20, ST_DROP_LOG_WINDOW_S = 10 };
typedef struct st_drop_log {
	int64_t window_start;
	int logged;
	unsigned long suppressed, total;  /* total: every drop so far (tests) */
} st_drop_log;
void st_auth_log_drop(st_drop_log *l, const char *where, const char *peer, const char *why);

#endif
