/*
 * Communicators and collectives.
 *
 * Members are partitioned into local groups: members on the same host and
 * in the same slice (when shared memory is on), ordered by their first
 * member's position in the communicator. Inside a local group data moves
 * through a shared memory segment (a memfd made by the group's first
 * member and passed to the others over the control socket); between local
 * groups over TCP (one connection per pair that exchanges data).
 *
 * Every collective is one engine run over "segments": segment i belongs to
 * member i (reduce-scatter: counts[i] elements of the concatenated input;
 * allreduce: a balanced split of the buffer; allgather/broadcast: the
 * member's contribution). The data is processed in windows; window w covers
 * the same fraction w/nw of every segment, so all members work on every
 * window. In each window:
 *   1. each member copies into its shared memory slot the pieces that
 *      another member of its local group reduces;
 *   2. segment i is reduced inside each local group g by its handler
 *      handler(g, i) (i itself in its own group; a counterpart elsewhere),
 *      reading the others' slots: the group partial, in member order;
 *   3. handlers send their partials to i over TCP; i adds the partials of
 *      all groups in group order (the final value, computed once);
 *   4. (allreduce, allgather) i sends the final piece back to the
 *      handlers; each local group copies it out of its handler's slot.
 * So each element's sum is ((m_a + m_b + ...) + (m_c + ...) + ...): left to
 * right inside each local group, then left to right over the groups, and
 * every member ends with the very bits computed by the segment's owner.
 * With one local group this is plain m_0 + m_1 + ... + m_{n-1}; with
 * singleton groups (all TCP) too. Two members in shared memory each reduce
 * half of each window directly from the other's slot and their own buffer.
 *
 * A buffer the members shared with st_comm_share skips the slots: in an
 * all-reduce over one local group, member i reduces segment i straight from
 * every member's mapping of the others' regions and writes the sums into all
 * of them, between two barriers (allreduce_shared). Each all-reduce
 * publishes its path in the member's line; the members check at the first
 * barrier that they all took the same one.
 *
 * Synchronization inside a local group: each member has a sequence counter
 * in the segment; a post increments it, a wait spins briefly, then yields,
 * then sleeps on the futex, and checks the group's failure state all along.
 * Slots are double-buffered (window parity).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/hash.h"
#include "comm/comm_int.h"

enum { M_AR, M_RS, M_AG };
enum { SHM_MAGIC = 0x5354534d };
enum { HDR_BYTES = 4096, LINE = 64 };

typedef struct shm_hdr {
	uint64_t magic, key, window;
	uint32_t n, nlocal;
} shm_hdr;

typedef struct shm_line {
	_Atomic uint32_t seq;     /* posts made by this member */
	_Atomic uint32_t waiters; /* members sleeping on seq */
	_Atomic uint64_t mode;    /* this all-reduce's path: 0 slots, else shared region + 1 and offset */
} shm_line;

/* A region of every local member's memory mapped by all of them (st_comm_share). */
typedef struct shared {
	uint8_t *base; /* mine */
	size_t len;    /* bytes, whole pages */
	uint8_t **at;  /* each local member's region, by local index (mine included) */
} shared;

struct st_comm {
	st_group *g;
	st_comm *next, *prev;
	int n, me;
	int *ranks;   /* global rank by position */
	int *grp;     /* local group of each position */
	int *lidx;    /* index inside its local group */
	int ngrp;     /* G */
	int *gsize;   /* L of each group */
	int *gstart;  /* group h's members are gmem[gstart[h] ...] */
	int *gmem;    /* members, grouped, in member order inside each group */
	int *dfd;     /* data connection by position, -1 */
	int my_g, L;
	int64_t spin_ns;  /* how long a wait spins before sleeping */
	int yields;       /* then how often it yields (oversubscribed only) */
	size_t W;     /* window bytes */
	uint8_t *shm; /* mapping: header, lines, slots */
	size_t shm_len;
	uint8_t *slots;
	uint32_t seq, last_done[2];
	uint64_t nwin;
	uint8_t *scratch; /* (G-1) windows: partials received for my segment */
	int64_t *cnt, *off, *lo, *len, *wofs; /* per position, per call / window */
	struct xop *ops;
	struct pollfd *pf;
	uint64_t key;
	shared *sh; /* st_comm_share's regions, in the order shared */
	int nsh;
	int broken; /* an all-reduce found members on different paths: unusable */
};

/* ---- reductions ---- */

/* Vectors of the target's register width: GCC lowers a generic vector wider
 * than the registers through the stack (a 64-byte vector on AVX2 was loaded
 * as two ymm, stored to the stack and written back as four xmm), which made
 * the sums and copies several times slower on CPUs without AVX-512. The
 * element-wise operations, so the bits, are the same at any width. */
#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
typedef float vf __attribute__((vector_size(VB)));
typedef double vd __attribute__((vector_size(VB)));
typedef uint64_t vu __attribute__((vector_size(VB)));

/* The copies. Out of another member's slot: copy_from_peer, register-wide
 * vector moves stored on register boundaries. From 4 KB up glibc's memcpy is
 * `rep movsb`, which on an AMD Zen 3 VM ran copies of lines last written by
 * the other member's core 3-4x slower than vector moves (1 MB all-reduce
 * 2.8-4.2 against 9.8 GB/s, docs/performance.md); aligning the stores (the
 * windows' pieces start anywhere) was 2-5% faster on an Intel Xeon (family 6
 * model 207). Every other copy (this member's memory into its slot or buffer)
 * is glibc's memcpy, called (copy_local: GCC otherwise inlined the 8 KB
 * accumulator's copies as `rep movsq`): from private memory the two were alike
 * on the Zen 3, and on that Xeon the all-reduce ran 6-10% faster at 1-16 MB
 * than with vector moves everywhere. */
