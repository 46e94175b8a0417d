/*
 * restore.c - restoring onto the current mesh: the newest usable committed
 * checkpoint (with fallback and, across processes, agreement on the step),
 * one given step (load_full_state_path), or parameters only
 * (load_parameters_path, a checkpoint or a Hugging Face directory: hf.c).
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Outcome of one try on one process, ordered so that a MAX over processes decides. */
enum { TRY_OK = 0, TRY_UNUSABLE = 1, TRY_HARD = 2 };

/* A MAX of every process's status; without comm, the local one. */
static int agree(st_comm *comm, int local, int *global)
{
	int64_t v = local;
	int rc;
	if (!comm) {
		*global = local;
		return 0;
	}
	if ((rc = st_comm_allreduce(comm, &v, 1, ST_DTYPE_I64, ST_MAX)) < 0)
		return rc;
	*global = (int)v;
	return 0;
}

/* Fail again with the current message under another code. */
static int refail(int code) { return code; }

static int classify(int rc)
{
	if (rc == 0)
		return TRY_OK;
	return rc == ST_EIO ? TRY_UNUSABLE : TRY_HARD;
}

static int64_t total_bytes(int n, const st_ckpt_piece *pieces)
{
	int64_t b = 0;
	for (int i = 0; i < n; i++)
		b += ck_piece_numel(&pieces[i]) * (int64_t)sizeof(float);
	return b;
}

/* Readers working on one restore: tasks are independent (each fills its
 * own destination), so reading, checksumming and the first touch of the
 * destination memory run on several threads. Many more than the cores: a
 * reader that checksums and copies, or waits for a core, has no read in
 * flight (each holds a 4 MB buffer; 4 readers were slower:
 * docs/checkpoint-costs.md). */
#define RESTORE_READERS 8
/* Bytes of one task of a large piece: one read of read.c (its READ_CHUNK),
 * a multiple of the direct reads' alignment (part boundaries are aligned in
 * the file: no block read twice) */
#define RESTORE_PART ((uint64_t)4 << 20)

/*
 * One task of a restore. A requested piece that is exactly one stored piece
 * (a restore onto the mesh that saved it) is read in parts of RESTORE_PART
 * bytes, so that a large tensor is read by several threads at once and the
 * disk always has reads in flight while other threads checksum and copy;
 * the part that completes a piece combines the parts' checksums and checks
 * the piece's. Any other requested piece (resharding) is one task,
 * ck_fill_piece.
 */
struct restore_task {
	int piece;                     /* index of the requested piece */
	const struct ck_tensor *t;     /* NULL: the whole piece through ck_fill_piece */
	const struct ck_piece *stored;
	uint64_t at, len;              /* bytes of the stored piece */
	uint32_t crc;                  /* of those bytes, once read */
	int first, nparts;             /* the piece's tasks */
};

/* The tasks of pieces[0..n) in order (*out malloc'd), or ST_ENOMEM. */
static int plan_tasks(const struct ck_manifest *m, int n, const st_ckpt_piece *pieces, struct restore_task **out,
		      int *count)
{
	struct restore_task *tasks = NULL;
	int ntasks = 0;
	/* pass 0 counts, pass 1 fills */
	for (int pass = 0; pass < 2; pass++) {
		ntasks = 0;
		for (int i = 0; i < n; i++) {
			const struct ck_tensor *t = NULL;
			const struct ck_piece *sp = ck_same_piece(m, &pieces[i], &t);
			struct restore_task k = {.piece = i, .first = ntasks, .nparts = 1};
			if (!sp || sp->nbytes == 0) {
				if (pass)
					tasks[ntasks] = k;
				ntasks++;
				continue;
			}
			/* cuts where the file offset is a multiple of RESTORE_PART past the piece's first block */
			uint64_t base = sp->data_offset / ST_ATOMIC_FILE_ALIGN * ST_ATOMIC_FILE_ALIGN;
			uint64_t end = sp->data_offset + sp->nbytes;
			k.nparts = (int)((end - base + RESTORE_PART - 1) / RESTORE_PART);
			for (int j = 0; j < k.nparts; j++, ntasks++) {
				if (!pass)
					continue;
				uint64_t from = j ? base + (uint64_t)j * RESTORE_PART : sp->data_offset;
				uint64_t to = j + 1 < k.nparts ? base + (uint64_t)(j + 1) * RESTORE_PART : end;
				k.t = t;
				k.stored = sp;
				k.at = from - sp->data_offset;
				k.len = to - from;
				tasks[ntasks] = k;
			}
		}
		if (!pass && !(tasks = malloc((size_t)(ntasks > 0 ? ntasks : 1) * sizeof(*tasks))))
			return st_fail(ST_ENOMEM, "out of memory");
	}
	*out = tasks;
	*count = ntasks;
	return 0;
}

