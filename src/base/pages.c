#include "base/pages.h"

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

void *st_pages_alloc(size_t bytes)
{
	if (bytes == 0)
		bytes = 1;
#ifdef PAGES_VIA_MALLOC
	void *p;
	if (posix_memalign(&p, ST_PAGES_ALIGN, bytes) != 0)
		return NULL;
	return memset(p, 0, bytes);
#else
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
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
