/*
 * manifest.c - the checkpoint manifest and the per-process done records:
 * one JSON schema for both (docs/checkpoints.md), parsed with every field
 * checked, since a manifest is outside input like any other file.
 */
#include "ckpt/ckpt_int.h"

#include "base/array.h"
#include "base/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- the model */

void ck_manifest_free(struct ck_manifest *m)
{
	for (int i = 0; i < m->nfiles; i++)
		free(m->files[i].name);
	for (int i = 0; i < m->ntensors; i++) {
		struct ck_tensor *t = &m->tensors[i];
		for (int j = 0; j < t->npieces; j++)
			free(t->pieces[j].key);
		free(t->pieces);
		free(t->name);
	}
	free(m->files);
	free(m->tensors);
	free(m->config_json);
	memset(m, 0, sizeof(*m));
}

struct ck_tensor *ck_manifest_find(const struct ck_manifest *m, const char *name)
{
	for (int i = 0; i < m->ntensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

int ck_manifest_add_file(struct ck_manifest *m, const char *name, int process, int64_t bytes)
{
	int rc;
	if ((rc = st_array_reserve(&m->files, &m->cap_files, (size_t)m->nfiles, sizeof(*m->files), 8)) < 0)
		return rc;
	struct ck_file *f = &m->files[m->nfiles];
	if (!(f->name = strdup(name)))
		return st_fail(ST_ENOMEM, "out of memory");
	f->process = process;
	f->bytes = bytes;
	return m->nfiles++;
}

int ck_manifest_add_tensor(struct ck_manifest *m, const char *name, int ndim, const int64_t *shape)
{
	int rc;
	if ((rc = st_array_reserve(&m->tensors, &m->cap_tensors, (size_t)m->ntensors, sizeof(*m->tensors), 8)) < 0)
		return rc;
	struct ck_tensor *t = &m->tensors[m->ntensors];
	memset(t, 0, sizeof(*t));
	if (!(t->name = strdup(name)))
		return st_fail(ST_ENOMEM, "out of memory");
	t->ndim = ndim;
	t->shape[0] = shape[0];
	t->shape[1] = ndim == 2 ? shape[1] : 0;
	return m->ntensors++;
}

int ck_tensor_add_piece(struct ck_tensor *t, const struct ck_piece *p)
{
	int rc;
	if ((rc = st_array_reserve(&t->pieces, &t->cap, (size_t)t->npieces, sizeof(*t->pieces), 8)) < 0)
		return rc;
	t->pieces[t->npieces] = *p;
	if (!(t->pieces[t->npieces].key = strdup(p->key)))
		return st_fail(ST_ENOMEM, "out of memory");
	t->npieces++;
	return 0;
}

/* ------------------------------------------------------------------ boxes */

int64_t ck_box_numel(const struct ck_box *b)
{
	return b->ndim == 2 ? b->shape[0] * b->shape[1] : b->shape[0];
}

int ck_box_intersect(const struct ck_box *a, const struct ck_box *b, struct ck_box *out)
{
	out->ndim = a->ndim;
	out->offset[1] = out->shape[1] = 0;
	for (int d = 0; d < a->ndim; d++) {
		int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
		int64_t ha = a->offset[d] + a->shape[d], hb = b->offset[d] + b->shape[d];
		int64_t hi = ha < hb ? ha : hb;
		if (hi <= lo)
			return 0;
		out->offset[d] = lo;
		out->shape[d] = hi - lo;
	}
	return 1;
}

const char *ck_box_str(const struct ck_box *b, char *buf, size_t cap)
{
	if (b->ndim == 2)
		snprintf(buf, cap, "[%" PRId64 ":%" PRId64 ",%" PRId64 ":%" PRId64 "]", b->offset[0],
			 b->offset[0] + b->shape[0], b->offset[1], b->offset[1] + b->shape[1]);
	else
		snprintf(buf, cap, "[%" PRId64 ":%" PRId64 "]", b->offset[0], b->offset[0] + b->shape[0]);
	return buf;
}

struct ck_box ck_piece_box(const st_ckpt_piece *p)
{
	struct ck_box b = {.ndim = p->ndim};
	for (int d = 0; d < p->ndim && d < 2; d++) {
		b.offset[d] = p->offset[d];
		b.shape[d] = p->shape[d];
	}
	return b;
}

int64_t ck_piece_numel(const st_ckpt_piece *p)
{
	return p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
}

/* Up to 2^62 elements in a tensor, so byte sizes never overflow. */
#define MAX_NUMEL (INT64_C(1) << 60)

static int shape_ok(int ndim, const int64_t *shape)
{
	if (ndim < 1 || ndim > 2)
		return 0;
	int64_t n = 1;
	for (int d = 0; d < ndim; d++)
		if (shape[d] < 1 || __builtin_mul_overflow(n, shape[d], &n) || n > MAX_NUMEL)
			return 0;
	return 1;
}

int ck_check_piece(const st_ckpt_piece *p, const char *what)
{
	if (!p->name || !p->name[0])
		return st_fail(ST_EINVAL, "%s: a piece has no tensor name", what);
	if (p->ndim < 1 || p->ndim > 2)
		return st_fail(ST_EINVAL, "%s: tensor %s: ndim %d (1 or 2 supported)", what, p->name, p->ndim);
	if (!shape_ok(p->ndim, p->global_shape) || !shape_ok(p->ndim, p->shape))
		return st_fail(ST_EINVAL, "%s: tensor %s: shapes must be positive", what, p->name);
	for (int d = 0; d < p->ndim; d++)
		if (p->offset[d] < 0 || p->offset[d] > p->global_shape[d] - p->shape[d])
			return st_fail(ST_EINVAL, "%s: tensor %s: piece at offset %" PRId64 " with extent %" PRId64
				       " lies outside dimension %d of size %" PRId64, what, p->name, p->offset[d],
				       p->shape[d], d, p->global_shape[d]);
	if (!p->data)
		return st_fail(ST_EINVAL, "%s: tensor %s: piece has no data", what, p->name);
	return 0;
}

int ck_manifest_check_tiling(const struct ck_manifest *m, const char *where)
{
	char b1[96], b2[96];
	for (int i = 0; i < m->ntensors; i++) {
		const struct ck_tensor *t = &m->tensors[i];
		struct ck_box whole = {.ndim = t->ndim, .shape = {t->shape[0], t->shape[1]}}, x;
		int64_t sum = 0;
		/* Quadratic in the pieces of one tensor: fine for the process counts we run. */
		for (int a = 0; a < t->npieces; a++) {
			sum += ck_box_numel(&t->pieces[a].box);
			for (int b = a + 1; b < t->npieces; b++)
				if (ck_box_intersect(&t->pieces[a].box, &t->pieces[b].box, &x))
					return st_fail(ST_EINVAL, "%s: tensor %s: pieces %s and %s overlap", where,
						       t->name, ck_box_str(&t->pieces[a].box, b1, sizeof(b1)),
						       ck_box_str(&t->pieces[b].box, b2, sizeof(b2)));
		}
		if (sum != ck_box_numel(&whole))
			return st_fail(ST_EINVAL, "%s: tensor %s: pieces cover %" PRId64 " of %" PRId64
				       " elements (a process's pieces are missing)", where, t->name, sum,
				       ck_box_numel(&whole));
	}
	return 0;
}

int ck_manifest_merge(struct ck_manifest *m, const struct ck_manifest *done, const char *where)
{
	int rc;
	for (int f = 0; f < done->nfiles; f++)
		for (int g = 0; g < m->nfiles; g++)
			if (strcmp(done->files[f].name, m->files[g].name) == 0)
				return st_fail(ST_EINVAL, "%s: file %s is listed twice", where, done->files[f].name);
	int base = m->nfiles;
	for (int f = 0; f < done->nfiles; f++)
		if ((rc = ck_manifest_add_file(m, done->files[f].name, done->files[f].process, done->files[f].bytes)) < 0)
			return rc;
	for (int i = 0; i < done->ntensors; i++) {
		const struct ck_tensor *dt = &done->tensors[i];
		struct ck_tensor *t = ck_manifest_find(m, dt->name);
		if (!t) {
			if ((rc = ck_manifest_add_tensor(m, dt->name, dt->ndim, dt->shape)) < 0)
				return rc;
			t = &m->tensors[rc];
		} else if (t->ndim != dt->ndim || t->shape[0] != dt->shape[0] || t->shape[1] != dt->shape[1]) {
			return st_fail(ST_EINVAL, "%s: tensor %s has shape [%" PRId64 ", %" PRId64 "] here and [%" PRId64
				       ", %" PRId64 "] in another process's record", where, dt->name, dt->shape[0],
				       dt->shape[1], t->shape[0], t->shape[1]);
		}
		for (int j = 0; j < dt->npieces; j++) {
			struct ck_piece p = dt->pieces[j];
			p.file += base;
			if ((rc = ck_tensor_add_piece(t, &p)) < 0)
				return rc;
		}
	}
	return 0;
}

/* ---------------------------------------------------------------- parsing */

struct pctx {
	const char *where;
	char ctx[256]; /* "tensor X piece 3" */
};

static int bad(const struct pctx *c, const char *fmt, const char *key)
{
	char msg[256];
	snprintf(msg, sizeof(msg), fmt, key);
	if (c->ctx[0])
		return st_fail(ST_EINVAL, "%s: %s: %s", c->where, c->ctx, msg);
	return st_fail(ST_EINVAL, "%s: %s", c->where, msg);
}

static int get_int(const struct pctx *c, json_t *o, const char *key, int64_t lo, int64_t *v)
{
	json_t *x = json_object_get(o, key);
	if (!x)
		return bad(c, "missing field \"%s\"", key);
	if (!json_is_integer(x))
		return bad(c, "field \"%s\" is not an integer", key);
	*v = json_integer_value(x);
	if (*v < lo)
		return bad(c, "field \"%s\" is out of range", key);
	return 0;
}

static int get_str(const struct pctx *c, json_t *o, const char *key, const char **v)
{
	json_t *x = json_object_get(o, key);
	if (!x)
		return bad(c, "missing field \"%s\"", key);
	if (!json_is_string(x))
		return bad(c, "field \"%s\" is not a string", key);
	*v = json_string_value(x);
	return 0;
}

static int get_dims(const struct pctx *c, json_t *o, const char *key, int ndim, int64_t *v)
{
	json_t *x = json_object_get(o, key);
	if (!x)
		return bad(c, "missing field \"%s\"", key);
	if (!json_is_array(x) || (ndim > 0 && (int)json_array_size(x) != ndim) || json_array_size(x) < 1 ||
	    json_array_size(x) > 2)
		return bad(c, "field \"%s\" is not a list of the tensor's dimensions", key);
	for (size_t d = 0; d < json_array_size(x); d++) {
		json_t *e = json_array_get(x, d);
		if (!json_is_integer(e) || json_integer_value(e) < 0)
			return bad(c, "field \"%s\" holds a value that is not a non-negative integer", key);
		v[d] = json_integer_value(e);
	}
	return (int)json_array_size(x);
}

static int safe_file_name(const char *s)
{
	return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 200;
}

static int parse_files(struct ck_manifest *m, struct pctx *c, json_t *files)
{
	int rc;
	if (!json_is_array(files) || json_array_size(files) == 0)
		return bad(c, "field \"%s\" is not a non-empty list", "files");
	for (size_t i = 0; i < json_array_size(files); i++) {
		json_t *f = json_array_get(files, i);
		const char *name;
		int64_t process, bytes;
		snprintf(c->ctx, sizeof(c->ctx), "files[%zu]", i);
		if (!json_is_object(f))
			return bad(c, "%s is not an object", "entry");
		if ((rc = get_str(c, f, "name", &name)) < 0 || (rc = get_int(c, f, "process", 0, &process)) < 0 ||
		    (rc = get_int(c, f, "bytes", 0, &bytes)) < 0)
			return rc;
		if (!safe_file_name(name))
			return bad(c, "file name \"%s\" is not a plain file name", name);
		if (process >= m->process_count)
			return bad(c, "field \"%s\" is not below process_count", "process");
		for (int j = 0; j < m->nfiles; j++)
			if (strcmp(m->files[j].name, name) == 0)
				return bad(c, "file \"%s\" is listed twice", name);
		if ((rc = ck_manifest_add_file(m, name, (int)process, bytes)) < 0)
			return rc;
	}
	c->ctx[0] = '\0';
	return 0;
}

static int parse_piece(struct ck_manifest *m, struct ck_tensor *t, struct pctx *c, json_t *p)
{
	struct ck_piece pc = {0};
	const char *file, *key;
	int64_t v, n;
	int rc;

	if (!json_is_object(p))
		return bad(c, "%s is not an object", "piece");
	if ((rc = get_str(c, p, "file", &file)) < 0 || (rc = get_str(c, p, "key", &key)) < 0)
		return rc;
	pc.file = -1;
	for (int i = 0; i < m->nfiles; i++)
		if (strcmp(m->files[i].name, file) == 0)
			pc.file = i;
	if (pc.file < 0)
		return bad(c, "unknown file \"%s\" (not in \"files\")", file);
	pc.box.ndim = t->ndim;
	if ((rc = get_dims(c, p, "offset", t->ndim, pc.box.offset)) < 0 ||
	    (rc = get_dims(c, p, "shape", t->ndim, pc.box.shape)) < 0)
		return rc;
	for (int d = 0; d < t->ndim; d++) {
		if (pc.box.shape[d] < 1 || pc.box.offset[d] > t->shape[d] - pc.box.shape[d]) {
			char bs[96];
			return bad(c, "box %s is out of range of the tensor", ck_box_str(&pc.box, bs, sizeof(bs)));
		}
	}
	n = ck_box_numel(&pc.box);
	if ((rc = get_int(c, p, "data_offset", 0, &v)) < 0)
		return rc;
	pc.data_offset = (uint64_t)v;
	if ((rc = get_int(c, p, "nbytes", 0, &v)) < 0)
		return rc;
	pc.nbytes = (uint64_t)v;
	if (pc.nbytes != (uint64_t)n * 4)
		return bad(c, "field \"%s\" does not match the box (4 bytes per F32 element)", "nbytes");
	if ((uint64_t)m->files[pc.file].bytes < pc.nbytes ||
	    pc.data_offset > (uint64_t)m->files[pc.file].bytes - pc.nbytes)
		return bad(c, "data lies beyond the end of file \"%s\"", file);
	if ((rc = get_int(c, p, "crc32", 0, &v)) < 0)
		return rc;
	if (v > UINT32_MAX)
		return bad(c, "field \"%s\" is out of range", "crc32");
	pc.crc = (uint32_t)v;
	pc.key = (char *)key;
	return ck_tensor_add_piece(t, &pc);
}

static int parse_tensors(struct ck_manifest *m, struct pctx *c, json_t *tensors)
{
	int rc;
	if (!json_is_array(tensors))
		return bad(c, "field \"%s\" is not a list", "tensors");
	for (size_t i = 0; i < json_array_size(tensors); i++) {
		json_t *t = json_array_get(tensors, i), *pieces;
		const char *name, *dtype;
		int64_t shape[2] = {0, 0};
		int ndim;
		snprintf(c->ctx, sizeof(c->ctx), "tensors[%zu]", i);
		if (!json_is_object(t))
			return bad(c, "%s is not an object", "entry");
		if ((rc = get_str(c, t, "name", &name)) < 0)
			return rc;
		snprintf(c->ctx, sizeof(c->ctx), "tensor %.200s", name);
		if (ck_manifest_find(m, name))
			return bad(c, "%s: listed twice", "tensor");
		if ((rc = get_str(c, t, "dtype", &dtype)) < 0)
			return rc;
		if (strcmp(dtype, "F32") != 0)
			return bad(c, "dtype \"%s\" is not supported (F32 only)", dtype);
		if ((ndim = get_dims(c, t, "shape", 0, shape)) < 0)
			return ndim;
		if (!shape_ok(ndim, shape))
			return bad(c, "%s is not positive or too large", "shape");
		pieces = json_object_get(t, "pieces");
		if (!json_is_array(pieces) || json_array_size(pieces) == 0)
			return bad(c, "field \"%s\" is missing or not a non-empty list", "pieces");
		if ((rc = ck_manifest_add_tensor(m, name, ndim, shape)) < 0)
			return rc;
		struct ck_tensor *ct = &m->tensors[rc];
		for (size_t j = 0; j < json_array_size(pieces); j++) {
			snprintf(c->ctx, sizeof(c->ctx), "tensor %.200s piece %zu", name, j);
			if ((rc = parse_piece(m, ct, c, json_array_get(pieces, j))) < 0)
				return rc;
		}
	}
	c->ctx[0] = '\0';
	return 0;
}

static int parse_root(struct ck_manifest *m, struct pctx *c, json_t *root, int want_done, int64_t expect_step)
{
	const char *format, *s;
	int64_t v;
	int rc;

	if (!json_is_object(root))
		return bad(c, "%s", "not a JSON object");
	if ((rc = get_str(c, root, "format", &format)) < 0)
		return rc;
	if (strcmp(format, want_done ? CK_DONE_FORMAT : CK_FORMAT) != 0)
		return bad(c, "format \"%s\" is not a slicetrain checkpoint file of this kind", format);
	if ((rc = get_int(c, root, "version", 0, &v)) < 0)
		return rc;
	if (v != CK_VERSION)
		return bad(c, "unsupported version (this build reads version 1%s)", "");
	if ((rc = get_int(c, root, "step", 0, &m->step)) < 0)
		return rc;
	if (expect_step >= 0 && m->step != expect_step)
		return bad(c, "%s does not match the directory name", "step");
	if ((rc = get_int(c, root, "process_count", 1, &v)) < 0)
		return rc;
	if (v > 1 << 24)
		return bad(c, "field \"%s\" is out of range", "process_count");
	m->process_count = (int)v;
	if ((rc = get_str(c, root, "save_id", &s)) < 0)
		return rc;
	char *end;
	errno = 0;
	m->save_id = strtoull(s, &end, 10);
	if (!s[0] || *end || errno)
		return bad(c, "field \"%s\" is not a decimal number", "save_id");
	m->generation = -1; /* optional: saved without an elastic generation */
	if (json_object_get(root, "generation") && (rc = get_int(c, root, "generation", 0, &m->generation)) < 0)
		return rc;
	if (want_done) {
		m->is_done = 1;
		if ((rc = get_int(c, root, "process", 0, &v)) < 0)
			return rc;
		if (v >= m->process_count)
			return bad(c, "field \"%s\" is not below process_count", "process");
		m->process = (int)v;
	} else {
		json_t *cfg = json_object_get(root, "config"), *t;
		if ((rc = get_int(c, root, "next_sample", 0, &m->next_sample)) < 0 ||
		    (rc = get_int(c, root, "data_shuffle_seed", INT64_MIN, &m->data_shuffle_seed)) < 0 ||
		    (rc = get_int(c, root, "init_weights_seed", INT64_MIN, &m->init_weights_seed)) < 0 ||
		    (rc = get_int(c, root, "global_batch", 0, &m->global_batch)) < 0 ||
		    (rc = get_str(c, root, "mesh", &s)) < 0)
			return rc;
		if (strlen(s) >= sizeof(m->mesh))
			return bad(c, "field \"%s\" is too long", "mesh");
		memcpy(m->mesh, s, strlen(s) + 1);
		if ((rc = get_str(c, root, "checksum", &s)) < 0)
			return rc;
		if (strcmp(s, CK_CHECKSUM) != 0)
			return bad(c, "checksum \"%s\" is not supported", s);
		t = json_object_get(root, "time_unix");
		if (!json_is_number(t))
			return bad(c, "field \"%s\" is missing or not a number", "time_unix");
		m->time_unix = json_number_value(t);
		if (!json_is_object(cfg))
			return bad(c, "field \"%s\" is missing or not an object", "config");
		if (!(m->config_json = json_dumps(cfg, JSON_COMPACT)))
			return st_fail(ST_ENOMEM, "out of memory");
	}
	if ((rc = parse_files(m, c, json_object_get(root, "files"))) < 0)
		return rc;
	if (want_done && (m->nfiles != 1 || m->files[0].process != m->process))
		return bad(c, "a done record lists exactly its own %s", "file");
	if ((rc = parse_tensors(m, c, json_object_get(root, "tensors"))) < 0)
		return rc;
	if (!want_done && (rc = ck_manifest_check_tiling(m, c->where)) < 0)
		return rc;
	return 0;
}

int ck_manifest_parse(struct ck_manifest *m, const char *where, const char *text, int want_done,
		      int64_t expect_step)
{
	struct pctx c = {.where = where};
	json_error_t err;
	json_t *root;
	int rc;

	memset(m, 0, sizeof(*m));
	if (!(root = json_loads(text, JSON_REJECT_DUPLICATES, &err)))
		return st_fail(ST_EINVAL, "%s: bad JSON: %s (line %d)", where, err.text, err.line);
	rc = parse_root(m, &c, root, want_done, expect_step);
	json_decref(root);
	if (rc < 0)
		ck_manifest_free(m);
	return rc;
}

int ck_manifest_load(struct ck_manifest *m, const char *step_dir, int64_t expect_step)
{
	char path[ST_PATH_MAX];
	char *text;
	size_t len;
	int rc;

	memset(m, 0, sizeof(*m));
	if ((rc = st_path_join(path, sizeof(path), step_dir, CK_MANIFEST)) < 0)
		return rc;
	if ((rc = st_read_file(path, 1u << 30, &text, &len)) < 0)
		return rc;
	rc = ck_manifest_parse(m, path, text, 0, expect_step);
	free(text);
	return rc;
}

/* ------------------------------------------------------------ serializing */

static json_t *dims(int ndim, const int64_t *v)
{
	json_t *a = json_array();
	for (int d = 0; a && d < ndim; d++)
		if (json_array_append_new(a, json_integer(v[d])) < 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

int ck_manifest_dump(const struct ck_manifest *m, char **out)
{
	char id[32], when[64];
	json_t *root = NULL, *files, *tensors, *cfg = NULL;
	json_error_t err;
	time_t secs = (time_t)m->time_unix;
	struct tm tm;

	*out = NULL;
	snprintf(id, sizeof(id), "%" PRIu64, m->save_id);
	root = json_pack("{s:s, s:i, s:I, s:I, s:s}", "format", m->is_done ? CK_DONE_FORMAT : CK_FORMAT, "version",
			 CK_VERSION, "step", (json_int_t)m->step, "process_count", (json_int_t)m->process_count,
			 "save_id", id);
	if (!root)
		goto nomem;
	if (m->generation >= 0 && json_object_set_new(root, "generation", json_integer(m->generation)) < 0)
		goto nomem;
	if (m->is_done) {
		if (json_object_set_new(root, "process", json_integer(m->process)) < 0)
			goto nomem;
	} else {
		gmtime_r(&secs, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
		if (!(cfg = json_loads(m->config_json ? m->config_json : "{}", 0, &err)) || !json_is_object(cfg)) {
			json_decref(root);
			json_decref(cfg);
			return st_fail(ST_EINVAL, "checkpoint step %" PRId64 ": the config is not a JSON object", m->step);
		}
		json_t *meta = json_pack("{s:I, s:I, s:I, s:I, s:s, s:f, s:s, s:s}", "next_sample",
					 (json_int_t)m->next_sample, "data_shuffle_seed", (json_int_t)m->data_shuffle_seed,
					 "init_weights_seed", (json_int_t)m->init_weights_seed, "global_batch",
					 (json_int_t)m->global_batch, "mesh", m->mesh, "time_unix", m->time_unix, "time",
					 when, "checksum", CK_CHECKSUM);
		int bad_meta = !meta || json_object_update(root, meta) < 0;
		json_decref(meta);
		if (bad_meta) {
			json_decref(cfg);
			goto nomem;
		}
		if (json_object_set_new(root, "config", cfg) < 0)
			goto nomem;
	}
	files = json_array();
	if (!files || json_object_set_new(root, "files", files) < 0)
		goto nomem;
	for (int i = 0; i < m->nfiles; i++)
		if (json_array_append_new(files, json_pack("{s:s, s:i, s:I}", "name", m->files[i].name, "process",
							   m->files[i].process, "bytes",
							   (json_int_t)m->files[i].bytes)) < 0)
			goto nomem;
	tensors = json_array();
	if (!tensors || json_object_set_new(root, "tensors", tensors) < 0)
		goto nomem;
	for (int i = 0; i < m->ntensors; i++) {
		const struct ck_tensor *t = &m->tensors[i];
		json_t *pieces = json_array();
		json_t *jt = json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype", "F32", "shape",
				       dims(t->ndim, t->shape), "pieces", pieces);
		if (!jt || json_array_append_new(tensors, jt) < 0)
			goto nomem;
		for (int j = 0; j < t->npieces; j++) {
			const struct ck_piece *p = &t->pieces[j];
			json_t *jp = json_pack("{s:s, s:s, s:o, s:o, s:I, s:I, s:I}", "file", m->files[p->file].name,
					       "key", p->key, "offset", dims(t->ndim, p->box.offset), "shape",
					       dims(t->ndim, p->box.shape), "data_offset", (json_int_t)p->data_offset,
					       "nbytes", (json_int_t)p->nbytes, "crc32", (json_int_t)p->crc);
			if (!jp || json_array_append_new(pieces, jp) < 0)
				goto nomem;
		}
	}
	*out = json_dumps(root, JSON_INDENT(1));
	json_decref(root);
	return *out ? 0 : st_fail(ST_ENOMEM, "out of memory");
nomem:
	json_decref(root);
	return st_fail(ST_ENOMEM, "out of memory (or a name that is not UTF-8) writing a checkpoint manifest");
}

/* ------------------------------------------------------------ file names */

/* "g000007-" with a generation, "" without */
static void generation_tag(char *buf, size_t cap, int64_t generation)
{
	if (generation >= 0)
		snprintf(buf, cap, "g%06" PRId64 "-", generation);
	else
		buf[0] = '\0';
}

void ck_shard_name(char *buf, size_t cap, int64_t generation, int process, int count)
{
	char tag[32];
	generation_tag(tag, sizeof(tag), generation);
	snprintf(buf, cap, "shard-%s%05d-of-%05d.safetensors", tag, process, count);
}

void ck_done_name(char *buf, size_t cap, int64_t generation, int process)
{
	char tag[32];
	generation_tag(tag, sizeof(tag), generation);
	snprintf(buf, cap, "done-%s%05d.json", tag, process);
}

/* After prefix: an optional generation tag; the rest of the name from there, or NULL. */
static const char *after_tag(const char *name, const char *prefix)
{
	size_t n = strlen(prefix);
	int end = -1;
	long long g;
	if (strncmp(name, prefix, n) != 0)
		return NULL;
	name += n;
	if (name[0] != 'g')
		return name;
	return sscanf(name, "g%lld-%n", &g, &end) == 1 && end > 0 ? name + end : NULL;
}

int ck_is_shard_name(const char *name, int *count)
{
	const char *rest = after_tag(name, "shard-");
	int p, pc, end = -1;
	if (!rest || sscanf(rest, "%d-of-%d.safetensors%n", &p, &pc, &end) != 2 || end < 0 || rest[end])
		return 0;
	*count = pc;
	return 1;
}

int ck_is_done_name(const char *name)
{
	const char *rest = after_tag(name, "done-");
	int p, end = -1;
	return rest && sscanf(rest, "%d.json%n", &p, &end) == 1 && end > 0 && !rest[end];
}

/* ------------------------------------------------------------ steps, misc */

int ck_parse_step(const char *name, int64_t *step)
{
	int64_t v = 0;
	if (!name[0] || strlen(name) > 18)
		return 0;
	for (const char *p = name; *p; p++) {
		if (*p < '0' || *p > '9')
			return 0;
		v = v * 10 + (*p - '0');
	}
	*step = v;
	return 1;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

int ck_list_steps(const char *dir, int committed_only, int64_t **steps, int *n)
{
	char path[ST_PATH_MAX];
	struct dirent *d;
	int64_t *v = NULL, step;
	size_t cap = 0;
	int rc;
	DIR *dp;

	*steps = NULL;
	*n = 0;
	if (!(dp = opendir(dir))) {
		if (errno == ENOENT)
			return 0;
		return st_fail(ST_EIO, "%s: cannot list: %s", dir, strerror(errno));
	}
	while ((d = readdir(dp))) {
		struct stat st;
		if (!ck_parse_step(d->d_name, &step))
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", dir, d->d_name) >= (int)sizeof(path) || stat(path, &st) < 0 ||
		    !S_ISDIR(st.st_mode))
			continue;
		if (committed_only) {
			char mp[ST_PATH_MAX];
			if (st_path_join(mp, sizeof(mp), path, CK_MANIFEST) < 0 || !st_file_exists(mp))
				continue;
		}
		if ((rc = st_array_reserve(&v, &cap, (size_t)*n, sizeof(*v), 8)) < 0) {
			closedir(dp);
			free(v);
			*n = 0;
			return rc;
		}
		v[(*n)++] = step;
	}
	closedir(dp);
	if (*n)
		qsort(v, (size_t)*n, sizeof(*v), cmp_i64);
	*steps = v;
	return 0;
}

int ck_step_dir(char *buf, size_t cap, const char *dir, int64_t step)
{
	int n = snprintf(buf, cap, "%s/%" PRId64, dir, step);
	if (n < 0 || (size_t)n >= cap)
		return st_fail(ST_EINVAL, "path too long: %.200s...", dir);
	return 0;
}
