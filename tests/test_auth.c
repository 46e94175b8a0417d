/*
 * The run token and every check that uses it (issue 11): st_token_load and
 * its errors, st_auth_check_bind, the handshake both ways (right token,
 * wrong token, token vs none, a replayed proof, truncated, garbage and
 * oversized input, the server's state machine byte by byte), the acceptor
 * of frame.h, the store's request parser, and the store's server against
 * hostile clients: handshake failures, slowloris, the pending and client
 * caps, the memory bound, out-of-order requests; and st_group_join's token
 * errors (a bad token file, no token on a non-loopback coordinator).
 * timeout: 60
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "check.h"
#include "comm/auth.h"
#include "comm/comm.h"
#include "comm/frame.h"
#include "comm/net.h"
#include "comm/store.h"

#define SECRET "correct horse battery staple 42"
#define OTHER "a different secret of the same size"

static char tmpdir[256];

static int64_t in_ms(int ms) { return st_mono_ns() + (int64_t)ms * 1000000; }

static st_token token_of(const char *secret)
{
	st_token t;
	unsetenv("SLICETRAIN_TOKEN_FILE");
	setenv("SLICETRAIN_TOKEN", secret, 1);
	if (st_token_load(&t) != 0 || !t.set)
		fprintf(stderr, "cannot load token: %s\n", st_errmsg());
	unsetenv("SLICETRAIN_TOKEN");
	return t;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
		perror(path);
		exit(1);
	}
	fchmod(fd, mode);
	close(fd);
}

/* st_token_load with SLICETRAIN_TOKEN_FILE=path: rc, and the message never holds the token. */
static int load_file(const char *path, st_token *t, const char *secret)
{
	unsetenv("SLICETRAIN_TOKEN");
	setenv("SLICETRAIN_TOKEN_FILE", path, 1);
	int rc = st_token_load(t);
	unsetenv("SLICETRAIN_TOKEN_FILE");
	if (rc < 0 && secret && *secret)
		CHECK_MSG(strstr(st_errmsg(), secret) == NULL, "the message shows the token: %s", st_errmsg());
	return rc;
}

static void test_token_load(void)
{
	st_token t, a, b;
	char path[512];
	unsetenv("SLICETRAIN_TOKEN_FILE");
	unsetenv("SLICETRAIN_TOKEN");
	CHECK(st_token_load(&t) == 0 && !t.set && strcmp(t.source, "none") == 0);

	/* a file of mode 0600, whitespace around the token ignored: the same key as the variable */
	snprintf(path, sizeof(path), "%s/token", tmpdir);
	write_file(path, "  " SECRET "\n\n", 0600);
	CHECK(load_file(path, &a, SECRET) == 0 && a.set && strcmp(a.source, "SLICETRAIN_TOKEN_FILE") == 0);
	b = token_of(SECRET);
	CHECK(memcmp(a.key, b.key, sizeof(a.key)) == 0 && strcmp(b.source, "SLICETRAIN_TOKEN") == 0);
	t = token_of(OTHER);
	CHECK(memcmp(a.key, t.key, sizeof(a.key)) != 0);
	write_file(path, SECRET, 0400);
	CHECK(load_file(path, &t, SECRET) == 0 && memcmp(t.key, a.key, sizeof(a.key)) == 0);
	/* the file wins over the variable */
	setenv("SLICETRAIN_TOKEN", OTHER, 1);
	setenv("SLICETRAIN_TOKEN_FILE", path, 1);
	CHECK(st_token_load(&t) == 0 && memcmp(t.key, a.key, sizeof(a.key)) == 0);
	unsetenv("SLICETRAIN_TOKEN");
	unsetenv("SLICETRAIN_TOKEN_FILE");

	/* errors: readable by others or the group, missing, a directory, too short, too long, empty */
	write_file(path, SECRET, 0644);
	CHECK(load_file(path, &t, SECRET) == ST_EINVAL && strstr(st_errmsg(), "mode 0644") &&
	      strstr(st_errmsg(), path));
	write_file(path, SECRET, 0640);
	CHECK(load_file(path, &t, SECRET) == ST_EINVAL && strstr(st_errmsg(), "owner only"));
	write_file(path, SECRET, 0602);
	CHECK(load_file(path, &t, SECRET) == ST_EINVAL);
	char missing[600];
	snprintf(missing, sizeof(missing), "%s/no-such-file", tmpdir);
	CHECK(load_file(missing, &t, NULL) == ST_EINVAL && strstr(st_errmsg(), "cannot open"));
	CHECK(load_file(tmpdir, &t, NULL) == ST_EINVAL && strstr(st_errmsg(), "not a regular file"));
	write_file(path, "short secret\n", 0600);
	CHECK(load_file(path, &t, "short secret") == ST_EINVAL && strstr(st_errmsg(), "too short"));
	write_file(path, "\n", 0600);
	CHECK(load_file(path, &t, NULL) == ST_EINVAL && strstr(st_errmsg(), "too short"));
	char *big = malloc(ST_AUTH_MAX_TOKEN + 2);
	memset(big, 'x', ST_AUTH_MAX_TOKEN + 1);
	big[ST_AUTH_MAX_TOKEN + 1] = 0;
	write_file(path, big, 0600);
	CHECK(load_file(path, &t, NULL) == ST_EINVAL && strstr(st_errmsg(), "too long"));
	big[ST_AUTH_MAX_TOKEN] = 0; /* exactly the maximum */
	write_file(path, big, 0600);
	CHECK(load_file(path, &t, NULL) == 0);
	free(big);
	CHECK(load_file("", &t, NULL) == ST_EINVAL && strstr(st_errmsg(), "empty"));
	setenv("SLICETRAIN_TOKEN", "tiny", 1);
	CHECK(st_token_load(&t) == ST_EINVAL && strstr(st_errmsg(), "SLICETRAIN_TOKEN") &&
	      !strstr(st_errmsg(), "tiny"));
	setenv("SLICETRAIN_TOKEN", "", 1);
	CHECK(st_token_load(&t) == ST_EINVAL);
	unsetenv("SLICETRAIN_TOKEN");
	unlink(path);
}

