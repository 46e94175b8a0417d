#include "ckpt/safetensors.h"

#include "base/err.h"
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; big-endian hosts are not supported"
#endif

/* The reference implementation refuses larger headers; so do we, so that a
 * corrupt length cannot make us parse gigabytes of tensor data as JSON. */
#define MAX_HEADER_LEN 100000000ull
#define META_KEY "__metadata__"

/* numel and byte size of a shape; -1 on overflow of int64 / size_t. */
static int shape_size(int ndim, const int64_t *shape, size_t elsize, int64_t *numel, size_t *nbytes)
{
	int64_t ne = 1;
	for (int d = 0; d < ndim; d++)
		if (__builtin_mul_overflow(ne, shape[d], &ne))
			return -1;
	size_t nb;
	if (__builtin_mul_overflow((uint64_t)ne, (uint64_t)elsize, &nb) || nb > INT64_MAX)
		return -1;
	*numel = ne;
	*nbytes = nb;
	return 0;
}

/* "[2, 3]" into buf. */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
	size_t len = (size_t)snprintf(buf, cap, "[");
	for (int d = 0; d < ndim && len < cap; d++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
	if (len < cap)
		snprintf(buf + len, cap - len, "]");
	return buf;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first string that occurs twice in v[0..n), or NULL. */
static const char *find_duplicate(const char **v, int n, int *nomem)
{
	*nomem = 0;
	if (n < 2)
		return NULL;
	const char **s = malloc((size_t)n * sizeof(*s));
	if (!s) {
		*nomem = 1;
		return NULL;
	}
	memcpy(s, v, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_str);
	const char *dup = NULL;
	for (int i = 1; i < n && !dup; i++)
		if (strcmp(s[i - 1], s[i]) == 0)
			dup = s[i];
	free(s);
	return dup;
}

/* ---------------------------------------------------------------- writer */

static int check_tensors(const char *path, int n, const st_safetensors_tensor *t, size_t *nbytes, int need_data)
{
	for (int i = 0; i < n; i++) {
		const st_safetensors_tensor *x = &t[i];
		if (!x->name)
			return st_fail(ST_EINVAL, "%s: tensor %d has no name", path, i);
		if (strcmp(x->name, META_KEY) == 0)
			return st_fail(ST_EINVAL, "%s: \"%s\" cannot be a tensor name", path, META_KEY);
		size_t es = st_dtype_size(x->dtype);
		if (!es)
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": invalid dtype %d", path, x->name,
				       (int)x->dtype);
		if (x->ndim < 0 || x->ndim > ST_SAFETENSORS_MAX_DIMS)
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": ndim %d is not in 0..%d", path,
				       x->name, x->ndim, ST_SAFETENSORS_MAX_DIMS);
		for (int d = 0; d < x->ndim; d++)
			if (x->shape[d] < 0)
				return st_fail(ST_EINVAL, "%s: tensor \"%s\": negative dimension %lld",
					       path, x->name, (long long)x->shape[d]);
		int64_t numel;
		if (shape_size(x->ndim, x->shape, es, &numel, &nbytes[i]) < 0)
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": size overflows", path, x->name);
		if (need_data && nbytes[i] && !x->data)
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": no data", path, x->name);
	}
	return 0;
}

/* The compact JSON header for the tensors, unpadded; caller frees. */
static int build_header(const char *path, int n, const st_safetensors_tensor *t, const size_t *nbytes,
			int nmeta, const char **mk, const char **mv, char **out)
{
	json_t *root = json_object();
	if (!root)
		goto nomem;
	if (nmeta > 0) {
		json_t *meta = json_object();
		if (json_object_set_new(root, META_KEY, meta) < 0)
			goto nomem;
		for (int i = 0; i < nmeta; i++) {
			json_t *v = json_string(mv[i]);
			if (!v || json_object_set_new(meta, mk[i], v) < 0) {
				json_decref(root);
				return st_fail(ST_EINVAL, "%s: metadata \"%s\" is not valid UTF-8", path, mk[i]);
			}
		}
	}
	uint64_t off = 0;
	for (int i = 0; i < n; i++) {
		json_t *shape = json_array();
		int bad = !shape;
		for (int d = 0; !bad && d < t[i].ndim; d++)
			bad = json_array_append_new(shape, json_integer(t[i].shape[d])) < 0;
		if (bad) {
			json_decref(shape);
			goto nomem;
		}
		/* "o" hands shape to the entry, also when packing fails */
		json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t[i].dtype),
				      "shape", shape, "data_offsets", (json_int_t)off,
				      (json_int_t)(off + nbytes[i]));
		if (!e)
			goto nomem;
		if (json_object_set_new(root, t[i].name, e) < 0) {
			json_decref(root);
			return st_fail(ST_EINVAL, "%s: tensor name \"%s\" is not valid UTF-8", path, t[i].name);
		}
		off += nbytes[i];
	}
	*out = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!*out)
		return st_fail(ST_ENOMEM, "%s: out of memory building the header", path);
	return 0;
