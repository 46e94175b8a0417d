/*
 * knobs.h - the trainer's test knobs: environment variables that tests and
 * benchmarks set to pace or observe a run, never needed to train
 * (docs/testing.md, "Test knobs"). Read once, at the trainer's start.
 *
 *   SLICETRAIN_MIN_STEP_SECONDS=S  every step lasts at least S seconds (0 to
 *                                  3600): the worker sleeps the rest, a
 *                                  signal cuts the sleep short. The elastic
 *                                  tests pace a cheap model's steps so that
 *                                  a slice's repair falls inside the run on
 *                                  any CPU without burning it.
 *   SLICETRAIN_SAMPLE_LOG=PATH     each process of tensor coordinate 0
 *                                  appends "STEP SAMPLE" for every row it
 *                                  reads to PATH.RANK, flushed after each
 *                                  micro-batch: which global samples each
 *                                  step trained, across restarts and kills.
 *   SLICETRAIN_TEST_SAVE_SECONDS=S each save's writer waits S seconds (0 to
 *                                  3600) before it writes (in the background
 *                                  with async saves): saves in flight for
 *                                  the partition benchmark.
 *   SLICETRAIN_TEST_SLOW_FILE=PATH while PATH exists, each step's compute
 *                                  takes the seconds it holds (0 to 60)
 *                                  longer: a slow host for the straggler
 *                                  detection.
 *   SLICETRAIN_TEST_HANG_FILE=PATH while PATH exists, the compute thread
 *                                  blocks at the start of its next step
 *                                  (checked every 10 ms); the process's
 *                                  other threads go on: a stuck compute
 *                                  thread for the step watchdog to find.
 */
#ifndef ST_TRAIN_KNOBS_H
#define ST_TRAIN_KNOBS_H

#include <stdint.h>
#include <stdio.h>

#include "base/path.h"

typedef struct st_test_knobs {
	double min_step_s;            /* 0: no floor */
	double save_delay_s;          /* 0: none */
	char sample_log[ST_PATH_MAX]; /* "": none */
	char hang_file[ST_PATH_MAX];  /* "": none */
	char slow_file[ST_PATH_MAX];  /* "": none */
	FILE *log;                    /* this process's sample log, while open */
} st_test_knobs;

/* ST_EINVAL naming the variable for a malformed value. */
int st_test_knobs_read(st_test_knobs *k);
/* This process's sample log (when SLICETRAIN_SAMPLE_LOG is set and
 * writes: tensor coordinate 0), appended to. ST_EIO when it cannot open. */
int st_test_knobs_open_log(st_test_knobs *k, int rank, int writes);
/* Rows first .. first+rows-1 read for step `step`. */
void st_test_knobs_log_samples(st_test_knobs *k, int64_t step, int64_t first, int64_t rows);
void st_test_knobs_close_log(st_test_knobs *k);
/* The checkpoint writer's hook (st_ckpt_opts.before_write; arg: the
 * knobs): wait save_delay_s. */
void st_test_knobs_before_save(void *arg, int64_t step);
/* The slow hook: sleep what the slow file holds, while it exists. */
void st_test_knobs_slow(const st_test_knobs *k);
/* The hang hook: block while the hang file exists, before step `step`. */
void st_test_knobs_hang(const st_test_knobs *k, int64_t step);
/* Sleep out the rest of a step begun at t0 (st_mono_s). */
void st_test_knobs_pace(const st_test_knobs *k, double t0);

#endif
