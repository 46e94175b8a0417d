/*
 * workspace.c - the one allocator under src/kernels/: kernel workspaces
 * (workspace.h) and kernel contexts (kctx.h), for callers that do not place
 * them in memory of their own. tests/cli/kernels_no_alloc checks that no
 * other kernel file allocates.
 */
#include "kernels/cpu/workspace.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/pages.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kctx.h"

int st_ws_init(st_ws *ws, size_t bytes, int threads)
{
	memset(ws, 0, sizeof(*ws));
	size_t n = st_ws_round(bytes);
	void *p = aligned_alloc(64, n ? n : 64);
	if (!p)
		return st_fail(ST_ENOMEM, "out of memory for a kernel workspace (%zu bytes)", bytes);
	memset(p, 0, n ? n : 64);
	ws->mem = p;
	ws->bytes = bytes;
	ws->threads = threads;
	return 0;
}

void st_ws_release(st_ws *ws)
{
	free(ws->mem);
	memset(ws, 0, sizeof(*ws));
}

int st_ws_check(const st_ws *ws, size_t need, const char *kernel)
{
	if (!ws || ws->threads < 1 || ws->bytes < need || (need && !ws->mem) ||
	    (uintptr_t)ws->mem % 16)
		return st_fail(ST_EINVAL,
			       "%s: workspace of %zu bytes for %d threads at %p; needs %zu bytes, "
			       "16-byte aligned, for at least 1 thread",
			       kernel, ws ? ws->bytes : 0, ws ? ws->threads : 0, ws ? ws->mem : NULL,
			       need);
	return 0;
}

int st_ws_threads(const st_ws *ws)
{
	int n = omp_get_max_threads();
	if (ws && ws->threads < n)
		n = ws->threads;
	return n < 1 ? 1 : n;
}

/* ---- the kernel context (kctx.h) ---- */

static size_t table_bytes(void) { return st_ws_round(ST_KCTX_PRIMS * sizeof(st_kprim)); }

size_t st_kctx_bytes(size_t workspace_bytes) { return table_bytes() + st_ws_round(workspace_bytes); }

int st_kctx_init_at(st_kctx *kc, void *mem, size_t bytes, int threads)
{
	memset(kc, 0, sizeof(*kc));
	if (!mem || (uintptr_t)mem % 64 || bytes < table_bytes() || threads < 1)
		return st_fail(ST_EINVAL,
			       "kernel context: %zu bytes at %p for %d threads; needs at least %zu bytes, "
			       "64-byte aligned, for at least 1 thread",
			       bytes, mem, threads, table_bytes());
	if (pthread_mutex_init(&kc->lock, NULL) != 0)
		return st_fail(ST_EINTERNAL, "kernel context: cannot create its lock");
	kc->prims = mem;
	memset(kc->prims, 0, table_bytes());
	kc->ws = (st_ws){.mem = (char *)mem + table_bytes(), .bytes = bytes - table_bytes(),
			 .threads = threads};
	kc->mem = mem;
	kc->bytes = bytes;
	kc->ready = 1;
	return 0;
}

int st_kctx_init(st_kctx *kc, size_t workspace_bytes, int threads)
{
	memset(kc, 0, sizeof(*kc));
	size_t n = st_kctx_bytes(workspace_bytes);
	if (threads < 1)
		return st_fail(ST_EINVAL, "kernel context: sized for %d threads (at least 1)", threads);
	/* zeroed; from 2 MiB on in transparent huge pages, as the model's own
	 * buffers (the packed operands of AMX products are read across rows) */
	void *p = st_pages_alloc(n);
	if (!p)
		return st_fail(ST_ENOMEM, "out of memory for a kernel context (%zu bytes)", n);
	int rc = st_kctx_init_at(kc, p, n, threads);
	if (rc < 0) {
		st_pages_free(p, n);
		return rc;
	}
	kc->owned = 1;
	return 0;
}

void st_kctx_release(st_kctx *kc)
{
	if (!kc->ready)
		return;
	st_gemm_cache_clear(kc);
	pthread_mutex_destroy(&kc->lock);
	if (kc->owned)
		st_pages_free(kc->mem, kc->bytes);
	memset(kc, 0, sizeof(*kc));
}
