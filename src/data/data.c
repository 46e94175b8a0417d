#include "data/data.h"

#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "data/tokfile.h"

/* Longest sample accepted (T+1 tokens); far beyond any model's context. */
#define MAX_SEQ ((int64_t)1 << 30)

struct st_dataset {
	enum st_dataset_type type;
	int64_t seq;      /* tokens per sample: max_target_length + 1 */
	int64_t vocab;
	uint64_t seed;    /* data_shuffle_seed */
	int shuffle;
	uint64_t synthetic_stream; /* ST_DATA_SYNTHETIC_STREAM, or _EVAL_STREAM for the eval data */
	int64_t nsamples; /* per epoch */

	/* tokens */
	st_tokfile *files;
	int nfiles;
	int64_t *file_end; /* cumulative sample count through file f (exclusive end) */
	int64_t *perm;     /* shuffle: permutation of epoch perm_epoch, or perm_epoch < 0 */
	int64_t perm_epoch;
};

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Expand the pattern of key (dataset_path, grain_eval_files) into a
 * byte-order sorted list (locale-independent). */
static int expand_paths(const char *key, const char *pattern, char ***out, int *count)
{
	glob_t g;
	memset(&g, 0, sizeof(g));
	int grc = glob(pattern, 0, NULL, &g);
	if (grc == GLOB_NOMATCH) {
		globfree(&g);
		return st_fail(ST_EINVAL, "%s '%s' matches no file", key, pattern);
	}
	if (grc == GLOB_NOSPACE) {
		globfree(&g);
		return st_fail(ST_ENOMEM, "%s '%s': out of memory expanding the glob", key, pattern);
	}
	if (grc != 0 || g.gl_pathc == 0) {
		globfree(&g);
		return st_fail(ST_EINVAL, "%s '%s': cannot expand the glob (read error)", key, pattern);
	}
	if (g.gl_pathc > INT32_MAX) {
		globfree(&g);
		return st_fail(ST_EINVAL, "%s '%s' matches too many files", key, pattern);
	}
	char **paths = calloc(g.gl_pathc, sizeof(*paths));
	if (!paths) {
		globfree(&g);
		return st_fail(ST_ENOMEM, "%s '%s': out of memory", key, pattern);
	}
	for (size_t i = 0; i < g.gl_pathc; i++) {
		paths[i] = strdup(g.gl_pathv[i]);
		if (!paths[i]) {
			for (size_t j = 0; j < i; j++)
				free(paths[j]);
			free(paths);
			globfree(&g);
			return st_fail(ST_ENOMEM, "%s '%s': out of memory", key, pattern);
		}
	}
	int n = (int)g.gl_pathc;
	globfree(&g);
	qsort(paths, (size_t)n, sizeof(*paths), cmp_str);
	*out = paths;
	*count = n;
	return 0;
}

static int open_tokens(st_dataset *ds, const char *key, const char *path)
{
	char **paths = NULL;
	int npaths = 0, rc;

	if (!path[0])
		return st_fail(ST_EINVAL, "%s is empty (dataset_type=tokens needs a file or a glob)", key);
	rc = expand_paths(key, path, &paths, &npaths);
	if (rc < 0)
		return rc;
	ds->files = calloc((size_t)npaths, sizeof(*ds->files));
	ds->file_end = calloc((size_t)npaths, sizeof(*ds->file_end));
	if (!ds->files || !ds->file_end) {
		rc = st_fail(ST_ENOMEM, "%s '%s': out of memory", key, path);
		goto out;
	}

	int64_t total = 0, total_tokens = 0;
	for (int i = 0; i < npaths; i++) {
		st_tokfile *f = &ds->files[i];
		rc = st_tokfile_open(f, paths[i]);
		if (rc < 0)
			goto out;
		ds->nfiles = i + 1;
		int64_t n;
		if (f->ndim == 2) {
			if (f->cols != ds->seq) {
				rc = st_fail(ST_EINVAL, "%s: 2-D array has rows of %" PRId64 " tokens; expected "
					     "max_target_length+1 = %" PRId64, f->path, f->cols, ds->seq);
				goto out;
			}
			n = f->rows;
		} else {
			n = f->ntokens / ds->seq;
		}
		rc = st_tokfile_check_ids(f, ds->vocab);
		if (rc < 0)
			goto out;
		total += n; /* each term is bounded by its file size: no overflow */
		total_tokens += f->ntokens;
		ds->file_end[i] = total;
	}
	if (total == 0) {
		rc = st_fail(ST_EINVAL, "%s '%s': no full sample of max_target_length+1 = %" PRId64
			     " tokens (%" PRId64 " tokens in %d file%s)", key, path, ds->seq,
			     total_tokens, npaths, npaths == 1 ? "" : "s");
		goto out;
	}
	ds->nsamples = total;
	if (ds->shuffle) {
		if ((uint64_t)total > SIZE_MAX / sizeof(*ds->perm) ||
		    !(ds->perm = malloc((size_t)total * sizeof(*ds->perm)))) {
			rc = st_fail(ST_ENOMEM, "%s '%s': out of memory for the shuffle of %" PRId64
				     " samples", key, path, total);
			goto out;
		}
	}
	rc = 0;
out:
	for (int i = 0; i < npaths; i++)
		free(paths[i]);
	free(paths);
	return rc;
}

