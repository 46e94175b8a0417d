/*
 * The worker group: bootstrap through the store, one control connection per
 * pair of processes, and a monitor thread that keeps them alive.
 *
 * Control connections: a unix seqpacket socket (abstract name, so nothing
 * is left in the file system) between processes of the same host, TCP
 * otherwise. The higher rank connects to the lower. They carry 32-byte
 * frames: heartbeats, BYE, ABORT, and memfds for communicators' shared
 * memory (SCM_RIGHTS). Data connections of communicators are separate TCP
 * connections (comm.c), accepted here by the monitor and handed over
 * through a mailbox.
 *
 * Liveness is independent of collective traffic: the monitor sends a
 * heartbeat to every peer each hb_ms and declares a peer dead when nothing
 * came from it for dead_ms (< timeout_ms), or at once when its connection
 * closes (process exited or was killed). The first failure is recorded in
 * g->fail, wakes every waiter through g->fail_fd, and is forwarded to all
 * peers as an ABORT frame, so a failure anywhere fails the whole group.
 *
 * Who may connect (docs/auth.md): every TCP connection, control or data,
 * starts with the run token's handshake (auth.h; the acceptor's side is the
 * state machine of frame.h, driven by the monitor), then a hello that must
 * name another member with its pid and the group nonce. A connection that
 * fails either, or does not finish them within PENDING_TIMEOUT_NS, is
 * dropped and logged, and the group goes on waiting for the real peer; at
 * most max_pending() connections wait at once (a new one evicts the
 * oldest). Unix control sockets accept only the run's own user (SO_PEERCRED
 * on both ends): their abstract names are reachable by any local user, and
 * they carry memfds. Listeners bind to the address this process reaches the
 * coordinator from (or SLICETRAIN_ADDR), so with a loopback coordinator
 * nothing listens beyond loopback; without a token, no group listens on any
 * other address (st_auth_check_bind).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "base/hash.h"
#include "comm/comm_int.h"

enum { EP_MAGIC = 0x53544551u, CFG_MAGIC = 0x53544346u };
/* An accepted connection must complete its handshake and hello by then. */
#define PENDING_TIMEOUT_NS ((int64_t)10 * 1000000000)

typedef struct ep_wire {
	uint32_t magic;
	int32_t rank, pid, slice, port;
	char addr[64];
	char uname[64];
	char hostkey[320];
	uint64_t cpus[16]; /* CPU affinity (first 1024 CPUs) */
} ep_wire;

typedef struct cfg_wire {
	uint32_t magic;
	int32_t world, num_slices, use_shm;
	int64_t window_bytes;
	uint64_t nonce;
} cfg_wire;

static uint64_t rand64(void)
{
	uint64_t x = 0;
	if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x))
		x = (uint64_t)st_mono_ns() * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32);
	return x ? x : 1;
}

static void poke(int efd)
{
	uint64_t one = 1;
	if (efd >= 0 && write(efd, &one, sizeof(one)) < 0) {
		/* only fails when the counter would overflow: it is readable then anyway */
	}
}

/* ---- failure state ---- */

void st_group_fail(st_group *g, int reason, int failed_rank, int reporter)
{
	uint64_t v = ((uint64_t)(uint32_t)(reporter + 1) << 32) | ((uint64_t)(uint32_t)(failed_rank + 1) << 8) |
		     (uint64_t)reason;
	uint64_t zero = 0;
	if (atomic_compare_exchange_strong(&g->fail, &zero, v)) {
		poke(g->fail_fd);
		poke(g->mon_fd);
	}
}

int st_group_check(st_group *g)
{
	uint64_t v = atomic_load(&g->fail);
	if (!v)
		return 0;
	int reason = (int)(v & 0xff);
	int failed = (int)((v >> 8) & 0xffffff) - 1;
	int reporter = (int)(v >> 32) - 1;
	if (reason == R_ABORT && failed == g->rank)
		return st_fail(ST_EINTR, "collectives of rank %d aborted (st_group_abort)", g->rank);
	char what[96];
	switch (reason) {
	case R_EXIT: snprintf(what, sizeof(what), "exited or closed its connection"); break;
	case R_HB: snprintf(what, sizeof(what), "stopped answering (no heartbeat for %d ms)", g->dead_ms); break;
	case R_LEFT: snprintf(what, sizeof(what), "left the group"); break;
	case R_ABORT: snprintf(what, sizeof(what), "aborted its collectives"); break;
	case R_JOIN: snprintf(what, sizeof(what), "did not join within %d ms", g->join_timeout_ms); break;
	case R_CTL:
		return st_fail(ST_EPEER, "worker group: the elastic controller re-forms the group of generation %lld "
				       "(a peer was lost)", g->generation);
	default: snprintf(what, sizeof(what), "failed"); break;
	}
	if (reporter == g->rank || reporter == failed || reporter < 0)
		return st_fail(ST_EPEER, "worker group: rank %d %s", failed, what);
	return st_fail(ST_EPEER, "worker group: rank %d %s (reported by rank %d)", failed, what, reporter);
}

int st_group_need(st_group *g, int rank)
{
	if (atomic_load(&g->peers[rank].left))
		st_group_fail(g, R_LEFT, rank, g->rank);
	return st_group_check(g);
}

int st_group_status(const st_group *g) { return st_group_check((st_group *)g); }

void st_group_abort(st_group *g)
{
	if (g)
		st_group_fail(g, R_ABORT, g->rank, g->rank);
}

/* The controller's aborts: the newest generation aborted, and an eventfd
 * that wakes every group's monitor (which compares). */
static int abort_efd = -1;
static _Atomic long long aborted_gen = -1;

int st_group_abort_init(void)
{
	if (abort_efd >= 0)
		return 0;
	abort_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	return abort_efd < 0 ? st_fail(ST_EIO, "eventfd: %s", strerror(errno)) : 0;
}

void st_group_abort_gen(long long gen)
{
	long long old = atomic_load(&aborted_gen);
	while (gen > old && !atomic_compare_exchange_weak(&aborted_gen, &old, gen)) {
	}
	if (abort_efd >= 0)
		poke(abort_efd);
}

/* Fail g when the controller aborted its generation (or a newer one). */
static void check_abort(st_group *g)
{
	if (g->generation >= 0 && atomic_load(&aborted_gen) >= g->generation)
		st_group_fail(g, R_CTL, -1, g->rank);
}

/* ---- frames ---- */

/* The generation on the wire (frames, store requests): 0 when not elastic. */
static uint64_t wire_gen(const st_group *g) { return g->generation > 0 ? (uint64_t)g->generation : 0; }

static st_frame frame(const st_group *g, uint32_t type, uint32_t aux, uint64_t key)
{
	st_frame f = { .magic = ST_FRAME_MAGIC, .type = type, .rank = g->rank, .aux = aux, .nonce = g->nonce, .key = key,
		       .gen = wire_gen(g) };
	return f;
}

/* Send what is queued for a peer over TCP, as far as it goes without
 * blocking; caller holds mu. */
static void ctrl_flush_locked(st_peer *q)
{
	while (q->txn > 0 && q->ctrl_fd >= 0) {
		ssize_t w = send(q->ctrl_fd, q->tx, (size_t)q->txn, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w <= 0)
			break;
		memmove(q->tx, q->tx + w, (size_t)(q->txn - w));
		q->txn -= (int)w;
	}
}

