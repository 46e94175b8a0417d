#include "base/progress.h"

#include "base/clock.h"
#include "base/err.h"

void st_progress_init(st_progress *p, const char *what, int64_t total_bytes)
{
	p->what = what;
	p->t0 = p->last = st_mono_s();
	p->total = total_bytes;
	p->done = 0;
	p->printed = 0;
}

static void progress_line(const st_progress *p, double now)
{
	double secs = now - p->t0;
	st_info("%s: %.2f of %.2f GB (%.0f%%), %.0f MB/s", p->what, (double)p->done / 1e9, (double)p->total / 1e9,
		p->total > 0 ? 100.0 * (double)p->done / (double)p->total : 100.0,
		secs > 0 ? (double)p->done / 1e6 / secs : 0.0);
}

void st_progress_add(st_progress *p, int64_t bytes)
{
	if (!p)
		return;
	p->done += bytes;
	double now = st_mono_s();
	if (now - p->t0 >= 3.0 && now - p->last >= (p->printed ? 5.0 : 3.0)) {
		progress_line(p, now);
		p->last = now;
		p->printed = 1;
	}
}

void st_progress_end(st_progress *p)
{
	if (p && p->printed)
		progress_line(p, st_mono_s());
}
