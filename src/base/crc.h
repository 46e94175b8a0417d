/*
 * crc.h - CRC-32 checksums: zlib's (checkpoints, state sync) and
 * Castagnoli's (TFRecord framing of TensorBoard event files).
 *
 * The gzip/zlib polynomial (IEEE 802.3, reflected), with zlib's values:
 * st_crc32(0, buf, n) equals zlib's crc32(0, buf, n) and Python's
 * zlib.crc32(buf). Computed by Intel's ISA-L (carry-less multiplies,
 * 512-bit where the CPU has VPCLMULQDQ; figures in docs/checkpoint-costs.md).
 * Chain calls to checksum data in parts:
 *
 *   uint32_t c = st_crc32(0, a, na);
 *   c = st_crc32(c, b, nb);              // == st_crc32(0, a ++ b, na + nb)
 *
 * Thread-safe; no allocation.
 */
#ifndef ST_BASE_CRC_H
#define ST_BASE_CRC_H

#include <stddef.h>
#include <stdint.h>

uint32_t st_crc32(uint32_t crc, const void *data, size_t n);

/*
 * The CRC-32 of a ++ b from crc_a = st_crc32(0, a, na), crc_b =
 * st_crc32(0, b, nb) and nb alone, so that parts checksummed separately (on
 * several threads) give the checksum of the whole. zlib's crc32_combine64.
 */
uint32_t st_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t nb);

/*
 * The same for many parts of one length nb, faster: op = st_crc32_combine_gen(nb)
 * once, then st_crc32_combine_op(crc_a, crc_b, op) == st_crc32_combine(crc_a,
 * crc_b, nb). zlib's crc32_combine_gen64 and crc32_combine_op.
 */
uint32_t st_crc32_combine_gen(uint64_t nb);
uint32_t st_crc32_combine_op(uint32_t crc_a, uint32_t crc_b, uint32_t op);

/*
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * TFRecord files and iSCSI: st_crc32c(0, "123456789", 9) == 0xE3069283.
 * Chained like st_crc32. ISA-L's too.
 */
uint32_t st_crc32c(uint32_t crc, const void *data, size_t n);

#endif
