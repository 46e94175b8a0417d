/*
 * test_data.c - token files, sample order and malformed input for src/data/.
 *
 * Writes its files into a mkdtemp directory (removed at the end): llm.c .bin
 * shards, .npy arrays of every supported dtype and version, globs over
 * several files, and one file per malformed case. A mutation loop at the end
 * feeds thousands of damaged headers to the parsers (run under ASan/UBSan).
 */
#include <ftw.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/rng.h"
#include "check.h"
#include "data/data.h"

static char tmpdir[] = "/tmp/test_data.XXXXXX";
static char pathbuf[8][4096];
static int pathslot;

/* A path inside tmpdir; a few can be live at once. */
static const char *tpath(const char *name)
{
	char *p = pathbuf[pathslot++ % 8];
	snprintf(p, sizeof(pathbuf[0]), "%s/%s", tmpdir, name);
	return p;
}

static void write_bytes(const char *name, const void *data, size_t len)
{
	FILE *f = fopen(tpath(name), "wb");
	if (!f) {
		perror(name);
		exit(1);
	}
	if (len && fwrite(data, 1, len, f) != len) {
		perror(name);
		exit(1);
	}
	fclose(f);
}

/* Growable byte buffer for composing files. */
struct buf {
	unsigned char *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (!n)
		return;
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void put_le(struct buf *b, uint64_t v, int size)
{
	unsigned char t[8];
	for (int i = 0; i < size; i++)
		t[i] = (unsigned char)(v >> (8 * i));
	put(b, t, (size_t)size);
}

/* llm.c shard: header[0..2] = magic, version, count; tokens as itemsize bytes. */
static void write_bin(const char *name, int32_t magic, int32_t version, int32_t count,
		      const uint64_t *toks, size_t ntoks, int itemsize)
{
	struct buf b = { 0 };
	int32_t hdr[256] = { 0 };
	hdr[0] = magic;
	hdr[1] = version;
	hdr[2] = count;
	for (int i = 0; i < 256; i++)
		put_le(&b, (uint32_t)hdr[i], 4);
	for (size_t i = 0; i < ntoks; i++)
		put_le(&b, toks[i], itemsize);
	write_bytes(name, b.p, b.n);
	free(b.p);
}

static void write_bin16(const char *name, const uint64_t *toks, size_t n)
{
	write_bin(name, 20240520, 1, (int32_t)n, toks, n, 2);
}

static void write_bin32(const char *name, const uint64_t *toks, size_t n)
{
	write_bin(name, 20240801, 7, (int32_t)n, toks, n, 4);
}

/* .npy with the given header dict text verbatim (padded as numpy pads it). */
static void write_npy_raw(const char *name, int major, const char *dict, const void *data, size_t len)
{
	struct buf b = { 0 };
	size_t pre = major == 1 ? 10 : 12;
	size_t hl = strlen(dict) + 1;
	while ((pre + hl) % 64)
		hl++;
	put(&b, "\x93NUMPY", 6);
	unsigned char ver[2] = { (unsigned char)major, 0 };
	put(&b, ver, 2);
	put_le(&b, hl, major == 1 ? 2 : 4);
	put(&b, dict, strlen(dict));
	for (size_t i = strlen(dict); i + 1 < hl; i++)
		put(&b, " ", 1);
	put(&b, "\n", 1);
	put(&b, data, len);
	write_bytes(name, b.p, b.n);
	free(b.p);
}

/* .npy of values vals[0..n-1] stored as descr ('<i4', '|u1', ...). */
static void write_npy(const char *name, int major, const char *descr, const char *shape,
		      const int64_t *vals, size_t n)
{
	int size = descr[2] - '0';
	struct buf d = { 0 };
	for (size_t i = 0; i < n; i++)
		put_le(&d, (uint64_t)vals[i], size);
	char dict[256];
	snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
	write_npy_raw(name, major, dict, d.p, d.n);
	free(d.p);
}

static st_config cfg_tokens(const char *path, int64_t T, int64_t vocab, int shuffle, int64_t seed)
{
	st_config c;
	memset(&c, 0, sizeof(c));
	c.dataset_type = ST_DATA_TOKENS;
	snprintf(c.dataset_path, sizeof(c.dataset_path), "%s", path);
	c.max_target_length = T;
	c.vocab_size = vocab;
	c.enable_data_shuffling = shuffle;
	c.data_shuffle_seed = seed;
	return c;
}

static st_dataset *open_ok(const st_config *c, int64_t rows)
{
	st_dataset *ds = NULL;
	int rc = st_dataset_open(&ds, c, rows);
	CHECK_MSG(rc == 0 && ds, "open %s: rc %d: %s", c->dataset_path, rc, st_errmsg());
	return rc == 0 ? ds : NULL;
}

/* Opening must fail with ST_EINVAL and a message holding both substrings. */
static void expect_fail_at(int line, const st_config *c, int64_t rows, const char *s1, const char *s2)
{
	st_dataset *ds = (st_dataset *)1;
	int rc = st_dataset_open(&ds, c, rows);
	const char *m = st_errmsg();
	if (rc != ST_EINVAL || ds != NULL || (s1 && !strstr(m, s1)) || (s2 && !strstr(m, s2))) {
		fprintf(stderr, "test_data.c:%d: expected ST_EINVAL with '%s' and '%s'; got rc %d, msg '%s'\n",
			line, s1 ? s1 : "", s2 ? s2 : "", rc, m);
		check_failures++;
	}
	if (rc == 0 && ds)
		st_dataset_free(ds);
}
#define expect_fail(c, rows, s1, s2) expect_fail_at(__LINE__, c, rows, s1, s2)

/* Open a single file under tmpdir that must be rejected with 'what'. */
static void expect_file_fail_at(int line, const char *name, int64_t T, int64_t vocab, const char *what)
{
	const char *p = tpath(name);
	st_config c = cfg_tokens(p, T, vocab, 0, 0);
	expect_fail_at(line, &c, 1, p, what);
}
#define expect_file_fail(name, T, vocab, what) expect_file_fail_at(__LINE__, name, T, vocab, what)

static int read_ok(st_dataset *ds, int64_t first, int64_t n, int32_t *out)
{
	int rc = st_dataset_read(ds, first, n, out);
	CHECK_MSG(rc == 0, "read %" PRId64 "+%" PRId64 ": %s", first, n, st_errmsg());
	return rc;
}

/* ---- well-formed files ---------------------------------------------------- */

static void test_bin_u16(void)
{
	uint64_t toks[11];
	for (int i = 0; i < 11; i++)
		toks[i] = (uint64_t)(i * 1000 + 7); /* up to 10007 */
	write_bin16("u16.bin", toks, 11);
	st_config c = cfg_tokens(tpath("u16.bin"), 3, 32000, 0, 0);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	CHECK(st_dataset_num_samples(ds) == 2); /* 11 tokens / 4: tail of 3 dropped */
	int32_t out[3 * 4];
	read_ok(ds, 0, 3, out);
	for (int i = 0; i < 8; i++)
		CHECK(out[i] == (int32_t)toks[i]);
	for (int i = 0; i < 4; i++) /* third row wraps to sample 0 */
		CHECK(out[8 + i] == (int32_t)toks[i]);
	st_dataset_free(ds);
}

static void test_bin_u32(void)
{
	uint64_t toks[9] = { 0, 65535, 65536, 70000, 99999, 1, 2, 3, 128255 };
	write_bin32("u32.bin", toks, 9);
	st_config c = cfg_tokens(tpath("u32.bin"), 2, 128256, 0, 0);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	CHECK(st_dataset_num_samples(ds) == 3);
	int32_t out[9];
	read_ok(ds, 0, 3, out);
	for (int i = 0; i < 9; i++)
		CHECK(out[i] == (int32_t)toks[i]);
	st_dataset_free(ds);

	/* an empty shard (header only) is valid but gives no sample */
	write_bin32("empty_shard.bin", NULL, 0);
	c = cfg_tokens(tpath("empty_shard.bin"), 2, 128256, 0, 0);
	expect_fail(&c, 1, "no full sample", NULL);
}

static void test_npy_dtypes(void)
{
	static const struct {
		const char *descr;
		int64_t max;
	} types[] = {
		{ "|u1", 255 },        { "|i1", 127 },        { "<u2", 65535 },      { "<i2", 32767 },
		{ "<u4", INT32_MAX },  { "<i4", INT32_MAX },  { "<u8", INT32_MAX },  { "<i8", INT32_MAX },
		{ "<u1", 200 },
	};
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		int64_t m = types[t].max;
		int64_t vals[10] = { 0, 1, m, 2, m - 1, 3, 5, 7, 11, m };
		int major = (int)(t % 3) + 1;
		char name[64];
		snprintf(name, sizeof(name), "dt%zu.npy", t);
		write_npy(name, major, types[t].descr, "(10,)", vals, 10);
		st_config c = cfg_tokens(tpath(name), 2, (int64_t)1 << 31, 0, 0);
		st_dataset *ds = open_ok(&c, 1);
		if (!ds)
			continue;
		CHECK_MSG(st_dataset_num_samples(ds) == 3, "%s", types[t].descr);
		int32_t out[9];
		read_ok(ds, 0, 3, out);
		for (int i = 0; i < 9; i++)
			CHECK_MSG(out[i] == vals[i], "%s v%d [%d]: %d != %" PRId64, types[t].descr, major, i, out[i],
				  vals[i]);
		st_dataset_free(ds);
	}
}

