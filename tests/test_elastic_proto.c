/*
 * The elastic wire protocol's framing (src/elastic/proto.c) over socketpairs
 * and loopback TCP: lines split across reads and several per read, the
 * line-length limit (exactly the limit passes, one byte more is ST_EPROTO
 * with no growth of the buffer), invalid JSON, non-objects, a missing or
 * non-string "type", the field getters' errors, peer close, partial writes
 * through a small socket buffer, the send queue's limit, the address,
 * listen and connect helpers, and the run token's handshake before the
 * first line (the right token, a wrong one, none, a replayed proof, a proof
 * followed by a line in the same write).
 * timeout: 60
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdint.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "base/clock.h"
#include "base/err.h"
#include "check.h"
#include "comm/net.h"
#include "elastic/proto.h"

/* c reads what peer writes. */
static void pair(st_proto_conn *c, int *peer)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		exit(1);
	}
	CHECK(st_proto_conn_init(c, sv[0]) == 0);
	*peer = sv[1];
}

static void put(int fd, const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, s, n);
		if (w <= 0) {
			perror("write");
			exit(1);
		}
		s += w;
		n -= (size_t)w;
	}
}

static void puts_(int fd, const char *s) { put(fd, s, strlen(s)); }

/* One line sent on its own connection: what recv makes of it. */
static int recv_one(const char *line, json_t **m)
{
	st_proto_conn c;
	int peer;
	pair(&c, &peer);
	puts_(peer, line);
	int rc = st_proto_recv(&c, m);
	st_proto_conn_release(&c);
	close(peer);
	return rc;
}

static void test_split_and_batched(void)
{
	st_proto_conn c;
	int peer;
	json_t *m = NULL;
	pair(&c, &peer);
	CHECK(st_proto_recv(&c, &m) == 0 && !m);
	puts_(peer, "{\"type\":\"a\",");
	CHECK(st_proto_recv(&c, &m) == 0);
	puts_(peer, "\"n\":");
	CHECK(st_proto_recv(&c, &m) == 0);
	puts_(peer, "7}\n{\"type\":\"b\"}\n{\"ty");
	CHECK(st_proto_recv(&c, &m) == 1);
	const char *t = NULL;
	long long n = 0;
	CHECK(st_proto_get_str(m, "type", &t) == 0 && !strcmp(t, "a"));
	CHECK(st_proto_get_int(m, "n", 0, 10, &n) == 0 && n == 7);
	json_decref(m);
	CHECK(st_proto_recv(&c, &m) == 1);
	CHECK(!strcmp(json_string_value(json_object_get(m, "type")), "b"));
	json_decref(m);
	CHECK(st_proto_recv(&c, &m) == 0);
	/* many lines in one write */
	puts_(peer, "pe\":\"c\"}\n");
	char many[4096] = "";
	for (int i = 0; i < 100; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "{\"type\":\"m\",\"i\":%d}\n", i);
	puts_(peer, many);
	CHECK(st_proto_recv(&c, &m) == 1);
	CHECK(!strcmp(json_string_value(json_object_get(m, "type")), "c"));
	json_decref(m);
	for (int i = 0; i < 100; i++) {
		CHECK(st_proto_recv(&c, &m) == 1);
		CHECK(st_proto_get_int(m, "i", 0, 1000, &n) == 0 && n == i);
		json_decref(m);
	}
	CHECK(st_proto_recv(&c, &m) == 0);
	/* peer closes in the middle of a line */
	puts_(peer, "{\"type\":");
	close(peer);
	CHECK(st_proto_recv(&c, &m) == ST_EPEER);
	CHECK(strstr(st_errmsg(), "closed") != NULL);
	st_proto_conn_release(&c);
	st_proto_conn_release(&c); /* twice is safe */
}

/* A line of exactly len bytes including its newline. */
static char *line_of(size_t len)
{
	const char *head = "{\"type\":\"big\",\"p\":\"", *tail = "\"}\n";
	char *s = malloc(len + 1);
	size_t h = strlen(head), t = strlen(tail);
	memcpy(s, head, h);
	memset(s + h, 'x', len - h - t);
	memcpy(s + len - t, tail, t + 1);
	return s;
}

