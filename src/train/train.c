#include "train/train.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/crc.h"
#include "base/err.h"
#include "base/path.h"
#include "ckpt/ckpt.h"
#include "data/data.h"
#include "elastic/worker.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16.h"
#include "comm/comm.h"
#include "comm/mesh.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "train/eval.h"
#include "train/flops.h"
#include "train/summary.h"
#include "shard/fsdp.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

typedef struct trainer {
	const st_config *c;
	st_group *group;
	st_par par;
	st_llama model;
	st_shard shard;   /* this process's part of weights, gradients, AdamW moments */
	st_fsdp *fsdp;    /* ZeRO-3 gathers when fsdp > 1, else NULL (resident model) */
	st_dataset *data;
	int32_t *tokens;  /* one micro-batch of this batch shard: rows x (T+1) */
	int64_t B, T;     /* per_device_batch_size, sequence length */
	int64_t rows;     /* rows per micro-batch of a batch shard: B x tensor */
	int64_t accum;    /* micro-batches per step: gradient_accumulation_steps, or more
			     on fewer devices under an elastic controller (elastic_accum) */
	int64_t G;        /* global rows per step: B x devices x accum */
	float *gsum;      /* accum > 1, resident model: the sum of the step's finished
			     micro-batch gradients (train_step) */
	int64_t max_devices; /* SLICETRAIN_ELASTIC_MAX_DEVICES, 0 when not elastic */
	int lead;         /* this process prints the log line and writes metrics */
	FILE *metrics;
	st_eval eval;     /* the eval data (eval_interval > 0) */
	/* TensorBoard (rank 0, enable_tensorboard): one event file per group this process leads */
	st_tfevents *tb;
	int tb_started;      /* the file holds the start summaries */
	int64_t tb_events;   /* metrics_file bytes read for the controller's events; -1: none yet */
	int64_t generation;  /* elastic generation (SLICETRAIN_GENERATION, then reforms), -1: none */
	char origin[200];    /* where this group's state came from, for the start summary */
	st_flops flops;
	int64_t step0;    /* first step of this run (after a restore) */
	int64_t sample0;  /* global sample index of step0's first sample */
	/* checkpoints */
	char ckpt_dir[ST_PATH_MAX];
	st_ckpt_saver *saver;
	st_ckpt_piece *save_pieces; /* what this process writes */
	int nsave_pieces;
	int64_t crc_done; /* save_pieces' crc32 values are of the state after this many steps; -1: none */
	char *config_json;
	char mesh_desc[256];
	/* dtype bfloat16: the kernel plan (model/kplan.h) */
	int kernels_set;                      /* t->model.kplan is decided */
	char ckpt_kernels[ST_KPLAN_STR_MAX];  /* the restored checkpoint's plan, "" none */
	FILE *sample_log; /* SLICETRAIN_SAMPLE_LOG: "step sample" per row read */
	double min_step_s; /* SLICETRAIN_MIN_STEP_SECONDS: a step lasts at least this long; 0: no floor */
	/* elastic re-formation in place (docs/elastic.md) */
	st_worker_ctl *ctl; /* the agent's control channel, NULL without one */
	int64_t done;       /* completed steps this process's state holds; -1: none yet (a joiner) */
	st_reform pending;  /* a reform message taken at a step boundary */
	int have_pending;
} trainer;

#define REFORM_WAIT_MS 60000 /* after a peer failure, how long to wait for the agent's reform */

static const char *remat_name(enum st_remat r)
{
	return r == ST_REMAT_FULL ? "full" : r == ST_REMAT_MINIMAL ? "minimal" : "none";
}

/* Shape and cost, printed before any large allocation so that a model too big
 * for this machine still shows what it would be. */
static void print_header(const trainer *t)
{
	const st_config *c = t->c;
	st_info("Per train step: Total TFLOPs: %.3f, split as %.2f%% learnable weight flops and "
		"%.2f%% attention flops",
		t->flops.total / 1e12, 100 * t->flops.weights / t->flops.total,
		100 * t->flops.attention / t->flops.total);
	st_info("batch %lld x %lld tokens per device, gradient accumulation %lld, remat %s, %s, %d threads",
		(long long)t->B, (long long)t->T, (long long)t->accum,
		remat_name(c->remat_policy),
		c->dtype == ST_DTYPE_BF16 ? "bf16 activations and products (per bf16_kernels), fp32 weights" : "fp32", omp_get_max_threads());
	if (c->dtype == ST_DTYPE_BF16)
		st_info("bf16 matrix products: %s", st_amx_available()
			? "AMX (slicetrain's tile kernel; ST_AMX=0 for oneDNN's)"
			: "oneDNN's matmul (no AMX in use: see docs/performance.md)");
}

/* Weights, gradients and two AdamW moments, in fp32. */
static int check_memory(int64_t nparams, const char *model)
{
	double need = 16.0 * (double)nparams;
	double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
	if (have > 0 && need > have)
		return st_fail(ST_ENOMEM,
			       "%s needs %.1f GiB for weights, gradients and optimizer state on one device; "
			       "this machine has %.1f GiB (shard it across devices, or pick a smaller model)",
			       model, need / (1 << 30), have / (1 << 30));
	return 0;
}

/*
 * Micro-batches per step on `world` devices. Under an elastic controller
 * (SLICETRAIN_ELASTIC_MAX_DEVICES=W_max, the group's device count at its
 * maximum size) the global batch stays that of W_max devices: accumulation
 * gradient_accumulation_steps * W_max / world, so the loss curve and the
 * sample order (by global sample index) do not depend on resizes; with
 * elastic_batch=scale it follows the devices (MaxText's behaviour). Unset or
 * empty: not elastic, *max_devices 0.
 */
static int elastic_accum(const st_config *c, int world, int64_t *accum, int64_t *max_devices)
{
	const char *s = getenv("SLICETRAIN_ELASTIC_MAX_DEVICES");
	*accum = c->gradient_accumulation_steps;
	*max_devices = 0;
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	long long w = strtoll(s, &end, 10);
	if (*end || errno || w < 1 || w > INT_MAX)
		return st_fail(ST_EINVAL,
			       "SLICETRAIN_ELASTIC_MAX_DEVICES='%s' is not a device count (a whole number >= 1: "
			       "the group's devices at its maximum size)", s);
	if (w < world)
		return st_fail(ST_EINVAL,
			       "SLICETRAIN_ELASTIC_MAX_DEVICES=%lld is smaller than this group's %d devices "
			       "(it is the device count at the maximum size)", w, world);
	*max_devices = w;
	if (c->elastic_batch == ST_ELASTIC_BATCH_SCALE)
		return 0;
	int64_t micro = c->gradient_accumulation_steps * w; /* micro-batches of one device per step */
	if (micro % world)
		return st_fail(ST_EINVAL,
			       "elastic_batch constant: the global batch of %lld devices (SLICETRAIN_ELASTIC_MAX_DEVICES) "
			       "x gradient_accumulation_steps %lld cannot be kept on %d devices (%d does not divide %lld; "
			       "use a device count that divides it, or elastic_batch=scale)",
			       w, (long long)c->gradient_accumulation_steps, world, world, (long long)micro);
	*accum = micro / world;
	return 0;
}

/* One record of metrics_file (o is taken), 17 significant digits: a double
 * read back is the same double (tests compare runs through this file, not
 * through the 3-decimal log line). Flushed every record: a process killed
 * later keeps the steps it reported (an elastic run's kept history reads them). */
