#include "kernels/cpu/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16.h"

enum { DT_F32 = ST_GEMM_F32, DT_BF16 = ST_GEMM_BF16, DT_BF16_OUT = ST_GEMM_BF16_OUT };

/*
 * The matmul primitives of a context (kctx.h): a table of ST_KCTX_PRIMS
 * entries looked up by key (a linear scan: a model's few dozen shapes cost
 * well under a microsecond a call); when it is full, a new entry replaces
 * the oldest (creation order, a ring), whose primitive is destroyed. The
 * engine and stream are the context's too, created on first use. All of
 * this under the context's lock.
 */
typedef st_kprim_key gemm_key;

static int same_key(const gemm_key *a, const gemm_key *b)
{
	return a->dtype == b->dtype && a->threads == b->threads && a->ta == b->ta && a->tb == b->tb &&
	       a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda && a->ldb == b->ldb &&
	       a->ldc == b->ldc && a->alpha == b->alpha && a->beta == b->beta;
}

/* Engine and stream, once per context (under its lock). */
static int ensure_engine(st_kctx *kc)
{
	if (kc->stream)
		return 0;
	if (kc->dnnl_failed)
		return st_fail(ST_EINTERNAL, "oneDNN CPU engine is unavailable");
	dnnl_engine_t engine = NULL;
	dnnl_stream_t stream = NULL;
	if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
	    dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
		if (engine)
			dnnl_engine_destroy(engine);
		kc->dnnl_failed = 1;
		return st_fail(ST_EINTERNAL, "cannot create oneDNN's CPU engine and stream");
	}
	kc->engine = engine;
	kc->stream = stream;
	return 0;
}

/* Row-major (rows, cols) view; transposed when stored (cols, rows) with ld. */
static void plain_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld, char trans,
		     dnnl_data_type_t dt)
{
	dnnl_dims_t dims = {rows, cols};
	dnnl_dims_t strides = {ld, 1};
	if (trans == 'T' || trans == 't') {
		strides[0] = 1;
		strides[1] = ld;
	}
	dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static void destroy_entry(st_kprim *en)
{
	if (en->prim)
		dnnl_primitive_destroy(en->prim);
	if (en->a)
		dnnl_memory_destroy(en->a);
	if (en->b)
		dnnl_memory_destroy(en->b);
	if (en->c)
		dnnl_memory_destroy(en->c);
	memset(en, 0, sizeof(*en));
}

static int create_entry(st_kprim *en, const gemm_key *k, dnnl_engine_t engine)
{
	dnnl_data_type_t in = k->dtype == DT_F32 ? dnnl_f32 : dnnl_bf16;
	dnnl_data_type_t out = k->dtype == DT_BF16_OUT ? dnnl_bf16 : dnnl_f32;
	dnnl_memory_desc_t a_md, b_md, c_md;
	plain_md(&a_md, k->M, k->K, k->lda, k->ta, in);
	plain_md(&b_md, k->K, k->N, k->ldb, k->tb, in);
	plain_md(&c_md, k->M, k->N, k->ldc, 'N', out);
	dnnl_matmul_desc_t desc;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	const char *what = "descriptor";
	dnnl_status_t s = dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md);
	if (s == dnnl_success && (s = dnnl_primitive_attr_create(&attr)) == dnnl_success) {
		what = "attributes";
		if (k->alpha != 1.0f)
			s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
		if (s == dnnl_success && k->beta != 0.0f) {
			if ((s = dnnl_post_ops_create(&po)) == dnnl_success &&
			    (s = dnnl_post_ops_append_sum(po, k->beta)) == dnnl_success)
				s = dnnl_primitive_attr_set_post_ops(attr, po);
		}
	}
	if (s == dnnl_success) {
		what = "primitive descriptor";
		s = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
	}
	if (s == dnnl_success) {
		what = "primitive";
		s = dnnl_primitive_create(&en->prim, pd);
	}
	if (s == dnnl_success) {
		const char *impl = NULL;
		dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
		snprintf(en->impl, sizeof(en->impl), "%s", impl ? impl : "?");
		what = "memory";
		if ((s = dnnl_memory_create(&en->a, &a_md, engine, DNNL_MEMORY_NONE)) == dnnl_success &&
		    (s = dnnl_memory_create(&en->b, &b_md, engine, DNNL_MEMORY_NONE)) == dnnl_success)
			s = dnnl_memory_create(&en->c, &c_md, engine, DNNL_MEMORY_NONE);
	}
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	if (s != dnnl_success) {
		destroy_entry(en);
		return st_fail(ST_EINTERNAL,
			       "oneDNN matmul %s (%s, %c%c, %lld x %lld x %lld, ld %lld/%lld/%lld) failed: "
			       "status %d%s",
			       what, k->dtype == DT_F32 ? "f32" : "bf16", k->ta, k->tb, (long long)k->M,
			       (long long)k->N, (long long)k->K, (long long)k->lda, (long long)k->ldb,
			       (long long)k->ldc, (int)s,
			       k->dtype != DT_F32 && !st_cpu_has_bf16()
				       ? " (this CPU has no AVX512_BF16 instructions)" : "");
	}
	en->key = *k;
	return 0;
}

