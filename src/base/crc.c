#include "base/crc.h"

#include <libdeflate.h>
#include <pthread.h>

uint32_t st_crc32(uint32_t crc, const void *data, size_t n) { return libdeflate_crc32(crc, data, n); }

/*
 * Combining: st_crc32 of a ++ b is crc_a times x^(8 nb), modulo the
 * polynomial, plus crc_b (the pre- and post-inversions cancel out). In the
 * reflected representation bit 31 is x^0, and the polynomial without its x^32
 * term is 0xEDB88320.
 */
#define CRC32_POLY 0xEDB88320u

/* a * b modulo the polynomial */
static uint32_t crc32_mulmod(uint32_t a, uint32_t b)
{
	uint32_t product = 0;
	for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
		if (a & bit)
			product ^= b;
		b = b & 1 ? (b >> 1) ^ CRC32_POLY : b >> 1; /* b * x */
	}
	return product;
}

uint32_t st_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t nb)
{
	uint32_t power = 1u << 31, square = 1u << 23; /* x^0; x^8, one byte */
	for (; nb; nb >>= 1) {
		if (nb & 1)
			power = crc32_mulmod(power, square);
		square = crc32_mulmod(square, square);
	}
	return crc32_mulmod(power, crc_a) ^ crc_b;
}

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
