/*
 * safetensors.h - read and write Hugging Face safetensors files.
 *
 * Layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian
 * u64 N, then N bytes of JSON header, then the data buffer.
 *
 *   {"__metadata__": {"key": "value", ...},                   (optional, strings only)
 *    "model.norm.weight": {"dtype": "F32", "shape": [4096], "data_offsets": [0, 16384]},
 *    ...}
 *
 * data_offsets are [begin, end) relative to the start of the buffer; the
 * tensors tile the buffer exactly (no gaps, no overlap); data is row-major and
 * little-endian. Tensor names are unique and may be any string except
 * "__metadata__".
 *
 * Writing (atomically, through base/file: temp, fsync, rename, fsync dir):
 *
 *   st_safetensors_tensor t[] = {
 *       {"model.norm.weight", ST_DTYPE_F32, 1, {E}, norm_w},
 *       {"lm_head.weight", ST_DTYPE_F32, 2, {V, E}, head_w},
 *   };
 *   const char *keys[] = {"format"}, *vals[] = {"pt"};
 *   rc = st_safetensors_write("model.safetensors", 2, t, 1, keys, vals);
 *
 * The header is compact JSON with "__metadata__" first (omitted when nmeta is
 * 0), then the tensors in the order given, padded with spaces to a multiple
 * of 8 bytes; the data follows in the same order with no padding. A tensor's
 * data is therefore aligned to its element size within the file only if the
 * tensors before it keep it so: pass tensors sorted by decreasing element
 * size (as Hugging Face does) when readers need aligned data.
 *
 * Reading (the file is mmapped read-only; everything is validated up front):
 *
 *   st_safetensors *f;
 *   if ((rc = st_safetensors_open(&f, path)) < 0) return rc;
 *   const st_safetensors_info *w = st_safetensors_find(f, "lm_head.weight");
 *   rc = st_safetensors_read_f32(f, "model.norm.weight", norm_w, E);
 *   const char *step = st_safetensors_meta(f, "step");
 *   st_safetensors_close(f);
 *
 * Info pointers, names, data pointers and metadata strings stay valid until
 * st_safetensors_close. Data pointers may be unaligned (see above): copy with
 * memcpy, or use st_safetensors_read_f32, unless the writer is known to align.
 *
 * Errors: a file that breaks the format gives ST_EINVAL with
 * "PATH: what is wrong"; I/O failures give ST_EIO; bad writer arguments give
 * ST_EINVAL naming the tensor. Only little-endian hosts are supported.
 */
#ifndef ST_CKPT_SAFETENSORS_H
#define ST_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define ST_SAFETENSORS_MAX_DIMS 8

/* Element types: base/dtype.h (the names in files are st_dtype_name's). */

/* A tensor to write. data holds numel * element size bytes (may be NULL when empty). */
typedef struct st_safetensors_tensor {
	const char *name;
	enum st_dtype dtype;
	int ndim;                        /* 0 (scalar) .. ST_SAFETENSORS_MAX_DIMS */
	int64_t shape[ST_SAFETENSORS_MAX_DIMS];
	const void *data;
} st_safetensors_tensor;

/*
 * Write n tensors and nmeta metadata pairs (meta_keys[i] -> meta_vals[i]) to
 * path, atomically. Names and metadata must be valid UTF-8; tensor names must
 * be unique and not "__metadata__"; metadata keys must be unique.
 */
int st_safetensors_write(const char *path, int n, const st_safetensors_tensor *t, int nmeta,
			 const char **meta_keys, const char **meta_vals);

/*
 * The bytes st_safetensors_write would put before the data: the 8-byte
 * length, the JSON header and its padding (*len is a multiple of 8). The
 * data of tensor i then starts at *len plus the sizes of tensors 0..i-1, in
 * the order given; t[i].data is not read. For writers that stream the data
 * themselves (the checkpoint writer checksums it on the way). Same checks
 * and errors as st_safetensors_write; *out is malloc'd.
 */
int st_safetensors_header(const char *path, int n, const st_safetensors_tensor *t, int nmeta, const char **meta_keys,
			  const char **meta_vals, char **out, size_t *len);

/* One tensor of an open file. */
typedef struct st_safetensors_info {
	const char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_SAFETENSORS_MAX_DIMS];
	int64_t numel;                   /* product of shape (1 for a scalar) */
	const void *data;                /* into the mapping; possibly unaligned */
	size_t nbytes;                   /* numel * element size */
	uint64_t offset;                 /* begin of data_offsets */
} st_safetensors_info;

typedef struct st_safetensors st_safetensors;

/* Map and validate path; on success *out owns the mapping (close it). */
int st_safetensors_open(st_safetensors **out, const char *path);
/* Unmap and free; NULL is fine. */
void st_safetensors_close(st_safetensors *f);

/* The path the file was opened with. */
const char *st_safetensors_path(const st_safetensors *f);
/* Number of tensors. */
int st_safetensors_count(const st_safetensors *f);
/* Tensor i, 0 <= i < count, in header order. */
const st_safetensors_info *st_safetensors_get(const st_safetensors *f, int i);
/* Tensor by name, or NULL (no error recorded). */
const st_safetensors_info *st_safetensors_find(const st_safetensors *f, const char *name);

/* Metadata value for key, or NULL. */
const char *st_safetensors_meta(const st_safetensors *f, const char *key);
/* Number of metadata pairs and the i-th key, in header order. */
int st_safetensors_meta_count(const st_safetensors *f);
const char *st_safetensors_meta_key(const st_safetensors *f, int i);

/*
 * Copy tensor `name` into dst as float, converting from F32, BF16, F16 or F64.
 * ST_EINVAL if there is no such tensor, its dtype is not floating point, or
 * it does not hold exactly n elements.
 */
int st_safetensors_read_f32(const st_safetensors *f, const char *name, float *dst, int64_t n);

#endif