static void test_npy_2d(void)
{
	int64_t vals[5 * 4];
	for (int i = 0; i < 20; i++)
		vals[i] = 100 + i;
	write_npy("rows.npy", 1, "<i4", "(5, 4)", vals, 20);
	st_config c = cfg_tokens(tpath("rows.npy"), 3, 1000, 0, 0);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	CHECK(st_dataset_num_samples(ds) == 5);
	int32_t out[5 * 4];
	read_ok(ds, 0, 5, out);
	for (int i = 0; i < 20; i++)
		CHECK(out[i] == vals[i]);
	read_ok(ds, 7, 1, out); /* epoch 1, row 2 */
	for (int i = 0; i < 4; i++)
		CHECK(out[i] == vals[8 + i]);
	st_dataset_free(ds);

	/* a 2-D array with one row of T+1: one sample */
	write_npy("onerow.npy", 1, "<u2", "(1, 4)", vals, 4);
	c = cfg_tokens(tpath("onerow.npy"), 3, 1000, 0, 0);
	ds = open_ok(&c, 1);
	if (ds) {
		CHECK(st_dataset_num_samples(ds) == 1);
		st_dataset_free(ds);
	}
}

/* Sample k of a glob: every token equals the sample's id, so order is visible. */
static void fill_const(uint64_t *t, int64_t *v, int n, int value)
{
	for (int i = 0; i < n; i++) {
		if (t)
			t[i] = (uint64_t)value;
		if (v)
			v[i] = value;
	}
}