/* Queue (TCP) or send (unix) a frame to peer p without blocking; caller holds mu. */
static void ctrl_send_locked(st_group *g, int p, const st_frame *f)
{
	st_peer *q = &g->peers[p];
	if (q->ctrl_fd < 0)
		return;
	if (q->ctrl_unix) {
		/* a full socket means the peer stopped reading: heartbeats can go */
		if (send(q->ctrl_fd, f, sizeof(*f), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		}
		return;
	}
	if (q->txn + (int)sizeof(*f) <= (int)sizeof(q->tx)) {
		memcpy(q->tx + q->txn, f, sizeof(*f));
		q->txn += (int)sizeof(*f);
	}
	ctrl_flush_locked(q);
}

static void mail_add(st_group *g, int kind, int from, uint64_t key, int fd)
{
	st_mail *m = calloc(1, sizeof(*m));
	if (!m) {
		close(fd);
		return;
	}
	m->kind = kind;
	m->from = from;
	m->key = key;
	m->fd = fd;
	pthread_mutex_lock(&g->mu);
	st_mail **pp = &g->mail;
	while (*pp)
		pp = &(*pp)->next;
	*pp = m;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* Wait on g->cv for up to ms; caller holds mu. */
static void cv_wait_ms(st_group *g, int ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += (long)ms * 1000000;
	ts.tv_sec += ts.tv_nsec / 1000000000;
	ts.tv_nsec %= 1000000000;
	pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

int st_group_take_mail(st_group *g, int kind, uint64_t key, int from, int *fd)
{
	pthread_mutex_lock(&g->mu);
	for (;;) {
		for (st_mail **pp = &g->mail; *pp; pp = &(*pp)->next) {
			st_mail *m = *pp;
			if (m->kind == kind && m->key == key && m->from == from) {
				*pp = m->next;
				*fd = m->fd;
				free(m);
				pthread_mutex_unlock(&g->mu);
				return 0;
			}
		}
		if (atomic_load(&g->fail) || atomic_load(&g->peers[from].left)) {
			pthread_mutex_unlock(&g->mu);
			return st_group_need(g, from);
		}
		cv_wait_ms(g, 50);
	}
}

int st_group_send_fd(st_group *g, int to, uint64_t key, int fd)
{
	st_frame f = frame(g, F_FD, 0, key);
	char cbuf[CMSG_SPACE(sizeof(int))];
	for (;;) {
		struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		memset(cbuf, 0, sizeof(cbuf));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		pthread_mutex_lock(&g->mu);
		int cfd = g->peers[to].ctrl_unix ? g->peers[to].ctrl_fd : -1;
		ssize_t r = cfd >= 0 ? sendmsg(cfd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) : -1;
		int e = errno;
		pthread_mutex_unlock(&g->mu);
		if (r == (ssize_t)sizeof(f))
			return 0;
		if (cfd >= 0 && r < 0 && (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)) {
			if (atomic_load(&g->fail))
				return st_group_check(g);
			usleep(1000);
			continue;
		}
		if (!atomic_load(&g->fail))
			st_group_fail(g, R_EXIT, to, g->rank);
		return st_group_check(g);
	}
}

/* A TCP connection to rank to's listener, past the token's handshake, with
 * hello sent. A failed handshake is tried again, DIAL_TRIES times in all: a
 * listener under a flood of connections may have evicted ours, before or
 * after our proof (a wrong token fails every time). 0, or a negative code
 * with a message. */
enum { DIAL_TRIES = 3 };
static int dial(st_group *g, int to, const st_frame *hello, int64_t deadline, int *fdp)
{
	const st_peer *q = &g->peers[to];
	char why[600] = "the group failed meanwhile";
	int r = ST_EPEER;
	for (int t = 0; t < DIAL_TRIES && !atomic_load(&g->fail); t++) {
		int fd, e = st_tcp_connect(q->addr, q->port, deadline, &fd);
		if (e < 0)
			return st_fail(ST_EPEER, "worker group: cannot connect to rank %d at %s:%d: %s", to, q->addr, q->port,
				       strerror(-e));
		if ((r = st_auth_client(fd, &g->tok, deadline)) == 0) {
			if ((e = st_send_full(fd, hello, sizeof(*hello), deadline)) == 0) {
				*fdp = fd;
				return 0;
			}
			close(fd);
			return st_fail(ST_EPEER, "worker group: cannot send a hello to rank %d at %s:%d: %s", to, q->addr,
				       q->port, strerror(-e));
		}
		snprintf(why, sizeof(why), "%s", st_errmsg());
		close(fd);
	}
	return st_fail(r == ST_EAUTH ? ST_EAUTH : ST_EPEER, "worker group: rank %d at %s:%d: %s", to, q->addr, q->port,
		       why);
}

int st_group_connect_data(st_group *g, int to, uint64_t key, int *fdp)
{
	int64_t deadline = st_mono_ns() + (int64_t)g->timeout_ms * 1000000;
	st_frame f = frame(g, F_HELLO_DATA, (uint32_t)getpid(), key);
	int fd, r = dial(g, to, &f, deadline, &fd);
	if (r < 0)
		return atomic_load(&g->fail) ? st_group_check(g) : r;
	st_sock_tune(fd);
	st_set_nonblock(fd, 1);
	*fdp = fd;
	return 0;
}

uint64_t st_group_next_comm_seq(st_group *g, uint64_t hash)
{
	pthread_mutex_lock(&g->mu);
	st_ckey *k = g->ckeys;
	while (k && k->hash != hash)
		k = k->next;
	if (!k && (k = calloc(1, sizeof(*k)))) {
		k->hash = hash;
		k->next = g->ckeys;
		g->ckeys = k;
	}
	uint64_t n = k ? k->count++ : 0;
	pthread_mutex_unlock(&g->mu);
	return n;
}

/* ---- the monitor ---- */

static void peer_closed(st_group *g, int p)
{
	st_peer *q = &g->peers[p];
	pthread_mutex_lock(&g->mu);
	if (q->ctrl_fd >= 0)
		close(q->ctrl_fd);
	q->ctrl_fd = -1;
	q->closed = 1;
	q->txn = 0;
	pthread_mutex_unlock(&g->mu);
	if (!atomic_load(&q->left))
		st_group_fail(g, R_EXIT, p, g->rank);
}

static void on_frame(st_group *g, int p, const st_frame *f, int fd)
{
	const char *why;
	int abort_reason = 0, abort_rank = p;
	int type = st_ctrl_frame_check(f, g->nonce, wire_gen(g), p, g->size, R_JOIN, &abort_reason, &abort_rank, &why);
	if (type < 0) {
		if (fd >= 0)
			close(fd);
		st_warn("worker group: %s from rank %d; dropping the connection", why, p);
		peer_closed(g, p);
		return;
	}
	g->peers[p].last_rx = st_mono_ns();
	switch (type) {
	case F_HB:
		break;
	case F_BYE:
		/* not a failure by itself: collectives that still need p fail */
		atomic_store(&g->peers[p].left, 1);
		break;
	case F_ABORT:
		if (abort_reason > R_NONE)
			st_group_fail(g, abort_reason, abort_rank, p);
		else
			st_group_fail(g, R_ABORT, p, p);
		break;
	case F_FD:
		if (fd >= 0) {
			mail_add(g, F_FD, p, f->key, fd);
			fd = -1;
		}
		break;
	default:
		break;
	}
	if (fd >= 0)
		close(fd);
}

/* The first fd a control message carries; any others are closed. -1: none. */
static int first_fd(struct msghdr *msg)
{
	int fd = -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < nfd; i++) {
			int x;
			memcpy(&x, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (fd < 0)
				fd = x;
			else
				close(x);
		}
	}
	return fd;
}

enum { RX_STOP, RX_MORE, RX_GOT };

/* What a receive on peer p's control socket returned: RX_GOT (bytes),
 * RX_MORE (interrupted: receive again), RX_STOP (nothing more now, or the
 * connection ended: then the peer is closed). */
static int rx_outcome(st_group *g, int p, ssize_t r)
{
	if (r > 0)
		return RX_GOT;
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return RX_STOP;
	if (r < 0 && errno == EINTR)
		return RX_MORE;
	peer_closed(g, p);
	return RX_STOP;
}

/* One frame (and fd) from peer p's unix control socket: RX_MORE or RX_STOP. */
static int read_unix_frame(st_group *g, int p)
{
	st_frame f;
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	ssize_t r = recvmsg(g->peers[p].ctrl_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	int next = rx_outcome(g, p, r);
	if (next != RX_GOT)
		return next;
	int fd = first_fd(&msg);
	if (r != (ssize_t)sizeof(f) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		if (fd >= 0)
			close(fd);
		st_warn("worker group: malformed control message from rank %d", p);
		peer_closed(g, p);
		return RX_STOP;
	}
	on_frame(g, p, &f, fd);
	return RX_MORE;
}

/* Bytes from peer p's TCP control socket, a frame once complete: RX_MORE
 * or RX_STOP. */
static int read_tcp_frame(st_group *g, int p)
{
	st_peer *q = &g->peers[p];
	ssize_t r = recv(q->ctrl_fd, q->rx + q->rxn, sizeof(q->rx) - (size_t)q->rxn, MSG_DONTWAIT);
	int next = rx_outcome(g, p, r);
	if (next != RX_GOT)
		return next;
	q->rxn += (int)r;
	if (q->rxn == (int)sizeof(st_frame)) {
		st_frame f;
		memcpy(&f, q->rx, sizeof(f));
		q->rxn = 0;
		on_frame(g, p, &f, -1);
	}
	return RX_MORE;
}

/* Everything peer p sent on its control connection so far. */
static void read_ctrl(st_group *g, int p)
{
	const st_peer *q = &g->peers[p];
	while (q->ctrl_fd >= 0 && (q->ctrl_unix ? read_unix_frame(g, p) : read_tcp_frame(g, p)) == RX_MORE)
		;
}

static int32_t pid_of(const void *ctx, int r) { return ((const st_group *)ctx)->peers[r].pid; }

/* Drop an accepted connection, and say why (rate-limited). */
static void pending_drop(st_group *g, st_pending *pc, const char *why)
{
	st_auth_log_drop(&g->drops, g->where, pc->peer, why);
	close(pc->fd);
	pc->fd = -1;
	g->npend--;
}

/* A complete hello on an accepted connection. */
static void on_hello(st_group *g, st_pending *pc, const st_frame *f)
{
	const char *why = NULL;
	st_hello_rules rules = { .self = g->rank, .size = g->size, .nonce = g->nonce, .gen = wire_gen(g), .pid_of = pid_of,
				 .ctx = g };
	int kind = st_hello_check(&rules, f, pc->is_unix, &why);
	if (kind == F_HELLO_CTRL) {
		pthread_mutex_lock(&g->mu);
		st_peer *q = &g->peers[f->rank];
		if (q->ctrl_fd < 0 && !q->closed) {
			q->ctrl_fd = pc->fd;
			q->ctrl_unix = pc->is_unix;
			q->last_rx = st_mono_ns();
			g->nconnected++;
			pc->fd = -1;
			g->npend--;
			pthread_cond_broadcast(&g->cv);
		} else {
			why = "a second control connection from the same rank";
		}
		pthread_mutex_unlock(&g->mu);
	} else if (kind == F_HELLO_DATA) {
		st_sock_tune(pc->fd);
		mail_add(g, F_HELLO_DATA, f->rank, f->key, pc->fd);
		pc->fd = -1;
		g->npend--;
	}
	if (pc->fd >= 0)
		pending_drop(g, pc, why);
}

/* Send a handshake message on a fresh connection: it fits the socket's buffer. */
static int pending_send(st_pending *pc, const void *p, size_t n)
{
	return send(pc->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* What an accepted connection sent: the proof (TCP), then the hello. Reads
 * no further, so that a data connection's payload stays in the socket. */
static void read_pending(st_group *g, st_pending *pc)
{
	while (pc->fd >= 0) {
		uint8_t in[ST_AUTH_PROOF], answer[ST_AUTH_MAC];
		size_t want = st_accept_want(&pc->acc), used;
		st_frame f;
		ssize_t r = recv(pc->fd, in, want < sizeof(in) ? want : sizeof(in), MSG_DONTWAIT);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r <= 0) {
			pending_drop(g, pc, pc->acc.need_auth && !pc->acc.auth.done
						    ? "closed before completing the handshake"
						    : "closed before its hello");
			return;
		}
		int k = st_accept_feed(&pc->acc, &g->tok, in, (size_t)r, &used, answer, &f);
		if (k < 0)
			pending_drop(g, pc, st_errmsg());
		else if (k == ST_ACCEPT_ANSWER && pending_send(pc, answer, sizeof(answer)) < 0)
			pending_drop(g, pc, "cannot send the handshake's answer");
		else if (k == ST_ACCEPT_HELLO)
			on_hello(g, pc, &f);
	}
}

/* At most this many accepted connections wait for their handshake and
 * hello (g->npend counts the open ones): each member may open a control
 * and a data connection at once. */
static int max_pending(const st_group *g) { return 2 * g->size + 64; }

/* Room for one more accepted connection: drop the oldest waiting one. */
static void pending_make_room(st_group *g)
{
	while (g->npend >= max_pending(g)) {
		st_pending *old = NULL;
		for (st_pending *pc = g->pend; pc; pc = pc->next)
			if (pc->fd >= 0)
				old = pc; /* newest first: the last open one is the oldest */
		if (!old)
			return;
		pending_drop(g, old, "too many connections waiting for their handshake (the oldest is dropped)");
	}
}

/* A unix peer of the run's own user (a local socket's peer credentials). */
static int same_user(int fd)
{
	struct ucred uc;
	socklen_t l = sizeof(uc);
	return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &l) == 0 && uc.uid == geteuid();
}

static void accept_on(st_group *g, int lfd, int is_unix)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/* the listener stays readable: pause instead of spinning */
				g->accept_pause_until = st_mono_ns() + 100000000;
				st_auth_log_drop(&g->drops, g->where, "?", "cannot accept: out of descriptors");
			}
			return;
		}
		pending_make_room(g);
		st_pending *pc = calloc(1, sizeof(*pc));
		if (!pc) {
			close(fd);
			continue;
		}
		uint8_t hello[ST_AUTH_HELLO];
		if (!is_unix)
			st_sock_nodelay(fd);
		pc->fd = fd;
		pc->is_unix = is_unix;
		pc->deadline = st_mono_ns() + PENDING_TIMEOUT_NS;
		st_sock_peer_name(fd, pc->peer, sizeof(pc->peer));
		pc->next = g->pend;
		g->pend = pc;
		g->npend++;
		if (is_unix && !same_user(fd))
			pending_drop(g, pc, "a local process of another user");
		else if (st_accept_start(&pc->acc, !is_unix, hello) < 0)
			pending_drop(g, pc, st_errmsg());
		else if (!is_unix && pending_send(pc, hello, sizeof(hello)) < 0)
			pending_drop(g, pc, "cannot send the handshake's hello");
	}
}

