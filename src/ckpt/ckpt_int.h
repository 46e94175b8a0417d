/*
 * ckpt_int.h - internals shared by the checkpoint modules: the manifest and
 * done-record model (manifest.c), the piece reader (read.c), small helpers.
 * Not a public API; the format is described in docs/checkpoints.md.
 */
#ifndef ST_CKPT_CKPT_INT_H
#define ST_CKPT_CKPT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/crc.h"
#include "base/file.h"
#include "base/path.h"
#include "base/progress.h"

#include "ckpt/ckpt.h"

#define CK_MANIFEST "manifest.json"
#define CK_FORMAT "slicetrain.checkpoint"
#define CK_DONE_FORMAT "slicetrain.done"
#define CK_VERSION 1
#define CK_CHECKSUM "crc32" /* zlib's CRC-32 (IEEE), of each piece's little-endian F32 bytes */

/* A box of a 1-D or 2-D tensor. A 1-D box uses index 0 only. */
struct ck_box {
	int ndim;
	int64_t offset[2], shape[2];
};

struct ck_piece {
	int file;              /* index into the manifest's files */
	char *key;             /* tensor name inside the shard */
	struct ck_box box;
	uint64_t data_offset;  /* absolute byte offset in the file */
	uint64_t nbytes;       /* numel * 4 */
	uint32_t crc;
};

struct ck_tensor {
	char *name;
	int ndim;
	int64_t shape[2];
	int npieces;
	size_t cap;
	struct ck_piece *pieces;
};

struct ck_file {
	char *name;  /* plain file name inside the step directory */
	int process;
	int64_t bytes;
};

/* A manifest, or a done record (then: one file, this process's pieces, no config). */
struct ck_manifest {
	int is_done;
	int64_t step, next_sample, data_shuffle_seed, init_weights_seed, global_batch;
	int process, process_count;  /* process: done records only */
	uint64_t save_id;
	int64_t generation;          /* the saving group's elastic generation; -1: none (an optional field) */
	char mesh[256];
	double time_unix;
	char *config_json;           /* compact JSON object text (manifest only) */
	int nfiles;
	size_t cap_files;
	struct ck_file *files;
	int ntensors;
	size_t cap_tensors;
	struct ck_tensor *tensors;
};

void ck_manifest_free(struct ck_manifest *m);
struct ck_tensor *ck_manifest_find(const struct ck_manifest *m, const char *name);

/*
 * Parse and validate a manifest (want_done 0) or done record (want_done 1)
 * from text; `where` names it in messages. expect_step < 0: any. Checks
 * every field, that boxes lie inside their tensors, sizes, known files,
 * checksums' range and, for a manifest, that each tensor's pieces tile it.
 * ST_EINVAL "WHERE: what is wrong".
 */
int ck_manifest_parse(struct ck_manifest *m, const char *where, const char *text, int want_done,
		      int64_t expect_step);
/* Read STEP_DIR/manifest.json and parse it (ST_EIO if unreadable, ST_EINVAL if bad). */
int ck_manifest_load(struct ck_manifest *m, const char *step_dir, int64_t expect_step);
/* Serialize (indented JSON, malloc'd). */
int ck_manifest_dump(const struct ck_manifest *m, char **out);
/* Each tensor's pieces tile it exactly (no gap, no overlap). */
int ck_manifest_check_tiling(const struct ck_manifest *m, const char *where);
/* Append a done record's file and pieces to m (tensors matched by name, shapes must agree). */
int ck_manifest_merge(struct ck_manifest *m, const struct ck_manifest *done, const char *where);
/* Add a file / a tensor / a piece (copies strings). Return the index or a negative error. */
int ck_manifest_add_file(struct ck_manifest *m, const char *name, int process, int64_t bytes);
int ck_manifest_add_tensor(struct ck_manifest *m, const char *name, int ndim, const int64_t *shape);
int ck_tensor_add_piece(struct ck_tensor *t, const struct ck_piece *p);

/* Volume of a box; intersection of two boxes (0 if empty). */
int64_t ck_box_numel(const struct ck_box *b);
int ck_box_intersect(const struct ck_box *a, const struct ck_box *b, struct ck_box *out);
/* "[r0:r1,c0:c1]" or "[c0:c1]" */
const char *ck_box_str(const struct ck_box *b, char *buf, size_t cap);

