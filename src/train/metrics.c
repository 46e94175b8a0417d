#include "train/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "train/summary.h"

/* A metric: its name (MaxText's, in the metrics file and TensorBoard alike)
 * and where its value is in the struct it comes from. */
typedef struct field {
	const char *name;
	size_t off;
	int integer; /* an int64_t (else a double) */
} field;

/* In the order the records and scalars are written. */
static const field step_fields[] = {
	{"learning/loss", offsetof(st_step_metrics, loss), 0},
	{"learning/total_weights", offsetof(st_step_metrics, total_weights), 1},
	{"learning/current_learning_rate", offsetof(st_step_metrics, lr), 0},
	{"learning/grad_norm", offsetof(st_step_metrics, grad_norm), 0},
	{"perf/step_time_seconds", offsetof(st_step_metrics, seconds), 0},
	{"perf/per_device_tflops_per_sec", offsetof(st_step_metrics, tflops), 0},
	{"perf/per_device_tokens_per_sec", offsetof(st_step_metrics, tokens), 0},
};
static const field eval_fields[] = {
	{"eval/total_loss", offsetof(st_eval_result, total_loss), 0},
	{"eval/total_weights", offsetof(st_eval_result, total_weights), 1},
	{"eval/avg_loss", offsetof(st_eval_result, avg_loss), 0},
};
enum { NSTEP = sizeof(step_fields) / sizeof(step_fields[0]), NEVAL = sizeof(eval_fields) / sizeof(eval_fields[0]) };

static double value(const field *f, const void *src)
{
	const char *p = (const char *)src + f->off;
	return f->integer ? (double)*(const int64_t *)p : *(const double *)p;
}

int st_metrics_is_record(const char *line)
{
	/* every step record has the first step metric, every eval record the last eval one */
	const char *names[2] = {step_fields[0].name, eval_fields[NEVAL - 1].name};
	for (int i = 0; i < 2; i++) {
		const char *p = line;
		size_t n = strlen(names[i]);
		while ((p = strstr(p, names[i])) != NULL) {
			if (p > line && p[-1] == '"' && p[n] == '"')
				return 1;
			p += n;
		}
	}
	return 0;
}

int st_metrics_open(st_metrics *m, const st_config *c, int lead, int append, int elastic, int64_t step0,
		    int announce)
{
	int64_t events = m->tb_events;
	*m = (st_metrics)ST_METRICS_INIT;
	m->c = c;
	m->lead = lead;
	m->elastic = elastic;
	/* the controller's events are read on from where this process left them
	 * while it leads */
	m->tb_events = lead ? events : -1;
	if (!lead)
		return 0;
	if (c->metrics_file[0] && !(m->file = fopen(c->metrics_file, append ? "a" : "w")))
		return st_fail(ST_EIO, "cannot open metrics_file '%s': %s", c->metrics_file, strerror(errno));
	if (!c->enable_tensorboard)
		return 0;
	/* a new event file for every group this process leads */
	int rc = st_summary_open(&m->tb, c);
	/* before this group's first record: what precedes it is an earlier writer's */
	if (rc == 0 && elastic)
		rc = st_summary_controller_events(m->tb, c->metrics_file, &m->tb_events, step0);
	if (rc == 0 && announce) {
		char dir[ST_PATH_MAX];
		if (st_summary_dir(c, dir, sizeof(dir)) == 0)
			st_info("TensorBoard: tensorboard --logdir=%s", dir);
	}
	return rc;
}

void st_metrics_describe(st_metrics *m, const st_run_info *run) { m->run = *run; }

/* One record of metrics_file (o is taken), 17 significant digits: a double
 * read back is the same double (tests compare runs through this file, not
 * through the 3-decimal log line). Flushed every record: a process killed
 * later keeps the steps it reported (an elastic run's kept history reads them). */
static int write_record(st_metrics *m, const field *fs, int n, const void *src, int64_t step)
{
	json_t *o = json_object();
	int bad = !o;
	for (int i = 0; i < n && !bad; i++)
		bad = json_object_set_new(o, fs[i].name, fs[i].integer ? json_integer((json_int_t)value(&fs[i], src))
								       : json_real(value(&fs[i], src)));
	if (!bad)
		bad = json_object_set_new(o, "step", json_integer((json_int_t)step)) ||
		      json_object_set_new(o, "run_name", json_string(m->c->run_name));
	char *line = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(o);
	if (!line)
		return st_fail(ST_ENOMEM, "out of memory (metrics)");
	bad = fprintf(m->file, "%s\n", line) < 0 || fflush(m->file);
	free(line);
	if (bad)
		return st_fail(ST_EIO, "cannot write metrics_file '%s'", m->c->metrics_file);
	return 0;
}