static void heartbeat(st_group *g, int64_t now)
{
	st_frame hb = frame(g, F_HB, 0, 0);
	int dead = -1;
	/* under mu: connect_ctrl (the joining thread) sets a new control
	 * connection's fd and last_rx together; read without the lock, a new fd
	 * could be seen with the last_rx of before (0), a peer dead at once */
	pthread_mutex_lock(&g->mu);
	for (int p = 0; p < g->size; p++) {
		st_peer *q = &g->peers[p];
		if (p == g->rank || q->ctrl_fd < 0)
			continue;
		ctrl_send_locked(g, p, &hb);
		if (dead < 0 && !atomic_load(&q->left) && now - q->last_rx > (int64_t)g->dead_ms * 1000000)
			dead = p;
	}
	pthread_mutex_unlock(&g->mu);
	if (dead >= 0)
		st_group_fail(g, R_HB, dead, g->rank);
}

/* What a slot of the monitor's poll set watches. */
enum slot_kind {
	SLOT_WAKE,        /* g->mon_fd: a failure, a new control connection, or stop */
	SLOT_ABORT,       /* abort_efd: the controller aborted a generation (st_group_abort_gen) */
	SLOT_TCP_LISTEN,  /* g->tcp_lfd: connections from other hosts and slices */
	SLOT_UNIX_LISTEN, /* g->unix_lfd: control connections from this host */
	SLOT_PENDING,     /* an accepted connection waiting for its hello */
	SLOT_PEER,        /* a peer's control connection */
};

