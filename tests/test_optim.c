/* AdamW, clipping and MaxText's warmup + cosine schedule, against values
 * worked out by hand from optax's definitions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "base/crc.h"
#include "base/err.h"
#include "check.h"
#include "kernels/cpu/bf16.h"
#include "optim/adamw.h"

static void test_schedule(void)
{
	st_config c;
	memset(&c, 0, sizeof(c));
	c.learning_rate = 1.0;
	c.learning_rate_final_fraction = 0.1;
	c.warmup_steps_fraction = 0.1;
	c.learning_rate_schedule_steps = 100;
	c.steps = 120;
	CHECK(st_lr_at(&c, 0) == 0.0);                 /* warmup starts at 0 */
	CHECK_NEAR(st_lr_at(&c, 5), 0.5, 1e-12);        /* linear */
	CHECK_NEAR(st_lr_at(&c, 10), 1.0, 1e-12);       /* peak at the boundary */
	CHECK_NEAR(st_lr_at(&c, 55), 0.55, 1e-12);      /* cosine midpoint: (1 + 0.1) / 2 */
	CHECK(st_lr_at(&c, 99) > 0.1 && st_lr_at(&c, 99) < 0.101);
	CHECK(st_lr_at(&c, 100) == 0.0 && st_lr_at(&c, 119) == 0.0); /* past the schedule */
	for (int s = 11; s < 100; s++)
		CHECK(st_lr_at(&c, s) < st_lr_at(&c, s - 1));
	c.warmup_steps_fraction = 0.0; /* no warmup: starts at the peak */
	CHECK_NEAR(st_lr_at(&c, 0), 1.0, 1e-12);
}

static void test_adamw(void)
{
	float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.1f, -0.2f, 0.0f}, m[3] = {0}, v[3] = {0};
	st_adamw h = {.lr = 0.01, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .wd = 0.1, .t = 1, .grad_scale = 1.0f};
	st_adamw_update(p, g, m, v, 3, &h);
	/* step 1: m_hat = g, v_hat = g^2, so the update is sign(g) + wd * p */
	CHECK_NEAR(p[0], 1.0 - 0.01 * (0.1 / (0.1 + 1e-8) + 0.1 * 1.0), 1e-6);
	CHECK_NEAR(p[1], -2.0 - 0.01 * (-0.2 / (0.2 + 1e-8) + 0.1 * -2.0), 1e-6);
	CHECK_NEAR(p[2], 0.5 - 0.01 * (0.1 * 0.5), 1e-6); /* zero gradient: decay only */
	CHECK_NEAR(m[0], 0.01, 1e-6);
	CHECK_NEAR(v[1], 0.05 * 0.04, 1e-6);
	/* step 2 with bias correction */
	float m0 = m[0], v0 = v[0], p0 = p[0];
	h.t = 2;
	st_adamw_update(p, g, m, v, 3, &h);
	double mm = 0.9 * m0 + 0.1 * 0.1, vv = 0.95 * v0 + 0.05 * 0.01;
	double upd = (mm / (1 - 0.81)) / (sqrt(vv / (1 - 0.9025)) + 1e-8) + 0.1 * p0;
	CHECK_NEAR(p[0], p0 - 0.01 * upd, 1e-6);
}

/* Each element by the same operations wherever it lies: the vector body
 * (n = 37) against the scalar tail (one element per call), bit for bit. */
static void test_adamw_lanes(void)
{
	enum { n = 37 };
	float p[n], g[n], m[n], v[n], p1[n], m1[n], v1[n];
	for (int i = 0; i < n; i++) {
		p[i] = p1[i] = 0.1f * (float)(i % 7) - 0.3f;
		g[i] = 0.013f * (float)((i * 5) % 11) - 0.06f;
		m[i] = m1[i] = 0.001f * (float)(i % 3);
		v[i] = v1[i] = 0.0002f * (float)(i % 5);
	}
	st_adamw h = {.lr = 0.01, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .wd = 0.1, .t = 3, .grad_scale = 0.7f};
	st_adamw_update(p, g, m, v, n, &h);
	for (int i = 0; i < n; i++)
		st_adamw_update(p1 + i, g + i, m1 + i, v1 + i, 1, &h);
	CHECK_MSG(memcmp(p, p1, sizeof(p)) == 0 && memcmp(m, m1, sizeof(m)) == 0 && memcmp(v, v1, sizeof(v)) == 0,
		  "AdamW of one element differs from the same element among %d", n);
}

