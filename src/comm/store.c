/*
 * The rendezvous store: one server thread with poll(2), synchronous clients.
 *
 * The server is a state machine per connection (conn_input: the token's
 * handshake, then one request at a time) that the thread drives from its
 * poll loop and st_store_engine_* drive directly (tests, fuzz/fuzz_store.c).
 * Nothing a client sends can make it block or hold more than its limits
 * (store.h): memory is counted in s->bytes before it is taken, answers to
 * GET share the stored value (a reference-counted blob), and a client may
 * not send its next request before it got the answer to the previous one,
 * so each connection holds at most one request and one answer.
 */
#include "comm/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/err.h"
#include "comm/comm_int.h"

enum { ANSWER_HDR = 8 };
enum { DEFAULT_MAX_CLIENTS = 1024, DEFAULT_MAX_PENDING = 64, DEFAULT_AUTH_TIMEOUT_MS = 5000 };
#define DEFAULT_MAX_BYTES ((int64_t)256 << 20)

/* A stored value, shared by the key and the answers being sent. */
typedef struct blob {
	size_t refs;
	uint32_t len;
	uint8_t data[];
} blob;

typedef struct kv {
	struct kv *next;
	char *key;
	blob *val;
} kv;

typedef struct conn {
	int open;          /* 0: a free slot */
	int fd;            /* -1: an engine connection (no socket) */
	int authed;        /* the handshake is done */
	int64_t since;     /* when it was accepted (the oldest pending is evicted first) */
	int64_t deadline;  /* the handshake must be done by then */
	char peer[64];     /* for log lines */
	st_auth_srv auth;
	uint8_t head[ST_STORE_HEADER]; /* the request's header, while it arrives */
	size_t headn;
	blob *rx;          /* the whole request once its header is in (counted in bytes); a
			    * SET's becomes the stored value */
	size_t rxn;
	uint8_t small[ST_AUTH_HELLO]; /* bytes to send first: a handshake message or an answer's header */
	size_t smalln;
	blob *body;        /* then this value (a reference) */
	size_t sent;       /* of small, then body */
	char *waitkey;     /* a GET parked until the key is set (counted in bytes) */
} conn;

struct st_store_server {
	int lfd, wake, port, running;
	pthread_t th;
	st_token tok;
	st_store_limits lim;
	kv *kv;
	conn *cl;
	int ncl, capcl;   /* slots in use (open or not) and allocated */
	int nauth, npend; /* open connections past and in the handshake */
	int64_t bytes;    /* keys, values, receive buffers and parked keys */
	int64_t accept_pause_until;
	st_drop_log log;
	atomic_ulong drops; /* read by other threads */
};

/* ---- parsing ---- */

int st_store_parse_request(const uint8_t *buf, size_t n, st_store_req *req)
{
	uint32_t h[3];
	memset(req, 0, sizeof(*req));
	if (n < ST_STORE_HEADER)
		return 0;
	memcpy(h, buf, sizeof(h));
	memcpy(&req->generation, buf + sizeof(h), sizeof(req->generation));
	req->op = h[0];
	req->key_len = h[1];
	req->val_len = h[2];
	if (req->op < ST_STORE_SET || req->op > ST_STORE_ADD)
		return st_fail(ST_EPROTO, "unknown request %u", req->op);
	if (req->key_len < 1 || req->key_len > ST_STORE_MAX_KEY)
		return st_fail(ST_EPROTO, "key length %u out of 1..%d", req->key_len, ST_STORE_MAX_KEY);
	if (req->val_len > ST_STORE_MAX_VALUE)
		return st_fail(ST_EPROTO, "value length %u over %d", req->val_len, ST_STORE_MAX_VALUE);
	if (req->op == ST_STORE_GET && req->val_len != 0)
		return st_fail(ST_EPROTO, "GET with a value");
	if (req->op == ST_STORE_ADD && req->val_len != 8)
		return st_fail(ST_EPROTO, "ADD with a value of %u bytes (want 8)", req->val_len);
	req->size = ST_STORE_HEADER + (size_t)req->key_len + req->val_len;
	if (n < req->size)
		return 0;
	req->key = buf + ST_STORE_HEADER;
	req->val = req->key + req->key_len;
	if (memchr(req->key, 0, req->key_len))
		return st_fail(ST_EPROTO, "NUL byte in a key");
	return 1;
}

