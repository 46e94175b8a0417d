/*
 * inspect.c - listing step directories and verifying committed checkpoints
 * (slicetrain ckpt list|verify).
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"
#include "ckpt/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void scan_dir(const char *sd, st_ckpt_step_info *s)
{
	char p[ST_PATH_MAX];
	struct dirent *d;
	struct stat st;
	DIR *dp = opendir(sd);

	if (stat(sd, &st) == 0)
		s->time_unix = (double)st.st_mtime;
	if (!dp)
		return;
	while ((d = readdir(dp))) {
		int pc;
		if (st_path_join(p, sizeof(p), sd, d->d_name) < 0 || stat(p, &st) < 0 || !S_ISREG(st.st_mode))
			continue;
		s->bytes += st.st_size;
		if (ck_is_done_name(d->d_name))
			s->ndone++;
		if (ck_is_shard_name(d->d_name, &pc)) {
			s->nshards++;
			if (!s->process_count)
				s->process_count = pc;
		}
	}
	closedir(dp);
}

int st_ckpt_list(const char *dir, st_ckpt_step_info **out, int *n)
{
	char sd[ST_PATH_MAX], mp[ST_PATH_MAX];
	int64_t *steps;
	int ns, rc;
	st_ckpt_step_info *v;

	*out = NULL;
	*n = 0;
	if ((rc = ck_list_steps(dir, 0, &steps, &ns)) < 0)
		return rc;
	if (!(v = calloc((size_t)ns + 1, sizeof(*v)))) {
		free(steps);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	for (int i = 0; i < ns; i++) {
		struct ck_manifest m;
		v[i].step = steps[i];
		if ((rc = ck_step_dir(sd, sizeof(sd), dir, steps[i])) < 0 || (rc = st_path_join(mp, sizeof(mp), sd, CK_MANIFEST)) < 0)
			break;
		scan_dir(sd, &v[i]);
		if (!st_file_exists(mp))
			continue;
		if (ck_manifest_load(&m, sd, steps[i]) < 0) {
			v[i].committed = -1;
			snprintf(v[i].mesh, sizeof(v[i].mesh), "(manifest unreadable: %.200s)", st_errmsg());
			continue;
		}
		v[i].committed = 1;
		v[i].process_count = m.process_count;
		v[i].time_unix = m.time_unix;
		memcpy(v[i].mesh, m.mesh, sizeof(v[i].mesh));
		ck_manifest_free(&m);
	}
	free(steps);
	if (rc < 0) {
		free(v);
		return rc;
	}
	*out = v;
	*n = ns;
	return 0;
}

struct problems {
	int count;
	char first[1024];
};

/* Record a problem: printed now, the first one kept for the error. */
static void problem(struct problems *pr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct problems *pr, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "slicetrain: verify: %s\n", msg);
	if (!pr->count++)
		memcpy(pr->first, msg, sizeof(msg));
}

/* Each shard's own header agrees with the manifest: keys, shapes, offsets. */
static void check_headers(const char *sd, const struct ck_manifest *m, struct problems *first)
{
	char path[ST_PATH_MAX];
	for (int f = 0; f < m->nfiles; f++) {
		st_safetensors *sf;
		uint64_t data_bytes = 0, data_start;
		struct stat st;
		if (st_path_join(path, sizeof(path), sd, m->files[f].name) < 0)
			continue;
		if (stat(path, &st) < 0) {
			problem(first, "%s: missing: %s", path, strerror(errno));
			continue;
		}
		if (st.st_size != m->files[f].bytes)
			problem(first, "%s: %lld bytes, the manifest says %" PRId64, path, (long long)st.st_size,
				m->files[f].bytes);
		if (st_safetensors_open(&sf, path) < 0) {
			problem(first, "%s", st_errmsg());
			continue;
		}
		for (int i = 0; i < st_safetensors_count(sf); i++)
			data_bytes += st_safetensors_get(sf, i)->nbytes;
		data_start = (uint64_t)st.st_size - data_bytes;
		for (int t = 0; t < m->ntensors; t++)
			for (int j = 0; j < m->tensors[t].npieces; j++) {
				const struct ck_piece *p = &m->tensors[t].pieces[j];
				const st_safetensors_info *in;
				if (p->file != f)
					continue;
				if (!(in = st_safetensors_find(sf, p->key)))
					problem(first, "%s: tensor %s (key %s) is not in the file", path, m->tensors[t].name,
						p->key);
				else if (in->dtype != ST_DTYPE_F32 || in->ndim != p->box.ndim || in->shape[0] != p->box.shape[0] ||
					 (p->box.ndim == 2 && in->shape[1] != p->box.shape[1]) ||
					 data_start + in->offset != p->data_offset)
					problem(first, "%s: tensor %s (key %s): dtype, shape or offset differ from the manifest",
						path, m->tensors[t].name, p->key);
			}
		st_safetensors_close(sf);
	}
}

