/*
 * comm_int.h - internals shared by the files of src/comm (not an API).
 *
 * net.c    socket helpers (net.h: public, the elastic layer uses them too)
 * auth.c   the run token and the connection handshake (auth.h: public)
 * store.c  the rendezvous store (store.h)
 * frame.c  control frames, hellos and the acceptor's handshake, as pure
 *          functions (frame.h; fuzz/fuzz_frame.c)
 * env.c    st_group_env_read: one table entry per launcher convention
 * group.c  join (meeting through the store, control connections), leave,
 *          the monitor thread (heartbeats, accepts, mailbox)
 * comm.c   communicators and collectives
 * mesh.c   the device mesh and its per-axis communicators (mesh.h; uses
 *          only the public API, not this file)
 */
#ifndef ST_COMM_INT_H
#define ST_COMM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"

#include "comm/auth.h"
#include "comm/comm.h"
#include "comm/frame.h"
#include "comm/store.h"

#include "comm/net.h"

/* frames on control sockets and in hellos (st_frame, F_*): comm/frame.h */

/* ---- failure state ---- */

enum {
	R_NONE = 0,
	R_EXIT,   /* closed its connection: exited, killed or crashed */
	R_HB,     /* stopped answering heartbeats (stopped, hung, partitioned) */
	R_LEFT,   /* called st_group_leave */
	R_ABORT,  /* called st_group_abort */
	R_JOIN,   /* did not join in time */
	R_CTL,    /* the elastic controller re-forms the group (st_group_abort_gen) */
};

/* ---- the group ---- */

typedef struct st_peer {
	int slice, host, pid, port;
	char addr[64];    /* numeric address of its TCP listener */
	char uname[64];   /* abstract unix socket name (without the leading NUL) */
	int ctrl_fd;      /* -1 until connected, and after it closed */
	int ctrl_unix;    /* ctrl_fd is a unix seqpacket socket (same host) */
	int closed;       /* its control connection ended */
	atomic_int left;  /* said BYE: gone on purpose; only waits that need it fail */
	int64_t last_rx;  /* monotonic ns of the last frame received (the monitor; connect_ctrl under mu) */
	uint8_t rx[sizeof(st_frame)]; /* partial frame on a TCP control socket */
	int rxn;
	uint8_t tx[8 * sizeof(st_frame)]; /* unsent bytes on a TCP control socket (under mu) */
	int txn;
} st_peer;

typedef struct st_mail {
	struct st_mail *next;
	int kind;     /* F_HELLO_DATA (a connection) or F_FD (a memfd) */
	int from;     /* sender's rank */
	uint64_t key;
	int fd;
} st_mail;

typedef struct st_pending {   /* accepted connection waiting for its handshake and hello */
	struct st_pending *next;
	int fd, is_unix;
	int64_t deadline;
	st_accept acc;
	char peer[64];            /* for log lines */
} st_pending;

typedef struct st_ckey {      /* how often a member list was made a communicator */
	struct st_ckey *next;
	uint64_t hash;
	uint64_t count;
} st_ckey;

struct st_group {
	int rank, size, num_slices, per_slice;
	long long generation; /* the elastic generation (st_group_env), -1 none */
	int timeout_ms, hb_ms, dead_ms, join_timeout_ms, use_shm;
	int64_t window_bytes;
	uint64_t nonce;
	st_peer *peers;
	int host_procs, host_cpus; /* this host's processes of the group, and the CPUs they may use */
	int tcp_lfd, unix_lfd;
	int fail_fd;   /* eventfd: becomes readable when the group fails or is aborted */
	int mon_fd;    /* eventfd: wakes the monitor */
	pthread_t mon;
	int mon_running;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	st_mail *mail;           /* under mu */
	st_pending *pend;        /* monitor only, newest first */
	int npend;               /* monitor only */
	int64_t accept_pause_until; /* monitor only: out of descriptors, listeners not polled */
	st_token tok;            /* the run token (key only), loaded by st_group_join */
	st_drop_log drops;       /* monitor only: refused connections */
	char where[48];          /* "worker group rank N", for log lines */
	int nconnected;          /* control connections established (under mu) */
	st_ckey *ckeys;          /* under mu */
	st_comm *comms;          /* open communicators (under mu) */
	/* (reporter+1) << 32 | (failed rank+1) << 8 | reason; 0 while healthy */
	_Atomic uint64_t fail;
	atomic_int told;         /* the monitor forwarded fail to the peers */
	atomic_int stop;
	st_store_server *store;
};

/* Record a failure (first one wins), wake everything. Thread-safe and
 * async-signal-safe. */
void st_group_fail(st_group *g, int reason, int failed_rank, int reporter);
/* 0, or the group's error (ST_EPEER or ST_EINTR) with its message. */
int st_group_check(st_group *g);
/* A wait needs rank; fails the group if that rank left or died. 0 if usable. */
int st_group_need(st_group *g, int rank);
/* Take a mail (connection or fd) of kind/key/from, waiting while the group is
 * healthy; bounded by the sender's liveness. 0 with *fd, or the group error. */
int st_group_take_mail(st_group *g, int kind, uint64_t key, int from, int *fd);
/* Send a frame with an fd over the unix control socket to rank to. */
int st_group_send_fd(st_group *g, int to, uint64_t key, int fd);
/* Open a data connection to rank to for communicator key. */
int st_group_connect_data(st_group *g, int to, uint64_t key, int *fd);
/* Communicator bookkeeping (comm.c <-> group.c). */
uint64_t st_group_next_comm_seq(st_group *g, uint64_t list_hash);
void st_comm_destroy(st_comm *c); /* free without touching the group's list */
st_comm *st_comm_next(st_comm *c);

#endif
