#include "train/knobs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"

/* A number of seconds, 0 to 3600 (unset: 0). */
static int seconds_knob(const char *name, double *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	char *end;
	errno = 0;
	*out = strtod(v, &end);
	if (errno || *end || !(*out >= 0 && *out <= 3600))
		return st_fail(ST_EINVAL, "%s='%s' is not a number of seconds from 0 to 3600", name, v);
	return 0;
}

/* A path-valued knob into buf ("" when unset). */
static int path_knob(const char *name, char *buf, size_t cap)
{
	const char *v = getenv(name);
	if (v && *v) {
		if (strlen(v) >= cap)
			return st_fail(ST_EINVAL, "%s is longer than %zu bytes", name, cap - 1);
		snprintf(buf, cap, "%s", v);
	}
	return 0;
}

int st_test_knobs_read(st_test_knobs *k)
{
	memset(k, 0, sizeof(*k));
	int rc = seconds_knob("SLICETRAIN_MIN_STEP_SECONDS", &k->min_step_s);
	if (rc == 0)
		rc = seconds_knob("SLICETRAIN_TEST_SAVE_SECONDS", &k->save_delay_s);
	if (rc < 0)
		return rc;
	if ((rc = path_knob("SLICETRAIN_SAMPLE_LOG", k->sample_log, sizeof(k->sample_log))) < 0 ||
	    (rc = path_knob("SLICETRAIN_TEST_SLOW_FILE", k->slow_file, sizeof(k->slow_file))) < 0)
		return rc;
	return path_knob("SLICETRAIN_TEST_HANG_FILE", k->hang_file, sizeof(k->hang_file));
}

void st_test_knobs_hang(const st_test_knobs *k, int64_t step)
{
	if (!k->hang_file[0] || access(k->hang_file, F_OK) < 0)
		return;
	st_warn("test hook: %s exists: the compute thread blocks before step %lld, until it is removed",
		k->hang_file, (long long)step);
	struct timespec ts = {0, 10 * 1000000L};
	while (access(k->hang_file, F_OK) == 0)
		nanosleep(&ts, NULL);
	st_info("test hook: %s is gone: the compute thread goes on", k->hang_file);
}

int st_test_knobs_open_log(st_test_knobs *k, int rank, int writes)
{
	if (!k->sample_log[0] || !writes)
		return 0;
	char path[ST_PATH_MAX + 16];
	snprintf(path, sizeof(path), "%s.%d", k->sample_log, rank);
	if (!(k->log = fopen(path, "a")))
		return st_fail(ST_EIO, "cannot open SLICETRAIN_SAMPLE_LOG file '%s': %s", path, strerror(errno));
	return 0;
}

void st_test_knobs_log_samples(st_test_knobs *k, int64_t step, int64_t first, int64_t rows)
{
	if (!k->log)
		return;
	for (int64_t r = 0; r < rows; r++)
		fprintf(k->log, "%lld %lld\n", (long long)step, (long long)(first + r));
	/* a process killed later must not take the record of what it read with it */
	fflush(k->log);
}

void st_test_knobs_close_log(st_test_knobs *k)
{
	if (k->log)
		fclose(k->log);
	k->log = NULL;
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	nanosleep(&ts, NULL);
}

void st_test_knobs_slow(const st_test_knobs *k)
{
	if (!k->slow_file[0])
		return;
	FILE *f = fopen(k->slow_file, "r");
	double s = 0;
	if (!f)
		return;
	if (fscanf(f, "%lf", &s) == 1 && s > 0 && s <= 60)
		sleep_s(s);
	fclose(f);
}

void st_test_knobs_before_save(void *arg, int64_t step)
{
	(void)step;
	sleep_s(((const st_test_knobs *)arg)->save_delay_s);
}

void st_test_knobs_pace(const st_test_knobs *k, double t0)
{
	double left = k->min_step_s - (st_mono_s() - t0);
	if (left > 0)
		sleep_s(left);
}
