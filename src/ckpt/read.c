/*
 * read.c - reading pieces of one committed checkpoint: each requested box
 * is filled from the stored pieces that intersect it, each stored piece read
 * whole with pread (only the byte ranges needed, no mapping that a truncated
 * file could turn into SIGBUS) and its checksum verified before use. A
 * stored piece can also be read in parts (restore.c reads large ones on
 * several threads) and its checksum combined from theirs.
 *
 * Stored pieces are read in chunks with O_DIRECT into an aligned buffer of
 * the reader (no copy through the page cache, which costs as much CPU as
 * the rest of a restore and runs at half the disk's rate on a busy 2-core
 * machine), each chunk checksummed and copied to its destination while it
 * is in the cache. Where the file system refuses O_DIRECT (tmpfs), chunks
 * are read buffered straight into the destination, with the same checksum
 * per chunk.
 *
 * The destination of a restore is usually fresh memory, and faulting it in
 * a page at a time from the copy is the largest cost of a restore; each
 * chunk's destination pages are faulted in with one MADV_POPULATE_WRITE
 * first (fewer traps; figures in docs/checkpoint-costs.md). Where the file
 * offset and the destination address are both on the file system's direct
 * I/O block (statx; 512 bytes on ext4 here), whole blocks are read straight
 * into the destination and checksummed there: no bounce and no copy. Our
 * saver pads the header to 4 KiB and every llama3 tensor is a multiple of
 * 3 KiB, so a restore into page-aligned state (base/pages.h) on the mesh
 * that saved it reads nearly all of it that way.
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#define READ_CHUNK ((size_t)4 << 20) /* bytes per read */
#define READ_SLICE ((size_t)256 << 10) /* checksummed then copied while in the cache */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Fault in the whole pages of [p, p + n) at once; only a hint (an older
 * kernel refuses it, and the copy then faults them one by one). */
static void populate(void *p, uint64_t n)
{
	const uintptr_t page = 4096;
	uintptr_t from = ((uintptr_t)p + page - 1) & ~(page - 1), to = ((uintptr_t)p + n) & ~(page - 1);
	if (to > from)
		(void)madvise((void *)from, to - from, MADV_POPULATE_WRITE);
}

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
	if (r->dfds)
		for (int i = 0; i < r->m->nfiles; i++)
			if (r->dfds[i] >= 0)
				close(r->dfds[i]);
	free(r->fds);
	free(r->dfds);
	free(r->dalign);
	free(r->bounce);
	free(r->tmp);
	memset(r, 0, sizeof(*r));
}

