/*
 * read.c - reading pieces of one committed checkpoint: each requested box
 * is filled from the stored pieces that intersect it, each stored piece read
 * whole with pread (only the byte ranges needed, no mapping that a truncated
 * file could turn into SIGBUS) and its checksum verified before use.
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ck_reader_init(struct ck_reader *r, const char *dir, const struct ck_manifest *m)
{
	memset(r, 0, sizeof(*r));
	r->dir = dir;
	r->m = m;
}

void ck_reader_release(struct ck_reader *r)
{
	if (r->fds)
		for (int i = 0; i < r->m->nfiles; i++)
			if (r->fds[i] >= 0)
				close(r->fds[i]);
	free(r->fds);
	free(r->tmp);
	memset(r, 0, sizeof(*r));
}

static int open_file(struct ck_reader *r, int file, int *fd)
{
	char path[ST_PATH_MAX];
	int rc;

	if (!r->fds) {
		if (!(r->fds = malloc((size_t)r->m->nfiles * sizeof(int))))
			return st_fail(ST_ENOMEM, "out of memory");
		for (int i = 0; i < r->m->nfiles; i++)
			r->fds[i] = -1;
	}
	if (r->fds[file] < 0) {
		if ((rc = st_path_join(path, sizeof(path), r->dir, r->m->files[file].name)) < 0)
			return rc;
		if ((r->fds[file] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			return st_fail(ST_EIO, "%s: cannot open shard: %s", path, strerror(errno));
	}
	*fd = r->fds[file];
	return 0;
}

int ck_read_stored(struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, float *dst)
{
	const char *fname = r->m->files[p->file].name;
	char box[96];
	uint64_t got = 0;
	uint32_t crc;
	int fd, rc;

	if ((rc = open_file(r, p->file, &fd)) < 0)
		return rc;
	while (got < p->nbytes) {
		size_t want = p->nbytes - got > (1u << 30) ? (1u << 30) : (size_t)(p->nbytes - got);
		ssize_t n = pread(fd, (char *)dst + got, want, (off_t)(p->data_offset + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return st_fail(ST_EIO, "%s/%s: read failed (tensor %s): %s", r->dir, fname, t->name,
				       strerror(errno));
		if (n == 0)
			return st_fail(ST_EIO, "%s/%s: file is truncated: tensor %s%s needs bytes up to %" PRIu64,
				       r->dir, fname, t->name, ck_box_str(&p->box, box, sizeof(box)),
				       p->data_offset + p->nbytes);
		got += (uint64_t)n;
		st_progress_add(r->progress, n);
	}
	r->bytes_read += (int64_t)p->nbytes;
	crc = st_crc32(0, dst, p->nbytes);
	if (crc != p->crc)
		return st_fail(ST_EIO, "%s/%s: checksum mismatch in tensor %s%s (manifest crc32 %08x, data %08x)",
			       r->dir, fname, t->name, ck_box_str(&p->box, box, sizeof(box)), p->crc, crc);
	return 0;
}

static int same_box(const struct ck_box *a, const struct ck_box *b)
{
	for (int d = 0; d < a->ndim; d++)
		if (a->offset[d] != b->offset[d] || a->shape[d] != b->shape[d])
			return 0;
	return 1;
}

/* Copy box x (inside both) from src (box sb) to dst (box db); 1-D boxes are one row. */
static void copy_box(float *dst, const struct ck_box *db, const float *src, const struct ck_box *sb,
		     const struct ck_box *x)
{
	if (x->ndim == 1) {
		memcpy(dst + (x->offset[0] - db->offset[0]), src + (x->offset[0] - sb->offset[0]),
		       (size_t)x->shape[0] * sizeof(float));
		return;
	}
	for (int64_t i = 0; i < x->shape[0]; i++) {
		int64_t row = x->offset[0] + i;
		memcpy(dst + (row - db->offset[0]) * db->shape[1] + (x->offset[1] - db->offset[1]),
		       src + (row - sb->offset[0]) * sb->shape[1] + (x->offset[1] - sb->offset[1]),
		       (size_t)x->shape[1] * sizeof(float));
	}
}

int ck_fill_piece(struct ck_reader *r, const st_ckpt_piece *want)
{
	struct ck_tensor *t = ck_manifest_find(r->m, want->name);
	struct ck_box wb = ck_piece_box(want), x;
	int64_t covered = 0;
	int rc;

	if ((rc = ck_check_piece(want, "restore")) < 0)
		return rc;
	if (!t)
		return st_fail(ST_EINVAL, "%s: tensor %s is not in this checkpoint (a different model?)", r->dir,
			       want->name);
	if (t->ndim != want->ndim || t->shape[0] != want->global_shape[0] ||
	    (t->ndim == 2 && t->shape[1] != want->global_shape[1]))
		return st_fail(ST_EINVAL, "%s: tensor %s: the model wants shape [%" PRId64 "%s%" PRId64 "], the "
			       "checkpoint holds [%" PRId64 "%s%" PRId64 "] (a different model shape)", r->dir, want->name,
			       want->global_shape[0], want->ndim == 2 ? ", " : "",
			       want->ndim == 2 ? want->global_shape[1] : (int64_t)0, t->shape[0], t->ndim == 2 ? ", " : "",
			       t->ndim == 2 ? t->shape[1] : (int64_t)0);
	for (int i = 0; i < t->npieces; i++) {
		const struct ck_piece *p = &t->pieces[i];
		if (!ck_box_intersect(&wb, &p->box, &x))
			continue;
		if (same_box(&wb, &p->box)) {
			if ((rc = ck_read_stored(r, t, p, want->data)) < 0)
				return rc;
		} else {
			if (r->cached != p) {
				if (p->nbytes > r->tmp_cap) {
					free(r->tmp);
					r->tmp_cap = 0;
					if (!(r->tmp = malloc(p->nbytes)))
						return st_fail(ST_ENOMEM, "out of memory reading tensor %s", t->name);
					r->tmp_cap = p->nbytes;
				}
				r->cached = NULL;
				if ((rc = ck_read_stored(r, t, p, r->tmp)) < 0)
					return rc;
				r->cached = p;
			}
			copy_box(want->data, &wb, r->tmp, &p->box, &x);
		}
		covered += ck_box_numel(&x);
	}
	if (covered != ck_box_numel(&wb))
		return st_fail(ST_EIO, "%s: tensor %s: the stored pieces cover %" PRId64 " of the %" PRId64
			       " elements requested", r->dir, want->name, covered, ck_box_numel(&wb));
	return 0;
}
