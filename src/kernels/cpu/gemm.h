/*
 * gemm.h - matrix products, row-major, through oneDNN.
 *
 * C(M,N) = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T ('N'/'T'),
 * all matrices row-major with leading dimensions lda/ldb/ldc (elements).
 * The Llama layers use three forms (W stored (out, in), as Hugging Face):
 *   y  = x W^T        st_gemm('N','T', ntok, out, in, ...)
 *   dx = dy W         st_gemm('N','N', ntok, in, out, ...)
 *   dW += dy^T x      st_gemm('T','N', out, in, ntok, ..., beta=1)
 * Results are deterministic for a fixed thread count.
 */
#ifndef ST_KERNELS_GEMM_H
#define ST_KERNELS_GEMM_H

#include <stdint.h>

/* Returns 0, or ST_EINTERNAL if oneDNN refuses the call. */
int st_gemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
	    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
	    int64_t ldc);

#endif