static void test_glob(void)
{
	mkdir(tpath("g"), 0700);
	/* written out of order; sorted: a.npy b.bin b2.bin c.npy (d.txt not matched) */
	uint64_t t[12];
	int64_t v[12];
	fill_const(NULL, v, 4, 30);
	fill_const(NULL, v + 4, 4, 31);
	fill_const(NULL, v + 8, 3, 39); /* tail dropped */
	write_npy("g/c.npy", 1, "<i8", "(11,)", v, 11);
	fill_const(t, NULL, 4, 20);
	write_bin16("g/b.bin", t, 4);
	fill_const(t, NULL, 3, 29); /* too short for a sample: contributes none */
	write_bin32("g/b2.bin", t, 3);
	fill_const(NULL, v, 4, 10);
	fill_const(NULL, v + 4, 4, 11);
	write_npy("g/a.npy", 2, "<u2", "(2, 4)", v, 8);
	write_bytes("g/d.txt", "not tokens", 10);

	st_config c = cfg_tokens(tpath("g/[a-c]*"), 3, 64, 0, 0);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	static const int want[5] = { 10, 11, 20, 30, 31 };
	CHECK(st_dataset_num_samples(ds) == 5);
	int32_t out[10 * 4];
	read_ok(ds, 0, 10, out);
	for (int r = 0; r < 10; r++)
		for (int k = 0; k < 4; k++)
			CHECK_MSG(out[r * 4 + k] == want[r % 5], "row %d", r);
	for (int64_t i = 0; i < 10; i++) {
		int64_t s = -1;
		CHECK(st_dataset_locate(ds, i, &s) == 0 && s == i % 5);
	}
	char line[256];
	st_dataset_summary(ds, line, sizeof(line));
	CHECK_MSG(strstr(line, "4 files") && strstr(line, "5 samples"), "%s", line);
	st_dataset_free(ds);

	/* the unmatched text file makes the full glob fail, naming it */
	c = cfg_tokens(tpath("g/*"), 3, 64, 0, 0);
	expect_fail(&c, 1, "d.txt", "bad magic");
}

/* N samples, sample k's tokens all k: a file written for the order tests. */
static const char *write_counting(const char *name, int n, int seq)
{
	int64_t *v = malloc(sizeof(*v) * (size_t)(n * seq));
	for (int k = 0; k < n; k++)
		fill_const(NULL, v + k * seq, seq, k);
	char shape[64];
	snprintf(shape, sizeof(shape), "(%d,)", n * seq);
	write_npy(name, 1, "<i4", shape, v, (size_t)(n * seq));
	free(v);
	return tpath(name);
}

/* The documented order, rebuilt independently of data.c. */
static void reference_perm(int64_t *p, int64_t n, uint64_t seed, uint64_t epoch)
{
	for (int64_t k = 0; k < n; k++)
		p[k] = k;
	for (int64_t k = n - 1; k > 0; k--) {
		int64_t j = (int64_t)st_rng_below(seed, ST_DATA_SHUFFLE_STREAM + epoch, (uint64_t)k, (uint64_t)k + 1);
		int64_t x = p[k];
		p[k] = p[j];
		p[j] = x;
	}
}

