/*
 * fuzz_store - the rendezvous store's server (comm/store.h) as its clients
 * reach it: the run token's handshake, then requests, on up to four
 * connections at once, through the same connection state machine the
 * served store runs (st_store_engine_*: no socket, no thread, so an input
 * replays exactly), plus the pure request parser on every piece.
 *
 * The target holds the run's token: a connection opens with a correct
 * proof (st_auth_cli_answer, so that the fuzzer's bytes reach the request
 * parser), or with the input's own 68 bytes, or with a correct proof with
 * one byte flipped (both must be refused).
 *
 * Input: byte 0: bits 0-1 the handshake of every (re)opened connection (0,
 * 3: correct; 1: the next 68 input bytes; 2: correct with one byte flipped,
 * chosen by the next byte), bit 2: small limits (64 KiB of memory, 2
 * clients, 2 pending), else the defaults. Then commands, each a byte h and
 * its operands, on connection h & 3 (reopened when it was dropped):
 *   (h >> 2) & 3 == 0: raw bytes: a length byte, then that many bytes;
 *   1: take what the server sends it, and check it;
 *   2: close it (it is reopened on its next use);
 *   3: a well-formed request: op byte (% 3 + 1), key length byte (% 8 + 1),
 *      the key, then for SET a 2-byte value length in units of 16 bytes
 *      (values up to 128 KiB, zero-filled), for ADD 8 bytes of delta.
 * Checked beyond "no crash, no leak, no sanitizer report": the bytes held
 * never pass the bound; a wrong proof never gets an answer; what the server
 * sends after the handshake is answers (status 0, a length that matches);
 * the parser's verdict on a piece is consistent (a complete request lies
 * inside the piece and its key has no NUL byte).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_store"
#include "comm_fuzz.h"
#include "comm/auth.h"
#include "comm/store.h"


enum { NCONN = 4 };

static st_token tok;

typedef struct input {
	const uint8_t *p;
	size_t n;
} input;

static int next(input *in)
{
	if (!in->n)
		return -1;
	in->n--;
	return *in->p++;
}

typedef struct conn {
	int id;      /* -1: not open */
	int authed;  /* the handshake was accepted */
} conn;

typedef struct fuzz {
	st_store_server *s;
	int64_t max_bytes;
	int mode;
	conn c[NCONN];
} fuzz;

/* What the server sent connection k: after the handshake, answers only. */
static void take(fuzz *f, int k)
{
	uint8_t *out;
	size_t n;
	if (f->c[k].id < 0 || st_store_engine_take(f->s, f->c[k].id, &out, &n) < 0)
		return;
	size_t off = 0;
	while (off < n) {
		uint32_t h[2];
		FUZZ_ASSERT(n - off >= sizeof(h));
		memcpy(h, out + off, sizeof(h));
		FUZZ_ASSERT(h[0] == 0 && h[1] <= ST_STORE_MAX_VALUE && n - off - sizeof(h) >= h[1]);
		off += sizeof(h) + h[1];
	}
	free(out);
}

/* Open connection k with the input's handshake mode. */
static void open_conn(fuzz *f, int k, input *in)
{
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], *out;
	size_t n;
	st_auth_cli cli;
	conn *c = &f->c[k];
	c->authed = 0;
	c->id = st_store_engine_open(f->s, hello);
	if (c->id < 0)
		return;
	/* a new connection may have evicted another in the handshake (same slot reused) */
	for (int j = 0; j < NCONN; j++)
		if (j != k && f->c[j].id == c->id)
			f->c[j].id = -1;
	FUZZ_ASSERT(memcmp(hello, "STA1", 4) == 0);
	FUZZ_ASSERT(st_auth_cli_answer(&cli, &tok, hello, proof) == 0);
	int right = 1;
	if (f->mode == 1) {
		for (size_t i = 0; i < sizeof(proof); i++) {
			int b = next(in);
			proof[i] = (uint8_t)(b < 0 ? 0 : b);
		}
		right = 0; /* (a guessed proof: probability 2^-256) */
	} else if (f->mode == 2) {
		int b = next(in);
		proof[(b < 0 ? 0 : b) % sizeof(proof)] ^= 0x5a;
		right = 0;
	}
	int r = st_store_engine_input(f->s, c->id, proof, sizeof(proof));
	if (r < 0) {
		FUZZ_ASSERT(!right || strstr(st_errmsg(), "too many clients"));
		c->id = -1;
		return;
	}
	FUZZ_ASSERT(right);
	FUZZ_ASSERT(st_store_engine_take(f->s, c->id, &out, &n) == 0 && n == ST_AUTH_MAC);
	FUZZ_ASSERT(st_auth_cli_verify(&cli, &tok, out) == 0);
	free(out);
	c->authed = 1;
}