/* ---- memory ---- */

/* Take n more bytes of the budget: 0, or ST_EPROTO (the client that asked is dropped). */
static int budget(st_store_server *s, size_t n, const char *what)
{
	if ((int64_t)n > s->lim.max_bytes - s->bytes)
		return st_fail(ST_EPROTO, "%s of %zu bytes would take the store past its bound of %lld bytes "
					  "(%lld in use)", what, n, (long long)s->lim.max_bytes, (long long)s->bytes);
	s->bytes += (int64_t)n;
	return 0;
}

static void unbudget(st_store_server *s, size_t n) { s->bytes -= (int64_t)n; }

/* A blob of len bytes, the first min(len, have) copied from p. */
static blob *blob_new_from(st_store_server *s, const void *p, size_t have, uint32_t len)
{
	if (budget(s, len, "a request or value") < 0)
		return NULL;
	blob *b = malloc(sizeof(*b) + (len ? len : 1));
	if (!b) {
		unbudget(s, len);
		st_fail(ST_ENOMEM, "out of memory for a value of %u bytes", len);
		return NULL;
	}
	b->refs = 1;
	b->len = len;
	if (len)
		memcpy(b->data, p, have < len ? have : len);
	return b;
}

static blob *blob_new(st_store_server *s, const void *p, uint32_t len) { return blob_new_from(s, p, len, len); }

static void blob_unref(st_store_server *s, blob *b)
{
	if (b && --b->refs == 0) {
		unbudget(s, b->len);
		free(b);
	}
}

