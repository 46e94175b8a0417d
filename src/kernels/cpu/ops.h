/*
 * ops.h - the Llama operations on CPU, forward and backward, fp32.
 *
 * Shapes are given as (rows, columns) of row-major arrays; N = B*T tokens.
 * Backward functions write input gradients (overwrite, "d* =") unless the
 * name says accumulate; weight gradients are always accumulated ("+=") so
 * gradient accumulation over micro-batches needs no extra pass.
 * Every op threads with OpenMP over a fixed partition of the work, and every
 * reduction runs in a fixed order: results do not depend on the thread count.
 *
 * No op allocates memory. Those that need scratch (RMSNorm backward,
 * attention, the output layer) take a workspace from the caller
 * (workspace.h), of at least the bytes their ..._workspace_bytes function
 * gives for the shape (and, for per-thread slices, the threads it is sized
 * for), and return 0, or ST_EINVAL without writing anything when it is too
 * small. One workspace of the largest size serves every call.
 */
#ifndef ST_KERNELS_OPS_H
#define ST_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/workspace.h"

/* out(N,C) = x * rstd * w; rstd(N) saved for backward. */
void st_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int64_t N,
			int64_t C, float eps);
/* The same with a bf16 output (for bf16 matrix products): each value is the
 * fp32 result above rounded once (st_f32_to_bf16). */
void st_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *x, const float *w, int64_t N,
			     int64_t C, float eps);
/* ... and the same rounded values in fp32 too (exact), out32 (N,C): for an
 * fp32 kernel's product that reads them, without a second pass. */
void st_rmsnorm_forward_keep(uint16_t *out, float *out32, float *rstd, const float *x,
			     const float *w, int64_t N, int64_t C, float eps);
/* dx(N,C) += d/dx (accumulates: the residual stream's gradient is already there);
 * dw(C) += d/dw. Uses x and rstd from forward. ws: the partial sums of dw
 * per block of 64 rows (summed in block order afterwards, whatever the
 * thread count), st_rmsnorm_backward_workspace_bytes(N, C); no per-thread
 * part. */
size_t st_rmsnorm_backward_workspace_bytes(int64_t N, int64_t C);
int st_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
			const float *rstd, int64_t N, int64_t C, const st_ws *ws);

/*
 * RoPE tables: cos/sin (T, D/2) for positions 0..T-1. inv_freq[i] = theta^(-2i/D),
 * optionally with Llama 3.1 scaling (factor, low/high freq factors, original
 * context length). Computed in double.
 */
typedef struct st_rope_scaling {
	int enabled;
	double factor, low_freq_factor, high_freq_factor;
	double original_max_len;
} st_rope_scaling;
void st_rope_tables(float *cos_t, float *sin_t, int64_t T, int64_t D, double theta,
		    const st_rope_scaling *scaling);
/* In place on x (B,T,nh,D) (rows of nh*D), Hugging Face rotate_half pairing. */
void st_rope_forward(float *x, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
		     int64_t nh, int64_t D);
/* In place on dx: the transpose rotation. */
void st_rope_backward(float *dx, const float *cos_t, const float *sin_t, int64_t B, int64_t T,
		      int64_t nh, int64_t D);

/*
 * Causal grouped-query attention, softmax(q k^T / sqrt(D)) v, tiled
 * flash-style (attention.c): blocks of 64 queries x 64 keys, online softmax
 * in forward, tiles recomputed in backward; no (T,T) buffer exists.
 * q (B,T,H,D), k and v (B,T,K,D), out (B,T,H,D), lse (B,H,T) saved for
 * backward. Query head h reads kv head h / (H/K) (indexed, not copied).
 * ws, st_attention_workspace_bytes(B, T, H, K, D, threads) for either
 * direction: transposed copies of k (and in backward of v) of the size of
 * k, in backward rowsum(dout o out) (B,H,T), and per thread of `threads`
 * one 64x64 score tile and a 64-row output accumulator (forward) or two
 * 64x64 tiles (backward).
 */
size_t st_attention_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
				    int threads);
int st_attention_forward(float *out, float *lse, const float *q, const float *k,
			 const float *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			 const st_ws *ws);
