/*
 * attention_kv.h - causal grouped-query attention of new queries over a
 * key/value cache, for incremental decoding (src/infer/generate.h).
 *
 * The training kernels (ops.h: st_attention_forward) attend a whole
 * sequence to itself; decoding adds n tokens at positions p0..p0+n-1 to a
 * cache that already holds positions 0..p0-1, and only their outputs are
 * wanted. Query i (position p0 + i) attends to cache positions 0..p0 + i:
 *
 *   out[i, h] = softmax_t(q[i, h] . k[h / (H/K), t] / sqrt(D)) v[h / (H/K), t]
 *
 * Shapes: q and out (n, H, D) (rows of H*D, as the q projection writes
 * them); kc and vc (K, cap, D): per kv head, positions in rows of D, cap
 * rows (the cache's capacity; positions up to p0 + n - 1 must be written).
 * fp32 throughout; the softmax subtracts the row maximum and sums in fp32,
 * as Hugging Face's eager attention does in float32.
 *
 * One task per (query, head): its scores in the caller's workspace, a slice
 * of st_attention_kv_workspace_bytes(cap, threads) per thread; each output
 * row is computed by one thread in a fixed order, so results do not depend
 * on the thread count. Returns 0, or ST_EINVAL (nothing written) for a
 * workspace too small, or p0 + n > cap.
 */
#ifndef ST_KERNELS_ATTENTION_KV_H
#define ST_KERNELS_ATTENTION_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/workspace.h"

size_t st_attention_kv_workspace_bytes(int64_t cap, int threads);
int st_attention_kv_forward(float *out, const float *q, const float *kc, const float *vc, int64_t cap,
			    int64_t p0, int64_t n, int64_t H, int64_t K, int64_t D, const st_ws *ws);

#endif