static kv *find(st_store_server *s, const char *key)
{
	for (kv *e = s->kv; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* ---- one connection ---- */

static size_t out_len(const conn *c) { return c->smalln + (c->body ? c->body->len : 0); }
static int out_pending(const conn *c) { return c->sent < out_len(c); }

static void out_reset(st_store_server *s, conn *c)
{
	blob_unref(s, c->body);
	c->body = NULL;
	c->smalln = c->sent = 0;
}

/* Queue an answer: header, then (a reference to) the value. */
static void answer(conn *c, blob *val)
{
	uint32_t h[2] = { 0, val ? val->len : 0 };
	memcpy(c->small, h, ANSWER_HDR);
	c->smalln = ANSWER_HDR;
	c->sent = 0;
	if (val) {
		val->refs++;
		c->body = val;
	}
}

static void rx_free(st_store_server *s, conn *c)
{
	blob_unref(s, c->rx);
	c->rx = NULL;
	c->rxn = c->headn = 0;
}

/* Close a connection and free what it holds; why (NULL: a normal close) is logged. */
static void conn_drop(st_store_server *s, conn *c, const char *why)
{
	if (!c->open)
		return;
	if (why) {
		s->drops++;
		if (c->fd >= 0)
			st_auth_log_drop(&s->log, "rendezvous store", c->peer, why);
	}
	if (c->fd >= 0)
		close(c->fd);
	rx_free(s, c);
	out_reset(s, c);
	if (c->waitkey) {
		unbudget(s, strlen(c->waitkey) + 1);
		free(c->waitkey);
	}
	if (c->authed)
		s->nauth--;
	else
		s->npend--;
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

/* SET and ADD: the key's entry, created if needed (counted). NULL on failure. */
static kv *entry(st_store_server *s, const st_store_req *q)
{
	char key[ST_STORE_MAX_KEY + 1];
	memcpy(key, q->key, q->key_len);
	key[q->key_len] = 0;
	kv *e = find(s, key);
	if (e)
		return e;
	size_t cost = sizeof(kv) + q->key_len + 1;
	if (budget(s, cost, "a new key") < 0)
		return NULL;
	if (!(e = calloc(1, sizeof(*e))) || !(e->key = strdup(key))) {
		free(e);
		unbudget(s, cost);
		st_fail(ST_ENOMEM, "out of memory");
		return NULL;
	}
	e->next = s->kv;
	s->kv = e;
	return e;
}

/* Answer the GETs parked on e's key. */
static void wake_waiters(st_store_server *s, const kv *e)
{
	for (int i = 0; i < s->ncl; i++) {
		conn *w = &s->cl[i];
		if (w->open && w->waitkey && strcmp(w->waitkey, e->key) == 0) {
			unbudget(s, strlen(w->waitkey) + 1);
			free(w->waitkey);
			w->waitkey = NULL;
			answer(w, e->val);
		}
	}
}

/* One complete, valid request q from c (in c->rx). 0, or a negative code: drop c. */
static int handle(st_store_server *s, conn *c, const st_store_req *q)
{
	if (q->op == ST_STORE_GET) {
		char key[ST_STORE_MAX_KEY + 1];
		memcpy(key, q->key, q->key_len);
		key[q->key_len] = 0;
		kv *e = find(s, key);
		if (e && e->val) { /* (a key whose first SET failed has none) */
			answer(c, e->val);
			return 0;
		}
		if (budget(s, q->key_len + 1, "a parked GET") < 0)
			return ST_EPROTO;
		if (!(c->waitkey = strdup(key))) {
			unbudget(s, q->key_len + 1);
			return st_fail(ST_ENOMEM, "out of memory");
		}
		return 0;
	}
	kv *e = entry(s, q);
	if (!e)
		return ST_EPROTO;
	blob *nv;
	if (q->op == ST_STORE_SET) {
		/* the request's buffer becomes the value: no second copy */
		nv = c->rx;
		c->rx = NULL;
		size_t size = nv->len;
		memmove(nv->data, q->val, q->val_len);
		nv->len = q->val_len;
		unbudget(s, size - q->val_len);
		blob_unref(s, e->val);
		e->val = nv;
		answer(c, NULL);
	} else {
		int64_t d, cur = 0;
		memcpy(&d, q->val, 8);
		if (e->val && e->val->len != 8)
			return st_fail(ST_EPROTO, "ADD on a key that is not a counter");
		if (e->val)
			memcpy(&cur, e->val->data, 8);
		cur = (int64_t)((uint64_t)cur + (uint64_t)d);
		if (!(nv = blob_new(s, &cur, 8)))
			return ST_EPROTO;
		blob_unref(s, e->val);
		e->val = nv;
		answer(c, nv);
	}
	wake_waiters(s, e);
	return 0;
}

/* Request bytes from an authenticated client: the header into head, then
 * the whole request into rx (its size counted first). 0, or a negative
 * code: drop c. *used: bytes taken. */
static int take_request(st_store_server *s, conn *c, const uint8_t *p, size_t n, size_t *used)
{
	st_store_req q;
	int r;
	*used = 0;
	if (!c->rx) {
		size_t k = ST_STORE_HEADER - c->headn < n ? ST_STORE_HEADER - c->headn : n;
		memcpy(c->head + c->headn, p, k);
		c->headn += k;
		*used = k;
		if (c->headn < ST_STORE_HEADER)
			return 0;
		if ((r = st_store_parse_request(c->head, c->headn, &q)) < 0)
			return r;
		if (q.generation != s->lim.generation)
			return st_fail(ST_EPROTO, "a request of generation %llu, %s the store's %llu: refused",
				       (unsigned long long)q.generation, q.generation < s->lim.generation ? "older than" : "newer than",
				       (unsigned long long)s->lim.generation);
		if (!(c->rx = blob_new_from(s, c->head, ST_STORE_HEADER, (uint32_t)q.size)))
			return ST_EPROTO;
		c->rxn = ST_STORE_HEADER;
		p += k;
		n -= k;
	}
	size_t k = c->rx->len - c->rxn < n ? c->rx->len - c->rxn : n;
	memcpy(c->rx->data + c->rxn, p, k);
	c->rxn += k;
	*used += k;
	if (c->rxn < c->rx->len)
		return 0;
	if ((r = st_store_parse_request(c->rx->data, c->rxn, &q)) < 0)
		return r;
	r = handle(s, c, &q);
	rx_free(s, c);
	return r;
}

/* Bytes that c sent. 0, or a negative code with a message: drop c. */
static int conn_input(st_store_server *s, conn *c, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t used;
		int r;
		if (!c->authed) {
			uint8_t mac[ST_AUTH_MAC];
			if ((r = st_auth_srv_feed(&c->auth, &s->tok, p, n, &used, mac)) < 0)
				return r;
			p += used;
			n -= used;
			if (r == 0)
				return 0;
			if (s->nauth >= s->lim.max_clients)
				return st_fail(ST_EPROTO, "too many clients (%d)", s->lim.max_clients);
			c->authed = 1;
			s->npend--;
			s->nauth++;
			memcpy(c->small, mac, ST_AUTH_MAC);
			c->smalln = ST_AUTH_MAC;
			c->sent = 0;
			continue;
		}
		if (out_pending(c) || c->waitkey)
			return st_fail(ST_EPROTO, "a request before the answer to the previous one");
		out_reset(s, c);
		if ((r = take_request(s, c, p, n, &used)) < 0)
			return r;
		p += used;
		n -= used;
	}
	return 0;
}

/* A free slot for a new connection, or NULL when out of memory. */
static conn *conn_slot(st_store_server *s)
{
	for (int i = 0; i < s->ncl; i++)
		if (!s->cl[i].open)
			return &s->cl[i];
	if (s->ncl == s->capcl) {
		int nc = s->capcl ? s->capcl * 2 : 16;
		conn *n = realloc(s->cl, sizeof(*n) * (size_t)nc);
		if (!n)
			return NULL;
		s->cl = n;
		s->capcl = nc;
	}
	memset(&s->cl[s->ncl], 0, sizeof(conn));
	s->cl[s->ncl].fd = -1;
	return &s->cl[s->ncl++];
}

/* Room for one more connection in the handshake: evict the oldest pending one. */
static void make_room(st_store_server *s)
{
	while (s->npend >= s->lim.max_pending) {
		conn *old = NULL;
		for (int i = 0; i < s->ncl; i++)
			if (s->cl[i].open && !s->cl[i].authed && (!old || s->cl[i].since < old->since))
				old = &s->cl[i];
		if (!old)
			return;
		conn_drop(s, old, "too many connections in the handshake (the oldest is dropped)");
	}
}

/* A new connection (fd -1: an engine one): starts the handshake. NULL when
 * out of memory or randomness (fd is then closed). */
static conn *conn_open(st_store_server *s, int fd)
{
	make_room(s);
	conn *c = conn_slot(s);
	if (!c) {
		if (fd >= 0)
			close(fd);
		st_fail(ST_ENOMEM, "out of memory");
		return NULL;
	}
	memset(c, 0, sizeof(*c));
	c->fd = fd;
	if (st_auth_srv_start(&c->auth, c->small) < 0) {
		if (fd >= 0)
			close(fd);
		c->fd = -1;
		return NULL;
	}
	c->smalln = ST_AUTH_HELLO;
	c->open = 1;
	c->since = st_mono_ns();
	c->deadline = c->since + (int64_t)s->lim.auth_timeout_ms * 1000000;
	s->npend++;
	if (fd >= 0) {
		st_sock_nodelay(fd);
		st_sock_peer_name(fd, c->peer, sizeof(c->peer));
	}
	return c;
}

/* ---- the server ---- */

static void take_limits(st_store_server *s, const st_token *tok, const st_store_limits *lim)
{
	if (tok)
		s->tok = *tok;
	else
		snprintf(s->tok.source, sizeof(s->tok.source), "none");
	if (lim)
		s->lim = *lim;
	if (s->lim.max_clients <= 0)
		s->lim.max_clients = DEFAULT_MAX_CLIENTS;
	if (s->lim.max_pending <= 0)
		s->lim.max_pending = DEFAULT_MAX_PENDING;
	if (s->lim.auth_timeout_ms <= 0)
		s->lim.auth_timeout_ms = DEFAULT_AUTH_TIMEOUT_MS;
	if (s->lim.max_bytes <= 0)
		s->lim.max_bytes = DEFAULT_MAX_BYTES;
}

/* Send what is queued for c, as far as the socket takes it: header and
 * value in one call (two sends of a small answer would wait for the
 * client's delayed ACK). */
static void flush_out(st_store_server *s, conn *c)
{
	while (c->open && out_pending(c)) {
		struct iovec iov[2];
		int n = 0;
		if (c->sent < c->smalln)
			iov[n++] = (struct iovec){ .iov_base = c->small + c->sent, .iov_len = c->smalln - c->sent };
		if (c->body) {
			size_t off = c->sent > c->smalln ? c->sent - c->smalln : 0;
			iov[n++] = (struct iovec){ .iov_base = c->body->data + off, .iov_len = c->body->len - off };
		}
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			c->sent += (size_t)w;
			continue;
		}
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		conn_drop(s, c, c->authed ? NULL : "closed during the handshake");
		return;
	}
	if (c->open && !out_pending(c))
		out_reset(s, c);
}

/* Everything c sent so far. */
static void read_conn(st_store_server *s, conn *c)
{
	uint8_t buf[65536];
	while (c->open) {
		ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r > 0) {
			if (conn_input(s, c, buf, (size_t)r) < 0)
				conn_drop(s, c, st_errmsg());
			continue;
		}
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		/* closed or failed: a client that leaves mid-handshake is worth a line */
		conn_drop(s, c, c->authed ? NULL : "closed before completing the handshake");
	}
}