typedef struct poll_slot {
	enum slot_kind kind;
	int peer;          /* SLOT_PEER: its rank */
	st_pending *pc;    /* SLOT_PENDING: the connection */
} poll_slot;

typedef struct poll_set {
	struct pollfd *fds;
	poll_slot *slots;  /* slots[i] says what fds[i] is */
	int n, cap;
} poll_set;

/* Room for cap slots. 0, or -1 when out of memory (the set stays valid). */
static int poll_set_reserve(poll_set *ps, int cap)
{
	struct pollfd *fds = realloc(ps->fds, sizeof(*fds) * (size_t)cap);
	if (fds)
		ps->fds = fds;
	poll_slot *slots = realloc(ps->slots, sizeof(*slots) * (size_t)cap);
	if (slots)
		ps->slots = slots;
	if (!fds || !slots)
		return -1;
	ps->cap = cap;
	return 0;
}

static void poll_set_add(poll_set *ps, int fd, short events, enum slot_kind kind, int peer, st_pending *pc)
{
	ps->fds[ps->n] = (struct pollfd){ .fd = fd, .events = events };
	ps->slots[ps->n++] = (poll_slot){ .kind = kind, .peer = peer, .pc = pc };
}

/* Room for every slot poll_set_fill may add. 0, or -1 when out of memory. */
static int poll_set_fit(const st_group *g, poll_set *ps)
{
	int need = 4 + g->size;
	for (const st_pending *pc = g->pend; pc; pc = pc->next)
		need++;
	return need > ps->cap ? poll_set_reserve(ps, 2 * need) : 0;
}

/* Everything the monitor watches now: its wake-up, both listeners, the
 * pending connections and the peers' control connections. Returns when the
 * poll must end at the latest: next_hb, or a pending hello's deadline. */
static int64_t poll_set_fill(st_group *g, poll_set *ps, int64_t next_hb)
{
	int64_t wake = next_hb;
	ps->n = 0;
	poll_set_add(ps, g->mon_fd, POLLIN, SLOT_WAKE, -1, NULL);
	poll_set_add(ps, abort_efd, POLLIN, SLOT_ABORT, -1, NULL);
	int paused = g->accept_pause_until > st_mono_ns();
	poll_set_add(ps, paused ? -1 : g->tcp_lfd, POLLIN, SLOT_TCP_LISTEN, -1, NULL);
	poll_set_add(ps, paused ? -1 : g->unix_lfd, POLLIN, SLOT_UNIX_LISTEN, -1, NULL);
	if (paused && g->accept_pause_until < wake)
		wake = g->accept_pause_until;
	for (st_pending *pc = g->pend; pc; pc = pc->next) {
		poll_set_add(ps, pc->fd, POLLIN, SLOT_PENDING, -1, pc);
		if (pc->deadline < wake)
			wake = pc->deadline;
	}
	pthread_mutex_lock(&g->mu);
	for (int p = 0; p < g->size; p++) {
		st_peer *q = &g->peers[p];
		if (p == g->rank || q->ctrl_fd < 0)
			continue;
		poll_set_add(ps, q->ctrl_fd, (short)(POLLIN | (q->txn ? POLLOUT : 0)), SLOT_PEER, p, NULL);
	}
	pthread_mutex_unlock(&g->mu);
	return wake;
}

/* Send what is queued for peer p, then read what it sent. */
static void serve_peer(st_group *g, int p, short revents)
{
	if (revents & POLLOUT) {
		pthread_mutex_lock(&g->mu);
		ctrl_flush_locked(&g->peers[p]);
		pthread_mutex_unlock(&g->mu);
	}
	if (revents & (POLLIN | POLLHUP | POLLERR))
		read_ctrl(g, p);
}

static void serve_slot(st_group *g, const poll_slot *s, short revents)
{
	uint64_t v;
	switch (s->kind) {
	case SLOT_WAKE:
		/* only wakes the loop, which checks stop and fail */
		if (read(g->mon_fd, &v, sizeof(v)) < 0) {
		}
		break;
	case SLOT_ABORT: /* consumed: a group formed later compares at its start */
		if (read(abort_efd, &v, sizeof(v)) < 0) {
		}
		check_abort(g);
		break;
	case SLOT_TCP_LISTEN:
		accept_on(g, g->tcp_lfd, 0);
		break;
	case SLOT_UNIX_LISTEN:
		accept_on(g, g->unix_lfd, 1);
		break;
	case SLOT_PENDING:
		read_pending(g, s->pc);
		break;
	case SLOT_PEER:
		serve_peer(g, s->peer, revents);
		break;
	}
}

