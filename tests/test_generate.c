/*
 * Generation (src/infer/generate.h): the decoder's logits, fed one token at
 * a time over its KV cache, give the training forward's loss on the same
 * sequence (head_dim 4: plain loops, 16: AVX-512; with Llama 3.1 RoPE
 * scaling; grouped-query attention); a prompt fed in chunks gives the
 * logits of one token at a time; reruns and thread counts give the same
 * bits; bad ids and a full cache are refused. The sampler: greedy is the
 * first largest logit, top-p keeps the nucleus and samples it in
 * proportion, the same seed gives the same draws. The loop: EOS, max
 * tokens, the context and the callback stop it.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/rng.h"
#include "check.h"
#include "infer/generate.h"
#include "model/llama.h"

static st_llama_shape shape_of(int64_t D, int llama31)
{
	st_llama_shape s = {.V = 37, .E = 32, .L = 2, .H = 4, .K = 2, .D = D, .M = 48, .eps = 1e-5f, .theta = 10000.0};
	if (llama31)
		s.rope = (st_rope_scaling){.enabled = 1, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
					   .original_max_len = 8};
	return s;
}

static void make_tokens(int32_t *tok, int n, int64_t V, uint64_t seed)
{
	for (int i = 0; i < n; i++)
		tok[i] = (int32_t)st_rng_below(seed, 0, (uint64_t)i, (uint64_t)V);
}

/* -log softmax(logits)[target], in double */
static double xent(const float *l, int64_t V, int32_t target)
{
	double mx = l[0], s = 0;
	for (int64_t i = 1; i < V; i++)
		mx = l[i] > mx ? l[i] : mx;
	for (int64_t i = 0; i < V; i++)
		s += exp((double)l[i] - mx);
	return mx + log(s) - (double)l[target];
}

/* Incremental logits against the training forward's loss. */
static void test_matches_training(int64_t D, int llama31)
{
	enum { T = 20 };
	st_llama_shape s = shape_of(D, llama31);
	st_llama m = ST_LLAMA_INIT;
	int32_t tok[T + 1];
	float logits[64];
	CHECK(st_llama_init(&m, &s) == 0);
	st_llama_init_weights(&m, 7);
	make_tokens(tok, T + 1, s.V, 3);
	CHECK(st_llama_alloc_acts(&m, 1, T, ST_REMAT_NONE) == 0);
	double want = 0, got = 0;
	CHECK(st_llama_forward_loss(&m, tok, &want) == 0);

	st_decoder *d;
	CHECK(st_decoder_create(&d, &m, T) == 0);
	for (int t = 0; t < T; t++) {
		CHECK(st_decoder_feed(d, &tok[t], 1, logits) == 0);
		got += xent(logits, s.V, tok[t + 1]);
	}
	CHECK(st_decoder_len(d) == T);
	printf("head_dim %lld%s: loss of %d tokens fed one at a time %.9f, training forward %.9f\n", (long long)D,
	       llama31 ? ", Llama 3.1 RoPE" : "", T, got / T, want / T);
	CHECK_NEAR(got, want, 1e-5);
	/* a full cache and a bad id are refused, nothing fed */
	CHECK(st_decoder_feed(d, tok, 1, logits) == ST_EINVAL);
	st_decoder_reset(d);
	int32_t bad[2] = {1, (int32_t)s.V};
	CHECK(st_decoder_feed(d, bad, 2, logits) == ST_EINVAL);
	CHECK(st_decoder_len(d) == 0);
	st_decoder_free(d);
	st_llama_release(&m);
}

/* A prompt of 150 tokens in chunks of 64 rows, and 40 + 110, give the
 * logits of feeding one at a time (close) and of each other rerun (exact). */
