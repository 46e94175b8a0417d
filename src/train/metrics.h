/*
 * metrics.h - what a training run reports, and where (docs/observability.md).
 *
 * One st_step_metrics value per step (and one st_eval_result per eval) goes
 * to every sink of the process that leads its group (rank 0):
 *  - stdout: MaxText's lines
 *      completed step: N, seconds: X.XXX, TFLOP/s/device: X.XXX, Tokens/s/device: X.XXX, total_weights: N, loss: X.XXX
 *      eval metrics after step: N, loss=X.XXX, total_weights=N.0
 *  - metrics_file: one JSON record per step and per eval, MaxText's keys,
 *    17 significant digits (a double read back is the same double);
 *  - TensorBoard (enable_tensorboard): the same values as scalars under the
 *    same names, the run's start as text, and under the elastic launcher the
 *    controller's events (train/summary.h).
 * Each metric's name is spelled once, in metrics.c's tables. Other
 * processes have no sinks: every call is a no-op there.
 *
 *   st_metrics m = ST_METRICS_INIT;
 *   rc = st_metrics_open(&m, c, lead, append, elastic, step0);  // per group this process is in
 *   st_metrics_describe(&m, &run);                              // before the first step's record
 *   rc = st_metrics_step(&m, &s);                               // each step
 *   rc = st_metrics_eval(&m, step, &e);                         // each eval
 *   rc = st_metrics_flush(&m);                                  // at the end
 *   st_metrics_close(&m);
 */
#ifndef ST_TRAIN_METRICS_H
#define ST_TRAIN_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "base/tfevents.h"
#include "config/config.h"
#include "train/eval.h"

/* One step's figures. */
typedef struct st_step_metrics {
	int64_t step;
	double loss;
	int64_t total_weights;   /* tokens the loss was taken over */
	double lr, grad_norm;    /* the update's learning rate; the gradient's global norm before clipping */
	double seconds;          /* the step's wall time */
	double tflops, tokens;   /* per device and second */
} st_step_metrics;

/* What TensorBoard's start summary of a group says (run/start, the
 * parameter count, the config), written at the group's first record. */
typedef struct st_run_info {
	int world;              /* processes */
	char mesh[256];         /* st_par_describe */
	int64_t global_batch, seq_len;
	int64_t generation;     /* elastic generation, -1: none */
	char origin[200];       /* where the state came from */
	int64_t nparams;
} st_run_info;

typedef struct st_metrics {
	const st_config *c;
	int lead;
	int elastic;          /* under the elastic launcher: the controller's events go to TensorBoard */
	FILE *file;           /* metrics_file, or NULL */
	st_tfevents *tb;      /* TensorBoard, or NULL */
	int tb_started;       /* the event file holds the start summaries */
	int64_t tb_events;    /* bytes of metrics_file read for the controller's events; -1: none yet.
			         Kept from group to group while this process leads */
	st_run_info run;
} st_metrics;

#define ST_METRICS_INIT {.tb_events = -1}

/* The sinks for a group this process is in (lead: rank 0 of it). append:
 * metrics_file is appended to (a later group of the same run), else
 * created. elastic: the controller writes its events into metrics_file;
 * those before step `step0` (an earlier writer's) are carried into the new
 * event file now. announce: print where TensorBoard reads from. */
int st_metrics_open(st_metrics *m, const st_config *c, int lead, int append, int elastic, int64_t step0,
		    int announce);
void st_metrics_describe(st_metrics *m, const st_run_info *run);
int st_metrics_step(st_metrics *m, const st_step_metrics *s);
int st_metrics_eval(st_metrics *m, int64_t step, const st_eval_result *e);
int st_metrics_flush(st_metrics *m);
/* Closes the sinks; tb_events stays for the next group while it leads. */
void st_metrics_close(st_metrics *m);

/* A line of metrics_file that is a step's or an eval's record (not one of
 * the controller's event lines). */
int st_metrics_is_record(const char *line);

#endif