/* The context's entry for a key (creating it, in place of the oldest when
 * the table is full), under kc->lock. */
static int lookup(st_kctx *kc, const gemm_key *k, st_kprim **out)
{
	int rc = ensure_engine(kc);
	if (rc < 0)
		return rc;
	for (int i = 0; i < kc->nprims; i++)
		if (same_key(&kc->prims[i].key, k)) {
			*out = &kc->prims[i];
			return 0;
		}
	st_kprim en;
	memset(&en, 0, sizeof(en));
	if ((rc = create_entry(&en, k, kc->engine)) < 0)
		return rc;
	st_kprim *slot;
	if (kc->nprims < ST_KCTX_PRIMS) {
		slot = &kc->prims[kc->nprims++];
	} else {
		slot = &kc->prims[kc->oldest];
		destroy_entry(slot);
		kc->oldest = (kc->oldest + 1) % ST_KCTX_PRIMS;
	}
	*slot = en;
	*out = slot;
	return 0;
}

/* The context, or ST_EINVAL naming the product. */
static int need_ctx(const st_kctx *kc, const char *what)
{
	return kc && kc->ready ? 0 : st_fail(ST_EINVAL, "%s: no kernel context", what);
}

/* K == 0: C = beta * C (no product). */
static void scale_only(int dtype, int64_t M, int64_t N, float beta, void *C, int64_t ldc)
{
	for (int64_t i = 0; i < M; i++) {
		if (dtype == DT_BF16_OUT) {
			uint16_t *c = (uint16_t *)C + i * ldc;
			for (int64_t j = 0; j < N; j++)
				c[j] = beta == 0.0f ? 0 : st_f32_to_bf16(beta * st_bf16_to_f32(c[j]));
		} else {
			float *c = (float *)C + i * ldc;
			for (int64_t j = 0; j < N; j++)
				c[j] = beta == 0.0f ? 0.0f : beta * c[j];
		}
	}
}

static int gemm_any(int dtype, char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
		    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C,
		    int64_t ldc, st_kctx *kc)
{
	if (M <= 0 || N <= 0)
		return 0;
	if (K <= 0) {
		scale_only(dtype, M, N, beta, C, ldc);
		return 0;
	}
	gemm_key k = {.dtype = dtype, .threads = omp_get_max_threads(),
		      .ta = (ta == 't' ? 'T' : ta == 'n' ? 'N' : ta),
		      .tb = (tb == 't' ? 'T' : tb == 'n' ? 'N' : tb), .M = M, .N = N, .K = K,
		      .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta};
	pthread_mutex_lock(&kc->lock);
	st_kprim *en;
	int rc = lookup(kc, &k, &en);
	if (rc == 0) {
		dnnl_memory_set_data_handle(en->a, (void *)A);
		dnnl_memory_set_data_handle(en->b, (void *)B);
		dnnl_memory_set_data_handle(en->c, C);
		dnnl_exec_arg_t args[3] = {
			{DNNL_ARG_SRC, en->a}, {DNNL_ARG_WEIGHTS, en->b}, {DNNL_ARG_DST, en->c}};
		dnnl_status_t s = dnnl_primitive_execute(en->prim, kc->stream, 3, args);
		if (s == dnnl_success)
			s = dnnl_stream_wait(kc->stream);
		if (s != dnnl_success)
			rc = st_fail(ST_EINTERNAL, "oneDNN matmul (%c%c, %lld x %lld x %lld) failed: status %d",
				     k.ta, k.tb, (long long)M, (long long)N, (long long)K, (int)s);
	}
	pthread_mutex_unlock(&kc->lock);
	return rc;
}