nomem:
	json_decref(root);
	return st_fail(ST_ENOMEM, "%s: out of memory building the header", path);
}

/* Checks the lists and builds the padded header (8-byte length, JSON, spaces) into *out. */
static int make_header(const char *path, int n, const st_safetensors_tensor *t, int nmeta, const char **meta_keys,
		       const char **meta_vals, int need_data, size_t *nbytes, char **out, size_t *out_len)
{
	if (n < 0 || nmeta < 0 || (n && !t) || (nmeta && (!meta_keys || !meta_vals)))
		return st_fail(ST_EINVAL, "%s: bad tensor or metadata list", path);
	for (int i = 0; i < nmeta; i++)
		if (!meta_keys[i] || !meta_vals[i])
			return st_fail(ST_EINVAL, "%s: metadata pair %d is NULL", path, i);

	int rc, nomem;
	char *header = NULL, *buf;
	const char **names = NULL;
	if ((rc = check_tensors(path, n, t, nbytes, need_data)) < 0)
		goto out;

	names = malloc(((size_t)n + 1) * sizeof(*names));
	if (!names) {
		rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < n; i++)
		names[i] = t[i].name;
	const char *dup = find_duplicate(names, n, &nomem);
	if (!dup && !nomem)
		dup = find_duplicate(meta_keys, nmeta, &nomem);
	if (nomem) {
		rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	if (dup) {
		rc = st_fail(ST_EINVAL, "%s: duplicate name \"%s\"", path, dup);
		goto out;
	}

	if ((rc = build_header(path, n, t, nbytes, nmeta, meta_keys, meta_vals, &header)) < 0)
		goto out;
	size_t hlen = strlen(header), padded = (hlen + 7) & ~(size_t)7;
	if (!(buf = malloc(8 + padded))) {
		rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
	memcpy(buf + 8, header, hlen);
	memset(buf + 8 + hlen, ' ', padded - hlen);
	*out = buf;
	*out_len = 8 + padded;
out:
	free(header);
	free(names);
	return rc;
}

int st_safetensors_header(const char *path, int n, const st_safetensors_tensor *t, int nmeta, const char **meta_keys,
			  const char **meta_vals, char **out, size_t *len)
{
	size_t *nbytes = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof(*nbytes));
	*out = NULL;
	*len = 0;
	if (!nbytes)
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	int rc = make_header(path, n, t, nmeta, meta_keys, meta_vals, 0, nbytes, out, len);
	free(nbytes);
	return rc;
}

int st_safetensors_write(const char *path, int n, const st_safetensors_tensor *t, int nmeta,
			 const char **meta_keys, const char **meta_vals)
{
	char *header = NULL;
	size_t hlen;
	size_t *nbytes = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof(*nbytes));
	if (!nbytes)
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	int rc = make_header(path, n, t, nmeta, meta_keys, meta_vals, 1, nbytes, &header, &hlen);
	if (rc < 0)
		goto out;

	st_atomic_file af;
	if ((rc = st_atomic_file_open(&af, path)) < 0)
		goto out;
	st_atomic_file_write(&af, header, hlen);
	for (int i = 0; i < n; i++)
		if (nbytes[i])
			st_atomic_file_write(&af, t[i].data, nbytes[i]);
	rc = st_atomic_file_commit(&af);
out:
	free(header);
	free(nbytes);
	return rc;
}

/* ---------------------------------------------------------------- reader */

struct st_safetensors {
	char *path;
	void *map;
	size_t map_len;
	int n;
	st_safetensors_info *t;      /* header order */
	int *by_name;       /* indices of t sorted by name */
	int nmeta;
	char **meta_keys;
	char **meta_vals;
};

const char *st_safetensors_path(const st_safetensors *f) { return f->path; }
int st_safetensors_count(const st_safetensors *f) { return f->n; }
int st_safetensors_meta_count(const st_safetensors *f) { return f->nmeta; }

const st_safetensors_info *st_safetensors_get(const st_safetensors *f, int i)
{
	if (i < 0 || i >= f->n)
		ST_BUG("st_safetensors_get: index %d out of range 0..%d", i, f->n - 1);
	return &f->t[i];
}

