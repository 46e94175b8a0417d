/*
 * watchdog.c - the step watchdog (train/watchdog.h): one thread, polling.
 */
#include "train/watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "comm/comm.h"

struct st_watchdog {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop, paused, fired, floor_ms;
	int skip;                     /* the next step end only marks: the first after a start or resume */
	int64_t mark_ns;              /* the last step's end or resume */
	int64_t step_max_ns;          /* the longest gap of the step in progress */
	int64_t gaps_ms[ST_WATCHDOG_STEPS];
	int ngaps, next;              /* the ring of the last steps' longest gaps */
	int64_t limit_ms;             /* 0: not armed */
	st_watchdog_hang_fn on_hang;
	void *arg;
};

int64_t st_watchdog_limit_ms(int floor_ms, const int64_t *gaps_ms, int n)
{
	if (n <= 0)
		return 0;
	int64_t longest = 0;
	for (int i = 0; i < n; i++)
		if (gaps_ms[i] > longest)
			longest = gaps_ms[i];
	int64_t lim = longest * ST_WATCHDOG_FACTOR;
	return lim > floor_ms ? lim : floor_ms;
}

/* The current gap (w->mu held): time outside collectives since the last
 * collective began or ended, or the last mark; 0 inside one. */
static int64_t gap_ns(const st_watchdog *w, int64_t now)
{
	int inside;
	int64_t last;
	st_comm_activity(&inside, &last);
	if (inside)
		return 0;
	int64_t since = last > w->mark_ns ? last : w->mark_ns;
	return now > since ? now - since : 0;
}

static void *watch(void *arg)
{
	st_watchdog *w = arg;
	pthread_setname_np(pthread_self(), "step-watchdog");
	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += ST_WATCHDOG_POLL_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&w->cv, &w->mu, &ts);
		if (w->stop || w->paused || w->fired)
			continue;
		int64_t g = gap_ns(w, st_mono_ns());
		if (g > w->step_max_ns)
			w->step_max_ns = g;
		if (!w->limit_ms || g <= w->limit_ms * 1000000)
			continue;
		w->fired = 1;
		char why[200];
		snprintf(why, sizeof(why), "stuck: no step progress for %.2f s (the step watchdog's limit %.2f s)",
			 (double)g / 1e9, (double)w->limit_ms / 1e3);
		pthread_mutex_unlock(&w->mu);
		w->on_hang(w->arg, why);
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int st_watchdog_start(st_watchdog **out, int floor_ms, st_watchdog_hang_fn on_hang, void *arg)
{
	*out = NULL;
	if (floor_ms <= 0)
		return 0;
	st_watchdog *w = calloc(1, sizeof(*w));
	if (!w)
		return st_fail(ST_ENOMEM, "out of memory");
	w->floor_ms = floor_ms;
	w->on_hang = on_hang;
	w->arg = arg;
	w->mark_ns = st_mono_ns();
	w->skip = 1;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, &ca);
	pthread_condattr_destroy(&ca);
	int e = pthread_create(&w->th, NULL, watch, w);
	if (e) {
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		free(w);
		return st_fail(ST_EIO, "the step watchdog's thread: %s", strerror(e));
	}
	*out = w;
	return 0;
}

void st_watchdog_step(st_watchdog *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	int64_t now = st_mono_ns(), g = gap_ns(w, now);
	if (!w->paused && !w->skip) {
		if (g > w->step_max_ns)
			w->step_max_ns = g;
		w->gaps_ms[w->next] = (w->step_max_ns + 999999) / 1000000;
		w->next = (w->next + 1) % ST_WATCHDOG_STEPS;
		if (w->ngaps < ST_WATCHDOG_STEPS)
			w->ngaps++;
		w->limit_ms = st_watchdog_limit_ms(w->floor_ms, w->gaps_ms, w->ngaps);
	}
	w->skip = 0;
	w->step_max_ns = 0;
	w->mark_ns = now;
	pthread_mutex_unlock(&w->mu);
}

void st_watchdog_pause(st_watchdog *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->paused++;
	pthread_mutex_unlock(&w->mu);
}

void st_watchdog_resume(st_watchdog *w, int warmup)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	if (w->paused > 0)
		w->paused--;
	w->skip |= warmup;
	w->step_max_ns = 0;
	w->mark_ns = st_mono_ns();
	pthread_mutex_unlock(&w->mu);
}

void st_watchdog_stop(st_watchdog *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->th, NULL);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
