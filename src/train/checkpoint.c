#include "train/checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/file.h"

/* The weight pieces as ranges of the shard, the moments' pieces the same
 * ranges of m and v: then the update can checksum them (k->request). */
static int crc_ranges(st_run_ckpt *k, const st_shard *sh)
{
	int nr = k->npieces / 3;
	k->request = (st_adamw_crc){0};
	if (k->npieces <= 0 || k->npieces % 3)
		return 0;
	k->start = malloc((size_t)nr * 2 * sizeof(int64_t));
	k->crc = malloc((size_t)nr * 3 * sizeof(uint32_t));
	if (!k->start || !k->crc)
		return st_fail(ST_ENOMEM, "out of memory (checkpoint checksums)");
	k->len = k->start + nr;
	const float *block[3] = {sh->p, sh->m, sh->v};
	int ok = 1;
	for (int j = 0; j < nr; j++) {
		const st_ckpt_piece *pc = &k->pieces[j];
		k->start[j] = pc->data - sh->p;
		k->len[j] = pc->shape[0] * (pc->ndim == 2 ? pc->shape[1] : 1);
		ok &= k->start[j] >= (j ? k->start[j - 1] + k->len[j - 1] : 0) && k->start[j] + k->len[j] <= sh->n;
		for (int b = 1; b < 3; b++) {
			const st_ckpt_piece *q = &k->pieces[b * nr + j];
			ok &= q->data == block[b] + k->start[j] && q->ndim == pc->ndim && q->shape[0] == pc->shape[0] &&
			      q->shape[1] == pc->shape[1];
		}
	}
	if (ok)
		k->request = (st_adamw_crc){.nranges = nr, .start = k->start, .len = k->len, .crc = k->crc};
	return 0;
}

int st_run_ckpt_set_kernels(st_run_ckpt *k, const st_kplan *plan)
{
	if (!k->config_json || k->c->dtype != ST_DTYPE_BF16)
		return 0;
	char s[ST_KPLAN_STR_MAX];
	st_kplan_format(plan, s, sizeof(s));
	json_t *o = json_loads(k->config_json, 0, NULL);
	char *out = NULL;
	if (o && json_object_set_new(o, "bf16_kernels", json_string(s)) == 0)
		out = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!out)
		return st_fail(ST_ENOMEM, "out of memory (the checkpoint's config)");
	free(k->config_json);
	k->config_json = out;
	return 0;
}

int st_run_ckpt_open(st_run_ckpt *k, const st_config *c, st_shard *sh, st_llama *m, const st_par *p,
		     const st_kplan *plan, int64_t generation, const st_test_knobs *knobs)
{
	char fence[ST_PATH_MAX];
	*k = (st_run_ckpt)ST_RUN_CKPT_INIT;
	k->c = c;
	int rc = st_ckpt_run_dir(c, k->dir, sizeof(k->dir));
	if (rc < 0 || !c->enable_checkpointing)
		return rc;
	st_ckpt_opts o;
	if ((rc = st_ckpt_opts_from_config(&o, c, p->rank, p->world)) < 0)
		return rc;
	/* the copy of a save runs in the background during the next step's
	 * forward and backward, which only read the state; the trainer releases
	 * it before the update (st_run_ckpt_before_update) */
	o.defer_copy = 1;
	/* an old generation's workers (a host partitioned away, come back) commit nothing */
	o.generation = generation;
	if (generation >= 0) {
		if ((rc = st_ckpt_fence_path(c, fence, sizeof(fence))) < 0)
			return rc;
		o.fence = fence;
	}
	if (knobs && knobs->save_delay_s > 0) { /* SLICETRAIN_TEST_SAVE_SECONDS: slow saves, for tests */
		o.before_write = st_test_knobs_before_save;
		o.hook_arg = (void *)knobs;
	}
	if ((rc = st_ckpt_saver_create(&k->saver, &o)) < 0)
		return rc;
	/* nobody saves before process 0 has removed uncommitted steps */
	if ((rc = st_comm_barrier(p->world_comm)) < 0)
		return rc;
	if ((rc = st_config_to_json(c, &k->config_json)) < 0 || (plan && (rc = st_run_ckpt_set_kernels(k, plan)) < 0))
		return rc;
	if ((rc = st_shard_pieces(sh, m, p, 1, 1, &k->pieces, &k->npieces)) < 0)
		return rc;
	return crc_ranges(k, sh);
}

int st_run_ckpt_reserve(st_run_ckpt *k)
{
	return k->saver ? st_ckpt_saver_reserve(k->saver, k->npieces, k->pieces) : 0;
}

/* The bf16 kernel plan a checkpoint's run used (its config's bf16_kernels,
 * when explicit). */
