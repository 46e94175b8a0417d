#include "base/crc.h"

#include <libdeflate.h>
#include <pthread.h>

uint32_t st_crc32(uint32_t crc, const void *data, size_t n) { return libdeflate_crc32(crc, data, n); }

/* libdeflate and zlib only have the gzip polynomial; Castagnoli's is ours. */
static uint32_t crc32c_table[256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc32c_table[i] = c;
	}
}

uint32_t st_crc32c(uint32_t crc, const void *data, size_t n)
{
	const unsigned char *p = data;
	pthread_once(&crc32c_once, crc32c_init);
	crc = ~crc;
	for (size_t i = 0; i < n; i++)
		crc = crc32c_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
	return ~crc;
}