const char *st_safetensors_meta_key(const st_safetensors *f, int i)
{
	if (i < 0 || i >= f->nmeta)
		ST_BUG("st_safetensors_meta_key: index %d out of range 0..%d", i, f->nmeta - 1);
	return f->meta_keys[i];
}

const char *st_safetensors_meta(const st_safetensors *f, const char *key)
{
	for (int i = 0; i < f->nmeta; i++)
		if (strcmp(f->meta_keys[i], key) == 0)
			return f->meta_vals[i];
	return NULL;
}

const st_safetensors_info *st_safetensors_find(const st_safetensors *f, const char *name)
{
	int lo = 0, hi = f->n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		int c = strcmp(f->t[f->by_name[mid]].name, name);
		if (c == 0)
			return &f->t[f->by_name[mid]];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void st_safetensors_close(st_safetensors *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->map_len);
	if (f->t)
		for (int i = 0; i < f->n; i++)
			free((char *)f->t[i].name);
	for (int i = 0; f->meta_keys && i < f->nmeta; i++) {
		free(f->meta_keys[i]);
		free(f->meta_vals[i]);
	}
	free(f->meta_keys);
	free(f->meta_vals);
	free(f->t);
	free(f->by_name);
	free(f->path);
	free(f);
}

/* The tensor array the comparators below index into (qsort has no context argument). */
static _Thread_local const st_safetensors_info *sort_t;

static int cmp_by_offset(const void *a, const void *b)
{
	const st_safetensors_info *x = &sort_t[*(const int *)a], *y = &sort_t[*(const int *)b];
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_by_name(const void *a, const void *b)
{
	return strcmp(sort_t[*(const int *)a].name, sort_t[*(const int *)b].name);
}

/* Parse one tensor entry into *ti (name already set). */
static int parse_entry(const char *path, const char *name, json_t *e, uint64_t buf_len, st_safetensors_info *ti)
{
	if (!json_is_object(e))
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": entry is not a JSON object", path, name);
	json_t *dtype = NULL, *shape = NULL, *offs = NULL;
	const char *k;
	json_t *v;
	json_object_foreach(e, k, v) {
		if (strcmp(k, "dtype") == 0)
			dtype = v;
		else if (strcmp(k, "shape") == 0)
			shape = v;
		else if (strcmp(k, "data_offsets") == 0)
			offs = v;
		else
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": unexpected field \"%s\"", path, name, k);
	}
	if (!dtype || !shape || !offs)
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": missing \"%s\"", path, name,
			       !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

	if (!json_is_string(dtype))
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": dtype is not a string", path, name);
	ti->dtype = st_dtype_parse(json_string_value(dtype));
	if (!ti->dtype)
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name,
			       json_string_value(dtype));

	if (!json_is_array(shape))
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": shape is not an array", path, name);
	if (json_array_size(shape) > ST_SAFETENSORS_MAX_DIMS)
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": shape has %zu dimensions, at most %d supported",
			       path, name, json_array_size(shape), ST_SAFETENSORS_MAX_DIMS);
	ti->ndim = (int)json_array_size(shape);
	for (int d = 0; d < ti->ndim; d++) {
		json_t *s = json_array_get(shape, (size_t)d);
		if (!json_is_integer(s))
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": shape entry %d is not an integer",
				       path, name, d);
		if (json_integer_value(s) < 0)
			return st_fail(ST_EINVAL, "%s: tensor \"%s\": shape has negative dimension %lld",
				       path, name, (long long)json_integer_value(s));
		ti->shape[d] = json_integer_value(s);
	}
	char sbuf[256];
	if (shape_size(ti->ndim, ti->shape, st_dtype_size(ti->dtype), &ti->numel, &ti->nbytes) < 0)
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": shape %s is too large", path, name,
			       shape_str(sbuf, sizeof(sbuf), ti->ndim, ti->shape));

	json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
	if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(b) || !json_is_integer(en))
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": data_offsets is not [begin, end]", path, name);
	long long begin = json_integer_value(b), end = json_integer_value(en);
	if (begin < 0 || end < begin)
		return st_fail(ST_EINVAL, "%s: tensor \"%s\": data_offsets [%lld, %lld] are not an interval",
			       path, name, begin, end);
	if ((uint64_t)end > buf_len)
		return st_fail(ST_EINVAL,
			       "%s: tensor \"%s\": data_offsets [%lld, %lld] extend beyond the %llu-byte data buffer",
			       path, name, begin, end, (unsigned long long)buf_len);
	if ((uint64_t)(end - begin) != ti->nbytes)
		return st_fail(ST_EINVAL,
			       "%s: tensor \"%s\": %s %s needs %zu bytes but data_offsets [%lld, %lld] hold %lld",
			       path, name, st_dtype_name(ti->dtype),
			       shape_str(sbuf, sizeof(sbuf), ti->ndim, ti->shape), ti->nbytes, begin, end,
			       end - begin);
	ti->offset = (uint64_t)begin;
	return 0;
}

