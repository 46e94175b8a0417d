#include "data/tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

/* Token loads below are memcpy into native integers: the formats are little-endian. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "src/data/tokfile.c assumes a little-endian host"
#endif

#define BIN_HEADER_BYTES ST_TOKFILE_BIN_HEADER_BYTES
#define BIN_MAGIC_U16 ST_TOKFILE_BIN_MAGIC_U16
#define BIN_VERSION_U16 ST_TOKFILE_BIN_VERSION_U16
#define BIN_MAGIC_U32 ST_TOKFILE_BIN_MAGIC_U32
#define BIN_VERSION_U32 ST_TOKFILE_BIN_VERSION_U32

#define NPY_MAX_DIMS 32
#define NPY_MAX_STR 64

static const unsigned char npy_magic[6] = { 0x93, 'N', 'U', 'M', 'P', 'Y' };

/* Accepted .npy descr strings. One-byte types have no byte order ('|'), but
 * '<' and '>' mean the same thing there, so they are accepted too. */
static const struct {
	const char *descr;
	enum st_dtype dtype;
} npy_dtypes[] = {
	{ "|u1", ST_DTYPE_U8 },  { "<u1", ST_DTYPE_U8 },  { ">u1", ST_DTYPE_U8 },
	{ "|i1", ST_DTYPE_I8 },  { "<i1", ST_DTYPE_I8 },  { ">i1", ST_DTYPE_I8 },
	{ "<u2", ST_DTYPE_U16 }, { "<i2", ST_DTYPE_I16 }, { "<u4", ST_DTYPE_U32 },
	{ "<i4", ST_DTYPE_I32 }, { "<u8", ST_DTYPE_U64 }, { "<i8", ST_DTYPE_I64 },
};

static uint16_t load_u16(const unsigned char *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint32_t load_u32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static int32_t load_i32(const unsigned char *p)
{
	int32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* ---- llm.c .bin ------------------------------------------------------- */

static int parse_bin(st_tokfile *f)
{
	const unsigned char *p = f->map;
	size_t size = f->maplen;

	if (size < BIN_HEADER_BYTES)
		return st_fail(ST_EINVAL, "%s: truncated llm.c .bin header (%zu bytes, the header alone is %d)",
			       f->path, size, BIN_HEADER_BYTES);
	int32_t magic = load_i32(p), version = load_i32(p + 4), n = load_i32(p + 8);
	if (magic == BIN_MAGIC_U16) {
		if (version != BIN_VERSION_U16)
			return st_fail(ST_EINVAL, "%s: unsupported llm.c .bin version %" PRId32
				       " for magic %d (expected %d: uint16 tokens)",
				       f->path, version, BIN_MAGIC_U16, BIN_VERSION_U16);
		f->dtype = ST_DTYPE_U16;
	} else {
		if (version != BIN_VERSION_U32)
			return st_fail(ST_EINVAL, "%s: unsupported llm.c .bin version %" PRId32
				       " for magic %d (expected %d: uint32 tokens)",
				       f->path, version, BIN_MAGIC_U32, BIN_VERSION_U32);
		f->dtype = ST_DTYPE_U32;
	}
	f->itemsize = (int)st_dtype_size(f->dtype);
	if (n < 0)
		return st_fail(ST_EINVAL, "%s: negative token count %" PRId32 " in llm.c .bin header", f->path, n);
	/* n < 2^31 and itemsize <= 4: no overflow in 64 bits */
	uint64_t want = BIN_HEADER_BYTES + (uint64_t)n * (uint64_t)f->itemsize;
	if ((uint64_t)size < want)
		return st_fail(ST_EINVAL, "%s: truncated: header announces %" PRId32 " %s tokens (%" PRIu64
			       " bytes with the header) but the file has %zu bytes",
			       f->path, n, st_dtype_numpy_name(f->dtype), want, size);
	if ((uint64_t)size > want)
		return st_fail(ST_EINVAL, "%s: %" PRIu64 " extra bytes after the %" PRId32
			       " tokens the header announces (file has %zu bytes, expected %" PRIu64 ")",
			       f->path, (uint64_t)size - want, n, size, want);
	f->data = p + BIN_HEADER_BYTES;
	f->ntokens = n;
	f->ndim = 1;
	f->rows = 1;
	f->cols = n;
	f->format = "llm.c .bin";
	return 0;
}

/* ---- .npy header dict --------------------------------------------------- */

/*
 * The header is the repr() of a dict such as
 *   {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }
 * padded with spaces and ending in '\n'. This parser accepts the subset of
 * Python literal syntax numpy writes: quoted strings without escapes, True
 * and False, tuples of non-negative decimal integers (an old Python 2 'L'
 * suffix allowed), arbitrary whitespace, a trailing comma.
 */
struct npy_header {
	char descr[NPY_MAX_STR];
	int fortran_order;
	int ndim;
	int64_t shape[NPY_MAX_DIMS];
	int have_descr, have_fortran, have_shape;
};

struct cursor {
	const char *p, *end;
	const char *path;
};

static int hdr_fail(const struct cursor *c, const char *what)
{
	return st_fail(ST_EINVAL, "%s: malformed .npy header: %s", c->path, what);
}

static void skip_ws(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
		c->p++;
}

static int peek(const struct cursor *c) { return c->p < c->end ? (unsigned char)*c->p : -1; }

static int parse_str(struct cursor *c, char *out, size_t cap, const char *what)
{
	int q = peek(c);
	if (q != '\'' && q != '"')
		return hdr_fail(c, what);
	c->p++;
	size_t n = 0;
	for (;;) {
		int ch = peek(c);
		if (ch < 0 || ch == '\n')
			return hdr_fail(c, "unterminated string");
		c->p++;
		if (ch == q)
			break;
		/* numpy writes plain ASCII here; rejecting the rest keeps messages printable */
		if (ch == '\\' || ch < 0x20 || ch > 0x7e)
			return hdr_fail(c, "unsupported character in string");
		if (n + 1 >= cap)
			return hdr_fail(c, "string too long");
		out[n++] = (char)ch;
	}
	out[n] = 0;
	return 0;
}

static int match_word(struct cursor *c, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0)
		return 0;
	/* "Trueish" is not True */
	if ((size_t)(c->end - c->p) > n) {
		char next = c->p[n];
		if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') ||
		    (next >= '0' && next <= '9') || next == '_')
			return 0;
	}
	c->p += n;
	return 1;
}

