#include "base/err.h"

#include <errno.h>
#include <stdarg.h>

static _Thread_local char errbuf[1024];

int st_fail(int code, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	errno = saved;
	return code;
}

const char *st_errmsg(void) { return errbuf; }

int st_exit_status(int code)
{
	if (code == ST_OK)
		return 0;
	if (code == ST_EINVAL)
		return 2;
	return code == ST_EPEER ? 3 : 1;
}

static int quiet;

void st_log_quiet(int q) { quiet = q; }

static void vlog(const char *prefix, const char *fmt, va_list ap)
{
	if (quiet)
		return;
	int saved = errno;
	char line[2048];
	vsnprintf(line, sizeof(line), fmt, ap);
	fprintf(stderr, "slicetrain: %s%s\n", prefix, line);
	errno = saved;
}

void st_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("warning: ", fmt, ap);
	va_end(ap);
}

void st_info(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog("", fmt, ap);
	va_end(ap);
}
