/*
 * store.h - the rendezvous store: a tiny TCP key/value server.
 *
 * Rank 0 of a group hosts it on the coordinator port while the group forms
 * (st_group_join); every process connects as a client, publishes its
 * endpoints and reads everybody else's. It is also usable on its own (the
 * elastic controller, tests):
 *
 *   st_store_server *srv;
 *   rc = st_store_serve(&srv, 29500);        // starts one thread; port 0 picks a free one
 *   ...
 *   st_store *s;
 *   rc = st_store_connect(&s, "node0", 29500, deadline);  // retries until the deadline
 *   rc = st_store_set(s, "ep/3", data, len);
 *   rc = st_store_get(s, "ep/0", &val, &len, deadline);   // waits until the key exists
 *   free(val);
 *   rc = st_store_add(s, "count", 1, &now);                // atomic counter
 *   rc = st_store_barrier(s, "joined", 4, deadline);       // all 4 clients meet
 *   st_store_close(s);
 *   st_store_server_stop(srv);
 *
 * Deadlines are CLOCK_MONOTONIC nanoseconds (st_mono_ns, base/clock.h).
 *
 * Wire format (little-endian hosts only, like the rest of the group
 * protocol): request = u32 op, u32 key length (1..1024), u32 value length
 * (<= 64 MiB), key, value; op 1 SET, 2 GET (answered once the key exists),
 * 3 ADD (value: i64 delta; answer: i64 new value). Answer = u32 status (0),
 * u32 length, value. A malformed request closes that client's connection.
 *
 * Errors: ST_EPEER when the server is unreachable, closes the connection or
 * a deadline passes (the client is then unusable); ST_EIO when the server
 * cannot listen; ST_EINVAL for bad arguments.
 */
#ifndef ST_COMM_STORE_H
#define ST_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_store_server st_store_server;
typedef struct st_store st_store;

enum { ST_STORE_MAX_KEY = 1024, ST_STORE_MAX_VALUE = 64 << 20 };

int st_store_serve(st_store_server **out, int port);
int st_store_server_port(const st_store_server *s);
/* Stops the thread, closes every connection, frees. NULL is fine. */
void st_store_server_stop(st_store_server *s);

int st_store_connect(st_store **out, const char *host, int port, int64_t deadline);
int st_store_set(st_store *s, const char *key, const void *val, size_t len);
/* *val is malloc'ed (NUL-terminated for convenience; *len excludes it). */
int st_store_get(st_store *s, const char *key, void **val, size_t *len, int64_t deadline);
int st_store_add(st_store *s, const char *key, int64_t delta, int64_t *result);
/* Every one of n clients calls it with the same name; returns when all did. */
int st_store_barrier(st_store *s, const char *name, int n, int64_t deadline);
/* The local address of the connection (numeric), as the server sees us. */
int st_store_local_addr(const st_store *s, char *buf, size_t cap);
void st_store_close(st_store *s);

#endif