static int parse_bool(struct cursor *c, int *out)
{
	if (match_word(c, "True"))
		*out = 1;
	else if (match_word(c, "False"))
		*out = 0;
	else
		return hdr_fail(c, "'fortran_order' must be True or False");
	return 0;
}

static int parse_dim(struct cursor *c, int64_t *out)
{
	int ch = peek(c);
	if (ch < '0' || ch > '9')
		return hdr_fail(c, "'shape' must be a tuple of non-negative integers");
	int64_t v = 0;
	while ((ch = peek(c)) >= '0' && ch <= '9') {
		if (v > (INT64_MAX - (ch - '0')) / 10)
			return hdr_fail(c, "dimension in 'shape' too large");
		v = v * 10 + (ch - '0');
		c->p++;
	}
	if (peek(c) == 'L' || peek(c) == 'l')
		c->p++;
	*out = v;
	return 0;
}

static int parse_shape(struct cursor *c, struct npy_header *h)
{
	if (peek(c) != '(')
		return hdr_fail(c, "'shape' must be a tuple");
	c->p++;
	h->ndim = 0;
	int need_comma = 0; /* a one-element tuple needs its trailing comma: (5) is not a tuple */
	for (;;) {
		skip_ws(c);
		if (peek(c) == ')') {
			if (need_comma)
				return hdr_fail(c, "'shape' must be a tuple, e.g. (5,)");
			c->p++;
			return 0;
		}
		if (h->ndim == NPY_MAX_DIMS)
			return hdr_fail(c, "too many dimensions in 'shape'");
		int rc = parse_dim(c, &h->shape[h->ndim++]);
		if (rc < 0)
			return rc;
		skip_ws(c);
		if (peek(c) == ',') {
			c->p++;
			need_comma = 0;
		} else if (peek(c) == ')') {
			if (h->ndim == 1)
				need_comma = 1;
		} else {
			return hdr_fail(c, "expected ',' or ')' in 'shape'");
		}
	}
}