static void kernels_from_meta(st_run_restored *r, const st_ckpt_meta *meta)
{
	r->kernels[0] = 0;
	json_t *o = meta->config_json ? json_loads(meta->config_json, 0, NULL) : NULL;
	const char *s = json_string_value(json_object_get(o, "bf16_kernels"));
	if (s && !st_kplan_is_auto(s) && strlen(s) < sizeof(r->kernels))
		snprintf(r->kernels, sizeof(r->kernels), "%s", s);
	json_decref(o);
}

int st_run_ckpt_restore(st_run_ckpt *k, st_shard *sh, st_llama *m, const st_par *p, int64_t global_batch,
			int batch_may_scale, int lead, st_run_restored *r)
{
	const st_config *c = k->c;
	st_ckpt_piece *pieces = NULL;
	int n = 0, found = 0, rc;
	st_ckpt_meta meta = {0};
	int params_only = !c->enable_checkpointing && !c->load_full_state_path[0];
	memset(r, 0, sizeof(*r));
	if (params_only && !c->load_parameters_path[0])
		return 0;
	if ((rc = st_shard_pieces(sh, m, p, 1, 0, &pieces, &n)) < 0)
		return rc;
	double t0 = st_mono_s();
	if (c->enable_checkpointing)
		rc = st_ckpt_restore_latest(k->dir, p->world_comm, &meta, n, pieces, &found);
	if (rc == 0 && !found && c->load_full_state_path[0]) {
		rc = st_ckpt_restore_step(c->load_full_state_path, p->world_comm, &meta, n, pieces);
		found = rc == 0;
	}
	if (rc == 0 && found) /* a resumed run keeps the batch it was trained with */
		rc = st_ckpt_check_resume(&meta, c, global_batch, batch_may_scale);
	if (rc == 0 && found) {
		r->step = meta.step;
		r->next_sample = meta.next_sample;
		if (lead)
			st_info("restored step %lld (saved on %s; next sample %lld): %.1f MB in %.3f s (%.0f MB/s; "
				"%.1f MB read straight into the state)",
				(long long)meta.step, meta.mesh, (long long)meta.next_sample, 3.0 * 4e-6 * (double)sh->n,
				st_mono_s() - t0, 3.0 * 4e-6 * (double)sh->n / (st_mono_s() - t0),
				1e-6 * (double)meta.bytes_direct);
		kernels_from_meta(r, &meta);
		if (meta.data_shuffle_seed != c->data_shuffle_seed)
			st_warn("data_shuffle_seed changed from %lld (checkpoint) to %lld: the data order changes, "
				"samples may repeat or be skipped",
				(long long)meta.data_shuffle_seed, (long long)c->data_shuffle_seed);
	} else if (rc == 0 && c->load_parameters_path[0]) {
		/* parameters only: the first third of the pieces */
		rc = st_ckpt_load_params(c->load_parameters_path, c, p->world_comm, sh->ntensors, pieces);
		if (rc == 0 && lead)
			st_info("loaded parameters from %s", c->load_parameters_path);
		found = rc == 0;
	}
	st_ckpt_meta_release(&meta);
	st_shard_pieces_free(pieces, n);
	r->found = rc == 0 && found;
	return rc;
}

int st_run_ckpt_due(const st_run_ckpt *k, int64_t done)
{
	const st_config *c = k->c;
	return k->saver && ((c->checkpoint_period > 0 && done % c->checkpoint_period == 0) ||
			    (done == c->steps && c->save_checkpoint_on_completion));
}

void st_run_ckpt_before_update(st_run_ckpt *k, int64_t step, int lead)
{
	double held;
	if (k->saver && st_ckpt_saver_release(k->saver, &held) && lead)
		st_info("checkpoint step %lld: the update waited %.3f s for the copy", (long long)step, held);
}

const st_adamw_crc *st_run_ckpt_crc_request(st_run_ckpt *k, int64_t done)
{
	k->crc_done = -1;
	k->crc_for = k->request.nranges > 0 && st_run_ckpt_due(k, done) ? done : -1;
	return k->crc_for >= 0 ? &k->request : NULL;
}

void st_run_ckpt_crc_taken(st_run_ckpt *k, int64_t done)
{
	if (k->crc_for != done)
		return;
	for (int j = 0; j < 3 * k->request.nranges; j++)
		k->pieces[j].crc32 = k->crc[j];
	k->crc_done = done;
	k->crc_for = -1;
}

