#include "kernels/cpu/amx.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/err.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/simd.h"

/*
 * Layout (see amx.h for the contract). tdpbf16ps multiplies a 16 x 32 bf16
 * tile of A by a 32 x 16 tile of B held in VNNI form (16 rows of k pairs)
 * into a 16 x 16 fp32 tile of C. Each call:
 *  - reads an op(A) 'N' (A row-major along K) straight from A's rows, 32
 *    rows (two tiles) by 32 k per step; strips at the edge of M or of a K
 *    that is not a multiple of 32 are packed strip by strip into a scratch
 *    (pack_a_tile). A transposed op(A) is packed whole (up to APACK_MAX),
 *    which transposes it: the steps of a strip of 32 rows one after the
 *    other. With A in huge pages (as the model's activations are) the rows
 *    read straight ran 1.06x the packed form over the step's products
 *    (commit 647e48e; with 4 KiB pages, before cbe2051: 0.8-0.9x);
 *  - walks op(B) in blocks of nb columns (at most NB_MAX, about B_BYTES) by
 *    KC rows of K; the threads pack a block together (its 32-column panels
 *    one after the other, 2 KiB per k step), then each computes its share
 *    of the 32-row strips of C against it: four C tiles (32 x 32) over the
 *    block's k steps in order, two A tiles and two B tiles per step. The B
 *    tiles are loaded with tileloaddt1 (a hint that they are not reused
 *    soon), so that they do not push the A strip, which every panel reads
 *    again, out of L1: with it the step's products ran 1.05x, and a strip
 *    of 17-24 k steps no longer gains from being run in two halves as
 *    before (commit 283a994).
 * Each thread prefetches into L2 what its next strip and the next block
 * read (prefetch_c, prefetch_b below): in a training step they come from
 * DRAM.
 * The fp32 sums go through C between blocks of K (a tile store and load of
 * fp32 lose nothing), so each element of C is the same sequence of
 * tdpbf16ps whatever the thread count, nb and KC. Strips and panels at an
 * edge of C go through a per-thread scratch strip; a bf16 C of whole
 * blocks is rounded block by block while the next block's tile products
 * run (pass below), else through the scratch. A residual add
 * (st_amx_gemm_bf16_res) loads its first sums from R where it would load
 * them from C.
 * All scratch is the caller's: the kernel context's workspace (kctx.h),
 * laid out by amx_layout.
 */

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

/* A block of op(B) is at most KC rows by NB_MAX columns, and about B_BYTES
 * (it stays in L2 while every strip of C passes over it): 512 columns where
 * K is 768, 256 where it is 2048 (measured 5-8% faster at K 512-768 than a
 * fixed 256, slower for a 2 MiB block at K 2048). */
enum { NB_MAX = 512, NB_MIN = 128, KC = 2048, B_BYTES = 1 << 20 };
/* op(A) packed whole up to this size, else strip by strip */
#define APACK_MAX ((size_t)64 << 20)

typedef struct {
	uint8_t palette, start;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} __attribute__((packed)) tilecfg;

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_probe(void)
{
#ifndef __AVX512F__
	return; /* a build without AVX-512 (-mno-avx512f) uses none of ours, AMX included */
#endif
	unsigned a = 0, b = 0, c = 0, d = 0;
	__asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
	if (a < 7)
		return;
	__asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
	int bf16 = (d >> 22) & 1, tile = (d >> 24) & 1, avx512bw = (b >> 30) & 1,
	    avx512f = (b >> 16) & 1;
	if (!bf16 || !tile || !avx512bw || !avx512f)
		return;
	/* Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM,
	 * XFEATURE_XTILEDATA); a kernel without it refuses and we do not use AMX */
	amx_ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

static int amx_forced_off = -1; /* -1: from the environment on first use */

int st_amx_available(void)
{
	pthread_once(&amx_once, amx_probe);
	if (amx_forced_off < 0) {
		const char *e = getenv("ST_AMX");
		amx_forced_off = e && !strcmp(e, "0");
	}
	return amx_ok && !amx_forced_off;
}

void st_amx_set_enabled(int on) { amx_forced_off = !on; }

/* This thread's tile configuration is loaded (st_amx_dp_tile keeps it
 * between calls; a product's parallel region releases it at its end). */
static _Thread_local int tiles_ready;

AMX_TARGET static void tiles_config(void)
{
	tiles_ready = 1;
	tilecfg cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int i = 0; i < 8; i++) {
		cfg.colsb[i] = 64;
		cfg.rows[i] = 16;
	}
	_tile_loadconfig(&cfg);
}