/* -1: not chosen yet (st_gemm_f32_backend decides on first use). */
static int f32_backend = -1;

void st_gemm_set_f32_backend(enum st_gemm_backend b) { f32_backend = (int)b; }

enum st_gemm_backend st_gemm_f32_backend(void)
{
	if (f32_backend < 0) {
		unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
		f32_backend = (isa & avx512) == avx512 ? ST_GEMM_SGEMM : ST_GEMM_TILES;
	}
	return (enum st_gemm_backend)f32_backend;
}

static int sgemm_failed(char transa, char transb, int64_t M, int64_t N, int64_t K, int s)
{
	return st_fail(ST_EINTERNAL, "oneDNN sgemm(%c%c, %lld x %lld x %lld) failed: status %d", transa,
		       transb, (long long)M, (long long)N, (long long)K, s);
}

/* ST_GEMM_TILES: C in tiles whose size depends on the shape only, never on
 * the thread count, each one single-threaded sgemm (oneDNN runs sequentially
 * inside a parallel region, so also for a single tile), the tiles spread
 * over the threads. 512 x 1024 where C is large (smaller tiles ran oneDNN's
 * AVX2 sgemm at half its rate, bench figures in docs/performance.md),
 * halved down to 128 until there are 4 tiles, so that small products still
 * use every thread of a 2-4 core machine. (Until 4 tiles, not 8: halving
 * the model's 2048 x 768 products to 512 x 384 ran them at 82-85 GFLOP/s
 * against 91-93 for 512 x 768 on a Zen 3, 1 thread; with 5-8 threads such
 * a product now leaves threads idle.)
 *
 * The weight gradients' form (A transposed: dW += dy^T x, K the tokens):
 * oneDNN's AVX2 sgemm ran a 512 x 384 tile of dy^T x at 39 GFLOP/s when
 * its A and B were blocks of wider matrices (leading dimension 2048), 62-65
 * when contiguous, and 83-86 for contiguous tiles of 256 rows; so there
 * each tile's blocks of A and B are first copied contiguous (a buffer per
 * thread, about 1/40 of the tile's time) and, where K is long (>= 1024), tiles
 * have at most 256 rows. Better still where K is long and C not too large
 * (sgemm_ksplit): the tokens in KSPLIT chunks, each chunk's whole M x N
 * product one sgemm call (rows k0.. of A and B are contiguous already:
 * nothing to copy), the chunks summed in order after. Whole products ran
 * at 85-88 GFLOP/s with cold caches where the tiles ran at 57-69 (each
 * tile repacks all of B). Figures: docs/performance.md, "The weight
 * gradients' tiles" and "Chunks of tokens". */
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void tile_shape(int64_t M, int64_t N, int64_t mmax, int64_t *tm, int64_t *tn)
{
	int64_t a = cdiv(M < mmax ? M : mmax, 128) * 128, b = cdiv(N < 1024 ? N : 1024, 128) * 128;
	while (cdiv(M, a) * cdiv(N, b) < 4 && (a > 128 || b > 128)) {
		if (b >= a)
			b = cdiv(b / 2, 128) * 128;
		else
			a = cdiv(a / 2, 128) * 128;
	}
	*tm = a;
	*tn = b;
}

/* Token chunks where K is at least KSPLIT_MIN_K (also where the packed
 * tiles get at most 256 rows). */
enum { KSPLIT = 4, KSPLIT_MIN_K = 1024 };
#define KSPLIT_MAX_FLOATS ((int64_t)16 << 20) /* 64 MiB of partial products at most */