/* Run task i with reader r; *bytes: the bytes it placed. The part that
 * completes its piece checks the piece's checksum (*last: 1). */
static int run_task(struct ck_reader *r, struct restore_task *tasks, int i, int *parts_left, st_ckpt_piece *pieces,
		    int64_t *bytes, int *last)
{
	struct restore_task *k = &tasks[i];
	int rc, left;

	*last = 0;
	if (!k->t) {
		*bytes = ck_piece_numel(&pieces[k->piece]) * (int64_t)sizeof(float);
		return ck_fill_piece(r, &pieces[k->piece]);
	}
	*bytes = (int64_t)k->len;
	if ((rc = ck_read_part(r, k->t, k->stored, k->at, k->len, (char *)pieces[k->piece].data + k->at, &k->crc)) < 0)
		return rc;
#pragma omp atomic capture seq_cst
	left = --parts_left[k->piece];
	if (left > 0)
		return 0;
	uint32_t crc = tasks[k->first].crc;
	for (int j = k->first + 1; j < k->first + k->nparts; j++)
		crc = st_crc32_combine(crc, tasks[j].crc, tasks[j].len);
	*last = 1;
	return ck_check_crc(r, k->t, k->stored, crc);
}

/*
 * Fill pieces[0..n) from the checkpoint in step_dir. Tasks are handed out
 * in increasing order; on failure the error reported is that of the lowest
 * failing task, as a sequential loop would report it (every lower task was
 * handed out before and completes; a checksum mismatch counts as the
 * piece's last part, where a sequential read would find it).
 */
static int read_pieces(const char *step_dir, const struct ck_manifest *m, int n, st_ckpt_piece *pieces,
		       st_progress *prog, int64_t *bytes_direct)
{
	struct restore_task *tasks;
	int ntasks, next = 0, failed = 0, err_rc = 0, err_at, rc;
	char err_msg[1024] = "";

	if ((rc = plan_tasks(m, n, pieces, &tasks, &ntasks)) < 0)
		return rc;
	int *parts_left = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
	if (!parts_left) {
		free(tasks);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	for (int i = 0; i < ntasks; i++)
		parts_left[tasks[i].piece] = tasks[i].nparts;
	err_at = ntasks;
	*bytes_direct = 0;
	int nthreads = ntasks < RESTORE_READERS ? (ntasks > 0 ? ntasks : 1) : RESTORE_READERS;
#pragma omp parallel num_threads(nthreads)
	{
		struct ck_reader r;
		ck_reader_init(&r, step_dir, m);
		for (;;) {
			int i, stop, last;
			int64_t bytes;
#pragma omp atomic read
			stop = failed;
			if (stop)
				break;
#pragma omp atomic capture
			i = next++;
			if (i >= ntasks)
				break;
			int trc = run_task(&r, tasks, i, parts_left, pieces, &bytes, &last);
			int at = last ? tasks[i].first + tasks[i].nparts - 1 : i;
#pragma omp critical(ck_restore_state)
			{
				if (trc < 0 && at < err_at) {
					err_at = at;
					err_rc = trc;
					snprintf(err_msg, sizeof(err_msg), "%s", st_errmsg());
				}
				if (trc == 0)
					st_progress_add(prog, bytes);
			}
			if (trc < 0) {
#pragma omp atomic write
				failed = 1;
			}
		}
#pragma omp atomic
		*bytes_direct += r.bytes_direct;
		ck_reader_release(&r);
	}
	free(parts_left);
	free(tasks);
	return err_rc < 0 ? st_fail(err_rc, "%s", err_msg) : 0;
}

/*
 * Restore step_dir into the pieces. Returns 0, ST_EIO for a damaged
 * checkpoint (bad or unreadable manifest, damaged shard), ST_EINVAL when the
 * request does not fit it, ST_ENOMEM.
 */
static int try_step(const char *step_dir, int64_t step, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces)
{
	struct ck_manifest m;
	st_progress prog;
	char what[64];
	int64_t direct = 0;
	int rc;

	if ((rc = ck_manifest_load(&m, step_dir, step)) < 0)
		return rc == ST_ENOMEM ? rc : refail(ST_EIO); /* a bad manifest: unusable */
	snprintf(what, sizeof(what), "restore of step %" PRId64, m.step);
	st_progress_init(&prog, what, total_bytes(n, pieces));
	rc = read_pieces(step_dir, &m, n, pieces, &prog, &direct);
	if (rc == 0)
		st_progress_end(&prog);
	if (rc == 0 && meta) {
		meta->step = m.step;
		meta->next_sample = m.next_sample;
		meta->data_shuffle_seed = m.data_shuffle_seed;
		meta->init_weights_seed = m.init_weights_seed;
		meta->global_batch = m.global_batch;
		memcpy(meta->mesh, m.mesh, sizeof(meta->mesh));
		meta->config_json = m.config_json;
		meta->bytes_direct = direct;
		m.config_json = NULL;
	}
	ck_manifest_free(&m);
	return rc;
}

static int check_pieces(int n, const st_ckpt_piece *pieces)
{
	int rc;
	if (n < 0 || (n > 0 && !pieces))
		return st_fail(ST_EINVAL, "restore: bad piece list");
	for (int i = 0; i < n; i++)
		if ((rc = ck_check_piece(&pieces[i], "restore")) < 0)
			return rc;
	return 0;
}

/* Process 0 lists the committed steps and every process gets the same list. */
static int candidates(const char *dir, st_comm *comm, int64_t **steps, int *n)
{
	int64_t count = 0;
	int rc = 0, lrc = 0;

	*steps = NULL;
	*n = 0;
	if (!comm || st_comm_rank(comm) == 0) {
		lrc = ck_list_steps(dir, 1, steps, n);
		count = lrc < 0 ? -1 : *n;
	}
	if (!comm)
		return lrc;
	if ((rc = st_comm_broadcast(comm, &count, sizeof(count), 0)) < 0)
		goto fail;
	if (count < 0) {
		rc = lrc < 0 ? lrc : st_fail(ST_EIO, "%s: process 0 could not list the checkpoints", dir);
		goto fail;
	}
	if (st_comm_rank(comm) != 0 && count > 0 && !(*steps = calloc((size_t)count, sizeof(int64_t))))
		count = -2; /* still take part in the broadcast below, then fail */
	if (count > 0 && *steps && (rc = st_comm_broadcast(comm, *steps, (size_t)count * sizeof(int64_t), 0)) < 0)
		goto fail;
	if (count == -2) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto fail;
	}
	*n = (int)count;
	return 0;
fail:
	free(*steps);
	*steps = NULL;
	*n = 0;
	return rc;
}