static void test_shuffle(void)
{
	enum { N = 37, SEQ = 4, EPOCHS = 4 };
	const char *path = write_counting("count.npy", N, SEQ);
	st_config c = cfg_tokens(path, SEQ - 1, 64, 1, 7);
	st_dataset *a = open_ok(&c, 1), *b = open_ok(&c, 1);
	c.data_shuffle_seed = 8;
	st_dataset *other = open_ok(&c, 1);
	if (!a || !b || !other)
		goto out;
	CHECK(st_dataset_num_samples(a) == N);

	int32_t ra[EPOCHS * N * SEQ], rb[EPOCHS * N * SEQ], ro[N * SEQ];
	read_ok(a, 0, EPOCHS * N, ra);
	/* b reads the same rows backwards, one at a time: the epoch cache must not matter */
	for (int64_t i = EPOCHS * N - 1; i >= 0; i--)
		read_ok(b, i, 1, rb + i * SEQ);
	CHECK(memcmp(ra, rb, sizeof(ra)) == 0);
	read_ok(other, 0, N, ro);
	CHECK(memcmp(ra, ro, sizeof(ro)) != 0);

	int64_t ref[N];
	for (int e = 0; e < EPOCHS; e++) {
		int seen[N] = { 0 }, identity = 1;
		reference_perm(ref, N, 7, (uint64_t)e);
		for (int k = 0; k < N; k++) {
			const int32_t *row = ra + ((int64_t)e * N + k) * SEQ;
			int s = row[0];
			CHECK(s >= 0 && s < N);
			if (s < 0 || s >= N)
				continue;
			seen[s]++;
			identity &= s == k;
			CHECK(row[SEQ - 1] == s);
			CHECK_MSG(s == ref[k], "epoch %d pos %d: %d != reference %" PRId64, e, k, s, ref[k]);
			int64_t loc = -1;
			CHECK(st_dataset_locate(a, (int64_t)e * N + k, &loc) == 0 && loc == s);
		}
		for (int s = 0; s < N; s++)
			CHECK_MSG(seen[s] == 1, "epoch %d: sample %d read %d times", e, s, seen[s]);
		CHECK(!identity);
	}
	CHECK(memcmp(ra, ra + N * SEQ, N * SEQ * sizeof(int32_t)) != 0); /* epochs differ */

	/* a read spanning epochs equals single-row reads; resume from a fresh open */
	int32_t span[10 * SEQ];
	read_ok(a, N - 5, 10, span);
	CHECK(memcmp(span, ra + (N - 5) * SEQ, sizeof(span)) == 0);
	st_dataset_free(b);
	c.data_shuffle_seed = 7;
	b = open_ok(&c, 1);
	if (b) {
		read_ok(b, 2 * N + 3, 10, span);
		CHECK(memcmp(span, ra + (2 * N + 3) * SEQ, sizeof(span)) == 0);
	}
	int64_t loc;
	CHECK(st_dataset_locate(a, -1, &loc) == ST_EINVAL);
out:
	st_dataset_free(a);
	st_dataset_free(b);
	st_dataset_free(other);
}

static void test_no_shuffle(void)
{
	enum { N = 9, SEQ = 3 };
	const char *path = write_counting("count2.npy", N, SEQ);
	st_config c = cfg_tokens(path, SEQ - 1, 64, 0, 7);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	int32_t out[3 * N * SEQ];
	read_ok(ds, 0, 3 * N, out);
	for (int i = 0; i < 3 * N; i++)
		CHECK(out[i * SEQ] == i % N && out[i * SEQ + SEQ - 1] == i % N);
	read_ok(ds, 1000 * N + 4, 1, out);
	CHECK(out[0] == 4);
	CHECK(read_ok(ds, 5, 0, NULL) == 0); /* zero rows: nothing to do */
	st_dataset_free(ds);
}

static void test_synthetic(void)
{
	enum { B = 5, T = 7, SEQ = T + 1, V = 50 };
	st_config c;
	memset(&c, 0, sizeof(c));
	c.dataset_type = ST_DATA_SYNTHETIC;
	c.max_target_length = T;
	c.vocab_size = V;
	c.data_shuffle_seed = 3;
	c.enable_data_shuffling = 1; /* no effect on synthetic data */
	st_dataset *a = open_ok(&c, B), *b = open_ok(&c, B);
	c.data_shuffle_seed = 4;
	st_dataset *other = open_ok(&c, B);
	if (!a || !b || !other)
		goto out;
	CHECK(st_dataset_num_samples(a) == B);
	int32_t b0[B * SEQ], b1[B * SEQ], bo[B * SEQ], row[SEQ];
	read_ok(a, 0, B, b0);
	read_ok(a, 5 * B, B, b1);
	CHECK(memcmp(b0, b1, sizeof(b0)) == 0);
	read_ok(b, 0, B, b1);
	CHECK(memcmp(b0, b1, sizeof(b0)) == 0);
	read_ok(other, 0, B, bo);
	CHECK(memcmp(b0, bo, sizeof(b0)) != 0);
	int distinct = 0;
	for (int i = 0; i < B * SEQ; i++) {
		CHECK(b0[i] >= 0 && b0[i] < V);
		distinct += b0[i] != b0[0];
		/* the documented formula */
		CHECK(b0[i] == (int32_t)st_rng_below(3, ST_DATA_SYNTHETIC_STREAM, (uint64_t)i, V));
	}
	CHECK(distinct > 0);
	read_ok(a, 3 * B + 2, 1, row);
	CHECK(memcmp(row, b0 + 2 * SEQ, sizeof(row)) == 0);
	int64_t loc;
	CHECK(st_dataset_locate(a, 3 * B + 2, &loc) == 0 && loc == 2);
	/* reads across the batch boundary */
	int32_t span[4 * SEQ];
	read_ok(a, B - 2, 4, span);
	CHECK(memcmp(span, b0 + (B - 2) * SEQ, 2 * SEQ * sizeof(int32_t)) == 0);
	CHECK(memcmp(span + 2 * SEQ, b0, 2 * SEQ * sizeof(int32_t)) == 0);
out:
	st_dataset_free(a);
	st_dataset_free(b);
	st_dataset_free(other);

	c.vocab_size = 1;
	a = open_ok(&c, 2);
	if (a) {
		read_ok(a, 0, 2, b0);
		for (int i = 0; i < 2 * SEQ; i++)
			CHECK(b0[i] == 0);
		st_dataset_free(a);
	}
	expect_fail(&c, 0, "at least one row", NULL);
}