/* rows x cols of src (leading dimension ld) into dst, contiguous; dst. */
static const float *copy_block(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
	for (int64_t r = 0; r < rows; r++)
		memcpy(dst + r * cols, src + r * ld, (size_t)cols * sizeof(float));
	return dst;
}

/* The number of token chunks of C = alpha A^T B + beta C (shape only), or 0
 * where sgemm_tiles keeps its tiles: K short, or C too large to hold
 * KSPLIT - 1 more copies of. */
static int ksplit_chunks(int64_t M, int64_t N, int64_t K)
{
	if (K < KSPLIT_MIN_K || (KSPLIT - 1) * M * N > KSPLIT_MAX_FLOATS)
		return 0;
	return KSPLIT;
}

/*
 * The TILES back end's scratch for a product, in the context's workspace:
 * placed at base, or only counted (base NULL); returns its bytes. The
 * weight gradients' form (A^T B) takes, in chunks of tokens, the chunks'
 * partial products (chunks - 1 copies of C), else, in tiles, one packing
 * buffer per thread for a tile's blocks of A and B (K x (tile rows + tile
 * columns) floats); the other forms take nothing. st_gemm_workspace_bytes
 * counts with it and sgemm_tiles places with it, so the two cannot
 * disagree.
 */
typedef struct tiles_ws {
	float *ks;         /* sgemm_ksplit's partial products */
	char *pack;        /* thread t's packing buffer at pack + t * pack_bytes */
	size_t pack_bytes;
	int chunks;        /* token chunks (sgemm_ksplit), or 0: tiles */
} tiles_ws;

static size_t tiles_layout(tiles_ws *w, char *base, char transa, char transb, int64_t M, int64_t N,
			   int64_t K, int threads)
{
	size_t off = 0;
	memset(w, 0, sizeof(*w));
	if (M <= 0 || N <= 0 || K <= 0 || transa != 'T' || transb != 'N')
		return 0;
	if ((w->chunks = ksplit_chunks(M, N, K))) {
		w->ks = st_ws_take(base, &off, (size_t)((w->chunks - 1) * M * N) * sizeof(float));
		return off;
	}
	int64_t tm, tn;
	tile_shape(M, N, K >= KSPLIT_MIN_K ? 256 : 512, &tm, &tn);
	w->pack_bytes = st_ws_round((size_t)(K * ((tm < M ? tm : M) + (tn < N ? tn : N))) * sizeof(float));
	w->pack = st_ws_take(base, &off, (size_t)threads * w->pack_bytes);
	return off;
}

/* C (ld ldc) = alpha A^T B + beta C with A (K x M, ld lda) and B (K x N, ld
 * ldb) cut into `chunks` blocks of rows (tokens): chunk 0 into C (with
 * beta), chunk s into partial product s (ks), one sequential sgemm each,
 * spread over the threads; then each element of C adds the partial
 * products 1, 2, ... in that order. Every step depends on the shape only:
 * the same bits at any thread count. */
static int sgemm_ksplit(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
			const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int chunks,
			float *ks)
{
	int64_t kc = cdiv(K, chunks);
	int err = dnnl_success;
#pragma omp parallel for schedule(dynamic)
	for (int c = 0; c < chunks; c++) {
		int64_t k0 = c * kc, k = K - k0 < kc ? K - k0 : kc;
		dnnl_status_t s = dnnl_success;
		if (c == 0) /* K >= KSPLIT_MIN_K: no chunk is empty */
			s = dnnl_sgemm('T', 'N', M, N, k, alpha, A, lda, B, ldb, beta, C, ldc);
		else
			s = dnnl_sgemm('T', 'N', M, N, k, alpha, A + k0 * lda, lda, B + k0 * ldb, ldb,
				       0.0f, ks + (c - 1) * M * N, N);
		if (s != dnnl_success) {
#pragma omp atomic write
			err = (int)s;
		}
	}
	if (err != dnnl_success)
		return sgemm_failed('T', 'N', M, N, K, err);
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < M; i++) {
		float *c = C + i * ldc;
		for (int s = 1; s < chunks; s++) {
			const float *p = ks + ((s - 1) * M + i) * N;
#pragma omp simd
			for (int64_t j = 0; j < N; j++)
				c[j] += p[j];
		}
	}
	return 0;
}