static void test_check_bind(void)
{
	st_token none = { 0 }, tok = token_of(SECRET);
	const char *loop[] = { "127.0.0.1", "127.3.2.1", "::1", "localhost", "::ffff:127.0.0.1" };
	const char *wide[] = { "10.1.2.3", "0.0.0.0", "::", "*", "", "192.168.0.1", "2001:db8::1" };
	for (size_t i = 0; i < sizeof(loop) / sizeof(*loop); i++) {
		CHECK_MSG(st_auth_check_bind(&none, loop[i]) == 0, "%s", loop[i]);
		CHECK(st_auth_check_bind(&tok, loop[i]) == 0);
	}
	for (size_t i = 0; i < sizeof(wide) / sizeof(*wide); i++) {
		CHECK_MSG(st_auth_check_bind(&none, wide[i]) == ST_EINVAL && strstr(st_errmsg(), "SLICETRAIN_TOKEN_FILE"),
			  "%s: %s", wide[i], st_errmsg());
		CHECK(st_auth_check_bind(NULL, wide[i]) == ST_EINVAL);
		CHECK(st_auth_check_bind(&tok, wide[i]) == 0);
	}
	CHECK(st_auth_check_bind(&none, NULL) == ST_EINVAL && strstr(st_errmsg(), "every address"));
	CHECK(st_auth_check_bind(&none, "10.9.8.7") == ST_EINVAL && strstr(st_errmsg(), "10.9.8.7"));
}

/* ---- the handshake over a socket pair ---- */

typedef struct side {
	int fd, rc;
	const st_token *tok;
	int server;
} side;

static void *run_side(void *arg)
{
	side *s = arg;
	s->rc = s->server ? st_auth_server(s->fd, s->tok, in_ms(2000)) : st_auth_client(s->fd, s->tok, in_ms(2000));
	/* a side that refuses closes, as every user of the handshake does */
	if (s->rc < 0)
		shutdown(s->fd, SHUT_RDWR);
	return NULL;
}

/* Server with ts, client with tc: both results. */
static void pair(const st_token *ts, const st_token *tc, int *rs, int *rc)
{
	int sv[2];
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	side s = { sv[0], 0, ts, 1 }, c = { sv[1], 0, tc, 0 };
	pthread_t th;
	pthread_create(&th, NULL, run_side, &s);
	run_side(&c);
	pthread_join(th, NULL);
	close(sv[0]);
	close(sv[1]);
	*rs = s.rc;
	*rc = c.rc;
}

/* A server's side driven by hand: its hello, then the client's bytes. */
static int feed_all(st_auth_srv *a, const st_token *t, const uint8_t *p, size_t n, uint8_t mac[ST_AUTH_MAC])
{
	size_t used;
	return st_auth_srv_feed(a, t, p, n, &used, mac);
}

