/*
 * bench_args.h - the benchmarks' command-line numbers, read strictly: a
 * value that is not a whole number in range (or, for sizes, a number with an
 * optional K/M/G suffix) is named in an error and the caller exits 2, where
 * atoi would have turned "--reps x" into 0 and measured something else.
 */
#ifndef ST_BENCH_ARGS_H
#define ST_BENCH_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* *out = s as a whole number in [lo, hi]; -1 (with a message) otherwise */
static inline int bench_long(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < lo || v > hi) {
		fprintf(stderr, "%s: expected a whole number in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

static inline int bench_int(const char *opt, const char *s, int lo, int hi, int *out)
{
	long v;
	if (bench_long(opt, s, lo, hi, &v) < 0)
		return -1;
	*out = (int)v;
	return 0;
}

/* the copy of list s that strtok_r may cut up (buf of n bytes); -1 (with a
 * message) when it does not fit */
static inline int bench_list_copy(const char *opt, const char *s, char *buf, size_t n)
{
	if (strlen(s) >= n) {
		fprintf(stderr, "%s: list too long\n", opt);
		return -1;
	}
	memcpy(buf, s, strlen(s) + 1);
	return 0;
}

static inline int bench_list_empty(const char *opt, const char *s)
{
	fprintf(stderr, "%s: expected a comma-separated list, got '%s'\n", opt, s);
	return -1;
}

/* a comma-separated list of at most max whole numbers in [lo, hi]; the
 * count, or -1 (with a message) */
static inline int bench_int_list(const char *opt, const char *s, int lo, int hi, int *out, int max)
{
	char buf[256];
	int n = 0;
	if (bench_list_copy(opt, s, buf, sizeof(buf)) < 0)
		return -1;
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max) {
			fprintf(stderr, "%s: at most %d values\n", opt, max);
			return -1;
		}
		if (bench_int(opt, t, lo, hi, &out[n++]) < 0)
			return -1;
	}
	return n ? n : bench_list_empty(opt, s);
}

/* a comma-separated list of names, each one of names[0..n-1]: on[k] = 1 for
 * each named, 0 for the others; -1 (with a message) for an unknown name or
 * an empty list */
static inline int bench_names(const char *opt, const char *s, const char *const *names, int n, int *on)
{
	char buf[256];
	int any = 0;
	if (bench_list_copy(opt, s, buf, sizeof(buf)) < 0)
		return -1;
	memset(on, 0, sizeof(int) * (size_t)n);
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int k = 0;
		while (k < n && strcmp(t, names[k]))
			k++;
		if (k == n) {
			fprintf(stderr, "%s: unknown name '%s' (known:", opt, t);
			for (k = 0; k < n; k++)
				fprintf(stderr, " %s", names[k]);
			fprintf(stderr, ")\n");
			return -1;
		}
		on[k] = any = 1;
	}
	return any ? 0 : bench_list_empty(opt, s);
}

/* a byte count: a number with an optional K, M or G suffix (powers of 1024),
 * in [lo, hi]; -1 (with a message) otherwise */
static inline int bench_size(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end != s && (*end == 'K' || *end == 'k'))
		v *= 1024, end++;
	else if (end != s && (*end == 'M' || *end == 'm'))
		v *= 1024.0 * 1024, end++;
	else if (end != s && (*end == 'G' || *end == 'g'))
		v *= 1024.0 * 1024 * 1024, end++;
	if (end == s || *end || errno || !(v >= (double)lo && v <= (double)hi)) {
		fprintf(stderr, "%s: expected a size in bytes (K, M, G allowed) in [%ld, %ld], got '%s'\n", opt, lo,
			hi, s);
		return -1;
	}
	*out = (long)v;
	return 0;
}

#endif