/* Close the accepted connections whose hello is late, and forget the closed ones. */
static void drop_stale_pending(st_group *g, int64_t now)
{
	for (st_pending **pp = &g->pend; *pp;) {
		st_pending *pc = *pp;
		if (pc->fd >= 0 && now > pc->deadline)
			pending_drop(g, pc, "no handshake and hello within the time limit");
		if (pc->fd < 0) {
			*pp = pc->next;
			free(pc);
		} else {
			pp = &pc->next;
		}
	}
}

/* The monitor was not running (stopped, starved): silence from the peers
 * over that time says nothing about them. */
static void forget_silence(st_group *g, int64_t now)
{
	pthread_mutex_lock(&g->mu);
	for (int p = 0; p < g->size; p++)
		g->peers[p].last_rx = now;
	pthread_mutex_unlock(&g->mu);
}

/* Tell every peer about the group's failure. */
static void forward_failure(st_group *g)
{
	uint64_t v = atomic_load(&g->fail);
	st_frame ab = frame(g, F_ABORT, (uint32_t)(v & 0xff), (uint64_t)(((v >> 8) & 0xffffff) - 1));
	pthread_mutex_lock(&g->mu);
	for (int p = 0; p < g->size; p++)
		if (p != g->rank)
			ctrl_send_locked(g, p, &ab);
	pthread_mutex_unlock(&g->mu);
}

/* The monitor's loop, until st_group_leave stops it: heartbeats, failure
 * forwarding, then one poll over everything it watches. */
static void watch(st_group *g, poll_set *ps)
{
	int64_t hb_ns = (int64_t)g->hb_ms * 1000000, next_hb = st_mono_ns(), last_loop = next_hb;
	while (!atomic_load(&g->stop)) {
		int64_t now = st_mono_ns();
		if (now - last_loop > 3 * hb_ns)
			forget_silence(g, now);
		last_loop = now;
		if (now >= next_hb) {
			heartbeat(g, now);
			next_hb = now + hb_ns;
		}
		if (!atomic_load(&g->told) && atomic_load(&g->fail)) {
			forward_failure(g);
			atomic_store(&g->told, 1);
		}
		if (poll_set_fit(g, ps) < 0) {
			st_group_fail(g, R_EXIT, g->rank, g->rank);
			return;
		}
		int64_t wake = poll_set_fill(g, ps, next_hb);
		int ms = (int)((wake - now) / 1000000) + 1;
		if (ms < 0)
			ms = 0;
		int r = poll(ps->fds, (nfds_t)ps->n, ms);
		if (r < 0 && errno != EINTR)
			usleep(1000);
		for (int i = 0; r > 0 && i < ps->n; i++)
			if (ps->fds[i].revents)
				serve_slot(g, &ps->slots[i], ps->fds[i].revents);
		drop_stale_pending(g, st_mono_ns());
	}
}

static void *monitor(void *arg)
{
	st_group *g = arg;
	poll_set ps = { 0 };
	if (poll_set_reserve(&ps, g->size + 8) < 0)
		st_group_fail(g, R_EXIT, g->rank, g->rank);
	else
		watch(g, &ps);
	free(ps.fds);
	free(ps.slots);
	return NULL;
}

/* ---- joining: settings, host key, unix sockets ---- */

static int env_ms(const char *name, int dflt, int lo, int *out)
{
	const char *v = getenv(name);
	long x;
	if (!v) {
		*out = dflt;
		return 0;
	}
	if (st_parse_long(v, lo, 1L << 30, &x) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not an integer in [%d, %ld]", name, v, lo, 1L << 30);
	*out = (int)x;
	return 0;
}

static void host_key(char *buf, size_t cap)
{
	char hn[256] = "?", boot[64] = "?", ns[64] = "?";
	if (gethostname(hn, sizeof(hn)) < 0)
		snprintf(hn, sizeof(hn), "?");
	hn[sizeof(hn) - 1] = 0;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			snprintf(boot, sizeof(boot), "?");
		fclose(f);
		boot[strcspn(boot, "\n")] = 0;
	}
	ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
	ns[n > 0 ? n : 0] = 0;
	snprintf(buf, cap, "%.200s|%.60s|%.50s", hn, boot, ns);
}

static int validate_env(const st_group_env *e)
{
	if (e->world_size < 1 || e->world_size > (1 << 20))
		return st_fail(ST_EINVAL, "worker group: world size %d out of range", e->world_size);
	if (e->rank < 0 || e->rank >= e->world_size)
		return st_fail(ST_EINVAL, "worker group: rank %d out of range for world size %d", e->rank, e->world_size);
	if (e->num_slices < 1 || e->world_size % e->num_slices)
		return st_fail(ST_EINVAL, "worker group: %d slices do not divide world size %d", e->num_slices,
			       e->world_size);
	if (e->slice_id != e->rank / (e->world_size / e->num_slices))
		return st_fail(ST_EINVAL, "worker group: slice %d is inconsistent with rank %d (slice-major order)",
			       e->slice_id, e->rank);
	return 0;
}

static int unix_listen(st_group *g, char *name, size_t cap)
{
	struct sockaddr_un a;
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	snprintf(name, cap, "slicetrain.%d.%016llx", (int)getpid(), (unsigned long long)rand64());
	memcpy(a.sun_path + 1, name, strlen(name));
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return st_fail(ST_EIO, "worker group: unix socket: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, 4096) < 0) {
		int e = errno;
		close(fd);
		return st_fail(ST_EIO, "worker group: unix socket %s: %s", name, strerror(e));
	}
	g->unix_lfd = fd;
	return 0;
}

static int unix_connect(const char *name, int *fdp)
{
	struct sockaddr_un a;
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	size_t n = strlen(name);
	if (n + 2 > sizeof(a.sun_path))
		return -ENAMETOOLONG;
	memcpy(a.sun_path + 1, name, n);
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, len) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	if (!same_user(fd)) { /* an abstract name any local user could have taken */
		close(fd);
		return -EACCES;
	}
	st_set_nonblock(fd, 1);
	*fdp = fd;
	return 0;
}

/* ---- joining: meeting through the store ---- */

/* Rank 0 writes the group's settings (world, slices, shared memory, window,
 * nonce); every process reads them back and checks that it agrees. */
static int agree_on_settings(st_group *g, st_store *s, const st_group_env *e, int64_t deadline)
{
	void *val = NULL;
	size_t len;
	int r;
	if (g->rank == 0) {
		cfg_wire cw = { .magic = CFG_MAGIC, .world = g->size, .num_slices = g->num_slices,
				.use_shm = g->use_shm, .window_bytes = g->window_bytes, .nonce = rand64() };
		if ((r = st_store_set(s, "cfg", &cw, sizeof(cw))) < 0)
			return r;
	}
	if ((r = st_store_get(s, "cfg", &val, &len, deadline)) < 0) {
		if (st_mono_ns() >= deadline)
			r = st_fail(ST_EPEER, "worker group: rank 0 did not set up the store at %s within %d ms",
				    e->coordinator, g->join_timeout_ms);
		return r;
	}
	cfg_wire cw;
	int sized = len == sizeof(cw);
	if (sized)
		memcpy(&cw, val, sizeof(cw));
	free(val);
	if (!sized)
		return st_fail(ST_EPEER, "worker group: the store at %s is not a slicetrain store (or another version)",
			       e->coordinator);
	if (cw.magic != CFG_MAGIC)
		return st_fail(ST_EPEER, "worker group: the store at %s is not a slicetrain store", e->coordinator);
	if (cw.world != g->size || cw.num_slices != g->num_slices)
		return st_fail(ST_EINVAL, "worker group: this process has world size %d in %d slices, rank 0 has %d in %d",
			       g->size, g->num_slices, cw.world, cw.num_slices);
	g->nonce = cw.nonce;
	g->window_bytes = cw.window_bytes;
	g->use_shm = cw.use_shm;
	return 0;
}