static void accept_new(st_store_server *s, int64_t now)
{
	for (int k = 0; k < 64; k++) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* the listener stays readable: wait instead of spinning */
				s->accept_pause_until = now + 100000000;
				st_auth_log_drop(&s->log, "rendezvous store", "?", "cannot accept: out of descriptors");
			}
			return;
		}
		conn *c = conn_open(s, fd);
		if (c)
			flush_out(s, c);
	}
}

/* Drop the connections whose handshake is late; the earliest deadline left. */
static int64_t drop_late(st_store_server *s, int64_t now)
{
	int64_t next = INT64_MAX;
	for (int i = 0; i < s->ncl; i++) {
		conn *c = &s->cl[i];
		if (!c->open || c->authed)
			continue;
		if (now >= c->deadline)
			conn_drop(s, c, "no handshake within the time limit");
		else if (c->deadline < next)
			next = c->deadline;
	}
	return next;
}

static void *serve(void *arg)
{
	st_store_server *s = arg;
	struct pollfd *pf = NULL;
	int cap = 0;
	for (;;) {
		int64_t now = st_mono_ns(), next = drop_late(s, now);
		if (s->accept_pause_until > now && s->accept_pause_until < next)
			next = s->accept_pause_until;
		int np = 2 + s->ncl;
		if (np > cap) {
			struct pollfd *n = realloc(pf, sizeof(*pf) * (size_t)np * 2);
			if (!n) {
				usleep(10000);
				continue;
			}
			pf = n;
			cap = np * 2;
		}
		pf[0] = (struct pollfd){ .fd = s->wake, .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = s->accept_pause_until > now ? -1 : s->lfd, .events = POLLIN };
		for (int i = 0; i < s->ncl; i++) {
			conn *c = &s->cl[i];
			pf[2 + i] = (struct pollfd){ .fd = c->open ? c->fd : -1,
						     .events = (short)(POLLIN | (out_pending(c) ? POLLOUT : 0)) };
		}
		int ms = next == INT64_MAX ? -1 : (int)((next - now) / 1000000) + 1;
		if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR)
			break;
		if (pf[0].revents)
			break;
		now = st_mono_ns();
		for (int i = 0; i < np - 2; i++) {
			conn *c = &s->cl[i];
			if (!c->open || !pf[2 + i].revents)
				continue;
			if (pf[2 + i].revents & (POLLIN | POLLHUP | POLLERR))
				read_conn(s, c);
			if (c->open)
				flush_out(s, c);
		}
		/* answers produced for parked clients by others' requests */
		for (int i = 0; i < s->ncl; i++)
			if (s->cl[i].open && out_pending(&s->cl[i]))
				flush_out(s, &s->cl[i]);
		if (pf[1].revents & POLLIN)
			accept_new(s, now);
	}
	free(pf);
	return NULL;
}

