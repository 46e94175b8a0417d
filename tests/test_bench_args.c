/*
 * test_bench_args - the benchmarks' command-line numbers (bench/bench_args.h):
 * good values parse, and every malformed one (not a number, trailing junk,
 * out of range, overflow, empty lists, unknown names) is refused with the
 * output left alone. The refusals print their messages to stderr.
 */
#include "../bench/bench_args.h"
#include "check.h"

int main(void)
{
	int i = 7;
	long l = 7;
	CHECK(bench_int("--reps", "3", 1, 9, &i) == 0 && i == 3);
	CHECK(bench_int("--reps", "-0", 0, 9, &i) == 0 && i == 0);
	const char *bad_int[] = {"", "x", "3x", "3 ", " ", "10", "0", "1.5", "0x3", "99999999999999999999", "-1"};
	for (size_t k = 0; k < sizeof(bad_int) / sizeof(*bad_int); k++) {
		i = 7;
		CHECK_MSG(bench_int("--reps", bad_int[k], 1, 9, &i) < 0 && i == 7, "'%s' accepted", bad_int[k]);
	}
	CHECK(bench_long("-f", "4", 2, 1L << 20, &l) == 0 && l == 4);
	CHECK(bench_long("-f", "9223372036854775808", 2, 1L << 40, &l) < 0 && l == 4);

	int t[8] = {0};
	CHECK(bench_int_list("--threads", "1,2,16", 1, 1024, t, 8) == 3 && t[0] == 1 && t[1] == 2 && t[2] == 16);
	CHECK(bench_int_list("--threads", "4", 1, 1024, t, 8) == 1 && t[0] == 4);
	const char *bad_list[] = {"", ",", "1,x", "1,,0", "0", "1,2,3,4,5,6,7,8,9", "2048", "1;2"};
	for (size_t k = 0; k < sizeof(bad_list) / sizeof(*bad_list); k++)
		CHECK_MSG(bench_int_list("--threads", bad_list[k], 1, 1024, t, 8) < 0, "'%s' accepted", bad_list[k]);
	char longlist[400];
	memset(longlist, '1', sizeof(longlist) - 1);
	longlist[sizeof(longlist) - 1] = 0;
	CHECK(bench_int_list("--threads", longlist, 1, 1024, t, 8) < 0);

	CHECK(bench_size("-b", "1M", 4, 1L << 40, &l) == 0 && l == 1L << 20);
	CHECK(bench_size("-b", "4k", 4, 1L << 40, &l) == 0 && l == 4096);
	CHECK(bench_size("-b", "1.5G", 4, 1L << 40, &l) == 0 && l == 3L << 29);
	CHECK(bench_size("-b", "4096", 4, 1L << 40, &l) == 0 && l == 4096);
	const char *bad_size[] = {"", "M", "1MB", "1T", "2", "-1M", "nan", "inf", "1e300", "2048G", "1 M"};
	for (size_t k = 0; k < sizeof(bad_size) / sizeof(*bad_size); k++) {
		l = 7;
		CHECK_MSG(bench_size("-b", bad_size[k], 4, 1L << 40, &l) < 0 && l == 7, "'%s' accepted", bad_size[k]);
	}

	static const char *const names[3] = {"fp32", "bf16", "bf16-fp32-kern"};
	int on[3] = {1, 1, 1};
	CHECK(bench_names("--st-modes", "fp32", names, 3, on) == 0 && on[0] && !on[1] && !on[2]);
	CHECK(bench_names("--st-modes", "bf16-fp32-kern,bf16", names, 3, on) == 0 && !on[0] && on[1] && on[2]);
	const char *bad_names[] = {"", ",", "fp16", "fp32,", "fp32,FP32x", "bf16-fp32"};
	for (size_t k = 0; k < sizeof(bad_names) / sizeof(*bad_names); k++) {
		int r = bench_names("--st-modes", bad_names[k], names, 3, on);
		/* "fp32," is one name and an empty tail, which strtok skips: valid */
		if (!strcmp(bad_names[k], "fp32,"))
			CHECK(r == 0 && on[0] && !on[1] && !on[2]);
		else
			CHECK_MSG(r < 0, "'%s' accepted", bad_names[k]);
	}
	return check_result();
}
