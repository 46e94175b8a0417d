/* The rendezvous store: one server thread with poll(2), synchronous clients. */
#include "comm/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "comm/comm_int.h"

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3 };
enum { HDR = 12 };

typedef struct kv {
	struct kv *next;
	char *key;
	uint8_t *val;
	uint32_t len;
} kv;

typedef struct client {
	int fd;
	uint8_t *rx;       /* request being received */
	size_t rxn, rxcap;
	uint8_t *tx;       /* answer being sent */
	size_t txn, txoff, txcap;
	char *waitkey;     /* GET parked until the key is set */
} client;

struct st_store_server {
	int lfd, wake, port;
	pthread_t th;
	kv *kv;
	client *cl;
	int ncl, capcl;
};

static kv *find(st_store_server *s, const char *key)
{
	for (kv *e = s->kv; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

static int reserve(uint8_t **b, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 256;
	while (nc < need)
		nc *= 2;
	uint8_t *nb = realloc(*b, nc);
	if (!nb)
		return -1;
	*b = nb;
	*cap = nc;
	return 0;
}

static int answer(client *c, const void *val, uint32_t len)
{
	uint32_t h[2] = { 0, len };
	if (reserve(&c->tx, &c->txcap, c->txn + 8 + len) < 0)
		return -1;
	memcpy(c->tx + c->txn, h, 8);
	if (len)
		memcpy(c->tx + c->txn + 8, val, len);
	c->txn += 8 + len;
	return 0;
}

static void drop(client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->rx);
	free(c->tx);
	free(c->waitkey);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

/* Handle one complete request in c->rx. -1 closes the client. */
static int handle(st_store_server *s, client *c, uint32_t op, uint32_t kl, uint32_t vl)
{
	char *key = malloc(kl + 1);
	if (!key)
		return -1;
	memcpy(key, c->rx + HDR, kl);
	key[kl] = 0;
	if (strlen(key) != kl) { /* embedded NUL */
		free(key);
		return -1;
	}
	const uint8_t *val = c->rx + HDR + kl;
	kv *e = find(s, key);
	if (op == OP_SET || op == OP_ADD) {
		if (!e) {
			e = calloc(1, sizeof(*e));
			if (!e) {
				free(key);
				return -1;
			}
			e->key = key;
			key = NULL;
			e->next = s->kv;
			s->kv = e;
		}
		if (op == OP_SET) {
			uint8_t *nv = malloc(vl ? vl : 1);
			if (!nv)
				goto fail;
			memcpy(nv, val, vl);
			free(e->val);
			e->val = nv;
			e->len = vl;
			if (answer(c, NULL, 0) < 0)
				goto fail;
		} else {
			int64_t d, cur = 0;
			memcpy(&d, val, 8);
			if (e->val && e->len == 8)
				memcpy(&cur, e->val, 8);
			else if (e->val)
				goto fail; /* ADD on a non-counter */
			cur = (int64_t)((uint64_t)cur + (uint64_t)d);
			if (!e->val && !(e->val = malloc(8)))
				goto fail;
			memcpy(e->val, &cur, 8);
			e->len = 8;
			if (answer(c, &cur, 8) < 0)
				goto fail;
		}
		free(key);
		/* wake parked GETs of this key */
		for (int i = 0; i < s->ncl; i++) {
			client *w = &s->cl[i];
			if (w->fd >= 0 && w->waitkey && strcmp(w->waitkey, e->key) == 0) {
				free(w->waitkey);
				w->waitkey = NULL;
				if (answer(w, e->val, e->len) < 0)
					drop(w);
			}
		}
		return 0;
	}
	/* OP_GET */
	if (e) {
		free(key);
		return answer(c, e->val, e->len);
	}
	c->waitkey = key;
	return 0;
fail:
	free(key);
	return -1;
}

/* Parse what arrived; -1 closes the client. */
static int consume(st_store_server *s, client *c)
{
	while (!c->waitkey && c->rxn >= HDR) {
		uint32_t h[3];
		memcpy(h, c->rx, HDR);
		uint32_t op = h[0], kl = h[1], vl = h[2];
		if (op < OP_SET || op > OP_ADD || kl < 1 || kl > ST_STORE_MAX_KEY || vl > ST_STORE_MAX_VALUE)
			return -1;
		if ((op == OP_GET && vl != 0) || (op == OP_ADD && vl != 8))
			return -1;
		size_t need = HDR + (size_t)kl + vl;
		if (c->rxn < need)
			return 0;
		if (handle(s, c, op, kl, vl) < 0)
			return -1;
		memmove(c->rx, c->rx + need, c->rxn - need);
		c->rxn -= need;
	}
	return 0;
}

static void flush_tx(client *c)
{
	while (c->txoff < c->txn) {
		ssize_t w = send(c->fd, c->tx + c->txoff, c->txn - c->txoff, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			c->txoff += (size_t)w;
			continue;
		}
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		drop(c);
		return;
	}
	c->txoff = c->txn = 0;
}

static void *serve(void *arg)
{
	st_store_server *s = arg;
	struct pollfd *pf = NULL;
	int cap = 0;
	for (;;) {
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
		pf[1] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
		for (int i = 0; i < s->ncl; i++) {
			client *c = &s->cl[i];
			pf[2 + i] = (struct pollfd){ .fd = c->fd, .events = (short)(POLLIN | (c->txoff < c->txn ? POLLOUT : 0)) };
		}
		if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR)
			break;
		if (pf[0].revents)
			break;
		for (int i = 0; i < s->ncl; i++) {
			client *c = &s->cl[i];
			if (c->fd < 0 || !pf[2 + i].revents)
				continue;
			if (pf[2 + i].revents & (POLLIN | POLLHUP | POLLERR)) {
				for (;;) {
					if (reserve(&c->rx, &c->rxcap, c->rxn + 65536) < 0) {
						drop(c);
						break;
					}
					ssize_t r = recv(c->fd, c->rx + c->rxn, c->rxcap - c->rxn, MSG_DONTWAIT);
					if (r > 0) {
						c->rxn += (size_t)r;
						if (consume(s, c) < 0) {
							drop(c);
							break;
						}
						continue;
					}
					if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
						break;
					drop(c); /* closed or failed */
					break;
				}
			}
			if (c->fd >= 0 && c->txoff < c->txn)
				flush_tx(c);
		}
		/* answers produced for parked clients */
		for (int i = 0; i < s->ncl; i++)
			if (s->cl[i].fd >= 0 && s->cl[i].txoff < s->cl[i].txn)
				flush_tx(&s->cl[i]);
		/* compact the client table */
		int k = 0;
		for (int i = 0; i < s->ncl; i++)
			if (s->cl[i].fd >= 0)
				s->cl[k++] = s->cl[i];
		s->ncl = k;
		if (pf[1].revents & POLLIN) {
			int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (fd >= 0) {
				if (s->ncl == s->capcl) {
					int nc = s->capcl ? s->capcl * 2 : 16;
					client *n = realloc(s->cl, sizeof(*n) * (size_t)nc);
					if (!n) {
						close(fd);
						continue;
					}
					s->cl = n;
					s->capcl = nc;
				}
				memset(&s->cl[s->ncl], 0, sizeof(client));
				s->cl[s->ncl++].fd = fd;
			}
		}
	}
	free(pf);
	return NULL;
}

int st_store_serve(st_store_server **out, int port)
{
	st_store_server *s = calloc(1, sizeof(*s));
	if (!s)
		return st_fail(ST_ENOMEM, "store: out of memory");
	int r = st_tcp_listen(port, 1024, &s->lfd, &s->port);
	if (r < 0) {
		free(s);
		return st_fail(ST_EIO, "store: cannot listen on port %d: %s", port, strerror(-r));
	}
	st_set_nonblock(s->lfd, 1);
	s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake < 0) {
		close(s->lfd);
		free(s);
		return st_fail(ST_EIO, "store: eventfd: %s", strerror(errno));
	}
	/* signals stay with the application's threads */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int e = pthread_create(&s->th, NULL, serve, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e) {
		close(s->wake);
		close(s->lfd);
		free(s);
		return st_fail(ST_EIO, "store: cannot start thread: %s", strerror(e));
	}
	*out = s;
	return 0;
}