static st_store_server *server_new(const st_token *tok, const st_store_limits *lim)
{
	st_store_server *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->lfd = s->wake = -1;
	take_limits(s, tok, lim);
	return s;
}

int st_store_serve(st_store_server **out, const char *host, int port, const st_token *tok,
		   const st_store_limits *lim)
{
	int r;
	if ((r = st_auth_check_bind(tok, host)) < 0)
		return r;
	st_store_server *s = server_new(tok, lim);
	if (!s)
		return st_fail(ST_ENOMEM, "store: out of memory");
	if ((r = st_tcp_listen(host, port, 1024, &s->lfd, &s->port)) < 0) {
		st_store_server_stop(s);
		return st_fail(ST_EIO, "store: cannot listen on %s port %d: %s", host && *host ? host : "*", port,
			       strerror(-r));
	}
	st_set_nonblock(s->lfd, 1);
	s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake < 0) {
		r = errno;
		st_store_server_stop(s);
		return st_fail(ST_EIO, "store: eventfd: %s", strerror(r));
	}
	/* signals stay with the application's threads */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&s->th, NULL, serve, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e) {
		st_store_server_stop(s);
		return st_fail(ST_EIO, "store: cannot start thread: %s", strerror(e));
	}
	s->running = 1;
	*out = s;
	return 0;
}

