/*
 * tokfile.h - one memory-mapped token file (read by src/data/data.c), and
 * the writer of llm.c .bin shards (slicetrain tokenize).
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
#include "base/file.h"

/* llm.c .bin: 256 int32 header words, then the tokens */
#define ST_TOKFILE_BIN_HEADER_BYTES 1024
#define ST_TOKFILE_BIN_MAGIC_U16 20240520
#define ST_TOKFILE_BIN_VERSION_U16 1
#define ST_TOKFILE_BIN_MAGIC_U32 20240801
#define ST_TOKFILE_BIN_VERSION_U32 7
#define ST_TOKFILE_BIN_MAX_TOKENS INT32_MAX /* header[2] is an int32 */


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

/*
 * Writing one llm.c .bin shard, atomically (base/file.h): the tokens go to
 * "<path>.tmp.<pid>", commit writes the header's count, fsyncs and renames;
 * abort (also after any error, and safe on ST_TOKFILE_WRITER_INIT) removes
 * the temporary, so no file ever appears under path half written.
 *
 *   st_tokfile_writer w = ST_TOKFILE_WRITER_INIT;
 *   rc = st_tokfile_writer_open(&w, "train.bin", vocab_size);  // uint16 ids up to 65536, else uint32
 *   while (rc == 0 && more) rc = st_tokfile_writer_put(&w, ids, n);
 *   rc = rc == 0 ? st_tokfile_writer_commit(&w) : (st_tokfile_writer_abort(&w), rc);
 *
 * put refuses (ST_EINVAL) an id outside [0, vocab_size) and more than
 * ST_TOKFILE_BIN_MAX_TOKENS tokens in all; I/O errors are ST_EIO.
 */
typedef struct st_tokfile_writer {
	st_atomic_file file;
	int64_t vocab_size;
	int itemsize;       /* 2 or 4 */
	int64_t ntokens;
	unsigned char *buf; /* tokens waiting to be written */
	size_t nbuf;
} st_tokfile_writer;
#define ST_TOKFILE_WRITER_INIT { .file = ST_ATOMIC_FILE_INIT }

int st_tokfile_writer_open(st_tokfile_writer *w, const char *path, int64_t vocab_size);
int st_tokfile_writer_put(st_tokfile_writer *w, const int32_t *ids, size_t n);
int st_tokfile_writer_commit(st_tokfile_writer *w);
void st_tokfile_writer_abort(st_tokfile_writer *w);

#endif
