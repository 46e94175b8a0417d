/*
 * train.c - the training loop and the step (train/train.h).
 *
 *   st_train:  setup, the steps, the end
 *   run_steps: each step and what follows it (report, save, eval, agree
 *              on a stop); one way on after a failure: re-form in place
 *   train_step: micro-batches forward and backward, the loss and gradient
 *              reductions, the global norm, AdamW
 * The rest lives beside it (train/trainer_int.h): setup.c builds the
 * trainer, reform.c re-forms an elastic group, and the modules it calls
 * report (metrics.h), save and restore (checkpoint.h), pick the bf16
 * kernels (kernels.h) and read the test knobs (knobs.h).
 */
#include "train/train.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/status.h"
#include "train/trainer_int.h"

/* ---- stop signals ----
 * SIGINT, SIGTERM (a preemption notice) and SIGUSR1 (the elastic
 * controller's resize request) set stop_signal; the loop agrees on it at the
 * next step boundary. */
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

/* The agent's abort (ST_SIG_ABORT, sigqueue'd with the generation): the
 * group of that generation gives up its collectives in flight. */
static void on_abort(int sig, siginfo_t *si, void *ctx)
{
	(void)sig;
	(void)ctx;
	st_group_abort_gen(si->si_code == SI_QUEUE ? si->si_value.sival_int : 0);
}

/* The step watchdog (train/watchdog.h) found the compute thread stuck: the
 * agent kills this worker and its slice is replaced. */
static void on_hang(void *arg, const char *why)
{
	const trainer *t = arg;
	st_warn("rank %d: the compute thread is %s: no collective and no step end for that long, where the "
		"limit is %d x the longest such gap of the last %d steps, at least --step-watchdog-ms; asking the "
		"agent to replace this worker", t->par.rank, why, ST_WATCHDOG_FACTOR, ST_WATCHDOG_STEPS);
	if (st_worker_ctl_hung(t->ctl, why) < 0)
		st_warn("rank %d: cannot tell the agent: %s", t->par.rank, st_errmsg());
}

static const int stop_sigs[3] = {SIGINT, ST_SIG_NOTICE, ST_SIG_RESIZE};
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

/* Every process stops after the same step: a signal seen by any stops all
 * (the largest number wins); a reform the agent sent (a grow) re-forms
 * all. */
static int agree_stop(trainer *t, int *sig, int *reform_now)
{
	int rc = trainer_poll_reform(t);
	if (rc < 0)
		return rc;
	int64_t v[2] = {stop_signal, t->have_pending};
	rc = st_comm_allreduce(t->par.world_comm, v, 2, ST_DTYPE_I64, ST_MAX);
	*sig = (int)v[0];
	*reform_now = (int)v[1];
	return rc;
}

/* ---- the step ---- */

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