/* ---- reading pieces of one checkpoint ---- */

struct ck_reader {
	const char *dir;              /* step directory */
	const struct ck_manifest *m;
	int *fds;                     /* per file, -1 until opened */
	int *dfds;                    /* per file, opened with O_DIRECT: -1 until tried, -2 refused */
	char *bounce;                 /* aligned buffer of the direct reads */
	size_t *dalign;               /* per file: the direct reads' block (st_direct_align) */
	int64_t bytes_direct;         /* read with O_DIRECT straight into the destination */
	float *tmp;
	size_t tmp_cap;
	const struct ck_piece *cached; /* the stored piece held in tmp */
	int64_t bytes_read;
	st_progress *progress;        /* optional */
};

void ck_reader_init(struct ck_reader *r, const char *dir, const struct ck_manifest *m);
void ck_reader_release(struct ck_reader *r);
/* Read stored piece p of t whole into dst and verify its checksum (ST_EIO naming file and tensor). */
int ck_read_stored(struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, float *dst);
/*
 * The same in parts: bytes [at, at + len) of stored piece p into dst (which
 * receives those bytes only), *crc their CRC-32 alone; ST_EIO naming file
 * and tensor for a failed read or a file that ends too soon (the messages
 * of ck_read_stored). Combine the parts' CRCs in order (st_crc32_combine)
 * and pass the piece's to ck_check_crc (ST_EIO: checksum mismatch).
 */
int ck_read_part(struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, uint64_t at, uint64_t len,
		 char *dst, uint32_t *crc);
int ck_check_crc(const struct ck_reader *r, const struct ck_tensor *t, const struct ck_piece *p, uint32_t crc);
/*
 * The stored piece whose box is exactly want's (it alone fills want: a
 * manifest's pieces tile their tensor), its tensor in *t; NULL when there is
 * none or want does not fit this checkpoint (ck_fill_piece says why).
 */
const struct ck_piece *ck_same_piece(const struct ck_manifest *m, const st_ckpt_piece *want,
				     const struct ck_tensor **t);
/*
 * Fill want->data from the stored pieces that intersect it. ST_EINVAL if the
 * tensor is missing or its shape differs; ST_EIO if the data is damaged.
 */
int ck_fill_piece(struct ck_reader *r, const st_ckpt_piece *want);

/* ---- file names, the fence ---- */

/* A process's shard and done record: "shard-00001-of-00004.safetensors" and
 * "done-00001.json", or with a generation (>= 0)
 * "shard-g000007-00001-of-00004.safetensors" and "done-g000007-00001.json". */
void ck_shard_name(char *buf, size_t cap, int64_t generation, int process, int count);
void ck_done_name(char *buf, size_t cap, int64_t generation, int process);
/* Whether name is a shard (then *count: its process count) or a done record, of any generation. */
int ck_is_shard_name(const char *name, int *count);
int ck_is_done_name(const char *name);
/*
 * The fence of a save of step `step` (o->generation, o->fence): 0 when there
 * is none, no fence file, or it holds a generation that is not newer than
 * o->generation; else ST_EIO "checkpoint step S: generation G is stale (the
 * run is at generation F): not committed", or the fence's own error.
 */
int ck_fence_check(const st_ckpt_opts *o, int64_t step);

/* ---- steps, pieces ---- */

/* A step directory name: decimal digits only, fits int64. */
int ck_parse_step(const char *name, int64_t *step);
/* Steps under dir (ascending); committed_only: those with a manifest. Missing dir: 0 steps. */
int ck_list_steps(const char *dir, int committed_only, int64_t **steps, int *n);
/* "dir/<step>" */
int ck_step_dir(char *buf, size_t cap, const char *dir, int64_t step);
/* Validate a caller's piece: ndim, shapes, box inside the tensor, data. */
int ck_check_piece(const st_ckpt_piece *p, const char *what);
/* The piece's box. */
struct ck_box ck_piece_box(const st_ckpt_piece *p);
int64_t ck_piece_numel(const st_ckpt_piece *p);

/* ---- Hugging Face (hf.c) ---- */

/* load_parameters_path from a Hugging Face model directory: fill pieces from
 * config.json + safetensors (checked against c; see st_ckpt_load_params). */
int ck_hf_load(const char *dir, const st_config *c, int n, st_ckpt_piece *pieces);

#endif