int st_store_server_port(const st_store_server *s) { return s->port; }
unsigned long st_store_server_drops(const st_store_server *s) { return atomic_load(&((st_store_server *)s)->drops); }

void st_store_server_stop(st_store_server *s)
{
	if (!s)
		return;
	if (s->running) {
		uint64_t one = 1;
		if (write(s->wake, &one, sizeof(one)) < 0) {
			/* an eventfd write only fails on overflow; the thread is woken anyway */
		}
		pthread_join(s->th, NULL);
	}
	for (int i = 0; i < s->ncl; i++)
		conn_drop(s, &s->cl[i], NULL);
	free(s->cl);
	while (s->kv) {
		kv *n = s->kv->next;
		blob_unref(s, s->kv->val);
		free(s->kv->key);
		free(s->kv);
		s->kv = n;
	}
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->wake >= 0)
		close(s->wake);
	st_token_clear(&s->tok);
	free(s);
}

/* ---- the engine: the same connections without sockets ---- */

int st_store_engine_new(st_store_server **out, const st_token *tok, const st_store_limits *lim)
{
	if (!(*out = server_new(tok, lim)))
		return st_fail(ST_ENOMEM, "store: out of memory");
	return 0;
}

int st_store_engine_open(st_store_server *s, uint8_t hello[ST_AUTH_HELLO])
{
	conn *c = conn_open(s, -1);
	if (!c)
		return ST_ENOMEM;
	memcpy(hello, c->small, ST_AUTH_HELLO);
	c->smalln = 0;
	return (int)(c - s->cl);
}

static conn *engine_conn(st_store_server *s, int id)
{
	return id >= 0 && id < s->ncl && s->cl[id].open && s->cl[id].fd < 0 ? &s->cl[id] : NULL;
}

int st_store_engine_input(st_store_server *s, int id, const void *p, size_t n)
{
	conn *c = engine_conn(s, id);
	if (!c)
		return st_fail(ST_EPEER, "store engine: connection %d is closed", id);
	int r = conn_input(s, c, p, n);
	if (r < 0) {
		char why[256];
		snprintf(why, sizeof(why), "%s", st_errmsg());
		conn_drop(s, c, why);
		return st_fail(r, "%s", why);
	}
	return 0;
}

