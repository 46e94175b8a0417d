#include "base/crc.h"

#include <isa-l/crc.h>
#include <limits.h>
#include <zlib.h>

/* ISA-L picks its kernel for this CPU when first called (carry-less
 * multiplies on 512-bit vectors where the CPU has VPCLMULQDQ). */

uint32_t st_crc32(uint32_t crc, const void *data, size_t n)
{
	return crc32_gzip_refl(crc, data, n);
}

uint32_t st_crc32c(uint32_t crc, const void *data, size_t n)
{
	const unsigned char *p = data;
	crc = ~crc; /* ISA-L's iSCSI CRC takes and gives the value before the final inversion */
	while (n > 0) {
		int len = n > INT_MAX ? INT_MAX : (int)n;
		crc = crc32_iscsi((unsigned char *)p, len, crc);
		p += len;
		n -= (size_t)len;
	}
	return ~crc;
}

uint32_t st_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t nb)
{
	return (uint32_t)crc32_combine64(crc_a, crc_b, (z_off64_t)nb);
}

uint32_t st_crc32_combine_gen(uint64_t nb) { return (uint32_t)crc32_combine_gen64((z_off64_t)nb); }

uint32_t st_crc32_combine_op(uint32_t crc_a, uint32_t crc_b, uint32_t op)
{
	return (uint32_t)crc32_combine_op(crc_a, crc_b, op);
}