static int parse_metadata(st_safetensors *f, json_t *meta)
{
	if (!json_is_object(meta))
		return st_fail(ST_EINVAL, "%s: %s is not a JSON object", f->path, META_KEY);
	size_t n = json_object_size(meta);
	f->meta_keys = calloc(n + 1, sizeof(char *));
	f->meta_vals = calloc(n + 1, sizeof(char *));
	if (!f->meta_keys || !f->meta_vals)
		return st_fail(ST_ENOMEM, "%s: out of memory", f->path);
	const char *k;
	json_t *v;
	json_object_foreach(meta, k, v) {
		if (!json_is_string(v))
			return st_fail(ST_EINVAL, "%s: %s value for \"%s\" is not a string", f->path,
				       META_KEY, k);
		int i = f->nmeta;
		f->meta_keys[i] = strdup(k);
		f->meta_vals[i] = strdup(json_string_value(v));
		f->nmeta++; /* counted now so that close frees a half-copied pair */
		if (!f->meta_keys[i] || !f->meta_vals[i])
			return st_fail(ST_ENOMEM, "%s: out of memory", f->path);
	}
	return 0;
}

/* Every byte of the buffer belongs to exactly one tensor. */
static int check_tiling(st_safetensors *f, uint64_t buf_len)
{
	int *order = malloc(((size_t)f->n + 1) * sizeof(int));
	if (!order)
		return st_fail(ST_ENOMEM, "%s: out of memory", f->path);
	for (int i = 0; i < f->n; i++)
		order[i] = i;
	sort_t = f->t;
	qsort(order, (size_t)f->n, sizeof(int), cmp_by_offset);
	int rc = 0;
	uint64_t pos = 0;
	const st_safetensors_info *prev = NULL;
	for (int i = 0; i < f->n && rc == 0; i++) {
		const st_safetensors_info *x = &f->t[order[i]];
		if (x->offset < pos)
			rc = st_fail(ST_EINVAL, "%s: tensors \"%s\" and \"%s\" overlap in the data buffer",
				     f->path, prev->name, x->name);
		else if (x->offset > pos)
			rc = st_fail(ST_EINVAL, "%s: gap in the data buffer: bytes [%llu, %llu) belong to no tensor",
				     f->path, (unsigned long long)pos, (unsigned long long)x->offset);
		pos = x->offset + x->nbytes;
		prev = x;
	}
	if (rc == 0 && pos != buf_len)
		rc = st_fail(ST_EINVAL, "%s: data buffer has %llu bytes but the tensors cover %llu",
			     f->path, (unsigned long long)buf_len, (unsigned long long)pos);
	free(order);
	return rc;
}

static int parse_header(st_safetensors *f, const unsigned char *hdr, size_t hlen,
			const unsigned char *buf, uint64_t buf_len)
{
	json_error_t jerr;
	json_t *root = json_loadb((const char *)hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (json_error_code(&jerr) == json_error_duplicate_key)
			return st_fail(ST_EINVAL, "%s: header has a duplicate name: %s", f->path, jerr.text);
		return st_fail(ST_EINVAL, "%s: header is not valid JSON: %s (at byte %d of the header)",
			       f->path, jerr.text, jerr.position);
	}
	int rc = 0;
	if (!json_is_object(root)) {
		rc = st_fail(ST_EINVAL, "%s: header is not a JSON object", f->path);
		goto out;
	}
	size_t n = json_object_size(root);
	if (n > INT32_MAX) {
		rc = st_fail(ST_EINVAL, "%s: too many tensors", f->path);
		goto out;
	}
	f->t = calloc(n + 1, sizeof(*f->t));
	f->by_name = malloc((n + 1) * sizeof(int));
	if (!f->t || !f->by_name) {
		rc = st_fail(ST_ENOMEM, "%s: out of memory", f->path);
		goto out;
	}
	const char *k;
	json_t *v;
	json_object_foreach(root, k, v) {
		if (strcmp(k, META_KEY) == 0) {
			if ((rc = parse_metadata(f, v)) < 0)
				goto out;
			continue;
		}
		st_safetensors_info *ti = &f->t[f->n];
		if (!(ti->name = strdup(k))) {
			rc = st_fail(ST_ENOMEM, "%s: out of memory", f->path);
			goto out;
		}
		f->n++;
		if ((rc = parse_entry(f->path, k, v, buf_len, ti)) < 0)
			goto out;
		ti->data = buf + ti->offset;
	}
	if ((rc = check_tiling(f, buf_len)) < 0)
		goto out;
	for (int i = 0; i < f->n; i++)
		f->by_name[i] = i;
	sort_t = f->t;
	qsort(f->by_name, (size_t)f->n, sizeof(int), cmp_by_name);
out:
	json_decref(root);
	return rc;
}

