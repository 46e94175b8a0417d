/*
 * progress.h - progress lines on stderr for long operations (export,
 * import, verify): nothing during the first 3 s, so short operations stay
 * quiet, then one st_info line every 5 s, and a final line at the end if
 * any was printed:
 *
 *   slicetrain: export of step 20: 1.20 of 1.50 GB (80%), 912 MB/s
 *
 *   st_progress p;
 *   st_progress_init(&p, "export of step 20", total_bytes);   // what: kept, not copied
 *   for (...) { ...; st_progress_add(&p, nbytes); }
 *   st_progress_end(&p);
 *
 * st_progress_add and st_progress_end accept NULL (no progress wanted), so
 * code that reports optionally can pass its pointer through. One thread.
 */
#ifndef ST_BASE_PROGRESS_H
#define ST_BASE_PROGRESS_H

#include <stdint.h>

typedef struct st_progress {
	const char *what;
	double t0, last; /* st_mono_s() at init and at the last line */
	int64_t total, done;
	int printed;
} st_progress;

void st_progress_init(st_progress *p, const char *what, int64_t total_bytes);
void st_progress_add(st_progress *p, int64_t bytes);
void st_progress_end(st_progress *p);

#endif