static int write_record(trainer *t, json_t *o)
{
	if (!o)
		return st_fail(ST_EINTERNAL, "cannot build the metrics record");
	char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(o);
	if (!line)
		return st_fail(ST_ENOMEM, "out of memory (metrics)");
	int bad = fprintf(t->metrics, "%s\n", line) < 0 || fflush(t->metrics);
	free(line);
	if (bad)
		return st_fail(ST_EIO, "cannot write metrics_file '%s'", t->c->metrics_file);
	return 0;
}

static int write_metrics(trainer *t, int64_t step, double loss, int64_t total_weights,
			 double secs, double tflops, double tokens, double lr, double gnorm)
{
	return write_record(t, json_pack("{s:f, s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:s}", "learning/loss", loss,
					 "learning/total_weights", (json_int_t)total_weights,
					 "learning/current_learning_rate", lr, "learning/grad_norm", gnorm,
					 "perf/step_time_seconds", secs, "perf/per_device_tflops_per_sec", tflops,
					 "perf/per_device_tokens_per_sec", tokens, "step", (json_int_t)step,
					 "run_name", t->c->run_name));
}

/* MaxText's eval record: its own line, with the step it follows. */
static int write_eval_metrics(trainer *t, int64_t step, const st_eval_result *e)
{
	return write_record(t, json_pack("{s:f, s:I, s:f, s:I, s:s}", "eval/total_loss", e->total_loss,
					 "eval/total_weights", (json_int_t)e->total_weights, "eval/avg_loss",
					 e->avg_loss, "step", (json_int_t)step, "run_name", t->c->run_name));
}

/*
 * The TensorBoard start of this event file, at the first step it records:
 * where the state came from (run/start), and as MaxText writes them the
 * model's parameter count and the config (text).
 */
static int tb_start(trainer *t, int64_t step)
{
	char text[1024], gen[48] = "";
	int rc;
	if (t->generation >= 0)
		snprintf(gen, sizeof(gen), ", elastic generation %lld", (long long)t->generation);
	snprintf(text, sizeof(text), "step %lld: %d process%s (%s), global batch %lld x %lld tokens%s; %s",
		 (long long)step, t->par.world, t->par.world == 1 ? "" : "es", t->mesh_desc, (long long)t->G,
		 (long long)t->T, gen, t->origin);
	if ((rc = st_tfevents_text(t->tb, step, "run/start", text)) < 0)
		return rc;
	snprintf(text, sizeof(text), "%lld", (long long)st_llama_count_params(&t->model.s));
	if ((rc = st_tfevents_text(t->tb, step, "num_model_parameters", text)) < 0)
		return rc;
	char *json = NULL;
	if ((rc = st_config_to_json(t->c, &json)) < 0)
		return rc;
	size_t n = strlen(json);
	char *md = malloc(n + 16);
	if (md) { /* a code block: markdown would eat its underscores */
		snprintf(md, n + 16, "```\n%s\n```", json);
		rc = st_tfevents_text(t->tb, step, "config", md);
	} else {
		rc = st_fail(ST_ENOMEM, "out of memory (TensorBoard text)");
	}
	free(md);
	free(json);
	t->tb_started = rc == 0;
	return rc;
}

/* The step's scalars under the metrics file's names, the controller's new
 * events, one write. */
static int tb_step(trainer *t, int64_t step, double loss, int64_t total_weights, double secs, double tflops,
		   double tokens, double lr, double gnorm)
{
	st_tfevents *w = t->tb;
	int rc = 0;
	if (!t->tb_started)
		rc = tb_start(t, step);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "learning/loss", loss);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "learning/total_weights", (double)total_weights);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "learning/current_learning_rate", lr);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "learning/grad_norm", gnorm);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "perf/step_time_seconds", secs);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "perf/per_device_tflops_per_sec", tflops);
	if (rc == 0)
		rc = st_tfevents_scalar(w, step, "perf/per_device_tokens_per_sec", tokens);
	if (rc == 0 && t->generation >= 0) /* under the elastic launcher */
		rc = st_summary_controller_events(w, t->c->metrics_file, &t->tb_events, step);
	return rc < 0 ? rc : st_tfevents_flush(w);
}

/* After step `step`, when eval_interval says so: the eval loss over the
 * eval data, MaxText's eval line, the eval record and scalars. */
static int maybe_eval(trainer *t, int64_t step)
{
	if (!t->eval.data || !st_eval_due(t->c, step))
		return 0;
	st_eval_job job = {.model = &t->model, .fsdp = t->fsdp, .par = &t->par, .tokens = t->tokens,
			   .rows = t->rows, .accum = t->accum, .T = t->T};
	st_eval_result e;
	int rc = st_eval_run(&t->eval, &job, &e);
	if (rc < 0 || !t->lead)
		return rc;
	/* MaxText's line; its total_weights is a float there ("75264.0") */
	printf("eval metrics after step: %lld, loss=%.3f, total_weights=%lld.0\n", (long long)step, e.avg_loss,
	       (long long)e.total_weights);
	fflush(stdout);
	if (t->metrics && (rc = write_eval_metrics(t, step, &e)) < 0)
		return rc;
	if (!t->tb)
		return 0;
	if ((rc = st_tfevents_scalar(t->tb, step, "eval/total_loss", e.total_loss)) < 0 ||
	    (rc = st_tfevents_scalar(t->tb, step, "eval/total_weights", (double)e.total_weights)) < 0 ||
	    (rc = st_tfevents_scalar(t->tb, step, "eval/avg_loss", e.avg_loss)) < 0)
		return rc;
	return st_tfevents_flush(t->tb);
}

/*
 * With accumulation on a resident model, each micro-batch's gradients are
 * computed from zero and summed in micro-batch order: g0 + g1 + ... The
 * kernels would otherwise add micro-batch a's terms onto the earlier ones'
 * inside their own sums, a different rounding from the data all-reduce's
 * g0 + g1 when the same micro-batches run on two replicas. This way a step
 * of two micro-batches gives the same bits on one device as on two data
 * replicas (an elastic group that shrinks from 2 to 1, or grows back, stays
 * on the fault-free run's weights); the cost is one gradient-sized buffer
 * and one pass over it per micro-batch.
 */
static void sum_micro_batch(trainer *t, int64_t a)
{
	float *g = t->model.grads, *s = t->gsum;
	int64_t n = t->model.nparams;
	if (a == t->accum - 1) { /* the last: the sum lands in the model's gradients */
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < n; i++)
			g[i] = s[i] + g[i];
		return;
	}
	if (a == 0)
		memcpy(s, g, (size_t)n * sizeof(float));
	else {
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < n; i++)
			s[i] += g[i];
	}
	st_llama_zero_grads(&t->model);
}

static int save_due(const trainer *t, int64_t done);

/*
 * The update of step `step`. When a save of its result follows, it also
 * checksums the save's pieces while they are in cache (st_adamw_update_crc),
 * so that the saver does not read 3 x 4 bytes per parameter again: the
 * weight pieces' ranges in the shard, the moments' pieces being the same
 * ranges of m and v (else, or with no pieces, the saver checksums).
 */
