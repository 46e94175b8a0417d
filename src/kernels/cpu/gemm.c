#include "kernels/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "base/err.h"

int st_gemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
	    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
	    int64_t ldc)
{
	if (M == 0 || N == 0)
		return 0;
	dnnl_status_t s = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	if (s != dnnl_success)
		return st_fail(ST_EINTERNAL, "oneDNN sgemm(%c%c, %lld x %lld x %lld) failed: status %d",
			       transa, transb, (long long)M, (long long)N, (long long)K, (int)s);
	return 0;
}
