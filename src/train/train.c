#include "train/train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "data/data.h"
#include "dist/mesh.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "train/flops.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct trainer {
	const st_config *c;
	st_llama model;
	st_dataset *data;
	float *m, *v;     /* AdamW moments */
	int32_t *tokens;  /* one micro-batch, B x (T+1) */
	int64_t B, T, G;  /* per-device rows, sequence, global rows per step */
	FILE *metrics;
	st_flops flops;
} trainer;

/* Shape and cost, printed before any large allocation so that a model too big
 * for this machine still shows what it would be. */
static void print_header(const trainer *t)
{
	const st_config *c = t->c;
	st_info("Per train step: Total TFLOPs: %.3f, split as %.2f%% learnable weight flops and "
		"%.2f%% attention flops",
		t->flops.total / 1e12, 100 * t->flops.weights / t->flops.total,
		100 * t->flops.attention / t->flops.total);
	st_info("batch %lld x %lld tokens per device, gradient accumulation %lld, remat %s, %d threads",
		(long long)t->B, (long long)t->T, (long long)c->gradient_accumulation_steps,
		c->remat_policy == ST_REMAT_FULL ? "full" : c->remat_policy == ST_REMAT_MINIMAL ? "minimal" : "none",
		omp_get_max_threads());
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

static int write_metrics(trainer *t, int64_t step, double loss, int64_t total_weights,
			 double secs, double tflops, double tokens, double lr, double gnorm)
{
	json_t *o = json_pack("{s:f, s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:s}", "learning/loss", loss,
			      "learning/total_weights", (json_int_t)total_weights,
			      "learning/current_learning_rate", lr, "learning/grad_norm", gnorm,
			      "perf/step_time_seconds", secs, "perf/per_device_tflops_per_sec", tflops,
			      "perf/per_device_tokens_per_sec", tokens, "step", (json_int_t)step,
			      "run_name", t->c->run_name);
	if (!o)
		return st_fail(ST_EINTERNAL, "cannot build the metrics record");
	char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
	json_decref(o);
	if (!line)
		return st_fail(ST_ENOMEM, "out of memory (metrics)");
	int bad = fprintf(t->metrics, "%s\n", line) < 0 ||
		  (t->c->log_period > 0 && (step + 1) % t->c->log_period == 0 && fflush(t->metrics));
	free(line);
	if (bad)
		return st_fail(ST_EIO, "cannot write metrics_file '%s'", t->c->metrics_file);
	return 0;
}

static int train_step(trainer *t, int64_t step, double *loss_out, double *gnorm_out,
		      double *lr_out)
{
	const st_config *c = t->c;
	int64_t accum = c->gradient_accumulation_steps;
	float scale = (float)(1.0 / ((double)t->G * (double)t->T));
	double loss_sum = 0;
	st_llama_zero_grads(&t->model);
	for (int64_t a = 0; a < accum; a++) {
		int64_t first = step * t->G + a * t->B;
		int rc = st_dataset_read(t->data, first, t->B, t->tokens);
		if (rc < 0)
			return rc;
		rc = st_llama_forward_backward(&t->model, t->tokens, scale, &loss_sum);
		if (rc < 0)
			return rc;
	}
	double loss = loss_sum / ((double)t->G * (double)t->T);
	if (!isfinite(loss))
		return st_fail(ST_EINVAL, "loss is %f at step %lld; stopping (as MaxText's abort_on_nan_loss)",
			       loss, (long long)step);
	double gnorm = st_global_norm(t->model.grads, t->model.nparams);
	st_adamw h = {
		.lr = st_lr_at(c, step), .b1 = c->adam_b1, .b2 = c->adam_b2, .eps = c->adam_eps,
		.wd = c->adam_weight_decay, .t = step + 1, .grad_scale = 1.0f,
	};
	double clip = c->gradient_clipping_threshold;
	if (clip > 0 && gnorm > clip)
		h.grad_scale = (float)(clip / gnorm);
	st_adamw_update(t->model.params, t->model.grads, t->m, t->v, t->model.nparams, &h);
	*loss_out = loss;
	*gnorm_out = gnorm;
	*lr_out = h.lr;
	return 0;
}

static void trainer_release(trainer *t)
{
	st_llama_release(&t->model);
	st_dataset_free(t->data);
	free(t->m);
	free(t->v);
	free(t->tokens);
	if (t->metrics)
		fclose(t->metrics);
}

int st_train(const st_config *c, st_train_result *res)
{
	trainer t = {.c = c};
	int rc;
	memset(res, 0, sizeof(*res));
	st_mesh mesh; /* one process is one device until the distributed runtime */
	if ((rc = st_mesh_resolve(&mesh, c, 1, 1)) < 0)
		return rc;
	t.B = (int64_t)c->per_device_batch_size;
	t.T = c->max_target_length;
	t.G = t.B * c->gradient_accumulation_steps; /* one device for now */
	t.flops = st_training_flops(c, (double)t.B);

	st_llama_shape shape;
	st_llama_shape_from_config(&shape, c);
	int64_t nparams = st_llama_count_params(&shape);
	print_header(&t);
	if ((rc = check_memory(nparams, c->model_name)) < 0)
		goto out;
	if ((rc = st_llama_init(&t.model, &shape)) < 0)
		goto out;
	st_llama_init_weights(&t.model, (uint64_t)c->init_weights_seed);
	if ((rc = st_llama_alloc_acts(&t.model, t.B, t.T, c->remat_policy)) < 0)
		goto out;
	if ((rc = st_dataset_open(&t.data, c, t.G)) < 0)
		goto out;
	t.m = calloc((size_t)t.model.nparams, sizeof(float));
	t.v = calloc((size_t)t.model.nparams, sizeof(float));
	t.tokens = malloc((size_t)(t.B * (t.T + 1)) * sizeof(int32_t));
	if (!t.m || !t.v || !t.tokens) {
		rc = st_fail(ST_ENOMEM, "out of memory for optimizer state");
		goto out;
	}
	if (c->metrics_file[0] && !(t.metrics = fopen(c->metrics_file, "w"))) {
		rc = st_fail(ST_EIO, "cannot open metrics_file '%s': %s", c->metrics_file, strerror(errno));
		goto out;
	}
	st_info("activations %.1f MiB (remat %s)", (double)st_llama_act_bytes(&t.model) / (1 << 20),
		c->remat_policy == ST_REMAT_FULL ? "full" : c->remat_policy == ST_REMAT_MINIMAL ? "minimal" : "none");

	struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	stop_signal = 0;
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	int64_t total_weights = t.G * t.T;
	for (int64_t step = 0; step < c->steps; step++) {
		double t0 = now_s(), loss = 0, gnorm = 0, lr = 0;
		if ((rc = train_step(&t, step, &loss, &gnorm, &lr)) < 0)
			break;
		double secs = now_s() - t0;
		double tflops = t.flops.total / secs / 1e12;
		double tokens = (double)(t.T * t.B * c->gradient_accumulation_steps) / secs;
		printf("completed step: %lld, seconds: %.3f, TFLOP/s/device: %.3f, Tokens/s/device: %.3f, "
		       "total_weights: %lld, loss: %.3f\n",
		       (long long)step, secs, tflops, tokens, (long long)total_weights, loss);
		fflush(stdout);
		if (t.metrics &&
		    (rc = write_metrics(&t, step, loss, total_weights, secs, tflops, tokens, lr, gnorm)) < 0)
			break;
		if (step == 0)
			res->first_loss = loss;
		res->last_loss = loss;
		res->steps_done = step + 1;
		if (stop_signal && step + 1 < c->steps) {
			res->stop_signal = stop_signal;
			rc = st_fail(ST_EINTR, "stopped by signal %d after step %lld", (int)stop_signal,
				     (long long)step);
			break;
		}
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (rc == 0 && t.metrics && fflush(t.metrics))
		rc = st_fail(ST_EIO, "cannot write metrics_file '%s'", c->metrics_file);
out:
	trainer_release(&t);
	return rc;
}