static int update(trainer *t, int64_t step, uint16_t *wb, const st_adamw *h)
{
	const st_shard *sh = &t->shard;
	int nr = t->nsave_pieces / 3, ok = t->nsave_pieces > 0 && t->nsave_pieces % 3 == 0 && save_due(t, step + 1);
	t->crc_done = -1;
	int64_t *start = ok ? malloc((size_t)nr * 2 * sizeof(int64_t)) : NULL, *len = start ? start + nr : NULL;
	uint32_t *crc = start ? malloc((size_t)nr * 3 * sizeof(uint32_t)) : NULL;
	const float *block[3] = {sh->p, sh->m, sh->v};
	for (int j = 0; crc && j < nr; j++) {
		const st_ckpt_piece *pc = &t->save_pieces[j];
		start[j] = pc->data - sh->p;
		len[j] = pc->shape[0] * (pc->ndim == 2 ? pc->shape[1] : 1);
		ok &= start[j] >= (j ? start[j - 1] + len[j - 1] : 0) && start[j] + len[j] <= sh->n;
		for (int k = 1; k < 3; k++) {
			const st_ckpt_piece *q = &t->save_pieces[k * nr + j];
			ok &= q->data == block[k] + start[j] && q->ndim == pc->ndim && q->shape[0] == pc->shape[0] &&
			      q->shape[1] == pc->shape[1];
		}
	}
	st_adamw_crc ac = {.nranges = nr, .start = start, .len = len, .crc = crc};
	int rc = st_adamw_update_crc(sh->p, wb, sh->g, sh->m, sh->v, sh->n, h, ok && crc ? &ac : NULL);
	if (rc == 0 && ok && crc) { /* save() passes them on if it saves this state */
		for (int j = 0; j < 3 * nr; j++)
			t->save_pieces[j].crc32 = crc[j];
		t->crc_done = step + 1;
	}
	free(start);
	free(crc);
	return rc;
}

static int train_step(trainer *t, int64_t step, double *loss_out, double *gnorm_out,
		      double *lr_out)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	int64_t accum = t->accum;
	float scale = (float)(1.0 / ((double)t->G * (double)t->T));
	double loss_sum = 0;
	int rc;
	st_llama_zero_grads(&t->model);
	if (t->fsdp)
		st_fsdp_begin_step(t->fsdp);
	for (int64_t a = 0; a < accum; a++) {
		/* this shard's rows of micro-batch a, by global sample index */
		int64_t first = t->sample0 + (step - t->step0) * t->G + a * (t->G / accum) +
				p->dp_index * t->rows;
		if ((rc = st_dataset_read(t->data, first, t->rows, t->tokens)) < 0)
			return rc;
		for (int64_t r = 0; t->sample_log && r < t->rows; r++)
			fprintf(t->sample_log, "%lld %lld\n", (long long)step, (long long)(first + r));
		/* a process killed later must not take the record of what it read with it */
		if (t->sample_log)
			fflush(t->sample_log);
		if ((rc = st_llama_forward_backward(&t->model, t->tokens, scale, &loss_sum)) < 0)
			return rc;
		if (t->gsum)
			sum_micro_batch(t, a);
	}
	if ((rc = st_comm_allreduce(p->batch, &loss_sum, 1, ST_DTYPE_F64, ST_SUM)) < 0)
		return rc;
	double loss = loss_sum / ((double)t->G * (double)t->T);
	if (!isfinite(loss))
		return st_fail(ST_EINVAL, "loss is %f at step %lld; stopping (as MaxText's abort_on_nan_loss)",
			       loss, (long long)step);
	double gnorm;
	if ((rc = st_shard_reduce_grads(&t->shard, &t->model, p)) < 0 ||
	    (rc = st_shard_grad_norm(&t->shard, &t->model, p, &gnorm)) < 0)
		return rc;
	/* the update overwrites the state: a save's background copy must have it all */
	double held;
	if (t->saver && st_ckpt_saver_release(t->saver, &held) && t->lead)
		st_info("checkpoint step %lld: the update waited %.3f s for the copy", (long long)step, held);
	st_adamw h = {
		.lr = st_lr_at(c, step), .b1 = c->adam_b1, .b2 = c->adam_b2, .eps = c->adam_eps,
		.wd = c->adam_weight_decay, .t = step + 1, .grad_scale = 1.0f,
	};
	double clip = c->gradient_clipping_threshold;
	if (clip > 0 && gnorm > clip)
		h.grad_scale = (float)(clip / gnorm);
	/* bf16 with the model's own weights updated in place: the update writes
	 * their bf16 copy in the same pass */
	uint16_t *wb = NULL;
	if (t->shard.alias && (rc = st_llama_bf16_weights(&t->model, &wb)) < 0)
		return rc;
	if ((rc = update(t, step, wb, &h)) < 0)
		return rc;
	if (t->fsdp)
		st_fsdp_end_step(t->fsdp); /* gathered lazily by the next forward */
	else if (!wb && ((rc = st_shard_gather_params(&t->shard, &t->model, p)) < 0 ||
			 (rc = st_llama_weights_changed(&t->model)) < 0))
		return rc;
	*loss_out = loss;
	*gnorm_out = gnorm;
	*lr_out = h.lr;
	return 0;
}

/* Weights and moments from a checkpoint, or weights from load_parameters_path.
 * MaxText's order: the run's own newest checkpoint first (auto-resume), then
 * load_full_state_path, then load_parameters_path. *found: the weights were
 * filled (else they still need their initial values). */
/* The bf16 kernel plan a checkpoint's run used (its config's bf16_kernels,
 * when explicit) into t->ckpt_kernels. */
static void kernels_from_meta(trainer *t, const st_ckpt_meta *meta)
{
	t->ckpt_kernels[0] = 0;
	json_t *o = meta->config_json ? json_loads(meta->config_json, 0, NULL) : NULL;
	const char *s = json_string_value(json_object_get(o, "bf16_kernels"));
	if (s && !st_kplan_is_auto(s) && strlen(s) < sizeof(t->ckpt_kernels))
		snprintf(t->ckpt_kernels, sizeof(t->ckpt_kernels), "%s", s);
	json_decref(o);
}

static int restore(trainer *t, int *found_out)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	st_ckpt_piece *pieces = NULL;
	int n = 0, found = 0, rc;
	st_ckpt_meta meta = {0};
	int params_only = !c->enable_checkpointing && !c->load_full_state_path[0];
	*found_out = 0;
	if (params_only && !c->load_parameters_path[0])
		return 0;
	if ((rc = st_shard_pieces(&t->shard, &t->model, p, 1, 0, &pieces, &n)) < 0)
		return rc;
	double t0 = st_mono_s();
	if (c->enable_checkpointing)
		rc = st_ckpt_restore_latest(t->ckpt_dir, p->world_comm, &meta, n, pieces, &found);
	if (rc == 0 && !found && c->load_full_state_path[0]) {
		rc = st_ckpt_restore_step(c->load_full_state_path, p->world_comm, &meta, n, pieces);
		found = rc == 0;
	}
	if (rc == 0 && found) {
		t->step0 = meta.step;
		t->sample0 = meta.next_sample;
		if (t->lead)
			st_info("restored step %lld (saved on %s; next sample %lld): %.1f MB in %.3f s (%.0f MB/s; "
				"%.1f MB read straight into the state)",
				(long long)meta.step, meta.mesh, (long long)meta.next_sample,
				3.0 * 4e-6 * (double)t->shard.n, st_mono_s() - t0,
				3.0 * 4e-6 * (double)t->shard.n / (st_mono_s() - t0), 1e-6 * (double)meta.bytes_direct);
		kernels_from_meta(t, &meta);
		if (meta.data_shuffle_seed != c->data_shuffle_seed)
			st_warn("data_shuffle_seed changed from %lld (checkpoint) to %lld: the data order changes, "
				"samples may repeat or be skipped",
				(long long)meta.data_shuffle_seed, (long long)c->data_shuffle_seed);
	} else if (rc == 0 && c->load_parameters_path[0]) {
		/* parameters only: the first third of the pieces */
		rc = st_ckpt_load_params(c->load_parameters_path, c, p->world_comm, t->shard.ntensors, pieces);
		if (rc == 0 && t->lead)
			st_info("loaded parameters from %s", c->load_parameters_path);
		found = rc == 0;
	}
	st_ckpt_meta_release(&meta);
	st_shard_pieces_free(pieces, n);
	*found_out = rc == 0 && found;
	return rc;
}