static void test_handshake(void)
{
	st_token tok = token_of(SECRET), other = token_of(OTHER), none = { 0 };
	int rs, rc;
	pair(&tok, &tok, &rs, &rc);
	CHECK_MSG(rs == 0 && rc == 0, "right token: server %d client %d", rs, rc);
	pair(&none, &none, &rs, &rc);
	CHECK(rs == 0 && rc == 0);
	pair(NULL, &none, &rs, &rc);
	CHECK(rs == 0 && rc == 0);
	pair(&tok, &other, &rs, &rc);
	CHECK_MSG(rs == ST_EAUTH && rc == ST_EAUTH, "wrong token: server %d client %d", rs, rc);
	pair(&tok, &none, &rs, &rc);
	CHECK_MSG(rs == ST_EAUTH && rc == ST_EAUTH, "token vs none: server %d client %d", rs, rc);
	pair(&none, &tok, &rs, &rc);
	CHECK_MSG(rs == ST_EAUTH && rc == ST_EAUTH, "none vs token: server %d client %d", rs, rc);

	/* the state machines; a server with a wrong token's answer is refused by the client */
	st_auth_srv a;
	st_auth_cli c;
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], mac[ST_AUTH_MAC];
	CHECK(st_auth_srv_start(&a, hello) == 0 && memcmp(hello, "STA1", 4) == 0);
	CHECK(st_auth_cli_answer(&c, &tok, hello, proof) == 0);
	CHECK(feed_all(&a, &tok, proof, sizeof(proof), mac) == 1 && a.done);
	CHECK(st_auth_cli_verify(&c, &tok, mac) == 0);
	CHECK(st_auth_cli_verify(&c, &other, mac) == ST_EAUTH);
	mac[5] ^= 1;
	CHECK(st_auth_cli_verify(&c, &tok, mac) == ST_EAUTH);

	/* a captured proof replayed on a new connection (a fresh server nonce) */
	uint8_t captured[ST_AUTH_PROOF];
	memcpy(captured, proof, sizeof(proof));
	for (int i = 0; i < 3; i++) {
		CHECK(st_auth_srv_start(&a, hello) == 0);
		CHECK(feed_all(&a, &tok, captured, sizeof(captured), mac) == ST_EAUTH &&
		      strstr(st_errmsg(), "wrong proof"));
	}
	/* nonces differ between connections */
	uint8_t h2[ST_AUTH_HELLO];
	st_auth_srv a2;
	st_auth_srv_start(&a2, h2);
	CHECK(memcmp(hello + 4, h2 + 4, ST_AUTH_NONCE) != 0);

	/* byte by byte: 0 until the last byte, which completes it */
	CHECK(st_auth_srv_start(&a, hello) == 0 && st_auth_cli_answer(&c, &tok, hello, proof) == 0);
	for (size_t i = 0; i < sizeof(proof); i++) {
		size_t used = 99;
		int r = st_auth_srv_feed(&a, &tok, proof + i, 1, &used, mac);
		CHECK(used == 1);
		CHECK_MSG(r == (i + 1 == sizeof(proof) ? 1 : 0), "byte %zu: %d", i, r);
	}
	CHECK(st_auth_cli_verify(&c, &tok, mac) == 0);
	size_t used = 99;
	CHECK(st_auth_srv_feed(&a, &tok, proof, 5, &used, mac) == 1 && used == 0); /* done: takes nothing more */
	CHECK(st_auth_srv_feed(&a, &tok, NULL, 0, &used, mac) == 1);

	/* oversized input: only the proof is taken, the rest is the protocol's */
	uint8_t big[1000];
	memset(big, 0xab, sizeof(big));
	CHECK(st_auth_srv_start(&a, hello) == 0 && st_auth_cli_answer(&c, &tok, hello, big) == 0);
	CHECK(st_auth_srv_feed(&a, &tok, big, sizeof(big), &used, mac) == 1 && used == ST_AUTH_PROOF);
	/* truncated: never complete */
	CHECK(st_auth_srv_start(&a, hello) == 0 && st_auth_cli_answer(&c, &tok, hello, proof) == 0);
	CHECK(st_auth_srv_feed(&a, &tok, proof, ST_AUTH_PROOF - 1, &used, mac) == 0 && !a.done);
	CHECK(st_auth_srv_feed(&a, &tok, NULL, 0, &used, mac) == 0);
	/* garbage: not the handshake; random bytes after the right magic: a wrong proof */
	unsigned seed = 5;
	for (int t = 0; t < 200; t++) {
		uint8_t g[ST_AUTH_PROOF];
		for (size_t i = 0; i < sizeof(g); i++)
			g[i] = (uint8_t)rand_r(&seed);
		if (t % 2)
			memcpy(g, "STA1", 4);
		st_auth_srv_start(&a, hello);
		CHECK(feed_all(&a, &tok, g, sizeof(g), mac) == ST_EAUTH && !a.done);
	}
	CHECK(st_auth_srv_start(&a, hello) == 0);
	CHECK(feed_all(&a, &tok, (const uint8_t *)"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789012345678901234567890123456789", 68,
		       mac) == ST_EAUTH && strstr(st_errmsg(), "not the run token's handshake"));
	/* a client facing a server that does not speak the handshake */
	memcpy(hello, "HTTP", 4);
	CHECK(st_auth_cli_answer(&c, &tok, hello, proof) == ST_EPEER);

	/* blocking sides against truncated peers: bounded by the deadline or the close */
	int sv[2];
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	CHECK(st_send_full(sv[1], proof, 10, in_ms(100)) == 0);
	shutdown(sv[1], SHUT_WR);
	int64_t t0 = st_mono_ns();
	CHECK(st_auth_server(sv[0], &tok, in_ms(2000)) == ST_EPEER && st_mono_ns() - t0 < 1500000000LL);
	close(sv[0]);
	close(sv[1]);
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	t0 = st_mono_ns();
	CHECK(st_auth_client(sv[0], &tok, in_ms(200)) == ST_EPEER); /* a silent server */
	CHECK(st_mono_ns() - t0 >= 150000000LL);
	close(sv[0]);
	close(sv[1]);
}

