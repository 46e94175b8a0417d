/*
 * clock.h - the one monotonic clock: durations, deadlines, step times.
 *
 * CLOCK_MONOTONIC never jumps with wall-clock changes, so deadlines and
 * measured step times stay meaningful across NTP adjustments.
 */
#ifndef ST_BASE_CLOCK_H
#define ST_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds since an arbitrary fixed point (deadlines, timeouts). */
static inline int64_t st_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The same clock in seconds (measured durations). */
static inline double st_mono_s(void) { return 1e-9 * (double)st_mono_ns(); }

#endif