/* The decided kernel plan, explicit, as bf16_kernels in the config the
 * checkpoints store (a resumed run reuses it). */
static int record_kernels(trainer *t)
{
	if (!t->model.bf16 || !t->kernels_set || !t->config_json)
		return 0;
	char plan[ST_KPLAN_STR_MAX];
	st_kplan_format(&t->model.kplan, plan, sizeof(plan));
	json_t *o = json_loads(t->config_json, 0, NULL);
	char *out = NULL;
	if (o && json_object_set_new(o, "bf16_kernels", json_string(plan)) == 0)
		out = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!out)
		return st_fail(ST_ENOMEM, "out of memory (the checkpoint's config)");
	free(t->config_json);
	t->config_json = out;
	return 0;
}

/*
 * dtype bfloat16: decide which kernel each product site runs on
 * (model/kplan.h), before the activations are allocated. The bf16_kernels
 * key when explicit; else the restored checkpoint's plan; else rank 0 times
 * both kernels at this run's shape. Rank 0's plan is broadcast, so every
 * process runs the same one. Collective over the group.
 */
static int decide_kernels(trainer *t)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	st_kplan plan = {{0}}; /* rank 0's, broadcast, unless given by the key or checkpoint */
	double ratio[ST_KS_COUNT];
	const char *from = "timing on rank 0";
	int rc = 0, timed = 0;
	if (!st_kplan_is_auto(c->bf16_kernels)) {
		rc = st_kplan_parse(&plan, c->bf16_kernels);
		from = "the bf16_kernels key";
		if (rc == 0 && t->lead && t->ckpt_kernels[0] && strcmp(t->ckpt_kernels, c->bf16_kernels))
			st_warn("bf16_kernels differs from the plan the checkpoint was trained with (%s): "
				"results will not match the uninterrupted run bit for bit", t->ckpt_kernels);
	} else if (t->ckpt_kernels[0]) {
		rc = st_kplan_parse(&plan, t->ckpt_kernels);
		from = "the checkpoint";
	} else if (p->rank == 0 && !st_cpu_has_bf16()) {
		memset(plan.f32, 1, sizeof(plan.f32));
		from = "this CPU (no bf16 products)";
	} else if (p->rank == 0) {
		st_kshape ks;
		st_llama_kernel_shape(&t->model, t->rows, t->T, &ks);
		double t0 = st_mono_s();
		rc = st_kplan_time(&ks, 2, &plan, ratio);
		timed = 1;
		if (rc == 0)
			st_info("bf16 kernels timed on this CPU in %.2f s (rank 0, %d threads; fp32 time / bf16 time):",
				st_mono_s() - t0, omp_get_max_threads());
	}
	/* a plan from the key or the checkpoint, on a CPU without bf16 products */
	int given = !st_kplan_is_auto(c->bf16_kernels) || t->ckpt_kernels[0];
	if (rc == 0 && given && !st_cpu_has_bf16() && st_kplan_count_f32(&plan) < ST_KS_COUNT) {
		if (!st_kplan_is_auto(c->bf16_kernels))
			return st_fail(ST_EINVAL, "bf16_kernels=%s runs sites on the bf16 kernel, but %s: use "
				       "bf16_kernels=fp32 (or auto)", c->bf16_kernels, st_cpu_bf16_message());
		if (t->lead)
			st_warn("the checkpoint's kernel plan (%s) runs sites on the bf16 kernel, but %s: every "
				"site on fp32; results will not match the uninterrupted run bit for bit",
				t->ckpt_kernels, st_cpu_bf16_message());
		memset(plan.f32, 1, sizeof(plan.f32));
	}
	if (rc < 0)
		return rc;
	if (p->world > 1 && (rc = st_comm_broadcast(p->world_comm, plan.f32, sizeof(plan.f32), 0)) < 0)
		return rc;
	if (t->lead) {
		char line[ST_KPLAN_STR_MAX];
		if (timed) {
			char *q = line;
			for (int i = 0; i < ST_KS_COUNT; i++)
				q += snprintf(q, sizeof(line) - (size_t)(q - line), "%s %s %.2f", i ? "," : "",
					      st_ksite_name(i), ratio[i]);
			st_info("  %s", line + 1);
		}
		st_kplan_format(&plan, line, sizeof(line));
		int n32 = st_kplan_count_f32(&plan);
		st_info("bf16 kernels from %s: %d of %d sites on the bf16 kernel, %d on fp32; to repeat: "
			"bf16_kernels=%s", from, ST_KS_COUNT - n32, ST_KS_COUNT, n32, line);
	}
	t->model.kplan = plan;
	t->kernels_set = 1;
	return record_kernels(t);
}

static int setup_checkpoints(trainer *t)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	int rc = st_ckpt_run_dir(c, t->ckpt_dir, sizeof(t->ckpt_dir));
	if (rc < 0 || !c->enable_checkpointing)
		return rc;
	st_ckpt_opts o;
	if ((rc = st_ckpt_opts_from_config(&o, c, p->rank, p->world)) < 0)
		return rc;
	/* the copy of a save runs in the background during the next step's
	 * forward and backward, which only read the state; train_step releases
	 * it before the update */
	o.defer_copy = 1;
	if ((rc = st_ckpt_saver_create(&t->saver, &o)) < 0)
		return rc;
	/* nobody saves before process 0 has removed uncommitted steps */
	if ((rc = st_comm_barrier(p->world_comm)) < 0)
		return rc;
	if ((rc = st_config_to_json(c, &t->config_json)) < 0 || (rc = record_kernels(t)) < 0)
		return rc;
	t->crc_done = -1;
	return st_shard_pieces(&t->shard, &t->model, p, 1, 1, &t->save_pieces, &t->nsave_pieces);
}

/* The host buffers, touched in the background, so that a save only copies
 * (after a restore: faulting them in competes with its reads). */
static int reserve_checkpoints(trainer *t)
{
	return t->saver ? st_ckpt_saver_reserve(t->saver, t->nsave_pieces, t->save_pieces) : 0;
}

/* Save the state after `done` completed steps. */
static int save(trainer *t, int64_t done)
{
	const st_config *c = t->c;
	st_ckpt_meta meta = {
		.step = done, .next_sample = t->sample0 + (done - t->step0) * t->G,
		.data_shuffle_seed = c->data_shuffle_seed, .init_weights_seed = c->init_weights_seed,
		.global_batch = t->G, .config_json = t->config_json,
	};
	snprintf(meta.mesh, sizeof(meta.mesh), "%s", t->mesh_desc);
	/* the update's checksums only if they are of this state */
	for (int j = 0; j < t->nsave_pieces; j++)
		t->save_pieces[j].has_crc32 = t->crc_done == done;
	int rc = st_ckpt_save(t->saver, &meta, t->nsave_pieces, t->save_pieces);
	t->crc_done = -1;
	if (rc == 0 && t->lead) {
		st_ckpt_stats st;
		st_ckpt_saver_stats(t->saver, &st);
		st_info("checkpoint step %lld: training stalled %.3f s (copy %.3f s), writing %s%s",
			(long long)done, st.last_stall_s, st.last_copy_s,
			c->async_checkpointing ? "in the background" : "done",
			st.last_crc_given ? " (checksums from the update)" : "");
	}
	return rc;
}

/* A periodic save follows `done` completed steps. */
static int save_due(const trainer *t, int64_t done)
{
	const st_config *c = t->c;
	return t->saver && ((c->checkpoint_period > 0 && done % c->checkpoint_period == 0) ||
			    (done == c->steps && c->save_checkpoint_on_completion));
}

/* Save after `done` completed steps when the period or the end says so:
 * 1 when it saved. */
