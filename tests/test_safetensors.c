/*
 * test_safetensors.c - safetensors writer/reader and the atomic file helpers.
 *
 * (including direct mode and st_read_file).
 * Round trips, the exact byte layout of small files, one malformed file per
 * validation rule (each must give ST_EINVAL with a message naming the file and
 * the problem), every truncation of a valid file, and random header mutations
 * (which must give 0 or ST_EINVAL, never a crash).
 */
#include "check.h"

#include "base/err.h"
#include "base/file.h"
#include "ckpt/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* tmpdir/name in a rotating static buffer (several paths may be live at once). */
static const char *P(const char *name)
{
	static char buf[16][512];
	static int k;
	k = (k + 1) % 16;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", tmpdir, name);
	return buf[k];
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(p);
}

static void write_raw(const char *path, const void *buf, size_t n)
{
	FILE *fp = fopen(path, "wb");
	if (!fp || fwrite(buf, 1, n, fp) != n || fclose(fp) != 0) {
		perror(path);
		exit(1);
	}
}

static unsigned char *read_all(const char *path, size_t *n)
{
	char *buf;
	return st_read_file(path, SIZE_MAX, &buf, n) == 0 ? (unsigned char *)buf : NULL;
}

static void put_u64le(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* A safetensors file with the given header text (unpadded) and data_len bytes 0x11. */
static const char *make_st(const char *name, const char *header, size_t data_len)
{
	const char *path = P(name);
	size_t hlen = strlen(header);
	unsigned char *buf = malloc(8 + hlen + data_len);
	put_u64le(buf, hlen);
	memcpy(buf + 8, header, hlen);
	memset(buf + 8 + hlen, 0x11, data_len);
	write_raw(path, buf, 8 + hlen + data_len);
	free(buf);
	return path;
}

/* Number of entries in tmpdir (to see that failed writes leave no temporaries). */
static int count_entries(void)
{
	DIR *d = opendir(tmpdir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

#define EXPECT_EINVAL(path, what) expect_einval(__LINE__, (path), (what))

static void expect_einval(int line, const char *path, const char *what)
{
	st_safetensors *f = (st_safetensors *)1;
	int rc = st_safetensors_open(&f, path);
	CHECK_MSG(rc == ST_EINVAL && f == NULL, "line %d: rc %d (%s)", line, rc, st_errmsg());
	CHECK_MSG(strstr(st_errmsg(), path) != NULL, "line %d: message lacks the path: %s", line, st_errmsg());
	CHECK_MSG(strstr(st_errmsg(), what) != NULL, "line %d: want \"%s\" in: %s", line, what, st_errmsg());
	if (rc == 0)
		st_safetensors_close(f);
}

/* ------------------------------------------------------------ atomic files */

static void test_file(void)
{
	char path[512];
	snprintf(path, sizeof(path), "%s", P("a.txt"));
	size_t n;
	CHECK(st_write_file_atomic(path, "hello", 5) == 0);
	unsigned char *b = read_all(path, &n);
	CHECK(b && n == 5 && memcmp(b, "hello", 5) == 0);
	free(b);
	CHECK(st_write_file_atomic(path, "bye", 3) == 0); /* replaces */
	b = read_all(path, &n);
	CHECK(b && n == 3 && memcmp(b, "bye", 3) == 0);
	free(b);
	CHECK(st_write_file_atomic(path, "", 0) == 0);
	b = read_all(path, &n);
	CHECK(b && n == 0);
	free(b);
	CHECK(count_entries() == 1);

	/* streaming, then abort: the old file stays, no temporary is left */
	st_atomic_file f = ST_ATOMIC_FILE_INIT;
	st_atomic_file_abort(&f); /* no-op on an unopened struct */
	CHECK(st_atomic_file_open(&f, path) == 0);
	CHECK(f.tmp && strstr(f.tmp, ".tmp.") && access(f.tmp, F_OK) == 0);
	CHECK(st_atomic_file_write(&f, "xyz", 3) == 0);
	st_atomic_file_abort(&f);
	CHECK(f.fd == -1 && f.tmp == NULL);
	st_atomic_file_abort(&f); /* twice is fine */
	CHECK(count_entries() == 1);

	/* streaming commit with several writes */
	CHECK(st_atomic_file_open(&f, path) == 0);
	CHECK(st_atomic_file_write(&f, "ab", 2) == 0);
	CHECK(st_atomic_file_write(&f, "cd", 2) == 0);
	CHECK(st_atomic_file_commit(&f) == 0);
	b = read_all(path, &n);
	CHECK(b && n == 4 && memcmp(b, "abcd", 4) == 0);
	free(b);

	/* sticky error: swap in a read-only descriptor so that write fails */
	CHECK(st_atomic_file_open(&f, P("sticky")) == 0);
	char *tmp = strdup(f.tmp);
	close(f.fd);
	f.fd = open("/dev/null", O_RDONLY);
	CHECK(st_atomic_file_write(&f, "x", 1) == ST_EIO);
	CHECK(strstr(st_errmsg(), "write failed") != NULL);
	st_fail(ST_EINVAL, "unrelated");
	CHECK(st_atomic_file_write(&f, "y", 1) == ST_EIO);
	CHECK(st_atomic_file_commit(&f) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "write failed") != NULL, "commit replays the first error: %s",
		  st_errmsg());
	CHECK(access(tmp, F_OK) != 0 && access(P("sticky"), F_OK) != 0);
	free(tmp);

	/* errors name the path */
	const char *bad = P("no/such/dir/file");
	CHECK(st_write_file_atomic(bad, "x", 1) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "no/such/dir/file") && strstr(st_errmsg(), "No such file"), "%s",
		  st_errmsg());
	CHECK(st_fsync_dir(P("nodir")) == ST_EIO);
	CHECK(strstr(st_errmsg(), "nodir") != NULL);
	CHECK(st_fsync_dir(tmpdir) == 0);

	/* mkdir -p */
	CHECK(st_mkdir_p(P("d1/d2//d3/")) == 0);
	struct stat st;
	CHECK(stat(P("d1/d2/d3"), &st) == 0 && S_ISDIR(st.st_mode));
	CHECK(st_mkdir_p(P("d1/d2/d3")) == 0); /* exists */
	CHECK(st_mkdir_p(tmpdir) == 0);
	CHECK(st_write_file_atomic(P("d1/d2/d3/f"), "z", 1) == 0);
	CHECK(st_mkdir_p(P("d1/d2/d3/f/g")) == ST_EIO); /* f is a file */
	CHECK_MSG(strstr(st_errmsg(), "d3/f: exists and is not a directory") != NULL, "%s", st_errmsg());
	CHECK(st_mkdir_p("") == ST_EINVAL);
	CHECK(nftw(P("d1"), rm_entry, 8, FTW_DEPTH | FTW_PHYS) == 0);
	unlink(path);
	CHECK(count_entries() == 0);
}

/* ------------------------------------------------------------ round trip */

static uint16_t bf16_of(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	return (uint16_t)(u >> 16); /* exact for the values used here */
}

/* Direct mode: whole aligned blocks with O_DIRECT, a partial last block and
 * unaligned buffers buffered; the same bytes wherever O_DIRECT is refused. */
static void direct_case(const char *path)
{
	enum { BLK = ST_ATOMIC_FILE_ALIGN };
	unsigned char *src, *b;
	size_t n;
	CHECK(posix_memalign((void **)&src, BLK, 4 * BLK) == 0);
	for (int i = 0; i < 4 * BLK; i++)
		src[i] = (unsigned char)(i * 7 + 3);
	st_atomic_file f = ST_ATOMIC_FILE_INIT;
	CHECK(st_atomic_file_open_direct(&f, path) == 0);
	int direct = st_atomic_file_is_direct(&f);
	CHECK(st_atomic_file_write(&f, src, 2 * BLK) == 0);                  /* whole blocks */
	CHECK(st_atomic_file_is_direct(&f) == direct);
	CHECK(st_atomic_file_write(&f, src + 2 * BLK, BLK + 100) == 0);      /* a block and a tail */
	CHECK(!st_atomic_file_is_direct(&f));                                /* buffered from the tail on */
	CHECK(st_atomic_file_write(&f, src + 3 * BLK + 100, BLK - 100) == 0); /* later writes: buffered */
	CHECK(st_atomic_file_commit(&f) == 0);
	b = read_all(path, &n);
	CHECK(b && n == 4 * BLK && memcmp(b, src, n) == 0);
	free(b);

	/* an unaligned buffer leaves direct mode at once */
	CHECK(st_atomic_file_open_direct(&f, path) == 0);
	CHECK(st_atomic_file_write(&f, src + 1, 2 * BLK) == 0);
	CHECK(!st_atomic_file_is_direct(&f));
	CHECK(st_atomic_file_commit(&f) == 0);
	b = read_all(path, &n);
	CHECK(b && n == 2 * BLK && memcmp(b, src + 1, n) == 0);
	free(b);
	free(src);
}

static void test_direct_file(void)
{
	direct_case(P("direct.bin"));
	char shm[64]; /* tmpfs: O_DIRECT refused on older kernels, accepted on newer ones */
	snprintf(shm, sizeof(shm), "/dev/shm/test_safetensors.%ld", (long)getpid());
	direct_case(shm);
	unlink(shm);
}

static void test_read_file(void)
{
	char *b;
	size_t n;
	CHECK(st_write_file_atomic(P("r.txt"), "0123456789", 10) == 0);
	CHECK(st_read_file(P("r.txt"), 10, &b, &n) == 0 && n == 10 && !strcmp(b, "0123456789"));
	free(b);
	CHECK(st_read_file(P("r.txt"), 9, &b, &n) == ST_EINVAL && !b && strstr(st_errmsg(), "too large"));
	CHECK(st_write_file_atomic(P("empty"), "", 0) == 0);
	CHECK(st_read_file(P("empty"), 0, &b, NULL) == 0 && b && b[0] == '\0');
	free(b);
	CHECK(st_read_file(P("missing"), 10, &b, &n) == ST_EIO && errno == ENOENT && !b);
	CHECK(strstr(st_errmsg(), "missing: cannot open"));
	CHECK(st_read_file(tmpdir, 10, &b, &n) == ST_EIO && errno == EISDIR && !b); /* a directory */
	/* stat gives no size for /proc files: read to the end all the same */
	CHECK(st_read_file("/proc/self/status", 1 << 20, &b, &n) == 0 && n > 0 && strlen(b) == n &&
	      strstr(b, "Pid:"));
	free(b);
	CHECK(st_read_file("/proc/self/status", 8, &b, &n) == ST_EINVAL && !b); /* over max while reading */
}

static void test_roundtrip(void)
{
	float a[6] = {1, -2, 3.5f, 0, 1e-3f, -1e30f};
	float bvals[5] = {1, -0.5f, 256, -3, 0.0078125f};
	uint16_t b[5];
	for (int i = 0; i < 5; i++)
		b[i] = bf16_of(bvals[i]);
	int64_t c[3] = {-1, INT64_MAX, 42};
	float s = 7.25f;
	/* F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), -0, +inf, 2^-14 (smallest normal) */
	uint16_t h[7] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x0400};
	float hvals[7] = {1, -2, 65504, 5.9604644775390625e-8f, -0.0f, INFINITY, 6.103515625e-05f};
	st_safetensors_tensor t[] = {
		{"w.f32", ST_DTYPE_F32, 2, {2, 3}, a},
		{"w.bf16", ST_DTYPE_BF16, 1, {5}, b}, /* 10 bytes: what follows is unaligned */
		{"ids", ST_DTYPE_I64, 1, {3}, c},
		{"scalar", ST_DTYPE_F32, 0, {0}, &s},
		{"empty", ST_DTYPE_F32, 2, {0, 4}, NULL},
		{"half", ST_DTYPE_F16, 1, {7}, h},
		{"unicode ünï \"q\"", ST_DTYPE_U8, 1, {1}, "x"},
	};
	int nt = (int)(sizeof(t) / sizeof(t[0]));
	const char *mk[] = {"format", "step"}, *mv[] = {"pt", "1200"};
	const char *path = P("rt.safetensors");
	CHECK(st_safetensors_write(path, nt, t, 2, mk, mv) == 0);
	CHECK(count_entries() == 1);

	size_t fsize;
	unsigned char *raw = read_all(path, &fsize);
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)raw[i] << (8 * i);
	CHECK(hlen % 8 == 0);
	CHECK(fsize == 8 + hlen + 24 + 10 + 24 + 4 + 0 + 14 + 1);
	free(raw);

	st_safetensors *f = NULL;
	CHECK(st_safetensors_open(&f, path) == 0);
	if (!f)
		return;
	CHECK(strcmp(st_safetensors_path(f), path) == 0);
	CHECK(st_safetensors_count(f) == nt);
	for (int i = 0; i < nt && i < st_safetensors_count(f); i++) {
		const st_safetensors_info *x = st_safetensors_get(f, i);
		CHECK_MSG(strcmp(x->name, t[i].name) == 0, "%d: %s", i, x->name);
		CHECK(x->dtype == t[i].dtype);
		CHECK(x->ndim == t[i].ndim);
		int64_t ne = 1;
		for (int d = 0; d < x->ndim; d++) {
			CHECK(x->shape[d] == t[i].shape[d]);
			ne *= t[i].shape[d];
		}
		CHECK(x->numel == ne);
		CHECK(x->nbytes == (size_t)ne * st_dtype_size(t[i].dtype));
		CHECK(x->nbytes == 0 || memcmp(x->data, t[i].data, x->nbytes) == 0);
		CHECK(st_safetensors_find(f, t[i].name) == x);
	}
	CHECK(((uintptr_t)st_safetensors_get(f, 0)->data) % 8 == 0); /* header padding */
	CHECK(st_safetensors_find(f, "missing") == NULL);
	CHECK(st_safetensors_find(f, "") == NULL);
	CHECK(st_safetensors_get(f, 3)->ndim == 0 && st_safetensors_get(f, 3)->numel == 1);
	CHECK(st_safetensors_get(f, 4)->numel == 0);

	CHECK(st_safetensors_meta_count(f) == 2);
	CHECK(strcmp(st_safetensors_meta_key(f, 0), "format") == 0);
	CHECK(strcmp(st_safetensors_meta(f, "format"), "pt") == 0);
	CHECK(strcmp(st_safetensors_meta(f, "step"), "1200") == 0);
	CHECK(st_safetensors_meta(f, "nope") == NULL);

	float out[8];
	CHECK(st_safetensors_read_f32(f, "w.f32", out, 6) == 0);
	CHECK(memcmp(out, a, sizeof(a)) == 0);
	CHECK(st_safetensors_read_f32(f, "w.bf16", out, 5) == 0);
	for (int i = 0; i < 5; i++)
		CHECK(out[i] == bvals[i]);
	CHECK(st_safetensors_read_f32(f, "half", out, 7) == 0);
	for (int i = 0; i < 7; i++)
		CHECK_MSG(out[i] == hvals[i] && signbit(out[i]) == signbit(hvals[i]), "%d: %g", i, out[i]);
	CHECK(st_safetensors_read_f32(f, "scalar", out, 1) == 0 && out[0] == 7.25f);
	CHECK(st_safetensors_read_f32(f, "empty", out, 0) == 0);

	CHECK(st_safetensors_read_f32(f, "missing", out, 1) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "no tensor named \"missing\"") != NULL);
	CHECK(st_safetensors_read_f32(f, "w.f32", out, 5) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "has shape [2, 3] (6 elements), expected 5") != NULL, "%s", st_errmsg());
	CHECK(st_safetensors_read_f32(f, "ids", out, 3) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "I64, which is not floating point") != NULL);
	st_safetensors_close(f);

	/* F16 NaN stays NaN */
	uint16_t hn = 0x7e00;
	st_safetensors_tensor tn = {"n", ST_DTYPE_F16, 1, {1}, &hn};
	CHECK(st_safetensors_write(path, 1, &tn, 0, NULL, NULL) == 0);
	CHECK(st_safetensors_open(&f, path) == 0);
	CHECK(f && st_safetensors_read_f32(f, "n", out, 1) == 0 && isnan(out[0]));
	CHECK(f && st_safetensors_meta_count(f) == 0 && st_safetensors_meta(f, "format") == NULL);
	st_safetensors_close(f);

	/* no tensors at all */
	CHECK(st_safetensors_write(path, 0, NULL, 0, NULL, NULL) == 0);
	CHECK(st_safetensors_open(&f, path) == 0);
	CHECK(f && st_safetensors_count(f) == 0);
	st_safetensors_close(f);
	unlink(path);

	/* writer argument errors: nothing is written */
	st_safetensors_tensor dup[] = {{"x", ST_DTYPE_F32, 1, {1}, a}, {"y", ST_DTYPE_F32, 1, {1}, a}, {"x", ST_DTYPE_F32, 1, {1}, a}};
	CHECK(st_safetensors_write(path, 3, dup, 0, NULL, NULL) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "duplicate name \"x\"") != NULL);
	const char *mk2[] = {"k", "k"}, *mv2[] = {"1", "2"};
	CHECK(st_safetensors_write(path, 1, dup, 2, mk2, mv2) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "duplicate name \"k\"") != NULL);
	st_safetensors_tensor bad1 = {"__metadata__", ST_DTYPE_F32, 1, {1}, a};
	CHECK(st_safetensors_write(path, 1, &bad1, 0, NULL, NULL) == ST_EINVAL);
	st_safetensors_tensor bad2 = {"neg", ST_DTYPE_F32, 1, {-1}, a};
	CHECK(st_safetensors_write(path, 1, &bad2, 0, NULL, NULL) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "negative dimension") != NULL);
	st_safetensors_tensor bad3 = {"dt", (enum st_dtype)99, 1, {1}, a};
	CHECK(st_safetensors_write(path, 1, &bad3, 0, NULL, NULL) == ST_EINVAL);
	st_safetensors_tensor bad4 = {"nd", ST_DTYPE_F32, 9, {1, 1, 1, 1, 1, 1, 1, 1}, a};
	CHECK(st_safetensors_write(path, 1, &bad4, 0, NULL, NULL) == ST_EINVAL);
	st_safetensors_tensor bad5 = {"nodata", ST_DTYPE_F32, 1, {2}, NULL};
	CHECK(st_safetensors_write(path, 1, &bad5, 0, NULL, NULL) == ST_EINVAL);
	st_safetensors_tensor bad6 = {"big", ST_DTYPE_F32, 3, {INT64_MAX / 2, 4, 4}, a};
	CHECK(st_safetensors_write(path, 1, &bad6, 0, NULL, NULL) == ST_EINVAL);
	st_safetensors_tensor bad7 = {"bad\xff utf8", ST_DTYPE_F32, 1, {1}, a};
	CHECK(st_safetensors_write(path, 1, &bad7, 0, NULL, NULL) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "not valid UTF-8") != NULL);
	CHECK(st_safetensors_write(P("no/dir/x.safetensors"), 1, dup, 0, NULL, NULL) == ST_EIO);
	CHECK(count_entries() == 0);

	/* dtype names */
	CHECK(st_dtype_parse("BF16") == ST_DTYPE_BF16 && st_dtype_parse("bf16") == 0);
	CHECK(strcmp(st_dtype_name(ST_DTYPE_F8_E4M3), "F8_E4M3") == 0 && st_dtype_name(0) == NULL);
	CHECK(st_dtype_size(ST_DTYPE_I64) == 8 && st_dtype_size(ST_DTYPE_BOOL) == 1 && st_dtype_size(99) == 0);
}

