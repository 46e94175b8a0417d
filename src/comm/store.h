/*
 * store.h - the rendezvous store: a tiny TCP key/value server.
 *
 * Rank 0 of a group hosts it on the coordinator address while the group
 * forms (st_group_join); every process connects as a client, publishes its
 * endpoints and reads everybody else's. It is also usable on its own
 * (tests):
 *
 *   st_store_server *srv;
 *   rc = st_store_serve(&srv, "127.0.0.1", 29500, &tok, NULL); // one thread; port 0 picks a free one
 *   ...
 *   st_store *s;
 *   rc = st_store_connect(&s, "node0", 29500, &tok, deadline);  // retries until the deadline
 *   rc = st_store_set(s, "ep/3", data, len);
 *   rc = st_store_get(s, "ep/0", &val, &len, deadline);   // waits until the key exists
 *   free(val);
 *   rc = st_store_add(s, "count", 1, &now);                // atomic counter
 *   rc = st_store_barrier(s, "joined", 4, deadline);       // all 4 clients meet
 *   st_store_close(s);
 *   st_store_server_stop(srv);
 *
 * Deadlines are CLOCK_MONOTONIC nanoseconds (st_mono_ns, base/clock.h).
 * tok (comm/auth.h) may be NULL: no token, and then the server listens on
 * loopback addresses only (st_auth_check_bind). The server copies the key.
 *
 * Wire format (little-endian hosts only, like the rest of the group
 * protocol): first the run token's handshake (comm/auth.h: the server's
 * hello, the client's proof, the server's answer); then requests, each
 * sent only after the answer to the previous one: request = u32 op, u32
 * key length (1..1024), u32 value length (<= 64 MiB), u64 generation (the
 * group's elastic generation, 0 when not elastic), key (no NUL byte),
 * value; op 1 SET, 2 GET (value length 0; answered once the key exists),
 * 3 ADD (value: i64 delta; answer: i64 new value; the key must hold a
 * counter). Answer = u32 status (0), u32 length, value.
 *
 * Hostile clients (the server's side; each case drops that connection only
 * and logs a line with the peer's address and the reason, rate-limited,
 * never the token): a request of another generation than the store's (a
 * worker of an older generation, back after a partition); a wrong or
 * replayed proof; no proof within
 * auth_timeout_ms (slowloris); a malformed request; a request sent before
 * the answer to the previous one; ADD on a key that is not a counter; a
 * request that would take the store past max_bytes (keys, values, parked
 * GETs and receive buffers of all clients together; answers share the
 * stored value, not a copy); more than max_clients authenticated clients.
 * Connections still in the handshake are at most max_pending: a new one
 * evicts the oldest. Before its proof, a connection costs a fixed ~200
 * bytes and a descriptor.
 *
 * Errors: ST_EPEER when the server is unreachable, closes the connection or
 * a deadline passes (the client is then unusable); ST_EAUTH when the
 * handshake fails (a different token on one side); ST_EIO when the server
 * cannot listen; ST_EINVAL for bad arguments, or an address that needs a
 * token (st_auth_check_bind).
 */
#ifndef ST_COMM_STORE_H
#define ST_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/auth.h"

typedef struct st_store_server st_store_server;
typedef struct st_store st_store;

enum { ST_STORE_MAX_KEY = 1024, ST_STORE_MAX_VALUE = 64 << 20 };
enum { ST_STORE_SET = 1, ST_STORE_GET = 2, ST_STORE_ADD = 3, ST_STORE_HEADER = 20 };

/* Bounds of what clients can make the server hold; 0 in a field (or a NULL
 * pointer) means its default. */
typedef struct st_store_limits {
	int max_clients;       /* authenticated connections at once (default 1024) */
	int max_pending;       /* connections in the handshake at once (default 64) */
	int auth_timeout_ms;   /* time to complete the handshake (default 5000) */
	int64_t max_bytes;     /* keys + values + buffers of all clients (default 256 MiB) */
	uint64_t generation;   /* not a limit: the generation the store serves (0: none); a request
				  carrying any other is refused */
} st_store_limits;

/* Listen on host:port (host NULL or "*": every address; see st_tcp_listen). */
int st_store_serve(st_store_server **out, const char *host, int port, const st_token *tok,
		   const st_store_limits *lim);
int st_store_server_port(const st_store_server *s);
/* Connections dropped so far (handshake failures, violations, limits). */
unsigned long st_store_server_drops(const st_store_server *s);
/* Stops the thread, closes every connection, frees. NULL is fine. */
void st_store_server_stop(st_store_server *s);

int st_store_connect(st_store **out, const char *host, int port, const st_token *tok, int64_t deadline);
/* The generation this client's requests carry from now on (0 at connect). */
void st_store_set_generation(st_store *s, uint64_t gen);
int st_store_set(st_store *s, const char *key, const void *val, size_t len);
/* *val is malloc'ed (NUL-terminated for convenience; *len excludes it). */
int st_store_get(st_store *s, const char *key, void **val, size_t *len, int64_t deadline);
int st_store_add(st_store *s, const char *key, int64_t delta, int64_t *result);
/* Every one of n clients calls it with the same name; returns when all did. */
int st_store_barrier(st_store *s, const char *name, int n, int64_t deadline);
/* The local address of the connection (numeric), as the server sees us. */
int st_store_local_addr(const st_store *s, char *buf, size_t cap);
void st_store_close(st_store *s);

/* ---- the protocol without sockets: tests and fuzzing ---- */

/* One request, parsed from buf[0..n) (pure: no allocation, no state). 1: a
 * complete, valid request of req->size bytes (key and val point into buf);
 * 0: more bytes are needed (req->size is the whole request's size once the
 * 20-byte header is in, else 0); ST_EPROTO: malformed (the message says
 * why: unknown op, key length 0 or > 1024, value > 64 MiB, GET with a
 * value, ADD without an 8-byte value, NUL in the key). */
typedef struct st_store_req {
	uint32_t op, key_len, val_len;
	uint64_t generation;
	size_t size;
	const uint8_t *key, *val;
} st_store_req;
int st_store_parse_request(const uint8_t *buf, size_t n, st_store_req *req);

/* The server's connection state machine without a socket or thread (the
 * same code the served store runs): open a connection (its id; hello = the
 * bytes the server sends first), feed it what the client sent (0 while it
 * stays open; a negative code once dropped, the reason in st_errmsg()),
 * take what the server has to send it (malloc'ed, *n may be 0; a GET
 * parked on one connection is answered when another sets the key). Free
 * with st_store_server_stop. Dropped connections are not logged here. */
int st_store_engine_new(st_store_server **out, const st_token *tok, const st_store_limits *lim);
int st_store_engine_open(st_store_server *s, uint8_t hello[ST_AUTH_HELLO]);
int st_store_engine_input(st_store_server *s, int id, const void *p, size_t n);
int st_store_engine_take(st_store_server *s, int id, uint8_t **out, size_t *n);
void st_store_engine_close(st_store_server *s, int id);
/* Bytes held now (what max_bytes bounds). */
int64_t st_store_engine_bytes(const st_store_server *s);

#endif
