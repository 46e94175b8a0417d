/*
 * test_watchdog.c - the step watchdog (train/watchdog.h): its limit rule,
 * and its thread against a real collective: a thread stuck outside
 * collectives is found, one waiting inside a collective or paused is not.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "comm/comm.h"
#include "train/watchdog.h"
#include "check.h"
#include "free_port.h"

static atomic_int hangs;
static char last_why[256];

static void on_hang(void *arg, const char *why)
{
	(void)arg;
	snprintf(last_why, sizeof(last_why), "%s", why);
	atomic_fetch_add(&hangs, 1);
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void test_limit(void)
{
	int64_t g[3] = {10, 400, 50};
	CHECK(st_watchdog_limit_ms(1000, g, 0) == 0); /* nothing measured: not armed */
	CHECK(st_watchdog_limit_ms(1000, g, 3) == 1200); /* 3 x the longest */
	CHECK(st_watchdog_limit_ms(1000, g, 1) == 1000); /* the floor */
	CHECK(st_watchdog_limit_ms(100, g, 1) == 100);
}

/* Steps of ~20 ms: the limit is the floor (200 ms). A stall of 100 ms is
 * not a hang; one of 600 ms is, reported once. */
static void test_fires(void)
{
	st_watchdog *w;
	atomic_store(&hangs, 0);
	CHECK(st_watchdog_start(&w, 0, on_hang, NULL) == 0 && w == NULL); /* 0: off */
	CHECK(st_watchdog_start(&w, 200, on_hang, NULL) == 0 && w != NULL);
	for (int i = 0; i < 5; i++) { /* the first is not measured */
		sleep_ms(20);
		st_watchdog_step(w);
	}
	sleep_ms(100);
	st_watchdog_step(w);
	CHECK_MSG(atomic_load(&hangs) == 0, "a 100 ms stall was a hang: %s", last_why);
	sleep_ms(600);
	CHECK_MSG(atomic_load(&hangs) == 1, "a 600 ms stall: %d reports", atomic_load(&hangs));
	CHECK_MSG(strstr(last_why, "stuck: no step progress for"), "'%s'", last_why);
	sleep_ms(200);
	CHECK(atomic_load(&hangs) == 1);
	st_watchdog_stop(w);
}

/* Not armed before a measured step; paused is never a hang; after a
 * re-formation (warm-up) the next step is not measured. */
static void test_pause(void)
{
	st_watchdog *w;
	atomic_store(&hangs, 0);
	CHECK(st_watchdog_start(&w, 150, on_hang, NULL) == 0);
	sleep_ms(400); /* the first step: not armed */
	st_watchdog_step(w);
	CHECK(atomic_load(&hangs) == 0);
	sleep_ms(10);
	st_watchdog_step(w); /* measured: armed at 150 ms */
	st_watchdog_pause(w);
	sleep_ms(400);
	st_watchdog_resume(w, 1);
	CHECK_MSG(atomic_load(&hangs) == 0, "paused, yet: %s", last_why);
	sleep_ms(100);
	st_watchdog_step(w);
	st_watchdog_stop(w);
	CHECK(atomic_load(&hangs) == 0);
	st_watchdog_stop(NULL);
}

/* A thread inside a collective (waiting on a peer that stalls) is not
 * stuck: a 2-member group where member 1 stalls 600 ms before its
 * all-reduce; member 0's process-wide activity shows it inside. */
typedef struct member {
	st_group_env env;
	int rank, rc, stall_ms;
} member;

static void *member_run(void *arg)
{
	member *m = arg;
	st_group *g = NULL;
	st_comm *c = NULL;
	st_group_opts o = {.env = &m->env, .use_shm = -1};
	int ranks[2] = {0, 1};
	m->rc = st_group_join(&g, &o);
	if (m->rc == 0)
		m->rc = st_comm_create(&c, g, 2, ranks);
	if (m->rc == 0) {
		sleep_ms(m->stall_ms);
		double x = 1;
		m->rc = st_comm_allreduce(c, &x, 1, ST_DTYPE_F64, ST_SUM);
	}
	st_comm_free(c);
	st_group_leave(g);
	return NULL;
}

static void test_inside(void)
{
	member m[2];
	memset(m, 0, sizeof(m));
	char coord[64];
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", free_port());
	for (int r = 0; r < 2; r++) {
		m[r].env = (st_group_env){.rank = r, .world_size = 2, .num_slices = 1, .source = "slicetrain"};
		snprintf(m[r].env.coordinator, sizeof(m[r].env.coordinator), "%s", coord);
		m[r].rank = r;
	}
	m[1].stall_ms = 600;
	pthread_t th[2];
	for (int r = 0; r < 2; r++)
		pthread_create(&th[r], NULL, member_run, &m[r]);
	/* member 0 enters the all-reduce at once and waits there */
	int inside = 0, seen = 0;
	int64_t last;
	for (int i = 0; i < 100 && !seen; i++) {
		sleep_ms(10);
		st_comm_activity(&inside, &last);
		seen = inside > 0;
	}
	CHECK_MSG(seen, "no thread was seen inside the all-reduce");
	for (int r = 0; r < 2; r++)
		pthread_join(th[r], NULL);
	CHECK(m[0].rc == 0 && m[1].rc == 0);
	st_comm_activity(&inside, &last);
	CHECK(inside == 0 && last > 0 && st_mono_ns() - last < 5000000000LL);
}

int main(void)
{
	test_limit();
	test_fires();
	test_pause();
	test_inside();
	return check_result();
}