static int parse_npy_dict(struct cursor *c, struct npy_header *h)
{
	memset(h, 0, sizeof(*h));
	skip_ws(c);
	if (peek(c) != '{')
		return hdr_fail(c, "does not start with '{'");
	c->p++;
	for (;;) {
		skip_ws(c);
		if (peek(c) == '}') {
			c->p++;
			break;
		}
		char key[NPY_MAX_STR];
		int rc = parse_str(c, key, sizeof(key), "expected a quoted key or '}'");
		if (rc < 0)
			return rc;
		skip_ws(c);
		if (peek(c) != ':')
			return hdr_fail(c, "expected ':' after a key");
		c->p++;
		skip_ws(c);
		int *seen;
		if (strcmp(key, "descr") == 0) {
			seen = &h->have_descr;
			if (peek(c) == '[')
				return st_fail(ST_EINVAL, "%s: structured .npy dtypes are not supported (need an integer array)",
					       c->path);
			rc = parse_str(c, h->descr, sizeof(h->descr), "'descr' must be a quoted string");
		} else if (strcmp(key, "fortran_order") == 0) {
			seen = &h->have_fortran;
			rc = parse_bool(c, &h->fortran_order);
		} else if (strcmp(key, "shape") == 0) {
			seen = &h->have_shape;
			rc = parse_shape(c, h);
		} else {
			return st_fail(ST_EINVAL, "%s: malformed .npy header: unexpected key '%s'", c->path, key);
		}
		if (rc < 0)
			return rc;
		if (*seen)
			return st_fail(ST_EINVAL, "%s: malformed .npy header: duplicate key '%s'", c->path, key);
		*seen = 1;
		skip_ws(c);
		if (peek(c) == ',') {
			c->p++;
		} else if (peek(c) != '}') {
			return hdr_fail(c, "expected ',' or '}' after a value");
		}
	}
	skip_ws(c);
	if (c->p != c->end)
		return hdr_fail(c, "unexpected text after the closing '}'");
	if (!h->have_descr)
		return hdr_fail(c, "missing key 'descr'");
	if (!h->have_fortran)
		return hdr_fail(c, "missing key 'fortran_order'");
	if (!h->have_shape)
		return hdr_fail(c, "missing key 'shape'");
	return 0;
}

static int npy_dtype(const st_tokfile *f, const char *descr, enum st_dtype *out)
{
	for (size_t i = 0; i < sizeof(npy_dtypes) / sizeof(npy_dtypes[0]); i++) {
		if (strcmp(descr, npy_dtypes[i].descr) == 0) {
			*out = npy_dtypes[i].dtype;
			return 0;
		}
	}
	char kind = strlen(descr) >= 2 ? descr[1] : 0;
	if (kind && strchr("fcb?", kind))
		return st_fail(ST_EINVAL, "%s: dtype '%s' is not an integer type (token ids must be integers)",
			       f->path, descr);
	if (descr[0] == '>' && (kind == 'i' || kind == 'u'))
		return st_fail(ST_EINVAL, "%s: big-endian dtype '%s' is not supported (save little-endian: a.astype('<%s'))",
			       f->path, descr, descr + 1);
	return st_fail(ST_EINVAL, "%s: unsupported .npy dtype '%s' (use one of <i2 <i4 <i8 <u2 <u4 <u8 |u1 |i1)",
		       f->path, descr);
}

