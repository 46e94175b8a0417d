#include "base/pages.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define PAGES_VIA_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAGES_VIA_MALLOC 1
#endif
#endif

#define HUGE ((size_t)2 << 20) /* x86-64's transparent huge page */

#ifndef PAGES_VIA_MALLOC
static void *map(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}
#endif

void *st_pages_alloc(size_t bytes)
{
	if (bytes == 0)
		bytes = 1;
#ifdef PAGES_VIA_MALLOC
	void *p; /* whole pages, as mmap gives (st_comm_share replaces them) */
	bytes = (bytes + ST_PAGES_ALIGN - 1) / ST_PAGES_ALIGN * ST_PAGES_ALIGN;
	if (posix_memalign(&p, ST_PAGES_ALIGN, bytes) != 0)
		return NULL;
	return memset(p, 0, bytes);
#else
	if (bytes < HUGE)
		return map(bytes);
	/* on a 2 MiB boundary: map 2 MiB more, unmap what lies outside */
	size_t len = (bytes + ST_PAGES_ALIGN - 1) / ST_PAGES_ALIGN * ST_PAGES_ALIGN;
	char *m = map(len + HUGE);
	if (!m)
		return NULL;
	char *p = (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
	if (p > m)
		munmap(m, (size_t)(p - m));
	munmap(p + len, (size_t)(m + HUGE - p));
	(void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused where THP is off */
	return p;
#endif
}

void st_pages_free(void *p, size_t bytes)
{
	if (!p)
		return;
#ifdef PAGES_VIA_MALLOC
	(void)bytes;
	free(p);
#else
	munmap(p, bytes ? bytes : 1);
#endif
}
