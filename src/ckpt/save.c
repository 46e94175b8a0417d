/*
 * save.c - the checkpoint saver: copy to host buffers, then (in a background
 * thread when async) write the shard, the done record and, on process 0,
 * the manifest. The commit handshake between processes goes through files
 * only, so the background thread never touches the communicator that the
 * training thread is using.
 *
 * defer_copy (the trainer's mode) copies nothing up front: the writer
 * writes the pieces with O_DIRECT straight from the caller's memory where
 * address and file offset are block-aligned (the header is padded to a
 * whole block, so the data starts on one), and the caller's release before
 * its next update copies only what is not written yet. On 2 cores that
 * both train, every CPU-second of the writer slows the step; the copy of
 * the whole state was a third of it (docs/checkpoint-costs.md).
 */
#include "ckpt/ckpt_int.h"

#include "base/clock.h"
#include "base/err.h"
#include "base/file.h"
#include "ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_COMMIT_TIMEOUT_MS 1800000
#define MAX_COPY_THREADS 8
#define CK_SLACK ((size_t)1 << 20) /* spare bytes, so that a header a little longer next time fits */
#define WRITER_NICE (-10)
#define WRITE_CHUNK ((size_t)8 << 20) /* defer_copy: the writer's unit (a release waits for at most one) */

struct job_piece {
	char *name, *key;
	int ndim;
	int64_t gshape[2];
	struct ck_box box;
	size_t off, nbytes; /* in the host buffer */
};

struct seg {
	char *dst;
	const char *src;
	size_t n;
};

/*
 * A range of the pieces' data (offsets into the concatenation of the pieces'
 * bytes, which the file holds right after the header) that the deferred
 * writer writes in one call: straight from the caller's memory (src), or,
 * where that memory or the file offset is not block-aligned, copied into the
 * host buffer first (src NULL).
 */
struct extent {
	size_t from, to;
	const char *src;
};

/*
 * defer_copy: the writer writes the pieces while the caller trains on (its
 * pieces unchanged until st_ckpt_saver_release), extent by extent in file
 * order (planned once the file is open: the alignment is the file
 * system's), and a second thread checksums them, extent by extent, from
 * the same memory (so the checksum's pass over memory is not on the
 * write's path). The release stops both, waits for the extent each has in
 * flight, and copies into the host buffer everything from the first extent
 * either had not reached (all of it if the writer has not planned yet);
 * the writer then writes and checksums the rest from the host buffer.
 */
struct defer {
	struct seg *segs; /* the sources, in file order; the concatenation of their bytes */
	int nsegs;
	size_t total;
	struct extent *ext; /* the plan (the writer's, under mu) */
	size_t next, n;   /* the next extent to write, the count (under mu) */
	size_t crc_next;  /* the next extent to checksum (under mu) */
	size_t taken;     /* under mu, with takeover: the writer goes on from here, in the host buffer */
	int takeover;     /* under mu: the release took what the writer had not claimed */
	int inflight;     /* under mu: the writer reads the caller's memory */
	int crc_inflight; /* under mu: the checksum thread reads it */
	int copied;       /* under mu: the release's copy is in the host buffer */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int pending;      /* the caller's: a save may still read its pieces */
	size_t direct;    /* bytes written straight from the caller's memory (the writer's) */
	double crc_cpu_s; /* CPU time of the checksum thread (the writer's, after joining it) */
	int given_crc;    /* the caller gave every piece's CRC-32: no checksum thread */
};

struct st_ckpt_saver {
	st_ckpt_opts o;
	char *dir, *fence;
	pthread_mutex_t mu;  /* guards stats */
	st_ckpt_stats stats;
	atomic_int abort;

	/* the save in flight (owned by the writer while running) */
	pthread_t thread;
	int running;
	struct ck_manifest meta; /* step, meta fields, config (process 0) */
	int npieces;
	struct job_piece *pieces;
	char *buf;
	size_t cap, used;
	struct defer defer;
	int nice0;       /* the caller's nice value (the writer raises its own) */
	uint32_t *crc;   /* defer_copy: each piece's CRC-32 of its first ... */
	size_t crc_pos;  /* ... bytes up to this offset in the file (pieces are contiguous) */
	int crc_cur;     /* the piece crc_pos is in */
	int have_crc;    /* crc[] is complete (else write_shard computes it) */

	/* outcome of the last save, until st_ckpt_wait / st_ckpt_save consumes it */
	int result;
	char errmsg[512];
};

void st_ckpt_meta_release(st_ckpt_meta *meta)
{
	free((char *)meta->config_json);
	meta->config_json = NULL;
}

int st_ckpt_run_dir(const st_config *c, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/%s/checkpoints", c->base_output_directory, c->run_name);
	if (n < 0 || (size_t)n >= cap)
		return st_fail(ST_EINVAL, "checkpoint directory path is too long (base_output_directory/run_name)");
	return 0;
}

int st_ckpt_opts_from_config(st_ckpt_opts *o, const st_config *c, int process, int count)
{
	static _Thread_local char dir[ST_PATH_MAX + ST_NAME_MAX + 32];
	int rc;

	memset(o, 0, sizeof(*o));
	if ((rc = st_ckpt_run_dir(c, dir, sizeof(dir))) < 0)
		return rc;
	o->dir = dir;
	o->process = process;
	o->process_count = count;
	o->async = c->async_checkpointing;
	o->max_to_keep = c->max_num_checkpoints_to_keep;
	o->failure_policy = c->checkpoint_failure_policy;
	o->generation = ST_CKPT_NO_GENERATION;
	return 0;
}

/* ------------------------------------------------------------ lifecycle */

static int prune(st_ckpt_saver *s);

