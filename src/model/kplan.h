/*
 * kplan.h - bf16 by measured rate: which kernel, bf16 or fp32, each of the
 * model's matrix products and attention passes runs on (dtype=bfloat16).
 *
 * With dtype=bfloat16 the model keeps its product inputs, the residual
 * stream and a weight copy in bf16 (the memory saving). Whether a bf16
 * product is also faster than an fp32 one depends on the CPU: with
 * AVX512_BF16 and a good oneDNN path it is (1.6-1.7x on Zen 5); on a CPU
 * that only emulates or runs it at half rate it is slower than fp32. So
 * each product site (a role in the layer, e.g. "gate_up" for the gate and up
 * projections, "w_down" for the down projection's weight gradient) runs on
 * the faster of the two kernels for its shape, the fp32 one reading fp32
 * copies of its bf16 operands (converted per call; exact) and the fp32
 * master weights.
 *
 * The plan is a string, the config key bf16_kernels:
 *   auto            time both kernels once per site at the run's shape (rank
 *                   0 decides and broadcasts; the decision is logged in the
 *                   explicit form below and stored in the checkpoint, whose
 *                   plan a resumed run reuses); every site on fp32, untimed,
 *                   where the CPU has no bf16 products (st_cpu_has_bf16),
 *                   which also refuses an explicit plan with a bf16 site
 *   bf16 | fp32     every site on that kernel
 *   SITE:K,...      every site named once, K bf16 or fp32, e.g. the logged
 *                   plan "q:bf16,kv:bf16,...,d_attn:fp32"
 * A run is bit-for-bit reproducible given its explicit plan (same mesh,
 * same thread count).
 */
#ifndef ST_MODEL_KPLAN_H
#define ST_MODEL_KPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/gemm.h"

/* Product sites in the model's order (forward, backward data, backward
 * weights), then the attention passes. */
enum st_ksite {
	ST_KS_Q, ST_KS_KV, ST_KS_O, ST_KS_GATE_UP, ST_KS_DOWN, ST_KS_LOGITS,
	ST_KS_D_DOWN, ST_KS_D_GATE_UP, ST_KS_D_O, ST_KS_D_Q, ST_KS_D_KV, ST_KS_D_LOGITS,
	ST_KS_W_DOWN, ST_KS_W_GATE_UP, ST_KS_W_O, ST_KS_W_Q, ST_KS_W_KV, ST_KS_W_LOGITS,
	ST_KS_ATTN, ST_KS_D_ATTN,
	ST_KS_COUNT
};

typedef struct st_kplan {
	unsigned char f32[ST_KS_COUNT]; /* 1: the site runs on the fp32 kernel */
} st_kplan;

/* Longest explicit plan string, with its NUL. */
#define ST_KPLAN_STR_MAX 320

const char *st_ksite_name(int site);

/*
 * Parse an explicit plan ("bf16", "fp32" or the SITE:K list; not "auto").
 * ST_EINVAL with the reason (unknown site, a site twice or missing, a kind
 * other than bf16/fp32) otherwise.
 */
int st_kplan_parse(st_kplan *p, const char *s);
/* 1 for "auto" (any case). */
int st_kplan_is_auto(const char *s);
/* Check a bf16_kernels value: "auto" or a plan st_kplan_parse accepts. */
int st_kplan_check(const char *s);
/* The explicit SITE:K list of every site (out: ST_KPLAN_STR_MAX bytes). */
void st_kplan_format(const st_kplan *p, char *out, size_t n);
/* Sites on the fp32 kernel. */
int st_kplan_count_f32(const st_kplan *p);

/* The shape a plan is timed at: this process's model dimensions (heads,
 * mlp and vocabulary divided by tensor parallelism) and one micro-batch. */
typedef struct st_kshape {
	int64_t B, T;        /* micro-batch rows and sequence length (N = B*T tokens) */
	int64_t E, H, K, D, M, V; /* emb, q heads, kv heads, head dim, mlp, vocab rows */
	int64_t R;           /* rows of the output layer's chunks */
	int resident;        /* 1: the bf16 weight copy exists (else converted per product) */
} st_kshape;

/* Elements of the fp32 copies the fp32 kernels of plan p need at shape s
 * (uncapped): *a_elems for first operands, *b_elems for second ones (0:
 * none); sites in the mask `given` (bit 1 << site) have their bf16
 * operand's copy made elsewhere by the caller. */
void st_kplan_scratch(const st_kplan *p, const st_kshape *s, unsigned given, int64_t *a_elems,
		      int64_t *b_elems);
/* 1 when some site reads the weights' bf16 copy (a bf16 product of a weight). */
int st_kplan_bf16_weights(const st_kplan *p);

/* Product site `site` (< ST_KS_ATTN) at shape s as model/llama.c calls it,
 * on the kernel of dtype, with `rows` rows for the output layer's sites
 * (their 'R': a chunk's rows): for sizing a kernel context (gemm.h's
 * st_gemm_workspace_bytes_list). */
void st_ksite_product(const st_kshape *s, int site, int64_t rows, enum st_gemm_dtype dtype,
		      st_gemm_shape *out);

/*
 * Time both kernels of every site at this shape, on this process's OpenMP
 * threads: each the conversions it needs (fp32: its bf16-only operands;
 * bf16: its fp32 operands) and the product, one warm-up and then the best of
 * `reps` alternated runs. out: the faster of each (bf16 on a tie); ratio
 * (may be NULL): fp32 time / bf16 time per site (> 1: bf16 is faster).
 * Allocates and frees its own buffers (the largest: the output layer's
 * chunk) and its own kernel context (kctx.h), sized for the timed shapes.
 * ST_ENOMEM, or an error of the kernels.
 */
int st_kplan_time(const st_kshape *s, int reps, st_kplan *out, double ratio[ST_KS_COUNT]);

#endif