static void test_limits(void)
{
	st_proto_conn c;
	int peer;
	json_t *m = NULL;
	char *ok = line_of(ST_PROTO_MAX_LINE), *big = line_of(ST_PROTO_MAX_LINE + 1);
	pair(&c, &peer);
	int sz = 4 * ST_PROTO_MAX_LINE;
	setsockopt(peer, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	put(peer, ok, ST_PROTO_MAX_LINE);
	put(peer, ok, ST_PROTO_MAX_LINE / 2); /* half of the next one */
	CHECK(st_proto_recv(&c, &m) == 1);
	CHECK(json_string_length(json_object_get(m, "p")) == ST_PROTO_MAX_LINE - 22);
	json_decref(m);
	CHECK(st_proto_recv(&c, &m) == 0);
	put(peer, ok + ST_PROTO_MAX_LINE / 2, ST_PROTO_MAX_LINE - ST_PROTO_MAX_LINE / 2);
	CHECK(st_proto_recv(&c, &m) == 1);
	json_decref(m);
	CHECK(st_proto_recv(&c, &m) == 0);
	/* one byte more: refused, and the buffer did not grow */
	put(peer, big, ST_PROTO_MAX_LINE + 1);
	CHECK(st_proto_recv(&c, &m) == ST_EPROTO && !m);
	CHECK(strstr(st_errmsg(), "longer than") != NULL);
	CHECK(c.rcap == ST_PROTO_MAX_LINE);
	st_proto_conn_release(&c);
	close(peer);
	/* an endless line without a newline: refused once the buffer is full */
	pair(&c, &peer);
	setsockopt(peer, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	for (int i = 0; i < 2; i++)
		put(peer, big + 20, ST_PROTO_MAX_LINE - 100);
	CHECK(st_proto_recv(&c, &m) == ST_EPROTO);
	CHECK(c.rcap == ST_PROTO_MAX_LINE);
	st_proto_conn_release(&c);
	close(peer);
	free(ok);
	free(big);
}

static void test_bad_lines(void)
{
	json_t *m = NULL;
	CHECK(recv_one("{\"type\":\"a\"\n", &m) == ST_EPROTO && !m);
	CHECK(strstr(st_errmsg(), "invalid JSON") != NULL);
	CHECK(recv_one("not json\n", &m) == ST_EPROTO);
	CHECK(recv_one("\n", &m) == ST_EPROTO);
	CHECK(recv_one("[\"type\",\"a\"]\n", &m) == ST_EPROTO);
	CHECK(strstr(st_errmsg(), "not a JSON object") != NULL);
	CHECK(recv_one("\"hello\"\n", &m) == ST_EPROTO);
	CHECK(recv_one("{\"kind\":\"a\"}\n", &m) == ST_EPROTO);
	CHECK(strstr(st_errmsg(), "\"type\"") != NULL);
	CHECK(recv_one("{\"type\":3}\n", &m) == ST_EPROTO);
	CHECK(recv_one("{\"type\":null}\n", &m) == ST_EPROTO);
	CHECK(recv_one("{\"type\":\"a\",\"type\":\"b\"}\n", &m) == ST_EPROTO); /* duplicate key */
	CHECK(recv_one("{\"type\":\"a\"} {\"type\":\"b\"}\n", &m) == ST_EPROTO);
	CHECK(recv_one("{\"type\":\"\xff\"}\n", &m) == ST_EPROTO); /* not UTF-8 */
	CHECK(recv_one("{\"type\":\"a\"}\n", &m) == 1);
	json_decref(m);
	/* a peer that closes without sending anything */
	st_proto_conn c;
	int peer;
	pair(&c, &peer);
	close(peer);
	CHECK(st_proto_recv(&c, &m) == ST_EPEER);
	st_proto_conn_release(&c);
	st_proto_conn released = ST_PROTO_CONN_INIT;
	CHECK(st_proto_recv(&released, &m) == ST_EPEER);
	CHECK(st_proto_send_new(&released, json_pack("{s:s}", "type", "x")) == ST_EPEER);
}

static void test_getters(void)
{
	json_t *m = json_pack("{s:s,s:i,s:f,s:s,s:b,s:I}", "type", "t", "n", 5, "r", 1.0, "s", "str", "b", 1,
			      "big", (json_int_t)1 << 40);
	long long v = -1;
	const char *s = NULL;
	CHECK(st_proto_get_int(m, "n", 0, 5, &v) == 0 && v == 5);
	CHECK(st_proto_get_int(m, "n", 6, 9, &v) == ST_EPROTO && v == 5);
	CHECK(strstr(st_errmsg(), "\"n\"") && strstr(st_errmsg(), "6..9"));
	CHECK(st_proto_get_int(m, "big", 0, INT32_MAX, &v) == ST_EPROTO);
	CHECK(st_proto_get_int(m, "missing", 0, 1, &v) == ST_EPROTO);
	CHECK(strstr(st_errmsg(), "\"missing\" is missing") != NULL);
	CHECK(st_proto_get_int(m, "r", 0, 5, &v) == ST_EPROTO); /* 1.0 is not an integer */
	CHECK(strstr(st_errmsg(), "not an integer") != NULL);
	CHECK(st_proto_get_int(m, "s", 0, 5, &v) == ST_EPROTO);
	CHECK(st_proto_get_int(m, "b", 0, 5, &v) == ST_EPROTO);
	CHECK(st_proto_get_str(m, "s", &s) == 0 && !strcmp(s, "str"));
	CHECK(st_proto_get_str(m, "n", &s) == ST_EPROTO);
	CHECK(strstr(st_errmsg(), "not a string") != NULL);
	CHECK(st_proto_get_str(m, "nope", &s) == ST_EPROTO);
	json_decref(m);
}

/* Heartbeat datagrams: made and parsed back with the same token; refused
 * with another token, any byte changed, another length or magic. */
static void test_beats(void)
{
	st_token t = {.set = 1}, other = {.set = 1};
	memset(t.key, 7, sizeof(t.key));
	memset(other.key, 8, sizeof(other.key));
	st_proto_beat b = {.slice = 3, .host = 70000, .session = 0x0123456789abcdefULL, .seq = 1ULL << 40}, got;
	uint8_t d[ST_PROTO_BEAT_LEN + 1];
	st_proto_beat_make(d, &t, &b);
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, &t, &got) == 0);
	CHECK(got.slice == 3 && got.host == 70000 && got.session == b.session && got.seq == b.seq);
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, &other, &got) == -1);
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, NULL, &got) == -1);
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN - 1, &t, &got) == -1);
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN + 1, &t, &got) == -1);
	CHECK(st_proto_beat_parse(d, 0, &t, &got) == -1);
	for (int i = 0; i < ST_PROTO_BEAT_LEN; i++) {
		d[i] ^= 0x20;
		CHECK_MSG(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, &t, &got) == -1, "byte %d changed: accepted", i);
		d[i] ^= 0x20;
	}
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, &t, &got) == 0);
	st_proto_beat_make(d, NULL, &b); /* no token: a key of zeros, on loopback */
	CHECK(st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, NULL, &got) == 0 && st_proto_beat_parse(d, ST_PROTO_BEAT_LEN, &t, &got) == -1);
}

