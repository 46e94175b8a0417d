#include "train/eval.h"

#include <inttypes.h>

#include "base/clock.h"
#include "base/err.h"
#include "comm/comm.h"

int st_eval_due(const st_config *c, int64_t step)
{
	return c->eval_interval > 0 && (step + 1) % c->eval_interval == 0;
}

int st_eval_open(st_eval *e, const st_config *c, int64_t G, int lead)
{
	e->data = NULL;
	e->batches = 0;
	e->G = G;
	if (c->eval_interval <= 0)
		return 0;
	int rc = st_dataset_open_eval(&e->data, c, G);
	if (rc < 0)
		return rc;
	int64_t n = st_dataset_num_samples(e->data);
	int tokens = c->dataset_type == ST_DATA_TOKENS;
	e->batches = c->eval_steps > 0 ? c->eval_steps : n / G;
	if (e->batches == 0) {
		st_eval_close(e);
		return st_fail(ST_EINVAL, "grain_eval_files '%s': %" PRId64 " eval samples of max_target_length+1 "
			       "tokens, fewer than one eval batch of %" PRId64 " (the global batch); add eval data, or "
			       "set eval_steps > 0 to read the samples more than once", c->grain_eval_files, n, G);
	}
	if (!lead)
		return 0;
	if (!tokens)
		st_info("eval every %" PRId64 " steps: %" PRId64 " batch%s of %" PRId64 " synthetic rows of their own",
			c->eval_interval, e->batches, e->batches == 1 ? "" : "es", G);
	else if (e->batches * G > n)
		st_warn("eval every %" PRId64 " steps: eval_steps %" PRId64 " x %" PRId64 " rows is more than the %" PRId64
			" eval samples: samples are evaluated more than once", c->eval_interval, e->batches, G, n);
	else
		st_info("eval every %" PRId64 " steps: %" PRId64 " batch%s of %" PRId64 " rows, %" PRId64 " of the %" PRId64
			" eval samples", c->eval_interval, e->batches, e->batches == 1 ? "" : "es", G, e->batches * G, n);
	return 0;
}

int st_eval_run(st_eval *e, const st_eval_job *job, st_eval_result *res)
{
	const st_par *p = job->par;
	double t0 = st_mono_s(), sum = 0;
	int rc = 0;
	int64_t micro = e->G / job->accum; /* rows of one micro-batch over the group */
	for (int64_t k = 0; k < e->batches && rc == 0; k++)
		for (int64_t a = 0; a < job->accum && rc == 0; a++) {
			int64_t first = k * e->G + a * micro + p->dp_index * job->rows;
			if ((rc = st_dataset_read(e->data, first, job->rows, job->tokens)) == 0)
				rc = st_llama_forward_loss(job->model, job->tokens, &sum);
		}
	/* the gathered weights go stale again, as the optimizer step left them:
	 * the next training step gathers exactly what it would have */
	if (job->fsdp)
		st_fsdp_end_step(job->fsdp);
	if (rc < 0 || (rc = st_comm_allreduce(p->batch, &sum, 1, ST_DTYPE_F64, ST_SUM)) < 0)
		return rc;
	res->total_loss = sum;
	res->total_weights = e->batches * e->G * job->T;
	res->avg_loss = sum / (double)res->total_weights;
	res->seconds = st_mono_s() - t0;
	return 0;
}

void st_eval_close(st_eval *e)
{
	st_dataset_free(e->data);
	e->data = NULL;
}
