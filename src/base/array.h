/*
 * array.h - growing arrays: the one doubling-realloc step that manifests,
 * config layers and YAML nodes use to append to a malloc'd array.
 *
 *   struct entry *v = NULL;
 *   size_t n = 0, cap = 0;
 *   ...
 *   if ((rc = st_array_reserve(&v, &cap, n, sizeof(*v), 16)) < 0) return rc;
 *   v[n++] = e;
 *
 * pv points at the caller's array pointer (any T **; it is read and written
 * as a void * through memcpy). When n >= *cap the array is reallocated to
 * max(2 * *cap, first, n + 1) elements; the new tail is uninitialized.
 * Returns 0, or ST_ENOMEM "out of memory" with the array and *cap unchanged
 * (still owned by the caller). free() releases the array as usual.
 */
#ifndef ST_BASE_ARRAY_H
#define ST_BASE_ARRAY_H

#include <stddef.h>

int st_array_reserve(void *pv, size_t *cap, size_t n, size_t elsize, size_t first);

#endif