int st_ckpt_verify(const char *step_dir, int64_t *pieces_checked, int64_t *bytes_checked)
{
	char mp[ST_PATH_MAX];
	struct ck_manifest m;
	struct ck_reader r;
	st_progress prog;
	int64_t total = 0;
	struct problems pr = {0}, *first = &pr;
	int rc;
	float *buf = NULL;
	size_t cap = 0;

	*pieces_checked = *bytes_checked = 0;
	if ((rc = st_path_join(mp, sizeof(mp), step_dir, CK_MANIFEST)) < 0)
		return rc;
	if (!st_file_exists(mp))
		return st_fail(ST_EINVAL, "%s is not a committed checkpoint (no %s)", step_dir, CK_MANIFEST);
	if ((rc = ck_manifest_load(&m, step_dir, -1)) < 0) {
		char msg[1024];
		snprintf(msg, sizeof(msg), "%s", st_errmsg());
		fprintf(stderr, "slicetrain: verify: %s\n", msg);
		return rc == ST_ENOMEM ? rc : st_fail(ST_EIO, "%s", msg);
	}
	check_headers(step_dir, &m, first);
	for (int t = 0; t < m.ntensors; t++)
		for (int j = 0; j < m.tensors[t].npieces; j++)
			total += (int64_t)m.tensors[t].pieces[j].nbytes;
	ck_reader_init(&r, step_dir, &m);
	st_progress_init(&prog, "verify", total);
	r.progress = &prog;
	for (int t = 0; t < m.ntensors; t++)
		for (int j = 0; j < m.tensors[t].npieces; j++) {
			const struct ck_piece *p = &m.tensors[t].pieces[j];
			if (p->nbytes > cap) {
				free(buf);
				cap = 0;
				if (!(buf = malloc(p->nbytes))) {
					rc = st_fail(ST_ENOMEM, "out of memory");
					goto out;
				}
				cap = p->nbytes;
			}
			if (ck_read_stored(&r, &m.tensors[t], p, buf) < 0)
				problem(first, "%s", st_errmsg());
			else
				*bytes_checked += (int64_t)p->nbytes;
			(*pieces_checked)++;
		}
	st_progress_end(&prog);
	rc = 0;
	if (pr.count)
		rc = st_fail(ST_EIO, "%s%s", pr.first, pr.count > 1 ? " (and more problems, listed above)" : "");
out:
	ck_reader_release(&r);
	ck_manifest_free(&m);
	free(buf);
	return rc;
}

void st_ckpt_resolve_dir(const char *dir, char *buf, size_t cap)
{
	struct stat st;
	char p[ST_PATH_MAX];
	int64_t step;
	const char *base = strrchr(dir, '/');
	if (st_path_join(p, sizeof(p), dir, "checkpoints") == 0 && stat(p, &st) == 0 && S_ISDIR(st.st_mode) &&
	    !ck_parse_step(base ? base + 1 : dir, &step)) {
		snprintf(buf, cap, "%s", p);
		return;
	}
	snprintf(buf, cap, "%s", dir);
}

void st_ckpt_free_dirs(char **dirs, int n)
{
	for (int i = 0; dirs && i < n; i++)
		free(dirs[i]);
	free(dirs);
}

int st_ckpt_verify_targets(const char *arg, char ***dirs_out, int *n_out)
{
	char dir[ST_PATH_MAX], mp[ST_PATH_MAX], sd[ST_PATH_MAX];
	struct stat st;
	int64_t *steps = NULL;
	char **dirs = NULL;
	int n = 0, rc;

	*dirs_out = NULL;
	*n_out = 0;
	if (stat(arg, &st) < 0 || !S_ISDIR(st.st_mode))
		return st_fail(ST_EINVAL, "%s: no such directory", arg);
	if ((rc = st_path_join(mp, sizeof(mp), arg, CK_MANIFEST)) < 0)
		return rc;
	if (st_file_exists(mp)) {
		if (!(dirs = malloc(sizeof(*dirs))) || !(dirs[0] = strdup(arg))) {
			free(dirs);
			return st_fail(ST_ENOMEM, "out of memory");
		}
		*dirs_out = dirs;
		*n_out = 1;
		return 0;
	}
	st_ckpt_resolve_dir(arg, dir, sizeof(dir));
	if ((rc = ck_list_steps(dir, 1, &steps, &n)) < 0)
		return rc;
	if (n == 0) {
		free(steps);
		return st_fail(ST_EINVAL, "%s: no committed checkpoint here (not a step directory with %s, nor a "
			       "checkpoints directory holding one)", arg, CK_MANIFEST);
	}
	if (!(dirs = calloc((size_t)n, sizeof(*dirs))))
		rc = st_fail(ST_ENOMEM, "out of memory");
	for (int i = 0; i < n && rc == 0; i++)
		if ((rc = ck_step_dir(sd, sizeof(sd), dir, steps[i])) == 0 && !(dirs[i] = strdup(sd)))
			rc = st_fail(ST_ENOMEM, "out of memory");
	free(steps);
	if (rc < 0) {
		st_ckpt_free_dirs(dirs, n);
		return rc;
	}
	*dirs_out = dirs;
	*n_out = n;
	return 0;
}