/* dq = d/dq (overwrite); dk, dv = d/dk, d/dv (overwrite). */
int st_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
			  const float *lse, const float *q, const float *k, const float *v,
			  int64_t B, int64_t T, int64_t H, int64_t K, int64_t D, const st_ws *ws);

/*
 * The same with bf16 tile products (attention_bf16.c), for dtype=bfloat16:
 * same shapes and layouts, q, k and v in bf16 (the model keeps them so),
 * the rest fp32; same tiling, partitions and thread-count independence.
 * Every product reads bf16 inputs and accumulates in fp32: dout rounded
 * once (st_f32_to_bf16), the probabilities P and the tiles dS rounded
 * before the products that read them. Softmax statistics, lse, exp and
 * rowsum(dout o out) stay fp32.
 * AVX512_BF16 (VDPBF16PS) when built for it and D % 16 == 0; plain loops
 * with the same roundings otherwise.
 * ws, st_attention_bf16_workspace_bytes(B, T, H, K, D, threads) for either
 * direction: k and v in bf16 pair layouts (forward two, backward three
 * arrays of half the size of k), in backward rowsum(dout o out) (B,H,T),
 * and per thread of `threads` a (T, D) bf16 row buffer, then reused for the
 * tiles (fp32 and bf16) and one query block's bf16 operands.
 */
size_t st_attention_bf16_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
					 int threads);
int st_attention_forward_bf16(float *out, float *lse, const uint16_t *q, const uint16_t *k,
			      const uint16_t *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			      const st_ws *ws);
int st_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
			       const float *out, const float *lse, const uint16_t *q, const uint16_t *k,
			       const uint16_t *v, int64_t B, int64_t T, int64_t H, int64_t K, int64_t D,
			       const st_ws *ws);

/* Backward work partition, for tests: 0 automatic (default), 1 one task per
 * (batch, kv head), 2 separate dq and dk/dv passes. All give bit-identical
 * results; the automatic choice depends on B*K and the thread count. Applies
 * to both precisions. */
void st_attention_set_partition(int mode);

/* act(n) = silu(gate) * up, elementwise over n values. */
void st_swiglu_forward(float *act, const float *gate, const float *up, int64_t n);
/* dgate, dup (overwrite) from dact; either may alias dact. */
void st_swiglu_backward(float *dgate, float *dup, const float *dact, const float *gate,
			const float *up, int64_t n);
/* bf16 gate and up (bf16 mode keeps them so): the same with their exact
 * fp32 values; either output may alias dact. */
void st_swiglu_backward_gu16(float *dgate, float *dup, const float *dact, const uint16_t *gate,
			     const uint16_t *up, int64_t n);
/* bf16 outputs, each the fp32 result above rounded once; outputs must not
 * overlap the inputs. The backward reads bf16 gate and up, as _gu16. */
void st_swiglu_forward_bf16(uint16_t *act, const float *gate, const float *up, int64_t n);
/* ... from bf16 gate and up (their exact fp32 values) */
void st_swiglu_forward_gu16(uint16_t *act, const uint16_t *gate, const uint16_t *up, int64_t n);
/* ... from fp32 gate and up, in one pass: each rounded to bf16 and kept
 * (g16, u16), then act as _gu16 from those; and act32, unless NULL, gets
 * act's exact fp32 values (act32 may be gate itself: each value is read
 * before its slot is written). */
void st_swiglu_forward_keep(uint16_t *act, float *act32, uint16_t *g16, uint16_t *u16,
			    const float *gate, const float *up, int64_t n);
void st_swiglu_backward_bf16(uint16_t *dgate, uint16_t *dup, const float *dact,
			     const uint16_t *gate, const uint16_t *up, int64_t n);

/* x(N,C) = emb[tokens] (emb (V,C)). */
void st_embedding_forward(float *x, const float *emb, const int32_t *tokens, int64_t N,
			  int64_t C);
/* demb[tokens[t]] += dx[t], in token order. */
void st_embedding_backward(float *demb, const float *dx, const int32_t *tokens, int64_t N,
			   int64_t C);

