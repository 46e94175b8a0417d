#include "base/dtype.h"

#include <string.h>

static const struct {
	const char *name, *numpy;
	size_t size;
} dtypes[] = {
	[ST_DTYPE_BOOL] = {"BOOL", "bool", 1},
	[ST_DTYPE_U8] = {"U8", "uint8", 1},
	[ST_DTYPE_I8] = {"I8", "int8", 1},
	[ST_DTYPE_F8_E4M3] = {"F8_E4M3", NULL, 1},
	[ST_DTYPE_F8_E5M2] = {"F8_E5M2", NULL, 1},
	[ST_DTYPE_U16] = {"U16", "uint16", 2},
	[ST_DTYPE_I16] = {"I16", "int16", 2},
	[ST_DTYPE_F16] = {"F16", "float16", 2},
	[ST_DTYPE_BF16] = {"BF16", NULL, 2},
	[ST_DTYPE_U32] = {"U32", "uint32", 4},
	[ST_DTYPE_I32] = {"I32", "int32", 4},
	[ST_DTYPE_F32] = {"F32", "float32", 4},
	[ST_DTYPE_U64] = {"U64", "uint64", 8},
	[ST_DTYPE_I64] = {"I64", "int64", 8},
	[ST_DTYPE_F64] = {"F64", "float64", 8},
};
#define NDTYPES ((int)(sizeof(dtypes) / sizeof(dtypes[0])))

static int valid(enum st_dtype t) { return (int)t > 0 && (int)t < NDTYPES; }

const char *st_dtype_name(enum st_dtype t) { return valid(t) ? dtypes[t].name : NULL; }

const char *st_dtype_numpy_name(enum st_dtype t) { return valid(t) ? dtypes[t].numpy : NULL; }

size_t st_dtype_size(enum st_dtype t) { return valid(t) ? dtypes[t].size : 0; }

enum st_dtype st_dtype_parse(const char *s)
{
	for (int i = 1; i < NDTYPES; i++)
		if (strcmp(s, dtypes[i].name) == 0)
			return (enum st_dtype)i;
	return ST_DTYPE_INVALID;
}
