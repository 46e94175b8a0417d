/*
 * gemm.h - matrix products, row-major, through oneDNN (sgemm and the matmul primitive).
 *
 * C(M,N) = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T ('N'/'T'),
 * all matrices row-major with leading dimensions lda/ldb/ldc (elements).
 * The Llama layers use three forms (W stored (out, in), as Hugging Face):
 *   y  = x W^T        st_gemm('N','T', ntok, out, in, ...)
 *   dx = dy W         st_gemm('N','N', ntok, in, out, ...)
 *   dW += dy^T x      st_gemm('T','N', out, in, ntok, ..., beta=1)
 *
 * fp32 runs through oneDNN's dnnl_sgemm: on this project's AVX-512 machines
 * (oneDNN 2.6) it measured 10-20% faster than the matmul primitive over the
 * model's shapes (docs/performance.md), and it is bit-identical at any
 * thread count for them. On CPUs without AVX-512 oneDNN's AVX2 sgemm (and
 * matmul) split K over the threads for some shapes (small M x N, long K),
 * so the result would depend on the thread count; there st_gemm cuts C into
 * tiles whose size depends on the shape only and runs one single-threaded
 * sgemm per tile
 * (ST_GEMM_TILES), whatever the thread count. bf16 has no sgemm-like entry
 * point and always uses the matmul primitive, as fp32 can with
 * st_gemm_set_f32_backend(ST_GEMM_MATMUL).
 *
 * Every product takes the caller's kernel context (kctx.h, the last
 * argument): the products own no memory. Matmul primitives: each distinct
 * call shape (dtypes, transposes, M, N, K, leading dimensions, alpha, beta)
 * and thread count (a primitive keeps the thread partition of its
 * creation) creates one oneDNN matmul primitive on first use and keeps it
 * in the context's table; later calls only execute it. Transposes are
 * memory-descriptor strides (no copies); beta != 0 is oneDNN's "sum"
 * post-op, alpha != 1 an output scale. Both paths use all OpenMP threads
 * (omp_get_max_threads() at the call; the regions with per-thread scratch
 * at most the context's st_ws_threads). Call from outside parallel
 * regions; calls on one context from several threads are serialized where
 * they use its table or scratch.
 *
 * Scratch from the context: the TILES back end's per-thread packed blocks
 * (products of the form 'T','N') and K-split partial sums, and the AMX
 * path's buffers (amx.h); none on the other paths. A context too small for
 * a product's shape (st_gemm_workspace_bytes) gets ST_EINVAL naming the
 * kernel and the bytes, and C is left unwritten.
 *
 * Determinism: with AVX-512, for the model's shapes, both oneDNN paths split
 * the work over blocks of M and N, never over K, so each element of C is one
 * fixed-order dot product and results are bit-identical for any thread
 * count; without it, the tiles make them so. tests/test_kernels.c checks the
 * model's shapes at 1 to 4 threads.
 */
#ifndef ST_KERNELS_GEMM_H
#define ST_KERNELS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kctx.h"

/* fp32. Returns 0, ST_EINVAL (no context, or one too small for the shape),
 * or ST_EINTERNAL if oneDNN refuses the call. */
int st_gemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
	    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
	    int64_t ldc, st_kctx *kc);

/*
 * bf16 inputs (uint16_t bit patterns, see bf16.h), fp32 accumulation, fp32 C;
 * beta is 0 (overwrite) or 1 (accumulate), or any other value. Needs a CPU
 * with AVX512_BF16 for speed (st_cpu_has_bf16()); elsewhere oneDNN emulates
 * or refuses, and this returns ST_EINTERNAL with the reason.
 */
int st_gemm_bf16(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		 const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		 float *C, int64_t ldc, st_kctx *kc);

/* The same with a bf16 C (rounded to nearest even from the fp32 result;
 * beta != 0 reads the old bf16 C). For activations stored in bf16. */
int st_gemm_bf16_out(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		     uint16_t *C, int64_t ldc, st_kctx *kc);

/*
 * Residual adds: C = R + op(A) op(B), R fp32 laid out as C (R == C is beta
 * 1). The AMX products start their sums from R, with no copy of R into C;
 * the other paths copy R into C (all threads) and accumulate. Same bits as
 * copying R into C and calling st_gemm / st_gemm_bf16 with beta 1.
 */
int st_gemm_res(char transa, char transb, int64_t M, int64_t N, int64_t K, const float *A,
		int64_t lda, const float *B, int64_t ldb, const float *R, float *C, int64_t ldc,
		st_kctx *kc);
int st_gemm_bf16_res(char transa, char transb, int64_t M, int64_t N, int64_t K,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const float *R,
		     float *C, int64_t ldc, st_kctx *kc);

/* The products' input and output types. */
enum st_gemm_dtype {
	ST_GEMM_F32,      /* st_gemm, st_gemm_res */
	ST_GEMM_BF16,     /* st_gemm_bf16, st_gemm_bf16_res: bf16 inputs, fp32 C */
	ST_GEMM_BF16_OUT, /* st_gemm_bf16_out: bf16 inputs and C */
};

/* A product's shape, for sizing a context: C(M,N) = op(A) op(B) with op(A)
 * M x K. Leading dimensions, alpha and beta do not change the scratch. */
typedef struct st_gemm_shape {
	enum st_gemm_dtype dtype;
	char ta, tb;
	int64_t M, N, K;
} st_gemm_shape;

/*
 * Bytes of context workspace (kctx.h: kc->ws) a product of shape s takes,
 * with its per-thread slices for `threads` (>= 1), on this CPU as it runs
 * now: the AMX path's buffers where st_amx_available() and the path takes
 * the shape (amx.h), the tiles' buffers on the TILES back end
 * (st_gemm_f32_backend()); 0 where the product needs none. The _list form:
 * the most of n shapes (products run one at a time, each laying out its
 * scratch from the start of the workspace). Size the context with
 * st_kctx_bytes of it.
 */
size_t st_gemm_workspace_bytes(const st_gemm_shape *s, int threads);
size_t st_gemm_workspace_bytes_list(const st_gemm_shape *s, int64_t n, int threads);

/*
 * oneDNN's implementation name for a call shape (e.g. "brg:avx512_core"),
 * creating the primitive in kc's table if needed; "" on failure. For
 * benchmarks and tests.
 */
const char *st_gemm_impl(enum st_gemm_dtype dtype, char transa, char transb, int64_t M, int64_t N,
			 int64_t K, int64_t lda, int64_t ldb, int64_t ldc, float beta, st_kctx *kc);

/* SGEMM: one sgemm call over all threads; MATMUL: the matmul primitive;
 * TILES: tiles of C sized by the shape only, one single-threaded sgemm each. */
enum st_gemm_backend { ST_GEMM_SGEMM, ST_GEMM_MATMUL, ST_GEMM_TILES };
/* Which one st_gemm uses (process-wide). By default TILES where oneDNN runs
 * without AVX-512 (its effective ISA) and SGEMM elsewhere. */
void st_gemm_set_f32_backend(enum st_gemm_backend b);
enum st_gemm_backend st_gemm_f32_backend(void);

/* Destroy every primitive in kc's table, and its engine and stream (they
 * are recreated on demand); st_kctx_release calls it. */
void st_gemm_cache_clear(st_kctx *kc);

#endif