/* The tiles (or token chunks) of one product; w: its scratch, placed. */
static int tiles_run(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
		     int64_t ldc, const tiles_ws *w, int threads)
{
	if (w->chunks)
		return sgemm_ksplit(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, w->chunks, w->ks);
	int packed = w->pack != NULL; /* dW += dy^T x: blocks packed contiguous */
	int64_t TILE_M, TILE_N;
	tile_shape(M, N, transa == 'T' && K >= KSPLIT_MIN_K ? 256 : 512, &TILE_M, &TILE_N);
	int64_t tn = (N + TILE_N - 1) / TILE_N, nt = (M + TILE_M - 1) / TILE_M * tn;
	int err = dnnl_success;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
	for (int64_t t = 0; t < nt; t++) {
		int64_t i0 = t / tn * TILE_M, j0 = t % tn * TILE_N;
		int64_t m = M - i0 < TILE_M ? M - i0 : TILE_M, n = N - j0 < TILE_N ? N - j0 : TILE_N;
		const float *a = transa == 'N' ? A + i0 * lda : A + i0;
		const float *b = transb == 'N' ? B + j0 : B + j0 * ldb;
		int64_t la = lda, lb = ldb;
		if (packed && (m < lda || n < ldb)) {
			float *p = (float *)(w->pack + (size_t)omp_get_thread_num() * w->pack_bytes);
			if (m < lda)
				a = copy_block(p, a, K, m, lda), la = m, p += K * m;
			if (n < ldb)
				b = copy_block(p, b, K, n, ldb), lb = n;
		}
		dnnl_status_t s = dnnl_sgemm(transa, transb, m, n, K, alpha, a, la, b, lb, beta,
					     C + i0 * ldc + j0, ldc);
		if (s != dnnl_success) {
#pragma omp atomic write
			err = (int)s;
		}
	}
	return err == dnnl_success ? 0 : sgemm_failed(transa, transb, M, N, K, err);
}

static int sgemm_tiles(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
		       int64_t ldc, st_kctx *kc)
{
	tiles_ws w;
	int threads = st_ws_threads(&kc->ws);
	size_t need = tiles_layout(&w, NULL, transa, transb, M, N, K, threads);
	if (!need) /* no scratch: every thread, as OpenMP gives them */
		return tiles_run(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &w,
				 omp_get_max_threads());
	int rc = st_ws_check(&kc->ws, need, "st_gemm (tiles)");
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&kc->lock);
	tiles_layout(&w, kc->ws.mem, transa, transb, M, N, K, threads);
	rc = tiles_run(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &w, threads);
	pthread_mutex_unlock(&kc->lock);
	return rc;
}

size_t st_gemm_workspace_bytes(const st_gemm_shape *s, int threads)
{
	if (threads < 1)
		threads = 1;
	if (s->dtype != ST_GEMM_F32)
		return st_amx_workspace_bytes(s->ta, s->tb, s->M, s->N, s->K,
					      s->dtype == ST_GEMM_BF16_OUT, threads);
	if (st_gemm_f32_backend() != ST_GEMM_TILES)
		return 0;
	tiles_ws w;
	return tiles_layout(&w, NULL, s->ta, s->tb, s->M, s->N, s->K, threads);
}

size_t st_gemm_workspace_bytes_list(const st_gemm_shape *s, int64_t n, int threads)
{
	size_t most = 0;
	for (int64_t i = 0; i < n; i++) {
		size_t b = st_gemm_workspace_bytes(&s[i], threads);
		most = b > most ? b : most;
	}
	return most;
}

int st_gemm(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
	    const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
	    int64_t ldc, st_kctx *kc)
{
	int rc = need_ctx(kc, "st_gemm");
	if (rc < 0)
		return rc;
	enum st_gemm_backend be = st_gemm_f32_backend();
	if (be == ST_GEMM_MATMUL)
		return gemm_any(DT_F32, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, kc);
	if (M <= 0 || N <= 0)
		return 0;
	if (K <= 0) { /* sgemm refuses K = 0 */
		scale_only(DT_F32, M, N, beta, C, ldc);
		return 0;
	}
	if (be == ST_GEMM_TILES)
		return sgemm_tiles(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, kc);
	dnnl_status_t s = dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	return s == dnnl_success ? 0 : sgemm_failed(transa, transb, M, N, K, (int)s);
}

