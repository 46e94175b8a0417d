/*
 * comm.h - the worker group and its collectives.
 *
 * One process per device. A process joins its group with st_group_join(),
 * which reads its place from the environment (see st_group_env below, and
 * docs/distributed.md for the variables and their precedence), meets the
 * others through a small rendezvous store (hosted by rank 0 or at a given
 * address), and sets up transports: shared memory between processes of the
 * same host and slice, TCP between hosts and always between slices.
 *
 *   st_group *g;
 *   rc = st_group_join(&g, &opts);                  // opts may be NULL: defaults + environment
 *   int ranks[] = {0, 1};
 *   st_comm *c;
 *   rc = st_comm_create(&c, g, 2, ranks);           // collective over the members
 *   rc = st_comm_allreduce(c, buf, n, ST_DTYPE_F32, ST_SUM);
 *   st_comm_free(c);
 *   st_group_leave(g);
 *
 * Determinism: every reduction adds contributions in an order fixed by the
 * members' positions in the communicator, never by arrival time, and every
 * member ends with bit-identical results.
 *
 * Failure: any wait is bounded. If a peer dies or stops answering, every
 * call on every other rank returns ST_EPEER within opts.timeout_ms (default
 * 5000) with a message naming the peer; the group is then unusable and must
 * be left (st_group_leave never blocks longer than the timeout). Nothing is
 * global: several groups may exist in one process (the elastic layer builds
 * a new one after a failure in the same process).
 */
#ifndef ST_COMM_COMM_H
#define ST_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h" /* collectives take ST_DTYPE_F32, ST_DTYPE_F64 and ST_DTYPE_I64 */

typedef struct st_group st_group;
typedef struct st_comm st_comm;

enum st_redop { ST_SUM, ST_MAX };

/* Where a process is, as read from the environment (or set by hand). */
typedef struct st_group_env {
	int rank, world_size;       /* global rank, slice-major */
	int num_slices, slice_id;   /* slice_id = rank / (world_size / num_slices) unless given */
	int local_rank;             /* index among this host's processes (informational) */
	char coordinator[256];      /* "host:port" of the rendezvous store */
	const char *source;         /* which convention supplied it (a static string): "slicetrain", "torchrun", "jax", "slurm", "single" */
} st_group_env;

/* Read the environment. With no variables set: a single process (rank 0 of 1).
 * Malformed or inconsistent values: ST_EINVAL naming the variable. */
int st_group_env_read(st_group_env *e);

/*
 * What the elastic launcher's agent tells a worker besides its place
 * (docs/elastic.md); none of it set: not under the elastic launcher.
 *   SLICETRAIN_GENERATION           the group's generation (logs; metrics_file appended to)
 *   SLICETRAIN_JOIN=1               this worker joins a running group: a peer sends it the state
 *   SLICETRAIN_ELASTIC_MAX_DEVICES  the group's device count at its maximum size (the global batch)
 *   SLICETRAIN_CONTROL_FD           the agent's control channel (elastic/worker.h); unset once
 *                                   read, so that processes this one starts do not inherit it
 *   SLICETRAIN_STEP_WATCHDOG_MS     the step watchdog's floor (train/watchdog.h), 100..3600000;
 *                                   unset or 0: no watchdog
 */
typedef struct st_elastic_env {
	long long generation;  /* -1: not set */
	int joiner;            /* SLICETRAIN_JOIN=1 */
	long long max_devices; /* 0: not set */
	int control_fd;        /* -1: not set */
	int watchdog_ms;       /* 0: not set */
} st_elastic_env;

/* Read once per process, at the trainer's start. Malformed values: ST_EINVAL
 * naming the variable. */
int st_elastic_env_read(st_elastic_env *e);

typedef struct st_group_opts {
	int timeout_ms;   /* failure detection bound; 0 = SLICETRAIN_COMM_TIMEOUT_MS, else 5000 */
	int use_shm;      /* 1 (default when 0 is not forced by -1): shared memory inside a host and slice */
	const st_group_env *env; /* NULL: st_group_env_read(); only read during st_group_join */
	int join_timeout_ms; /* how long join waits for the others; 0 = SLICETRAIN_JOIN_TIMEOUT_MS, else 300000 */
	long long generation; /* the elastic generation (st_group_abort_gen); 0: none */
} st_group_opts;

