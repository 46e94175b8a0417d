/*
 * Whole-model checks: gradients of the full Llama forward against central
 * differences (a few elements of every tensor), every remat policy giving
 * bit-identical losses and gradients, and bit-identical reruns; the bf16
 * path's gradients against fp32's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "check.h"
#include "kernels/cpu/bf16.h"
#include "model/llama.h"

static const st_llama_shape shape = {
	.V = 37, .E = 16, .L = 2, .H = 4, .K = 2, .D = 4, .M = 24, .eps = 1e-5f, .theta = 10000.0,
};
enum { B = 2, T = 6 };

static void make_tokens(int32_t *tok)
{
	for (int i = 0; i < B * (T + 1); i++)
		tok[i] = (int32_t)st_rng_below(77, 0, (uint64_t)i, (uint64_t)shape.V);
}

static double loss_of(st_llama *m, const int32_t *tok)
{
	double s = 0;
	CHECK(st_llama_forward_loss(m, tok, &s) == 0);
	return s / (B * T);
}

static void test_finite_differences(void)
{
	st_llama m = ST_LLAMA_INIT;
	CHECK(st_llama_init(&m, &shape) == 0);
	st_llama_init_weights(&m, 42);
	CHECK(st_llama_alloc_acts(&m, B, T, ST_REMAT_NONE) == 0);
	int32_t tok[B * (T + 1)];
	make_tokens(tok);
	st_llama_zero_grads(&m);
	double s = 0;
	CHECK(st_llama_forward_backward(&m, tok, 1.0f / (B * T), &s) == 0);
	CHECK_NEAR(s / (B * T), loss_of(&m, tok), 1e-6);
	for (int ti = 0; ti < m.ntensors; ti++) {
		const st_tensor *t = &m.tensors[ti];
		float *w = m.params + t->offset;
		const float *g = m.grads + t->offset;
		double gmax = 0, worst = 0;
		for (int64_t i = 0; i < t->numel; i++)
			gmax = fmax(gmax, fabs(g[i]));
		CHECK_MSG(gmax > 0, "%s has a zero gradient", t->name);
		for (int k = 0; k < 6; k++) {
			int64_t i = (int64_t)st_rng_below(9, (uint64_t)ti, (uint64_t)k, (uint64_t)t->numel);
			if (t->kind == ST_T_EMBED)
				i = (int64_t)tok[k] * t->shape[1] + k % t->shape[1]; /* a row that is used */
			float save = w[i], h = 1e-2f;
			w[i] = save + h;
			double lp = loss_of(&m, tok);
			w[i] = save - h;
			double lm = loss_of(&m, tok);
			w[i] = save;
			double num = (lp - lm) / (2.0 * h);
			worst = fmax(worst, fabs(num - g[i]) / gmax);
		}
		CHECK_MSG(worst < 5e-3, "%s: finite-difference error %.3g of max |grad| %.3g", t->name,
			  worst, gmax);
	}
	st_llama_release(&m);
}

/* Loss and gradients of one step under a remat policy (two micro-batches
 * accumulated, to cover gradient accumulation too), fp32 or bf16. */
static void run_plan(const st_llama_shape *sh, int bf16, const st_kplan *kp, int late,
		     enum st_remat p, double *loss, float **grads, int64_t *n)
{
	st_llama m = ST_LLAMA_INIT;
	CHECK(st_llama_init(&m, sh) == 0);
	st_llama_init_weights(&m, 7);
	m.bf16 = bf16;
	if (kp && !late) /* as the trainer: the plan before the activations */
		m.kplan = *kp;
	CHECK(st_llama_weights_changed(&m) == 0);
	CHECK(st_llama_alloc_acts(&m, B, T, p) == 0);
	if (kp && late) /* as a joiner: the group's plan arrives later */
		CHECK(st_llama_set_kernels(&m, kp) == 0);
	int32_t tok[B * (T + 1)];
	for (int i = 0; i < B * (T + 1); i++)
		tok[i] = (int32_t)st_rng_below(77, 0, (uint64_t)i, (uint64_t)sh->V);
	st_llama_zero_grads(&m);
	*loss = 0;
	CHECK(st_llama_forward_backward(&m, tok, 0.5f / (B * T), loss) == 0);
	tok[3] = (tok[3] + 1) % (int32_t)sh->V;
	CHECK(st_llama_forward_backward(&m, tok, 0.5f / (B * T), loss) == 0);
	*n = m.nparams;
	*grads = malloc((size_t)m.nparams * sizeof(float));
	memcpy(*grads, m.grads, (size_t)m.nparams * sizeof(float));
	st_llama_release(&m);
}

