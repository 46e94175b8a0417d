/*
 * adamw.h - AdamW with decoupled weight decay, global-norm clipping, and
 * MaxText's learning-rate schedule.
 *
 * Semantics follow optax as MaxText uses it:
 *   clip_by_global_norm(c): g *= c / max(|g|, c)            (c = 0: no clipping)
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )   t = step + 1
 * The schedule (st_lr_at) is a linear warmup from 0 over
 * floor(schedule_steps * warmup_fraction) steps, then a cosine decay to
 * lr * final_fraction at schedule_steps, then 0.
 */
#ifndef ST_OPTIM_ADAMW_H
#define ST_OPTIM_ADAMW_H

#include <stdint.h>

#include "config/config.h"

/* Learning rate used at (0-based) step `step`. */
double st_lr_at(const st_config *c, int64_t step);

/* sum g^2 in double, summed in fixed-size blocks in a fixed order (the
 * result does not depend on the thread count). */
double st_sum_squares(const float *g, int64_t n);
/* sqrt(st_sum_squares(g, n)). */
double st_global_norm(const float *g, int64_t n);

typedef struct st_adamw {
	double lr, b1, b2, eps, wd;
	int64_t t;         /* 1-based update count */
	float grad_scale;  /* multiplies every gradient (clipping) */
} st_adamw;

/* One update of n parameters with moments m, v (all fp32). */
void st_adamw_update(float *p, const float *g, float *m, float *v, int64_t n,
		     const st_adamw *h);
/* The same, also writing pb[i] = bf16(new p[i]) (pb NULL: none) in the
 * same pass over memory: the bf16 weight copy of dtype=bfloat16. */
void st_adamw_update_bf16(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n,
			  const st_adamw *h);

/*
 * Checksums of the new state, computed in the update's pass while each
 * block is in cache: a checkpoint's CRC-32s (st_ckpt_piece.crc32), so that
 * the saver need not read the state from memory again. ranges: nranges
 * non-empty parts [start[r], start[r] + len[r]) of the flat arrays, sorted and
 * disjoint (gaps allowed); crc[k * nranges + r] receives st_crc32(0, range r of array k)
 * after the update, k = 0: p, 1: m, 2: v.
 */
typedef struct st_adamw_crc {
	int nranges;
	const int64_t *start, *len;
	uint32_t *crc; /* 3 * nranges */
} st_adamw_crc;

/* st_adamw_update_bf16, and with crc the checksums above. ST_EINVAL (bad
 * ranges: nothing updated), ST_ENOMEM. */
int st_adamw_update_crc(float *p, uint16_t *pb, const float *g, float *m, float *v, int64_t n, const st_adamw *h,
			const st_adamw_crc *crc);

#endif
