#include "base/crc.h"

#include <libdeflate.h>

uint32_t st_crc32(uint32_t crc, const void *data, size_t n) { return libdeflate_crc32(crc, data, n); }
