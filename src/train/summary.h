/*
 * summary.h - the TensorBoard side of a run (enable_tensorboard;
 * docs/observability.md): rank 0's event file, and the elastic controller's
 * events carried over from metrics_file as text summaries.
 *
 *   st_tfevents *w;
 *   rc = st_summary_open(&w, c);   // <base_output_directory>/<run_name>/tensorboard/events.out.tfevents.*
 *   ... each step: the step's scalars (train/metrics.c: st_metrics_step) ...
 *   rc = st_summary_controller_events(w, c->metrics_file, &off, step);
 *   rc = st_tfevents_flush(w);
 *
 * Every process lifetime as rank 0, and every generation of an elastic run,
 * writes a file of its own in the same directory; TensorBoard reads them all.
 */
#ifndef ST_TRAIN_SUMMARY_H
#define ST_TRAIN_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "base/tfevents.h"
#include "config/config.h"

/* <base_output_directory>/<run_name>/tensorboard into buf; ST_EINVAL when too long. */
int st_summary_dir(const st_config *c, char *buf, size_t cap);
/* A new event file in that directory (created as needed). Errors: tfevents.h. */
int st_summary_open(st_tfevents **out, const st_config *c);

/*
 * The elastic controller appends JSON event lines ({"event": "failure" |
 * "shrink" | "grow" | "preemption" | "reform" | "restore" | "summary", "step":
 * N, ...}) to metrics_file between generations. Write each complete event
 * line found past byte *off as a text summary "elastic/events" at the
 * event's step (else at step), and move *off past the lines read. *off < 0:
 * a writer that has read nothing yet starts after the file's last training
 * or eval record (the events before it were written by an earlier
 * generation's rank 0). A missing file or an empty metrics_file: nothing.
 * ST_EIO when the file cannot be read; the writer's errors.
 */
int st_summary_controller_events(st_tfevents *w, const char *metrics_file, int64_t *off, int64_t step);

#endif
