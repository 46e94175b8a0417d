/*
 * check.h - tiny assertion helpers for C tests. A test program returns
 * check_result() from main: 0 when every CHECK held, 1 otherwise.
 */
#ifndef ST_TESTS_CHECK_H
#define ST_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_failures;

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

static inline int check_result(void) { return check_failures ? 1 : 0; }

#endif