/* A reform's "env": names SLICETRAIN_ + 1..64 of A-Z 0-9 _, string values
 * without NUL, at most max entries; anything else is refused by name. */
static void test_get_env(void)
{
	char longest[80], over[80];
	snprintf(longest, sizeof(longest), "SLICETRAIN_%0*d", ST_PROTO_ENV_NAME_MAX, 0);
	snprintf(over, sizeof(over), "SLICETRAIN_%0*d", ST_PROTO_ENV_NAME_MAX + 1, 0);
	const json_t *env = NULL;
	json_t *m = json_pack("{s:{s:s,s:s,s:s}}", "env", "SLICETRAIN_RANK", "0", "SLICETRAIN_WORLD_SIZE", "2",
			      longest, "");
	CHECK(st_proto_get_env(m, 3, &env) == 0 && env == json_object_get(m, "env"));
	CHECK(st_proto_get_env(m, 2, &env) == ST_EPROTO && strstr(st_errmsg(), "at most 2"));
	json_decref(m);
	const char *bad_names[] = {"SLICETRAIN_", "SLICETRAIN_rank", "SLICETRAIN_A=B", "SLICETRAIN_A B", "PATH",
				   "LD_PRELOAD", "slicetrain_RANK", over};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(*bad_names); i++) {
		m = json_pack("{s:{s:s}}", "env", bad_names[i], "1");
		CHECK(st_proto_get_env(m, 8, &env) == ST_EPROTO);
		CHECK(strstr(st_errmsg(), "is not SLICETRAIN_NAME") != NULL);
		json_decref(m);
	}
	m = json_pack("{s:{s:i}}", "env", "SLICETRAIN_RANK", 0); /* not a string */
	CHECK(st_proto_get_env(m, 8, &env) == ST_EPROTO && strstr(st_errmsg(), "SLICETRAIN_RANK"));
	json_decref(m);
	m = json_pack("{s:{s:s%}}", "env", "SLICETRAIN_RANK", "0\0" "1", (size_t)3); /* a NUL inside */
	CHECK(m && st_proto_get_env(m, 8, &env) == ST_EPROTO);
	json_decref(m);
	m = json_pack("{s:[]}", "env");
	CHECK(st_proto_get_env(m, 8, &env) == ST_EPROTO && strstr(st_errmsg(), "not an object"));
	json_decref(m);
	m = json_pack("{}");
	CHECK(st_proto_get_env(m, 8, &env) == ST_EPROTO);
	json_decref(m);
}

