/*
 * watchdog.h - the step watchdog of an elastic worker (docs/hosts.md,
 * "Failure detection"): finds a compute thread that is stuck while the
 * process's other threads (the group's heartbeats) still answer, which its
 * peers cannot see.
 *
 * A thread polls every 50 ms. It measures the "gaps": time the process
 * spends outside collectives (st_comm_activity) since the last collective
 * began or ended, or the last step ended. A peer waiting on a stuck worker
 * sits inside a collective, so only the stuck one's gap grows. Each step
 * records its longest gap; the limit is
 *
 *     max(floor_ms, 3 x the longest gap of the last 16 steps)
 *
 * and a gap past it, while armed, is a hang: the watchdog calls on_hang
 * once, with what it saw, from its thread (the trainer tells its agent,
 * which kills the worker and reports its slice hung; the controller
 * replaces that slice and re-forms the rest in place). It is paused
 * around what is not a step (re-formations, saves, evals); the first step
 * after its start or a re-formation is not measured (warm-up: first
 * touches, gathers); it arms once a step has been.
 *
 *   st_watchdog *w;
 *   rc = st_watchdog_start(&w, 1000, on_hang, arg); // NULL when floor_ms is 0: off
 *   ... each step: st_watchdog_step(w) at its end
 *   st_watchdog_pause(w); ... a re-formation ...; st_watchdog_resume(w, 1);
 *   st_watchdog_stop(w);                     // NULL is fine
 */
#ifndef ST_TRAIN_WATCHDOG_H
#define ST_TRAIN_WATCHDOG_H

#include <stdint.h>

typedef struct st_watchdog st_watchdog;

enum { ST_WATCHDOG_FACTOR = 3, ST_WATCHDOG_STEPS = 16, ST_WATCHDOG_POLL_MS = 50 };

/* Called once, from the watchdog's thread, with what it saw. */
typedef void (*st_watchdog_hang_fn)(void *arg, const char *why);

/* floor_ms 0: *out = NULL (no watchdog). ST_ENOMEM, ST_EIO (no thread). */
int st_watchdog_start(st_watchdog **out, int floor_ms, st_watchdog_hang_fn on_hang, void *arg);
void st_watchdog_step(st_watchdog *w);
void st_watchdog_pause(st_watchdog *w);
/* warmup 1: the next step is not measured (after a re-formation). */
void st_watchdog_resume(st_watchdog *w, int warmup);
void st_watchdog_stop(st_watchdog *w);

/* The limit for a step history (pure: the thread's rule, for tests): the
 * longest of n gaps times ST_WATCHDOG_FACTOR, at least floor_ms; 0 when
 * n is 0 (not armed). Milliseconds. */
int64_t st_watchdog_limit_ms(int floor_ms, const int64_t *gaps_ms, int n);

#endif