int st_group_join(st_group **out, const st_group_opts *opts);
int st_group_rank(const st_group *g);
int st_group_size(const st_group *g);
int st_group_slice(const st_group *g, int rank);   /* slice of any rank */
int st_group_num_slices(const st_group *g);
/* Leave: close transports, release shared memory, stop the store if hosted,
 * and free g. Communicators still open are freed too: g's pointer and theirs
 * become invalid. Never blocks on peers; fine after a failure, and on NULL. */
void st_group_leave(st_group *g);
/* 0 while the group is healthy, else the error every call now returns
 * (ST_EPEER naming the failed rank, or ST_EINTR after st_group_abort). */
int st_group_status(const st_group *g);
/* Make every pending and later collective of this group return ST_EINTR at
 * once, and tell the peers (theirs return ST_EPEER). Async-signal-safe:
 * may be called from a signal handler or another thread. */
void st_group_abort(st_group *g);
/*
 * The elastic controller's abort (docs/hosts.md, "Failure detection"): the
 * group of generation gen or older, in this process, gives up the
 * collectives in flight at once (they return ST_EPEER: "the controller
 * re-forms the group"), so that a worker blocked on a silent or hung peer
 * re-forms without waiting out a timeout. Async-signal-safe (a handler of
 * the agent's ST_SIG_ABORT calls it with the signal's value); a group of a
 * newer generation is not touched. st_group_abort_init makes the eventfd it
 * writes (once per process; 0 or ST_EIO).
 */
int st_group_abort_init(void);
void st_group_abort_gen(long long gen);

/* This process's collectives, for a step watchdog (train/watchdog.h):
 * *inside, how many threads are in one now (waiting on peers or moving
 * data); *last_ns, when one last began or ended (st_mono_ns; 0: none yet). */
void st_comm_activity(int *inside, int64_t *last_ns);

/* A communicator over members ranks[0..n-1] (distinct global ranks; every
 * member calls with the same list). The caller's position in the list is its
 * rank in the communicator. n == 1 gives a trivial communicator. */
int st_comm_create(st_comm **out, st_group *g, int n, const int *ranks);
int st_comm_rank(const st_comm *c);
int st_comm_size(const st_comm *c);
void st_comm_free(st_comm *c);

/*
 * Collectives. Every member calls the same collectives on a communicator in
 * the same order, with the same count(s) and type. Different communicators
 * may be used from different threads at once; one communicator from one
 * thread at a time. Errors: ST_EINVAL for bad arguments (nothing was sent),
 * ST_EPEER / ST_EINTR once the group failed or was aborted.
 */
/* In place over count elements. */
int st_comm_allreduce(st_comm *c, void *buf, int64_t count, enum st_dtype dt, enum st_redop op);
/* in: the concatenation of size chunks, chunk i of counts[i] elements;
 * out: this member's chunk, reduced (sum). counts[i] may differ per chunk
 * (and be 0), but every member passes the same counts. out may be disjoint
 * from in, or exactly this member's chunk inside in. */
int st_comm_reduce_scatter(st_comm *c, const void *in, void *out, const int64_t *counts,
			   enum st_dtype dt);
/* in: this member's counts[rank] elements; out: the concatenation of all
 * chunks. in may be disjoint from out, or exactly this member's chunk in out. */
int st_comm_allgather(st_comm *c, const void *in, void *out, const int64_t *counts,
		      enum st_dtype dt);
int st_comm_broadcast(st_comm *c, void *buf, size_t bytes, int root);
/* Share [buf, buf + bytes) with the members on this host and slice, so that
 * an all-reduce of a buffer inside it reads the others' inputs and writes
 * the sums straight into their memory, with no copies through the
 * communicator's slots (twice the busbw of the plain path at 4-16 MB on two
 * cores, docs/performance.md). buf starts on a page boundary and the caller
 * owns every page it touches (st_pages_alloc's buffers); the pages are
 * replaced, in place and with their contents, by shared ones, which stay
 * valid after st_comm_free (the others' mappings of them end there).
 * Collective: every member calls it, in the same order, with the same
 * bytes, and from then on all-reduces the same parts of the regions (a
 * member whose buffer is shared while another's is not: ST_EINVAL on all).
 * Only communicators within one host and slice share; elsewhere this
 * returns 0 and changes nothing. */
int st_comm_share(st_comm *c, void *buf, size_t bytes);
int st_comm_barrier(st_comm *c);

#endif