static void test_chunks_and_determinism(void)
{
	enum { T = 150 };
	st_llama_shape s = shape_of(16, 0);
	st_llama m = ST_LLAMA_INIT;
	int32_t tok[T];
	float *a = malloc(4 * s.V * sizeof(float)), *b = a + s.V, *c = b + s.V, *e = c + s.V;
	CHECK(st_llama_init(&m, &s) == 0);
	st_llama_init_weights(&m, 11);
	make_tokens(tok, T, s.V, 5);
	st_decoder *d;
	CHECK(st_decoder_create(&d, &m, T) == 0);
	CHECK(st_decoder_feed(d, tok, T, a) == 0);
	st_decoder_reset(d);
	CHECK(st_decoder_feed(d, tok, 40, NULL) == 0);
	CHECK(st_decoder_feed(d, tok + 40, T - 40, b) == 0);
	st_decoder_reset(d);
	for (int t = 0; t < T; t++)
		CHECK(st_decoder_feed(d, &tok[t], 1, c) == 0);
	double worst = 0;
	for (int64_t v = 0; v < s.V; v++) {
		worst = fmax(worst, fabs((double)a[v] - c[v]) / fmax(1e-3, fabs((double)c[v])));
		worst = fmax(worst, fabs((double)b[v] - c[v]) / fmax(1e-3, fabs((double)c[v])));
	}
	printf("150-token prompt in chunks vs one at a time: logits within %.1e relative\n", worst);
	CHECK(worst < 1e-4);
	/* the same again, and on another thread count: the same bits */
	int threads = omp_get_max_threads();
	for (int nt = 1; nt <= 2; nt++) {
		omp_set_num_threads(nt);
		st_decoder_reset(d);
		CHECK(st_decoder_feed(d, tok, T, e) == 0);
		CHECK_MSG(!memcmp(a, e, (size_t)s.V * sizeof(float)), "prompt logits differ at %d threads", nt);
		st_decoder_reset(d);
		for (int t = 0; t < T; t++)
			CHECK(st_decoder_feed(d, &tok[t], 1, e) == 0);
		CHECK_MSG(!memcmp(c, e, (size_t)s.V * sizeof(float)), "incremental logits differ at %d threads", nt);
	}
	omp_set_num_threads(threads);
	st_decoder_free(d);
	/* a model without its own weights (ZeRO-3) cannot decode */
	st_llama z = ST_LLAMA_INIT;
	CHECK(st_llama_init_tp(&z, &s, 1, 0, NULL, 0) == 0);
	CHECK(st_decoder_create(&d, &z, 8) == ST_EINVAL && !d);
	st_llama_release(&z);
	st_llama_release(&m);
	free(a);
}