static int parse_npy(st_tokfile *f)
{
	const unsigned char *p = f->map;
	size_t size = f->maplen;
	size_t hoff;
	uint64_t hlen;

	if (size < 10)
		return st_fail(ST_EINVAL, "%s: truncated .npy header (%zu bytes)", f->path, size);
	int major = p[6], minor = p[7];
	if (major == 1 && minor == 0) {
		hoff = 10;
		hlen = load_u16(p + 8);
	} else if ((major == 2 || major == 3) && minor == 0) {
		if (size < 12)
			return st_fail(ST_EINVAL, "%s: truncated .npy header (%zu bytes)", f->path, size);
		hoff = 12;
		hlen = load_u32(p + 8);
	} else {
		return st_fail(ST_EINVAL, "%s: unsupported .npy format version %d.%d (know 1.0, 2.0, 3.0)",
			       f->path, major, minor);
	}
	if (hlen > size - hoff)
		return st_fail(ST_EINVAL, "%s: truncated .npy header (header length field says %" PRIu64
			       " bytes, only %zu follow)", f->path, hlen, size - hoff);

	struct npy_header h;
	struct cursor c = { (const char *)p + hoff, (const char *)p + hoff + hlen, f->path };
	int rc = parse_npy_dict(&c, &h);
	if (rc < 0)
		return rc;
	rc = npy_dtype(f, h.descr, &f->dtype);
	if (rc < 0)
		return rc;
	f->itemsize = (int)st_dtype_size(f->dtype);
	if (h.fortran_order)
		return st_fail(ST_EINVAL, "%s: fortran_order=True is not supported (save a C-order array: "
			       "np.ascontiguousarray(a))", f->path);
	if (h.ndim == 0)
		return st_fail(ST_EINVAL, "%s: 0-D .npy array (shape ()); need a 1-D token stream or 2-D rows",
			       f->path);
	if (h.ndim > 2)
		return st_fail(ST_EINVAL, "%s: %d-D .npy array; need a 1-D token stream or 2-D rows",
			       f->path, h.ndim);

	int64_t n = h.shape[0];
	if (h.ndim == 2 && __builtin_mul_overflow(h.shape[0], h.shape[1], &n))
		return st_fail(ST_EINVAL, "%s: .npy shape (%" PRId64 ", %" PRId64 ") is too large",
			       f->path, h.shape[0], h.shape[1]);
	uint64_t want;
	if (__builtin_mul_overflow((uint64_t)n, (uint64_t)f->itemsize, &want))
		return st_fail(ST_EINVAL, "%s: .npy shape of %" PRId64 " elements is too large", f->path, n);
	uint64_t have = (uint64_t)(size - hoff - hlen);
	if (have < want)
		return st_fail(ST_EINVAL, "%s: truncated: .npy header announces %" PRId64 " %s elements (%" PRIu64
			       " bytes) but %" PRIu64 " bytes of data follow",
			       f->path, n, st_dtype_numpy_name(f->dtype), want, have);
	if (have > want)
		return st_fail(ST_EINVAL, "%s: %" PRIu64 " extra bytes after the %" PRId64
			       " elements the .npy header announces", f->path, have - want, n);
	f->data = p + hoff + hlen;
	f->ntokens = n;
	f->ndim = h.ndim;
	f->rows = h.ndim == 2 ? h.shape[0] : 1;
	f->cols = h.ndim == 2 ? h.shape[1] : n;
	f->format = ".npy";
	return 0;
}

/* ---- open / check / read ------------------------------------------------ */