/* Step `step`: its loss, gradient norm and learning rate into m. */
static int train_step(trainer *t, int64_t step, st_step_metrics *m)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	float scale = (float)(1.0 / ((double)t->G * (double)t->T));
	double loss_sum = 0;
	int rc;
	st_llama_zero_grads(&t->model);
	if (t->fsdp)
		st_fsdp_begin_step(t->fsdp);
	double t0 = st_mono_s();
	for (int64_t a = 0; a < t->accum; a++) {
		/* this shard's rows of micro-batch a, by global sample index */
		int64_t first = t->sample0 + (step - t->step0) * t->G + a * (t->G / t->accum) + p->dp_index * t->rows;
		if ((rc = st_dataset_read(t->data, first, t->rows, t->tokens)) < 0)
			return rc;
		st_test_knobs_log_samples(&t->knobs, step, first, t->rows);
		if ((rc = st_llama_forward_backward(&t->model, t->tokens, scale, &loss_sum)) < 0)
			return rc;
		if (t->gsum)
			sum_micro_batch(t, a);
	}
	st_test_knobs_slow(&t->knobs);
	/* this process's compute up to the gradient collective: the controller
	 * compares it across hosts (stragglers) */
	t->compute_s = st_mono_s() - t0;
	if ((rc = st_comm_allreduce(p->batch, &loss_sum, 1, ST_DTYPE_F64, ST_SUM)) < 0)
		return rc;
	double loss = loss_sum / ((double)t->G * (double)t->T);
	if (!isfinite(loss))
		return st_fail(ST_EINVAL, "loss is %f at step %lld; stopping (as MaxText's abort_on_nan_loss)", loss,
			       (long long)step);
	double gnorm;
	if ((rc = st_shard_reduce_grads(&t->shard, &t->model, p)) < 0 ||
	    (rc = st_shard_grad_norm(&t->shard, &t->model, p, &gnorm)) < 0)
		return rc;
	st_run_ckpt_before_update(&t->ckpt, step, t->lead);
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
	/* AdamW; a save of its result, when one is due, takes its checksums from it */
	st_shard *sh = &t->shard;
	if ((rc = st_adamw_update_crc(sh->p, wb, sh->g, sh->m, sh->v, sh->n, &h,
				      st_run_ckpt_crc_request(&t->ckpt, step + 1))) < 0)
		return rc;
	st_run_ckpt_crc_taken(&t->ckpt, step + 1);
	if (t->fsdp)
		st_fsdp_end_step(t->fsdp); /* gathered lazily by the next forward */
	else if (!wb && ((rc = st_shard_gather_params(sh, &t->model, p)) < 0 ||
			 (rc = st_llama_weights_changed(&t->model)) < 0))
		return rc;
	m->loss = loss;
	m->grad_norm = gnorm;
	m->lr = h.lr;
	return 0;
}

/* After step `step`, when eval_interval says so: the eval loss over the
 * eval data, to the sinks. */
static int maybe_eval(trainer *t, int64_t step)
{
	if (!t->eval.data || !st_eval_due(t->c, step))
		return 0;
	st_eval_job job = {.model = &t->model, .fsdp = t->fsdp, .par = &t->par, .tokens = t->tokens,
			   .rows = t->rows, .accum = t->accum, .T = t->T};
	st_eval_result e;
	int rc = st_eval_run(&t->eval, &job, &e);
	return rc < 0 ? rc : st_metrics_eval(&t->out, step, &e);
}

/* What a save after `done` completed steps records. */
static st_run_state run_state(const trainer *t, int64_t done)
{
	return (st_run_state){.next_sample = t->sample0 + (done - t->step0) * t->G, .global_batch = t->G,
			      .mesh = t->mesh_desc, .lead = t->lead};
}

/* ---- the loop ---- */

/* Step `step` and what follows it: its figures to the sinks, a save and an
 * eval when due, and the group's agreement on a stop signal (*sig) or a
 * re-formation (*reform_now). */
static int one_step(trainer *t, int64_t step, st_train_result *res, int64_t *saved_at, int *sig, int *reform_now)
{
	st_test_knobs_hang(&t->knobs, step);
	double t0 = st_mono_s();
	st_step_metrics m = {.step = step, .total_weights = t->G * t->T};
	int rc = train_step(t, step, &m);
	if (rc < 0)
		return rc;
	t->done = step + 1;
	st_test_knobs_pace(&t->knobs, t0);
	st_watchdog_step(t->wd);
	if (t->ctl && st_worker_ctl_step(t->ctl, step, t->compute_s) < 0)
		st_warn("rank %d: cannot tell the agent step %lld's compute time: %s", t->par.rank, (long long)step,
			st_errmsg());
	m.seconds = st_mono_s() - t0;
	m.tflops = t->flops.total / m.seconds / 1e12;
	m.tokens = (double)(t->T * t->B * t->accum) / m.seconds;
	if ((rc = st_metrics_step(&t->out, &m)) < 0)
		return rc;
	if (step == t->step0)
		res->first_loss = m.loss;
	res->last_loss = m.loss;
	res->steps_done = step + 1;
	st_run_state s = run_state(t, step + 1);
	/* a save (its wait for the one before) and an eval are not steps: the watchdog pauses */
	st_watchdog_pause(t->wd);
	rc = st_run_ckpt_maybe_save(&t->ckpt, step + 1, &s);
	if (rc == 1)
		*saved_at = step + 1;
	/* after the save: its copy is taken, the write overlaps the eval */
	if (rc >= 0)
		rc = maybe_eval(t, step);
	st_watchdog_resume(t->wd, 0);
	return rc < 0 ? rc : agree_stop(t, sig, reform_now);
}