/* ---- malformed input ------------------------------------------------------ */

static void test_bad_config(void)
{
	write_bin16("cfg.bin", (uint64_t[]){ 1, 2, 3, 4 }, 4);
	st_config c = cfg_tokens(tpath("cfg.bin"), 0, 100, 0, 0);
	expect_fail(&c, 1, "max_target_length", NULL);
	c = cfg_tokens(tpath("cfg.bin"), 3, 0, 0, 0);
	expect_fail(&c, 1, "vocab_size", NULL);
	c = cfg_tokens("", 3, 100, 0, 0);
	expect_fail(&c, 1, "dataset_path is empty", NULL);
	c = cfg_tokens(tpath("cfg.bin"), 3, 100, 0, 0);
	c.dataset_type = (enum st_dataset_type)7;
	expect_fail(&c, 1, "unknown dataset_type", NULL);

	c = cfg_tokens(tpath("cfg.bin"), 3, 100, 1, 0);
	st_dataset *ds = open_ok(&c, 1);
	if (!ds)
		return;
	int32_t out[4];
	CHECK(st_dataset_read(ds, -1, 1, out) == ST_EINVAL && strstr(st_errmsg(), "negative sample index"));
	CHECK(st_dataset_read(ds, 0, -1, out) == ST_EINVAL && strstr(st_errmsg(), "negative row count"));
	CHECK(st_dataset_read(ds, INT64_MAX, 2, out) == ST_EINVAL && strstr(st_errmsg(), "overflows"));
	CHECK(st_dataset_read(ds, INT64_MAX - 1, 1, out) == 0 && out[0] == 1); /* large indices are fine */
	st_dataset_free(ds);
}

static void test_bad_paths(void)
{
	st_config c = cfg_tokens(tpath("nofile.bin"), 3, 100, 0, 0);
	expect_fail(&c, 1, "matches no file", "nofile.bin");
	c = cfg_tokens(tpath("zzz*.npy"), 3, 100, 0, 0);
	expect_fail(&c, 1, "matches no file", "zzz*.npy");
	mkdir(tpath("adir"), 0700);
	expect_file_fail("adir", 3, 100, "is a directory");
	if (mkfifo(tpath("fifo"), 0600) == 0)
		expect_file_fail("fifo", 3, 100, "not a regular file");
	write_bytes("empty", "", 0);
	expect_file_fail("empty", 3, 100, "empty file");
	write_bytes("text", "hello, world\n", 13);
	expect_file_fail("text", 3, 100, "not a token file (bad magic");
	write_bytes("tiny", "\x93N", 2);
	expect_file_fail("tiny", 3, 100, "bad magic");
	/* one bad file among good ones: named, and everything opened so far released */
	mkdir(tpath("mix"), 0700);
	write_bin16("mix/a.bin", (uint64_t[]){ 1, 2, 3, 4 }, 4);
	write_bytes("mix/b.bin", "garbage!", 8);
	write_bin16("mix/c.bin", (uint64_t[]){ 1, 2, 3, 4 }, 4);
	c = cfg_tokens(tpath("mix/*.bin"), 3, 100, 0, 0);
	expect_fail(&c, 1, "mix/b.bin", "bad magic");
}

static void test_bad_bin(void)
{
	uint64_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	unsigned char hdr[100] = { 0 };
	int32_t magic = 20240520;
	memcpy(hdr, &magic, 4);
	write_bytes("trunc_hdr.bin", hdr, sizeof(hdr));
	expect_file_fail("trunc_hdr.bin", 3, 100, "truncated llm.c .bin header");
	write_bin("badver16.bin", 20240520, 7, 8, toks, 8, 2);
	expect_file_fail("badver16.bin", 3, 100, "unsupported llm.c .bin version 7");
	write_bin("badver32.bin", 20240801, 1, 8, toks, 8, 4);
	expect_file_fail("badver32.bin", 3, 100, "unsupported llm.c .bin version 1");
	write_bin("trunc16.bin", 20240520, 1, 9, toks, 8, 2);
	expect_file_fail("trunc16.bin", 3, 100, "truncated: header announces 9 uint16 tokens");
	write_bin("trunc32.bin", 20240801, 7, 8, toks, 8, 2); /* uint32 count, uint16 data */
	expect_file_fail("trunc32.bin", 3, 100, "truncated");
	write_bin("extra.bin", 20240520, 1, 7, toks, 8, 2);
	expect_file_fail("extra.bin", 3, 100, "2 extra bytes");
	write_bin("neg.bin", 20240801, 7, -5, toks, 8, 4);
	expect_file_fail("neg.bin", 3, 100, "negative token count -5");
	write_bin("huge.bin", 20240801, 7, INT32_MAX, toks, 8, 4);
	expect_file_fail("huge.bin", 3, 100, "truncated");
}