static int maybe_save(trainer *t, int64_t done)
{
	if (!save_due(t, done))
		return 0;
	int rc = save(t, done);
	return rc < 0 ? rc : 1;
}

/*
 * The group agreed to stop on signal `sig` after `done` completed steps: save
 * that state (unless the period just did) and wait until it is committed, so
 * that no completed step is lost (a preemption notice or a resize request of
 * the elastic controller). Every process calls this after the same step. A
 * second signal meanwhile only sets stop_signal again: the save finishes.
 * Then ST_EINTR (the caller's exit status 128 + sig), or the save's error.
 */
static int stop_with_save(trainer *t, int64_t done, int saved, int sig)
{
	int rc = 0;
	if (t->saver) {
		if (!saved)
			rc = save(t, done);
		if (rc == 0)
			rc = st_ckpt_wait(t->saver);
		if (rc < 0)
			return rc;
		/* committed = process 0 wrote its manifest (under checkpoint_failure_policy
		 * continue a failed save is only warned); every process learns it */
		int64_t missing = 0;
		if (t->lead) {
			char path[ST_PATH_MAX + 48];
			snprintf(path, sizeof(path), "%s/%lld/manifest.json", t->ckpt_dir, (long long)done);
			missing = !st_file_exists(path);
		}
		if ((rc = st_comm_allreduce(t->par.world_comm, &missing, 1, ST_DTYPE_I64, ST_MAX)) < 0)
			return rc;
		if (missing) {
			st_ckpt_stats st;
			st_ckpt_saver_stats(t->saver, &st);
			return st_fail(ST_EIO, "stopping after step %lld (signal %d): checkpoint %lld was not committed%s%s",
				       (long long)(done - 1), sig, (long long)done, st.last_error[0] ? ": " : "",
				       st.last_error);
		}
		if (t->lead)
			st_info("stopping after step %lld (signal %d): checkpoint %lld saved", (long long)(done - 1),
				sig, (long long)done);
	} else if (t->lead) {
		st_info("stopping after step %lld (signal %d): checkpointing is off, nothing saved",
			(long long)(done - 1), sig);
	}
	return st_fail(ST_EINTR, "stopped by signal %d after step %lld", sig, (long long)(done - 1));
}

/* Every process stops after the same step: a signal (SIGINT, SIGTERM,
 * SIGUSR1) seen by any stops all; the largest number wins. */
static int agree_stop(trainer *t, int *sig, int *reform_now)
{
	int rc;
	if (t->ctl && !t->have_pending) { /* a grow: the agent's reform, to act on at a boundary */
		if ((rc = st_worker_ctl_wait(t->ctl, 0, &t->pending)) < 0 && rc != ST_EPEER)
			return rc;
		t->have_pending = rc == 1;
	}
	int64_t v[2] = {stop_signal, t->have_pending};
	rc = st_comm_allreduce(t->par.world_comm, v, 2, ST_DTYPE_I64, ST_MAX);
	*sig = (int)v[0];
	*reform_now = (int)v[1];
	return rc;
}

/* Join the group (env NULL: this process's environment) and derive what
 * depends on it: the mesh and this process's place, the micro-batches per
 * step and the global batch, the step's cost; rank 0 prints them. */
static int group_setup(trainer *t, const st_group_env *env)
{
	const st_config *c = t->c;
	st_group_opts go = {.env = env};
	int rc;
	if ((rc = st_group_join(&t->group, env ? &go : NULL)) < 0)
		return rc;
	if ((rc = st_par_init(&t->par, c, t->group)) < 0)
		return rc;
	const st_par *p = &t->par;
	t->lead = p->rank == 0;
	t->B = (int64_t)c->per_device_batch_size;
	t->T = c->max_target_length;
	t->rows = t->B * p->mesh.size[ST_AXIS_TENSOR];
	if ((rc = elastic_accum(c, p->world, &t->accum, &t->max_devices)) < 0)
		return rc;
	t->G = t->B * p->world * t->accum;
	t->flops = st_training_flops(c, (double)t->B);
	/* the formula counts gradient_accumulation_steps micro-batches; we run t->accum */
	double fk = (double)t->accum / (double)c->gradient_accumulation_steps;
	t->flops.weights *= fk;
	t->flops.attention *= fk;
	t->flops.total *= fk;
	st_par_describe(p, t->mesh_desc, sizeof(t->mesh_desc));
	if (t->lead) {
		st_info("mesh: %s", t->mesh_desc);
		const char *gen = getenv("SLICETRAIN_GENERATION");
		if (t->max_devices)
			st_info("elastic%s%s: %d of at most %lld devices, global batch %lld (elastic_batch %s)",
				gen && *gen ? " generation " : "", gen && *gen ? gen : "", p->world,
				(long long)t->max_devices, (long long)t->G,
				c->elastic_batch == ST_ELASTIC_BATCH_SCALE ? "scale" : "constant");
		if (!env)
			print_header(t);
	}
	return 0;
}

static void group_release(trainer *t)
{
	st_par_release(&t->par);
	st_group_leave(t->group);
	t->group = NULL;
}

/* What is bound to the group besides the mesh: the checkpoint saver and
 * the pieces this process writes, ZeRO-3's buffers, the data reader (of the
 * global batch), the gradient sum (accumulation on a resident model), rank
 * 0's metrics file and the sample log. (Checkpoints: only the saver here;
 * restore() reads.) */
static int bound_setup(trainer *t, int reformed)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	int rc;
	if ((rc = setup_checkpoints(t)) < 0 || (reformed && (rc = reserve_checkpoints(t)) < 0))
		return rc;
	if (!t->shard.alias && (rc = st_fsdp_create(&t->fsdp, &t->shard, &t->model, p, t->rows * t->T)) < 0)
		return rc;
	if ((rc = st_shard_share(&t->shard, p)) < 0)
		return rc;
	if ((rc = st_dataset_open(&t->data, c, t->G)) < 0)
		return rc;
	if (t->accum > 1 && t->shard.alias &&
	    !(t->gsum = malloc((size_t)t->model.nparams * sizeof(float))))
		return st_fail(ST_ENOMEM, "out of memory for the gradient sum (%.1f MB)",
			       4e-6 * (double)t->model.nparams);
	/* under an elastic controller the file holds every generation's records
	 * (and the controller's event lines between them): append */
	const char *gen = getenv("SLICETRAIN_GENERATION");
	if (t->lead && c->metrics_file[0] &&
	    !(t->metrics = fopen(c->metrics_file, reformed || (gen && *gen) ? "a" : "w")))
		return st_fail(ST_EIO, "cannot open metrics_file '%s': %s", c->metrics_file, strerror(errno));
	if ((rc = st_eval_open(&t->eval, c, t->G, t->lead)) < 0)
		return rc;
	/* a new event file for every group this process leads; the controller's
	 * events are read on from where this process left them */
	t->tb_started = 0;
	if (!t->lead)
		t->tb_events = -1;
	if (t->lead && c->enable_tensorboard &&
	    ((rc = st_summary_open(&t->tb, c)) < 0 ||
	     /* before this group's first record: what precedes it is an earlier writer's */
	     (t->generation >= 0 &&
	      (rc = st_summary_controller_events(t->tb, c->metrics_file, &t->tb_events, t->step0)) < 0)))
		return rc;
	if (t->tb && !reformed) {
		char dir[ST_PATH_MAX];
		if (st_summary_dir(c, dir, sizeof(dir)) == 0)
			st_info("TensorBoard: tensorboard --logdir=%s", dir);
	}
	/* a record of the global sample indices this batch shard trains on, for
	 * checking that no sample is skipped or repeated across restarts */
	const char *slog = getenv("SLICETRAIN_SAMPLE_LOG");
	if (slog && *slog && p->coord[ST_AXIS_TENSOR] == 0) {
		char path[ST_PATH_MAX + 16];
		snprintf(path, sizeof(path), "%s.%d", slog, p->rank);
		if (!(t->sample_log = fopen(path, "a")))
			return st_fail(ST_EIO, "cannot open SLICETRAIN_SAMPLE_LOG file '%s': %s", path, strerror(errno));
	}
	return 0;
}

