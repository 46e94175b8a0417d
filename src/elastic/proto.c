/*
 * proto.c - the elastic wire protocol (proto.h): line framing of JSON
 * objects over non-blocking sockets with bounded buffers, field getters,
 * and the socket helpers both sides use (over comm's net.c).
 */
#include "elastic/proto.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <time.h>
#include <unistd.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "comm/auth.h"
#include "comm/net.h"

int st_proto_conn_init(st_proto_conn *c, int fd)
{
	*c = (st_proto_conn)ST_PROTO_CONN_INIT;
	int rc = st_set_nonblock(fd, 1);
	if (rc < 0) {
		close(fd);
		return st_fail(ST_EIO, "protocol: cannot make the socket non-blocking: %s", strerror(-rc));
	}
	if (!(c->rbuf = malloc(ST_PROTO_MAX_LINE))) {
		close(fd);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	c->rcap = ST_PROTO_MAX_LINE;
	c->fd = fd;
	return 0;
}

void st_proto_conn_release(st_proto_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->rbuf);
	free(c->wbuf);
	free(c->auth);
	*c = (st_proto_conn)ST_PROTO_CONN_INIT;
}

/* Queue n raw bytes (the handshake's) and send what the socket takes. */
static int queue_raw(st_proto_conn *c, const void *p, size_t n)
{
	if (st_array_reserve(&c->wbuf, &c->wcap, c->wlen + n, 1, 4096) < 0)
		return st_fail(ST_ENOMEM, "out of memory");
	memcpy(c->wbuf + c->wlen, p, n);
	c->wlen += n;
	int rc = st_proto_flush(c);
	return rc < 0 ? rc : 0;
}