/* The steps from t->step0 to c->steps, or until an agreed stop signal (then
 * with a save at the stop) or an error. Under an elastic agent a failed step
 * or an agreed grow re-forms the group in place and goes on. */
static int run_steps(trainer *t, st_train_result *res)
{
	const st_config *c = t->c;
	int64_t saved_at = -1;
	if (t->step0 >= c->steps && t->lead)
		st_info("the run already completed its %lld steps", (long long)c->steps);
	for (int64_t step = t->step0; step < c->steps;) {
		int sig = 0, reform_now = 0;
		int rc = one_step(t, step, res, &saved_at, &sig, &reform_now);
		int last = step + 1 >= c->steps;
		if (rc == 0 && sig && !last) {
			res->stop_signal = sig;
			st_run_state s = run_state(t, step + 1);
			st_watchdog_stop(t->wd);
			t->wd = NULL;
			return st_run_ckpt_stop(&t->ckpt, step + 1, saved_at == step + 1, sig, &s, &t->par);
		}
		if (rc == 0 && !(reform_now && !last)) {
			step++;
			continue;
		}
		/* a failed step, or an agreed re-formation: the group re-forms in
		 * place and goes on from the steps it holds */
		st_watchdog_pause(t->wd);
		int64_t from = trainer_reform(t, rc);
		st_watchdog_resume(t->wd, 1);
		if (from < 0)
			return (int)from;
		step = from, saved_at = -1;
	}
	return 0;
}

int st_train(const st_config *c, st_train_result *res)
{
	trainer t = {.c = c, .out = ST_METRICS_INIT, .ckpt = ST_RUN_CKPT_INIT, .generation = -1};
	stop_handlers h = {0};
	memset(res, 0, sizeof(*res));
	/* the agent's abort may come from the first join on (SA_ONSTACK: the
	 * alternate stack is set up with the stop handlers; before it, the
	 * thread's own) */
	struct sigaction ab = {.sa_sigaction = on_abort, .sa_flags = SA_ONSTACK | SA_SIGINFO | SA_RESTART}, old_ab;
	sigemptyset(&ab.sa_mask);
	int rc = st_group_abort_init();
	sigaction(ST_SIG_ABORT, &ab, &old_ab);
	if (rc == 0)
		rc = trainer_setup(&t);
	if (rc == 0 && t.ctl)
		rc = st_watchdog_start(&t.wd, t.env.watchdog_ms, on_hang, &t);
	if (rc == 0) {
		stop_handlers_install(&h);
		rc = run_steps(&t, res);
		st_watchdog_stop(t.wd);
		t.wd = NULL;
		/* after the last step: the sinks flushed, the last save committed */
		if (rc == 0)
			rc = st_metrics_flush(&t.out);
		if (rc == 0)
			rc = st_run_ckpt_finish(&t.ckpt, t.lead);
	}
	/* a stop by signal is agreed by every process after the same step: the
	 * save in flight commits (only a failure aborts it) */
	trainer_release(&t, rc < 0 && rc != ST_EINTR);
	/* the handlers stay until the group is left: a launcher's SIGTERM to the
	 * last ranks of a stopping group must not kill them on the way out */
	stop_handlers_restore(&h);
	sigaction(ST_SIG_ABORT, &old_ab, NULL);
	return rc;
}