/* failed: a save in flight is abandoned (it can no longer commit). */
static void bound_release(trainer *t, int failed)
{
	if (t->saver && failed)
		st_ckpt_saver_abort(t->saver);
	st_ckpt_saver_free(t->saver); /* waits for the save in flight */
	t->saver = NULL;
	st_shard_pieces_free(t->save_pieces, t->nsave_pieces);
	t->save_pieces = NULL;
	t->crc_done = -1; /* they were of those pieces */
	t->nsave_pieces = 0;
	free(t->config_json);
	t->config_json = NULL;
	st_fsdp_free(t->fsdp);
	t->fsdp = NULL;
	st_dataset_free(t->data);
	t->data = NULL;
	st_eval_close(&t->eval);
	st_tfevents_close(t->tb); /* finish() reported a failed last write */
	t->tb = NULL;
	free(t->gsum);
	t->gsum = NULL;
	if (t->metrics)
		fclose(t->metrics);
	t->metrics = NULL;
	if (t->sample_log)
		fclose(t->sample_log);
	t->sample_log = NULL;
}

/*
 * After the group (re-)formed: every process ends with the state of the
 * most completed steps any of them holds. The processes that hold less (a
 * joiner holds nothing; after a failure in the middle of a step's last
 * collective a few may be one step behind) receive the shard of weights and
 * AdamW moments from the lowest-ranked process that holds the most and
 * holds the same shard (the same fsdp and tensor coordinates), verified by
 * a CRC-32 of each block. No checkpoint is read.
 */
static int sync_state(trainer *t)
{
	const st_par *p = &t->par;
	int W = p->world, rc;
	if (W < 1)
		return st_fail(ST_EINTERNAL, "state sync: a group of %d processes", W);
	int64_t mine[2] = {t->done, t->sample0 + (t->done - t->step0) * t->G};
	/* one block: every process's (done, next sample), the allgather's counts, the members */
	int64_t *all = malloc((size_t)W * (3 * sizeof(int64_t) + sizeof(int)));
	if (!all)
		return st_fail(ST_ENOMEM, "out of memory");
	int64_t *counts = all + 2 * W;
	int *members = (int *)(counts + W);
	for (int r = 0; r < W; r++)
		counts[r] = 2;
	if ((rc = st_comm_allgather(p->world_comm, mine, all, counts, ST_DTYPE_I64)) < 0)
		goto out;
	int64_t most = -1;
	for (int r = 0; r < W; r++)
		most = all[2 * r] > most ? all[2 * r] : most;
	if (most < 0) {
		rc = st_fail(ST_EINVAL, "no process of the group holds a training state (every one is a joiner)");
		goto out;
	}
	if (t->model.bf16) { /* the kernel plan: a joiner takes the group's */
		int root = 0;
		while (all[2 * root] != most)
			root++;
		st_kplan plan = t->model.kplan;
		if ((rc = st_comm_broadcast(p->world_comm, plan.f32, sizeof(plan.f32), root)) < 0 ||
		    (rc = st_llama_set_kernels(&t->model, &plan)) < 0)
			goto out;
		if (!t->kernels_set) {
			t->kernels_set = 1;
			if ((rc = record_kernels(t)) < 0)
				goto out;
		}
	}
	/* the members of this process's shard: the source first, then the receivers */
	int key = p->coord[ST_AXIS_FSDP] * (int)p->mesh.size[ST_AXIS_TENSOR] + p->coord[ST_AXIS_TENSOR];
	int n = 0, nrecv = 0, me = -1;
	for (int pass = 0; pass < 2; pass++)
		for (int r = 0; r < W; r++) {
			int co[ST_NAXES];
			st_mesh_coords(&p->mesh, r, co);
			if (co[ST_AXIS_FSDP] * (int)p->mesh.size[ST_AXIS_TENSOR] + co[ST_AXIS_TENSOR] != key)
				continue;
			int has = all[2 * r] == most;
			if (pass == 0 && has && n == 0)
				members[n++] = r;
			else if (pass == 1 && !has)
				members[n++] = r, nrecv++;
		}
	for (int i = 0; i < n; i++)
		if (members[i] == p->rank)
			me = i;
	int64_t behind = 0;
	for (int r = 0; r < W; r++)
		behind += all[2 * r] < most;
	if (t->lead && behind)
		st_info("re-formed group: %lld of %d processes receive the state of step %lld from a peer",
			(long long)behind, W, (long long)most);
	if (nrecv == 0 || me < 0) { /* nothing to send or receive for this shard */
		rc = 0;
		if (t->done != most) /* cannot be: a process behind is a receiver */
			rc = st_fail(ST_EINTERNAL, "state sync: rank %d holds step %lld, the group %lld", p->rank,
				     (long long)t->done, (long long)most);
		goto out;
	}
	st_comm *bc;
	if ((rc = st_comm_create(&bc, t->group, n, members)) < 0)
		goto out;
	double t0 = st_mono_s();
	float *blk[3] = {t->shard.p, t->shard.m, t->shard.v};
	size_t bytes = (size_t)t->shard.n * sizeof(float);
	/* header: step, next sample, the three blocks' CRCs */
	int64_t hdr[5] = {most, all[2 * members[0] + 1], 0, 0, 0};
	if (me == 0)
		for (int k = 0; k < 3; k++)
			hdr[2 + k] = st_crc32(0, blk[k], bytes);
	rc = st_comm_broadcast(bc, hdr, sizeof(hdr), 0);
	for (int k = 0; k < 3 && rc == 0; k++)
		rc = st_comm_broadcast(bc, blk[k], bytes, 0);
	st_comm_free(bc);
	if (rc < 0)
		goto out;
	if (me > 0) {
		for (int k = 0; k < 3; k++)
			if ((uint32_t)hdr[2 + k] != st_crc32(0, blk[k], bytes)) {
				rc = st_fail(ST_EIO, "the state received from rank %d fails its checksum (block %d)",
					     members[0], k);
				goto out;
			}
		t->done = t->step0 = hdr[0];
		t->sample0 = hdr[1];
		double secs = st_mono_s() - t0;
		fprintf(stderr, "slicetrain: rank %d: state of step %lld received from rank %d, no checkpoint read: "
			"%.1f MB in %.3f s (%.0f MB/s), checksums match\n", p->rank, (long long)t->done, members[0],
			3e-6 * (double)bytes, secs, 3e-6 * (double)bytes / (secs > 0 ? secs : 1e-9));
		if (t->shard.alias)
			rc = st_llama_weights_changed(&t->model);
	}
out:
	free(all);
	return rc;
}

/*
 * Re-form in place (the agent's reform message r): leave the group, join
 * generation r->gen's with the state in memory, and continue from the
 * completed steps the group holds (sync_state). Only the DCN data axis may
 * change: this process keeps its fsdp and tensor coordinates, so its shard
 * stays what it is (the controller re-forms in place only then).
 */
