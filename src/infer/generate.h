/*
 * generate.h - text generation with a Llama: incremental decoding over a
 * key/value cache, the choice of each next token (greedy, temperature,
 * top-p, seeded), and the loop that ties them together with EOS and length
 * limits. Tokens only: text in and out is the caller's (src/text,
 * src/cli/generate.c).
 *
 *   st_decoder *d;
 *   rc = st_decoder_create(&d, &model, cap);   // model: resident fp32 weights, one process
 *   st_sampler s = ST_SAMPLER_INIT;
 *   rc = st_sampler_init(&s, model.s.V, temperature, top_p, seed);
 *   st_gen_result r;
 *   rc = st_generate(d, &s, prompt, nprompt, &opts, on_token, ctx, &r);
 *   st_sampler_release(&s);
 *   st_decoder_free(d);
 *
 * The decoder computes what the training forward (st_llama_forward_loss)
 * computes for the same sequence, in fp32, but one new token at a time:
 * each layer's rotated keys and values of every position fed so far stay
 * in the cache, so a new token costs one row through every product plus
 * its attention over the cache (src/kernels/cpu/attention_kv.h), not the
 * whole sequence again. A prompt goes through in chunks of rows.
 *
 * Determinism: the kernels use fixed partitions, and the sampler draws from
 * st_rng (seed, step): the same model, prompt, options and chunking give
 * the same tokens, at any thread count.
 *
 * Errors: 0 or a negative ST_E* code with a message (base/err.h): ST_EINVAL
 * for bad arguments (an id outside the vocabulary, a full cache, a model
 * that is not resident or split by tensor parallelism), ST_ENOMEM,
 * ST_EINTERNAL from oneDNN.
 */
#ifndef ST_INFER_GENERATE_H
#define ST_INFER_GENERATE_H

#include <stdint.h>

#include "model/llama.h"

typedef struct st_decoder st_decoder;

/*
 * A decoder over m's weights (borrowed: m must outlive it and its weights
 * must not change while it holds positions) with room for cap positions
 * (0..cap-1). m: resident parameters (st_llama_init), tp 1; fp32 products
 * whatever m->bf16 says. Allocates the cache, 2 * L * cap * K * D floats,
 * the RoPE tables for cap positions, and row buffers for chunks of
 * min(cap, 64) tokens.
 */
int st_decoder_create(st_decoder **out, const st_llama *m, int64_t cap);
void st_decoder_free(st_decoder *d); /* NULL is fine */
/* Positions held: the tokens fed since creation or the last reset. */
int64_t st_decoder_len(const st_decoder *d);
int64_t st_decoder_capacity(const st_decoder *d);
/* Forget every position (the next token fed is position 0). */
void st_decoder_reset(st_decoder *d);
/*
 * Feed tokens[0..n) at positions len..len+n-1 and, when logits is not NULL,
 * write the V logits that follow the last of them. ST_EINVAL (nothing fed)
 * when an id is outside [0, V) or len + n > cap.
 */
int st_decoder_feed(st_decoder *d, const int32_t *tokens, int64_t n, float *logits);

/*
 * Choosing the next token from logits. temperature 0: greedy, the largest
 * logit (the lowest id among equals, as torch.argmax). Otherwise softmax of
 * logits / temperature (in double); with top_p < 1 only the nucleus is kept,
 * the fewest most likely tokens whose probabilities sum to at least top_p
 * (Hugging Face's TopPLogitsWarper), and renormalized; then one draw
 * st_rng_uniform(seed, ST_SAMPLER_STREAM, step) picks the token.
 */
#define ST_SAMPLER_STREAM 0x67656e /* "gen" */
typedef struct st_sampler {
	double temperature, top_p;
	uint64_t seed;
	int64_t V;
	double *prob;  /* V: scratch */
	int32_t *idx;  /* V: the nucleus, most likely first */
} st_sampler;
#define ST_SAMPLER_INIT {0}

/* ST_EINVAL for temperature < 0 or not finite, top_p outside (0, 1]. */
int st_sampler_init(st_sampler *s, int64_t V, double temperature, double top_p, uint64_t seed);
/* The token for draw number `step` (0 for the first new token, 1, ...). */
int32_t st_sampler_pick(st_sampler *s, const float *logits, uint64_t step);
void st_sampler_release(st_sampler *s);

/* Why st_generate stopped. */
enum st_gen_stop {
	ST_GEN_EOS,        /* it chose one of opts->eos */
	ST_GEN_MAX_TOKENS, /* opts->max_tokens new tokens */
	ST_GEN_CONTEXT,    /* the next token would need a position past the decoder's capacity */
	ST_GEN_CALLER,     /* the token callback returned 1 */
};
const char *st_gen_stop_name(enum st_gen_stop stop); /* "eos", "max_tokens", "context", "caller" */

typedef struct st_gen_opts {
	int64_t max_tokens;   /* new tokens at most, >= 1 */
	const int32_t *eos;   /* stop after choosing one of these (it is passed to the callback) */
	int neos;
} st_gen_opts;

typedef struct st_gen_result {
	int64_t prompt_tokens, new_tokens; /* new_tokens counts an EOS that stopped it */
	double prefill_s;                  /* the prompt's forward */
	double decode_s;                   /* every new token's choice and forward after that */
	enum st_gen_stop stop;
} st_gen_result;

/*
 * Called with each new token as soon as it is chosen (is_eos: it is one of
 * opts->eos and generation stops after it). Return 0 to go on, 1 to stop
 * (ST_GEN_CALLER), or a negative ST_E* code, which st_generate returns.
 */
typedef int (*st_gen_token_fn)(void *ctx, int32_t id, int is_eos);

/*
 * Reset d, feed prompt[0..n) (n >= 1, n <= capacity), then choose, report
 * and feed new tokens until a stop; the last new token is never fed, so a
 * sequence reaches at most capacity + 1 tokens. *r is filled on success and
 * on a callback's error.
 */
int st_generate(st_decoder *d, st_sampler *s, const int32_t *prompt, int64_t n, const st_gen_opts *o,
		st_gen_token_fn fn, void *ctx, st_gen_result *r);

#endif