static void run_mode(const st_llama_shape *sh, int bf16, enum st_remat p, double *loss,
		     float **grads, int64_t *n)
{
	run_plan(sh, bf16, NULL, 0, p, loss, grads, n);
}

static void run_policy(enum st_remat p, double *loss, float **grads, int64_t *n)
{
	run_mode(&shape, 0, p, loss, grads, n);
}

/* Worst per-tensor relative L2 distance of gradients g from reference r;
 * *worst_name (may be NULL): that tensor's name. */
static double worst_rel(const st_llama_shape *sh, const float *g, const float *r, char *worst_name)
{
	st_llama m = ST_LLAMA_INIT;
	CHECK(st_llama_init(&m, sh) == 0);
	double worst = 0;
	for (int ti = 0; ti < m.ntensors; ti++) {
		const st_tensor *t = &m.tensors[ti];
		double d = 0, q = 0;
		for (int64_t i = t->offset; i < t->offset + t->numel; i++) {
			d += ((double)g[i] - r[i]) * ((double)g[i] - r[i]);
			q += (double)r[i] * r[i];
		}
		if (sqrt(d / q) > worst && worst_name)
			memcpy(worst_name, t->name, sizeof(t->name));
		worst = fmax(worst, sqrt(d / q));
	}
	st_llama_release(&m);
	return worst;
}

/*
 * st_llama_zero_grads leaves resident gradients to be written, not added to,
 * by the next backward: whatever the buffer held before (NaN here), every
 * gradient after zero_grads + one backward equals the same backward added
 * onto real zeros (compared with ==: a sum onto +0 may turn a -0 into +0),
 * and a second backward without zero_grads adds to the first. fp32 and, where
 * the CPU has them, bf16 products. The output layer's gradient is one chunk
 * of rows at this shape (its later chunks adding was checked on llama3-125m
 * at 4 x 512: checkpoints bit-identical to the code before lazy zeroing).
 */
static void test_fresh_gradients(void)
{
	for (int bf16 = 0; bf16 < 2; bf16++) {
		if (bf16 && !st_cpu_has_bf16()) {
			check_skip_hw("fresh gradients in bf16 mode: %s", st_cpu_bf16_message());
			continue;
		}
		st_llama m = ST_LLAMA_INIT;
		CHECK(st_llama_init(&m, &shape) == 0);
		st_llama_init_weights(&m, 11);
		m.bf16 = bf16;
		CHECK(st_llama_weights_changed(&m) == 0);
		CHECK(st_llama_alloc_acts(&m, B, T, ST_REMAT_NONE) == 0);
		size_t bytes = (size_t)m.nparams * sizeof(float);
		float *ref = malloc(bytes), *one = malloc(bytes), *two = malloc(bytes);
		int32_t tok[B * (T + 1)], tok2[B * (T + 1)];
		make_tokens(tok);
		for (int i = 0; i < B * (T + 1); i++)
			tok2[i] = (tok[i] + 5) % (int32_t)shape.V;
		double s = 0;
		/* the reference: onto zeros, as before lazy zeroing */
		memset(m.grads, 0, bytes);
		m.gfresh = 0;
		CHECK(st_llama_forward_backward(&m, tok, 1.0f / (B * T), &s) == 0);
		memcpy(ref, m.grads, bytes);
		for (int64_t i = 0; i < m.nparams; i++)
			m.grads[i] = NAN;
		st_llama_zero_grads(&m);
		CHECK(m.gfresh == 1);
		CHECK(st_llama_forward_backward(&m, tok, 1.0f / (B * T), &s) == 0);
		CHECK(m.gfresh == 0);
		int64_t bad = 0;
		for (int64_t i = 0; i < m.nparams; i++)
			bad += !(m.grads[i] == ref[i]);
		CHECK_MSG(bad == 0, "bf16 %d: %lld of %lld gradients differ from the sum onto zeros",
			  bf16, (long long)bad, (long long)m.nparams);
		memcpy(one, m.grads, bytes);
		/* a second backward without zero_grads adds to the first */
		CHECK(st_llama_forward_backward(&m, tok2, 1.0f / (B * T), &s) == 0);
		memcpy(two, m.grads, bytes);
		st_llama_zero_grads(&m);
		CHECK(st_llama_forward_backward(&m, tok2, 1.0f / (B * T), &s) == 0); /* tok2 alone */
		double worst = 0;
		for (int64_t i = 0; i < m.nparams; i++)
			worst = fmax(worst, fabs((double)two[i] - ((double)one[i] + m.grads[i])) /
						    (fabs((double)one[i]) + fabs((double)m.grads[i]) + 1e-6));
		CHECK_MSG(worst < 1e-4, "bf16 %d: two backwards vs the sum of each, relative %.3g", bf16,
			  worst);
		free(ref);
		free(one);
		free(two);
		st_llama_release(&m);
	}
}