/* ------------------------------------------------------------ exact layout */

static void check_bytes(const char *path, const char *header, const void *data, size_t data_len)
{
	size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
	size_t n = 8 + padded + data_len;
	unsigned char *want = malloc(n);
	put_u64le(want, padded);
	memcpy(want + 8, header, hlen);
	memset(want + 8 + hlen, ' ', padded - hlen);
	memcpy(want + 8 + padded, data, data_len);
	size_t got_n;
	unsigned char *got = read_all(path, &got_n);
	CHECK_MSG(got && got_n == n && memcmp(got, want, n) == 0, "%s: %zu bytes, want %zu: %.*s", path,
		  got_n, n, got ? (int)got_n - 8 : 0, got ? (char *)got + 8 : "");
	free(got);
	free(want);
}

static void test_layout(void)
{
	const char *path = P("layout.safetensors");
	float a[2] = {1.0f, -2.0f};
	uint16_t b[3] = {0x3f80, 0x0000, 0xc000};
	st_safetensors_tensor t[] = {{"a", ST_DTYPE_F32, 1, {2}, a}, {"b", ST_DTYPE_BF16, 2, {3, 1}, b}};
	const char *mk[] = {"k"}, *mv[] = {"v"};
	CHECK(st_safetensors_write(path, 2, t, 1, mk, mv) == 0);
	const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, /* a */
				      0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};            /* b */
	check_bytes(path,
		    "{\"__metadata__\":{\"k\":\"v\"},"
		    "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		    "\"b\":{\"dtype\":\"BF16\",\"shape\":[3,1],\"data_offsets\":[8,14]}}",
		    data, sizeof(data));

	int64_t x = 0x0102030405060708;
	st_safetensors_tensor s = {"x", ST_DTYPE_I64, 0, {0}, &x};
	CHECK(st_safetensors_write(path, 1, &s, 0, NULL, NULL) == 0);
	const unsigned char xb[] = {8, 7, 6, 5, 4, 3, 2, 1};
	check_bytes(path, "{\"x\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}", xb, 8);

	/* A file laid out by hand the way the Python library writes it (spaces in the
	 * JSON, header padded) reads back. */
	const char *hdr = "{\"__metadata__\": {\"format\": \"pt\"}, "
			  "\"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}, "
			  "\"w\": {\"dtype\": \"F32\", \"shape\": [1, 2], \"data_offsets\": [0, 8]}}   ";
	const char *p2 = make_st("hand.safetensors", hdr, 8);
	st_safetensors *f = NULL;
	CHECK(st_safetensors_open(&f, p2) == 0);
	CHECK(f && st_safetensors_count(f) == 2 && st_safetensors_find(f, "w")->nbytes == 8);
	CHECK(f && strcmp(st_safetensors_meta(f, "format"), "pt") == 0);
	st_safetensors_close(f);
	unlink(path);
	unlink(p2);
}