/* Claim this process's rank: a second process with the same rank fails. */
static int claim_rank(st_group *g, st_store *s)
{
	char key[64];
	int64_t claims;
	int r;
	snprintf(key, sizeof(key), "claim/%d", g->rank);
	if ((r = st_store_add(s, key, 1, &claims)) < 0)
		return r;
	if (claims != 1)
		return st_fail(ST_EINVAL, "worker group: rank %d was claimed by two processes (check the rank variables)",
			       g->rank);
	return 0;
}

/* The CPUs this process may run on (the first 1024), as a bit mask. */
static void affinity_mask(uint64_t cpus[16])
{
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) == 0) {
		for (int k = 0; k < 1024 && k < CPU_SETSIZE; k++)
			if (CPU_ISSET(k, &cs))
				cpus[k / 64] |= 1ull << (k % 64);
	} else {
		cpus[0] = 1;
	}
}

/* Write ep/<rank>: how the others reach this process, its host and its CPUs. */
static int publish_endpoint(st_group *g, st_store *s, const st_group_env *e, const char *addr)
{
	ep_wire me;
	char key[64];
	memset(&me, 0, sizeof(me));
	me.magic = EP_MAGIC;
	me.rank = g->rank;
	me.pid = (int32_t)getpid();
	me.slice = e->slice_id;
	me.port = g->peers[g->rank].port;
	snprintf(me.addr, sizeof(me.addr), "%s", addr);
	snprintf(me.uname, sizeof(me.uname), "%s", g->peers[g->rank].uname);
	host_key(me.hostkey, sizeof(me.hostkey));
	affinity_mask(me.cpus);
	snprintf(key, sizeof(key), "ep/%d", g->rank);
	return st_store_set(s, key, &me, sizeof(me));
}

/* Rank 0 reads every ep/<rank> into all and publishes them as one value,
 * eps, so that joining costs O(world) store requests, not O(world^2). */
static int gather_endpoints(st_group *g, st_store *s, const st_group_env *e, int64_t deadline, uint8_t *all)
{
	for (int p = 0; p < g->size; p++) {
		char key[64];
		void *val = NULL;
		size_t len;
		int r;
		snprintf(key, sizeof(key), "ep/%d", p);
		if ((r = st_store_get(s, key, &val, &len, deadline)) < 0) {
			if (st_mono_ns() >= deadline)
				r = st_fail(ST_EPEER, "worker group: rank %d did not join within %d ms (coordinator %s)", p,
					    g->join_timeout_ms, e->coordinator);
			return r;
		}
		if (len != sizeof(ep_wire)) {
			free(val);
			return st_fail(ST_EPEER, "worker group: malformed endpoint of rank %d in the store", p);
		}
		memcpy(all + (size_t)p * sizeof(ep_wire), val, sizeof(ep_wire));
		free(val);
	}
	return st_store_set(s, "eps", all, sizeof(ep_wire) * (size_t)g->size);
}

/* Every endpoint, in rank order: gathered by rank 0, read from eps by the
 * others. *all is allocated (the caller frees it, also on failure). */
static int read_endpoints(st_group *g, st_store *s, const st_group_env *e, int64_t deadline, uint8_t **all)
{
	size_t all_len = sizeof(ep_wire) * (size_t)g->size, len;
	void *val = NULL;
	int r;
	if (g->rank == 0) {
		if (!(*all = malloc(all_len)))
			return st_fail(ST_ENOMEM, "worker group: out of memory");
		return gather_endpoints(g, s, e, deadline, *all);
	}
	if ((r = st_store_get(s, "eps", &val, &len, deadline)) < 0) {
		if (st_mono_ns() >= deadline)
			r = st_fail(ST_EPEER, "worker group: the group did not form within %d ms (coordinator %s; "
					      "rank 0 names the missing ranks)", g->join_timeout_ms, e->coordinator);
		return r;
	}
	if (len != all_len) {
		free(val);
		return st_fail(ST_EPEER, "worker group: malformed endpoint table in the store");
	}
	*all = val;
	return 0;
}

static int endpoint_valid(const st_group *g, const ep_wire *ep, int p)
{
	return ep->magic == EP_MAGIC && ep->rank == p && ep->port >= 1 && ep->port <= 65535 &&
	       memchr(ep->addr, 0, sizeof(ep->addr)) && memchr(ep->uname, 0, sizeof(ep->uname)) &&
	       memchr(ep->hostkey, 0, sizeof(ep->hostkey)) && ep->slice == p / g->per_slice;
}

/* The host of rank p: the lowest rank with the same host key (hk: the
 * hashes of the host keys of ranks 0..p). */
static int host_of(const st_group *g, const uint8_t *all, const uint64_t *hk, int p)
{
	const ep_wire *eps = (const ep_wire *)all;
	for (int k = 0; k < p; k++)
		if (hk[k] == hk[p] && strcmp(eps[k].hostkey, eps[p].hostkey) == 0)
			return g->peers[k].host;
	return p;
}

/* Take every peer's place and address from the endpoints. */
static int adopt_endpoints(st_group *g, const uint8_t *all)
{
	uint64_t *hk = calloc((size_t)g->size, sizeof(uint64_t));
	int r = 0;
	if (!hk)
		return st_fail(ST_ENOMEM, "worker group: out of memory");
	for (int p = 0; p < g->size; p++) {
		ep_wire ep;
		memcpy(&ep, all + (size_t)p * sizeof(ep), sizeof(ep));
		if (!endpoint_valid(g, &ep, p)) {
			r = st_fail(ST_EPEER, "worker group: malformed endpoint of rank %d in the store", p);
			break;
		}
		st_peer *q = &g->peers[p];
		q->pid = ep.pid;
		q->slice = ep.slice;
		q->port = ep.port;
		memcpy(q->addr, ep.addr, sizeof(q->addr));
		memcpy(q->uname, ep.uname, sizeof(q->uname));
		hk[p] = st_fnv1a(ST_FNV_INIT, ep.hostkey, strlen(ep.hostkey));
		q->host = host_of(g, all, hk, p);
	}
	free(hk);
	return r;
}

/* Can this host's processes of the group all run at once? Count them, and
 * the CPUs their affinity masks cover together. */
static void count_host_cpus(st_group *g, const uint8_t *all)
{
	uint64_t un[16] = { 0 };
	int procs = 0, cpus = 0;
	for (int p = 0; p < g->size; p++) {
		if (g->peers[p].host != g->peers[g->rank].host)
			continue;
		ep_wire ep;
		memcpy(&ep, all + (size_t)p * sizeof(ep), sizeof(ep));
		for (int k = 0; k < 16; k++)
			un[k] |= ep.cpus[k];
		procs++;
	}
	for (int k = 0; k < 16; k++)
		cpus += __builtin_popcountll(un[k]);
	g->host_procs = procs;
	g->host_cpus = cpus > 0 ? cpus : 1;
}

