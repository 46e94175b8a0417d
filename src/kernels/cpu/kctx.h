/*
 * kctx.h - the kernel context: everything the matrix products keep between
 * calls, owned by their caller and passed to every product (gemm.h, amx.h).
 *
 * The products own no memory. What they keep between calls lives in a
 * context the caller owns:
 *  - a table of oneDNN matmul primitives (one per call shape and thread
 *    count, created on first use; ST_KCTX_PRIMS entries, fixed: when it is
 *    full a new shape replaces the oldest entry, whose primitive is
 *    destroyed), with oneDNN's engine and stream;
 *  - the lock that serializes the products run on one context (calls on
 *    different contexts do not wait for each other);
 *  - a workspace (workspace.h) for the products' scratch: the AMX path's
 *    packed block of op(B), its packed op(A) and per-thread strips, and the
 *    fp32 tiles' per-thread packed blocks and K-split partial sums.
 *
 * The caller sizes the workspace from the shapes of the products it will
 * run (st_gemm_workspace_bytes_list, gemm.h), for the CPU it runs on: the
 * AMX buffers only where st_amx_available(), the tiles' only on the TILES
 * back end; zero where a product needs none (oneDNN's sgemm and matmul
 * keep their own scratch). A product given a context too small for its
 * shape writes nothing and returns ST_EINVAL naming the kernel and the
 * bytes it needs (st_ws_check); it never allocates. A product whose shape
 * was not counted, or whose back end was switched after the sizing
 * (st_gemm_set_f32_backend, st_amx_set_enabled), can be refused that way.
 *
 *   st_gemm_shape sh[] = {{ST_GEMM_F32, 'T', 'N', M, N, K}, ...};
 *   st_kctx kc = ST_KCTX_INIT;
 *   rc = st_kctx_init(&kc, st_gemm_workspace_bytes_list(sh, n, omp_get_max_threads()),
 *                     omp_get_max_threads());
 *   rc = st_gemm('T', 'N', M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, &kc);
 *   st_kctx_release(&kc);
 *
 * The model owns one context, sized from its product shapes and placed in
 * its own memory by the layout code `slicetrain plan` counts with
 * (st_kctx_bytes, st_kctx_init_at; model/llama.c). Its per-thread slices
 * follow workspace.h: the products run their regions with per-thread
 * scratch on st_ws_threads(&kc->ws) threads.
 *
 * st_kctx_init, st_kctx_init_at and st_kctx_release live in workspace.c, the
 * one file under src/kernels/ that allocates (tests/cli/kernels_no_alloc).
 */
#ifndef ST_KERNELS_KCTX_H
#define ST_KERNELS_KCTX_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/workspace.h"

/* Entries of a context's primitive table. A model's products take a few
 * dozen distinct call shapes at most (sites, both betas of the weight
 * gradients, the output layer's last chunk): a bf16 step of llama3-125m
 * made 17 primitives on an AVX512_BF16 CPU without AMX. */
#define ST_KCTX_PRIMS 64

struct dnnl_engine;
struct dnnl_stream;
struct dnnl_primitive;
struct dnnl_memory;

/* One cached matmul primitive, by its call (gemm.c's; callers never touch
 * it). */
typedef struct st_kprim_key {
	int dtype;   /* enum st_gemm_dtype */
	int threads; /* oneDNN fixes a primitive's thread partition when it is created */
	char ta, tb;
	int64_t M, N, K, lda, ldb, ldc;
	float alpha, beta;
} st_kprim_key;

typedef struct st_kprim {
	st_kprim_key key;
	struct dnnl_primitive *prim;
	struct dnnl_memory *a, *b, *c; /* data handles set per call */
	char impl[48];
} st_kprim;

typedef struct st_kctx {
	int ready;                   /* initialized (st_kctx_init, st_kctx_init_at) */
	pthread_mutex_t lock;        /* products on this context run one at a time */
	st_kprim *prims;             /* the primitive table: ST_KCTX_PRIMS entries */
	int nprims;                  /* entries in use */
	int oldest;                  /* the entry a new one replaces once the table is full */
	struct dnnl_engine *engine;  /* oneDNN's CPU engine and stream, on first use */
	struct dnnl_stream *stream;
	int dnnl_failed;             /* their creation failed: every matmul call fails */
	st_ws ws;                    /* the products' scratch */
	void *mem;                   /* the block holding the table and ws.mem */
	size_t bytes;
	int owned;                   /* mem is st_kctx_init's (freed by st_kctx_release) */
} st_kctx;

#define ST_KCTX_INIT {0}

/* Bytes of a context whose workspace holds `workspace_bytes`: the primitive
 * table, then the workspace, each rounded up to 64 bytes. */
size_t st_kctx_bytes(size_t workspace_bytes);
/* Allocate a context (st_kctx_bytes(workspace_bytes), zeroed; huge pages
 * from 2 MiB, as the model's buffers) whose workspace is sized for
 * `threads` (>= 1). 0, ST_EINVAL or ST_ENOMEM. */
int st_kctx_init(st_kctx *kc, size_t workspace_bytes, int threads);
/* The same in the caller's memory: mem (64-byte aligned, `bytes` from
 * st_kctx_bytes) holds the table and the workspace; the caller frees it
 * after st_kctx_release. 0 or ST_EINVAL. */
int st_kctx_init_at(st_kctx *kc, void *mem, size_t bytes, int threads);
/* Destroy the cached primitives, the engine and stream (gemm.c's
 * st_gemm_cache_clear), free what st_kctx_init allocated. Safe on
 * ST_KCTX_INIT and twice. */
void st_kctx_release(st_kctx *kc);

#endif
