#include "kernels/cpu/workspace.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

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
