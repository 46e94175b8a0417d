/*
 * test_kplan.c - the bf16 kernel plan (model/kplan.h): the bf16_kernels
 * value's parser (every malformed form refused with the reason), the
 * logged form parsing back to the same plan, the fp32 kernels' operand
 * copies, and timing on a small shape.
 */
#include "check.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/bf16.h"
#include "model/kplan.h"

static void test_parse(void)
{
	st_kplan p, q;
	CHECK(st_kplan_parse(&p, "bf16") == 0 && st_kplan_count_f32(&p) == 0);
	CHECK(st_kplan_parse(&p, "FP32") == 0 && st_kplan_count_f32(&p) == ST_KS_COUNT);
	CHECK(st_kplan_parse(&p, "float32") == 0 && st_kplan_count_f32(&p) == ST_KS_COUNT);
	CHECK(st_kplan_parse(&p, "bfloat16") == 0 && st_kplan_count_f32(&p) == 0);
	CHECK(st_kplan_is_auto("auto") && st_kplan_is_auto("AUTO") && !st_kplan_is_auto("bf16"));
	CHECK(st_kplan_check("auto") == 0 && st_kplan_check("fp32") == 0);

	/* the logged form of a mixed plan parses back to it */
	memset(&p, 0, sizeof(p));
	for (int i = 0; i < ST_KS_COUNT; i++)
		p.f32[i] = (unsigned char)(i % 2);
	char s[ST_KPLAN_STR_MAX];
	st_kplan_format(&p, s, sizeof(s));
	CHECK(strlen(s) < sizeof(s) - 1);
	CHECK(st_kplan_parse(&q, s) == 0 && memcmp(&p, &q, sizeof(p)) == 0);
	CHECK(strstr(s, "q:bf16,kv:fp32,") == s);
	CHECK(st_kplan_count_f32(&q) == ST_KS_COUNT / 2);

	/* malformed values: each refused, with the reason */
	struct {
		const char *in, *why;
	} bad[] = {
		{"", "empty"},
		{"fast", "not SITE:bf16"},
		{"q:bf16", "missing"},
		{"q:fp16", "neither bf16 nor fp32"},
		{"nope:bf16", "unknown site"},
		{":bf16", "unknown site"},
		{"q:", "neither"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_MSG(st_kplan_parse(&q, bad[i].in) == ST_EINVAL, "'%s' accepted", bad[i].in);
		CHECK_MSG(strstr(st_errmsg(), bad[i].why) != NULL, "'%s': %s", bad[i].in, st_errmsg());
	}
	char twice[ST_KPLAN_STR_MAX + 16], trailing[ST_KPLAN_STR_MAX + 2];
	snprintf(twice, sizeof(twice), "q:fp32,%s", s);
	CHECK(st_kplan_parse(&q, twice) == ST_EINVAL && strstr(st_errmsg(), "twice"));
	snprintf(trailing, sizeof(trailing), "%s,", s);
	CHECK(st_kplan_parse(&q, trailing) == ST_EINVAL && strstr(st_errmsg(), "trailing comma"));
	CHECK(st_kplan_check("q:bf16") == ST_EINVAL);
}

/* The fp32 kernels' operand copies: none for all-bf16; the largest
 * bf16-only operand of the sites on fp32 otherwise. */
static void test_scratch(void)
{
	st_kshape ks = {.B = 2, .T = 8, .E = 32, .H = 4, .K = 2, .D = 8, .M = 48, .V = 100, .R = 16,
			.resident = 1};
	st_kplan p = {{0}};
	int64_t a, b;
	st_kplan_scratch(&p, &ks, 0, &a, &b);
	CHECK(a == 0 && b == 0 && st_kplan_bf16_weights(&p));
	p.f32[ST_KS_DOWN] = 1; /* act (N, M) */
	st_kplan_scratch(&p, &ks, 0, &a, &b);
	CHECK(a == 16 * 48 && b == 0);
	p.f32[ST_KS_W_Q] = 1; /* h1 (N, E) as the second operand */
	st_kplan_scratch(&p, &ks, 0, &a, &b);
	CHECK(a == 16 * 48 && b == 16 * 32);
	p.f32[ST_KS_O] = 1; /* ctx is kept in fp32: no copy */
	st_kplan_scratch(&p, &ks, 0, &a, &b);
	CHECK(a == 16 * 48 && b == 16 * 32);
	/* act's copy made by the caller: the next largest first operand, h1 or h2 (N, E) */
	st_kplan_scratch(&p, &ks, 1u << ST_KS_DOWN, &a, &b);
	CHECK(a == 0 && b == 16 * 32);
	p.f32[ST_KS_GATE_UP] = 1;
	st_kplan_scratch(&p, &ks, 1u << ST_KS_DOWN, &a, &b);
	CHECK(a == 16 * 32 && b == 16 * 32);
	memset(p.f32, 1, sizeof(p.f32));
	CHECK(!st_kplan_bf16_weights(&p));
}

static void test_time(void)
{
	if (!st_cpu_has_bf16()) {
		check_skip_hw("timing the bf16 kernels: %s", st_cpu_bf16_message());
		return;
	}
	st_kshape ks = {.B = 2, .T = 64, .E = 64, .H = 4, .K = 2, .D = 16, .M = 128, .V = 300, .R = 64,
			.resident = 1};
	st_kplan p;
	double ratio[ST_KS_COUNT];
	CHECK(st_kplan_time(&ks, 1, &p, ratio) == 0);
	for (int i = 0; i < ST_KS_COUNT; i++) {
		CHECK_MSG(ratio[i] > 0 && ratio[i] < 1e6, "%s: ratio %g", st_ksite_name(i), ratio[i]);
		CHECK_MSG(p.f32[i] == (ratio[i] < 1.0), "%s: the plan does not follow the ratio %g",
			  st_ksite_name(i), ratio[i]);
	}
}

int main(void)
{
	test_parse();
	test_scratch();
	test_time();
	return check_result();
}