/*
 * Cross-entropy over rows of logits, in two passes that read each logit once
 * and compute one exponential per logit; the building blocks of
 * st_lm_head_xent, exposed for a vocabulary-parallel output layer where each
 * process holds columns [v0, v0+V) of the vocabulary.
 *
 * st_xent_rows_exp: for each row r < nr of l (nr, V): rmax[r] = max_c l,
 * l = exp(l - rmax[r]) in place, rsum[r] = sum of those (double, fixed
 * order), tlogit[r] = the target's logit (before the exponential) when
 * targets[r] - v0 is a local column, else 0. targets/tlogit may be NULL.
 * A vocabulary-parallel caller then combines: M = max over processes of
 * rmax, S = sum of rsum * exp(rmax - M), target logit = sum of tlogit;
 * loss_r = M + log S - target logit.
 * st_xent_rows_grad: l *= rscale[r] per row, then l[r][targets[r]-v0] -=
 * scale where that column is local. With rscale[r] = scale * exp(rmax[r] - M)
 * / S, l becomes scale * (softmax - onehot), the gradient of scale * loss.
 */
void st_xent_rows_exp(float *l, float *rmax, double *rsum, float *tlogit, const int32_t *targets,
		      int64_t v0, int64_t nr, int64_t V);
void st_xent_rows_grad(float *l, const float *rscale, const int32_t *targets, int64_t v0,
		       int64_t nr, int64_t V, float scale);
/* The same over bf16 logits (row r at l + r * ld), as the bf16 mode's
 * output layer keeps them: st_xent_rows_exp16 stores nothing (rmax, rsum,
 * tlogit as above); st_xent_rows_grad16 then writes, over the logits in
 * place, the gradient exp(l - rmax[r]) * rscale[r] (minus scale at the
 * target column), each value computed in fp32 and rounded once to bf16. */
void st_xent_rows_exp16(const uint16_t *l, int64_t ld, float *rmax, double *rsum, float *tlogit,
			const int32_t *targets, int64_t v0, int64_t nr, int64_t V);
void st_xent_rows_grad16(uint16_t *l, int64_t ld, const float *rmax, const float *rscale,
			 const int32_t *targets, int64_t v0, int64_t nr, int64_t V, float scale);
/* The same written as bf16 (each value the fp32 result above rounded once),
 * row r at out + r * ldo: a separate array (ldo >= V; l is left unchanged),
 * or l itself with ldo = 2V (each row's bf16 values over the first half of
 * its fp32 storage, so the chunk needs no second buffer). */
void st_xent_rows_grad_bf16(uint16_t *out, int64_t ldo, const float *l, const float *rscale,
			    const int32_t *targets, int64_t v0, int64_t nr, int64_t V, float scale);

/*
 * Output layer and cross-entropy, fused and chunked over rows so the (N,V)
 * logits never exist at once. For x (N,E), W (V,E), targets (N):
 *   loss_sum += sum_t -log softmax(x_t W^T)[target_t]   (double, fixed order)
 *   dx (N,E) = scale * d(loss_sum)/dx   (overwrite)
 *   dW (V,E) += scale * d(loss_sum)/dW
 * ws, st_lm_head_workspace_bytes(V, chunk_rows): one chunk's logits
 * (chunk_rows x V floats) and four statistics per row; no per-thread part.
 * kc: the kernel context of its matrix products (kctx.h), sized for the
 * shapes st_lm_head_products lists. Returns 0 or a negative ST_E* code.
 */
size_t st_lm_head_workspace_bytes(int64_t V, int64_t chunk_rows);
int st_lm_head_xent(double *loss_sum, float *dx, float *dW, const float *x, const float *W,
		    const int32_t *targets, int64_t N, int64_t E, int64_t V, float scale,
		    int64_t chunk_rows, const st_ws *ws, st_kctx *kc);
/* Forward only (evaluation): loss_sum += sum of -log p(target). */
int st_lm_head_loss(double *loss_sum, const float *x, const float *W, const int32_t *targets,
		    int64_t N, int64_t E, int64_t V, int64_t chunk_rows, const st_ws *ws,
		    st_kctx *kc);
/* The shapes of the fp32 products st_lm_head_xent and st_lm_head_loss run
 * (logits, dx, dW, for a whole chunk and for the last, shorter one), for
 * sizing their kernel context: fills out (up to 6) and returns the count. */
int st_lm_head_products(int64_t N, int64_t E, int64_t V, int64_t chunk_rows, st_gemm_shape out[6]);

#endif
