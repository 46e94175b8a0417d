/*
 * pages.h - large zeroed buffers that start on a page boundary.
 *
 * What calloc gives for large sizes (fresh zero pages, faulted in on first
 * use), plus the alignment: a checkpoint save writes the optimizer state
 * straight from these buffers with O_DIRECT, which needs the memory address
 * (and the file offset) aligned to the disk's block size (ckpt/save.c,
 * docs/checkpoint-costs.md). The model's parameters, gradients, activations and
 * bf16 weight copy, the shard's state and the AMX products' packed operand
 * are allocated here.
 *
 * A buffer of 2 MiB or more starts on a 2 MiB boundary and is advised for
 * transparent huge pages (MADV_HUGEPAGE; where THP is "madvise", Debian's
 * default, nothing else gets them): the fresh memory a restore reads into
 * is faulted in 2 MiB at a time, and the optimizer's sweeps and the save's
 * O_DIRECT writes walk far fewer page-table entries (figures in
 * docs/checkpoint-costs.md), as do the matrix products reading
 * activations across rows kilobytes apart (docs/kernels.md). A hint
 * only: without THP the buffer is the same, in 4 KiB pages.
 *
 *   float *p = st_pages_alloc(n * sizeof(float));   // NULL: out of memory
 *   ...
 *   st_pages_free(p, n * sizeof(float));            // the same byte count; NULL is fine
 *
 * Under AddressSanitizer the buffer comes from posix_memalign (zeroed), so
 * that ASan still sees overruns past its end.
 */
#ifndef ST_BASE_PAGES_H
#define ST_BASE_PAGES_H

#include <stddef.h>

/* Alignment of st_pages_alloc's buffers: at least the block size of O_DIRECT. */
#define ST_PAGES_ALIGN 4096

void *st_pages_alloc(size_t bytes);
void st_pages_free(void *p, size_t bytes);

#endif