/* The bf16 tests' shape: its head_dim takes the vector bf16 attention path. */
static const st_llama_shape sh = {
	.V = 53, .E = 32, .L = 2, .H = 4, .K = 2, .D = 16, .M = 48, .eps = 1e-5f, .theta = 10000.0,
};

/*
 * dtype=bfloat16 on a shape whose head_dim takes the vector bf16 attention
 * path: every remat policy gives the same bits; loss and every tensor's
 * gradient are close to fp32's (relative L2 error under 3e-2) but not equal
 * (the bf16 products really run).
 */
static void test_bf16(void)
{
	if (!st_cpu_has_bf16()) {
		check_skip_hw("bf16 remat and gradient checks: %s", st_cpu_bf16_message());
		return;
	}
	double lf, lb[3];
	float *gf, *gb[3];
	int64_t n;
	enum st_remat pol[3] = {ST_REMAT_NONE, ST_REMAT_MINIMAL, ST_REMAT_FULL};
	run_mode(&sh, 0, ST_REMAT_NONE, &lf, &gf, &n);
	for (int i = 0; i < 3; i++)
		run_mode(&sh, 1, pol[i], &lb[i], &gb[i], &n);
	for (int i = 1; i < 3; i++)
		CHECK_MSG(lb[i] == lb[0] && memcmp(gb[i], gb[0], (size_t)n * sizeof(float)) == 0,
			  "bf16 remat policy %d differs from none", i);
	CHECK_MSG(fabs(lb[0] - lf) / lf < 1e-2, "bf16 loss %.6f vs fp32 %.6f", lb[0], lf);
	CHECK(memcmp(gb[0], gf, (size_t)n * sizeof(float)) != 0);
	char name[80] = "";
	double worst = worst_rel(&sh, gb[0], gf, name);
	CHECK_MSG(worst < 3e-2, "%s: bf16 gradient relative error %.3g", name, worst);
	printf("bf16: loss %.6f vs fp32 %.6f, worst gradient relative L2 error %.3g\n", lb[0], lf, worst);
	free(gf);
	for (int i = 0; i < 3; i++)
		free(gb[i]);
}

/*
 * dtype=bfloat16 on a CPU without bf16 products (and on any other): bf16
 * storage with every site on the fp32 kernels. Loss and gradients close to
 * fp32's but not equal (the activations and weight copy really are bf16),
 * the same bits under every remat policy.
 */