/* The training data, or the eval data (eval: grain_eval_files, never
 * shuffled, synthetic rows from a stream of their own). */
static int open_split(st_dataset **out, const st_config *c, int64_t global_batch_rows, int eval)
{
	*out = NULL;
	if (c->max_target_length < 1 || c->max_target_length >= MAX_SEQ)
		return st_fail(ST_EINVAL, "max_target_length must be in [1, %" PRId64 "), got %" PRId64,
			       MAX_SEQ - 1, c->max_target_length);
	/* ids are handed out as int32 */
	if (c->vocab_size < 1 || c->vocab_size > (int64_t)INT32_MAX + 1)
		return st_fail(ST_EINVAL, "vocab_size must be in [1, 2^31], got %" PRId64, c->vocab_size);

	st_dataset *ds = calloc(1, sizeof(*ds));
	if (!ds)
		return st_fail(ST_ENOMEM, "data: out of memory");
	ds->type = c->dataset_type;
	ds->seq = c->max_target_length + 1;
	ds->vocab = c->vocab_size;
	ds->seed = (uint64_t)c->data_shuffle_seed;
	ds->shuffle = !eval && c->enable_data_shuffling;
	ds->synthetic_stream = eval ? ST_DATA_SYNTHETIC_EVAL_STREAM : ST_DATA_SYNTHETIC_STREAM;
	ds->perm_epoch = -1;

	int rc;
	switch (c->dataset_type) {
	case ST_DATA_SYNTHETIC:
		if (global_batch_rows < 1) {
			rc = st_fail(ST_EINVAL, "dataset_type=synthetic needs a global batch of at least one row, got %" PRId64,
				     global_batch_rows);
			break;
		}
		ds->nsamples = global_batch_rows;
		rc = 0;
		break;
	case ST_DATA_TOKENS:
		rc = eval ? open_tokens(ds, "grain_eval_files", c->grain_eval_files)
			  : open_tokens(ds, "dataset_path", c->dataset_path);
		break;
	default:
		rc = st_fail(ST_EINVAL, "unknown dataset_type %d", (int)c->dataset_type);
		break;
	}
	if (rc < 0) {
		st_dataset_free(ds);
		return rc;
	}
	*out = ds;
	return 0;
}