static void __attribute__((noinline)) copy_local(void *d, const void *s, size_t n) { memcpy(d, s, n); }

static void copy_from_peer(void *d, const void *s, size_t n)
{
	uint8_t *D = d;
	const uint8_t *S = s;
	size_t i = (size_t)(-(uintptr_t)D & (VB - 1)); /* whole-register stores on register boundaries */
	if (i > n)
		i = n;
	memcpy(D, S, i);
	for (; i + 4 * VB <= n; i += 4 * VB) {
		vu a, b, x, y;
		memcpy(&a, S + i, VB);
		memcpy(&b, S + i + VB, VB);
		memcpy(&x, S + i + 2 * VB, VB);
		memcpy(&y, S + i + 3 * VB, VB);
		memcpy(D + i, &a, VB);
		memcpy(D + i + VB, &b, VB);
		memcpy(D + i + 2 * VB, &x, VB);
		memcpy(D + i + 3 * VB, &y, VB);
	}
	if (i < n)
		memcpy(D + i, S + i, n - i);
}

/* d[i] = a[i] op b[i] for n elements; d may be a or b. */
static void combine(void *d, const void *a, const void *b, size_t n, int dt, int op)
{
	uint8_t *D = d;
	const uint8_t *A = a, *B = b;
	size_t i = 0;
	if (op == ST_SUM && dt == ST_DTYPE_F32) {
		for (; i + VB / 4 <= n; i += VB / 4) {
			vf x, y;
			memcpy(&x, A + i * 4, VB);
			memcpy(&y, B + i * 4, VB);
			x += y;
			memcpy(D + i * 4, &x, VB);
		}
		for (; i < n; i++) {
			float x, y;
			memcpy(&x, A + i * 4, 4);
			memcpy(&y, B + i * 4, 4);
			x += y;
			memcpy(D + i * 4, &x, 4);
		}
	} else if (op == ST_SUM && dt == ST_DTYPE_F64) {
		for (; i + VB / 8 <= n; i += VB / 8) {
			vd x, y;
			memcpy(&x, A + i * 8, VB);
			memcpy(&y, B + i * 8, VB);
			x += y;
			memcpy(D + i * 8, &x, VB);
		}
		for (; i < n; i++) {
			double x, y;
			memcpy(&x, A + i * 8, 8);
			memcpy(&y, B + i * 8, 8);
			x += y;
			memcpy(D + i * 8, &x, 8);
		}
	} else if (op == ST_SUM) { /* i64, wrapping */
		for (; i + VB / 8 <= n; i += VB / 8) {
			vu x, y;
			memcpy(&x, A + i * 8, VB);
			memcpy(&y, B + i * 8, VB);
			x += y;
			memcpy(D + i * 8, &x, VB);
		}
		for (; i < n; i++) {
			uint64_t x, y;
			memcpy(&x, A + i * 8, 8);
			memcpy(&y, B + i * 8, 8);
			x += y;
			memcpy(D + i * 8, &x, 8);
		}
	} else if (dt == ST_DTYPE_F32) { /* max: NaN wins */
		for (; i < n; i++) {
			float x, y;
			memcpy(&x, A + i * 4, 4);
			memcpy(&y, B + i * 4, 4);
			if (y > x || y != y)
				x = y;
			memcpy(D + i * 4, &x, 4);
		}
	} else if (dt == ST_DTYPE_F64) {
		for (; i < n; i++) {
			double x, y;
			memcpy(&x, A + i * 8, 8);
			memcpy(&y, B + i * 8, 8);
			if (y > x || y != y)
				x = y;
			memcpy(D + i * 8, &x, 8);
		}
	} else {
		for (; i < n; i++) {
			int64_t x, y;
			memcpy(&x, A + i * 8, 8);
			memcpy(&y, B + i * 8, 8);
			if (y > x)
				x = y;
			memcpy(D + i * 8, &x, 8);
		}
	}
}

/* d1 (and d2 if not NULL) = ((src[0] op src[1]) op src[2]) ... for n
 * elements. An output may be one of the inputs (never partially overlapping). */
static void reduce(void *d1, void *d2, const void *const *src, int k, size_t n, int dt, int op)
{
	size_t esz = st_dtype_size(dt), bytes = n * esz;
	if (k == 1) {
		if (d1 != src[0])
			copy_local(d1, src[0], bytes);
		if (d2 && d2 != src[0])
			copy_local(d2, src[0], bytes);
		return;
	}
	if (k == 2 && !d2) {
		combine(d1, src[0], src[1], n, dt, op);
		return;
	}
	enum { BLK = 8192 };
	_Alignas(64) uint8_t acc[BLK];
	for (size_t o = 0; o < bytes; o += BLK) {
		size_t b = bytes - o < BLK ? bytes - o : BLK, e = b / esz;
		combine(acc, (const uint8_t *)src[0] + o, (const uint8_t *)src[1] + o, e, dt, op);
		for (int q = 2; q < k; q++)
			combine(acc, acc, (const uint8_t *)src[q] + o, e, dt, op);
		copy_local((uint8_t *)d1 + o, acc, b);
		if (d2)
			copy_local((uint8_t *)d2 + o, acc, b);
	}
}

/* ---- shared memory synchronization ---- */

static shm_line *line(st_comm *c, int l) { return (shm_line *)(c->shm + HDR_BYTES + (size_t)l * LINE); }