/* The scalars of one record, under the same names. */
static int write_scalars(st_metrics *m, const field *fs, int n, const void *src, int64_t step)
{
	int rc = 0;
	for (int i = 0; i < n && rc == 0; i++)
		rc = st_tfevents_scalar(m->tb, step, fs[i].name, value(&fs[i], src));
	return rc;
}

/*
 * The TensorBoard start of this event file, at the first step it records:
 * where the state came from (run/start), and as MaxText writes them the
 * model's parameter count and the config (text).
 */
static int tb_start(st_metrics *m, int64_t step)
{
	const st_run_info *r = &m->run;
	char text[1024], gen[48] = "";
	int rc;
	if (r->generation >= 0)
		snprintf(gen, sizeof(gen), ", elastic generation %lld", (long long)r->generation);
	snprintf(text, sizeof(text), "step %lld: %d process%s (%s), global batch %lld x %lld tokens%s; %s",
		 (long long)step, r->world, r->world == 1 ? "" : "es", r->mesh, (long long)r->global_batch,
		 (long long)r->seq_len, gen, r->origin);
	if ((rc = st_tfevents_text(m->tb, step, "run/start", text)) < 0)
		return rc;
	snprintf(text, sizeof(text), "%lld", (long long)r->nparams);
	if ((rc = st_tfevents_text(m->tb, step, "num_model_parameters", text)) < 0)
		return rc;
	char *json = NULL;
	if ((rc = st_config_to_json(m->c, &json)) < 0)
		return rc;
	size_t n = strlen(json);
	char *md = malloc(n + 16);
	if (md) { /* a code block: markdown would eat its underscores */
		snprintf(md, n + 16, "```\n%s\n```", json);
		rc = st_tfevents_text(m->tb, step, "config", md);
	} else {
		rc = st_fail(ST_ENOMEM, "out of memory (TensorBoard text)");
	}
	free(md);
	free(json);
	m->tb_started = rc == 0;
	return rc;
}

int st_metrics_step(st_metrics *m, const st_step_metrics *s)
{
	if (!m->lead)
		return 0;
	printf("completed step: %lld, seconds: %.3f, TFLOP/s/device: %.3f, Tokens/s/device: %.3f, "
	       "total_weights: %lld, loss: %.3f\n",
	       (long long)s->step, s->seconds, s->tflops, s->tokens, (long long)s->total_weights, s->loss);
	fflush(stdout);
	int rc = 0;
	if (m->file && (rc = write_record(m, step_fields, NSTEP, s, s->step)) < 0)
		return rc;
	if (!m->tb)
		return 0;
	if (!m->tb_started)
		rc = tb_start(m, s->step);
	if (rc == 0)
		rc = write_scalars(m, step_fields, NSTEP, s, s->step);
	if (rc == 0 && m->elastic) /* the controller's new events */
		rc = st_summary_controller_events(m->tb, m->c->metrics_file, &m->tb_events, s->step);
	return rc < 0 ? rc : st_tfevents_flush(m->tb);
}

int st_metrics_eval(st_metrics *m, int64_t step, const st_eval_result *e)
{
	if (!m->lead)
		return 0;
	/* MaxText's line; its total_weights is a float there ("75264.0") */
	printf("eval metrics after step: %lld, loss=%.3f, total_weights=%lld.0\n", (long long)step, e->avg_loss,
	       (long long)e->total_weights);
	fflush(stdout);
	int rc;
	if (m->file && (rc = write_record(m, eval_fields, NEVAL, e, step)) < 0)
		return rc;
	if (!m->tb)
		return 0;
	if ((rc = write_scalars(m, eval_fields, NEVAL, e, step)) < 0)
		return rc;
	return st_tfevents_flush(m->tb);
}

int st_metrics_flush(st_metrics *m)
{
	if (m->file && fflush(m->file))
		return st_fail(ST_EIO, "cannot write metrics_file '%s'", m->c->metrics_file);
	return m->tb ? st_tfevents_flush(m->tb) : 0;
}

void st_metrics_close(st_metrics *m)
{
	if (m->file)
		fclose(m->file);
	m->file = NULL;
	st_tfevents_close(m->tb); /* the run's end reported a failed last write (st_metrics_flush) */
	m->tb = NULL;
	m->tb_started = 0;
}