/* A pattern of key names at least one file (its files are not opened). */
static int check_pattern(const char *key, const char *pattern)
{
	char **paths = NULL;
	int n = 0;
	if (!pattern[0])
		return st_fail(ST_EINVAL, "%s is empty (dataset_type=tokens needs a file or a glob)", key);
	int rc = expand_paths(key, pattern, &paths, &n);
	for (int i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	return rc;
}

int st_dataset_check_paths(const st_config *c, const char **key)
{
	int rc = 0;
	*key = NULL;
	if (c->dataset_type != ST_DATA_TOKENS)
		return 0;
	if ((rc = check_pattern("dataset_path", c->dataset_path)) < 0)
		*key = "dataset_path";
	else if (c->eval_interval > 0 && (rc = check_pattern("grain_eval_files", c->grain_eval_files)) < 0)
		*key = "grain_eval_files";
	return rc;
}

int st_dataset_open(st_dataset **out, const st_config *c, int64_t global_batch_rows)
{
	return open_split(out, c, global_batch_rows, 0);
}

int st_dataset_open_eval(st_dataset **out, const st_config *c, int64_t global_batch_rows)
{
	return open_split(out, c, global_batch_rows, 1);
}

int64_t st_dataset_num_samples(const st_dataset *ds) { return ds->nsamples; }

/* Fisher-Yates, from the last position down; every swap is a pure function of
 * (seed, epoch, position), so any process rebuilds the same order. */
static void build_perm(st_dataset *ds, int64_t epoch)
{
	int64_t n = ds->nsamples;
	int64_t *p = ds->perm;
	uint64_t stream = ST_DATA_SHUFFLE_STREAM + (uint64_t)epoch;
	for (int64_t k = 0; k < n; k++)
		p[k] = k;
	for (int64_t k = n - 1; k > 0; k--) {
		int64_t j = (int64_t)st_rng_below(ds->seed, stream, (uint64_t)k, (uint64_t)k + 1);
		int64_t t = p[k];
		p[k] = p[j];
		p[j] = t;
	}
	ds->perm_epoch = epoch;
}

static int64_t sample_of(st_dataset *ds, int64_t i)
{
	int64_t n = ds->nsamples;
	if (ds->type == ST_DATA_SYNTHETIC || !ds->shuffle)
		return i % n;
	int64_t epoch = i / n;
	if (epoch != ds->perm_epoch)
		build_perm(ds, epoch);
	return ds->perm[i % n];
}

int st_dataset_locate(st_dataset *ds, int64_t i, int64_t *sample)
{
	if (i < 0)
		return st_fail(ST_EINVAL, "data: negative sample index %" PRId64, i);
	*sample = sample_of(ds, i);
	return 0;
}

static void read_token_sample(const st_dataset *ds, int64_t s, int32_t *out)
{
	/* first file whose end lies beyond s; files with no samples have end == start */
	int lo = 0, hi = ds->nfiles - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (ds->file_end[mid] > s)
			hi = mid;
		else
			lo = mid + 1;
	}
	int64_t local = s - (lo > 0 ? ds->file_end[lo - 1] : 0);
	st_tokfile_get(&ds->files[lo], local * ds->seq, ds->seq, out);
}

static void synth_sample(const st_dataset *ds, int64_t row, int32_t *out)
{
	uint64_t base = (uint64_t)row * (uint64_t)ds->seq;
	for (int64_t t = 0; t < ds->seq; t++)
		out[t] = (int32_t)st_rng_below(ds->seed, ds->synthetic_stream, base + (uint64_t)t,
					       (uint64_t)ds->vocab);
}

int st_dataset_read(st_dataset *ds, int64_t first, int64_t nrows, int32_t *tokens)
{
	if (first < 0)
		return st_fail(ST_EINVAL, "data: negative sample index %" PRId64, first);
	if (nrows < 0)
		return st_fail(ST_EINVAL, "data: negative row count %" PRId64, nrows);
	if (nrows > INT64_MAX - first)
		return st_fail(ST_EINVAL, "data: sample index %" PRId64 " + %" PRId64 " overflows", first, nrows);
	if (nrows > 0 && !tokens)
		return st_fail(ST_EINVAL, "data: no output buffer");
	for (int64_t r = 0; r < nrows; r++) {
		int32_t *out = tokens + r * ds->seq;
		int64_t s = sample_of(ds, first + r);
		if (ds->type == ST_DATA_SYNTHETIC)
			synth_sample(ds, s, out);
		else
			read_token_sample(ds, s, out);
	}
	return 0;
}

void st_dataset_summary(const st_dataset *ds, char *buf, size_t len)
{
	if (!len)
		return;
	if (ds->type == ST_DATA_SYNTHETIC) {
		snprintf(buf, len, "synthetic: one fixed batch of %" PRId64 " samples x %" PRId64
			 " tokens (seed %" PRIu64 ")", ds->nsamples, ds->seq, ds->seed);
		return;
	}
	int64_t tokens = 0;
	for (int i = 0; i < ds->nfiles; i++)
		tokens += ds->files[i].ntokens;
	char order[64];
	if (ds->shuffle)
		snprintf(order, sizeof(order), "shuffled per epoch (seed %" PRIu64 ")", ds->seed);
	else
		snprintf(order, sizeof(order), "in file order");
	snprintf(buf, len, "tokens: %d file%s, %" PRId64 " tokens, %" PRId64 " samples x %" PRId64
		 " tokens per epoch, %s", ds->nfiles, ds->nfiles == 1 ? "" : "s", tokens, ds->nsamples,
		 ds->seq, order);
}

void st_dataset_free(st_dataset *ds)
{
	if (!ds)
		return;
	for (int i = 0; i < ds->nfiles; i++)
		st_tokfile_release(&ds->files[i]);
	free(ds->files);
	free(ds->file_end);
	free(ds->perm);
	free(ds);
}