static void test_bad_ids(void)
{
	uint64_t toks[8] = { 1, 2, 3, 4, 5, 70000, 7, 8 };
	write_bin32("id.bin", toks, 8);
	char want[4200];
	snprintf(want, sizeof(want), "%s: token id 70000 at position 5 is >= vocab_size 32000", tpath("id.bin"));
	st_config c = cfg_tokens(tpath("id.bin"), 3, 32000, 0, 0);
	expect_fail(&c, 1, want, NULL);
	CHECK_MSG(strcmp(st_errmsg(), want) == 0, "%s", st_errmsg());

	/* ids in a dropped tail are still checked */
	uint64_t tail[5] = { 1, 2, 3, 4, 100 };
	write_bin16("idtail.bin", tail, 5);
	expect_file_fail("idtail.bin", 3, 100, "token id 100 at position 4 is >= vocab_size 100");

	int64_t neg[8] = { 1, 2, -5, 4, 5, 6, 7, 8 };
	write_npy("neg.npy", 1, "<i2", "(8,)", neg, 8);
	expect_file_fail("neg.npy", 3, 100, "token id -5 at position 2 is negative");
	int64_t neg8[4] = { 0, 0, 0, INT64_MIN };
	write_npy("neg8.npy", 1, "<i8", "(4,)", neg8, 4);
	expect_file_fail("neg8.npy", 3, 100, "token id -9223372036854775808 at position 3 is negative");
	int64_t big[4] = { 0, (int64_t)0x8000000000000005ull, 0, 0 };
	write_npy("big.npy", 1, "<u8", "(4,)", big, 4);
	expect_file_fail("big.npy", 3, 100, "token id 9223372036854775813 at position 1");
	int64_t u1[4] = { 0, 255, 0, 0 };
	write_npy("u1.npy", 1, "|u1", "(4,)", u1, 4);
	expect_file_fail("u1.npy", 3, 255, "token id 255 at position 1 is >= vocab_size 255");
	int64_t rows[8] = { 1, 2, 3, 4, 5, 6, 7, 99 };
	write_npy("idrows.npy", 1, "<i4", "(2, 4)", rows, 8);
	expect_file_fail("idrows.npy", 3, 99, "token id 99 at position 7");
}