/* ---- frame.h: hellos, control frames, the acceptor ---- */

static int32_t pids[4] = { 100, 101, 102, 103 };
static int32_t pid_of(const void *ctx, int r) { return ((const int32_t *)ctx)[r]; }

static void test_frames(void)
{
	st_hello_rules rules = { .self = 1, .size = 4, .nonce = 77, .pid_of = pid_of, .ctx = pids };
	const char *why;
	st_frame ok = { .magic = ST_FRAME_MAGIC, .type = F_HELLO_DATA, .rank = 0, .aux = 100, .nonce = 77, .key = 5 };
	CHECK(st_hello_check(&rules, &ok, 0, &why) == F_HELLO_DATA);
	CHECK(st_hello_check(&rules, &ok, 1, &why) == -1 && strstr(why, "unix"));
	st_frame f = ok;
	f.type = F_HELLO_CTRL;
	CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "lower rank"));
	f.rank = 3;
	f.aux = 103;
	CHECK(st_hello_check(&rules, &f, 1, &why) == F_HELLO_CTRL);
	f = ok;
	f.aux = 101;
	CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "pid"));
	f = ok;
	f.nonce = 78;
	CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "nonce"));
	int bad_ranks[] = { -1, 1, 4, 1 << 30 };
	for (size_t i = 0; i < sizeof(bad_ranks) / sizeof(*bad_ranks); i++) {
		f = ok;
		f.rank = bad_ranks[i];
		CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "member"));
	}
	f = ok;
	f.type = F_HB;
	CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "not a hello"));
	f = ok;
	f.magic ^= 1;
	CHECK(st_hello_check(&rules, &f, 0, &why) == -1 && strstr(why, "magic"));
	/* a hello replayed from an older generation (a stale worker back after a
	 * partition), and one from a newer: refused, whatever its nonce */
	st_hello_rules r7 = rules;
	r7.gen = 7;
	f = ok;
	f.gen = 6;
	CHECK(st_hello_check(&r7, &f, 0, &why) == -1 && strstr(why, "older generation"));
	f.gen = 8;
	CHECK(st_hello_check(&r7, &f, 0, &why) == -1 && strstr(why, "newer generation"));
	f.gen = 7;
	CHECK(st_hello_check(&r7, &f, 0, &why) == F_HELLO_DATA);
	uint8_t raw[48];
	memcpy(raw, &ok, sizeof(ok));
	CHECK(st_frame_decode(raw, 40, &f, &why) == 0 && f.key == 5);
	CHECK(st_frame_decode(raw, 39, &f, &why) == -1 && st_frame_decode(raw, 41, &f, &why) == -1);

	/* control frames and abort reasons */
	int reason, arank;
	st_frame ab = { .magic = ST_FRAME_MAGIC, .type = F_ABORT, .rank = 2, .aux = 2, .nonce = 77, .key = 3 };
	CHECK(st_ctrl_frame_check(&ab, 77, 0, 2, 4, 5, &reason, &arank, &why) == F_ABORT && reason == 2 && arank == 3);
	ab.key = 9;
	CHECK(st_ctrl_frame_check(&ab, 77, 0, 2, 4, 5, &reason, &arank, &why) == F_ABORT && reason == 0 && arank == 2);
	CHECK(st_ctrl_frame_check(&ab, 77, 0, 1, 4, 5, &reason, &arank, &why) == -1);
	CHECK(st_ctrl_frame_check(&ab, 78, 0, 2, 4, 5, &reason, &arank, &why) == -1);
	/* replayed from an older generation (the same nonce, to be sure the generation decides) */
	ab.gen = 6;
	CHECK(st_ctrl_frame_check(&ab, 77, 7, 2, 4, 5, &reason, &arank, &why) == -1 && strstr(why, "generation"));
	ab.gen = 7;
	CHECK(st_ctrl_frame_check(&ab, 77, 7, 2, 4, 5, &reason, &arank, &why) == F_ABORT);

	/* the acceptor, byte by byte: hello, proof, answer, hello frame; nothing read past it */
	st_token tok = token_of(SECRET);
	st_accept acc;
	st_auth_cli c;
	uint8_t hello[ST_AUTH_HELLO], stream[ST_AUTH_PROOF + sizeof(st_frame) + 8], answer[ST_AUTH_MAC];
	CHECK(st_accept_start(&acc, 1, hello) == 0);
	CHECK(st_auth_cli_answer(&c, &tok, hello, stream) == 0);
	memcpy(stream + ST_AUTH_PROOF, &ok, sizeof(ok));
	memset(stream + ST_AUTH_PROOF + sizeof(ok), 0xee, 8); /* payload that belongs to comm.c */
	size_t off = 0;
	int answered = 0, got = 0;
	while (off < sizeof(stream) && !got) {
		size_t want = st_accept_want(&acc), used;
		CHECK(want >= 1 && want <= ST_AUTH_PROOF);
		st_frame hf;
		int k = st_accept_feed(&acc, &tok, stream + off, 1, &used, answer, &hf);
		off += used;
		if (k == ST_ACCEPT_ANSWER) {
			answered++;
			CHECK(st_auth_cli_verify(&c, &tok, answer) == 0);
		} else if (k == ST_ACCEPT_HELLO) {
			got = 1;
			CHECK(memcmp(&hf, &ok, sizeof(ok)) == 0);
		} else {
			CHECK(k == ST_ACCEPT_MORE);
		}
	}
	CHECK(answered == 1 && got && off == ST_AUTH_PROOF + sizeof(ok));
	/* the wrong token stops it at the proof; unix connections have no handshake */
	st_token other = token_of(OTHER);
	CHECK(st_accept_start(&acc, 1, hello) == 0 && st_auth_cli_answer(&c, &other, hello, stream) == 0);
	size_t used;
	st_frame hf;
	CHECK(st_accept_feed(&acc, &tok, stream, ST_AUTH_PROOF, &used, answer, &hf) == ST_EAUTH);
	CHECK(st_accept_start(&acc, 0, NULL) == 0 && st_accept_want(&acc) == sizeof(st_frame));
	CHECK(st_accept_feed(&acc, &tok, (const uint8_t *)&ok, sizeof(ok), &used, answer, &hf) == ST_ACCEPT_HELLO);
}