/* Save the state after `done` completed steps. */
static int save(st_run_ckpt *k, int64_t done, const st_run_state *s)
{
	const st_config *c = k->c;
	st_ckpt_meta meta = {
		.step = done, .next_sample = s->next_sample, .data_shuffle_seed = c->data_shuffle_seed,
		.init_weights_seed = c->init_weights_seed, .global_batch = s->global_batch,
		.config_json = k->config_json,
	};
	snprintf(meta.mesh, sizeof(meta.mesh), "%s", s->mesh);
	/* the update's checksums only if they are of this state */
	for (int j = 0; j < k->npieces; j++)
		k->pieces[j].has_crc32 = k->crc_done == done;
	int rc = st_ckpt_save(k->saver, &meta, k->npieces, k->pieces);
	k->crc_done = -1;
	if (rc == 0 && s->lead) {
		st_ckpt_stats st;
		st_ckpt_saver_stats(k->saver, &st);
		st_info("checkpoint step %lld: training stalled %.3f s (copy %.3f s), writing %s%s", (long long)done,
			st.last_stall_s, st.last_copy_s, c->async_checkpointing ? "in the background" : "done",
			st.last_crc_given ? " (checksums from the update)" : "");
	}
	return rc;
}

int st_run_ckpt_maybe_save(st_run_ckpt *k, int64_t done, const st_run_state *s)
{
	if (!st_run_ckpt_due(k, done))
		return 0;
	int rc = save(k, done, s);
	return rc < 0 ? rc : 1;
}

int st_run_ckpt_stop(st_run_ckpt *k, int64_t done, int saved, int sig, const st_run_state *s, const st_par *p)
{
	int rc = 0;
	if (!k->saver) {
		if (s->lead)
			st_info("stopping after step %lld (signal %d): checkpointing is off, nothing saved",
				(long long)(done - 1), sig);
		return st_fail(ST_EINTR, "stopped by signal %d after step %lld", sig, (long long)(done - 1));
	}
	if (!saved)
		rc = save(k, done, s);
	if (rc == 0)
		rc = st_ckpt_wait(k->saver);
	if (rc < 0)
		return rc;
	/* committed = process 0 wrote its manifest (under checkpoint_failure_policy
	 * continue a failed save is only warned); every process learns it */
	int64_t missing = 0;
	if (s->lead) {
		char path[ST_PATH_MAX + 48];
		snprintf(path, sizeof(path), "%s/%lld/manifest.json", k->dir, (long long)done);
		missing = !st_file_exists(path);
	}
	if ((rc = st_comm_allreduce(p->world_comm, &missing, 1, ST_DTYPE_I64, ST_MAX)) < 0)
		return rc;
	if (missing) {
		st_ckpt_stats st;
		st_ckpt_saver_stats(k->saver, &st);
		return st_fail(ST_EIO, "stopping after step %lld (signal %d): checkpoint %lld was not committed%s%s",
			       (long long)(done - 1), sig, (long long)done, st.last_error[0] ? ": " : "", st.last_error);
	}
	if (s->lead)
		st_info("stopping after step %lld (signal %d): checkpoint %lld saved", (long long)(done - 1), sig,
			(long long)done);
	return st_fail(ST_EINTR, "stopped by signal %d after step %lld", sig, (long long)(done - 1));
}

int st_run_ckpt_finish(st_run_ckpt *k, int lead)
{
	if (!k->saver)
		return 0;
	int rc = st_ckpt_wait(k->saver); /* the last save is committed before we report success */
	if (rc < 0 || !lead)
		return rc;
	st_ckpt_stats st;
	st_ckpt_saver_stats(k->saver, &st);
	if (st.saves > 0)
		st_info("checkpoints: %lld saved, %lld failed; the last: %.1f MB written in %.3f s (%.0f MB/s; "
			"%.1f MB straight from the state), commit %.3f s; background CPU %.3f s per save",
			(long long)st.committed, (long long)st.failed, 1e-6 * (double)st.last_bytes, st.last_write_s,
			1e-6 * (double)st.last_bytes / (st.last_write_s > 0 ? st.last_write_s : 1),
			1e-6 * (double)st.last_direct_bytes, st.last_commit_s,
			st.total_bg_cpu_s / (double)(st.committed + st.failed > 0 ? st.committed + st.failed : 1));
	return 0;
}

void st_run_ckpt_close(st_run_ckpt *k, int failed)
{
	if (k->saver && failed)
		st_ckpt_saver_abort(k->saver);
	st_ckpt_saver_free(k->saver); /* waits for the save in flight */
	st_shard_pieces_free(k->pieces, k->npieces);
	free(k->config_json);
	free(k->start);
	free(k->crc);
	const st_config *c = k->c;
	*k = (st_run_ckpt)ST_RUN_CKPT_INIT;
	k->c = c;
}