/* 16 x 16 32-bit transpose: v[i] row i in, v[c] column c out. */
AMX_TARGET static void transpose16(__m512i v[16])
{
	__m512i t[16], u[16];
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
	}
	for (int i = 0; i < 4; i++) {
		u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
		u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
		u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
		u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
	}
	/* u[4i+q], 128-bit lane L: rows 4i..4i+3 of column 4L+q */
	for (int q = 0; q < 4; q++) {
		__m512i w0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88);
		__m512i w1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xDD);
		__m512i w2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88);
		__m512i w3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xDD);
		v[q] = _mm512_shuffle_i32x4(w0, w2, 0x88);
		v[8 + q] = _mm512_shuffle_i32x4(w0, w2, 0xDD);
		v[4 + q] = _mm512_shuffle_i32x4(w1, w3, 0x88);
		v[12 + q] = _mm512_shuffle_i32x4(w1, w3, 0xDD);
	}
}

/* Mask of the first n (0..32) 16-bit elements. */
static __mmask32 mask16(int64_t n)
{
	return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0 : (__mmask32)((1u << n) - 1);
}

/* Row pairs (r, r+1) of a row-major X interleaved into 16 dwords: dword j =
 * (X[r][c+j], X[r+1][c+j]); nr valid rows (0..2) and nc valid columns
 * (0..16) from (r, c), zeros beyond. */