static void test_clipping(void)
{
	float g[10000];
	for (int i = 0; i < 10000; i++)
		g[i] = (i % 2) ? 0.03f : -0.04f;
	double n = st_global_norm(g, 10000);
	CHECK_NEAR(n, sqrt(5000 * (0.0009 + 0.0016)), 1e-6);
	/* clipping scales the gradient fed to Adam: with grad_scale, the first
	 * moment is the scaled gradient */
	float p[1] = {0}, gg[1] = {4.0f}, m[1] = {0}, v[1] = {0};
	st_adamw h = {.lr = 0, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .wd = 0, .t = 1, .grad_scale = 0.25f};
	st_adamw_update(p, gg, m, v, 1, &h);
	CHECK_NEAR(m[0], 0.1, 1e-6);
}

/* The fused bf16 copy: the same fp32 update, and pb = bf16(p) exactly, over
 * several parallel blocks and a ragged tail; pb 32-byte aligned (streamed
 * stores) and not (plain stores). */
static void adamw_bf16_copy_case(int64_t off)
{
	int64_t n = 3 * 16384 + 77;
	float *p0 = malloc((size_t)n * sizeof(float)), *p1 = malloc((size_t)n * sizeof(float));
	float *g = malloc((size_t)n * sizeof(float)), *m0 = calloc((size_t)n, sizeof(float));
	float *v0 = calloc((size_t)n, sizeof(float)), *m1 = calloc((size_t)n, sizeof(float));
	float *v1 = calloc((size_t)n, sizeof(float));
	/* aligned_alloc's size a multiple of its alignment */
	uint16_t *buf = aligned_alloc(64, ((size_t)(n + 64) * sizeof(uint16_t) + 63) / 64 * 64), *pb = buf + off;
	for (int64_t i = 0; i < n + 64; i++)
		buf[i] = 0xffff;
	for (int64_t i = 0; i < n; i++) {
		p0[i] = p1[i] = (float)sin(0.37 * (double)i) * 3.0f;
		g[i] = (float)cos(0.11 * (double)i);
	}
	st_adamw h = {.lr = 0.01, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .wd = 0.1, .t = 3, .grad_scale = 0.5f};
	st_adamw_update(p0, g, m0, v0, n, &h);
	st_adamw_update_bf16(p1, pb, g, m1, v1, n, &h);
	CHECK(memcmp(p0, p1, (size_t)n * sizeof(float)) == 0);
	CHECK(memcmp(m0, m1, (size_t)n * sizeof(float)) == 0 && memcmp(v0, v1, (size_t)n * sizeof(float)) == 0);
	int64_t bad = 0, outside = 0;
	for (int64_t i = 0; i < n; i++)
		bad += pb[i] != st_f32_to_bf16(p1[i]);
	for (int64_t i = 0; i < n + 64; i++)
		outside += (i < off || i >= off + n) && buf[i] != 0xffff;
	CHECK_MSG(bad == 0 && outside == 0, "pb offset %lld: %lld bf16 copies differ, %lld written outside",
		  (long long)off, (long long)bad, (long long)outside);
	CHECK(p1[5] != (float)sin(0.37 * 5.0) * 3.0f); /* it did update */
	free(p0); free(p1); free(g); free(m0); free(v0); free(m1); free(v1); free(buf);
}

static void test_adamw_bf16_copy(void)
{
	adamw_bf16_copy_case(0);
	adamw_bf16_copy_case(1);
}