/* Move a damaged checkpoint aside, so that it is neither loaded nor "already saved" again. */
static void quarantine(const char *dir, int64_t step)
{
	char from[ST_PATH_MAX], to[ST_PATH_MAX + 64];
	if (ck_step_dir(from, sizeof(from), dir, step) < 0)
		return;
	snprintf(to, sizeof(to), "%s.unusable-%lld", from, (long long)time(NULL));
	if (rename(from, to) == 0)
		st_warn("moved the unusable checkpoint %s to %s (kept for inspection; it is never loaded)", from, to);
	else
		st_warn("could not move the unusable checkpoint %s aside: %s", from, strerror(errno));
}

int st_ckpt_restore_latest(const char *dir, st_comm *comm, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces,
			   int *found)
{
	char step_dir[ST_PATH_MAX], last[1024] = "";
	int64_t *steps = NULL;
	int nsteps = 0, rc, global, local;
	int leader = !comm || st_comm_rank(comm) == 0;

	*found = 0;
	if (meta)
		meta->config_json = NULL;
	local = classify(check_pieces(n, pieces));
	snprintf(last, sizeof(last), "%s", st_errmsg());
	if ((rc = agree(comm, local, &global)) < 0)
		return rc;
	if (local != TRY_OK)
		return st_fail(ST_EINVAL, "%s", last);
	if (global != TRY_OK)
		return st_fail(ST_EINVAL, "restore: another process passed invalid pieces (see its log)");
	last[0] = '\0';
	if ((rc = candidates(dir, comm, &steps, &nsteps)) < 0)
		return rc;
	for (int i = nsteps - 1; i >= 0; i--) {
		st_ckpt_meta got = {0};
		if ((rc = ck_step_dir(step_dir, sizeof(step_dir), dir, steps[i])) < 0)
			goto out; /* the same on every process: it depends only on dir and the list */
		local = classify(try_step(step_dir, steps[i], &got, n, pieces));
		if (local != TRY_OK)
			snprintf(last, sizeof(last), "%s", st_errmsg());
		if ((rc = agree(comm, local, &global)) < 0) {
			st_ckpt_meta_release(&got);
			goto out;
		}
		if (global == TRY_OK) {
			if (i < nsteps - 1)
				st_warn("restored checkpoint step %" PRId64 " from %s: the %d newer one%s could not be used",
					steps[i], dir, nsteps - 1 - i, nsteps - 1 - i == 1 ? "" : "s");
			if (leader)
				for (int j = i + 1; j < nsteps; j++)
					quarantine(dir, steps[j]);
			if (meta)
				*meta = got;
			else
				st_ckpt_meta_release(&got);
			*found = 1;
			goto out;
		}
		st_ckpt_meta_release(&got);
		if (global == TRY_HARD) {
			if (local == TRY_HARD)
				rc = st_fail(ST_EINVAL, "%s", last);
			else
				rc = st_fail(ST_EINVAL, "checkpoint %s: another process could not restore it (see its log)",
					     step_dir);
			goto out;
		}
		if (local == TRY_UNUSABLE)
			st_warn("checkpoint %s is unusable: %s; %s", step_dir, last,
				i > 0 ? "falling back to the previous one" : "no older checkpoint left");
		else
			st_warn("checkpoint %s is unusable on another process (see its log); %s", step_dir,
				i > 0 ? "falling back to the previous one" : "no older checkpoint left");
	}
	if (nsteps > 0)
		rc = st_fail(ST_EINVAL, "no usable checkpoint in %s: all %d committed checkpoint%s (steps %" PRId64
			     "..%" PRId64 ") are damaged%s%s; refusing to train on them", dir, nsteps,
			     nsteps == 1 ? "" : "s", steps[0], steps[nsteps - 1], last[0] ? "; last problem: " : "", last);
out:
	free(steps);
	return rc;
}