int st_store_engine_take(st_store_server *s, int id, uint8_t **out, size_t *n)
{
	conn *c = engine_conn(s, id);
	*out = NULL;
	*n = 0;
	if (!c)
		return st_fail(ST_EPEER, "store engine: connection %d is closed", id);
	size_t len = out_len(c) - c->sent;
	if (!(*out = malloc(len ? len : 1)))
		return st_fail(ST_ENOMEM, "out of memory");
	size_t k = 0;
	if (c->sent < c->smalln) {
		k = c->smalln - c->sent;
		memcpy(*out, c->small + c->sent, k);
	}
	if (c->body)
		memcpy(*out + k, c->body->data + (c->sent > c->smalln ? c->sent - c->smalln : 0), len - k);
	*n = len;
	out_reset(s, c);
	return 0;
}

void st_store_engine_close(st_store_server *s, int id)
{
	conn *c = engine_conn(s, id);
	if (c)
		conn_drop(s, c, NULL);
}

int64_t st_store_engine_bytes(const st_store_server *s) { return s->bytes; }

/* ---- client ---- */

struct st_store {
	int fd;
	int broken;
	char host[256];
	int port;
	uint64_t generation;
};

/* A handshake that fails this many times in a row ends the connect; each
 * gets at most HANDSHAKE_NS (a listener that accepts and stays silent is
 * not the store). */
enum { HANDSHAKE_TRIES = 3 };
#define HANDSHAKE_NS ((int64_t)10 * 1000000000)

int st_store_connect(st_store **out, const char *host, int port, const st_token *tok, int64_t deadline)
{
	int64_t backoff = 5000000; /* 5 ms, growing to 250 ms */
	int r, refused = 0;
	char why[320] = "";
	for (;;) {
		int fd;
		r = st_tcp_connect(host, port, deadline, &fd);
		if (r == 0) {
			int64_t hs = st_mono_ns() + HANDSHAKE_NS;
			r = st_auth_client(fd, tok, hs < deadline ? hs : deadline);
			if (r == 0) {
				st_store *s = calloc(1, sizeof(*s));
				if (!s) {
					close(fd);
					return st_fail(ST_ENOMEM, "store: out of memory");
				}
				s->fd = fd;
				snprintf(s->host, sizeof(s->host), "%s", host);
				s->port = port;
				*out = s;
				return 0;
			}
			close(fd);
			snprintf(why, sizeof(why), "%s", st_errmsg());
			/* a store that refuses our token will refuse it again, but one
			 * under a flood of connections may have evicted us: a few tries */
			if (++refused >= HANDSHAKE_TRIES)
				return st_fail(r, "store %s:%d: handshake failed %d times (run token: %s): %s", host, port,
					       refused, tok && tok->set ? tok->source : "none", why);
		}
		int64_t now = st_mono_ns();
		if (now + backoff >= deadline)
			break;
		struct timespec ts = { .tv_sec = backoff / 1000000000, .tv_nsec = backoff % 1000000000 };
		nanosleep(&ts, NULL);
		backoff = backoff * 3 / 2;
		if (backoff > 250000000)
			backoff = 250000000;
	}
	if (*why)
		return st_fail(ST_EPEER, "store: cannot reach the coordinator %s:%d: %s", host, port, why);
	return st_fail(ST_EPEER, "store: cannot reach the coordinator %s:%d: %s", host, port, strerror(-r));
}

void st_store_set_generation(st_store *s, uint64_t gen) { s->generation = gen; }

static int fail_io(st_store *s, int r, const char *what, const char *key)
{
	s->broken = 1;
	if (r == -ETIMEDOUT)
		return st_fail(ST_EPEER, "store %s:%d: timed out in %s '%s'", s->host, s->port, what, key);
	return st_fail(ST_EPEER, "store %s:%d: %s '%s': %s", s->host, s->port, what, key,
		       r == -ECONNRESET ? "the store closed the connection" : strerror(-r));
}