static void test_bf16_storage_fp32_kernels(void)
{
	double lf, l[2];
	float *gf, *g[2];
	int64_t n;
	st_kplan kp;
	memset(kp.f32, 1, sizeof(kp.f32));
	run_mode(&sh, 0, ST_REMAT_NONE, &lf, &gf, &n);
	run_plan(&sh, 1, &kp, 0, ST_REMAT_NONE, &l[0], &g[0], &n);
	run_plan(&sh, 1, &kp, 0, ST_REMAT_FULL, &l[1], &g[1], &n);
	CHECK_MSG(l[0] == l[1] && memcmp(g[0], g[1], (size_t)n * sizeof(float)) == 0,
		  "bf16 storage on the fp32 kernels: remat full differs from none");
	CHECK_MSG(fabs(l[0] - lf) / lf < 1e-2, "bf16 storage on the fp32 kernels: loss %.6f vs fp32 %.6f",
		  l[0], lf);
	CHECK(memcmp(g[0], gf, (size_t)n * sizeof(float)) != 0);
	double worst = worst_rel(&sh, g[0], gf, NULL);
	CHECK_MSG(worst < 3e-2, "bf16 storage on the fp32 kernels: gradient relative error %.3g", worst);
	printf("bf16 storage on the fp32 kernels: loss %.6f vs fp32 %.6f, worst gradient relative L2 error %.3g\n",
	       l[0], lf, worst);
	free(gf), free(g[0]), free(g[1]);
}

/*
 * bf16 by measured rate (model/kplan.h): in bf16 mode each product site and
 * attention pass runs on the kernel its plan names. Moving any one site to
 * the fp32 kernel changes the gradients' bits (the switch is in effect and
 * every site's operand copies fit), keeps loss and gradients close to
 * fp32's; the all-fp32 plan is closer to fp32 than the all-bf16 one, is the
 * same under every remat policy, and a plan set after the activations (a
 * joiner's) gives the same bits as one set before.
 */
static void test_bf16_kernels(void)
{
	if (!st_cpu_has_bf16()) {
		check_skip_hw("bf16 kernel plans: %s", st_cpu_bf16_message());
		return;
	}
	double lf, lb, l;
	float *gf, *gb, *g;
	int64_t n;
	run_mode(&sh, 0, ST_REMAT_NONE, &lf, &gf, &n);
	st_kplan kp = {{0}};
	run_plan(&sh, 1, &kp, 0, ST_REMAT_NONE, &lb, &gb, &n);
	for (int s = 0; s < ST_KS_COUNT; s++) {
		memset(&kp, 0, sizeof(kp));
		kp.f32[s] = 1;
		run_plan(&sh, 1, &kp, 0, ST_REMAT_NONE, &l, &g, &n);
		CHECK_MSG(memcmp(g, gb, (size_t)n * sizeof(float)) != 0,
			  "site %s on fp32: the gradients equal the all-bf16 plan's", st_ksite_name(s));
		CHECK_MSG(fabs(l - lf) / lf < 1e-2, "site %s on fp32: loss %.6f vs fp32 %.6f",
			  st_ksite_name(s), l, lf);
		double w = worst_rel(&sh, g, gf, NULL);
		CHECK_MSG(w < 3e-2, "site %s on fp32: gradient relative error %.3g", st_ksite_name(s), w);
		free(g);
	}
	memset(kp.f32, 1, sizeof(kp.f32));
	float *g2;
	double l2;
	run_plan(&sh, 1, &kp, 0, ST_REMAT_NONE, &l, &g, &n);
	run_plan(&sh, 1, &kp, 0, ST_REMAT_FULL, &l2, &g2, &n);
	CHECK_MSG(l == l2 && memcmp(g, g2, (size_t)n * sizeof(float)) == 0,
		  "the all-fp32 plan differs between remat none and full");
	double w32 = worst_rel(&sh, g, gf, NULL), w16 = worst_rel(&sh, gb, gf, NULL);
	CHECK_MSG(w32 < w16, "all-fp32 plan: gradient error %.3g not below the all-bf16 plan's %.3g", w32, w16);
	printf("bf16 kernel plans: worst gradient relative error vs fp32: all-bf16 %.3g, all-fp32 %.3g\n",
	       w16, w32);
	free(g), free(g2);
	/* a mixed plan, set before and after the activations */
	for (int s = 0; s < ST_KS_COUNT; s++)
		kp.f32[s] = (unsigned char)(s % 3 == 0);
	run_plan(&sh, 1, &kp, 0, ST_REMAT_MINIMAL, &l, &g, &n);
	run_plan(&sh, 1, &kp, 1, ST_REMAT_MINIMAL, &l2, &g2, &n);
	CHECK_MSG(l == l2 && memcmp(g, g2, (size_t)n * sizeof(float)) == 0,
		  "a plan set after the activations gives other bits than one set before");
	free(g), free(g2);
	/* late, a plan that needs no operand copy, only the fp32 SwiGLU gradients */
	memset(&kp, 0, sizeof(kp));
	kp.f32[ST_KS_D_GATE_UP] = 1;
	run_plan(&sh, 1, &kp, 0, ST_REMAT_NONE, &l, &g, &n);
	run_plan(&sh, 1, &kp, 1, ST_REMAT_NONE, &l2, &g2, &n);
	CHECK_MSG(l == l2 && memcmp(g, g2, (size_t)n * sizeof(float)) == 0,
		  "d_gate_up on fp32 set late gives other bits than set before");
	free(g), free(g2), free(gf), free(gb);
}