/* The update's checksums (st_adamw_update_crc): each range's CRC-32 of the
 * new p, m and v equals st_crc32 over it afterwards, for ranges inside one
 * block, across blocks, with gaps, a range ending the array; the update
 * itself unchanged; at 1 and 3 threads; bad ranges refused, nothing updated. */
static void test_adamw_crc(void)
{
	const int64_t n = 5 * 16384 + 123;
	/* ranges: many small ones inside block 0, one across blocks 0-3, a gap, one to the end */
	int64_t start[8] = {0, 5, 768, 1536, 2000, 16000, 70000, 70001};
	int64_t len[8] = {5, 763, 768, 7, 1, 50000, 1, n - 70001};
	float *p0 = malloc((size_t)n * 4), *p1 = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
	float *m0 = calloc((size_t)n, 4), *v0 = calloc((size_t)n, 4), *m1 = calloc((size_t)n, 4), *v1 = calloc((size_t)n, 4);
	for (int64_t i = 0; i < n; i++) {
		p0[i] = (float)sin(0.37 * (double)i) * 3.0f;
		g[i] = (float)cos(0.11 * (double)i);
	}
	st_adamw h = {.lr = 0.01, .b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .wd = 0.1, .t = 2, .grad_scale = 1.0f};
	int threads[2] = {1, 3};
	for (int ti = 0; ti < 2; ti++) {
		omp_set_num_threads(threads[ti]);
		memcpy(p1, p0, (size_t)n * 4);
		memset(m1, 0, (size_t)n * 4);
		memset(v1, 0, (size_t)n * 4);
		float *ref[3] = {malloc((size_t)n * 4), calloc((size_t)n, 4), calloc((size_t)n, 4)};
		memcpy(ref[0], p0, (size_t)n * 4);
		st_adamw_update(ref[0], g, ref[1], ref[2], n, &h);
		uint32_t crc[24];
		memset(crc, 0xab, sizeof(crc));
		st_adamw_crc c = {.nranges = 8, .start = start, .len = len, .crc = crc};
		CHECK(st_adamw_update_crc(p1, NULL, g, m1, v1, n, &h, &c) == 0);
		CHECK(memcmp(p1, ref[0], (size_t)n * 4) == 0 && memcmp(m1, ref[1], (size_t)n * 4) == 0 &&
		      memcmp(v1, ref[2], (size_t)n * 4) == 0);
		const float *arr[3] = {p1, m1, v1};
		int bad = 0;
		for (int k = 0; k < 3; k++)
			for (int r = 0; r < 8; r++)
				bad += crc[k * 8 + r] != st_crc32(0, arr[k] + start[r], (size_t)len[r] * 4);
		CHECK_MSG(bad == 0, "%d of 24 checksums differ at %d threads", bad, threads[ti]);
		for (int k = 0; k < 3; k++)
			free(ref[k]);
	}
	omp_set_num_threads(2);
	/* overlapping, unsorted, empty, past the end: refused before anything changes */
	int64_t bs[4][2] = {{0, 10}, {10, 0}, {0, 5}, {0, n - 5}}, bl[4][2] = {{20, 5}, {5, 5}, {0, 5}, {5, 10}};
	for (int b = 0; b < 4; b++) {
		memcpy(p1, p0, (size_t)n * 4);
		uint32_t crc[6];
		st_adamw_crc c = {.nranges = 2, .start = bs[b], .len = bl[b], .crc = crc};
		CHECK_MSG(st_adamw_update_crc(p1, NULL, g, m1, v1, n, &h, &c) == ST_EINVAL, "bad ranges %d", b);
		CHECK(memcmp(p1, p0, (size_t)n * 4) == 0);
	}
	free(p0); free(p1); free(g); free(m0); free(v0); free(m1); free(v1);
}

int main(void)
{
	test_adamw_crc();
	test_adamw_lanes();
	test_adamw_bf16_copy();
	test_schedule();
	test_adamw();
	test_clipping();
	return check_result();
}