static void test_bad_npy(void)
{
	int64_t v[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	write_bytes("short.npy", "\x93NUMPY\x01\x00", 8);
	expect_file_fail("short.npy", 3, 100, "truncated .npy header");
	write_bytes("short2.npy", "\x93NUMPY\x02\x00\x10\x00", 10);
	expect_file_fail("short2.npy", 3, 100, "truncated .npy header");
	write_bytes("ver4.npy", "\x93NUMPY\x04\x00\x10\x00\x00\x00", 12);
	expect_file_fail("ver4.npy", 3, 100, "unsupported .npy format version 4.0");
	write_bytes("ver11.npy", "\x93NUMPY\x01\x01\x10\x00\x00\x00", 12);
	expect_file_fail("ver11.npy", 3, 100, "unsupported .npy format version 1.1");
	write_bytes("hlen1.npy", "\x93NUMPY\x01\x00\xff\xff{}", 12);
	expect_file_fail("hlen1.npy", 3, 100, "truncated .npy header (header length field says 65535");
	write_bytes("hlen2.npy", "\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14);
	expect_file_fail("hlen2.npy", 3, 100, "header length field says 4294967295");

	write_npy("be.npy", 1, ">i4", "(8,)", v, 8);
	expect_file_fail("be.npy", 3, 100, "big-endian dtype '>i4'");
	write_npy("f4.npy", 1, "<f4", "(8,)", v, 8);
	expect_file_fail("f4.npy", 3, 100, "dtype '<f4' is not an integer type");
	write_npy("f8be.npy", 1, ">f8", "(8,)", v, 8);
	expect_file_fail("f8be.npy", 3, 100, "not an integer type");
	write_npy("bool.npy", 1, "|b1", "(8,)", v, 8);
	expect_file_fail("bool.npy", 3, 100, "not an integer type");
	write_npy("str.npy", 1, "<U1", "(8,)", v, 8);
	expect_file_fail("str.npy", 3, 100, "unsupported .npy dtype '<U1'");
	write_npy("i16.npy", 1, "<i16", "(8,)", v, 8);
	expect_file_fail("i16.npy", 3, 100, "unsupported .npy dtype");

	unsigned char d32[48] = { 0 };
	write_npy_raw("struct.npy", 1, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (8,), }", d32, 32);
	expect_file_fail("struct.npy", 3, 100, "structured");
	write_npy_raw("fortran.npy", 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 4), }", d32, 32);
	expect_file_fail("fortran.npy", 3, 100, "fortran_order=True");
	write_npy_raw("3d.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2, 2), }", d32, 32);
	expect_file_fail("3d.npy", 3, 100, "3-D .npy array");
	write_npy_raw("0d.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", d32, 4);
	expect_file_fail("0d.npy", 3, 100, "0-D .npy array");
	write_npy_raw("ovf2.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }",
		      d32, 32);
	expect_file_fail("ovf2.npy", 3, 100, "is too large");
	write_npy_raw("ovf1.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904,), }",
		      d32, 32);
	expect_file_fail("ovf1.npy", 3, 100, "too large");
	write_npy_raw("big1.npy", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (9223372036854775807,), }",
		      d32, 32);
	expect_file_fail("big1.npy", 3, 100, "truncated");
	write_npy_raw("dimovf.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
		      d32, 32);
	expect_file_fail("dimovf.npy", 3, 100, "dimension in 'shape' too large");

	write_npy_raw("truncdata.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (9,), }", d32, 32);
	expect_file_fail("truncdata.npy", 3, 100, "truncated: .npy header announces 9 int32 elements");
	write_npy_raw("extradata.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (7,), }", d32, 32);
	expect_file_fail("extradata.npy", 3, 100, "4 extra bytes");
	write_npy("rowlen.npy", 1, "<i4", "(2, 5)", v, 10);
	expect_file_fail("rowlen.npy", 3, 100, "2-D array has rows of 5 tokens; expected max_target_length+1 = 4");
	write_npy("zero.npy", 1, "<i4", "(3,)", v, 3);
	expect_file_fail("zero.npy", 3, 100, "no full sample of max_target_length+1 = 4 tokens (3 tokens in 1 file)");
	write_npy("zero2d.npy", 1, "<i4", "(0, 4)", v, 0);
	expect_file_fail("zero2d.npy", 3, 100, "no full sample");

	/* malformed dicts; the data (8 int32) fits shape (8,) when it parses */
	static const struct {
		const char *dict, *what;
	} bad[] = {
		{ "", "does not start with '{'" },
		{ "   ", "does not start with '{'" },
		{ "{", "expected a quoted key" },
		{ "{'descr': '<i4'", "expected ',' or '}'" },
		{ "{'descr' '<i4'}", "expected ':'" },
		{ "{'descr': <i4, 'fortran_order': False, 'shape': (8,)}", "'descr' must be a quoted string" },
		{ "{'descr': '<i4, 'fortran_order': False, 'shape': (8,)}", "expected ',' or '}'" },
		{ "{'descr': '<i4", "unterminated string" },
		{ "{'descr': 'a\\'b', 'fortran_order': False, 'shape': (8,)}", "unsupported character" },
		{ "{'descr': '<i4', 'fortran_order': Maybe, 'shape': (8,)}", "True or False" },
		{ "{'descr': '<i4', 'fortran_order': Falsey, 'shape': (8,)}", "True or False" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8)}", "must be a tuple, e.g. (5,)" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': 8}", "'shape' must be a tuple" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (-8,)}", "non-negative integers" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8,,)}", "non-negative integers" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8 8)}", "expected ',' or ')'" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8,", "non-negative integers" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8,), 'extra': 1}", "unexpected key 'extra'" },
		{ "{'descr': '<i4', 'fortran_order': False}", "missing key 'shape'" },
		{ "{'fortran_order': False, 'shape': (8,)}", "missing key 'descr'" },
		{ "{'descr': '<i4', 'shape': (8,)}", "missing key 'fortran_order'" },
		{ "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (8,)}", "duplicate key 'descr'" },
		{ "{'descr': '<i4', 'fortran_order': False, 'shape': (8,)} junk", "unexpected text after" },
		{ "{'descr': '<i4' 'fortran_order': False, 'shape': (8,)}", "expected ',' or '}'" },
		{ "{'descr': 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'}", "string too long" },
		{ "{'shape': (1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33)}",
		  "too many dimensions" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char name[32];
		snprintf(name, sizeof(name), "dict%zu.npy", i);
		write_npy_raw(name, 1 + (int)(i % 3), bad[i].dict, d32, 32);
		expect_file_fail(name, 3, 100, bad[i].what);
		CHECK_MSG(strstr(st_errmsg(), ".npy header"), "dict %zu: %s", i, st_errmsg());
	}

	/* accepted variants: double quotes, no trailing comma, odd spacing, key order, 'L' suffix */
	static const char *good[] = {
		"{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (8,)}",
		"{ 'shape' : ( 8 , ) , 'fortran_order' : False , 'descr' : '<i4' , }",
		"{'descr':'<i4','fortran_order':False,'shape':(8L,)}",
		"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 4,), }",
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char name[32];
		snprintf(name, sizeof(name), "good%zu.npy", i);
		write_npy_raw(name, 1, good[i], d32, 32);
		st_config c = cfg_tokens(tpath(name), 3, 100, 0, 0);
		st_dataset *ds = open_ok(&c, 1);
		if (ds) {
			CHECK(st_dataset_num_samples(ds) == 2);
			st_dataset_free(ds);
		}
	}
}