static int reform(trainer *t, const st_reform *r, int failed)
{
	double t0 = st_mono_s();
	st_mesh old = t->par.mesh;
	int oc[ST_NAXES];
	memcpy(oc, t->par.coord, sizeof(oc));
	int64_t next = t->sample0 + (t->done - t->step0) * t->G;
	bound_release(t, 1);
	group_release(t);
	int rc = group_setup(t, &r->env);
	if (rc < 0)
		return rc;
	const st_par *p = &t->par;
	for (int a = ST_AXIS_FSDP; a < ST_NAXES; a++)
		if (p->mesh.size[a] != old.size[a] || p->coord[a] != oc[a])
			return st_fail(ST_EPEER, "re-forming in place: the %s axis changed (%lld -> %lld): a new "
						  "process must restore from a checkpoint", a == ST_AXIS_FSDP ? "fsdp" : "tensor",
				       (long long)old.size[a], (long long)p->mesh.size[a]);
	t->step0 = t->done;
	t->sample0 = next;
	t->generation = r->gen;
	snprintf(t->origin, sizeof(t->origin), "re-formed in place %s, the state kept in memory",
		 failed ? "after a failure" : "at a step boundary");
	if ((rc = bound_setup(t, 1)) < 0)
		return rc;
	double t1 = st_mono_s();
	if ((rc = sync_state(t)) < 0)
		return rc;
	if (t->lead)
		st_info("re-formed in place (generation %lld, %s): %d processes at step %lld; group %.3f s, state %.3f s",
			r->gen, failed ? "after a failure" : "at a step boundary", p->world, (long long)t->done,
			t1 - t0, st_mono_s() - t1);
	fflush(stdout);
	return st_worker_ctl_ack(t->ctl, r->gen);
}

/* Everything before the first step: the group and its mesh, the model and
 * its shard (restored, initialized, or received from a peer: a joiner of an
 * elastic group, SLICETRAIN_JOIN=1), ZeRO-3, activations, data, output files. */
static int trainer_setup(trainer *t)
{
	const st_config *c = t->c;
	int rc;
	if ((rc = st_worker_ctl_open(&t->ctl)) < 0 || (rc = group_setup(t, NULL)) < 0)
		return rc;
	const st_par *p = &t->par;
	/* pacing for the elastic tests: a cheap model's steps made to last as
	 * long as a real one's (the worker sleeps the rest), so that a slice's
	 * repair falls inside the run on any CPU without burning it */
	const char *floor_s = getenv("SLICETRAIN_MIN_STEP_SECONDS");
	t->min_step_s = 0;
	if (floor_s && *floor_s) {
		char *end;
		errno = 0;
		t->min_step_s = strtod(floor_s, &end);
		if (errno || *end || !(t->min_step_s >= 0 && t->min_step_s <= 3600))
			return st_fail(ST_EINVAL, "SLICETRAIN_MIN_STEP_SECONDS='%s' is not a number of seconds "
				       "from 0 to 3600", floor_s);
	}
	const char *join = getenv("SLICETRAIN_JOIN");
	int joiner = join && !strcmp(join, "1");
	const char *gen = getenv("SLICETRAIN_GENERATION");
	if (gen && *gen)
		t->generation = strtoll(gen, NULL, 10);
	st_llama_shape shape;
	st_llama_shape_from_config(&shape, c);
	int64_t nparams;
	if ((rc = st_llama_check_config(c, &nparams)) < 0 || (rc = check_memory(nparams, c->model_name)) < 0)
		return rc;
	/* with fsdp > 1 the model is not resident: ZeRO-3 gathers it unit by unit */
	int resident = p->mesh.size[ST_AXIS_FSDP] == 1;
	if ((rc = st_llama_init_tp(&t->model, &shape, (int)p->mesh.size[ST_AXIS_TENSOR],
				   p->coord[ST_AXIS_TENSOR], p->tp, resident)) < 0)
		return rc;
	if (c->dtype == ST_DTYPE_BF16) {
		/* bf16 storage everywhere; without bf16 products every site runs on
		 * the fp32 kernels (decide_kernels) */
		t->model.bf16 = 1;
		if (!st_cpu_has_bf16() && t->lead)
			st_info("dtype bfloat16: %s; bf16 storage, every product on the fp32 kernels",
				st_cpu_bf16_message());
	}
	int restored = 0;
	if ((rc = st_shard_init(&t->shard, &t->model, p)) < 0 || (rc = bound_setup(t, 0)) < 0)
		return rc;
	if (!joiner && (rc = restore(t, &restored)) < 0)
		return rc;
	if (!joiner && !restored) /* a fresh start (or every checkpoint was unusable): initial weights */
		st_shard_init_weights(&t->shard, &t->model, (uint64_t)c->init_weights_seed);
	if ((rc = reserve_checkpoints(t)) < 0)
		return rc;
	if (joiner)
		snprintf(t->origin, sizeof(t->origin), "joined: the state received from a peer");
	else if (restored && t->step0 > 0)
		snprintf(t->origin, sizeof(t->origin), "restored from the checkpoint of step %lld", (long long)t->step0);
	else if (restored)
		snprintf(t->origin, sizeof(t->origin), "weights loaded from %.170s",
			 c->load_full_state_path[0] ? c->load_full_state_path : c->load_parameters_path);
	else
		snprintf(t->origin, sizeof(t->origin), "fresh weights (init_weights_seed %lld)",
			 (long long)c->init_weights_seed);
	t->done = joiner ? -1 : t->step0;
	if (t->model.bf16 && !joiner && (rc = decide_kernels(t)) < 0)
		return rc;
	if (resident && (rc = st_shard_gather_params(&t->shard, &t->model, p)) == 0)
		rc = st_llama_weights_changed(&t->model);
	if (rc < 0 || (rc = st_llama_alloc_acts(&t->model, t->rows, t->T, c->remat_policy)) < 0)
		return rc;
	t->tokens = malloc((size_t)(t->rows * (t->T + 1)) * sizeof(int32_t));
	if (!t->tokens)
		return st_fail(ST_ENOMEM, "out of memory for the batch");
	/* an elastic group: a joiner gets the state from a peer */
	if ((t->ctl || joiner) && (rc = sync_state(t)) < 0)
		return rc;
	if (t->lead) {
		st_info("activations %.1f MiB (remat %s; %lld bytes)", (double)st_llama_act_bytes(&t->model) / (1 << 20),
			remat_name(c->remat_policy), (long long)st_llama_act_bytes(&t->model));
		if (t->fsdp)
			st_info("fsdp buffers %.1f MiB (%lld bytes)",
				(double)st_fsdp_buffer_bytes(t->fsdp) / (1 << 20),
				(long long)st_fsdp_buffer_bytes(t->fsdp));
	}
	return 0;
}

static void trainer_release(trainer *t, int failed)
{
	bound_release(t, failed);
	st_llama_release(&t->model);
	st_shard_release(&t->shard);
	free(t->tokens);
	group_release(t);
	st_worker_ctl_close(t->ctl);
}

/* The stop signals (SIGINT, SIGTERM: a preemption notice, SIGUSR1: the
 * elastic controller's resize request) set stop_signal; the loop agrees on it
 * at the next step boundary. */
static const int stop_sigs[3] = {SIGINT, SIGTERM, SIGUSR1};
typedef struct stop_handlers {
	int installed;
	struct sigaction old_sa[3];
	stack_t old_ss;
} stop_handlers;

static void stop_handlers_install(stop_handlers *h)
{
	/* The handler runs on a stack of its own (a signal sent to the process
	 * goes to this thread, which never blocks it): a signal frame pushed
	 * below the interrupted stack pointer clobbered data that oneDNN 2.6's
	 * gemm keeps there, and 1 in 5 SIGTERMs during a step corrupted the heap
	 * (tests/cli/sigterm_train.sh). */
	static char sig_stack[64 << 10];
	stack_t ss = {.ss_sp = sig_stack, .ss_size = sizeof(sig_stack)};
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_ONSTACK};
	sigemptyset(&sa.sa_mask);
	stop_signal = 0;
	sigaltstack(&ss, &h->old_ss);
	for (int i = 0; i < 3; i++)
		sigaction(stop_sigs[i], &sa, &h->old_sa[i]);
	h->installed = 1;
}