/* ------------------------------------------------------------ malformed input */

static void test_malformed(void)
{
	const char *p;
#define ENTRY(name, dt, shape, b, e) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

	p = P("short");
	write_raw(p, "\x10\0\0\0\0", 5);
	EXPECT_EINVAL(p, "file has 5 bytes, too short");

	p = make_st("hlen", "{}", 10);
	{ /* claim a 1000-byte header in a 20-byte file */
		unsigned char buf[20] = {0};
		put_u64le(buf, 1000);
		write_raw(p, buf, sizeof(buf));
	}
	EXPECT_EINVAL(p, "header length 1000 exceeds the 12 bytes after it");

	p = P("huge");
	{ /* a sparse file big enough to hold a header over the 100 MB limit */
		unsigned char buf[8];
		put_u64le(buf, 150000000);
		write_raw(p, buf, 8);
		CHECK(truncate(p, 200000000) == 0);
	}
	EXPECT_EINVAL(p, "header length 150000000 exceeds the limit");
	unlink(p);

	EXPECT_EINVAL(make_st("nonjson", "{\"a\": nope}", 0), "header is not valid JSON");
	EXPECT_EINVAL(make_st("empty_header", "", 0), "header is not valid JSON");
	EXPECT_EINVAL(make_st("array", "[1, 2]", 0), "header is not a JSON object");
	EXPECT_EINVAL(make_st("dtype", "{" ENTRY("a", "F31", "[1]", 0, 4) "}", 4), "tensor \"a\": unknown dtype \"F31\"");
	EXPECT_EINVAL(make_st("mismatch", "{" ENTRY("a", "F32", "[2]", 0, 4) "}", 4),
		      "tensor \"a\": F32 [2] needs 8 bytes but data_offsets [0, 4] hold 4");
	EXPECT_EINVAL(make_st("overlap", "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 4, 12) "}", 12),
		      "tensors \"a\" and \"b\" overlap");
	EXPECT_EINVAL(make_st("gap", "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("b", "F32", "[1]", 8, 12) "}", 12),
		      "gap in the data buffer: bytes [4, 8)");
	EXPECT_EINVAL(make_st("gap0", "{" ENTRY("a", "F32", "[1]", 4, 8) "}", 8), "gap in the data buffer: bytes [0, 4)");
	EXPECT_EINVAL(make_st("beyond", "{" ENTRY("a", "F32", "[2]", 0, 8) "}", 4),
		      "tensor \"a\": data_offsets [0, 8] extend beyond the 4-byte data buffer");
	EXPECT_EINVAL(make_st("trailing", "{" ENTRY("a", "F32", "[1]", 0, 4) "}", 8),
		      "data buffer has 8 bytes but the tensors cover 4");
	EXPECT_EINVAL(make_st("dup", "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("a", "F32", "[1]", 4, 8) "}", 8),
		      "header has a duplicate name");
	EXPECT_EINVAL(make_st("meta", "{\"__metadata__\":{\"k\":\"v\",\"n\":1}}", 0),
		      "__metadata__ value for \"n\" is not a string");
	EXPECT_EINVAL(make_st("meta_obj", "{\"__metadata__\":[\"k\"]}", 0), "__metadata__ is not a JSON object");
	EXPECT_EINVAL(make_st("negshape", "{" ENTRY("a", "F32", "[-1]", 0, 0) "}", 0),
		      "tensor \"a\": shape has negative dimension -1");
	EXPECT_EINVAL(make_st("floatshape", "{" ENTRY("a", "F32", "[1.0]", 0, 4) "}", 4),
		      "tensor \"a\": shape entry 0 is not an integer");
	EXPECT_EINVAL(make_st("ndim", "{" ENTRY("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4),
		      "shape has 9 dimensions, at most 8");
	EXPECT_EINVAL(make_st("overflow", "{" ENTRY("a", "F32", "[4294967296,4294967296,4]", 0, 4) "}", 4),
		      "tensor \"a\": shape [4294967296, 4294967296, 4] is too large");
	EXPECT_EINVAL(make_st("backwards", "{" ENTRY("a", "F32", "[0]", 4, 0) "}", 4), "are not an interval");
	EXPECT_EINVAL(make_st("negoff", "{" ENTRY("a", "F32", "[1]", -4, 0) "}", 4), "are not an interval");
	EXPECT_EINVAL(make_st("offs3", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4),
		      "data_offsets is not [begin, end]");
	EXPECT_EINVAL(make_st("missing", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
		      "tensor \"a\": missing \"shape\"");
	EXPECT_EINVAL(make_st("extra", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4),
		      "tensor \"a\": unexpected field \"x\"");
	EXPECT_EINVAL(make_st("notobj", "{\"a\":[1]}", 0), "tensor \"a\": entry is not a JSON object");
	EXPECT_EINVAL(make_st("dtnum", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
		      "dtype is not a string");
	EXPECT_EINVAL(make_st("garbage", "{}x", 0), "header is not valid JSON");
	EXPECT_EINVAL(tmpdir, "not a regular file");
#undef ENTRY

	st_safetensors *f = (st_safetensors *)1;
	CHECK(st_safetensors_open(&f, P("does-not-exist")) == ST_EIO && f == NULL);
	CHECK(strstr(st_errmsg(), "does-not-exist: cannot open: No such file") != NULL);

	/* zero-size tensors may share an offset with their neighbours */
	p = make_st("zeros", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
			     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			     "\"c\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[0,0]}}", 4);
	CHECK(st_safetensors_open(&f, p) == 0);
	CHECK(f && st_safetensors_count(f) == 3);
	st_safetensors_close(f);

	DIR *d = opendir(tmpdir);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			unlink(P(e->d_name));
	closedir(d);
}

/* Every proper prefix of a valid file is rejected. */
static void test_truncations(void)
{
	float a[3] = {1, 2, 3};
	int64_t c[2] = {5, 6};
	st_safetensors_tensor t[] = {{"a", ST_DTYPE_F32, 1, {3}, a}, {"c", ST_DTYPE_I64, 1, {2}, c}};
	const char *mk[] = {"k"}, *mv[] = {"v"};
	const char *full = P("full"), *cut = P("cut");
	CHECK(st_safetensors_write(full, 2, t, 1, mk, mv) == 0);
	size_t n;
	unsigned char *raw = read_all(full, &n);
	int bad = 0;
	for (size_t len = 0; len < n; len++) {
		write_raw(cut, raw, len);
		st_safetensors *f = NULL;
		int rc = st_safetensors_open(&f, cut);
		if (rc != ST_EINVAL || f) {
			fprintf(stderr, "prefix of %zu bytes: rc %d\n", len, rc);
			bad++;
			st_safetensors_close(f);
		}
	}
	CHECK(bad == 0);
	free(raw);
	unlink(full);
	unlink(cut);
}

/* Random byte changes in a valid file: 0 or ST_EINVAL, and every tensor of an
 * accepted file lies inside the mapping. */
static void test_mutations(void)
{
	float a[4] = {1, 2, 3, 4};
	uint16_t b[3] = {1, 2, 3};
	int32_t c[2] = {7, 8};
	st_safetensors_tensor t[] = {{"a", ST_DTYPE_F32, 2, {2, 2}, a}, {"b", ST_DTYPE_BF16, 1, {3}, b}, {"c", ST_DTYPE_I32, 1, {2}, c}};
	const char *mk[] = {"k"}, *mv[] = {"v"};
	const char *orig = P("orig"), *mut = P("mut");
	CHECK(st_safetensors_write(orig, 3, t, 1, mk, mv) == 0);
	size_t n;
	unsigned char *raw = read_all(orig, &n);
	unsigned char *buf = malloc(n);
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	int accepted = 0, bad = 0;
	static const char alphabet[] = "{}[]\":,0123456789-. aF3I6BU\\e";
	for (int it = 0; it < 3000; it++) {
		memcpy(buf, raw, n);
		int k = 1 + (int)(rng % 3);
		for (int j = 0; j < k; j++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			size_t pos = (rng >> 33) % (n - 12); /* mostly the header */
			uint64_t r = rng >> 17;
			buf[pos] = (r & 1) ? (unsigned char)alphabet[(r >> 1) % (sizeof(alphabet) - 1)]
					   : (unsigned char)(r >> 9);
		}
		write_raw(mut, buf, n);
		st_safetensors *f = NULL;
		int rc = st_safetensors_open(&f, mut);
		if (rc == 0) {
			accepted++;
			unsigned sum = 0;
			for (int i = 0; i < st_safetensors_count(f); i++) {
				const st_safetensors_info *x = st_safetensors_get(f, i);
				const unsigned char *d = x->data;
				for (size_t q = 0; q < x->nbytes; q++)
					sum += d[q];
				float tmp[64];
				if (x->numel <= 64)
					st_safetensors_read_f32(f, x->name, tmp, x->numel);
			}
			(void)sum;
			st_safetensors_close(f);
		} else if (rc != ST_EINVAL || f) {
			bad++;
		}
	}
	CHECK_MSG(bad == 0, "%d mutations gave an unexpected result", bad);
	CHECK(accepted > 0); /* some mutations only touch data or padding */
	free(buf);
	free(raw);
	unlink(orig);
	unlink(mut);
}

int main(void)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof(tmpdir), "%s/test_safetensors.XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_file();
	test_roundtrip();
	test_layout();
	test_malformed();
	test_truncations();
	test_mutations();
	test_direct_file(); /* these leave files in tmpdir: after the tests that count them */
	test_read_file();
	nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return check_result();
}
