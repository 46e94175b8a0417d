#include "base/err.h"
#include "base/status.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

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

int st_wrap(int code, const char *fmt, ...)
{
	int saved = errno;
	char inner[sizeof(errbuf)];
	memcpy(inner, errbuf, sizeof(inner));
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n + 2 < sizeof(errbuf)) {
		memcpy(errbuf + n, ": ", 2);
		size_t room = sizeof(errbuf) - (size_t)n - 2, len = strnlen(inner, room - 1);
		memcpy(errbuf + n + 2, inner, len);
		errbuf[n + 2 + len] = 0;
	}
	errno = saved;
	return code;
}

int st_exit_status(int code)
{
	if (code == ST_OK)
		return ST_EXIT_OK;
	if (code == ST_EINVAL)
		return ST_EXIT_BAD_INPUT;
	return code == ST_EPEER ? ST_EXIT_PEER : ST_EXIT_ERROR;
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
