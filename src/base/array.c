#include "base/array.h"

#include "base/err.h"

#include <stdint.h>
#include <string.h>

int st_array_reserve(void *pv, size_t *cap, size_t n, size_t elsize, size_t first)
{
	void *v, *nv;
	if (n < *cap)
		return 0;
	size_t ncap = *cap > SIZE_MAX / 2 ? SIZE_MAX : 2 * *cap;
	if (ncap < first)
		ncap = first;
	if (ncap <= n)
		ncap = n + 1;
	if (elsize && ncap > SIZE_MAX / elsize)
		return st_fail(ST_ENOMEM, "out of memory");
	memcpy(&v, pv, sizeof(v));
	if (!(nv = realloc(v, ncap * elsize)))
		return st_fail(ST_ENOMEM, "out of memory");
	memcpy(pv, &nv, sizeof(nv));
	*cap = ncap;
	return 0;
}
