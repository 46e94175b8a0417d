/*
 * data.h - training batches by global sample index.
 *
 * A dataset is a sequence of samples, each max_target_length+1 token ids
 * (inputs are tokens[0..T-1], targets tokens[1..T]). Sample i of the run is
 * found through a deterministic order (shuffled by data_shuffle_seed unless
 * enable_data_shuffling=false), so a process that knows the global sample
 * index of its first row reads exactly its own rows, and a resumed run
 * continues where it stopped. The order depends only on the number of
 * samples N and those two config keys: never on the mesh, the process count
 * or the order of calls.
 *
 * dataset_type=synthetic: one fixed random batch (seeded), reused every step:
 *   sample i is row (i mod global_batch) of that batch. Token t of row r is
 *   st_rng_below(data_shuffle_seed, ST_DATA_SYNTHETIC_STREAM, r*(T+1) + t,
 *   vocab_size), so the batch is never stored and each process computes only
 *   its own rows. (MaxText's SyntheticDataIterator draws its batch once from
 *   PRNGKey(0); here the seed is data_shuffle_seed, 0 by default.)
 * dataset_type=tokens: dataset_path is a file or glob of llm.c .bin shards
 *   (uint16 or uint32 tokens) or .npy integer arrays, told apart by magic.
 *   A 2-D .npy of shape (N, T+1) gives one sample per row; any other file is
 *   cut into consecutive non-overlapping samples of T+1 tokens (a tail
 *   shorter than T+1 is dropped). Files in sorted glob order (byte order of
 *   the path, independent of the locale); samples of all files concatenated.
 *   Epochs: sample index i >= N wraps to epoch e = i / N, each epoch with its
 *   own permutation (seeded by data_shuffle_seed and the epoch): i reads
 *   sample perm_e[i mod N], so every sample is read exactly once per epoch.
 *   perm_e is a Fisher-Yates shuffle of 0..N-1: for k = N-1 down to 1, swap
 *   positions k and st_rng_below(data_shuffle_seed, ST_DATA_SHUFFLE_STREAM + e,
 *   k, k+1). Without shuffling, i reads sample i mod N.
 *   Every file is mmapped for the dataset's lifetime and every token id is
 *   checked once at open.
 *
 *   st_dataset *ds;
 *   rc = st_dataset_open(&ds, &cfg, global_batch_rows);
 *   rc = st_dataset_read(ds, first_sample_index, nrows, tokens);  // tokens: nrows x (T+1) int32
 *   st_dataset_free(ds);
 *
 * Errors (ST_EINVAL, one line naming the file): no file matches, directory,
 * empty file, bad magic, truncated header or data, extra bytes after the data,
 * malformed .npy header, unsupported version, dtype, byte order, Fortran order
 * or rank, a 2-D .npy whose rows are not T+1 long, token id >= vocab_size or
 * < 0, fewer tokens than one sample in all files together. ST_ENOMEM and
 * ST_EIO (mmap) for system failures. On failure *out is NULL.
 *
 * A dataset is not thread-safe: st_dataset_read caches the current epoch's
 * permutation. Use one per thread, or serialize reads.
 */
#ifndef ST_DATA_DATA_H
#define ST_DATA_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* st_rng streams of the data module ("SYNT", "SHUF", "SYNE" in the high bytes). */
#define ST_DATA_SYNTHETIC_STREAM 0x53594e5400000000ull
#define ST_DATA_SHUFFLE_STREAM 0x5348554600000000ull
#define ST_DATA_SYNTHETIC_EVAL_STREAM 0x53594e4500000000ull

typedef struct st_dataset st_dataset;

/* global_batch_rows: rows per step over all devices (synthetic batch height;
 * unused for tokens). Reads c during the call only. */
int st_dataset_open(st_dataset **out, const st_config *c, int64_t global_batch_rows);
/*
 * The eval data (eval_interval, docs/observability.md), read like the
 * training data but never shuffled (sample i is i mod N, in file order):
 * dataset_type=tokens reads grain_eval_files (errors name that key);
 * synthetic is a batch of global_batch_rows rows of its own, token t of row
 * r st_rng_below(data_shuffle_seed, ST_DATA_SYNTHETIC_EVAL_STREAM, r*(T+1)
 * + t, vocab_size): random text the training batch never shows.
 */
int st_dataset_open_eval(st_dataset **out, const st_config *c, int64_t global_batch_rows);
/*
 * Before a run creates anything: dataset_type=tokens' dataset_path, and
 * grain_eval_files when eval is on (eval_interval > 0), each name at least
 * one file (the glob only: the files' contents are checked at open). 0, or
 * ST_EINVAL with open's message ("dataset_path 'P' matches no file", ...)
 * and *key the key at fault (else NULL). Synthetic data: 0.
 */
int st_dataset_check_paths(const st_config *c, const char **key);
/* Number of samples in one epoch (synthetic: global_batch_rows). */
int64_t st_dataset_num_samples(const st_dataset *ds);
/* Fill tokens[nrows][T+1] with samples first..first+nrows-1 in the run's order.
 * first >= 0 and nrows >= 0, else ST_EINVAL; rows may span epochs. */
int st_dataset_read(st_dataset *ds, int64_t first, int64_t nrows, int32_t *tokens);
/* The dataset sample (0..N-1, in concatenated file order; synthetic: the
 * batch row) that global sample index i >= 0 reads. */
int st_dataset_locate(st_dataset *ds, int64_t i, int64_t *sample);
/* One line for the log, e.g. "tokens: 3 files, 1000000 tokens, 487 samples x
 * 2049 tokens per epoch, shuffled per epoch (seed 0)". Always NUL-terminated. */
void st_dataset_summary(const st_dataset *ds, char *buf, size_t len);
/* NULL is fine. */
void st_dataset_free(st_dataset *ds);

#endif