/* The TCP listener the peers connect to, on SLICETRAIN_ADDR or else the
 * address this process reaches the store from (with a loopback coordinator:
 * loopback), on a port of SLICETRAIN_PORT_RANGE when set (firewalls). Its
 * address goes into the endpoint (me_addr). */
static int listen_transport(st_group *g, st_store *s, char *me_addr, size_t cap)
{
	const char *adv = getenv("SLICETRAIN_ADDR");
	int r, lport;
	if (adv && *adv)
		snprintf(me_addr, cap, "%s", adv);
	else if (st_store_local_addr(s, me_addr, cap) < 0)
		snprintf(me_addr, cap, "127.0.0.1");
	if ((r = st_auth_check_bind(&g->tok, me_addr)) < 0) {
		return st_wrap(r, "worker group");
	}
	const char *range = getenv("SLICETRAIN_PORT_RANGE");
	int lo = 0, hi = 0;
	if (range && *range && st_port_range_parse(range, &lo, &hi) < 0)
		return st_fail(ST_EINVAL, "worker group: SLICETRAIN_PORT_RANGE '%.40s' is not LO-HI (ports 1-65535)",
			       range);
	if ((r = st_tcp_listen_range(me_addr, lo, hi, 4096, &g->tcp_lfd, &lport)) < 0)
		return st_fail(r == -EADDRNOTAVAIL ? ST_EINVAL : ST_EIO, "worker group: cannot listen on %s%s%s%s: %s",
			       me_addr, adv && *adv ? " (SLICETRAIN_ADDR)" : "", lo ? " in SLICETRAIN_PORT_RANGE " : "",
			       lo ? range : "", strerror(-r));
	st_set_nonblock(g->tcp_lfd, 1);
	g->peers[g->rank].port = lport;
	return 0;
}

/* Meet the others through the store at host:port: listen for them, agree
 * on the settings, claim this rank, publish this endpoint and learn
 * everyone's. */
static int meet_through_store(st_group *g, const st_group_env *e, const char *host, int port, int64_t deadline)
{
	st_store *s = NULL;
	uint8_t *all = NULL;
	char addr[64];
	int r = st_store_connect(&s, host, port, &g->tok, deadline);
	if (r < 0)
		return r;
	st_store_set_generation(s, wire_gen(g)); /* a store of another generation refuses us */
	if ((r = listen_transport(g, s, addr, sizeof(addr))) < 0 || (r = agree_on_settings(g, s, e, deadline)) < 0 ||
	    (r = claim_rank(g, s)) < 0 ||
	    (r = publish_endpoint(g, s, e, addr)) < 0 || (r = read_endpoints(g, s, e, deadline, &all)) < 0 ||
	    (r = adopt_endpoints(g, all)) < 0)
		goto out;
	count_host_cpus(g, all);
out:
	free(all);
	st_store_close(s);
	return r;
}

/* ---- joining: listen, meet, connect ---- */

/* Timeouts and window: opts first, then the environment, then defaults. */
static int take_settings(st_group *g, const st_group_opts *opts)
{
	int r, win_kb;
	if (opts && opts->timeout_ms > 0)
		g->timeout_ms = opts->timeout_ms;
	else if ((r = env_ms("SLICETRAIN_COMM_TIMEOUT_MS", 5000, 10, &g->timeout_ms)) < 0)
		return r;
	if (opts && opts->join_timeout_ms > 0)
		g->join_timeout_ms = opts->join_timeout_ms;
	else if ((r = env_ms("SLICETRAIN_JOIN_TIMEOUT_MS", 300000, 10, &g->join_timeout_ms)) < 0)
		return r;
	if ((r = env_ms("SLICETRAIN_COMM_WINDOW_KB", 1024, 64, &win_kb)) < 0)
		return r;
	g->window_bytes = (int64_t)win_kb * 1024;
	/* a heartbeat every tenth of the timeout; dead after 8 missed ones, so
	 * that with the polling delay a stopped peer is declared dead within timeout_ms */
	g->hb_ms = g->timeout_ms / 10 > 0 ? g->timeout_ms / 10 : 1;
	g->dead_ms = g->timeout_ms - 2 * g->hb_ms;
	return 0;
}

/* A group for the place e, with its settings and no connection yet. */
static int group_new(st_group **out, const st_group_env *e, const st_group_opts *opts)
{
	st_group *g = calloc(1, sizeof(*g));
	int r;
	if (!g)
		return st_fail(ST_ENOMEM, "worker group: out of memory");
	g->rank = e->rank;
	g->generation = opts && opts->generation > 0 ? opts->generation : -1;
	g->size = e->world_size;
	g->num_slices = e->num_slices;
	g->per_slice = e->world_size / e->num_slices;
	g->tcp_lfd = g->unix_lfd = g->fail_fd = g->mon_fd = -1;
	snprintf(g->where, sizeof(g->where), "worker group rank %d", g->rank);
	g->use_shm = !(opts && opts->use_shm < 0);
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	if ((r = take_settings(g, opts)) < 0)
		goto fail;
	g->peers = calloc((size_t)g->size, sizeof(st_peer));
	if (!g->peers) {
		r = st_fail(ST_ENOMEM, "worker group: out of memory");
		goto fail;
	}
	for (int p = 0; p < g->size; p++) {
		g->peers[p].ctrl_fd = -1;
		g->peers[p].slice = p / g->per_slice;
	}
	*out = g;
	return 0;
fail:
	st_group_leave(g);
	return r;
}

/* One control connection per peer, plus data connections: raise the soft
 * descriptor limit to the hard one when a large group needs it. */
static void raise_fd_limit(int size)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < (rlim_t)(4 * size + 256) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The eventfds, the unix listener the peers of this host connect to, and on
 * rank 0 the store on the coordinator's address and port (the TCP listener
 * comes once the store tells which address reaches the others:
 * listen_transport). */
static int open_listeners(st_group *g, const st_group_env *e, const char *store_host, int store_port)
{
	int r;
	g->fail_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	g->mon_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (g->fail_fd < 0 || g->mon_fd < 0)
		return st_fail(ST_EIO, "worker group: eventfd: %s", strerror(errno));
	if ((r = unix_listen(g, g->peers[g->rank].uname, sizeof(g->peers[g->rank].uname))) < 0)
		return r;
	/* every member is a client once; room for a few retries and strays */
	st_store_limits lim = { .max_clients = g->size + 16, .max_pending = g->size + 64,
				.max_bytes = ((int64_t)64 << 20) + (int64_t)4 * g->size * (int64_t)sizeof(ep_wire),
				.generation = wire_gen(g) };
	if (g->rank == 0 && (r = st_store_serve(&g->store, store_host, store_port, &g->tok, &lim)) < 0) {
		char why[900];
		snprintf(why, sizeof(why), "%s", st_errmsg());
		return st_fail(r == ST_EINVAL ? ST_EINVAL : ST_EIO,
			       "worker group: rank 0 cannot host the store on the coordinator port %d of %s (%s): %s; "
			       "point SLICETRAIN_COORDINATOR at a free host:port of rank 0's host", store_port, store_host,
			       e->source, why);
	}
	return 0;
}

