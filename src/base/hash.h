/*
 * hash.h - FNV-1a, 64 bits: a fast, stable hash of bytes for keys that every
 * process must compute identically (communicator keys). Not for security:
 * anything an attacker can choose needs a keyed MAC instead.
 */
#ifndef ST_BASE_HASH_H
#define ST_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define ST_FNV_INIT 0xcbf29ce484222325ull

/* Continue hash h over p[0..n); start with ST_FNV_INIT. */
static inline uint64_t st_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

#endif