static void test_sampler(void)
{
	st_sampler s = ST_SAMPLER_INIT;
	float l[6] = {0.5f, 2.0f, 2.0f, -1.0f, NAN, 1.0f};
	CHECK(st_sampler_init(&s, 6, 0, 1, 0) == 0);
	CHECK(st_sampler_pick(&s, l, 0) == 1); /* the first of equal largest; NaN never wins */
	st_sampler_release(&s);
	CHECK(st_sampler_init(&s, 6, -1, 1, 0) == ST_EINVAL);
	CHECK(st_sampler_init(&s, 6, INFINITY, 1, 0) == ST_EINVAL);
	CHECK(st_sampler_init(&s, 6, 1, 0, 0) == ST_EINVAL);
	CHECK(st_sampler_init(&s, 6, 1, 1.5, 0) == ST_EINVAL);

	/* p = 0.4, 0.3, 0.2, 0.1 at temperature 1: top-p 0.5 keeps {0, 1} (0.4 < 0.5 <= 0.7) */
	float q[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
	int count[4] = {0}, n = 20000;
	CHECK(st_sampler_init(&s, 4, 1.0, 0.5, 42) == 0);
	for (int i = 0; i < n; i++)
		count[st_sampler_pick(&s, q, (uint64_t)i)]++;
	printf("top-p 0.5 of (0.4, 0.3, 0.2, 0.1): %d %d %d %d of %d\n", count[0], count[1], count[2], count[3], n);
	CHECK(count[2] == 0 && count[3] == 0);
	CHECK(fabs(count[0] / (double)n - 4.0 / 7) < 0.02);
	/* the same seed and steps: the same tokens; top-p 1 reaches every token */
	int again = st_sampler_pick(&s, q, 123);
	CHECK(st_sampler_pick(&s, q, 123) == again);
	st_sampler_release(&s);
	memset(count, 0, sizeof(count));
	CHECK(st_sampler_init(&s, 4, 1.0, 1.0, 42) == 0);
	for (int i = 0; i < n; i++)
		count[st_sampler_pick(&s, q, (uint64_t)i)]++;
	for (int k = 0; k < 4; k++)
		CHECK_MSG(fabs(count[k] / (double)n - (0.4 - 0.1 * k)) < 0.02, "token %d drawn %d of %d", k, count[k], n);
	st_sampler_release(&s);
	/* a tiny top-p is greedy */
	CHECK(st_sampler_init(&s, 4, 2.0, 1e-9, 1) == 0);
	for (int i = 0; i < 100; i++)
		CHECK(st_sampler_pick(&s, q, (uint64_t)i) == 0);
	st_sampler_release(&s);
}

struct seen {
	int32_t ids[64];
	int n, stop_after, fail_after;
};

static int on_token(void *ctx, int32_t id, int is_eos)
{
	struct seen *w = ctx;
	(void)is_eos;
	w->ids[w->n++] = id;
	if (w->fail_after && w->n == w->fail_after)
		return st_fail(ST_EIO, "callback failed");
	return w->stop_after && w->n == w->stop_after;
}

static void test_loop(void)
{
	st_llama_shape s = shape_of(16, 0);
	st_llama m = ST_LLAMA_INIT;
	st_sampler smp = ST_SAMPLER_INIT;
	st_decoder *d;
	st_gen_result r;
	int32_t prompt[5] = {1, 2, 3, 4, 5};
	CHECK(st_llama_init(&m, &s) == 0);
	st_llama_init_weights(&m, 3);
	CHECK(st_sampler_init(&smp, s.V, 0, 1, 0) == 0);
	CHECK(st_decoder_create(&d, &m, 20) == 0);

	struct seen a = {0}, b = {0};
	st_gen_opts o = {.max_tokens = 10};
	CHECK(st_generate(d, &smp, prompt, 5, &o, on_token, &a, &r) == 0);
	CHECK(r.stop == ST_GEN_MAX_TOKENS && r.new_tokens == 10 && a.n == 10 && r.prompt_tokens == 5);
	/* greedy is the argmax of the decoder's logits at each step */
	float *l = malloc((size_t)s.V * sizeof(float));
	st_decoder_reset(d);
	CHECK(st_decoder_feed(d, prompt, 5, l) == 0);
	for (int k = 0; k < a.n; k++) {
		CHECK(st_sampler_pick(&smp, l, 0) == a.ids[k]);
		CHECK(st_decoder_feed(d, &a.ids[k], 1, l) == 0);
	}
	/* EOS: the third token, reported, then the end */
	int32_t eos = a.ids[2];
	int first = 0;
	while (a.ids[first] != eos)
		first++;
	o.eos = &eos;
	o.neos = 1;
	CHECK(st_generate(d, &smp, prompt, 5, &o, on_token, &b, &r) == 0);
	CHECK(r.stop == ST_GEN_EOS && b.n == first + 1 && b.ids[first] == eos);
	/* the context: a capacity of 20 positions, 5 of them the prompt, makes 16 new tokens */
	struct seen c = {0};
	o = (st_gen_opts){.max_tokens = 50};
	CHECK(st_generate(d, &smp, prompt, 5, &o, on_token, &c, &r) == 0);
	CHECK(r.stop == ST_GEN_CONTEXT && r.new_tokens == 16 && st_decoder_len(d) == 20);
	/* the callback stops it, or fails it */
	struct seen e = {.stop_after = 3}, f = {.fail_after = 2};
	CHECK(st_generate(d, &smp, prompt, 5, &o, on_token, &e, &r) == 0 && r.stop == ST_GEN_CALLER && e.n == 3);
	CHECK(st_generate(d, &smp, prompt, 5, &o, on_token, &f, &r) == ST_EIO && f.n == 2);
	/* prompts that do not fit, or none */
	int32_t longp[21] = {0};
	CHECK(st_generate(d, &smp, longp, 21, &o, NULL, NULL, &r) == ST_EINVAL);
	CHECK(st_generate(d, &smp, prompt, 0, &o, NULL, NULL, &r) == ST_EINVAL);
	free(l);
	st_decoder_free(d);
	st_sampler_release(&smp);
	st_llama_release(&m);
}

int main(void)
{
	test_matches_training(4, 0);
	test_matches_training(16, 0);
	test_matches_training(16, 1);
	test_chunks_and_determinism();
	test_sampler();
	test_loop();
	return check_result();
}