int st_tokfile_open(st_tokfile *f, const char *path)
{
	struct stat st;
	int rc;

	*f = (st_tokfile)ST_TOKFILE_INIT;
	if (stat(path, &st) != 0)
		return st_fail(ST_EINVAL, "%s: cannot open: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return st_fail(ST_EINVAL, "%s: is a directory, not a token file", path);
	if (!S_ISREG(st.st_mode))
		return st_fail(ST_EINVAL, "%s: not a regular file", path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_fail(ST_EINVAL, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		rc = st_fail(ST_EIO, "%s: fstat: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: not a regular file", path);
	}
	if (st.st_size == 0) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: empty file, not a token file", path);
	}
	if ((uintmax_t)st.st_size > SIZE_MAX) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: too large to map", path);
	}
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = st_fail(ST_EIO, "%s: mmap: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	close(fd); /* the mapping keeps the file */
	f->map = map;
	f->maplen = (size_t)st.st_size;
	f->path = strdup(path);
	if (!f->path) {
		st_tokfile_release(f);
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	}

	const unsigned char *p = map;
	int32_t magic = f->maplen >= 4 ? load_i32(p) : 0;
	if (f->maplen >= sizeof(npy_magic) && memcmp(p, npy_magic, sizeof(npy_magic)) == 0)
		rc = parse_npy(f);
	else if (magic == BIN_MAGIC_U16 || magic == BIN_MAGIC_U32)
		rc = parse_bin(f);
	else
		rc = st_fail(ST_EINVAL, "%s: not a token file (bad magic; expected an llm.c .bin shard or .npy array)",
			     path);
	if (rc < 0)
		st_tokfile_release(f);
	return rc;
}

static int bad_id(const st_tokfile *f, int64_t pos, int neg, int64_t sval, uint64_t uval, int64_t vocab)
{
	if (neg)
		return st_fail(ST_EINVAL, "%s: token id %" PRId64 " at position %" PRId64 " is negative",
			       f->path, sval, pos);
	return st_fail(ST_EINVAL, "%s: token id %" PRIu64 " at position %" PRId64 " is >= vocab_size %" PRId64,
		       f->path, uval, pos, vocab);
}

/* One loop per type so the compiler vectorizes the common no-error path. */
#define SCAN_UNSIGNED(T)                                                             \
	do {                                                                         \
		const unsigned char *d = f->data;                                    \
		for (int64_t k = 0; k < n; k++) {                                    \
			T v;                                                         \
			memcpy(&v, d + k * (int64_t)sizeof(T), sizeof(T));           \
			if ((uint64_t)v >= (uint64_t)vocab)                          \
				return bad_id(f, k, 0, 0, (uint64_t)v, vocab);       \
		}                                                                    \
	} while (0)

#define SCAN_SIGNED(T)                                                               \
	do {                                                                         \
		const unsigned char *d = f->data;                                    \
		for (int64_t k = 0; k < n; k++) {                                    \
			T v;                                                         \
			memcpy(&v, d + k * (int64_t)sizeof(T), sizeof(T));           \
			if (v < 0)                                                   \
				return bad_id(f, k, 1, (int64_t)v, 0, vocab);        \
			if ((int64_t)v >= vocab)                                     \
				return bad_id(f, k, 0, 0, (uint64_t)v, vocab);       \
		}                                                                    \
	} while (0)

int st_tokfile_check_ids(const st_tokfile *f, int64_t vocab)
{
	int64_t n = f->ntokens;
	if (n == 0)
		return 0;
	/* One sequential pass; afterwards reads may be in shuffled order. */
	madvise(f->map, f->maplen, MADV_SEQUENTIAL);
	switch (f->dtype) {
	case ST_DTYPE_U8:
		if (vocab < 256)
			SCAN_UNSIGNED(uint8_t);
		break;
	case ST_DTYPE_U16:
		if (vocab < 65536)
			SCAN_UNSIGNED(uint16_t);
		break;
	case ST_DTYPE_U32: SCAN_UNSIGNED(uint32_t); break;
	case ST_DTYPE_U64: SCAN_UNSIGNED(uint64_t); break;
	case ST_DTYPE_I8: SCAN_SIGNED(int8_t); break;
	case ST_DTYPE_I16: SCAN_SIGNED(int16_t); break;
	case ST_DTYPE_I32: SCAN_SIGNED(int32_t); break;
	case ST_DTYPE_I64: SCAN_SIGNED(int64_t); break;
	default: ST_BUG("%s: token dtype %d", f->path, (int)f->dtype); /* open sets integer types only */
	}
	madvise(f->map, f->maplen, MADV_NORMAL);
	return 0;
}

#define COPY(T)                                                                      \
	do {                                                                         \
		const unsigned char *d = f->data + start * (int64_t)sizeof(T);       \
		for (int64_t k = 0; k < n; k++) {                                    \
			T v;                                                         \
			memcpy(&v, d + k * (int64_t)sizeof(T), sizeof(T));           \
			out[k] = (int32_t)v;                                         \
		}                                                                    \
	} while (0)

void st_tokfile_get(const st_tokfile *f, int64_t start, int64_t n, int32_t *out)
{
	if (start < 0 || n < 0 || start > f->ntokens - n)
		ST_BUG("%s: token range %" PRId64 "+%" PRId64 " outside %" PRId64, f->path, start, n, f->ntokens);
	switch (f->dtype) {
	case ST_DTYPE_U8: COPY(uint8_t); break;
	case ST_DTYPE_I8: COPY(int8_t); break;
	case ST_DTYPE_U16: COPY(uint16_t); break;
	case ST_DTYPE_I16: COPY(int16_t); break;
	case ST_DTYPE_U32: COPY(uint32_t); break;
	case ST_DTYPE_I32: memcpy(out, f->data + start * 4, (size_t)n * 4); break;
	case ST_DTYPE_U64: COPY(uint64_t); break;
	case ST_DTYPE_I64: COPY(int64_t); break;
	default: ST_BUG("%s: token dtype %d", f->path, (int)f->dtype);
	}
}

void st_tokfile_release(st_tokfile *f)
{
	if (f->map)
		munmap(f->map, f->maplen);
	free(f->path);
	*f = (st_tokfile)ST_TOKFILE_INIT;
}

/* ---- writing llm.c .bin shards ------------------------------------------ */

#define WRITER_BUF_BYTES ((size_t)1 << 20)

static void bin_header(unsigned char *hdr, int itemsize, int64_t ntokens)
{
	int32_t words[3] = {itemsize == 2 ? BIN_MAGIC_U16 : BIN_MAGIC_U32,
			    itemsize == 2 ? BIN_VERSION_U16 : BIN_VERSION_U32, (int32_t)ntokens};
	memset(hdr, 0, BIN_HEADER_BYTES);
	memcpy(hdr, words, sizeof(words));
}

int st_tokfile_writer_open(st_tokfile_writer *w, const char *path, int64_t vocab_size)
{
	unsigned char hdr[BIN_HEADER_BYTES];
	*w = (st_tokfile_writer)ST_TOKFILE_WRITER_INIT;
	if (vocab_size < 1 || vocab_size > (int64_t)1 << 32)
		return st_fail(ST_EINVAL, "%s: vocabulary size %" PRId64 " does not fit a token file", path, vocab_size);
	w->vocab_size = vocab_size;
	w->itemsize = vocab_size <= 65536 ? 2 : 4;
	if (!(w->buf = malloc(WRITER_BUF_BYTES)))
		return st_fail(ST_ENOMEM, "out of memory");
	int rc = st_atomic_file_open(&w->file, path);
	if (rc == 0) {
		bin_header(hdr, w->itemsize, 0); /* the count is written by commit */
		rc = st_atomic_file_write(&w->file, hdr, sizeof(hdr));
	}
	if (rc < 0)
		st_tokfile_writer_abort(w);
	return rc;
}

static int writer_flush(st_tokfile_writer *w)
{
	int rc = w->nbuf ? st_atomic_file_write(&w->file, w->buf, w->nbuf) : 0;
	w->nbuf = 0;
	return rc;
}

int st_tokfile_writer_put(st_tokfile_writer *w, const int32_t *ids, size_t n)
{
	if ((uint64_t)w->ntokens + n > ST_TOKFILE_BIN_MAX_TOKENS)
		return st_fail(ST_EINVAL, "%s: more than %d tokens, the most one llm.c .bin file holds: split the input",
			       w->file.path, ST_TOKFILE_BIN_MAX_TOKENS);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= w->vocab_size)
			return st_fail(ST_EINVAL, "%s: token id %" PRId32 " is outside [0, %" PRId64 ")", w->file.path, ids[i],
				       w->vocab_size);
		if (w->nbuf + 4 > WRITER_BUF_BYTES) {
			int rc = writer_flush(w);
			if (rc < 0)
				return rc;
		}
		if (w->itemsize == 2) {
			uint16_t v = (uint16_t)ids[i];
			memcpy(w->buf + w->nbuf, &v, 2);
		} else {
			uint32_t v = (uint32_t)ids[i];
			memcpy(w->buf + w->nbuf, &v, 4);
		}
		w->nbuf += (size_t)w->itemsize;
	}
	w->ntokens += (int64_t)n;
	return 0;
}

int st_tokfile_writer_commit(st_tokfile_writer *w)
{
	unsigned char hdr[BIN_HEADER_BYTES];
	bin_header(hdr, w->itemsize, w->ntokens);
	int rc = writer_flush(w);
	if (rc == 0)
		rc = st_atomic_file_write_at(&w->file, hdr, sizeof(hdr), 0);
	if (rc < 0) {
		st_tokfile_writer_abort(w);
		return rc;
	}
	rc = st_atomic_file_commit(&w->file);
	free(w->buf);
	*w = (st_tokfile_writer)ST_TOKFILE_WRITER_INIT;
	return rc;
}

void st_tokfile_writer_abort(st_tokfile_writer *w)
{
	st_atomic_file_abort(&w->file);
	free(w->buf);
	*w = (st_tokfile_writer)ST_TOKFILE_WRITER_INIT;
}