/* Read everything the peer has for up to ms; append to buf. */
static size_t slurp(int fd, char *buf, size_t have, size_t cap, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	while (have < cap && poll(&p, 1, ms) > 0) {
		ssize_t n = read(fd, buf + have, cap - have);
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	return have;
}

static void test_send_partial(void)
{
	st_proto_conn c;
	int peer;
	pair(&c, &peer);
	int small = 4096;
	setsockopt(c.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	setsockopt(peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	size_t plen = ST_PROTO_MAX_LINE - 100;
	char *p = malloc(plen + 1);
	memset(p, 'y', plen);
	p[plen] = 0;
	CHECK(st_proto_send_new(&c, json_pack("{s:s,s:s}", "type", "bulk", "p", p)) == 0);
	CHECK(c.wlen > 0);              /* it did not all fit */
	CHECK(st_proto_flush(&c) == 1); /* still some left, nobody read */
	CHECK(st_proto_send_new(&c, json_pack("{s:s}", "type", "after")) == 0);
	/* the reader drains it; flush reaches 0 */
	size_t cap = 2 * ST_PROTO_MAX_LINE, have = 0;
	char *got = malloc(cap);
	int64_t deadline = st_mono_ns() + 10 * (int64_t)1000000000;
	int fr;
	while ((fr = st_proto_flush(&c)) == 1 && st_mono_ns() < deadline)
		have = slurp(peer, got, have, cap, 10);
	CHECK(fr == 0 && c.wlen == 0);
	have = slurp(peer, got, have, cap, 50);
	/* what arrived is the two lines, in order */
	st_proto_conn r;
	int w;
	pair(&r, &w);
	int sz = 4 * ST_PROTO_MAX_LINE;
	setsockopt(w, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	put(w, got, have);
	json_t *m;
	CHECK(st_proto_recv(&r, &m) == 1);
	CHECK(json_string_length(json_object_get(m, "p")) == plen);
	json_decref(m);
	CHECK(st_proto_recv(&r, &m) == 1);
	CHECK(!strcmp(json_string_value(json_object_get(m, "type")), "after"));
	json_decref(m);
	CHECK(st_proto_recv(&r, &m) == 0);
	st_proto_conn_release(&r);
	close(w);
	/* a message longer than a line: refused, nothing queued */
	char *q = malloc(ST_PROTO_MAX_LINE + 1);
	memset(q, 'z', ST_PROTO_MAX_LINE);
	q[ST_PROTO_MAX_LINE] = 0;
	CHECK(st_proto_send_new(&c, json_pack("{s:s,s:s}", "type", "huge", "p", q)) == ST_EINVAL);
	CHECK(c.wlen == 0);
	CHECK(st_proto_send_new(&c, NULL) == ST_ENOMEM);
	/* a peer that never reads: the queue stops at its limit */
	int rc = 0, sends = 0;
	json_t *bulk = json_pack("{s:s,s:s}", "type", "bulk", "p", p);
	while (rc == 0 && sends < 1000) {
		rc = st_proto_send(&c, bulk);
		sends++;
	}
	json_decref(bulk);
	CHECK(rc == ST_EPEER && c.wlen <= ST_PROTO_MAX_QUEUE);
	CHECK(strstr(st_errmsg(), "not reading") != NULL);
	/* a peer that closed: flush fails */
	close(peer);
	CHECK(st_proto_flush(&c) == ST_EPEER);
	st_proto_conn_release(&c);
	free(p);
	free(q);
	free(got);
}

/* A client connecting (and proving tok) in a thread, as st_proto_connect blocks. */
typedef struct client {
	const char *addr;
	const st_token *tok;
	int rc, fd;
	pthread_t th;
} client;

static void *client_main(void *p)
{
	client *c = p;
	c->rc = st_proto_connect(c->addr, c->tok, st_mono_ns() + 5 * (int64_t)1000000000, &c->fd);
	return NULL;
}

/* Accept one connection on lfd as a server holding tok while cl connects:
 * 1 when the client's proof was taken (*b ready for lines), else what
 * st_proto_recv returned; cl is joined. */
static int serve_one(int lfd, const st_token *tok, client *cl, st_proto_conn *b)
{
	cl->fd = -1;
	CHECK(pthread_create(&cl->th, NULL, client_main, cl) == 0);
	int afd = -1, r = 0;
	for (int i = 0; i < 250 && afd < 0; i++) {
		struct pollfd lp = {.fd = lfd, .events = POLLIN};
		poll(&lp, 1, 20);
		CHECK(st_proto_accept(lfd, &afd) >= 0);
	}
	CHECK(afd >= 0);
	CHECK(st_proto_conn_init_server(b, afd, tok) == 0);
	json_t *m = NULL;
	for (int i = 0; i < 250 && b->auth && r == 0; i++) {
		struct pollfd p = {.fd = b->fd, .events = POLLIN | (b->wlen ? POLLOUT : 0)};
		poll(&p, 1, 20);
		if (b->wlen)
			st_proto_flush(b);
		r = st_proto_recv(b, &m);
	}
	CHECK(m == NULL);
	int ok = !b->auth;
	if (!ok) /* refused: the controller drops the connection, as the client sees */
		st_proto_conn_release(b);
	while (ok && b->wlen && st_proto_flush(b) > 0) /* the answer */
		usleep(1000);
	pthread_join(cl->th, NULL);
	return ok ? 1 : r;
}

static void mac(const uint8_t key[32], char who, const uint8_t ns[32], const uint8_t nc[32], uint8_t out[32])
{
	uint8_t msg[65];
	unsigned len = 32;
	msg[0] = (uint8_t)who;
	memcpy(msg + 1, ns, 32);
	memcpy(msg + 33, nc, 32);
	HMAC(EVP_sha256(), key, 32, msg, sizeof(msg), out, &len);
}

static void test_handshake(void)
{
	st_token right = {.set = 1, .source = "test"}, wrong = {.set = 1, .source = "test"}, none = {0};
	SHA256((const uint8_t *)"the run's own token, 32 bytes ..", 32, right.key);
	SHA256((const uint8_t *)"another token, as long as needed", 32, wrong.key);
	int lfd, port;
	CHECK(st_proto_listen("127.0.0.1", 0, &lfd, &port) == 0);
	fcntl(lfd, F_SETFL, O_NONBLOCK);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	st_proto_conn b;
	/* a wrong token, and none, are refused on both sides */
	const st_token *bad[] = {&wrong, &none};
	for (int i = 0; i < 2; i++) {
		client cl = {.addr = addr, .tok = bad[i]};
		CHECK(serve_one(lfd, &right, &cl, &b) == ST_EAUTH);
		CHECK(cl.rc == ST_EAUTH || cl.rc == ST_EPEER);
		if (cl.fd >= 0)
			close(cl.fd);
	}
	/* the right token: the proof, then a line, in one write; then a replay
	 * of that proof on a new connection (a fresh nonce) is refused */
	uint8_t hello[36], proof[68], answer[32], want[32];
	for (int round = 0; round < 2; round++) {
		int fd;
		CHECK(st_tcp_connect("127.0.0.1", port, st_mono_ns() + 2 * (int64_t)1000000000, &fd) == 0);
		int afd = -1;
		for (int i = 0; i < 250 && afd < 0; i++) {
			struct pollfd lp = {.fd = lfd, .events = POLLIN};
			poll(&lp, 1, 20);
			CHECK(st_proto_accept(lfd, &afd) >= 0);
		}
		CHECK(afd >= 0 && st_proto_conn_init_server(&b, afd, &right) == 0);
		CHECK(st_recv_full(fd, hello, sizeof(hello), st_mono_ns() + 2 * (int64_t)1000000000) == 0);
		CHECK(!memcmp(hello, "STA1", 4));
		uint8_t msg[68 + 32];
		if (round == 0) {
			memcpy(proof, "STA1", 4);
			for (int i = 0; i < 32; i++)
				proof[4 + i] = (uint8_t)(i * 7 + 1);
			mac(right.key, 'c', hello + 4, proof + 4, proof + 36);
		}
		memcpy(msg, proof, 68);
		const char *line = "{\"type\":\"hello\"}\n";
		memcpy(msg + 68, line, strlen(line));
		CHECK(st_send_full(fd, msg, 68 + strlen(line), st_mono_ns() + 2 * (int64_t)1000000000) == 0);
		json_t *m = NULL;
		int r = 0;
		for (int i = 0; i < 250 && r == 0; i++) {
			struct pollfd p = {.fd = b.fd, .events = POLLIN};
			poll(&p, 1, 20);
			r = st_proto_recv(&b, &m);
		}
		if (round == 0) {
			CHECK_MSG(r == 1 && !strcmp(json_string_value(json_object_get(m, "type")), "hello"),
				  "the right proof and a line in one write: %d (%s)", r, st_errmsg());
			json_decref(m);
			while (b.wlen && st_proto_flush(&b) > 0)
				usleep(1000);
			CHECK(st_recv_full(fd, answer, sizeof(answer), st_mono_ns() + 2 * (int64_t)1000000000) == 0);
			mac(right.key, 's', hello + 4, proof + 4, want);
			CHECK(!memcmp(answer, want, 32));
		} else {
			CHECK_MSG(r == ST_EAUTH, "a replayed proof: %d", r);
		}
		close(fd);
		st_proto_conn_release(&b);
	}
	close(lfd);
}

static void test_sockets(void)
{
	char host[64];
	int port = 0, lfd = -1, bound = 0, fd = -1, afd = -1;
	CHECK(st_proto_parse_addr("127.0.0.1:80", host, sizeof(host), &port) == 0 && port == 80 &&
	      !strcmp(host, "127.0.0.1"));
	CHECK(st_proto_parse_addr("[::1]:9", host, sizeof(host), &port) == 0 && port == 9 && !strcmp(host, "::1"));
	const char *bad[] = {"", "host", "host:", "host:0", "host:65536", ":80", "host:8x", "::1:80", NULL};
	for (int i = 0; bad[i]; i++)
		CHECK_MSG(st_proto_parse_addr(bad[i], host, sizeof(host), &port) == ST_EINVAL, "'%s'", bad[i]);
	st_token tok = {.set = 1, .key = {7}, .source = "test"};
	CHECK(st_proto_connect("nonsense", &tok, st_mono_ns() + 100000000, &fd) == ST_EINVAL);
	CHECK(st_proto_listen("no-such-host.invalid", 0, &lfd, &bound) == ST_EINVAL);

	CHECK(st_proto_listen("127.0.0.1", 0, &lfd, &bound) == 0 && bound > 0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", bound);
	fcntl(lfd, F_SETFL, O_NONBLOCK);
	CHECK(st_proto_accept(lfd, &afd) == 0 && afd == -1); /* nobody yet */
	st_proto_conn a, b;
	client cl = {.addr = addr, .tok = &tok};
	CHECK(serve_one(lfd, &tok, &cl, &b) == 1 && cl.rc == 0);
	fd = cl.fd;
	CHECK(st_proto_conn_init(&a, fd) == 0);
	CHECK(st_proto_send_new(&a, json_pack("{s:s,s:i}", "type", "hello", "pid", 42)) == 0);
	struct pollfd p = {.fd = b.fd, .events = POLLIN};
	json_t *m = NULL;
	int r = 0;
	for (int i = 0; i < 100 && r == 0; i++) {
		poll(&p, 1, 20);
		r = st_proto_recv(&b, &m);
	}
	long long pid = 0;
	CHECK(r == 1 && st_proto_get_int(m, "pid", 0, 100, &pid) == 0 && pid == 42);
	json_decref(m);
	st_proto_conn_release(&a);
	for (int i = 0; i < 100 && r != ST_EPEER; i++) {
		poll(&p, 1, 20);
		r = st_proto_recv(&b, &m);
	}
	CHECK(r == ST_EPEER);
	st_proto_conn_release(&b);
	/* nothing listens any more: connect gives up at its deadline */
	close(lfd);
	int64_t t0 = st_mono_ns();
	CHECK(st_proto_connect(addr, &tok, t0 + 300000000, &fd) == ST_EPEER);
	CHECK(st_mono_ns() - t0 < 3 * (int64_t)1000000000);
	CHECK(strstr(st_errmsg(), "cannot connect") != NULL);
	/* the wildcard listener */
	CHECK(st_proto_listen(NULL, 0, &lfd, &bound) == 0 && bound > 0);
	close(lfd);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	test_split_and_batched();
	test_limits();
	test_bad_lines();
	test_getters();
	test_get_env();
	test_beats();
	test_handshake();
	test_send_partial();
	test_sockets();
	return check_result();
}