static void post(st_comm *c)
{
	shm_line *m = line(c, c->lidx[c->me]);
	c->seq++;
	atomic_store(&m->seq, c->seq);
	if (atomic_load(&m->waiters))
		syscall(SYS_futex, &m->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static int reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

/* Wait until every other member of my local group has posted target times:
 * spin (up to spin_ns), then yield (only when oversubscribed: yielding to an
 * unrelated busy process costs a whole time slice), then sleep on the futex,
 * checking the group's state between sleeps. */
static int wait_locals(st_comm *c, uint32_t target)
{
	st_group *g = c->g;
	int h = c->my_g;
	for (int k = 0; k < c->L; k++) {
		int x = c->gmem[c->gstart[h] + k];
		if (x == c->me)
			continue;
		shm_line *m = line(c, k);
		int64_t t0 = 0;
		for (unsigned i = 1;; i++) {
			if (reached(atomic_load_explicit(&m->seq, memory_order_acquire), target))
				goto next;
			cpu_relax();
			if ((i & 63) == 0) {
				int64_t now = st_mono_ns();
				if (!t0)
					t0 = now;
				else if (now - t0 > c->spin_ns)
					break;
			}
		}
		for (int i = 0;; i++) {
			if (atomic_load(&g->fail) || atomic_load(&g->peers[c->ranks[x]].left)) {
				/* what it posted before leaving still counts */
				if (reached(atomic_load(&m->seq), target))
					break;
				return st_group_need(g, c->ranks[x]);
			}
			if (i < c->yields) {
				sched_yield();
			} else {
				atomic_fetch_add(&m->waiters, 1);
				uint32_t v = atomic_load(&m->seq);
				if (!reached(v, target)) {
					struct timespec ts = { 0, 10 * 1000000 };
					syscall(SYS_futex, &m->seq, FUTEX_WAIT, v, &ts, NULL, 0);
				}
				atomic_fetch_sub(&m->waiters, 1);
			}
			if (reached(atomic_load_explicit(&m->seq, memory_order_acquire), target))
				break;
		}
	next:;
	}
	return 0;
}

/* ---- TCP exchanges ---- */

typedef struct xop {
	int peer, send, prev;
	uint8_t *p;
	size_t len, done;
} xop;

/* Progress all transfers at once (full duplex); per peer and direction in list order. */
static int xchg(st_comm *c, xop *ops, int nops)
{
	st_group *g = c->g;
	int left = 0;
	for (int a = 0; a < nops; a++) {
		ops[a].done = 0;
		ops[a].prev = -1;
		for (int b = a - 1; b >= 0; b--)
			if (ops[b].peer == ops[a].peer && ops[b].send == ops[a].send) {
				ops[a].prev = b;
				break;
			}
		left += ops[a].len > 0;
	}
	int64_t spin_until = 0;
	while (left > 0) {
		int progress = 0;
		for (int a = 0; a < nops; a++) {
			xop *o = &ops[a];
			if (o->done == o->len || (o->prev >= 0 && ops[o->prev].done < ops[o->prev].len))
				continue;
			int fd = c->dfd[o->peer];
			ssize_t r = o->send ? send(fd, o->p + o->done, o->len - o->done, MSG_DONTWAIT | MSG_NOSIGNAL)
					    : recv(fd, o->p + o->done, o->len - o->done, MSG_DONTWAIT);
			if (r > 0) {
				o->done += (size_t)r;
				progress = 1;
				left -= o->done == o->len;
				continue;
			}
			if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
				continue;
			/* end of stream or reset: the peer is gone */
			st_group_fail(g, atomic_load(&g->peers[c->ranks[o->peer]].left) ? R_LEFT : R_EXIT,
				      c->ranks[o->peer], g->rank);
			return st_group_check(g);
		}
		if (progress || left == 0) {
			spin_until = 0;
			continue;
		}
		if (atomic_load(&g->fail))
			return st_group_check(g);
		/* A peer on another CPU usually answers within microseconds: retry
		 * for a while before sleeping in poll, unless CPUs are oversubscribed. */
		if (c->spin_ns > 100000) {
			int64_t t = st_mono_ns();
			if (!spin_until)
				spin_until = t + c->spin_ns;
			if (t < spin_until)
				continue;
		}
		int np = 0;
		for (int a = 0; a < nops; a++) {
			xop *o = &ops[a];
			if (o->done == o->len || (o->prev >= 0 && ops[o->prev].done < ops[o->prev].len))
				continue;
			c->pf[np++] = (struct pollfd){ .fd = c->dfd[o->peer], .events = o->send ? POLLOUT : POLLIN };
		}
		c->pf[np++] = (struct pollfd){ .fd = g->fail_fd, .events = POLLIN };
		if (poll(c->pf, (nfds_t)np, 1000) < 0 && errno != EINTR)
			return st_fail(ST_EIO, "collective: poll: %s", strerror(errno));
	}
	return 0;
}

/* ---- the engine ---- */

typedef struct job {
	int mode, dt, op;
	int check; /* all-reduce, first window: every member must be on the slot path too */
	size_t esz;
	const uint8_t *in;
	uint8_t *out;
	int64_t total;
} job;

static const uint8_t *in_ptr(st_comm *c, const job *j, int i)
{
	if (j->mode == M_AG)
		return j->in + (size_t)c->lo[c->me] * j->esz;
	return j->in + (size_t)(c->off[i] + c->lo[i]) * j->esz;
}

static uint8_t *out_ptr(st_comm *c, const job *j, int i)
{
	if (j->mode == M_RS)
		return j->out + (size_t)c->lo[c->me] * j->esz;
	return j->out + (size_t)(c->off[i] + c->lo[i]) * j->esz;
}

static uint8_t *slot(st_comm *c, const job *j, int x, int par, int i)
{
	return c->slots + ((size_t)c->lidx[x] * 2 + (size_t)par) * c->W + (size_t)c->wofs[i] * j->esz;
}

/* The member of group h that reduces segment i there: i itself in its own
 * group, else the member at i's local index (modulo the group's size). */
static int handler(const st_comm *c, int h, int i)
{
	return c->grp[i] == h ? i : c->gmem[c->gstart[h] + c->lidx[i] % c->gsize[h]];
}

static void add_op(st_comm *c, int *nops, int peer, int send, const void *p, int64_t len, size_t esz)
{
	c->ops[*nops] = (xop){ .peer = peer, .send = send, .p = (uint8_t *)p, .len = (size_t)len * esz };
	(*nops)++;
}

static int same_path(st_comm *c, uint64_t mode);

static int window_reduce(st_comm *c, const job *j, int par)
{
	const int n = c->n, me = c->me, G = c->ngrp, L = c->L, my_g = c->my_g;
	const size_t esz = j->esz;
	const void *src[G > L ? G : L];
	int r;
	if (L > 1) {
		for (int i = 0; i < n; i++)
			if (c->len[i] && handler(c, my_g, i) != me)
				copy_local(slot(c, j, me, par, i), in_ptr(c, j, i), (size_t)c->len[i] * esz);
		post(c);
		if ((r = wait_locals(c, c->seq)) < 0 || (j->check && (r = same_path(c, 0)) < 0))
			return r;
	}
	/* group partials of the segments I handle */
	for (int i = 0; i < n; i++) {
		if (!c->len[i] || handler(c, my_g, i) != me)
			continue;
		for (int k = 0; k < L; k++) {
			int x = c->gmem[c->gstart[my_g] + k];
			src[k] = x == me ? (const void *)in_ptr(c, j, i) : (const void *)slot(c, j, x, par, i);
		}
		if (G == 1)
			reduce(out_ptr(c, j, me), j->mode == M_AR && L > 1 ? slot(c, j, me, par, me) : NULL, src, L,
			       (size_t)c->len[i], j->dt, j->op);
		else if (L > 1)
			reduce(slot(c, j, me, par, i), NULL, src, L, (size_t)c->len[i], j->dt, j->op);
	}
	if (G == 1)
		return 0;
	/* partials to the owners; the others' partials of my segment */
	int nops = 0;
	for (int i = 0; i < n; i++)
		if (c->len[i] && handler(c, my_g, i) == me && c->grp[i] != my_g)
			add_op(c, &nops, i, 1, L > 1 ? (const void *)slot(c, j, me, par, i) : (const void *)in_ptr(c, j, i),
			       c->len[i], esz);
	if (c->len[me])
		for (int h = 0, k = 0; h < G; h++)
			if (h != my_g)
				add_op(c, &nops, handler(c, h, me), 0, c->scratch + (size_t)k++ * c->W, c->len[me], esz);
	if ((r = xchg(c, c->ops, nops)) < 0)
		return r;
	if (c->len[me]) {
		for (int h = 0, k = 0; h < G; h++)
			src[h] = h == my_g ? (L > 1 ? (const void *)slot(c, j, me, par, me) : (const void *)in_ptr(c, j, me))
					   : (const void *)(c->scratch + (size_t)k++ * c->W);
		reduce(out_ptr(c, j, me), j->mode == M_AR && L > 1 ? slot(c, j, me, par, me) : NULL, src, G,
		       (size_t)c->len[me], j->dt, j->op);
	}
	if (j->mode != M_AR)
		return 0;
	/* final pieces back to the handlers */
	nops = 0;
	if (c->len[me])
		for (int h = 0; h < G; h++)
			if (h != my_g)
				add_op(c, &nops, handler(c, h, me), 1, out_ptr(c, j, me), c->len[me], esz);
	for (int i = 0; i < n; i++)
		if (c->len[i] && handler(c, my_g, i) == me && c->grp[i] != my_g)
			add_op(c, &nops, i, 0, L > 1 ? slot(c, j, me, par, i) : out_ptr(c, j, i), c->len[i], esz);
	return xchg(c, c->ops, nops);
}

static int window_gather(st_comm *c, const job *j, int par)
{
	const int n = c->n, me = c->me, G = c->ngrp, L = c->L, my_g = c->my_g;
	const size_t esz = j->esz;
	int r;
	if (c->len[me]) {
		size_t b = (size_t)c->len[me] * esz;
		if (L > 1)
			copy_local(slot(c, j, me, par, me), in_ptr(c, j, me), b);
		if (out_ptr(c, j, me) != in_ptr(c, j, me))
			memmove(out_ptr(c, j, me), in_ptr(c, j, me), b);
	}
	if (G > 1) {
		int nops = 0;
		if (c->len[me])
			for (int h = 0; h < G; h++)
				if (h != my_g)
					add_op(c, &nops, handler(c, h, me), 1, in_ptr(c, j, me), c->len[me], esz);
		for (int i = 0; i < n; i++)
			if (c->len[i] && handler(c, my_g, i) == me && c->grp[i] != my_g)
				add_op(c, &nops, i, 0, L > 1 ? slot(c, j, me, par, i) : out_ptr(c, j, i), c->len[i], esz);
		if ((r = xchg(c, c->ops, nops)) < 0)
			return r;
	}
	return 0;
}

/* This process's collectives, for a step watchdog (st_comm_activity):
 * how many threads are inside one, and when one last began or ended. */
static atomic_int act_inside;
static _Atomic int64_t act_last_ns;

static void act_enter(void)
{
	atomic_fetch_add(&act_inside, 1);
	atomic_store(&act_last_ns, st_mono_ns());
}

static int act_leave(int r)
{
	atomic_store(&act_last_ns, st_mono_ns());
	atomic_fetch_sub(&act_inside, 1);
	return r;
}

void st_comm_activity(int *inside, int64_t *last_ns)
{
	*inside = atomic_load(&act_inside);
	*last_ns = atomic_load(&act_last_ns);
}

static int usable(st_comm *c)
{
	if (c->broken)
		return st_fail(ST_EINVAL, "collective: this communicator saw a mismatched all-reduce and is unusable");
	return st_group_check(c->g);
}

static int run_windows(st_comm *c, const job *j, const int64_t *cnt)
{
	const int n = c->n;
	int r;
	if ((r = usable(c)) < 0)
		return r;
	int64_t total = 0;
	for (int i = 0; i < n; i++) {
		c->cnt[i] = cnt[i];
		c->off[i] = total;
		total += cnt[i];
	}
	if (total == 0)
		return 0;
	int64_t wel = (int64_t)(c->W / j->esz) - n;
	if (wel < 1)
		return st_fail(ST_EINVAL, "collective: %d members do not fit a %zu-byte window", n, c->W);
	int64_t nw = (total + wel - 1) / wel;
	job jw = *j;
	jw.check = j->mode == M_AR && c->L > 1;
	j = &jw;
	if (jw.check)
		atomic_store(&line(c, c->lidx[c->me])->mode, 0);
	for (int64_t w = 0; w < nw; w++, jw.check = 0) {
		int64_t acc = 0;
		for (int i = 0; i < n; i++) {
			int64_t a = (int64_t)((__int128)c->cnt[i] * w / nw);
			int64_t b = (int64_t)((__int128)c->cnt[i] * (w + 1) / nw);
			c->lo[i] = a;
			c->len[i] = b - a;
			c->wofs[i] = acc;
			acc += b - a;
		}
		int par = (int)(c->nwin++ & 1);
		if (c->L > 1 && (r = wait_locals(c, c->last_done[par])) < 0)
			return r;
		r = j->mode == M_AG ? window_gather(c, j, par) : window_reduce(c, j, par);
		if (r < 0)
			return r;
		if (c->L > 1 && j->mode != M_RS) {
			/* the finals are in the handlers' slots */
			post(c);
			if ((r = wait_locals(c, c->seq)) < 0)
				return r;
			for (int i = 0; i < n; i++) {
				if (!c->len[i] || i == c->me)
					continue;
				int y = handler(c, c->my_g, i);
				copy_from_peer(out_ptr(c, j, i), slot(c, j, y, par, i), (size_t)c->len[i] * j->esz);
			}
		}
		if (c->L > 1) {
			post(c);
			c->last_done[par] = c->seq;
		}
	}
	return 0;
}

static int run(st_comm *c, const job *j, const int64_t *cnt)
{
	act_enter();
	return act_leave(run_windows(c, j, cnt));
}

/* After the first post of an all-reduce: did every local member take the
 * path I took (mode: as published in my line)? A member on the other path
 * would read slots nobody filled or write into memory nobody expects. */
static int same_path(st_comm *c, uint64_t mode)
{
	for (int k = 0; k < c->L; k++)
		if (atomic_load(&line(c, k)->mode) != mode) {
			c->broken = 1;
			return st_fail(ST_EINVAL, "allreduce: members disagree on the buffer (one shared with "
						  "st_comm_share, one not, or at different offsets); the communicator "
						  "is unusable now");
		}
	return 0;
}

/* The region of st_comm_share that holds [buf, buf + bytes), or -1. */
static int find_shared(const st_comm *c, const void *buf, size_t bytes)
{
	const uint8_t *b = buf;
	for (int x = 0; x < c->nsh; x++)
		if (b >= c->sh[x].base && bytes <= c->sh[x].len && (size_t)(b - c->sh[x].base) <= c->sh[x].len - bytes)
			return x;
	return -1;
}

/* All-reduce of a buffer every local member shared with st_comm_share, one
 * local group only: after a barrier (everyone's input is in place), member i
 * reduces segment i reading all members' regions directly, in member order
 * (the bits of the slot path), and writes the result into all of them; a
 * second barrier and every member holds every sum. No copies into slots
 * and out again: each member reads its segment once from each region and
 * writes it once into each. */
static int allreduce_shared(st_comm *c, int x, size_t off, int64_t count, int dt, int op)
{
	const int L = c->L, me = c->me;
	const size_t esz = st_dtype_size(dt);
	uint64_t mode = (uint64_t)(x + 1) << 48 | off;
	atomic_store(&line(c, c->lidx[me])->mode, mode);
	post(c);
	int r = wait_locals(c, c->seq);
	if (r < 0 || (r = same_path(c, mode)) < 0)
		return r;
	int64_t lo = (int64_t)((__int128)count * me / c->n), hi = (int64_t)((__int128)count * (me + 1) / c->n);
	size_t o0 = off + (size_t)lo * esz, bytes = (size_t)(hi - lo) * esz;
	enum { BLK = 8192 };
	_Alignas(64) uint8_t acc[BLK];
	for (size_t o = 0; o < bytes; o += BLK) {
		size_t b = bytes - o < BLK ? bytes - o : BLK, e = b / esz;
		uint8_t *const *at = c->sh[x].at;
		combine(acc, at[0] + o0 + o, at[1] + o0 + o, e, dt, op);
		for (int k = 2; k < L; k++)
			combine(acc, acc, at[k] + o0 + o, e, dt, op);
		for (int k = 0; k < L; k++)
			copy_local(at[k] + o0 + o, acc, b);
	}
	post(c);
	return wait_locals(c, c->seq);
}

int st_comm_share(st_comm *c, void *buf, size_t bytes)
{
	long pg = sysconf(_SC_PAGESIZE);
	if (!buf || bytes == 0 || (uintptr_t)buf % (uintptr_t)pg)
		return st_fail(ST_EINVAL, "comm_share: the buffer must be non-empty and start on a page boundary");
	if (c->n == 1 || c->L < 2 || c->ngrp > 1)
		return st_group_check(c->g); /* nothing to share: collectives take their usual path */
	size_t len = (bytes + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
	for (int x = 0; x < c->nsh; x++)
		if ((uint8_t *)buf < c->sh[x].base + c->sh[x].len && c->sh[x].base < (uint8_t *)buf + len)
			return st_fail(ST_EINVAL, "comm_share: the buffer overlaps one shared before");
	shared *grown = realloc(c->sh, sizeof(shared) * (size_t)(c->nsh + 1));
	if (!grown)
		return st_fail(ST_ENOMEM, "comm_share: out of memory");
	c->sh = grown;
	shared *s = &c->sh[c->nsh];
	*s = (shared){ .base = buf, .len = len, .at = calloc((size_t)c->L, sizeof(uint8_t *)) };
	if (!s->at)
		return st_fail(ST_ENOMEM, "comm_share: out of memory");
	int r, fd = memfd_create("slicetrain-shared", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		r = st_fail(ST_EIO, "comm_share: shared memory of %zu bytes: %s", len, strerror(errno));
		goto out;
	}
	/* the contents into the new pages, which then replace the old ones at the same address */
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = st_fail(ST_EIO, "comm_share: cannot map %zu bytes: %s", len, strerror(errno));
		goto out;
	}
	memcpy(p, buf, len);
	if (mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, buf) == MAP_FAILED) {
		r = st_fail(ST_EIO, "comm_share: cannot put the shared pages in place: %s", strerror(errno));
		munmap(p, len);
		goto out;
	}
	s->at[c->lidx[c->me]] = buf;
	uint64_t key = st_fnv1a(c->key, "share", 5);
	key = st_fnv1a(key, &c->nsh, sizeof(c->nsh)) | 1;
	for (int k = 0; k < c->L; k++) {
		int y = c->gmem[c->gstart[c->my_g] + k];
		if (y != c->me && (r = st_group_send_fd(c->g, c->ranks[y], key, fd)) < 0)
			goto out;
	}
	for (int k = 0; k < c->L; k++) {
		int y = c->gmem[c->gstart[c->my_g] + k], pfd;
		if (y == c->me)
			continue;
		if ((r = st_group_take_mail(c->g, F_FD, key, c->ranks[y], &pfd)) < 0)
			goto out;
		struct stat st;
		void *q = MAP_FAILED;
		if (fstat(pfd, &st) == 0 && (size_t)st.st_size == len)
			q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
		close(pfd);
		if (q == MAP_FAILED) {
			r = st_fail(ST_EPEER, "comm_share: rank %d shared %lld bytes, this member %zu (or mapping failed)",
				    c->ranks[y], (long long)st.st_size, len);
			goto out;
		}
		s->at[k] = q;
	}
	c->nsh++;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (r < 0) {
		for (int k = 0; k < c->L; k++)
			if (s->at[k] && k != c->lidx[c->me])
				munmap(s->at[k], len);
		free(s->at);
	}
	return r;
}

/* ---- API ---- */

static int check_dt(int dt, int op)
{
	if (dt != ST_DTYPE_F32 && dt != ST_DTYPE_F64 && dt != ST_DTYPE_I64)
		return st_fail(ST_EINVAL, "collective: unknown data type %d", dt);
	if (op != ST_SUM && op != ST_MAX)
		return st_fail(ST_EINVAL, "collective: unknown reduction %d", op);
	return 0;
}

int st_comm_allreduce(st_comm *c, void *buf, int64_t count, enum st_dtype dt, enum st_redop op)
{
	int r = check_dt(dt, op);
	if (r < 0)
		return r;
	if (count < 0 || (count > 0 && !buf))
		return st_fail(ST_EINVAL, "allreduce: bad buffer or count %lld", (long long)count);
	if (c->n == 1 || count == 0)
		return c->n == 1 ? 0 : st_group_check(c->g);
	size_t esz = st_dtype_size(dt);
	int x = c->nsh ? find_shared(c, buf, (size_t)count * esz) : -1;
	if (x >= 0) {
		if ((r = usable(c)) < 0)
			return r;
		act_enter();
		return act_leave(allreduce_shared(c, x, (size_t)((uint8_t *)buf - c->sh[x].base), count, dt, op));
	}
	job j = { .mode = M_AR, .dt = dt, .op = op, .esz = esz, .in = buf, .out = buf };
	for (int i = 0; i < c->n; i++)
		c->cnt[i] = (int64_t)((__int128)count * (i + 1) / c->n - (__int128)count * i / c->n);
	return run(c, &j, c->cnt);
}

/* Sum of per-member counts; a negative one is ST_EINVAL naming the call. */
static int sum_counts(const st_comm *c, const int64_t *counts, const char *what, int64_t *total)
{
	*total = 0;
	for (int i = 0; i < c->n; i++) {
		if (counts[i] < 0)
			return st_fail(ST_EINVAL, "%s: counts[%d] = %lld is negative", what, i, (long long)counts[i]);
		*total += counts[i];
	}
	return 0;
}

int st_comm_reduce_scatter(st_comm *c, const void *in, void *out, const int64_t *counts, enum st_dtype dt)
{
	int r = check_dt(dt, ST_SUM);
	if (r < 0)
		return r;
	int64_t total;
	if ((r = sum_counts(c, counts, "reduce_scatter", &total)) < 0)
		return r;
	if ((total > 0 && !in) || (counts[c->me] > 0 && !out))
		return st_fail(ST_EINVAL, "reduce_scatter: NULL buffer");
	size_t esz = st_dtype_size(dt);
	if (c->n == 1) {
		if (out != in && counts[0])
			memmove(out, in, (size_t)counts[0] * esz);
		return 0;
	}
	job j = { .mode = M_RS, .dt = dt, .op = ST_SUM, .esz = esz, .in = in, .out = out };
	return run(c, &j, counts);
}

int st_comm_allgather(st_comm *c, const void *in, void *out, const int64_t *counts, enum st_dtype dt)
{
	int r = check_dt(dt, ST_SUM);
	if (r < 0)
		return r;
	int64_t total;
	if ((r = sum_counts(c, counts, "allgather", &total)) < 0)
		return r;
	if ((total > 0 && !out) || (counts[c->me] > 0 && !in))
		return st_fail(ST_EINVAL, "allgather: NULL buffer");
	size_t esz = st_dtype_size(dt);
	if (c->n == 1) {
		if (out != in && counts[0])
			memmove(out, in, (size_t)counts[0] * esz);
		return 0;
	}
	job j = { .mode = M_AG, .dt = dt, .op = ST_SUM, .esz = esz, .in = in, .out = out };
	return run(c, &j, counts);
}

int st_comm_broadcast(st_comm *c, void *buf, size_t bytes, int root)
{
	if (root < 0 || root >= c->n)
		return st_fail(ST_EINVAL, "broadcast: root %d is not a member (size %d)", root, c->n);
	if (bytes > 0 && !buf)
		return st_fail(ST_EINVAL, "broadcast: NULL buffer");
	if (c->n == 1 || bytes == 0)
		return c->n == 1 ? 0 : st_group_check(c->g);
	for (int i = 0; i < c->n; i++)
		c->cnt[i] = i == root ? (int64_t)bytes : 0;
	/* bytes move as 1-byte elements; nothing is reduced */
	job j = { .mode = M_AG, .dt = ST_DTYPE_F32, .op = ST_SUM, .esz = 1, .in = buf, .out = buf };
	return run(c, &j, c->cnt);
}

int st_comm_barrier(st_comm *c)
{
	int64_t one = 1;
	return st_comm_allreduce(c, &one, 1, ST_DTYPE_I64, ST_SUM);
}

int st_comm_rank(const st_comm *c) { return c->me; }
int st_comm_size(const st_comm *c) { return c->n; }
st_comm *st_comm_next(st_comm *c) { return c->next; }

/* ---- create / free ---- */

void st_comm_destroy(st_comm *c)
{
	if (!c)
		return;
	if (c->dfd)
		for (int i = 0; i < c->n; i++)
			if (c->dfd[i] >= 0)
				close(c->dfd[i]);
	if (c->shm)
		munmap(c->shm, c->shm_len);
	for (int x = 0; x < c->nsh; x++) {
		for (int k = 0; k < c->L; k++)
			if (c->sh[x].at[k] && k != c->lidx[c->me])
				munmap(c->sh[x].at[k], c->sh[x].len);
		free(c->sh[x].at);
	}
	free(c->sh);
	free(c->scratch);
	free(c->ranks);
	free(c->grp);
	free(c->lidx);
	free(c->gsize);
	free(c->gstart);
	free(c->gmem);
	free(c->dfd);
	free(c->cnt);
	free(c->off);
	free(c->lo);
	free(c->len);
	free(c->wofs);
	free(c->ops);
	free(c->pf);
	free(c);
}

void st_comm_free(st_comm *c)
{
	if (!c)
		return;
	st_group *g = c->g;
	pthread_mutex_lock(&g->mu);
	if (c->prev)
		c->prev->next = c->next;
	else
		g->comms = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&g->mu);
	st_comm_destroy(c);
}

