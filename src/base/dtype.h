/*
 * dtype.h - element types: one enum for every module that names one.
 *
 * Safetensors files and checkpoints (the element type of stored tensors),
 * token files (llm.c .bin and .npy token ids) and the config's compute dtype
 * (MaxText's `dtype: bfloat16`, `weight_dtype: float32`) all use enum
 * st_dtype. The config accepts only ST_DTYPE_F32 and ST_DTYPE_BF16; a file
 * may hold any of them. 0 (ST_DTYPE_INVALID) is never a valid element type,
 * so a zeroed field or a failed parse is recognisable.
 *
 * Each module keeps the spelling its own format uses: st_dtype_name gives
 * the safetensors name ("F32", "BF16"), st_dtype_numpy_name numpy's
 * ("float32", "uint16"), and the config's key table MaxText's ("bfloat16").
 *
 *   enum st_dtype t = st_dtype_parse("BF16");    // ST_DTYPE_BF16
 *   size_t bytes = numel * st_dtype_size(t);     // 2 per element
 */
#ifndef ST_BASE_DTYPE_H
#define ST_BASE_DTYPE_H

#include <stddef.h>

enum st_dtype {
	ST_DTYPE_INVALID = 0,
	ST_DTYPE_BOOL,    /* "BOOL", 1 byte */
	ST_DTYPE_U8,      /* "U8" */
	ST_DTYPE_I8,      /* "I8" */
	ST_DTYPE_F8_E4M3, /* "F8_E4M3" */
	ST_DTYPE_F8_E5M2, /* "F8_E5M2" */
	ST_DTYPE_U16,     /* "U16" */
	ST_DTYPE_I16,     /* "I16" */
	ST_DTYPE_F16,     /* "F16" */
	ST_DTYPE_BF16,    /* "BF16" */
	ST_DTYPE_U32,     /* "U32" */
	ST_DTYPE_I32,     /* "I32" */
	ST_DTYPE_F32,     /* "F32" */
	ST_DTYPE_U64,     /* "U64" */
	ST_DTYPE_I64,     /* "I64" */
	ST_DTYPE_F64,     /* "F64" */
};

/* The safetensors name: "F32" for ST_DTYPE_F32, ...; NULL for an invalid value. */
const char *st_dtype_name(enum st_dtype t);
/* numpy's name: "float32", "uint16", ...; NULL for an invalid value or a
 * type numpy does not have ("F8_E4M3", "BF16"). */
const char *st_dtype_numpy_name(enum st_dtype t);
/* Bytes per element; 0 for an invalid value. */
size_t st_dtype_size(enum st_dtype t);
/* The dtype with safetensors name s ("BF16" -> ST_DTYPE_BF16), or
 * ST_DTYPE_INVALID if unknown (names are case-sensitive). */
enum st_dtype st_dtype_parse(const char *s);

#endif