AMX_TARGET static __m512i pair_rows(const uint16_t *X, int64_t ld, int64_t r, int64_t c, int nr,
				    int nc)
{
	__mmask16 m = nc >= 16 ? 0xFFFF : (__mmask16)((1u << (nc > 0 ? nc : 0)) - 1);
	__m256i lo = nr > 0 ? _mm256_maskz_loadu_epi16(m, X + r * ld + c) : _mm256_setzero_si256();
	__m256i hi = nr > 1 ? _mm256_maskz_loadu_epi16(m, X + (r + 1) * ld + c) : _mm256_setzero_si256();
	return _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
			       _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

/*
 * One VNNI tile of op(B) (tb 'N': B is (K, N); 'T': B is (N, K)) for
 * columns n0..n0+15 and k0..k0+31, zeros outside K x N, to out (16 rows of
 * 64 bytes: row r = k pair k0+2r, column j = dword j).
 */
AMX_TARGET static void pack_b_tile(char tb, const uint16_t *B, int64_t ldb, int64_t K, int64_t N,
				   int64_t k0, int64_t n0, uint16_t *out)
{
	__m512i v[16];
	int64_t kr = K - k0, nr = N - n0;
	if (tb == 'N') {
		for (int r = 0; r < 16; r++) {
			int64_t left = kr - 2 * r;
			v[r] = pair_rows(B, ldb, k0 + 2 * r, n0, left >= 2 ? 2 : left > 0 ? (int)left : 0,
					 nr >= 16 ? 16 : (int)nr);
		}
	} else {
		__mmask32 m = mask16(kr);
		for (int j = 0; j < 16; j++)
			v[j] = j < nr ? _mm512_maskz_loadu_epi16(m, B + (n0 + j) * ldb + k0)
				      : _mm512_setzero_si512();
		transpose16(v);
	}
	for (int r = 0; r < 16; r++)
		_mm512_store_si512((__m512i *)(out + r * 32), v[r]);
}

/*
 * One A tile (rows m0..m0+15, k0..k0+31 of op(A); ta 'N': A is (M, K),
 * 'T': A is (K, M)) to out (16 rows of 64 bytes, 32 consecutive k), zeros
 * outside M x K.
 */
AMX_TARGET static void pack_a_tile(char ta, const uint16_t *A, int64_t lda, int64_t M, int64_t K,
				   int64_t m0, int64_t k0, uint16_t *out)
{
	int64_t mr = M - m0, kr = K - k0;
	if (ta == 'N') {
		__mmask32 m = mask16(kr);
		for (int r = 0; r < 16; r++) {
			__m512i v = r < mr ? _mm512_maskz_loadu_epi16(m, A + (m0 + r) * lda + k0)
					   : _mm512_setzero_si512();
			_mm512_store_si512((__m512i *)(out + r * 32), v);
		}
		return;
	}
	__m512i v[16];
	for (int r = 0; r < 16; r++) {
		int64_t left = kr - 2 * r;
		v[r] = pair_rows(A, lda, k0 + 2 * r, m0, left >= 2 ? 2 : left > 0 ? (int)left : 0,
				 mr >= 16 ? 16 : (int)mr);
	}
	transpose16(v); /* v[m]: dword r = (k0+2r, k0+2r+1) of row m */
	for (int r = 0; r < 16; r++)
		_mm512_store_si512((__m512i *)(out + r * 32), v[r]);
}

/* A thread's scratch: a packed A strip (32 rows x KC), a strip of C (32 x
 * NB_MAX fp32) and the ring of a bf16 C. */
typedef struct {
	uint16_t *a;
	float *c;
	float *ring; /* two 32 x 32 fp32 blocks as tiles, for a bf16 C */
} scratch;

enum { STRIP_A = 32 * KC * 2, STRIP_C = 32 * NB_MAX * 4, STRIP_RING = 2 * 1024 * 4 };

static size_t strip_bytes(void)
{
	return st_ws_round(STRIP_A) + st_ws_round(STRIP_C) + st_ws_round(STRIP_RING);
}

/* Thread t's strip in a product's strips. */
static scratch strip_of(char *strips, int t)
{
	char *p = strips + (size_t)t * strip_bytes();
	return (scratch){.a = (uint16_t *)p, .c = (float *)(p + st_ws_round(STRIP_A)),
			 .ring = (float *)(p + st_ws_round(STRIP_A) + st_ws_round(STRIP_C))};
}

/* Bytes of op(A) packed whole: a transposed A up to APACK_MAX, else 0. */
static size_t apack_bytes(char ta, int64_t M, int64_t K)
{
	size_t an = (size_t)((M + 31) / 32) * (size_t)((K + 31) / 32) * 2048;
	return ta == 'T' && an <= APACK_MAX ? an : 0;
}

/* A product's scratch in the context's workspace, placed at base (64-byte
 * aligned) or only counted (base NULL); returns its bytes: op(A) packed
 * whole (apack_bytes, where any), one packed block of op(B) (B_BYTES) and
 * one strip per thread. st_amx_workspace_bytes counts with it and gemm
 * places with it, so the two cannot disagree. */
typedef struct {
	uint16_t *a, *b;
	char *strips;
} amx_ws;

static size_t amx_layout(amx_ws *w, char *base, char ta, int64_t M, int64_t K, int threads)
{
	size_t off = 0, an = apack_bytes(ta, M, K);
	w->a = an ? st_ws_take(base, &off, an) : NULL;
	w->b = st_ws_take(base, &off, B_BYTES);
	w->strips = st_ws_take(base, &off, (size_t)threads * strip_bytes());
	return off;
}

/* The C tiles 0-3 of a 32 x 32 block at c (row stride ldc floats): rows
 * 16-31 (tiles 2, 3) only if two_i, columns 16-31 (tiles 1, 3) only if
 * two_j. Start: from C (load) or zero; end: stored back. */
AMX_TARGET static void c_start(const float *c, int64_t ldc, int two_i, int two_j, int load)
{
	int64_t cs = ldc * (int64_t)sizeof(float);
	if (!load) {
		_tile_zero(0);
		_tile_zero(1);
		_tile_zero(2);
		_tile_zero(3);
		return;
	}
	_tile_loadd(0, c, cs);
	if (two_j)
		_tile_loadd(1, c + 16, cs);
	if (two_i)
		_tile_loadd(2, c + 16 * ldc, cs);
	if (two_i && two_j)
		_tile_loadd(3, c + 16 * ldc + 16, cs);
}

AMX_TARGET static void c_end(float *c, int64_t ldc, int two_i, int two_j)
{
	int64_t cs = ldc * (int64_t)sizeof(float);
	_tile_stored(0, c, cs);
	if (two_j)
		_tile_stored(1, c + 16, cs);
	if (two_i)
		_tile_stored(2, c + 16 * ldc, cs);
	if (two_i && two_j)
		_tile_stored(3, c + 16 * ldc + 16, cs);
}

/* A strip of C against the np panels of a packed block of op(B), over its
 * ks k steps: the 32 x 32 block of panel p starts from cin + 32 p (row
 * stride ldcin floats) when load, else from zero, and ends as fp32 at c +
 * 32 p (row stride ldc), or, with o, rounded to bf16 at o + 32 p (row
 * stride ldo) by way of ring (two blocks of four 16 x 16 tiles). The blocks are pipelined: a block's tiles
 * are stored, and the next block's loaded, between the last tile products
 * of one and the first of the next, and a block's bf16 rows are rounded
 * while the next block's products run (the vector units and the tile unit
 * work at once). Same sums in the same order as block by block. */
typedef struct {
	const char *a0, *a1; /* the strip's two A tiles of the first k step */
	int64_t as, astep;   /* their row stride, and bytes from one k step to the next */
	const char *bp;      /* panel 0's first step; panel p at bp + p * pstep */
	int64_t pstep, np, ks;
	const float *cin;
	int64_t ldcin;
	int load;
	float *c;
	int64_t ldc;
	uint16_t *o; /* NULL: fp32 at c */
	int64_t ldo;
	float *ring;
} pass_t;

#define TILE_INIT(t, src, stride)                       \
	do {                                            \
		if (q->load)                            \
			_tile_loadd(t, src, stride);    \
		else                                    \
			_tile_zero(t);                  \
	} while (0)

#ifdef __AVX512F__
/* Rows r0..r1-1 of a ring block (tiles 0 1 / 2 3, 16 x 16 fp32 each,
 * contiguous) rounded to 32 bf16 each at o (row stride ldo). */
AMX_TARGET static void ring_round(const float *blk, uint16_t *o, int64_t ldo, int r0, int r1)
{
	for (int r = r0; r < r1; r++) {
		const float *t = blk + (r < 16 ? 0 : 512) + (r % 16) * 16;
		__m256i lo = st_cvt_bf16_16(_mm512_load_ps(t)), hi = st_cvt_bf16_16(_mm512_load_ps(t + 256));
		_mm512_storeu_si512(o + r * ldo,
				    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
	}
}
#else
static void ring_round(const float *blk, uint16_t *o, int64_t ldo, int r0, int r1)
{
	/* a build without AVX-512 never takes the AMX path (amx_probe) */
	ST_BUG("AMX: a bf16 C rounded as it goes in a build without AVX-512");
}
#endif

AMX_TARGET static void pass(const pass_t *q)
{
	int64_t cis = q->ldcin * (int64_t)sizeof(float), ks = q->ks;
	int64_t ds = q->o ? 64 : q->ldc * (int64_t)sizeof(float);
	/* rows of the previous block rounded per k step, from the second on */
	int rps = ks > 1 ? (int)((32 + ks - 2) / (ks - 1)) : 32;
	TILE_INIT(0, q->cin, cis);
	TILE_INIT(1, q->cin + 16, cis);
	TILE_INIT(2, q->cin + 16 * q->ldcin, cis);
	TILE_INIT(3, q->cin + 16 * q->ldcin + 16, cis);
	/* where tiles 1-3 of a block go, in floats from tile 0: in the ring
	 * each tile's 16 x 16 lie together, in C they lie as in the block */
	int64_t o1 = q->o ? 256 : 16, o2 = q->o ? 512 : 16 * q->ldc, o3 = o2 + o1;
	float *prev = NULL; /* where the previous block's tile 0 went */
	for (int64_t p = 0; p < q->np; p++) {
		const char *b = q->bp + p * q->pstep;
		const char *a0 = q->a0, *a1 = q->a1;
		float *d = q->o ? q->ring + (p & 1) * 1024 : q->c + 32 * p;
		const float *ci = q->load ? q->cin + 32 * (p + 1) : NULL; /* the next block's start */
		int next = p + 1 < q->np, rr = 0;
		for (int64_t s = 0; s < ks; s++, a0 += q->astep, a1 += q->astep, b += 2048) {
			_tile_loadd(4, a0, q->as);
			_tile_stream_loadd(6, b, 64);
			_tile_stream_loadd(7, b + 1024, 64);
			_tile_dpbf16ps(0, 4, 6);
			if (s == 0 && prev) {
				_tile_stored(2, prev + o2, ds);
				TILE_INIT(2, q->cin + 32 * p + 16 * q->ldcin, cis);
			}
			if (s == ks - 1) {
				_tile_stored(0, d, ds);
				if (next)
					TILE_INIT(0, ci, cis);
			}
			_tile_loadd(5, a1, q->as);
			_tile_dpbf16ps(1, 4, 7);
			if (s == 0 && prev) {
				_tile_stored(3, prev + o3, ds);
				TILE_INIT(3, q->cin + 32 * p + 16 * q->ldcin + 16, cis);
			}
			if (s == ks - 1) {
				_tile_stored(1, d + o1, ds);
				if (next)
					TILE_INIT(1, ci + 16, cis);
			}
			_tile_dpbf16ps(2, 5, 6);
			_tile_dpbf16ps(3, 5, 7);
			if (q->o && prev && s > 0 && rr < 32) {
				int r1 = rr + rps < 32 ? rr + rps : 32;
				ring_round(prev, q->o + 32 * (p - 1), q->ldo, rr, r1);
				rr = r1;
			}
		}
		if (q->o && prev && rr < 32)
			ring_round(prev, q->o + 32 * (p - 1), q->ldo, rr, 32);
		prev = d;
	}
	_tile_stored(2, prev + o2, ds);
	_tile_stored(3, prev + o3, ds);
	if (q->o)
		ring_round(prev, q->o + 32 * (q->np - 1), q->ldo, 0, 32);
}

typedef struct {
	const uint16_t *ap; /* op(A) packed whole: strip i, k step s at ap + (i * aks + s) * 1024 */
	int64_t aks;
	uint16_t *bblk;     /* the packed block of op(B) (B_BYTES) */
	char *strips;       /* the threads' scratch strips (strip_of) */
	int64_t nb;         /* columns per block of op(B) */
	char ta, tb;
	int64_t M, N, K, lda, ldb, ldc;
	const uint16_t *A, *B;
	float beta;
	const float *R;     /* C starts from R (laid out as C) instead of C's contents, or NULL */
	void *C;
	int c16;
} job;

/* Strip [m0, m0+32) of C against the packed block (columns n0..n0+nb, K
 * rows k0..k0+kc), first: the first block of K. */
AMX_TARGET static void strip(const job *j, scratch *sc, const uint16_t *bblk, int64_t m0, int64_t n0,
			     int64_t nb, int64_t k0, int64_t kc, int first)
{
	int64_t ks = (kc + 31) / 32, mr = j->M - m0;
	int whole_rows = mr >= 32;
	const char *a0, *a1;
	int64_t as, astep;
	if (j->ap) {
		a0 = (const char *)(j->ap + ((m0 / 32) * j->aks + k0 / 32) * 1024);
		a1 = a0 + 1024;
		as = 64;
		astep = 2048;
	} else if (j->ta == 'N' && whole_rows && kc % 32 == 0) {
		const uint16_t *a = j->A + m0 * j->lda + k0;
		a0 = (const char *)a;
		a1 = (const char *)(a + 16 * j->lda);
		as = j->lda * 2;
		astep = 64;
	} else {
		for (int64_t s = 0; s < ks; s++) {
			pack_a_tile(j->ta, j->A, j->lda, j->M, k0 + kc, m0, k0 + 32 * s, sc->a + s * 1024);
			pack_a_tile(j->ta, j->A, j->lda, j->M, k0 + kc, m0 + 16, k0 + 32 * s,
				    sc->a + s * 1024 + 512);
		}
		a0 = (const char *)sc->a;
		a1 = a0 + 1024;
		as = 64;
		astep = 2048;
	}
	int load = !first || j->beta != 0.0f;
	/* where the first block of K reads its starting sums */
	const float *cin = first && j->R ? j->R : (const float *)j->C;
	int64_t rows = mr < 32 ? mr : 32, cols = j->N - n0 < nb ? j->N - n0 : nb;
	/* a bf16 C of whole blocks: rounded block by block as the products go */
	int ring = j->c16 && whole_rows && cols == nb;
	/* an edge of C, or a bf16 C otherwise: the strip's fp32 sums in the
	 * scratch (32 x nb), then copied or rounded into C */
	int scr = !ring && (j->c16 || !whole_rows || cols < nb);
	float *c = ring ? NULL : scr ? sc->c : (float *)j->C + m0 * j->ldc + n0;
	if (scr && load) {
		memset(sc->c, 0, 32 * NB_MAX * sizeof(float));
		for (int64_t r = 0; r < rows; r++)
			memcpy(sc->c + r * NB_MAX, cin + (m0 + r) * j->ldc + n0,
			       (size_t)cols * sizeof(float));
	}
	pass_t q = {.a0 = a0, .a1 = a1, .as = as, .astep = astep, .bp = (const char *)bblk,
		    .pstep = ks * 2048, .np = nb / 32, .ks = ks,
		    .cin = ring ? NULL : scr ? c : cin + m0 * j->ldc + n0, .ldcin = scr ? NB_MAX : j->ldc,
		    .load = load, .c = c, .ldc = scr ? NB_MAX : j->ldc,
		    .o = ring ? (uint16_t *)j->C + m0 * j->ldc + n0 : NULL, .ldo = j->ldc,
		    .ring = sc->ring};
	pass(&q);
	if (!scr)
		return;
	for (int64_t r = 0; r < rows; r++) {
		const float *src = sc->c + r * NB_MAX;
		if (j->c16) /* rounded to nearest even, as everywhere */
			st_f32_to_bf16_serial((uint16_t *)j->C + (m0 + r) * j->ldc + n0, src, cols);
		else
			memcpy((float *)j->C + (m0 + r) * j->ldc + n0, src, (size_t)cols * sizeof(float));
	}
}

/*
 * Prefetches into L2 of what the next strips read from memory; in the model
 * most operands and C come from DRAM (written long before, or bigger than
 * the caches), and the packing and tile loads alone do not keep enough
 * lines in flight.
 */

/* The lines of C that strip m0 (columns n0 .. n0+nb of the block) loads or
 * stores. */
static void prefetch_c(const job *j, int64_t m0, int64_t n0, int64_t nb)
{
	int64_t rows = j->M - m0 < 32 ? j->M - m0 : 32, cols = j->N - n0 < nb ? j->N - n0 : nb;
	size_t es = j->c16 ? 2 : 4;
	for (int64_t r = 0; r < rows; r++) {
		const char *p = (const char *)j->C + ((m0 + r) * j->ldc + n0) * (int64_t)es;
		for (size_t b = 0; b < (size_t)cols * es; b += 64)
			_mm_prefetch(p + b, _MM_HINT_T1);
	}
}

/* Piece `piece` of `pieces` of thread t's (of nt) share of the source rows
 * of op(B)'s block at (n0, k0): rows of B across n (tb 'T') or along k
 * (tb 'N'), split among the threads as the packing loop splits them. */
static void prefetch_b(const job *j, int64_t n0, int64_t k0, int t, int nt, int64_t piece,
		       int64_t pieces)
{
	int64_t nb = j->N - n0 < j->nb ? j->N - n0 : j->nb, kc = j->K - k0 < KC ? j->K - k0 : KC;
	int64_t rows = j->tb == 'T' ? nb : kc, len = j->tb == 'T' ? kc : nb;
	int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt, n = r1 - r0;
	int64_t a = r0 + n * piece / pieces, b = r0 + n * (piece + 1) / pieces;
	for (int64_t r = a; r < b; r++) {
		const uint16_t *row = j->tb == 'T' ? j->B + (n0 + r) * j->ldb + k0
						   : j->B + (k0 + r) * j->ldb + n0;
		for (int64_t e = 0; e < len; e += 32)
			_mm_prefetch((const char *)(row + e), _MM_HINT_T1);
	}
}

/*
 * One thread's part of a product: called by every thread of run's parallel
 * region, its work-sharing loop and barriers orphaned here. The tile code
 * lives in this function, not in the region's body: the compiler outlines
 * that body into a function of its own, which does not inherit AMX_TARGET
 * (clang 14 then fails in its backend, "Cannot select: intrinsic
 * %llvm.x86.tilerelease", when the build's -march has no AMX).
 */
AMX_TARGET static void run_thread(const job *j)
{
	int64_t strips = (j->M + 31) / 32;
	scratch mine = strip_of(j->strips, omp_get_thread_num()), *sc = &mine;
	tiles_config();
	/* this thread's strips of C, contiguous (as schedule(static)) */
	int nt = omp_get_num_threads(), me = omp_get_thread_num();
	int64_t i0 = strips * me / nt, i1 = strips * (me + 1) / nt;
	if (j->ap) {
		/* this thread's tiles, in pieces of 64, each followed by a
		 * piece of its share of the first block of op(B) */
		int64_t n = strips * j->aks * 2, t0 = n * me / nt, t1 = n * (me + 1) / nt;
		int64_t pieces = (t1 - t0 + 63) / 64;
		for (int64_t t = t0; t < t1; t++) {
			/* consecutive tiles read on along the same rows of
			 * A: 32 rows of K, across M */
			int64_t h = t % 2, s = t / (strips * 2), i = (t / 2) % strips;
			pack_a_tile(j->ta, j->A, j->lda, j->M, j->K, 32 * i + 16 * h, 32 * s,
				    (uint16_t *)j->ap + (i * j->aks + s) * 1024 + h * 512);
			if ((t - t0) % 64 == 63 || t + 1 == t1)
				prefetch_b(j, 0, 0, me, nt, (t - t0) / 64, pieces);
		}
#pragma omp barrier
	}
	for (int64_t n0 = 0; n0 < j->N; n0 += j->nb) {
		int64_t nb = j->N - n0 < j->nb ? (j->N - n0 + 31) / 32 * 32 : j->nb;
		for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
			int64_t kc = j->K - k0 < KC ? j->K - k0 : KC, ks = (kc + 31) / 32;
#pragma omp for schedule(static) nowait
			for (int64_t t = 0; t < (nb / 32) * ks * 2; t++) {
				/* along rows of B: (K, N) across N, (N, K) across K */
				int64_t p, s, h = t % 2;
				if (j->tb == 'T')
					p = t / (ks * 2), s = (t / 2) % ks;
				else
					s = t / (nb / 32 * 2), p = (t / 2) % (nb / 32);
				pack_b_tile(j->tb, j->B, j->ldb, k0 + kc, j->N, k0 + 32 * s,
					    n0 + 32 * p + 16 * h, j->bblk + (p * ks + s) * 1024 + h * 512);
			}
			if (i0 < i1)
				prefetch_c(j, 32 * i0, n0, nb);
#pragma omp barrier
			/* the next block of op(B), if any */
			int64_t nn0 = n0, nk0 = k0 + KC;
			if (nk0 >= j->K)
				nn0 = n0 + j->nb, nk0 = 0;
			for (int64_t i = i0; i < i1; i++) {
				strip(j, sc, j->bblk, 32 * i, n0, nb, k0, kc, k0 == 0);
				if (i + 1 < i1)
					prefetch_c(j, 32 * (i + 1), n0, nb);
				if (nn0 < j->N)
					prefetch_b(j, nn0, nk0, me, nt, i - i0, i1 - i0);
			}
#pragma omp barrier
		}
	}
	_tile_release();
	tiles_ready = 0;
}

/* On at most `threads` threads: the strips are laid out for that many. */
static void run(const job *j, int threads)
{
#pragma omp parallel num_threads(threads)
	run_thread(j);
}

/* The path takes the call (see amx.h); shape and operation only. */
static int takes(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
		 int c_bf16)
{
	return st_amx_available() && alpha == 1.0f && (beta == 0.0f || beta == 1.0f) &&
	       !(c_bf16 && (beta != 0.0f || K > KC)) && M > 0 && N > 0 && K > 0 &&
	       (ta == 'N' || ta == 'T') && (tb == 'N' || tb == 'T');
}

static char upper(char t) { return t == 'n' ? 'N' : t == 't' ? 'T' : t; }

size_t st_amx_workspace_bytes(char ta, char tb, int64_t M, int64_t N, int64_t K, int c_bf16,
			      int threads)
{
	ta = upper(ta);
	tb = upper(tb);
	if (!takes(ta, tb, M, N, K, 1.0f, 0.0f, c_bf16))
		return 0;
	amx_ws w;
	return amx_layout(&w, NULL, ta, M, K, threads > 0 ? threads : 1);
}

static int gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *A,
		int64_t lda, const uint16_t *B, int64_t ldb, float beta, const float *R, void *C,
		int64_t ldc, int c_bf16, st_kctx *kc)
{
	ta = upper(ta);
	tb = upper(tb);
	if (!takes(ta, tb, M, N, K, alpha, beta, c_bf16) || omp_in_parallel())
		return 0;
	if (!kc || !kc->ready)
		return st_fail(ST_EINVAL, "st_gemm_bf16 (AMX): no kernel context");
	int threads = st_ws_threads(&kc->ws);
	amx_ws w;
	int rc = st_ws_check(&kc->ws, amx_layout(&w, NULL, ta, M, K, threads), "st_gemm_bf16 (AMX)");
	if (rc < 0)
		return rc;
	if ((uintptr_t)kc->ws.mem % 64) /* aligned tile stores */
		return st_fail(ST_EINVAL, "st_gemm_bf16 (AMX): the context's workspace at %p is not "
			       "64-byte aligned", kc->ws.mem);
	int64_t kcp = ((K < KC ? K : KC) + 31) / 32 * 32, nb = B_BYTES / (kcp * 2) / 32 * 32;
	job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
		 .A = A, .B = B, .beta = beta, .R = R, .C = C, .c16 = c_bf16,
		 .nb = nb > NB_MAX ? NB_MAX : nb < NB_MIN ? NB_MIN : nb};
	pthread_mutex_lock(&kc->lock);
	amx_layout(&w, kc->ws.mem, ta, M, K, threads);
	/* op(A) 'N' whole strips are read straight from A's rows (A in huge
	 * pages, as the model's activations are: the step's products 1.06x);
	 * a transposed A is packed whole (w.a, where it fits APACK_MAX), which
	 * transposes it */
	j.ap = w.a;
	j.aks = (K + 31) / 32;
	j.bblk = w.b;
	j.strips = w.strips;
	run(&j, threads);
	pthread_mutex_unlock(&kc->lock);
	return 1;
}

