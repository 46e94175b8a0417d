/*
 * tokfile.h - one memory-mapped token file (internal to src/data/).
 *
 * Reads llm.c .bin shards and .npy integer arrays, told apart by magic bytes
 * (never by extension). Opening checks the header and that the file size is
 * exactly what the header announces; st_tokfile_check_ids() then scans every
 * token id once. The mapping stays until st_tokfile_release().
 *
 *   st_tokfile f = ST_TOKFILE_INIT;
 *   rc = st_tokfile_open(&f, "shard_000.bin");
 *   if (rc == 0) rc = st_tokfile_check_ids(&f, vocab_size);
 *   st_tokfile_get(&f, start, n, out);      // out: n int32 ids
 *   st_tokfile_release(&f);                 // safe on ST_TOKFILE_INIT and after a failed open
 *
 * Errors (ST_EINVAL unless noted; the message starts with the path): cannot
 * open, directory or not a regular file, empty, bad magic, truncated header,
 * unsupported version or dtype, malformed .npy header, size not matching the
 * header (truncated or extra bytes), id out of range. mmap failure is ST_EIO,
 * allocation failure ST_ENOMEM.
 *
 * Formats:
 *   llm.c .bin: 256 little-endian int32 header words (1024 bytes), then the
 *     tokens. header[0] magic, header[1] version, header[2] token count.
 *     magic 20240520 version 1: uint16 tokens (GPT-2 shards);
 *     magic 20240801 version 7: uint32 tokens (Llama 3 shards).
 *   .npy 1.0 / 2.0 / 3.0: "\x93NUMPY", major, minor, header length (uint16
 *     for 1.0, uint32 after), a Python-literal dict with exactly 'descr',
 *     'fortran_order' and 'shape', then the C-order data. dtypes |u1 |i1
 *     <u2 <i2 <u4 <i4 <u8 <i8; shape 1-D or 2-D.
 */
#ifndef ST_DATA_TOKFILE_H
#define ST_DATA_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"


typedef struct st_tokfile {
	char *path;                   /* owned copy, used in messages */
	void *map;                    /* whole file, PROT_READ */
	size_t maplen;
	const unsigned char *data;    /* first token inside map */
	enum st_dtype dtype;          /* ST_DTYPE_U8 .. ST_DTYPE_I64 */
	int itemsize;                 /* bytes per token */
	int64_t ntokens;              /* all elements of the array / shard */
	int ndim;                     /* 1 (.bin and 1-D .npy) or 2 */
	int64_t rows, cols;           /* ndim == 2: shape; ndim == 1: rows 1, cols ntokens */
	const char *format;           /* "llm.c .bin", ".npy" */
} st_tokfile;

#define ST_TOKFILE_INIT { 0 }

int st_tokfile_open(st_tokfile *f, const char *path);
/* Every id in 0 <= id < vocab_size, else ST_EINVAL naming the first bad one. */
int st_tokfile_check_ids(const st_tokfile *f, int64_t vocab_size);
/* Copy ids start..start+n-1 (within ntokens, already checked) as int32. */
void st_tokfile_get(const st_tokfile *f, int64_t start, int64_t n, int32_t *out);
void st_tokfile_release(st_tokfile *f);

#endif