int st_safetensors_open(st_safetensors **out, const char *path)
{
	*out = NULL;
	st_safetensors *f = calloc(1, sizeof(*f));
	if (!f || !(f->path = strdup(path))) {
		free(f);
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	}
	int rc;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = st_fail(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
		goto fail;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = st_fail(ST_EIO, "%s: cannot stat: %s", path, strerror(errno));
		close(fd);
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = st_fail(ST_EINVAL, "%s: not a regular file", path);
		close(fd);
		goto fail;
	}
	uint64_t size = (uint64_t)st.st_size;
	if (size < 8) {
		rc = st_fail(ST_EINVAL, "%s: file has %llu bytes, too short for the 8-byte header length",
			     path, (unsigned long long)size);
		close(fd);
		goto fail;
	}
	f->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		rc = st_fail(ST_EIO, "%s: cannot mmap: %s", path, strerror(errno));
		goto fail;
	}
	f->map_len = (size_t)size;
	const unsigned char *p = f->map;
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)p[i] << (8 * i);
	if (hlen > size - 8) {
		rc = st_fail(ST_EINVAL, "%s: header length %llu exceeds the %llu bytes after it in the file",
			     path, (unsigned long long)hlen, (unsigned long long)(size - 8));
		goto fail;
	}
	if (hlen > MAX_HEADER_LEN) {
		rc = st_fail(ST_EINVAL, "%s: header length %llu exceeds the limit of %llu bytes", path,
			     (unsigned long long)hlen, MAX_HEADER_LEN);
		goto fail;
	}
	if ((rc = parse_header(f, p + 8, (size_t)hlen, p + 8 + hlen, size - 8 - hlen)) < 0)
		goto fail;
	*out = f;
	return 0;
fail:
	st_safetensors_close(f);
	return rc;
}

/* ---------------------------------------------------------------- conversion */

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
	if (exp == 0) {
		float v = ldexpf((float)man, -24); /* zero or subnormal: man * 2^-24 */
		return sign ? -v : v;
	}
	if (exp == 31)
		bits = sign | 0x7f800000u | (man << 13); /* inf, nan (payload kept) */
	else
		bits = sign | ((exp + 112) << 23) | (man << 13); /* rebias 15 -> 127 */
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

int st_safetensors_read_f32(const st_safetensors *f, const char *name, float *dst, int64_t n)
{
	const st_safetensors_info *t = st_safetensors_find(f, name);
	if (!t)
		return st_fail(ST_EINVAL, "%s: no tensor named \"%s\"", f->path, name);
	if (t->numel != n) {
		char sbuf[256];
		return st_fail(ST_EINVAL, "%s: tensor \"%s\" has shape %s (%lld elements), expected %lld elements",
			       f->path, name, shape_str(sbuf, sizeof(sbuf), t->ndim, t->shape),
			       (long long)t->numel, (long long)n);
	}
	const unsigned char *src = t->data;
	switch (t->dtype) {
	case ST_DTYPE_F32:
		if (n)
			memcpy(dst, src, t->nbytes);
		return 0;
	case ST_DTYPE_BF16:
		for (int64_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, src + 2 * i, 2);
			uint32_t bits = (uint32_t)h << 16;
			memcpy(&dst[i], &bits, 4);
		}
		return 0;
	case ST_DTYPE_F16:
		for (int64_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, src + 2 * i, 2);
			dst[i] = half_to_float(h);
		}
		return 0;
	case ST_DTYPE_F64:
		for (int64_t i = 0; i < n; i++) {
			double d;
			memcpy(&d, src + 8 * i, 8);
			dst[i] = (float)d;
		}
		return 0;
	default:
		return st_fail(ST_EINVAL, "%s: tensor \"%s\" has dtype %s, which is not floating point",
			       f->path, name, st_dtype_name(t->dtype));
	}
}