int st_gemm_bf16(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		 const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		 float *C, int64_t ldc, st_kctx *kc)
{
	int rc = need_ctx(kc, "st_gemm_bf16");
	if (rc < 0)
		return rc;
	rc = st_amx_gemm_bf16(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 0, kc);
	if (rc)
		return rc < 0 ? rc : 0;
	return gemm_any(DT_BF16, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, kc);
}

int st_gemm_bf16_out(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		     uint16_t *C, int64_t ldc, st_kctx *kc)
{
	int rc = need_ctx(kc, "st_gemm_bf16_out");
	if (rc < 0)
		return rc;
	rc = st_amx_gemm_bf16(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, kc);
	if (rc)
		return rc < 0 ? rc : 0;
	return gemm_any(DT_BF16_OUT, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, kc);
}

/* C (M x N, row stride ldc) = R, laid out the same, over all threads. */
static void copy_rows(float *C, const float *R, int64_t M, int64_t N, int64_t ldc)
{
	if (R == C)
		return;
#pragma omp parallel for schedule(static) if (M * N > (1 << 16))
	for (int64_t i = 0; i < M; i++)
		memcpy(C + i * ldc, R + i * ldc, (size_t)N * sizeof(float));
}

int st_gemm_res(char transa, char transb, int64_t M, int64_t N, int64_t K, const float *A,
		int64_t lda, const float *B, int64_t ldb, const float *R, float *C, int64_t ldc,
		st_kctx *kc)
{
	int rc = need_ctx(kc, "st_gemm_res");
	if (rc < 0)
		return rc;
	copy_rows(C, R, M, N, ldc);
	return st_gemm(transa, transb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc, kc);
}

int st_gemm_bf16_res(char transa, char transb, int64_t M, int64_t N, int64_t K,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, const float *R,
		     float *C, int64_t ldc, st_kctx *kc)
{
	int rc = need_ctx(kc, "st_gemm_bf16_res");
	if (rc < 0)
		return rc;
	rc = st_amx_gemm_bf16_res(transa, transb, M, N, K, A, lda, B, ldb, R, C, ldc, kc);
	if (rc)
		return rc < 0 ? rc : 0;
	copy_rows(C, R, M, N, ldc);
	return gemm_any(DT_BF16, transa, transb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc, kc);
}

const char *st_gemm_impl(enum st_gemm_dtype dtype, char transa, char transb, int64_t M, int64_t N,
			 int64_t K, int64_t lda, int64_t ldb, int64_t ldc, float beta, st_kctx *kc)
{
	gemm_key k = {.dtype = dtype, .threads = omp_get_max_threads(), .ta = transa, .tb = transb,
		      .M = M, .N = N, .K = K,
		      .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = 1.0f, .beta = beta};
	static _Thread_local char impl[sizeof(((st_kprim *)0)->impl)];
	impl[0] = 0;
	if (need_ctx(kc, "st_gemm_impl") < 0)
		return impl;
	pthread_mutex_lock(&kc->lock);
	st_kprim *en;
	if (lookup(kc, &k, &en) == 0)
		memcpy(impl, en->impl, sizeof(impl));
	pthread_mutex_unlock(&kc->lock);
	return impl;
}

void st_gemm_cache_clear(st_kctx *kc)
{
	if (!kc || !kc->ready)
		return;
	pthread_mutex_lock(&kc->lock);
	for (int i = 0; i < kc->nprims; i++)
		destroy_entry(&kc->prims[i]);
	kc->nprims = kc->oldest = 0;
	if (kc->stream)
		dnnl_stream_destroy(kc->stream);
	if (kc->engine)
		dnnl_engine_destroy(kc->engine);
	kc->stream = NULL;
	kc->engine = NULL;
	kc->dnnl_failed = 0;
	pthread_mutex_unlock(&kc->lock);
}