/* ---- mutation loop: damaged headers must give 0 or ST_EINVAL, never a crash ---- */

static void fuzz_one(const char *name, const unsigned char *orig, size_t len, uint64_t iter, size_t hot)
{
	static const char alphabet[] = "{}()[]':,\" TrueFalse0123456789L<>|iufdescrshapeortran_\n\\\x93\xff";
	unsigned char *m = malloc(len + 1);
	memcpy(m, orig, len);
	size_t n = len;
	int edits = 1 + (int)st_rng_below(99, iter, 0, 4);
	for (int e = 0; e < edits; e++) {
		size_t pos = (size_t)st_rng_below(99, iter, 1 + 3 * (uint64_t)e, hot);
		uint64_t kind = st_rng_below(99, iter, 2 + 3 * (uint64_t)e, 3);
		uint64_t r = st_rng_u64(99, iter, 3 + 3 * (uint64_t)e);
		if (kind == 0)
			m[pos] = (unsigned char)r;
		else if (kind == 1)
			m[pos] = (unsigned char)alphabet[r % (sizeof(alphabet) - 1)];
		else
			m[pos] ^= (unsigned char)(1u << (r % 8));
	}
	if (st_rng_below(99, iter, 100, 4) == 0)
		n = (size_t)st_rng_below(99, iter, 101, len + 1);
	write_bytes(name, m, n);
	free(m);

	st_config c = cfg_tokens(tpath(name), 3, 1000, (int)(iter & 1), 5);
	st_dataset *ds = NULL;
	int rc = st_dataset_open(&ds, &c, 1);
	CHECK_MSG(rc == 0 || rc == ST_EINVAL, "iter %" PRIu64 ": rc %d: %s", iter, rc, st_errmsg());
	if (rc == ST_EINVAL)
		CHECK_MSG(strstr(st_errmsg(), name) || strstr(st_errmsg(), "dataset_path"), "iter %" PRIu64 ": %s",
			  iter, st_errmsg());
	if (rc == 0) {
		int64_t ns = st_dataset_num_samples(ds);
		CHECK(ns > 0);
		int32_t row[4];
		for (int64_t i = 0; i < ns && i < 64; i++) {
			CHECK(st_dataset_read(ds, i, 1, row) == 0);
			for (int k = 0; k < 4; k++)
				CHECK(row[k] >= 0 && row[k] < 1000);
		}
		st_dataset_free(ds);
	}
}

static void test_fuzz(void)
{
	int64_t v[16];
	for (int i = 0; i < 16; i++)
		v[i] = i * 50;
	write_npy("seed.npy", 1, "<u2", "(16,)", v, 16);
	uint64_t t[16];
	for (int i = 0; i < 16; i++)
		t[i] = (uint64_t)i * 50;
	write_bin16("seed.bin", t, 16);

	const char *names[2] = { "seed.npy", "seed.bin" };
	for (int which = 0; which < 2; which++) {
		FILE *f = fopen(tpath(names[which]), "rb");
		unsigned char buf[2048];
		size_t len = f ? fread(buf, 1, sizeof(buf), f) : 0;
		if (f)
			fclose(f);
		CHECK(len > 0);
		if (!len)
			continue;
		/* npy: mutate the whole 64-byte header + data; bin: first header words and the data */
		for (uint64_t it = 0; it < 3000; it++) {
			if (which == 0) {
				fuzz_one("fz.npy", buf, len, it, len);
			} else {
				/* mutate only the first 12 bytes (magic, version, count) or the tokens */
				unsigned char m[2048];
				memcpy(m, buf, len);
				size_t pos = st_rng_below(7, it, 0, 2) ? (size_t)st_rng_below(7, it, 1, 12)
								   : 1024 + (size_t)st_rng_below(7, it, 1, len - 1024);
				m[pos] ^= (unsigned char)(1u << st_rng_below(7, it, 2, 8));
				fuzz_one("fz.bin", m, len, it + 1000000, 12);
			}
		}
	}
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	return remove(path);
}

int main(void)
{
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_bin_u16();
	test_bin_u32();
	test_npy_dtypes();
	test_npy_2d();
	test_glob();
	test_shuffle();
	test_no_shuffle();
	test_synthetic();
	test_bad_config();
	test_bad_paths();
	test_bad_bin();
	test_bad_ids();
	test_bad_npy();
	test_fuzz();
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	if (!check_failures)
		printf("test_data: ok\n");
	return check_result();
}