int st_ckpt_saver_create(st_ckpt_saver **out, const st_ckpt_opts *opts)
{
	st_ckpt_saver *s;
	int rc;

	*out = NULL;
	if (!opts || !opts->dir || !opts->dir[0])
		return st_fail(ST_EINVAL, "checkpoint saver: no directory");
	if (opts->process_count < 1 || opts->process < 0 || opts->process >= opts->process_count)
		return st_fail(ST_EINVAL, "checkpoint saver: process %d of %d", opts->process, opts->process_count);
	if (!(s = calloc(1, sizeof(*s))) || !(s->dir = strdup(opts->dir)) ||
	    (opts->fence && !(s->fence = strdup(opts->fence)))) {
		if (s)
			free(s->dir);
		free(s);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	s->o = *opts;
	s->o.dir = s->dir;
	s->o.fence = s->fence;
	if (s->o.commit_timeout_ms <= 0)
		s->o.commit_timeout_ms = DEFAULT_COMMIT_TIMEOUT_MS;
	s->stats.last_step = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->defer.mu, NULL);
	pthread_cond_init(&s->defer.cv, NULL);
	/* process 0 also enforces max_num_checkpoints_to_keep now: a run killed
	 * between a commit and its pruning left one checkpoint too many */
	s->meta.step = -1;
	if ((rc = st_mkdir_p(s->dir)) < 0 ||
	    (opts->process == 0 && ((rc = ck_fence_check(&s->o, -1)) < 0 || (rc = st_ckpt_cleanup(s->dir)) < 0 ||
				    (rc = prune(s)) < 0))) {
		st_ckpt_saver_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static void free_job(st_ckpt_saver *s)
{
	for (int i = 0; i < s->npieces; i++) {
		free(s->pieces[i].name);
		free(s->pieces[i].key);
	}
	free(s->pieces);
	s->pieces = NULL;
	s->npieces = 0;
	free(s->defer.segs);
	s->defer.segs = NULL;
	s->defer.nsegs = 0;
	s->defer.total = 0;
	free(s->defer.ext);
	s->defer.ext = NULL;
	s->defer.n = s->defer.next = s->defer.crc_next = 0;
	s->defer.direct = 0;
	s->defer.crc_cpu_s = 0;
	s->defer.given_crc = 0;
	free(s->crc);
	s->crc = NULL;
	s->have_crc = 0;
	ck_manifest_free(&s->meta);
}

static void join(st_ckpt_saver *s)
{
	if (s->running) {
		pthread_join(s->thread, NULL);
		s->running = 0;
	}
	s->defer.pending = 0; /* the writer wrote (or the release copied) every extent before it ended */
}

void st_ckpt_saver_abort(st_ckpt_saver *s)
{
	if (s)
		atomic_store(&s->abort, 1);
}

void st_ckpt_saver_free(st_ckpt_saver *s)
{
	if (!s)
		return;
	join(s);
	free_job(s);
	free(s->buf);
	free(s->dir);
	free(s->fence);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->defer.mu);
	pthread_cond_destroy(&s->defer.cv);
	free(s);
}

void st_ckpt_saver_stats(st_ckpt_saver *s, st_ckpt_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->stats;
	pthread_mutex_unlock(&s->mu);
}

/* The outcome of the finished save: its error under "stop", else 0 (it was warned already). */
static int consume_result(st_ckpt_saver *s)
{
	int rc = s->result;
	s->result = 0;
	if (rc < 0 && s->o.failure_policy == ST_CKPT_FAIL_STOP)
		return st_fail(rc, "%s", s->errmsg);
	return 0;
}

int st_ckpt_wait(st_ckpt_saver *s)
{
	join(s);
	return consume_result(s);
}

/* ------------------------------------------------------------ the writer */

static int done_path(char *buf, size_t cap, const char *step_dir, int64_t generation, int process)
{
	char name[64];
	ck_done_name(name, sizeof(name), generation, process);
	return st_path_join(buf, cap, step_dir, name);
}

/*
 * Pad a safetensors header (u64 length, JSON, spaces) with more spaces to a
 * whole number of blocks, as the format allows: the data then starts on a
 * block boundary in the file, so pieces can be written with O_DIRECT
 * straight from block-aligned memory.
 */
static int pad_header(const char *path, char **hdr, size_t *hlen)
{
	size_t len = (*hlen + ST_ATOMIC_FILE_ALIGN - 1) / ST_ATOMIC_FILE_ALIGN * ST_ATOMIC_FILE_ALIGN;
	char *p = realloc(*hdr, len);
	if (!p)
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	memset(p + *hlen, ' ', len - *hlen);
	for (int i = 0; i < 8; i++)
		p[i] = (char)(unsigned char)((uint64_t)(len - 8) >> (8 * i));
	*hdr = p;
	*hlen = len;
	return 0;
}

/*
 * The shard's safetensors header for the job's pieces, computed before the
 * copy so that the host buffer holds the exact file image: the header, then
 * the pieces' data in order.
 */
static int build_header(st_ckpt_saver *s, const char *path, char **hdr, size_t *hlen)
{
	char num[4][32];
	int n = s->npieces, nmeta = 0, rc;
	st_safetensors_tensor *t = calloc((size_t)n + 1, sizeof(*t));
	const char **mk = calloc((size_t)n + 4, sizeof(*mk)), **mv = calloc((size_t)n + 4, sizeof(*mv));
	char **boxes = calloc((size_t)n + 1, sizeof(*boxes));

	if (!t || !mk || !mv || !boxes) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	snprintf(num[0], sizeof(num[0]), "%" PRId64, s->meta.step);
	snprintf(num[1], sizeof(num[1]), "%d", s->o.process);
	snprintf(num[2], sizeof(num[2]), "%d", s->o.process_count);
	mk[nmeta] = "slicetrain.step", mv[nmeta++] = num[0];
	mk[nmeta] = "slicetrain.process", mv[nmeta++] = num[1];
	mk[nmeta] = "slicetrain.process_count", mv[nmeta++] = num[2];
	if (s->o.generation >= 0) {
		snprintf(num[3], sizeof(num[3]), "%" PRId64, s->o.generation);
		mk[nmeta] = "slicetrain.generation", mv[nmeta++] = num[3];
	}
	for (int i = 0; i < n; i++) {
		const struct job_piece *p = &s->pieces[i];
		t[i].name = p->key;
		t[i].dtype = ST_DTYPE_F32;
		t[i].ndim = p->ndim;
		t[i].shape[0] = p->box.shape[0];
		t[i].shape[1] = p->box.shape[1];
		if (strcmp(p->key, p->name) != 0) {
			/* a piece that is not the whole tensor: its box, for readers of the shard alone */
			char buf[512];
			if (p->ndim == 2)
				snprintf(buf, sizeof(buf), "{\"tensor\":\"%s\",\"shape\":[%" PRId64 ",%" PRId64
					 "],\"offset\":[%" PRId64 ",%" PRId64 "]}", p->name, p->gshape[0], p->gshape[1],
					 p->box.offset[0], p->box.offset[1]);
			else
				snprintf(buf, sizeof(buf), "{\"tensor\":\"%s\",\"shape\":[%" PRId64 "],\"offset\":[%" PRId64
					 "]}", p->name, p->gshape[0], p->box.offset[0]);
			if (!(boxes[i] = strdup(buf))) {
				rc = st_fail(ST_ENOMEM, "out of memory");
				goto out;
			}
			mk[nmeta] = p->key, mv[nmeta++] = boxes[i];
		}
	}
	if ((rc = st_safetensors_header(path, n, t, nmeta, mk, mv, hdr, hlen)) == 0)
		rc = pad_header(path, hdr, hlen);
out:
	for (int i = 0; boxes && i < n; i++)
		free(boxes[i]);
	free(boxes);
	free(t);
	free(mk);
	free(mv);
	return rc;
}

static int defer_write(st_ckpt_saver *s, st_atomic_file *f);

/*
 * The shard, atomically (base/file.h's direct mode). The host buffer is
 * ST_ATOMIC_FILE_ALIGN-aligned and the header padded to a whole block, so
 * whole blocks go out with O_DIRECT where the file system allows it: no copy
 * into the page cache, which on a virtual disk runs well below the direct
 * rate (docs/checkpoint-costs.md), and no checkpoint pages pushing the training's
 * memory out. The last partial block is written buffered. defer_copy: the
 * header from the host buffer, then the pieces (defer_write).
 */
static int write_image(st_ckpt_saver *s, const char *path)
{
	st_atomic_file f = ST_ATOMIC_FILE_INIT;
	int rc = st_atomic_file_open_direct(&f, path);
	if (rc < 0)
		return rc;
	if (s->defer.segs) {
		st_atomic_file_write(&f, s->buf, s->used - s->defer.total);
		if ((rc = defer_write(s, &f)) < 0) {
			st_atomic_file_abort(&f);
			return rc;
		}
	} else {
		st_atomic_file_write(&f, s->buf, s->used);
	}
	return st_atomic_file_commit(&f);
}

/* Shard file (the host buffer as it is) and done record of this process. */
static int write_shard(st_ckpt_saver *s, const char *step_dir, int64_t *file_bytes)
{
	char fname[64], path[ST_PATH_MAX];
	char *text = NULL;
	struct ck_manifest done = {0};
	int rc;

	ck_shard_name(fname, sizeof(fname), s->o.generation, s->o.process, s->o.process_count);
	if ((rc = st_path_join(path, sizeof(path), step_dir, fname)) < 0)
		return rc;
	/* first the shard: a deferred write checksums the pieces as it goes */
	if ((rc = write_image(s, path)) < 0)
		return rc;
	*file_bytes = (int64_t)s->used;
	done.is_done = 1;
	done.step = s->meta.step;
	done.process = s->o.process;
	done.process_count = s->o.process_count;
	done.save_id = s->o.save_id;
	done.generation = s->o.generation;
	if ((rc = ck_manifest_add_file(&done, fname, s->o.process, (int64_t)s->used)) < 0)
		goto out;
	for (int i = 0; i < s->npieces; i++) {
		const struct job_piece *p = &s->pieces[i];
		struct ck_piece cp = {.file = 0, .key = p->key, .box = p->box, .data_offset = p->off, .nbytes = p->nbytes};
		struct ck_tensor *ct = ck_manifest_find(&done, p->name);
		cp.crc = s->have_crc ? s->crc[i] : st_crc32(0, s->buf + p->off, p->nbytes);
		if (!ct) {
			if ((rc = ck_manifest_add_tensor(&done, p->name, p->ndim, p->gshape)) < 0)
				goto out;
			ct = &done.tensors[rc];
		}
		if ((rc = ck_tensor_add_piece(ct, &cp)) < 0)
			goto out;
	}
	if ((rc = ck_manifest_dump(&done, &text)) < 0 ||
	    (rc = done_path(path, sizeof(path), step_dir, s->o.generation, s->o.process)) < 0)
		goto out;
	rc = st_write_file_atomic(path, text, strlen(text));
out:
	ck_manifest_free(&done);
	free(text);
	return rc;
}

/* Process 0: wait for process p's done record of this save and merge it into m. A
 * record of another generation is never merged: a group's names carry its
 * generation, and the record says which it is. */
static int collect_done(st_ckpt_saver *s, const char *step_dir, int p, struct ck_manifest *m, double deadline)
{
	char path[ST_PATH_MAX], fpath[ST_PATH_MAX];
	struct ck_manifest d;
	struct stat st;
	useconds_t sleep_us = 2000;
	char *text;
	int rc, foreign_told = 0;

	if ((rc = done_path(path, sizeof(path), step_dir, s->o.generation, p)) < 0)
		return rc;
	for (;;) {
		if (atomic_load(&s->abort))
			return st_fail(ST_EPEER, "checkpoint step %" PRId64 ": commit aborted while waiting for process %d",
				       s->meta.step, p);
		if (st_file_exists(path)) {
			if ((rc = st_read_file(path, 1u << 30, &text, NULL)) < 0)
				return rc;
			rc = ck_manifest_parse(&d, path, text, 1, s->meta.step);
			free(text);
			if (rc < 0)
				return rc;
			if (d.generation != s->o.generation) {
				if (!foreign_told++)
					st_warn("checkpoint step %" PRId64 ": ignoring %s: a record of generation %" PRId64
						", this save is generation %" PRId64 "; waiting for process %d's own",
						s->meta.step, path, d.generation, s->o.generation, p);
			} else if (d.save_id == s->o.save_id) { /* else: a stale record of an earlier attempt; wait */
				break;
			}
			ck_manifest_free(&d);
		}
		if (st_mono_s() > deadline)
			return st_fail(ST_EIO, "checkpoint step %" PRId64 ": process %d did not finish its shard within %g s "
				       "(no %s; is it alive?)", s->meta.step, p, s->o.commit_timeout_ms / 1000.0, path);
		usleep(sleep_us);
		if (sleep_us < 100000)
			sleep_us *= 2;
	}
	rc = 0;
	if (d.process != p || d.process_count != s->o.process_count)
		rc = st_fail(ST_EINVAL, "%s: written by process %d of %d, expected process %d of %d", path, d.process,
			     d.process_count, p, s->o.process_count);
	else if (st_path_join(fpath, sizeof(fpath), step_dir, d.files[0].name) < 0 || stat(fpath, &st) < 0)
		rc = st_fail(ST_EINVAL, "%s: names file %s, which does not exist", path, d.files[0].name);
	else if (st.st_size != d.files[0].bytes)
		rc = st_fail(ST_EINVAL, "%s: file %s has %lld bytes, the record says %" PRId64, path, d.files[0].name,
			     (long long)st.st_size, d.files[0].bytes);
	if (rc == 0)
		rc = ck_manifest_merge(m, &d, path);
	ck_manifest_free(&d);
	return rc;
}

/* Remove a committed checkpoint: the manifest first, so a crash leaves an uncommitted dir. */
static int remove_committed(const char *dir, int64_t step)
{
	char sd[ST_PATH_MAX], mp[ST_PATH_MAX];
	int rc;
	if ((rc = ck_step_dir(sd, sizeof(sd), dir, step)) < 0 || (rc = st_path_join(mp, sizeof(mp), sd, CK_MANIFEST)) < 0)
		return rc;
	if (unlink(mp) < 0 && errno != ENOENT)
		return st_fail(ST_EIO, "%s: cannot remove: %s", mp, strerror(errno));
	if ((rc = st_fsync_dir(sd)) < 0)
		return rc;
	return st_remove_dir(sd);
}

static int prune(st_ckpt_saver *s)
{
	int64_t *steps;
	int n, rc;

	if (s->o.max_to_keep <= 0)
		return 0;
	if ((rc = ck_list_steps(s->dir, 1, &steps, &n)) < 0)
		return rc;
	for (int i = 0; i + s->o.max_to_keep < n && rc == 0; i++) {
		if (steps[i] == s->meta.step)
			continue;
		st_info("removing checkpoint %s/%" PRId64 " (max_num_checkpoints_to_keep=%" PRId64 ")", s->dir,
			steps[i], s->o.max_to_keep);
		rc = remove_committed(s->dir, steps[i]);
	}
	free(steps);
	return rc;
}

/* Process 0: every done record, then the manifest, then pruning. */
static int commit(st_ckpt_saver *s, const char *step_dir)
{
	struct ck_manifest m = {0};
	char path[ST_PATH_MAX], where[ST_PATH_MAX + 32];
	char *text = NULL;
	double deadline = st_mono_s() + s->o.commit_timeout_ms / 1000.0;
	int rc = 0;

	m.step = s->meta.step;
	m.next_sample = s->meta.next_sample;
	m.data_shuffle_seed = s->meta.data_shuffle_seed;
	m.init_weights_seed = s->meta.init_weights_seed;
	m.global_batch = s->meta.global_batch;
	m.process_count = s->o.process_count;
	m.save_id = s->o.save_id;
	m.generation = s->o.generation;
	memcpy(m.mesh, s->meta.mesh, sizeof(m.mesh));
	m.time_unix = (double)time(NULL);
	if (!(m.config_json = strdup(s->meta.config_json))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	for (int p = 0; p < s->o.process_count && rc == 0; p++)
		rc = collect_done(s, step_dir, p, &m, deadline);
	if (rc < 0)
		goto out;
	snprintf(where, sizeof(where), "checkpoint %s", step_dir);
	if ((rc = ck_manifest_check_tiling(&m, where)) < 0 || (rc = ck_manifest_dump(&m, &text)) < 0 ||
	    (rc = st_path_join(path, sizeof(path), step_dir, CK_MANIFEST)) < 0)
		goto out;
	if (s->o.before_commit)
		s->o.before_commit(s->o.hook_arg, m.step);
	/* a newer generation may have started while the done records came */
	if ((rc = ck_fence_check(&s->o, m.step)) < 0 || (rc = st_write_file_atomic(path, text, strlen(text))) < 0 ||
	    (rc = st_fsync_dir(s->dir)) < 0)
		goto out;
	if ((rc = prune(s)) < 0) /* the checkpoint is committed: a pruning failure is only reported */
		st_warn("checkpoint step %" PRId64 " committed, but removing old checkpoints failed: %s", m.step,
			st_errmsg());
	rc = 0;
out:
	free(text);
	ck_manifest_free(&m);
	return rc;
}

static double thread_cpu_s(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
		return 0;
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_job(st_ckpt_saver *s)
{
	char step_dir[ST_PATH_MAX];
	double t0 = st_mono_s(), t1, t2, cpu0 = thread_cpu_s();
	int64_t bytes = 0;
	int rc, wrote;

	if (s->o.before_write)
		s->o.before_write(s->o.hook_arg, s->meta.step);
	rc = ck_fence_check(&s->o, s->meta.step);
	if (rc == 0)
		rc = ck_step_dir(step_dir, sizeof(step_dir), s->dir, s->meta.step);
	if (rc == 0)
		rc = st_mkdir_p(step_dir);
	if (rc == 0)
		rc = write_shard(s, step_dir, &bytes);
	wrote = rc == 0;
	t1 = st_mono_s();
	if (wrote && s->o.process == 0)
		rc = commit(s, step_dir);
	t2 = st_mono_s();
	pthread_mutex_lock(&s->mu);
	s->stats.last_write_s = t1 - t0;
	s->stats.last_commit_s = wrote && s->o.process == 0 ? t2 - t1 : 0;
	s->stats.last_bytes = bytes;
	s->stats.last_direct_bytes = (int64_t)s->defer.direct;
	s->stats.last_bg_cpu_s = thread_cpu_s() - cpu0 + s->defer.crc_cpu_s;
	s->stats.total_bg_cpu_s += s->stats.last_bg_cpu_s;
	if (rc < 0) {
		s->stats.failed++;
		snprintf(s->stats.last_error, sizeof(s->stats.last_error), "%s", st_errmsg());
	} else {
		s->stats.committed++;
	}
	pthread_mutex_unlock(&s->mu);
	s->result = rc;
	if (rc < 0) {
		snprintf(s->errmsg, sizeof(s->errmsg), "checkpoint step %" PRId64 " failed: %s", s->meta.step,
			 st_errmsg());
		st_warn("checkpoint step %" PRId64 " FAILED (%s): %s", s->meta.step,
			s->o.failure_policy == ST_CKPT_FAIL_STOP ? "checkpoint_failure_policy=stop: the run stops"
								 : "checkpoint_failure_policy=continue: training goes on without it",
			st_errmsg());
	}
}

static void *writer_main(void *arg)
{
	st_ckpt_saver *s = arg;
	pthread_setname_np(pthread_self(), "ckpt-writer"); /* for top, perf */
	/* the writer needs little CPU but needs it at once: each write that
	 * completes must be followed by the next while the training keeps
	 * both cores busy (refused without CAP_SYS_NICE: then as before) */
	s->nice0 = getpriority(PRIO_PROCESS, 0);
	setpriority(PRIO_PROCESS, 0, WRITER_NICE);
	run_job(s);
	return NULL;
}

/* ------------------------------------------------------------ the host buffer */

/* Make the host buffer hold at least bytes (aligned for O_DIRECT); the old one is dropped. */
static int reserve(st_ckpt_saver *s, size_t bytes)
{
	void *p;
	size_t cap;
	if (bytes <= s->cap)
		return 0;
	free(s->buf);
	s->buf = NULL;
	s->cap = 0;
	cap = (bytes + CK_SLACK + ST_ATOMIC_FILE_ALIGN - 1) / ST_ATOMIC_FILE_ALIGN * ST_ATOMIC_FILE_ALIGN;
	if (posix_memalign(&p, ST_ATOMIC_FILE_ALIGN, cap) != 0)
		return st_fail(ST_ENOMEM, "checkpoint: out of memory for the host buffer (%zu bytes)", cap);
	s->buf = p;
	s->cap = cap;
	return 0;
}

static void *prefault_main(void *arg)
{
	st_ckpt_saver *s = arg;
	for (size_t i = 0; i < s->cap; i += 4096) /* one write per page */
		((volatile char *)s->buf)[i] = 0;
	return NULL;
}

int st_ckpt_saver_reserve(st_ckpt_saver *s, int n, const st_ckpt_piece *pieces)
{
	size_t bytes = 4096 + (size_t)(n > 0 ? n : 0) * 512; /* the header, generously */
	int rc;
	for (int i = 0; i < n; i++)
		bytes += (size_t)ck_piece_numel(&pieces[i]) * sizeof(float);
	join(s);
	if (bytes <= s->cap)
		return 0;
	if ((rc = reserve(s, bytes)) < 0)
		return rc;
	/* deferred async saves touch only what a release copies (ckpt.h) */
	if (s->o.defer_copy && s->o.async)
		return 0;
	if (pthread_create(&s->thread, NULL, prefault_main, s) == 0)
		s->running = 1;
	else
		prefault_main(s);
	return 0;
}

/* ------------------------------------------------------------ the copy */

struct copy_part {
	const struct seg *segs;
	int nsegs;
	size_t from, to; /* byte range of the concatenation */
};

static void *copy_range(void *arg)
{
	const struct copy_part *c = arg;
	size_t pos = 0;
	for (int i = 0; i < c->nsegs && pos < c->to; i++) {
		const struct seg *g = &c->segs[i];
		size_t lo = c->from > pos ? c->from - pos : 0, hi = c->to - pos < g->n ? c->to - pos : g->n;
		if (lo < hi)
			memcpy(g->dst + lo, g->src + lo, hi - lo);
		pos += g->n;
	}
	return NULL;
}

/* memcpy of bytes [from, to) of the segments, split over a few threads when
 * large (the stall is memory-bound). */
static void parallel_copy(const struct seg *segs, int nsegs, size_t from, size_t to)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = to - from;
	int nt = n < ((size_t)64 << 20) ? 1 : cpus < 1 ? 1 : cpus > MAX_COPY_THREADS ? MAX_COPY_THREADS : (int)cpus;
	pthread_t th[MAX_COPY_THREADS];
	struct copy_part parts[MAX_COPY_THREADS];
	int started[MAX_COPY_THREADS] = {0};

	for (int i = 0; i < nt; i++)
		parts[i] = (struct copy_part){segs, nsegs, from + n / (size_t)nt * (size_t)i,
					      i == nt - 1 ? to : from + n / (size_t)nt * (size_t)(i + 1)};
	for (int i = 1; i < nt; i++)
		started[i] = pthread_create(&th[i], NULL, copy_range, &parts[i]) == 0;
	copy_range(&parts[0]);
	for (int i = 1; i < nt; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		else
			copy_range(&parts[i]);
	}
}

/* ------------------------------------------------------------ the deferred write */

/* The pieces' CRC-32 over the file's bytes from crc_pos up to offset `to`, which p holds. */
static void crc_feed(st_ckpt_saver *s, const char *p, size_t to)
{
	while (s->crc_pos < to && s->crc_cur < s->npieces) {
		const struct job_piece *q = &s->pieces[s->crc_cur];
		size_t end = q->off + q->nbytes < to ? q->off + q->nbytes : to;
		if (s->crc_pos < end) {
			s->crc[s->crc_cur] = st_crc32(s->crc[s->crc_cur], p, end - s->crc_pos);
			p += end - s->crc_pos;
			s->crc_pos = end;
		}
		if (s->crc_pos >= q->off + q->nbytes)
			s->crc_cur++;
	}
}

static int add_extent(struct extent *ext, size_t *n, size_t from, size_t to, const char *src)
{
	struct extent *last = *n ? &ext[*n - 1] : NULL;
	if (from == to)
		return 0;
	if (last && last->to == from && (src ? last->src && last->src + (last->to - last->from) == src : !last->src)) {
		last->to = to; /* contiguous on both sides: one extent */
		return 0;
	}
	ext[(*n)++] = (struct extent){from, to, src};
	return 1;
}

/*
 * The deferred write's extents for d's segments, the data starting at file
 * offset data0 (block-aligned), for blocks of A bytes (the file's O_DIRECT
 * alignment; 1 for buffered writes): the block-aligned middle of every run of
 * pieces that lie back to back in memory goes straight from that memory when
 * its address is block-aligned too; the rest (the runs' unaligned ends, runs
 * at unaligned addresses) goes through the host buffer. So every extent but
 * the last starts and ends on a block boundary, as O_DIRECT needs. Then cut
 * into WRITE_CHUNK pieces. ST_ENOMEM.
 */
static int plan_extents(struct defer *d, size_t data0, size_t A)
{
	size_t nreg = 0, pos = 0, cap = 0;
	struct extent *reg = calloc(3 * (size_t)d->nsegs + 1, sizeof(*reg));
	if (!reg)
		return st_fail(ST_ENOMEM, "out of memory");
	for (int i = 0; i < d->nsegs;) {
		const char *src = d->segs[i].src;
		size_t from = pos, to = pos;
		do /* a run: pieces back to back in memory */
			to += d->segs[i++].n;
		while (i < d->nsegs && d->segs[i].src == src + (to - from));
		size_t a = (data0 + from + A - 1) / A * A - data0, b = (data0 + to) / A * A - data0;
		if (b > a && (uintptr_t)(src + (a - from)) % A == 0) {
			add_extent(reg, &nreg, from, a, NULL);
			add_extent(reg, &nreg, a, b, src + (a - from));
			add_extent(reg, &nreg, b, to, NULL);
		} else {
			add_extent(reg, &nreg, from, to, NULL);
		}
		pos = to;
	}
	for (size_t r = 0; r < nreg; r++)
		cap += (reg[r].to - reg[r].from + WRITE_CHUNK - 1) / WRITE_CHUNK;
	if (!(d->ext = calloc(cap + 1, sizeof(*d->ext)))) {
		free(reg);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	d->n = 0;
	for (size_t r = 0; r < nreg; r++)
		for (size_t at = reg[r].from; at < reg[r].to; at += WRITE_CHUNK) {
			size_t end = reg[r].to - at < WRITE_CHUNK ? reg[r].to : at + WRITE_CHUNK;
			d->ext[d->n++] = (struct extent){at, end, reg[r].src ? reg[r].src + (at - reg[r].from) : NULL};
		}
	free(reg);
	return 0;
}

/* The checksum of bytes [from, to) of the pieces (in order after crc_pos), from the caller's memory. */
static void crc_from_pieces(st_ckpt_saver *s, size_t from, size_t to)
{
	const struct defer *d = &s->defer;
	size_t data0 = s->used - d->total, pos = 0;
	for (int i = 0; i < d->nsegs && pos < to; i++) {
		const struct seg *g = &d->segs[i];
		size_t lo = from > pos ? from - pos : 0, hi = to - pos < g->n ? to - pos : g->n;
		if (lo < hi)
			crc_feed(s, g->src + lo, data0 + pos + hi);
		pos += g->n;
	}
}

static double thread_cpu_s(void);

/* The checksum thread: the extents in order, from the caller's memory, until done or a release. */
static void *crc_main(void *arg)
{
	st_ckpt_saver *s = arg;
	struct defer *d = &s->defer;
	double cpu0 = thread_cpu_s();
	setpriority(PRIO_PROCESS, 0, s->nice0); /* not the writer's: this one computes */
	for (;;) {
		pthread_mutex_lock(&d->mu);
		if (d->takeover || d->crc_next == d->n) {
			pthread_mutex_unlock(&d->mu);
			d->crc_cpu_s = thread_cpu_s() - cpu0;
			return NULL;
		}
		const struct extent *e = &d->ext[d->crc_next++];
		d->crc_inflight = 1;
		pthread_mutex_unlock(&d->mu);
		crc_from_pieces(s, e->from, e->to);
		pthread_mutex_lock(&d->mu);
		d->crc_inflight = 0;
		pthread_cond_broadcast(&d->cv);
		pthread_mutex_unlock(&d->mu);
	}
}

/*
 * The writer's part of a deferred save, after the header: the extents in
 * order (an unaligned one copied into the host buffer first), while
 * crc_main checksums them. Stops when the release takes over, then writes
 * and checksums what the release copied into the host buffer. Write errors
 * are f's (sticky); ST_ENOMEM when the plan cannot be made.
 */
static int defer_write(st_ckpt_saver *s, st_atomic_file *f)
{
	struct defer *d = &s->defer;
	size_t data0 = s->used - d->total, first;
	char *img = s->buf + data0;
	pthread_t crc_thread;
	int rc = 0, crc_started, werr = 0;
	pthread_mutex_lock(&d->mu);
	if (!d->takeover)
		rc = plan_extents(d, data0, st_atomic_file_align(f));
	pthread_mutex_unlock(&d->mu);
	if (rc < 0) /* a release copies all: nothing was planned */
		return rc;
	crc_started = !d->given_crc && pthread_create(&crc_thread, NULL, crc_main, s) == 0;
	while (!werr) {
		pthread_mutex_lock(&d->mu);
		if (d->takeover || d->next == d->n) {
			pthread_mutex_unlock(&d->mu);
			break;
		}
		const struct extent *e = &d->ext[d->next++];
		d->inflight = 1;
		pthread_mutex_unlock(&d->mu);
		const char *p = e->src;
		if (!p) {
			struct copy_part part = {d->segs, d->nsegs, e->from, e->to};
			copy_range(&part);
			p = img + e->from;
		} else {
			d->direct += e->to - e->from;
		}
		werr = st_atomic_file_write(f, p, e->to - e->from) < 0; /* sticky: the commit reports it */
		pthread_mutex_lock(&d->mu);
		d->inflight = 0;
		pthread_cond_broadcast(&d->cv);
		pthread_mutex_unlock(&d->mu);
	}
	if (crc_started) {
		pthread_join(crc_thread, NULL);
	} else if (!d->given_crc) {
		crc_main(s); /* on this thread: its CPU time is this thread's */
		d->crc_cpu_s = 0;
	}
	pthread_mutex_lock(&d->mu);
	while (d->takeover && !d->copied)
		pthread_cond_wait(&d->cv, &d->mu);
	first = d->takeover ? d->taken : d->total;
	pthread_mutex_unlock(&d->mu);
	if (werr)
		return 0;
	if (s->crc_pos < data0 + d->total) /* the release copied from here on too */
		crc_feed(s, img + (s->crc_pos - data0), data0 + d->total);
	if (first < d->total)
		st_atomic_file_write(f, img + first, d->total - first);
	s->have_crc = 1;
	return 0;
}

int st_ckpt_saver_release(st_ckpt_saver *s, double *held_s)
{
	struct defer *d = &s->defer;
	double t0 = st_mono_s();
	size_t from;
	*held_s = 0;
	if (!d->pending)
		return 0;
	/* stop the writer and the checksum, wait for the extent each has in flight ... */
	pthread_mutex_lock(&d->mu);
	d->takeover = 1;
	if (!d->ext) {
		d->taken = from = 0;
	} else {
		size_t w = d->next < d->n ? d->ext[d->next].from : d->total;
		size_t c = d->crc_next < d->n && !d->given_crc ? d->ext[d->crc_next].from : d->total;
		d->taken = w;
		from = c < w ? c : w;
		d->next = d->crc_next = d->n;
	}
	while (d->inflight || d->crc_inflight)
		pthread_cond_wait(&d->cv, &d->mu);
	pthread_mutex_unlock(&d->mu);
	/* ... then copy what either has not reached, on a few threads (memory-bound) */
	if (from < d->total)
		parallel_copy(d->segs, d->nsegs, from, d->total);
	pthread_mutex_lock(&d->mu);
	d->copied = 1;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->mu);
	d->pending = 0;
	*held_s = st_mono_s() - t0;
	pthread_mutex_lock(&s->mu);
	s->stats.last_hold_s = *held_s;
	pthread_mutex_unlock(&s->mu);
	return 1;
}

static int piece_key(const st_ckpt_piece *p, char **out)
{
	char box[128];
	struct ck_box b = ck_piece_box(p);
	int whole = 1;
	for (int d = 0; d < p->ndim; d++)
		whole &= p->offset[d] == 0 && p->shape[d] == p->global_shape[d];
	if (whole)
		*out = strdup(p->name);
	else if (asprintf(out, "%s%s", p->name, ck_box_str(&b, box, sizeof(box))) < 0)
		*out = NULL;
	return *out ? 0 : st_fail(ST_ENOMEM, "out of memory");
}

static int check_args(const st_ckpt_saver *s, const st_ckpt_meta *meta, int n, const st_ckpt_piece *pieces)
{
	int rc;
	if (!meta || meta->step < 0)
		return st_fail(ST_EINVAL, "checkpoint: step must be >= 0");
	if (n < 0 || (n > 0 && !pieces))
		return st_fail(ST_EINVAL, "checkpoint step %" PRId64 ": bad piece list", meta->step);
	if (s->o.process == 0 && !meta->config_json)
		return st_fail(ST_EINVAL, "checkpoint step %" PRId64 ": process 0 must pass the resolved config",
			       meta->step);
	if (!memchr(meta->mesh, '\0', sizeof(meta->mesh)))
		return st_fail(ST_EINVAL, "checkpoint step %" PRId64 ": mesh string is not terminated", meta->step);
	for (int i = 0; i < n; i++)
		if ((rc = ck_check_piece(&pieces[i], "checkpoint")) < 0)
			return rc;
	return 0;
}

int st_ckpt_save(st_ckpt_saver *s, const st_ckpt_meta *meta, int n, const st_ckpt_piece *pieces)
{
	char step_dir[ST_PATH_MAX], path[ST_PATH_MAX], fname[64];
	double t0 = st_mono_s(), t1, t2;
	struct seg *segs = NULL;
	char *hdr = NULL;
	size_t total = 0, hlen = 0;
	int rc;

	join(s);
	t1 = st_mono_s();
	if ((rc = consume_result(s)) < 0)
		return rc;
	free_job(s);
	if ((rc = check_args(s, meta, n, pieces)) < 0)
		return rc;
	if ((rc = ck_step_dir(step_dir, sizeof(step_dir), s->dir, meta->step)) < 0 ||
	    (rc = st_path_join(path, sizeof(path), step_dir, CK_MANIFEST)) < 0)
		return rc;
	if (st_file_exists(path)) {
		st_info("checkpoint step %" PRId64 " already exists in %s; not saving it again", meta->step, s->dir);
		pthread_mutex_lock(&s->mu);
		s->stats.skipped++;
		pthread_mutex_unlock(&s->mu);
		return 0;
	}

	/* the job: meta, piece descriptors, one host buffer (kept between saves) */
	s->meta.step = meta->step;
	s->meta.next_sample = meta->next_sample;
	s->meta.data_shuffle_seed = meta->data_shuffle_seed;
	s->meta.init_weights_seed = meta->init_weights_seed;
	s->meta.global_batch = meta->global_batch;
	memcpy(s->meta.mesh, meta->mesh, sizeof(s->meta.mesh));
	if (meta->config_json && !(s->meta.config_json = strdup(meta->config_json)))
		goto nomem;
	if (!(s->pieces = calloc((size_t)n + 1, sizeof(*s->pieces))) || !(segs = calloc((size_t)n + 1, sizeof(*segs))))
		goto nomem;
	for (int i = 0; i < n; i++) {
		const st_ckpt_piece *p = &pieces[i];
		struct job_piece *j = &s->pieces[i];
		s->npieces = i + 1;
		if (!(j->name = strdup(p->name)) || piece_key(p, &j->key) < 0)
			goto nomem;
		for (int k = 0; k < i; k++)
			if (strcmp(s->pieces[k].key, j->key) == 0) {
				rc = st_fail(ST_EINVAL, "checkpoint step %" PRId64 ": piece %s is passed twice", meta->step,
					     j->key);
				goto fail;
			}
		j->ndim = p->ndim;
		j->gshape[0] = p->global_shape[0];
		j->gshape[1] = p->ndim == 2 ? p->global_shape[1] : 0;
		j->box = ck_piece_box(p);
		j->off = total;
		j->nbytes = (size_t)ck_piece_numel(p) * sizeof(float);
		total += j->nbytes;
	}
	/* the host buffer is the shard file's image: header, then the pieces */
	ck_shard_name(fname, sizeof(fname), s->o.generation, s->o.process, s->o.process_count);
	if ((rc = st_path_join(path, sizeof(path), step_dir, fname)) < 0 || (rc = build_header(s, path, &hdr, &hlen)) < 0)
		goto fail;
	for (int i = 0; i < n; i++)
		s->pieces[i].off += hlen;
	if ((rc = reserve(s, hlen + total)) < 0)
		goto fail;
	s->used = hlen + total;
	memcpy(s->buf, hdr, hlen);
	free(hdr);
	hdr = NULL;
	int given = n > 0;
	for (int i = 0; i < n; i++) {
		segs[i] = (struct seg){s->buf + s->pieces[i].off, (const char *)pieces[i].data, s->pieces[i].nbytes};
		given &= pieces[i].has_crc32 != 0;
	}
	if (!(s->crc = calloc((size_t)n + 1, sizeof(*s->crc))))
		goto nomem;
	for (int i = 0; given && i < n; i++)
		s->crc[i] = pieces[i].crc32;
	s->have_crc = given;
	s->defer.given_crc = given;
	if (s->o.defer_copy && s->o.async) {
		/* the writer writes from the pieces; the caller keeps them until st_ckpt_saver_release */
		s->defer.segs = segs;
		s->defer.nsegs = n;
		s->defer.total = total;
		s->defer.next = s->defer.n = s->defer.crc_next = s->defer.taken = 0;
		s->defer.takeover = s->defer.inflight = s->defer.crc_inflight = s->defer.copied = 0;
		s->crc_pos = given ? hlen + total : hlen; /* given: nothing to checksum */
		s->crc_cur = given ? n : 0;
		s->defer.pending = 1;
	} else {
		parallel_copy(segs, n, 0, total);
		free(segs);
	}
	segs = NULL;
	t2 = st_mono_s();

	pthread_mutex_lock(&s->mu);
	s->stats.saves++;
	s->stats.last_step = meta->step;
	s->stats.last_wait_s = t1 - t0;
	s->stats.last_copy_s = s->defer.pending ? 0 : t2 - t1;
	s->stats.last_stall_s = t2 - t0;
	s->stats.last_hold_s = 0;
	s->stats.last_crc_given = given;
	pthread_mutex_unlock(&s->mu);

	atomic_store(&s->abort, 0);
	if (s->o.async) {
		if (pthread_create(&s->thread, NULL, writer_main, s) == 0) {
			s->running = 1;
			return 0;
		}
		st_warn("checkpoint step %" PRId64 ": cannot start the background writer; saving synchronously",
			meta->step);
	}
	run_job(s);
	s->defer.pending = 0; /* run_job wrote every extent */
	return consume_result(s);
nomem:
	rc = st_fail(ST_ENOMEM, "checkpoint step %" PRId64 ": out of memory for host buffers (%zu bytes)", meta->step,
		     total);
fail:
	free(segs);
	free(hdr);
	free_job(s);
	return rc;
}

/* ------------------------------------------------------------ cleanup */

int st_ckpt_cleanup(const char *dir)
{
	char sd[ST_PATH_MAX], mp[ST_PATH_MAX];
	int64_t *steps;
	int n, rc, removed = 0, first = 0;

	if ((rc = ck_list_steps(dir, 0, &steps, &n)) < 0)
		return rc;
	for (int i = 0; i < n; i++) {
		if ((rc = ck_step_dir(sd, sizeof(sd), dir, steps[i])) < 0 || (rc = st_path_join(mp, sizeof(mp), sd, CK_MANIFEST)) < 0)
			break;
		if (st_file_exists(mp))
			continue;
		st_warn("removing uncommitted checkpoint %s (no manifest: its save did not finish)", sd);
		if ((rc = st_remove_dir(sd)) < 0 && first == 0)
			first = rc;
		removed++;
	}
	free(steps);
	if (rc == 0 && first == 0 && removed)
		rc = st_fsync_dir(dir);
	return rc < 0 ? rc : first;
}