int st_amx_gemm_bf16(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
		     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
		     void *C, int64_t ldc, int c_bf16, st_kctx *kc)
{
	return gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc, c_bf16, kc);
}

int st_amx_gemm_bf16_res(char ta, char tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
			 int64_t lda, const uint16_t *B, int64_t ldb, const float *R, float *C,
			 int64_t ldc, st_kctx *kc)
{
	return gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, R, C, ldc, 0, kc);
}

/*
 * The bf16 attention's tile products (attention_bf16.c's dp_tile): C (m x
 * N, row stride ldc) += A B (acc) or = scale * A B, A (m x np words of two
 * bf16 along the reduction), word (r, p) at A[r*sr + p*sc] with sc 1 (rows
 * read straight) or sr 1 (transposed: 16 x 16 blocks transposed into a
 * local copy), B (np x N words) word (p, c) at B[p*ldb + c]: already the
 * VNNI form a B tile reads. m, N and np multiples of 16, m and np at most
 * 64; else 0 (the caller's vector path). C in 32 x 32 blocks (four tiles),
 * each over np in steps of 16 words in order.
 */
AMX_TARGET int st_amx_dp_tile(float *C, int64_t ldc, int64_t m, int64_t N, const uint32_t *A,
			      int64_t sr, int64_t sc, int64_t np, const uint32_t *B, int64_t ldb,
			      int acc, float scale)
{
	if (m <= 0 || N <= 0 || np <= 0 || m % 16 || N % 16 || np % 16 || m > 64 || np > 64 ||
	    (sc != 1 && sr != 1) || !st_amx_available())
		return 0;
	uint32_t At[64 * 64] __attribute__((aligned(64)));
	if (sc != 1) {
		for (int64_t r0 = 0; r0 < m; r0 += 16)
			for (int64_t p0 = 0; p0 < np; p0 += 16) {
				__m512i v[16];
				for (int i = 0; i < 16; i++)
					v[i] = _mm512_loadu_si512(A + (p0 + i) * sc + r0);
				transpose16(v);
				for (int i = 0; i < 16; i++)
					_mm512_store_si512((__m512i *)(At + (r0 + i) * np + p0), v[i]);
			}
		A = At;
		sr = np;
	}
	if (!tiles_ready)
		tiles_config();
	int64_t as = sr * 4, bs = ldb * 4;
	for (int64_t i0 = 0; i0 < m; i0 += 32)
		for (int64_t j0 = 0; j0 < N; j0 += 32) {
			int two_i = m - i0 >= 32, two_j = N - j0 >= 32;
			float *c = C + i0 * ldc + j0;
			c_start(c, ldc, two_i, two_j, acc);
			for (int64_t p = 0; p < np; p += 16) {
				_tile_loadd(4, A + i0 * sr + p, as);
				_tile_loadd(6, B + p * ldb + j0, bs);
				_tile_dpbf16ps(0, 4, 6);
				if (two_j) {
					_tile_loadd(7, B + p * ldb + j0 + 16, bs);
					_tile_dpbf16ps(1, 4, 7);
				}
				if (two_i) {
					_tile_loadd(5, A + (i0 + 16) * sr + p, as);
					_tile_dpbf16ps(2, 5, 6);
					if (two_j)
						_tile_dpbf16ps(3, 5, 7);
				}
			}
			c_end(c, ldc, two_i, two_j);
		}
	if (!acc) {
		__m512 vs = _mm512_set1_ps(scale);
		for (int64_t r = 0; r < m; r++)
			for (int64_t j = 0; j < N; j += 16)
				_mm512_storeu_ps(C + r * ldc + j, _mm512_mul_ps(_mm512_loadu_ps(C + r * ldc + j), vs));
	}
	return 1;
}