int st_proto_conn_init_server(st_proto_conn *c, int fd, const st_token *tok)
{
	int rc = st_proto_conn_init(c, fd);
	if (rc < 0)
		return rc;
	uint8_t hello[ST_AUTH_HELLO];
	if (!(c->auth = malloc(sizeof(*c->auth)))) {
		st_proto_conn_release(c);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	c->tok = tok;
	if ((rc = st_auth_srv_start(c->auth, hello)) < 0 || (rc = queue_raw(c, hello, sizeof(hello))) < 0) {
		st_proto_conn_release(c);
		return rc;
	}
	return 0;
}

/* Server side, before the first line: the client's proof from rbuf. 1 when
 * accepted (the answer queued; what follows it in rbuf is protocol lines),
 * 0 when more bytes are needed, ST_EAUTH when the proof is wrong. */
static int take_proof(st_proto_conn *c)
{
	size_t used = 0;
	uint8_t answer[ST_AUTH_MAC];
	int rc = st_auth_srv_feed(c->auth, c->tok, (const uint8_t *)c->rbuf + c->roff, c->rlen - c->roff, &used,
				  answer);
	c->roff += used;
	c->rscan = c->roff;
	if (rc <= 0)
		return rc;
	free(c->auth);
	c->auth = NULL;
	return (rc = queue_raw(c, answer, sizeof(answer))) < 0 ? rc : 1;
}

/* rbuf[roff, end) is one line without its newline: parse and check it. */
static int parse_line(const char *line, size_t len, json_t **msg)
{
	json_error_t je;
	json_t *m = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	if (!m)
		return st_fail(ST_EPROTO, "protocol: invalid JSON at column %d: %s", je.column, je.text);
	if (!json_is_object(m)) {
		json_decref(m);
		return st_fail(ST_EPROTO, "protocol: a message is not a JSON object");
	}
	if (!json_is_string(json_object_get(m, "type"))) {
		json_decref(m);
		return st_fail(ST_EPROTO, "protocol: a message without a string \"type\"");
	}
	*msg = m;
	return 1;
}

int st_proto_recv(st_proto_conn *c, json_t **msg)
{
	*msg = NULL;
	if (c->fd < 0)
		return st_fail(ST_EPEER, "protocol: connection closed");
	for (;;) {
		if (c->auth) {
			int rc = take_proof(c);
			if (rc < 0)
				return rc;
		}
		char *nl = c->auth ? NULL : memchr(c->rbuf + c->rscan, '\n', c->rlen - c->rscan);
		if (nl) {
			size_t start = c->roff, end = (size_t)(nl - c->rbuf);
			c->roff = c->rscan = end + 1;
			return parse_line(c->rbuf + start, end - start, msg);
		}
		c->rscan = c->rlen;
		if (c->roff > 0) { /* compact: the partial line moves to the front */
			memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
			c->rlen -= c->roff;
			c->rscan -= c->roff;
			c->roff = 0;
		}
		if (c->rlen == c->rcap)
			return st_fail(ST_EPROTO, "protocol: a line longer than %d bytes", ST_PROTO_MAX_LINE);
		ssize_t n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
		if (n > 0) {
			c->rlen += (size_t)n;
			continue;
		}
		if (n == 0)
			return st_fail(ST_EPEER, "protocol: the peer closed the connection%s",
				       c->rlen ? " in the middle of a line" : "");
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return st_fail(ST_EPEER, "protocol: receive failed: %s", strerror(errno));
	}
}

int st_proto_flush(st_proto_conn *c)
{
	size_t off = 0;
	int rc = 0;
	if (c->fd < 0)
		return st_fail(ST_EPEER, "protocol: connection closed");
	while (off < c->wlen) {
		ssize_t n = send(c->fd, c->wbuf + off, c->wlen - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		rc = st_fail(ST_EPEER, "protocol: send failed: %s", n < 0 ? strerror(errno) : "no progress");
		break;
	}
	memmove(c->wbuf, c->wbuf + off, c->wlen - off);
	c->wlen -= off;
	return rc < 0 ? rc : c->wlen > 0;
}

int st_proto_flush_until(st_proto_conn *c, int64_t deadline)
{
	for (;;) {
		int rc = st_proto_flush(c);
		if (rc <= 0)
			return rc;
		int64_t left = deadline - st_mono_ns();
		if (left <= 0)
			return st_fail(ST_EPEER, "protocol: the peer did not take %zu queued bytes in time", c->wlen);
		struct pollfd p = {.fd = c->fd, .events = POLLOUT};
		if (poll(&p, 1, (int)(left / 1000000) + 1) < 0 && errno != EINTR)
			return st_fail(ST_EPEER, "protocol: poll failed: %s", strerror(errno));
	}
}

int st_proto_send(st_proto_conn *c, const json_t *msg)
{
	if (c->fd < 0)
		return st_fail(ST_EPEER, "protocol: connection closed");
	char *s = json_dumps(msg, JSON_COMPACT);
	if (!s)
		return st_fail(ST_ENOMEM, "protocol: cannot serialize a message");
	size_t n = strlen(s);
	if (n + 1 > ST_PROTO_MAX_LINE) {
		free(s);
		return st_fail(ST_EINVAL, "protocol: a message of %zu bytes is longer than the %d-byte line limit",
			       n + 1, ST_PROTO_MAX_LINE);
	}
	if (c->wlen + n + 1 > ST_PROTO_MAX_QUEUE) {
		free(s);
		return st_fail(ST_EPEER, "protocol: the peer is not reading (%zu bytes queued)", c->wlen);
	}
	if (st_array_reserve(&c->wbuf, &c->wcap, c->wlen + n, 1, 4096) < 0) {
		free(s);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	memcpy(c->wbuf + c->wlen, s, n);
	c->wbuf[c->wlen + n] = '\n';
	c->wlen += n + 1;
	free(s);
	int rc = st_proto_flush(c);
	return rc < 0 ? rc : 0;
}

int st_proto_send_new(st_proto_conn *c, json_t *msg)
{
	if (!msg)
		return st_fail(ST_ENOMEM, "protocol: cannot build a message");
	int rc = st_proto_send(c, msg);
	json_decref(msg);
	return rc;
}

int st_proto_get_int(const json_t *msg, const char *key, long long lo, long long hi, long long *out)
{
	const json_t *v = json_object_get(msg, key);
	if (!v)
		return st_fail(ST_EPROTO, "protocol: \"%s\" is missing", key);
	if (!json_is_integer(v))
		return st_fail(ST_EPROTO, "protocol: \"%s\" is not an integer", key);
	long long x = json_integer_value(v);
	if (x < lo || x > hi)
		return st_fail(ST_EPROTO, "protocol: \"%s\" is %lld, not in %lld..%lld", key, x, lo, hi);
	*out = x;
	return 0;
}

int st_proto_get_str(const json_t *msg, const char *key, const char **out)
{
	const json_t *v = json_object_get(msg, key);
	if (!v)
		return st_fail(ST_EPROTO, "protocol: \"%s\" is missing", key);
	if (!json_is_string(v))
		return st_fail(ST_EPROTO, "protocol: \"%s\" is not a string", key);
	*out = json_string_value(v);
	return 0;
}

static int env_name_ok(const char *k)
{
	if (strncmp(k, "SLICETRAIN_", 11))
		return 0;
	size_t n = strspn(k + 11, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
	return n >= 1 && n <= ST_PROTO_ENV_NAME_MAX && !k[11 + n];
}

int st_proto_get_env(const json_t *msg, size_t max, const json_t **env)
{
	const json_t *e = json_object_get(msg, "env");
	if (!json_is_object(e) || json_object_size(e) > max)
		return st_fail(ST_EPROTO, "protocol: \"env\" is not an object of at most %zu strings", max);
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)e, k, v)
		if (!env_name_ok(k) || !json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
			return st_fail(ST_EPROTO,
				       "protocol: \"env\" entry '%.60s' is not SLICETRAIN_NAME: \"VALUE\" "
				       "(NAME: 1 to %d of A-Z, 0-9, _)",
				       k, ST_PROTO_ENV_NAME_MAX);
	*env = e;
	return 0;
}

/* ---- heartbeat datagrams ---- */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

void st_proto_beat_make(uint8_t out[ST_PROTO_BEAT_LEN], const st_token *t, const st_proto_beat *b)
{
	uint8_t mac[ST_AUTH_MAC];
	memcpy(out, "STB1", 4);
	put32(out + 4, b->slice);
	put32(out + 8, b->host);
	put32(out + 12, 0);
	put64(out + 16, b->session);
	put64(out + 24, b->seq);
	st_auth_hmac(t, out, 32, mac);
	memcpy(out + 32, mac, 16);
}

int st_proto_beat_parse(const uint8_t *in, size_t n, const st_token *t, st_proto_beat *b)
{
	uint8_t mac[ST_AUTH_MAC];
	if (n != ST_PROTO_BEAT_LEN || memcmp(in, "STB1", 4))
		return -1;
	st_auth_hmac(t, in, 32, mac);
	if (CRYPTO_memcmp(mac, in + 32, 16))
		return -1;
	b->slice = get32(in + 4);
	b->host = get32(in + 8);
	b->session = get64(in + 16);
	b->seq = get64(in + 24);
	return 0;
}

/* ---- addresses and sockets ---- */

int st_proto_parse_addr(const char *addr, char *host, size_t hostcap, int *port)
{
	if (st_split_hostport(addr, host, hostcap, port) < 0)
		return st_fail(ST_EINVAL, "'%s' is not an address HOST:PORT (port 1..65535; [v6]:PORT)",
			       addr ? addr : "");
	return 0;
}

int st_proto_connect(const char *addr, const st_token *tok, int64_t deadline, int *fd)
{
	char host[256];
	int port, rc;
	if ((rc = st_proto_parse_addr(addr, host, sizeof(host), &port)) < 0)
		return rc;
	/* a controller that is still starting refuses: retry until the deadline */
	for (;;) {
		rc = st_tcp_connect(host, port, deadline, fd);
		if (rc == 0) {
			if ((rc = st_auth_client(*fd, tok, deadline)) < 0) {
				close(*fd);
				*fd = -1;
				return st_wrap(rc, "%s", addr);
			}
			return 0;
		}
		int64_t left = deadline - st_mono_ns();
		if (left <= 0 || rc == -ETIMEDOUT)
			break;
		struct timespec ts = {0, left < 100000000 ? left : 100000000};
		nanosleep(&ts, NULL);
	}
	return st_fail(ST_EPEER, "cannot connect to %s: %s", addr, strerror(-rc));
}

int st_proto_listen(const char *host, int port, int *fd, int *bound_port)
{
	int rc;
	if (host && !strcmp(host, "*"))
		host = NULL;
	if (host && !*host)
		host = NULL;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
			*res, *ai;
	char ps[16];
	snprintf(ps, sizeof(ps), "%d", port);
	if ((rc = getaddrinfo(host, ps, &hints, &res)) != 0)
		return st_fail(ST_EINVAL, "cannot resolve '%s': %s", host ? host : "*", gai_strerror(rc));
	int err = EADDRNOTAVAIL, one = 1;
	for (ai = res; ai; ai = ai->ai_next) {
		int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (s < 0) {
			err = errno;
			continue;
		}
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, 64) == 0 &&
		    getsockname(s, (struct sockaddr *)&ss, &sl) == 0) {
			freeaddrinfo(res);
			*bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
							       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
			*fd = s;
			return 0;
		}
		err = errno;
		close(s);
	}
	freeaddrinfo(res);
	return st_fail(ST_EIO, "cannot listen on %s:%d: %s", host ? host : "*", port, strerror(err));
}

int st_proto_accept(int lfd, int *fd)
{
	for (;;) {
		int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (s >= 0) {
			st_sock_nodelay(s);
			*fd = s;
			return 1;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return st_fail(ST_EIO, "accept failed: %s", strerror(errno));
	}
}