static int request(st_store *s, uint32_t op, const char *key, const void *val, size_t len,
		   void **ans, size_t *anslen, int64_t deadline, const char *what)
{
	size_t kl = strlen(key);
	if (kl < 1 || kl > ST_STORE_MAX_KEY || len > ST_STORE_MAX_VALUE)
		return st_fail(ST_EINVAL, "store: key or value too long ('%.40s')", key);
	if (s->broken)
		return st_fail(ST_EPEER, "store %s:%d: connection unusable after an earlier error", s->host, s->port);
	uint8_t h[ST_STORE_HEADER];
	uint32_t h3[3] = { op, (uint32_t)kl, (uint32_t)len };
	memcpy(h, h3, sizeof(h3));
	memcpy(h + sizeof(h3), &s->generation, sizeof(s->generation));
	int r = st_send_full(s->fd, h, sizeof(h), deadline);
	if (!r)
		r = st_send_full(s->fd, key, kl, deadline);
	if (!r && len)
		r = st_send_full(s->fd, val, len, deadline);
	uint32_t a[2];
	if (!r)
		r = st_recv_full(s->fd, a, sizeof(a), deadline);
	if (r)
		return fail_io(s, r, what, key);
	if (a[0] != 0 || a[1] > ST_STORE_MAX_VALUE) {
		s->broken = 1;
		return st_fail(ST_EPEER, "store %s:%d: malformed answer", s->host, s->port);
	}
	uint8_t *b = malloc((size_t)a[1] + 1);
	if (!b)
		return st_fail(ST_ENOMEM, "store: out of memory");
	r = st_recv_full(s->fd, b, a[1], deadline);
	if (r) {
		free(b);
		return fail_io(s, r, what, key);
	}
	b[a[1]] = 0;
	if (ans) {
		*ans = b;
		*anslen = a[1];
	} else {
		free(b);
	}
	return 0;
}

/* Non-waiting operations still get a generous deadline: the server answers at once. */
static int64_t soon(void) { return st_mono_ns() + (int64_t)60 * 1000000000; }

int st_store_set(st_store *s, const char *key, const void *val, size_t len)
{
	return request(s, ST_STORE_SET, key, val, len, NULL, NULL, soon(), "set");
}

int st_store_get(st_store *s, const char *key, void **val, size_t *len, int64_t deadline)
{
	return request(s, ST_STORE_GET, key, NULL, 0, val, len, deadline, "waiting for");
}

int st_store_add(st_store *s, const char *key, int64_t delta, int64_t *result)
{
	void *a;
	size_t n;
	int r = request(s, ST_STORE_ADD, key, &delta, 8, &a, &n, soon(), "add");
	if (r < 0)
		return r;
	if (n != 8) {
		free(a);
		s->broken = 1;
		return st_fail(ST_EPEER, "store %s:%d: malformed answer to add", s->host, s->port);
	}
	if (result)
		memcpy(result, a, 8);
	free(a);
	return 0;
}

int st_store_barrier(st_store *s, const char *name, int n, int64_t deadline)
{
	char k[ST_STORE_MAX_KEY + 16];
	int64_t v;
	if (strlen(name) > ST_STORE_MAX_KEY - 8)
		return st_fail(ST_EINVAL, "store: barrier name too long");
	snprintf(k, sizeof(k), "%s/count", name);
	int r = st_store_add(s, k, 1, &v);
	if (r < 0)
		return r;
	snprintf(k, sizeof(k), "%s/done", name);
	if (v == n && (r = st_store_set(s, k, "1", 1)) < 0)
		return r;
	void *val;
	size_t len;
	r = st_store_get(s, k, &val, &len, deadline);
	if (r == 0)
		free(val);
	return r;
}

int st_store_local_addr(const st_store *s, char *buf, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(s->fd, (struct sockaddr *)&ss, &sl) < 0)
		return -1;
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
			return inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], buf, (socklen_t)cap) ? 0 : -1;
		return inet_ntop(AF_INET6, &a->sin6_addr, buf, (socklen_t)cap) ? 0 : -1;
	}
	return inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)cap) ? 0 : -1;
}

void st_store_close(st_store *s)
{
	if (!s)
		return;
	close(s->fd);
	free(s);
}