static void check_parse(const uint8_t *p, size_t n)
{
	st_store_req q;
	int r = st_store_parse_request(p, n, &q);
	FUZZ_ASSERT(r == 0 || r == 1 || r == ST_EPROTO);
	if (r == 1) {
		FUZZ_ASSERT(q.size <= n && q.key == p + ST_STORE_HEADER && q.key_len >= 1 &&
			    q.key_len <= ST_STORE_MAX_KEY && q.val == q.key + q.key_len &&
			    q.size == ST_STORE_HEADER + (size_t)q.key_len + q.val_len);
		FUZZ_ASSERT(!memchr(q.key, 0, q.key_len));
	}
}

/* Feed connection k bytes p[0..n); a drop closes it. */
static void feed(fuzz *f, int k, const uint8_t *p, size_t n)
{
	check_parse(p, n);
	if (st_store_engine_input(f->s, f->c[k].id, p, n) < 0)
		f->c[k].id = -1;
	FUZZ_ASSERT(st_store_engine_bytes(f->s) <= f->max_bytes);
}

/* A well-formed request from the input's operands. */
static void request(fuzz *f, int k, input *in)
{
	int op = next(in), kl = next(in);
	if (op < 0 || kl < 0)
		return;
	op = op % 3 + 1;
	kl = kl % 8 + 1;
	char key[8];
	for (int i = 0; i < kl; i++) {
		int b = next(in);
		key[i] = (char)(b <= 0 ? 'k' : b);
	}
	size_t vl = 0;
	if (op == ST_STORE_SET) {
		int lo = next(in), hi = next(in);
		vl = ((size_t)(lo < 0 ? 0 : lo) | (size_t)(hi < 0 ? 0 : hi) << 8) * 16;
		if (vl > (128 << 10)) /* past the small limits' bound, and fast */
			vl = 128 << 10;
	} else if (op == ST_STORE_ADD) {
		vl = 8;
	}
	uint8_t *b = calloc(1, ST_STORE_HEADER + (size_t)kl + vl);
	uint32_t h[3] = { (uint32_t)op, (uint32_t)kl, (uint32_t)vl };
	memcpy(b, h, sizeof(h));
	memcpy(b + ST_STORE_HEADER, key, (size_t)kl);
	for (size_t i = 0; op == ST_STORE_ADD && i < 8; i++) {
		int x = next(in);
		b[ST_STORE_HEADER + kl + i] = (uint8_t)(x < 0 ? 0 : x);
	}
	feed(f, k, b, ST_STORE_HEADER + (size_t)kl + vl);
	free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	comm_fuzz_token(&tok);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	input in = { data, size };
	int flags = next(&in);
	if (flags < 0)
		return 0;
	fuzz f = { .mode = flags & 3 };
	st_store_limits small = { .max_clients = 2, .max_pending = 2, .max_bytes = 64 << 10 };
	const st_store_limits *lim = flags & 4 ? &small : NULL;
	f.max_bytes = lim ? lim->max_bytes : (int64_t)256 << 20;
	if (f.mode == 3)
		f.mode = 0;
	FUZZ_ASSERT(st_store_engine_new(&f.s, &tok, lim) == 0);
	for (int k = 0; k < NCONN; k++)
		f.c[k].id = -1;
	for (int steps = 0; steps < 4096; steps++) {
		int h = next(&in);
		if (h < 0)
			break;
		int k = h & 3, kind = (h >> 2) & 3;
		if (kind == 2) {
			if (f.c[k].id >= 0)
				st_store_engine_close(f.s, f.c[k].id);
			f.c[k].id = -1;
			continue;
		}
		if (f.c[k].id < 0)
			open_conn(&f, k, &in);
		if (f.c[k].id < 0)
			continue;
		if (kind == 0) {
			int len = next(&in);
			if (len < 0)
				break;
			if ((size_t)len > in.n)
				len = (int)in.n;
			feed(&f, k, in.p, (size_t)len);
			in.p += len;
			in.n -= (size_t)len;
		} else if (kind == 1) {
			take(&f, k);
		} else {
			request(&f, k, &in);
		}
	}
	for (int k = 0; k < NCONN; k++)
		take(&f, k);
	check_parse(data, size);
	st_store_server_stop(f.s);
	return 0;
}