static void stop_handlers_restore(stop_handlers *h)
{
	if (!h->installed)
		return;
	for (int i = 0; i < 3; i++)
		sigaction(stop_sigs[i], &h->old_sa[i], NULL);
	sigaltstack(&h->old_ss, NULL);
	h->installed = 0;
}

/* A collective of the step failed (rc): with the agent's control channel,
 * wait for its reform message and re-form in place. 1 when re-formed (the
 * loop goes on from t->done), else rc, or the re-formation's error. */
static int recover(trainer *t, int rc)
{
	if (!t->ctl || (rc != ST_EPEER && rc != ST_EINTR))
		return rc;
	char why[300];
	snprintf(why, sizeof(why), "%s", st_errmsg());
	/* A reform taken at this step boundary (agree_stop) whose agreement then
	 * failed may be the one the controller sent for this very failure: it
	 * sends no other, so act on it. Were it a grow sent before the failure,
	 * its generation has made no step and the controller stops it. */
	st_reform r = t->pending;
	double t0 = st_mono_s();
	int w = t->have_pending ? 1 : st_worker_ctl_wait(t->ctl, REFORM_WAIT_MS, &r);
	t->have_pending = 0;
	if (w <= 0) {
		st_warn("rank %d: %s; no re-formation came (%s): stopping", t->par.rank, why,
			w == 0 ? "waited 60 s" : st_errmsg());
		return st_fail(rc, "%s", why);
	}
	st_info("rank %d: %s; re-forming as rank %d of %d (generation %lld) after %.3f s", t->par.rank, why,
		r.env.rank, r.env.world_size, r.gen, st_mono_s() - t0);
	if ((rc = reform(t, &r, 1)) < 0)
		return rc;
	return 1;
}

/* SLICETRAIN_MIN_STEP_SECONDS: sleep out the rest of a step begun at t0. A
 * signal cuts the sleep short (a preemption notice is not delayed). */
static void pace(const trainer *t, double t0)
{
	double left = t->min_step_s - (st_mono_s() - t0);
	if (left <= 0)
		return;
	struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
	nanosleep(&ts, NULL);
}

/* The steps from t->step0 to c->steps, or until an agreed stop signal (then
 * with a save at the stop) or an error. Under an elastic agent a failed step
 * or an agreed grow re-forms the group in place and goes on. */
static int run_steps(trainer *t, st_train_result *res)
{
	const st_config *c = t->c;
	int rc = 0;
	int64_t saved_at = -1;
	if (t->step0 >= c->steps && t->lead)
		st_info("the run already completed its %lld steps", (long long)c->steps);
	for (int64_t step = t->step0; step < c->steps; step++) {
		double t0 = st_mono_s(), loss = 0, gnorm = 0, lr = 0;
		int sig = 0, now = 0;
		int64_t total_weights = t->G * t->T;
		if ((rc = train_step(t, step, &loss, &gnorm, &lr)) < 0) {
			if ((rc = recover(t, rc)) < 0)
				break;
			step = t->done - 1, saved_at = -1;
			continue;
		}
		t->done = step + 1;
		pace(t, t0);
		double secs = st_mono_s() - t0;
		double tflops = t->flops.total / secs / 1e12;
		double tokens = (double)(t->T * t->B * t->accum) / secs;
		if (t->lead) {
			printf("completed step: %lld, seconds: %.3f, TFLOP/s/device: %.3f, Tokens/s/device: %.3f, "
			       "total_weights: %lld, loss: %.3f\n",
			       (long long)step, secs, tflops, tokens, (long long)total_weights, loss);
			fflush(stdout);
		}
		if (t->metrics &&
		    (rc = write_metrics(t, step, loss, total_weights, secs, tflops, tokens, lr, gnorm)) < 0)
			break;
		if (t->tb && (rc = tb_step(t, step, loss, total_weights, secs, tflops, tokens, lr, gnorm)) < 0)
			break;
		if (step == t->step0)
			res->first_loss = loss;
		res->last_loss = loss;
		res->steps_done = step + 1;
		if ((rc = maybe_save(t, step + 1)) < 0)
			break;
		if (rc == 1)
			saved_at = step + 1;
		/* after the save: its copy is taken, the write overlaps the eval */
		if ((rc = maybe_eval(t, step)) < 0) {
			if ((rc = recover(t, rc)) < 0)
				break;
			step = t->done - 1, saved_at = -1;
			continue;
		}
		if ((rc = agree_stop(t, &sig, &now)) < 0) {
			if ((rc = recover(t, rc)) < 0)
				break;
			step = t->done - 1, saved_at = -1;
			continue;
		}
		if (sig && step + 1 < c->steps) {
			res->stop_signal = sig;
			rc = stop_with_save(t, step + 1, saved_at == step + 1, sig);
			break;
		}
		if (now && step + 1 < c->steps) { /* every process re-forms after this step */
			if (!t->have_pending) {
				int w = st_worker_ctl_wait(t->ctl, REFORM_WAIT_MS, &t->pending);
				if (w <= 0) {
					rc = w < 0 ? w : st_fail(ST_EPEER, "the group agreed to re-form, but no reform came");
					break;
				}
			}
			t->have_pending = 0;
			if ((rc = reform(t, &t->pending, 0)) < 0)
				break;
			step = t->done - 1, saved_at = -1;
		}
	}
	return rc;
}

/* After the last step: metrics flushed, the last save committed, its figures. */
static int finish(trainer *t)
{
	const st_config *c = t->c;
	int rc = 0;
	if (rc == 0 && t->metrics && fflush(t->metrics))
		rc = st_fail(ST_EIO, "cannot write metrics_file '%s'", c->metrics_file);
	if (rc == 0 && t->tb)
		rc = st_tfevents_flush(t->tb);
	if (rc == 0 && t->saver)
		rc = st_ckpt_wait(t->saver); /* the last save is committed before we report success */
	if (rc == 0 && t->saver && t->lead) {
		st_ckpt_stats st;
		st_ckpt_saver_stats(t->saver, &st);
		if (st.saves > 0)
			st_info("checkpoints: %lld saved, %lld failed; the last: %.1f MB written in %.3f s (%.0f MB/s; "
				"%.1f MB straight from the state), commit %.3f s; background CPU %.3f s per save",
				(long long)st.committed, (long long)st.failed, 1e-6 * (double)st.last_bytes, st.last_write_s,
				1e-6 * (double)st.last_bytes / (st.last_write_s > 0 ? st.last_write_s : 1),
				1e-6 * (double)st.last_direct_bytes, st.last_commit_s,
				st.total_bg_cpu_s / (double)(st.committed + st.failed > 0 ? st.committed + st.failed : 1));
	}
	return rc;
}

int st_train(const st_config *c, st_train_result *res)
{
	trainer t = {.c = c, .tb_events = -1, .generation = -1, .crc_done = -1};
	stop_handlers h = {0};
	memset(res, 0, sizeof(*res));
	int rc = trainer_setup(&t);
	if (rc == 0) {
		stop_handlers_install(&h);
		rc = run_steps(&t, res);
		if (rc == 0)
			rc = finish(&t);
	}
	/* a stop by signal is agreed by every process after the same step: the
	 * save in flight commits (only a failure aborts it) */
	trainer_release(&t, rc < 0 && rc != ST_EINTR);
	/* the handlers stay until the group is left: a launcher's SIGTERM to the
	 * last ranks of a stopping group must not kill them on the way out */
	stop_handlers_restore(&h);
	return rc;
}
