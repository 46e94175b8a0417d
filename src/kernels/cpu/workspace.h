/*
 * workspace.h - scratch memory a kernel borrows from its caller.
 *
 * Kernels never allocate and never fail for lack of memory. A kernel that
 * needs scratch says how much through its ..._workspace_bytes(shape,
 * threads) function (ops.h) and takes an st_ws. The caller allocates once,
 * before the calls (the model at st_llama_alloc_acts, counted by the same
 * layout code that `slicetrain plan` uses; tests and benchmarks with
 * st_ws_init), and passes the same workspace to every call. Kernels run one
 * at a time, so one block sized for the largest of them serves them all.
 *
 * Per-thread slices: a kernel whose OpenMP threads each need their own
 * scratch (attention's tiles) sizes one slice per thread of `threads`, and
 * runs those parallel regions on st_ws_threads(ws) threads: OpenMP's current
 * choice, never more than the workspace was sized for. Results do not depend
 * on the thread count (fixed work partitions), so this changes no bit.
 *
 *   st_ws ws = ST_WS_INIT;
 *   rc = st_ws_init(&ws, st_attention_workspace_bytes(B, T, H, K, D, omp_get_max_threads()),
 *                   omp_get_max_threads());
 *   rc = st_attention_forward(out, lse, q, k, v, B, T, H, K, D, &ws);
 *   st_ws_release(&ws);
 *
 * A kernel given a workspace too small for its shape (or not 16-byte
 * aligned, or sized for no thread) writes nothing and returns ST_EINVAL with
 * a message naming the kernel and the bytes it needs.
 *
 * The matrix products (gemm.h, amx.h) take a kernel context instead
 * (kctx.h): their scratch is an st_ws inside it, laid out and checked by
 * these same rules, next to what they keep between calls (oneDNN
 * primitives). This file's st_ws_init and kctx.h's st_kctx_init are the
 * only allocations under src/kernels/ (workspace.c;
 * tests/cli/kernels_no_alloc).
 */
#ifndef ST_KERNELS_WORKSPACE_H
#define ST_KERNELS_WORKSPACE_H

#include <stddef.h>

typedef struct st_ws {
	void *mem;    /* 16-byte aligned at least; 64 (st_ws_init, the model) is best */
	size_t bytes;
	int threads;  /* OpenMP threads the per-thread slices were sized for (>= 1) */
} st_ws;

#define ST_WS_INIT {0}

/* For callers: allocate `bytes` (64-byte aligned, zeroed) sized for
 * `threads`. 0 or ST_ENOMEM. */
int st_ws_init(st_ws *ws, size_t bytes, int threads);
/* Free what st_ws_init allocated; safe on ST_WS_INIT. */
void st_ws_release(st_ws *ws);

/* For kernels: 0 when ws can hold `need` bytes, else ST_EINVAL naming
 * `kernel`. */
int st_ws_check(const st_ws *ws, size_t need, const char *kernel);
/* Threads for a region with per-thread slices: min(ws->threads,
 * omp_get_max_threads()), at least 1 (also for a NULL or unsized ws, which
 * st_ws_check then refuses). A kernel lays out its slices for this count. */
int st_ws_threads(const st_ws *ws);

/*
 * Lay out a workspace piece by piece, in 64-byte steps: returns base + *off
 * (NULL when base is NULL: counting only) and advances *off. Each kernel has
 * one layout function that both counts (its ..._workspace_bytes) and places
 * (its call), so the two cannot disagree.
 */
static inline size_t st_ws_round(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static inline void *st_ws_take(char *base, size_t *off, size_t bytes)
{
	void *p = base ? base + *off : NULL;
	*off += st_ws_round(bytes);
	return p;
}

#endif