static void test_remat_policies(void)
{
	double l0, l1, l2, l3;
	float *g0, *g1, *g2, *g3;
	int64_t n;
	run_policy(ST_REMAT_NONE, &l0, &g0, &n);
	run_policy(ST_REMAT_MINIMAL, &l1, &g1, &n);
	run_policy(ST_REMAT_FULL, &l2, &g2, &n);
	run_policy(ST_REMAT_FULL, &l3, &g3, &n);
	CHECK(l0 == l1 && l0 == l2);
	CHECK(memcmp(g0, g1, (size_t)n * sizeof(float)) == 0);
	CHECK(memcmp(g0, g2, (size_t)n * sizeof(float)) == 0);
	CHECK(l2 == l3 && memcmp(g2, g3, (size_t)n * sizeof(float)) == 0); /* reruns are bit-identical */
	free(g0);
	free(g1);
	free(g2);
	free(g3);
}

static void test_activation_memory(void)
{
	int64_t bytes[3];
	enum st_remat p[3] = {ST_REMAT_NONE, ST_REMAT_MINIMAL, ST_REMAT_FULL};
	for (int i = 0; i < 3; i++) {
		st_llama m = ST_LLAMA_INIT;
		CHECK(st_llama_init(&m, &shape) == 0);
		CHECK(st_llama_alloc_acts(&m, B, T, p[i]) == 0);
		bytes[i] = st_llama_act_bytes(&m);
		CHECK(bytes[i] == st_llama_act_bytes_for(&shape, B, T, p[i], NULL));
		st_llama_release(&m);
	}
	CHECK(bytes[0] > bytes[1] && bytes[1] > bytes[2]);
}

static void test_param_table(void)
{
	st_llama m = ST_LLAMA_INIT;
	CHECK(st_llama_init(&m, &shape) == 0);
	CHECK(m.ntensors == 3 + 9 * shape.L);
	const st_tensor *q = st_llama_find(&m, "model.layers.1.self_attn.q_proj.weight");
	CHECK(q && q->shape[0] == shape.H * shape.D && q->shape[1] == shape.E);
	const st_tensor *k = st_llama_find(&m, "model.layers.0.self_attn.k_proj.weight");
	CHECK(k && k->shape[0] == shape.K * shape.D);
	CHECK(st_llama_find(&m, "lm_head.weight") && !st_llama_find(&m, "nope"));
	CHECK(m.p.layers[1].wq == m.params + q->offset);
	int64_t sum = 0;
	for (int i = 0; i < m.ntensors; i++)
		sum += m.tensors[i].numel;
	CHECK(sum == m.nparams && sum == st_llama_count_params(&shape));
	st_llama_release(&m);
}

int main(void)
{
	test_param_table();
	test_finite_differences();
	test_remat_policies();
	test_activation_memory();
	test_bf16();
	test_bf16_storage_fp32_kernels();
	test_bf16_kernels();
	test_fresh_gradients();
	return check_result();
}