int st_store_server_port(const st_store_server *s) { return s->port; }

void st_store_server_stop(st_store_server *s)
{
	if (!s)
		return;
	uint64_t one = 1;
	if (write(s->wake, &one, sizeof(one)) < 0) {
		/* an eventfd write only fails on overflow; the thread is woken anyway */
	}
	pthread_join(s->th, NULL);
	for (int i = 0; i < s->ncl; i++)
		drop(&s->cl[i]);
	free(s->cl);
	while (s->kv) {
		kv *n = s->kv->next;
		free(s->kv->key);
		free(s->kv->val);
		free(s->kv);
		s->kv = n;
	}
	close(s->lfd);
	close(s->wake);
	free(s);
}

/* ---- client ---- */

struct st_store {
	int fd;
	int broken;
	char host[256];
	int port;
};

int st_store_connect(st_store **out, const char *host, int port, int64_t deadline)
{
	int64_t backoff = 5000000; /* 5 ms, growing to 250 ms */
	int r;
	for (;;) {
		int fd;
		r = st_tcp_connect(host, port, deadline, &fd);
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
		int64_t now = st_mono_ns();
		if (now + backoff >= deadline)
			break;
		struct timespec ts = { .tv_sec = backoff / 1000000000, .tv_nsec = backoff % 1000000000 };
		nanosleep(&ts, NULL);
		backoff = backoff * 3 / 2;
		if (backoff > 250000000)
			backoff = 250000000;
	}
	return st_fail(ST_EPEER, "store: cannot reach the coordinator %s:%d: %s", host, port, strerror(-r));
}

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
	uint32_t h[3] = { op, (uint32_t)kl, (uint32_t)len };
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
	return request(s, OP_SET, key, val, len, NULL, NULL, soon(), "set");
}

int st_store_get(st_store *s, const char *key, void **val, size_t *len, int64_t deadline)
{
	return request(s, OP_GET, key, NULL, 0, val, len, deadline, "waiting for");
}

int st_store_add(st_store *s, const char *key, int64_t delta, int64_t *result)
{
	void *a;
	size_t n;
	int r = request(s, OP_ADD, key, &delta, 8, &a, &n, soon(), "add");
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
