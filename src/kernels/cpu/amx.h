/*
 * amx.h - bf16 matrix products on Intel AMX (tdpbf16ps), where the CPU and
 * the kernel offer it; st_gemm_bf16 and st_gemm_bf16_out try this first.
 *
 * C(M,N) = op(A) op(B) (+ C when beta is 1), row-major, op 'N' or 'T' as in
 * gemm.h; bf16 inputs, fp32 sums; C fp32, or bf16 (c_bf16: rounded to
 * nearest even, beta 0 only). Returns 1 when done, 0 when this path does
 * not take the call (no AMX, ST_AMX=0 in the environment, alpha != 1, beta
 * not 0 or 1, a bf16 C with K > 2048, called inside a parallel region): the
 * caller then runs its other path. <0: ST_EINVAL, no context or one too
 * small for the shape (st_amx_workspace_bytes), nothing written.
 *
 * Scratch comes from the caller's kernel context (kctx.h): a packed block
 * of op(B) (1 MiB), op(A) packed whole where it is transposed (up to 64
 * MiB, else strip by strip) and one strip per thread (200 KiB each). Calls
 * on one context are serialized (its lock); the product runs on
 * st_ws_threads(&kc->ws) threads.
 *
 * Each element of C is the same sequence of tdpbf16ps (k steps of 32 in
 * order, zeros past K) whatever the thread count, so results are bit for
 * bit the same at any thread count.
 */
#ifndef ST_KERNELS_AMX_H
#define ST_KERNELS_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kctx.h"

/* The CPU has AMX-BF16 and the kernel granted the tile state (and ST_AMX
 * is not "0", and st_amx_set_enabled(0) was not called). */
int st_amx_available(void);
/* Process-wide switch (tests and benchmarks compare both paths). */
void st_amx_set_enabled(int on);

int st_amx_gemm_bf16(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		     void *C, int64_t ldc, int c_bf16, st_kctx *kc);

/* C = R + op(A) op(B), fp32 R laid out as C (row stride ldc; R == C is beta
 * 1): the sums start from R where they would start from C, so a residual
 * add needs no copy of R into C first. Returns as st_amx_gemm_bf16. */
int st_amx_gemm_bf16_res(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
			 int64_t lda, const uint16_t *B, int64_t ldb, const float *R, float *C,
			 int64_t ldc, st_kctx *kc);

/* Bytes of context workspace a product of this shape takes on this path
 * with its per-thread strips for `threads`: 0 where the path would not take
 * it (no AMX, ST_AMX=0, a bf16 C with K > 2048, an empty product). Alpha
 * and beta are not in the shape: counted as taken. */
size_t st_amx_workspace_bytes(char ta, char tb, int64_t M, int64_t N, int64_t K, int c_bf16,
			      int threads);

/*
 * One tile product of the bf16 attention (attention_bf16.c's dp_tile, whose
 * operands are words of two bf16 along the reduction): C (m x N, stride
 * ldc) += A B (acc), or = scale * A B; word (r, p) of A at A[r*sr + p*sc]
 * (sc or sr 1), word (p, c) of B at B[p*ldb + c]. Returns 1 when done, 0
 * when not taken (no AMX; m, N, np not multiples of 16, m or np over 64).
 * Leaves this thread's tile configuration loaded for the next call. Takes
 * no context: its one scratch, a transposed A of at most 64 x 64 words, is
 * on the stack.
 */
int st_amx_dp_tile(float *C, int64_t ldc, int64_t m, int64_t N, const uint32_t *A, int64_t sr,
		   int64_t sc, int64_t np, const uint32_t *B, int64_t ldb, int acc, float scale);

#endif