/* ---- the store's parser and server ---- */

/* A request of generation gen into buf; its size. */
static size_t req_gen(uint8_t *buf, uint32_t op, const char *key, const void *val, uint32_t vl, uint64_t gen)
{
	uint32_t h[3] = { op, (uint32_t)strlen(key), vl };
	memcpy(buf, h, 12);
	memcpy(buf + 12, &gen, 8);
	memcpy(buf + ST_STORE_HEADER, key, strlen(key));
	if (vl)
		memcpy(buf + ST_STORE_HEADER + strlen(key), val, vl);
	return ST_STORE_HEADER + strlen(key) + vl;
}

static size_t req(uint8_t *buf, uint32_t op, const char *key, const void *val, uint32_t vl)
{
	return req_gen(buf, op, key, val, vl, 0);
}

static void test_store_parse(void)
{
	uint8_t b[256];
	st_store_req q;
	size_t n = req(b, ST_STORE_SET, "key", "value", 5);
	CHECK(st_store_parse_request(b, n, &q) == 1 && q.size == n && q.key_len == 3 && q.val_len == 5 &&
	      memcmp(q.val, "value", 5) == 0);
	for (size_t k = 0; k < n; k++)
		CHECK(st_store_parse_request(b, k, &q) == 0 && q.size == (k >= ST_STORE_HEADER ? n : 0));
	CHECK(st_store_parse_request(b, n + 10, &q) == 1 && q.size == n); /* what follows is not its business */
	int64_t d = 1;
	n = req(b, ST_STORE_ADD, "c", &d, 8);
	CHECK(st_store_parse_request(b, n, &q) == 1);
	uint32_t bad[][3] = { { 0, 1, 0 }, { 4, 1, 0 }, { 1, 0, 0 }, { 1, 1025, 0 }, { 1, 1, (64u << 20) + 1 },
			      { 2, 1, 1 }, { 3, 1, 7 }, { 3, 1, 9 }, { 0xffffffffu, 0xffffffffu, 0xffffffffu } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		memset(b, 'k', sizeof(b));
		memcpy(b, bad[i], 12);
		CHECK_MSG(st_store_parse_request(b, sizeof(b), &q) == ST_EPROTO, "case %zu", i);
	}
	n = req(b, ST_STORE_GET, "a\0b", NULL, 0);
	uint32_t kl = 3;
	memcpy(b + 4, &kl, 4);
	memcpy(b + ST_STORE_HEADER, "a\0b", 3);
	CHECK(st_store_parse_request(b, ST_STORE_HEADER + 3, &q) == ST_EPROTO && strstr(st_errmsg(), "NUL"));
	n = req_gen(b, ST_STORE_GET, "g", NULL, 0, 1ull << 40);
	CHECK(st_store_parse_request(b, n, &q) == 1 && q.generation == 1ull << 40);
}

/* An engine connection past the handshake with token t. -1 when refused. */
static int engine_client(st_store_server *s, const st_token *t)
{
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], *out;
	size_t n;
	st_auth_cli c;
	int id = st_store_engine_open(s, hello);
	if (id < 0 || st_auth_cli_answer(&c, t, hello, proof) < 0 || st_store_engine_input(s, id, proof, sizeof(proof)) < 0)
		return -1;
	if (st_store_engine_take(s, id, &out, &n) < 0)
		return -1;
	int ok = n == ST_AUTH_MAC && st_auth_cli_verify(&c, t, out) == 0;
	free(out);
	return ok ? id : -1;
}

