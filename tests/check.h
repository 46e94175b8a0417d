/*
 * check.h - tiny assertion helpers for C tests. A test program returns
 * check_result() from main: 1 when a CHECK failed, else 77 when a part was
 * skipped (check_skip_hw, check_skip_dep), else 0.
 */
#ifndef ST_TESTS_CHECK_H
#define ST_TESTS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

/* The exit status of a test that skipped something (tests/run.sh; automake's). */
#define CHECK_SKIP_STATUS 77

static int check_failures, check_skips;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			check_failures++;                                            \
		}                                                                    \
	} while (0)

#define CHECK_MSG(cond, ...)                                                         \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                \
			fputc('\n', stderr);                                         \
			check_failures++;                                            \
		}                                                                    \
	} while (0)

#define CHECK_NEAR(a, b, rel)                                                        \
	do {                                                                         \
		double _a = (a), _b = (b);                                           \
		double _d = fabs(_a - _b), _s = fmax(fabs(_a), fabs(_b));            \
		if (!(_d <= (rel) * _s || _d < 1e-30)) {                             \
			fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s=%.9g %s=%.9g (rel %.3g)\n", \
				__FILE__, __LINE__, #a, _a, #b, _b, _s > 0 ? _d / _s : _d); \
			check_failures++;                                            \
		}                                                                    \
	} while (0)

/* A part of the test (or all of it) cannot run here: print one line
 * "SKIP KIND: REASON" and go on with the rest. check_skip_hw: this machine
 * lacks something (e.g. AVX512_BF16), always a skip; check_skip_dep: something
 * that scripts/install-deps.sh --test provides is missing (a venv, a package,
 * a fixture), which tests/run.sh counts as a failure when CI=true. */
#define check_skip_hw(...) check_skip_("hardware", __VA_ARGS__)
#define check_skip_dep(...) check_skip_("dependency", __VA_ARGS__)
static void check_skip_(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void check_skip_(const char *kind, const char *fmt, ...)
{
	va_list ap;
	printf("SKIP %s: ", kind);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	check_skips++;
}

static inline int check_result(void) { return check_failures ? 1 : check_skips ? CHECK_SKIP_STATUS : 0; }

#endif