static int open_file(struct ck_reader *r, int file, int *fd)
{
	char path[ST_PATH_MAX];
	int rc;

	if (!r->fds) {
		if (!(r->fds = malloc((size_t)r->m->nfiles * sizeof(int))) ||
		    !(r->dfds = malloc((size_t)r->m->nfiles * sizeof(int))) ||
		    !(r->dalign = malloc((size_t)r->m->nfiles * sizeof(size_t)))) {
			free(r->fds);
			free(r->dfds);
			r->fds = r->dfds = NULL;
			return st_fail(ST_ENOMEM, "out of memory");
		}
		for (int i = 0; i < r->m->nfiles; i++)
			r->fds[i] = r->dfds[i] = -1;
	}
	if (r->fds[file] < 0) {
		if ((rc = st_path_join(path, sizeof(path), r->dir, r->m->files[file].name)) < 0)
			return rc;
		if ((r->fds[file] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			return st_fail(ST_EIO, "%s: cannot open shard: %s", path, strerror(errno));
		/* the direct descriptor, when the file system takes it (and a buffer for it) */
		r->dfds[file] = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		if (r->dfds[file] < 0)
			r->dfds[file] = -2;
		else if ((r->dalign[file] = st_direct_align(r->dfds[file])) > ST_ATOMIC_FILE_ALIGN) {
			close(r->dfds[file]); /* the bounce buffer's reads assume a divisor of it */
			r->dfds[file] = -2;
		} else if (!r->bounce) {
			void *b;
			if (posix_memalign(&b, ST_ATOMIC_FILE_ALIGN, READ_CHUNK) != 0) {
				close(r->dfds[file]);
				r->dfds[file] = -2;
			} else
				r->bounce = b;
		}
	}
	*fd = r->fds[file];
	return 0;
}

/* pread until n bytes or the end of the file; the bytes read, or -errno.
 * direct: a short read is the end (the next offset would be unaligned). */
static ssize_t pread_full(int fd, char *buf, size_t n, off_t at, int direct)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = pread(fd, buf + got, n - got, at + (off_t)got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		got += (size_t)k;
		if (direct && got < n)
			break;
	}
	return (ssize_t)got;
}

/*
 * Bytes [off, off + n) of the file into dst, with their CRC-32 (continued
 * from *crc), chunk by chunk. Returns the bytes placed (fewer: the file
 * ends there), or -errno. With a direct descriptor, chunks go straight into
 * dst where aligned, else through r->bounce; an EINVAL there (a file system that took the open but
 * not the read) switches the file to buffered reads.
 */
static int64_t read_range(struct ck_reader *r, int file, int fd, char *dst, uint64_t off, uint64_t n, uint32_t *crc)
{
	uint64_t done = 0;
	while (done < n && r->dfds[file] >= 0) {
		/* whole blocks straight into the destination where the file offset and
		 * the address are both on one; else into r->bounce from the block before */
		uint64_t at = off + done, A = r->dalign[file];
		int into = at % A == 0 && (uintptr_t)(dst + done) % A == 0 && n - done >= A;
		uint64_t a = into ? at : at / ST_ATOMIC_FILE_ALIGN * ST_ATOMIC_FILE_ALIGN;
		uint64_t want = into ? (n - done) / A * A
				     : (off + n - a + ST_ATOMIC_FILE_ALIGN - 1) / ST_ATOMIC_FILE_ALIGN * ST_ATOMIC_FILE_ALIGN;
		if (want > READ_CHUNK)
			want = READ_CHUNK;
		if (into)
			populate(dst + done, want);
		ssize_t k = pread_full(r->dfds[file], into ? dst + done : r->bounce, want, (off_t)a, 1);
		if (k == -EINVAL && done == 0) {
			close(r->dfds[file]);
			r->dfds[file] = -2;
			break;
		}
		if (k < 0)
			return k;
		if ((uint64_t)k <= at - a)
			return (int64_t)done; /* the file ends before `at` */
		uint64_t len = a + (uint64_t)k - at;
		if (len > n - done)
			len = n - done;
		if (into) {
			*crc = st_crc32(*crc, dst + done, (size_t)len);
			r->bytes_direct += (int64_t)len;
			done += len;
			st_progress_add(r->progress, (int64_t)len);
			if ((uint64_t)k < want)
				return (int64_t)done; /* the end of the file */
			continue;
		}
		populate(dst + done, len);
		/* checksum, then copy, in slices that stay in the cache */
		for (uint64_t x = 0; x < len; x += READ_SLICE) {
			size_t m = len - x < READ_SLICE ? (size_t)(len - x) : READ_SLICE;
			const char *src = r->bounce + (at - a) + x;
			*crc = st_crc32(*crc, src, m);
			memcpy(dst + done + x, src, m);
		}
		done += len;
		st_progress_add(r->progress, (int64_t)len);
		if ((uint64_t)k < want)
			return (int64_t)done; /* the end of the file */
	}
	while (done < n) {
		size_t want = n - done > READ_CHUNK ? READ_CHUNK : (size_t)(n - done);
		populate(dst + done, want);
		ssize_t k = pread_full(fd, dst + done, want, (off_t)(off + done), 0);
		if (k < 0)
			return k;
		*crc = st_crc32(*crc, dst + done, (size_t)k);
		done += (uint64_t)k;
		st_progress_add(r->progress, k);
		if ((size_t)k < want)
			break;
	}
	return (int64_t)done;
}

int ck_read_part(struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, uint64_t at, uint64_t len,
		 char *dst, uint32_t *crc)
{
	const char *fname = r->m->files[p->file].name;
	char box[96];
	int fd, rc;

	*crc = 0;
	if (at > p->nbytes || len > p->nbytes - at)
		ST_BUG("ck_read_part: bytes %" PRIu64 "+%" PRIu64 " outside a piece of %" PRIu64, at, len, p->nbytes);
	if ((rc = open_file(r, p->file, &fd)) < 0)
		return rc;
	int64_t got = read_range(r, p->file, fd, dst, p->data_offset + at, len, crc);
	if (got < 0)
		return st_fail(ST_EIO, "%s/%s: read failed (tensor %s): %s", r->dir, fname, t->name,
			       strerror((int)-got));
	if ((uint64_t)got < len)
		return st_fail(ST_EIO, "%s/%s: file is truncated: tensor %s%s needs bytes up to %" PRIu64,
			       r->dir, fname, t->name, ck_box_str(&p->box, box, sizeof(box)),
			       p->data_offset + p->nbytes);
	r->bytes_read += (int64_t)len;
	return 0;
}

int ck_check_crc(const struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, uint32_t crc)
{
	char box[96];
	if (crc != p->crc)
		return st_fail(ST_EIO, "%s/%s: checksum mismatch in tensor %s%s (manifest crc32 %08x, data %08x)",
			       r->dir, r->m->files[p->file].name, t->name, ck_box_str(&p->box, box, sizeof(box)),
			       p->crc, crc);
	return 0;
}

int ck_read_stored(struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, float *dst)
{
	uint32_t crc;
	int rc = ck_read_part(r, t, p, 0, p->nbytes, (char *)dst, &crc);
	return rc < 0 ? rc : ck_check_crc(r, t, p, crc);
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

static int same_global_shape(const struct ck_tensor *t, const st_ckpt_piece *want)
{
	return t->ndim == want->ndim && t->shape[0] == want->global_shape[0] &&
	       (t->ndim == 1 || t->shape[1] == want->global_shape[1]);
}

const struct ck_piece *ck_same_piece(const struct ck_manifest *m, const st_ckpt_piece *want,
				     const struct ck_tensor **tensor)
{
	const struct ck_tensor *t = ck_manifest_find(m, want->name);
	struct ck_box wb = ck_piece_box(want);
	if (!t || !same_global_shape(t, want))
		return NULL;
	for (int i = 0; i < t->npieces; i++)
		if (t->pieces[i].box.ndim == wb.ndim && same_box(&wb, &t->pieces[i].box)) {
			*tensor = t;
			return &t->pieces[i];
		}
	return NULL;
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
	if (!same_global_shape(t, want))
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