/* One request on engine connection id: the answer's value length, or -1 when dropped / -2 no answer yet. */
static long engine_req(st_store_server *s, int id, uint32_t op, const char *key, const void *val, uint32_t vl)
{
	uint8_t *b = malloc(ST_STORE_HEADER + strlen(key) + vl), *out;
	size_t n = req(b, op, key, val, vl);
	int r = st_store_engine_input(s, id, b, n);
	free(b);
	if (r < 0)
		return -1;
	st_store_engine_take(s, id, &out, &n);
	long len = n >= 8 ? (long)((uint32_t *)out)[1] : -2;
	free(out);
	return len;
}

static void test_store_engine(void)
{
	st_token tok = token_of(SECRET), other = token_of(OTHER);
	st_store_limits lim = { .max_clients = 3, .max_pending = 2, .max_bytes = 1 << 20 };
	st_store_server *s;
	CHECK(st_store_engine_new(&s, &tok, &lim) == 0);
	int a = engine_client(s, &tok);
	CHECK(a >= 0);
	CHECK(engine_client(s, &other) == -1 && strstr(st_errmsg(), "wrong proof"));
	CHECK(engine_client(s, NULL) == -1);
	CHECK(engine_req(s, a, ST_STORE_SET, "k", "v", 1) == 0);
	CHECK(engine_req(s, a, ST_STORE_GET, "k", NULL, 0) == 1);
	/* a request byte by byte */
	uint8_t b[64], *out;
	size_t n = req(b, ST_STORE_GET, "k", NULL, 0), m;
	for (size_t i = 0; i < n; i++)
		CHECK(st_store_engine_input(s, a, b + i, 1) == 0);
	CHECK(st_store_engine_take(s, a, &out, &m) == 0 && m == 9 && out[8] == 'v');
	free(out);
	/* two requests at once (the second before the first's answer): dropped */
	uint8_t two[64];
	size_t n1 = req(two, ST_STORE_GET, "k", NULL, 0);
	n1 += req(two + n1, ST_STORE_GET, "k", NULL, 0);
	CHECK(st_store_engine_input(s, a, two, n1) < 0 && strstr(st_errmsg(), "before the answer"));
	/* a request while a GET is parked: dropped */
	a = engine_client(s, &tok);
	CHECK(engine_req(s, a, ST_STORE_GET, "later", NULL, 0) == -2);
	CHECK(engine_req(s, a, ST_STORE_GET, "k", NULL, 0) == -1);
	/* bytes before the proof is answered... garbage after a valid request header */
	a = engine_client(s, &tok);
	uint32_t h[5] = { 9, 1, 0, 0, 0 };
	CHECK(st_store_engine_input(s, a, h, ST_STORE_HEADER) < 0 && strstr(st_errmsg(), "unknown request"));
	/* ADD on a value that is not a counter */
	a = engine_client(s, &tok);
	int64_t one = 1;
	CHECK(engine_req(s, a, ST_STORE_ADD, "k", &one, 8) == -1 && strstr(st_errmsg(), "counter"));
	a = engine_client(s, &tok);
	CHECK(engine_req(s, a, ST_STORE_ADD, "n", &one, 8) == 8 && engine_req(s, a, ST_STORE_ADD, "n", &one, 8) == 8);

	/* a request replayed from an older generation, and one from a newer, on
	 * a store of generation 7: refused (the connection dropped), whatever
	 * the op; generation 7's are served */
	st_store_limits lim7 = lim;
	lim7.generation = 7;
	st_store_server *s7;
	CHECK(st_store_engine_new(&s7, &tok, &lim7) == 0);
	uint8_t rb[64];
	int c7 = engine_client(s7, &tok);
	size_t rn = req_gen(rb, ST_STORE_SET, "ep/1", "x", 1, 7);
	CHECK(st_store_engine_input(s7, c7, rb, rn) == 0);
	for (int g = 0; g < 2; g++) {
		uint32_t ops[3] = { ST_STORE_SET, ST_STORE_GET, ST_STORE_ADD };
		for (int o = 0; o < 3; o++) {
			int cs = engine_client(s7, &tok);
			rn = req_gen(rb, ops[o], "ep/1", &one, ops[o] == ST_STORE_GET ? 0 : ops[o] == ST_STORE_ADD ? 8 : 1,
				     g ? 8 : 6);
			CHECK_MSG(st_store_engine_input(s7, cs, rb, rn) < 0 &&
				  strstr(st_errmsg(), g ? "newer than the store's 7" : "older than the store's 7"), "'%s'",
				  st_errmsg());
		}
	}
	int c7b = engine_client(s7, &tok);
	rn = req_gen(rb, ST_STORE_GET, "ep/1", NULL, 0, 7);
	CHECK(st_store_engine_input(s7, c7b, rb, rn) == 0);
	CHECK(st_store_engine_take(s7, c7b, &out, &m) == 0 && m == 9 && out[8] == 'x'); /* the stale SET did not land */
	free(out);
	st_store_server_stop(s7);

	/* the memory bound: a value over it, then many keys until the bound */
	int64_t base = st_store_engine_bytes(s);
	char *big = calloc(1, 2 << 20);
	int c2 = engine_client(s, &tok);
	CHECK(engine_req(s, c2, ST_STORE_SET, "big", big, 2 << 20) == -1 && strstr(st_errmsg(), "bound"));
	CHECK(st_store_engine_bytes(s) == base); /* its buffer is given back */
	c2 = engine_client(s, &tok);
	int stored = 0;
	for (int i = 0; i < 100; i++) {
		char key[32];
		snprintf(key, sizeof(key), "k%d", i);
		long r = engine_req(s, c2, ST_STORE_SET, key, big, 100 << 10);
		if (r < 0)
			break;
		stored++;
	}
	CHECK_MSG(stored >= 8 && stored <= 10, "%d values of 100 KiB under a 1 MiB bound", stored);
	CHECK(st_store_engine_bytes(s) <= (1 << 20) && st_store_engine_bytes(s) > (1 << 20) - (200 << 10));
	/* GETs share the value: N parked readers of one value cost their keys only */
	int w[2];
	for (int i = 0; i < 2; i++) {
		w[i] = engine_client(s, &tok);
		CHECK(engine_req(s, w[i], ST_STORE_GET, "late", NULL, 0) == -2);
	}
	c2 = engine_client(s, &tok);
	CHECK(c2 < 0 && strstr(st_errmsg(), "too many clients")); /* max_clients 3 */
	st_store_engine_close(s, w[1]);
	c2 = engine_client(s, &tok);
	CHECK(c2 >= 0);
	for (int i = 0; i < 4; i++) { /* make room */
		char key[32];
		snprintf(key, sizeof(key), "k%d", i);
		CHECK(engine_req(s, c2, ST_STORE_SET, key, "x", 1) == 0);
	}
	int64_t before = st_store_engine_bytes(s);
	CHECK(engine_req(s, c2, ST_STORE_SET, "late", big, 200 << 10) == 0);
	CHECK(st_store_engine_bytes(s) <= before + (200 << 10) + 1024); /* the value once, not per reader */
	CHECK(st_store_engine_take(s, w[0], &out, &m) == 0 && m == 8 + (200 << 10));
	free(out);
	free(big);
	/* pending cap: a third connection in the handshake evicts the oldest */
	uint8_t hello[ST_AUTH_HELLO];
	int p1 = st_store_engine_open(s, hello), p2 = st_store_engine_open(s, hello);
	unsigned long drops = st_store_server_drops(s);
	int p3 = st_store_engine_open(s, hello); /* evicts p1 (and takes its slot) */
	CHECK(p1 >= 0 && p2 >= 0 && p3 >= 0 && st_store_server_drops(s) == drops + 1);
	CHECK(st_store_engine_input(s, p2, "x", 1) == 0 && st_store_engine_input(s, p3, "x", 1) == 0);
	st_store_server_stop(s);
}