/* The monitor thread, with every signal blocked (handlers run on the
 * application's threads). */
static int start_monitor(st_group *g)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int pe = pthread_create(&g->mon, NULL, monitor, g);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (pe)
		return st_fail(ST_EIO, "worker group: cannot start the monitor thread: %s", strerror(pe));
	g->mon_running = 1;
	return 0;
}

/* The control connection to lower rank p (the higher rank connects): a
 * unix socket on the same host, else TCP, opened with a hello. */
static int connect_ctrl(st_group *g, int p, int64_t deadline)
{
	st_peer *q = &g->peers[p];
	st_frame f = frame(g, F_HELLO_CTRL, (uint32_t)getpid(), 0);
	int fd = -1, r, same_host = q->host == g->peers[g->rank].host;
	if (!same_host) {
		if ((r = dial(g, p, &f, deadline, &fd)) < 0)
			return r;
	} else {
		if ((r = unix_connect(q->uname, &fd)) == 0 && (r = st_send_full(fd, &f, sizeof(f), deadline)) < 0)
			close(fd);
		if (r < 0)
			return st_fail(ST_EPEER, "worker group: cannot connect to rank %d (same host, unix socket): %s", p,
				       r == -EACCES ? "its socket belongs to another user" : strerror(-r));
	}
	st_set_nonblock(fd, 1);
	pthread_mutex_lock(&g->mu);
	q->last_rx = st_mono_ns();
	q->ctrl_fd = fd;
	q->ctrl_unix = same_host;
	g->nconnected++;
	pthread_mutex_unlock(&g->mu);
	poke(g->mon_fd);
	return 0;
}

/* Wait until every higher rank has connected (the monitor accepts them). */
static int await_higher_ranks(st_group *g, int64_t deadline)
{
	int missing = -1, r;
	pthread_mutex_lock(&g->mu);
	while (g->nconnected < g->size - 1 && !atomic_load(&g->fail) && st_mono_ns() < deadline)
		cv_wait_ms(g, 50);
	for (int p = g->rank + 1; p < g->size && g->nconnected < g->size - 1; p++)
		if (g->peers[p].ctrl_fd < 0) {
			missing = p;
			break;
		}
	pthread_mutex_unlock(&g->mu);
	if ((r = st_group_check(g)) < 0)
		return r;
	if (missing >= 0)
		return st_fail(ST_EPEER, "worker group: rank %d did not connect within %d ms", missing, g->join_timeout_ms);
	return 0;
}

/* Connect g to the other processes: listen, meet them through the store,
 * start the monitor, open the control connections, free the coordinator port. */
static int connect_group(st_group *g, const st_group_env *e)
{
	char host[256];
	int port, r;
	raise_fd_limit(g->size);
	int64_t deadline = st_mono_ns() + (int64_t)g->join_timeout_ms * 1000000;
	if (st_split_hostport(e->coordinator, host, sizeof(host), &port) < 0)
		return st_fail(ST_EINVAL, "worker group: coordinator '%s' is not host:port", e->coordinator);
	if ((r = st_auth_check_bind(&g->tok, host)) < 0) {
		return st_wrap(r, "worker group (coordinator %s, from %s)", e->coordinator, e->source);
	}
	if ((r = open_listeners(g, e, host, port)) < 0 || (r = meet_through_store(g, e, host, port, deadline)) < 0 ||
	    (r = start_monitor(g)) < 0)
		return r;
	check_abort(g); /* an abort of this generation that came before its monitor */
	for (int p = 0; p < g->rank; p++)
		if ((r = connect_ctrl(g, p, deadline)) < 0)
			return r;
	if ((r = await_higher_ranks(g, deadline)) < 0)
		return r;
	/* Everybody has read every endpoint before connecting to rank 0, so the
	 * store is no longer needed: free the coordinator port. */
	st_store_server_stop(g->store);
	g->store = NULL;
	return 0;
}

int st_group_join(st_group **out, const st_group_opts *opts)
{
	st_group_env envbuf;
	const st_group_env *e = opts ? opts->env : NULL;
	st_group *g = NULL;
	int r;
	*out = NULL;
	if (!e) {
		if ((r = st_group_env_read(&envbuf)) < 0)
			return r;
		e = &envbuf;
	}
	if ((r = validate_env(e)) < 0 || (r = group_new(&g, e, opts)) < 0)
		return r;
	if ((r = st_token_load(&g->tok)) < 0 || (g->size > 1 && (r = connect_group(g, e)) < 0)) {
		st_group_leave(g);
		return r;
	}
	*out = g;
	return 0;
}

/* ---- the group and leaving it ---- */

int st_group_rank(const st_group *g) { return g->rank; }
int st_group_size(const st_group *g) { return g->size; }
int st_group_num_slices(const st_group *g) { return g->num_slices; }
int st_group_slice(const st_group *g, int rank)
{
	return rank >= 0 && rank < g->size ? rank / g->per_slice : -1;
}

void st_group_leave(st_group *g)
{
	if (!g)
		return;
	/* communicators still open are released with the group */
	while (g->comms) {
		st_comm *c = g->comms;
		g->comms = st_comm_next(c);
		st_comm_destroy(c);
	}
	/* A failure raised before this leave (st_group_abort, a failed join)
	 * that the monitor had no turn to forward goes to the peers ahead of
	 * the goodbye, else they would read "left the group" or "exited". One
	 * the monitor sees while this member leaves is not forwarded: a peer
	 * that ends meanwhile is no news to the others. */
	uint64_t failed_before = atomic_load(&g->fail);
	if (g->mon_running) {
		atomic_store(&g->stop, 1);
		poke(g->mon_fd);
		pthread_join(g->mon, NULL);
		g->mon_running = 0;
		if (failed_before && !atomic_load(&g->told))
			forward_failure(g);
	}
	st_frame bye = frame(g, F_BYE, 0, 0);
	for (int p = 0; g->peers && p < g->size; p++) {
		st_peer *q = &g->peers[p];
		if (q->ctrl_fd < 0)
			continue;
		ctrl_send_locked(g, p, &bye);
		close(q->ctrl_fd);
		q->ctrl_fd = -1;
	}
	while (g->pend) {
		st_pending *n = g->pend->next;
		if (g->pend->fd >= 0)
			close(g->pend->fd);
		free(g->pend);
		g->pend = n;
	}
	while (g->mail) {
		st_mail *n = g->mail->next;
		close(g->mail->fd);
		free(g->mail);
		g->mail = n;
	}
	while (g->ckeys) {
		st_ckey *n = g->ckeys->next;
		free(g->ckeys);
		g->ckeys = n;
	}
	st_store_server_stop(g->store);
	if (g->tcp_lfd >= 0)
		close(g->tcp_lfd);
	if (g->unix_lfd >= 0)
		close(g->unix_lfd);
	if (g->fail_fd >= 0)
		close(g->fail_fd);
	if (g->mon_fd >= 0)
		close(g->mon_fd);
	free(g->peers);
	st_token_clear(&g->tok);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
	free(g);
}