static int setup_shm(st_comm *c, uint64_t key)
{
	st_group *g = c->g;
	int leader = c->gmem[c->gstart[c->my_g]];
	size_t lines = ((size_t)c->L * LINE + 4095) & ~(size_t)4095;
	c->shm_len = HDR_BYTES + lines + (size_t)c->L * 2 * c->W;
	int fd = -1, r;
	if (leader == c->me) {
		fd = memfd_create("slicetrain-comm", MFD_CLOEXEC);
		if (fd < 0)
			return st_fail(ST_EIO, "comm: memfd_create: %s", strerror(errno));
		if (ftruncate(fd, (off_t)c->shm_len) < 0) {
			r = st_fail(ST_EIO, "comm: cannot size shared memory (%zu bytes): %s", c->shm_len, strerror(errno));
			close(fd);
			return r;
		}
	} else {
		if ((r = st_group_take_mail(g, F_FD, key, c->ranks[leader], &fd)) < 0)
			return r;
		struct stat st;
		if (fstat(fd, &st) < 0 || (size_t)st.st_size != c->shm_len) {
			close(fd);
			return st_fail(ST_EPEER, "comm: shared memory from rank %d has the wrong size", c->ranks[leader]);
		}
	}
	void *p = mmap(NULL, c->shm_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (p == MAP_FAILED) {
		r = st_fail(ST_EIO, "comm: cannot map %zu bytes of shared memory: %s", c->shm_len, strerror(errno));
		close(fd);
		return r;
	}
	c->shm = p;
	c->slots = c->shm + HDR_BYTES + lines;
	shm_hdr *h = (shm_hdr *)c->shm;
	if (leader == c->me) {
		h->key = key;
		h->window = c->W;
		h->n = (uint32_t)c->n;
		h->nlocal = (uint32_t)c->L;
		h->magic = SHM_MAGIC;
		for (int k = 1; k < c->L; k++) {
			int x = c->gmem[c->gstart[c->my_g] + k];
			if ((r = st_group_send_fd(g, c->ranks[x], key, fd)) < 0) {
				close(fd);
				return r;
			}
		}
	} else if (h->magic != SHM_MAGIC || h->key != key || h->window != c->W || h->n != (uint32_t)c->n ||
		   h->nlocal != (uint32_t)c->L) {
		close(fd);
		return st_fail(ST_EPEER, "comm: shared memory from rank %d does not match this communicator",
			       c->ranks[leader]);
	}
	close(fd);
	return 0;
}

int st_comm_create(st_comm **out, st_group *g, int n, const int *ranks)
{
	int r, me = -1;
	*out = NULL;
	if (n < 1 || n > g->size || !ranks)
		return st_fail(ST_EINVAL, "comm: %d members for a group of %d", n, g->size);
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= g->size)
			return st_fail(ST_EINVAL, "comm: member %d is rank %d, outside the group of %d", i, ranks[i], g->size);
		for (int k = 0; k < i; k++)
			if (ranks[k] == ranks[i])
				return st_fail(ST_EINVAL, "comm: rank %d is listed twice", ranks[i]);
		if (ranks[i] == g->rank)
			me = i;
	}
	if (me < 0)
		return st_fail(ST_EINVAL, "comm: this process (rank %d) is not a member", g->rank);
	if ((r = st_group_check(g)) < 0)
		return r;
	st_comm *c = calloc(1, sizeof(*c));
	if (!c)
		return st_fail(ST_ENOMEM, "comm: out of memory");
	c->g = g;
	c->n = n;
	c->me = me;
	c->W = (size_t)g->window_bytes;
	size_t nn = (size_t)n;
	c->ranks = malloc(sizeof(int) * nn);
	c->grp = malloc(sizeof(int) * nn);
	c->lidx = malloc(sizeof(int) * nn);
	c->gsize = calloc(nn, sizeof(int));
	c->gstart = calloc(nn, sizeof(int));
	c->gmem = malloc(sizeof(int) * nn);
	c->dfd = malloc(sizeof(int) * nn);
	c->cnt = malloc(sizeof(int64_t) * nn);
	c->off = malloc(sizeof(int64_t) * nn);
	c->lo = malloc(sizeof(int64_t) * nn);
	c->len = malloc(sizeof(int64_t) * nn);
	c->wofs = malloc(sizeof(int64_t) * nn);
	c->ops = malloc(sizeof(xop) * 2 * nn);
	c->pf = malloc(sizeof(struct pollfd) * (2 * nn + 1));
	if (!c->ranks || !c->grp || !c->lidx || !c->gsize || !c->gstart || !c->gmem || !c->dfd || !c->cnt || !c->off ||
	    !c->lo || !c->len || !c->wofs || !c->ops || !c->pf) {
		st_comm_destroy(c);
		return st_fail(ST_ENOMEM, "comm: out of memory");
	}
	memcpy(c->ranks, ranks, sizeof(int) * nn);
	/* local groups: same host and slice, in order of first appearance */
	for (int i = 0; i < n; i++) {
		c->dfd[i] = -1;
		const st_peer *pi = &g->peers[ranks[i]];
		c->grp[i] = -1;
		if (g->use_shm)
			for (int k = 0; k < i; k++) {
				const st_peer *pk = &g->peers[ranks[k]];
				if (pk->host == pi->host && pk->slice == pi->slice) {
					c->grp[i] = c->grp[k];
					break;
				}
			}
		if (c->grp[i] < 0)
			c->grp[i] = c->ngrp++;
		c->lidx[i] = c->gsize[c->grp[i]]++;
	}
	for (int h = 1; h < c->ngrp; h++)
		c->gstart[h] = c->gstart[h - 1] + c->gsize[h - 1];
	for (int i = 0; i < n; i++)
		c->gmem[c->gstart[c->grp[i]] + c->lidx[i]] = i;
	c->my_g = c->grp[me];
	c->L = c->gsize[c->my_g];
	/* Spinning pays while every process of the group on this host has a
	 * CPU; otherwise it steals the time slice of the one we wait for. */
	int crowded = g->host_procs > g->host_cpus;
	c->spin_ns = crowded ? 2000 : 1000000;
	c->yields = crowded ? 2 : 0;

	uint64_t lh = st_fnv1a(ST_FNV_INIT, &g->nonce, sizeof(g->nonce));
	lh = st_fnv1a(lh, &n, sizeof(n));
	lh = st_fnv1a(lh, ranks, sizeof(int) * nn);
	uint64_t seq = st_group_next_comm_seq(g, lh);
	uint64_t key = st_fnv1a(lh, &seq, sizeof(seq)) | 1;
	c->key = key;

	if (n > 1 && c->ngrp > 1) {
		c->scratch = aligned_alloc(64, (size_t)(c->ngrp - 1) * c->W);
		if (!c->scratch) {
			st_comm_destroy(c);
			return st_fail(ST_ENOMEM, "comm: out of memory for %d x %zu bytes", c->ngrp - 1, c->W);
		}
		/* connect first (completes against the listen backlog), then accept */
		for (int pass = 0; pass < 2; pass++)
			for (int x = 0; x < n; x++) {
				if (c->grp[x] == c->my_g)
					continue;
				if (handler(c, c->grp[x], me) != x && handler(c, c->my_g, x) != me)
					continue;
				int connect_ = g->rank < ranks[x];
				if (pass == 0 && connect_)
					r = st_group_connect_data(g, ranks[x], key, &c->dfd[x]);
				else if (pass == 1 && !connect_)
					r = st_group_take_mail(g, F_HELLO_DATA, key, ranks[x], &c->dfd[x]);
				else
					continue;
				if (r < 0) {
					st_comm_destroy(c);
					return r;
				}
			}
	}
	if (n > 1 && c->L > 1 && (r = setup_shm(c, key)) < 0) {
		st_comm_destroy(c);
		return r;
	}
	pthread_mutex_lock(&g->mu);
	c->next = g->comms;
	if (g->comms)
		g->comms->prev = c;
	g->comms = c;
	pthread_mutex_unlock(&g->mu);
	*out = c;
	return 0;
}