/* A raw TCP connection to the store: the hello read, then what to send. */
static int raw(int port, uint8_t hello[ST_AUTH_HELLO])
{
	int fd;
	if (st_tcp_connect("127.0.0.1", port, in_ms(1000), &fd) < 0)
		return -1;
	if (hello && st_recv_full(fd, hello, ST_AUTH_HELLO, in_ms(1000)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* 1 when the server closes fd within ms. */
static int closed_within(int fd, int ms)
{
	char b[64];
	for (;;) {
		int r = st_recv_full(fd, b, 1, in_ms(ms));
		if (r == -ECONNRESET)
			return 1;
		if (r < 0)
			return 0;
	}
}

static void test_store_server(void)
{
	st_token tok = token_of(SECRET), other = token_of(OTHER), none = { 0 };
	st_store_limits lim = { .auth_timeout_ms = 300, .max_pending = 8 };
	st_store_server *srv;
	CHECK(st_store_serve(&srv, "10.1.2.3", 0, &none, NULL) == ST_EINVAL); /* no token: loopback only */
	CHECK(st_store_serve(&srv, "127.0.0.1", 0, &tok, &lim) == 0);
	int port = st_store_server_port(srv);
	st_store *c;
	int64_t dl = in_ms(3000);
	void *v;
	size_t n;
	CHECK(st_store_connect(&c, "127.0.0.1", port, &tok, dl) == 0);
	CHECK(st_store_set(c, "a", "hello", 5) == 0);
	/* answers with a value come in one segment: 20 GETs take nowhere near
	 * 20 delayed ACKs (40 ms each, when header and value went apart) */
	int64_t t0 = st_mono_ns();
	for (int i = 0; i < 20; i++) {
		CHECK(st_store_get(c, "a", &v, &n, dl) == 0 && n == 5);
		free(v);
	}
	CHECK_MSG(st_mono_ns() - t0 < 400000000LL, "20 GETs took %.0f ms", (st_mono_ns() - t0) / 1e6);
	st_store_close(c);
	/* a wrong token, no token: refused at once (not after the deadline), and counted */
	unsigned long d0 = st_store_server_drops(srv);
	t0 = st_mono_ns();
	CHECK(st_store_connect(&c, "127.0.0.1", port, &other, dl) == ST_EAUTH && strstr(st_errmsg(), "handshake"));
	CHECK(st_store_connect(&c, "127.0.0.1", port, &none, dl) == ST_EAUTH);
	CHECK(st_store_connect(&c, "127.0.0.1", port, NULL, dl) == ST_EAUTH);
	CHECK(st_mono_ns() - t0 < 2000000000LL);
	usleep(50000);
	CHECK(st_store_server_drops(srv) >= d0 + 9);
	/* a captured proof replayed on a new connection */
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], mac[ST_AUTH_MAC];
	st_auth_cli ac;
	int fd = raw(port, hello);
	CHECK(fd >= 0 && st_auth_cli_answer(&ac, &tok, hello, proof) == 0);
	CHECK(st_send_full(fd, proof, sizeof(proof), in_ms(1000)) == 0);
	CHECK(st_recv_full(fd, mac, sizeof(mac), in_ms(1000)) == 0 && st_auth_cli_verify(&ac, &tok, mac) == 0);
	close(fd);
	fd = raw(port, hello);
	CHECK(st_send_full(fd, proof, sizeof(proof), in_ms(1000)) == 0);
	CHECK(closed_within(fd, 1000));
	close(fd);
	/* slowloris: silent, or one byte short of the proof: dropped after the time limit */
	int s1 = raw(port, hello), s2 = raw(port, hello);
	CHECK(st_send_full(s2, proof, sizeof(proof) - 1, in_ms(1000)) == 0);
	t0 = st_mono_ns();
	CHECK(closed_within(s1, 2000) && closed_within(s2, 2000));
	CHECK(st_mono_ns() - t0 >= 200000000LL);
	close(s1);
	close(s2);
	/* a flood of silent connections: the oldest are evicted, a real client still gets in */
	int fl[20];
	for (int i = 0; i < 20; i++)
		fl[i] = raw(port, NULL);
	CHECK(st_store_connect(&c, "127.0.0.1", port, &tok, in_ms(3000)) == 0);
	CHECK(st_store_get(c, "a", &v, &n, in_ms(1000)) == 0 && n == 5);
	free(v);
	st_store_close(c);
	CHECK(closed_within(fl[0], 1000));
	for (int i = 0; i < 20; i++)
		close(fl[i]);
	/* garbage and random bytes from many clients: the store keeps serving */
	unsigned seed = 11;
	for (int t = 0; t < 100; t++) {
		fd = raw(port, NULL);
		uint8_t g[128];
		size_t len = 1 + (size_t)rand_r(&seed) % sizeof(g);
		for (size_t i = 0; i < len; i++)
			g[i] = (uint8_t)rand_r(&seed);
		if (fd >= 0 && send(fd, g, len, MSG_NOSIGNAL) < 0) {
		}
		close(fd);
	}
	CHECK(st_store_connect(&c, "127.0.0.1", port, &tok, in_ms(3000)) == 0);
	CHECK(st_store_get(c, "a", &v, &n, in_ms(1000)) == 0 && n == 5);
	free(v);
	st_store_close(c);
	st_store_server_stop(srv);
}

/* ---- st_group_join: the token's errors ---- */

static void test_group_join(void)
{
	st_group_env e = { .rank = 1, .world_size = 2, .num_slices = 1, .slice_id = 0, .source = "test" };
	st_group_opts o = { .env = &e, .join_timeout_ms = 500 };
	st_group *g;
	char path[512];
	unsetenv("SLICETRAIN_TOKEN");
	unsetenv("SLICETRAIN_TOKEN_FILE");
	/* no token and a coordinator beyond loopback: refused before anything listens */
	snprintf(e.coordinator, sizeof(e.coordinator), "10.255.255.1:29500");
	CHECK(st_group_join(&g, &o) == ST_EINVAL && strstr(st_errmsg(), "10.255.255.1") &&
	      strstr(st_errmsg(), "SLICETRAIN_TOKEN_FILE"));
	CHECK(st_exit_status(ST_EINVAL) == 2);
	/* a bad token file: a clear error, also for a single process */
	snprintf(path, sizeof(path), "%s/token", tmpdir);
	write_file(path, SECRET, 0644);
	setenv("SLICETRAIN_TOKEN_FILE", path, 1);
	snprintf(e.coordinator, sizeof(e.coordinator), "127.0.0.1:29500");
	CHECK(st_group_join(&g, &o) == ST_EINVAL && strstr(st_errmsg(), "0644"));
	st_group_env one = { .rank = 0, .world_size = 1, .num_slices = 1, .source = "test" };
	o.env = &one;
	CHECK(st_group_join(&g, &o) == ST_EINVAL);
	unsetenv("SLICETRAIN_TOKEN_FILE");
	unlink(path);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "%s/test_auth.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_token_load();
	test_check_bind();
	test_handshake();
	test_frames();
	test_store_parse();
	test_store_engine();
	test_store_server();
	test_group_join();
	rmdir(tmpdir);
	return check_result();
}