/* One given step directory, no fallback; with comm, all fail together. */
static int restore_one(const char *step_dir, st_comm *comm, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces,
		       const st_config *hf_model)
{
	char path[ST_PATH_MAX], msg[1024];
	int rc, rc2, local, global;

	if (meta)
		meta->config_json = NULL;
	rc = check_pieces(n, pieces);
	if (rc == 0 && hf_model)
		rc = ck_hf_load(step_dir, hf_model, n, pieces);
	else if (rc == 0 && (rc = st_path_join(path, sizeof(path), step_dir, CK_MANIFEST)) == 0) {
		if (!st_file_exists(path))
			rc = st_fail(ST_EINVAL, "%s is not a committed slicetrain checkpoint (no %s)", step_dir,
				     CK_MANIFEST);
		else
			rc = try_step(step_dir, -1, meta, n, pieces);
	}
	local = classify(rc);
	snprintf(msg, sizeof(msg), "%s", st_errmsg());
	if ((rc2 = agree(comm, local, &global)) < 0)
		return rc2;
	if (global == TRY_OK)
		return 0;
	if (meta)
		st_ckpt_meta_release(meta);
	if (local != TRY_OK)
		return st_fail(rc, "%s", msg);
	return st_fail(ST_EINVAL, "%s: another process could not load it (see its log)", step_dir);
}

int st_ckpt_restore_step(const char *step_dir, st_comm *comm, st_ckpt_meta *meta, int n, st_ckpt_piece *pieces)
{
	return restore_one(step_dir, comm, meta, n, pieces, NULL);
}

int st_ckpt_load_params(const char *path, const st_config *c, st_comm *comm, int n, st_ckpt_piece *pieces)
{
	char p[ST_PATH_MAX];
	int hf = 0;

	if (st_path_join(p, sizeof(p), path, CK_MANIFEST) == 0 && !st_file_exists(p) &&
	    st_path_join(p, sizeof(p), path, "config.json") == 0 && st_file_exists(p))
		hf = 1;
	if (!hf && st_path_join(p, sizeof(p), path, CK_MANIFEST) == 0 && !st_file_exists(p)) {
		int64_t *steps;
		int nsteps = 0;
		char hint[ST_PATH_MAX + 64] = "";
		if (ck_list_steps(path, 1, &steps, &nsteps) == 0 && nsteps > 0)
			snprintf(hint, sizeof(hint), " (it holds checkpoint steps: name one, e.g. %s/%" PRId64 ")", path,
				 steps[nsteps - 1]);
		free(steps);
		/* every process fails alike, so no agreement is needed */
		return st_fail(ST_EINVAL, "load_parameters_path %s: neither a committed slicetrain checkpoint step "
			       "directory (%s) nor a Hugging Face model directory (config.json)%s", path, CK_MANIFEST,
			       hint);
	}
	return restore_one(path, comm, NULL, n, pieces, hf ? c : NULL);
}
