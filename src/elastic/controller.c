/*
 * controller.c - the elastic controller (controller.h): one poll loop over
 * the listening socket and the agents' connections, and an explicit state
 * machine. docs/elastic.md describes the states, the failure semantics and
 * the accounting.
 */
#include "elastic/controller.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/status.h"
#include "base/file.h"
#include "base/version.h"
#include "ckpt/ckpt.h"
#include "comm/mesh.h"
#include "comm/net.h"
#include "config/config.h"
#include "elastic/proto.h"

enum { S_INITIALIZING, S_SCHEDULING, S_RUNNING, S_RESTARTING, S_RESIZING, S_FINISHED, S_ERRORED };
static const char *const state_names[] = {"INITIALIZING", "SCHEDULING", "RUNNING", "RESTARTING",
					  "RESIZING", "FINISHED", "ERRORED"};
enum { C_FREE, C_NEW, C_PENDING, C_AGENT, C_STATUS };
enum { STOP_NONE, STOP_RESIZE, STOP_NOTICE, STOP_KILL };
static const char *const stop_names[] = {"", "resize", "notice", "kill"};

#define MAX_CONNS 128
#define HELLO_TIMEOUT_S 5.0
#define READY_TIMEOUT_S 60.0 /* hello to ready: reading the probe on slow shared storage */
#define INIT_WAIT_S 10.0    /* INITIALIZING waits this long for every slice */
#define ADOPT_WAIT_S 3.0    /* ... and, when agents kept workers running, this long for every host
			       before it takes over their generation */
#define BACKOFF_MAX 64.0
#define STRAGGLER_FACTOR 1.5 /* a host this much slower than the group's median, --straggler-steps in a row */
#define STRAGGLER_MIN_S 0.05 /* ... and at least this much: a few ms of noise is no straggler */

typedef struct conn {
	st_proto_conn pc;
	char peer[64];     /* the peer's address, for the log */
	int kind, slice, host;
	double opened;
	int close_after_flush;
	long pid;          /* C_PENDING: the agent's hello, kept until it says ready */
	char addr[64];
	int port;
	uint64_t session;  /* its heartbeat datagrams' session (the welcome's "beat") */
	json_t *running;   /* C_PENDING: its hello's "running" (what it kept from a controller before) */
} conn;

typedef struct host {
	int conn; /* index into conns, -1 */
	long pid;
	char addr[64]; /* the address its processes bind (its hello) */
	int port;      /* a port free there (its last heartbeat): the coordinator's when it holds rank 0 */
	uint64_t session, beat_seq; /* its heartbeat datagrams: session, last sequence number */
	double last_hb, last_hb_wall, connected_wall;
	int noticed; /* sent a preemption notice: its going away is no failure */
	json_t *running; /* its hello's "running", until adopted or stopped (NULL: none) */
	double compute_s;   /* its workers' latest step compute (the slowest of them); < 0: none */
	long long compute_step, compute_gen;
	int slow_steps;     /* consecutive steps at least STRAGGLER_FACTOR x the group's median */
	int slow;           /* reported a straggler (until it is not for a step) */
} host;

typedef struct slice {
	host *h;
	double down_until;   /* mono; down (repair or back-off) until then */
	double repair_until; /* mono; the repair part of down_until (the rest is back-off) */
	double backoff;      /* multiplier of the next down time after a quick relapse */
	double up_mono;      /* when it last became healthy (mono), 0: not healthy */
	double fault_down;   /* the down time of an injected fault, < 0 none */
	int was_down;        /* marked down at least once */
	char why[160];       /* why it is down */
	const char *shown;   /* the state last shown (for "since") */
	double since_wall;
} slice;

typedef struct worker {
	int slice, host;
	long pid;
	int exited, code; /* code: exit status, 128+signal, -1 lost with its agent */
} worker;

typedef struct gen {
	int id, k, world, port;
	char coord_host[64];
	int from;          /* re-formed in place from generation `from` (0: started afresh) */
	int reform_wanted; /* a failure: tick() tries to re-form in place */
	int *slices;
	st_mesh mesh;
	worker *w;
	int nexited;
	int stop_how;
	double stop_mono;  /* when the resize or notice stop began (mono) */
	double fail_mono;  /* failure detected (mono); 0 none */
	double fail_wall;
	int failed, bad_input, preempt, preempt_slice;
	double preempt_down, preempt_wall;
	char *culprit;     /* per slice */
	char reason[200];
	int64_t first_step, last_step; /* -1 until the first completed step */
	int adopted;       /* taken over from a controller before this one (its workers ran on) */
	double start_mono;
	double kill_sent;  /* injected kill sent (mono), 0 none */
} gen;

struct st_ctl {
	st_ctl_opts o;
	st_config *cfg;
	int64_t steps;
	int lfd, ufd; /* the agents' TCP listener; the heartbeat datagrams' socket (same port) */
	char addr[96];
	char listen_host[64];
	conn conns[MAX_CONNS];
	slice *sl;
	st_ctl_fault *faults;
	int state;
	double start_mono, start_wall, state_since;
	int done, exit_status, interrupted;
	gen g;          /* the current (or last) generation; g.id 0: none yet */
	worker *prev_w; /* the workers of the generation g re-formed from (g.from), */
	int prev_world; /* whose lines still come until each worker re-formed */
	int gen_active; /* workers of g may be running */
	int next_gen;
	/* accounting */
	int failures, preemptions, resizes;
	int64_t steps_lost, hi;  /* hi: completed steps of the kept timeline */
	double *kept;            /* step time of each kept step */
	json_t *recovery;        /* array of seconds */
	double pending_recovery; /* failure detected (mono) awaiting the next step; 0 none */
	double grow_healthy;     /* the slice that made us grow became healthy (mono); 0 none */
	json_t *events;          /* waiting for the next gap between generations */
	double waiting_since; /* mono: fewer than --min-slices healthy since then, 0: not waiting */
	int last_k;
	double last_round; /* the end of the last st_ctl_poll (mono) */
	st_token tok;      /* the run token every connection proves */
	char build[ST_BUILD_ID_LEN + 1]; /* the workers' binary: every host must run the same */
	char *config_json; /* the resolved config the workers load (st_config_to_json) */
	char run_dir[ST_PATH_MAX], probe[ST_PATH_MAX + 64]; /* a file every host must see */
	char fence[ST_PATH_MAX + 16]; /* the newest generation, for the checkpoint writers (ckpt.h) */
	char nonce[33];
	st_drop_log drops; /* connections dropped before their hello */
	char epochs[ST_PATH_MAX + 16]; /* <run_dir>/controller: a file per controller epoch */
	long long epoch;   /* this controller's, claimed there (claim_epoch) */
	int deposed;       /* a newer epoch exists: leave, touching no worker */
	double epoch_checked; /* mono: the last look for a newer epoch */
};

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static double log_t0; /* the controller's start (mono), for the times in its lines */

static void logf_(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "slicetrain controller: [%8.3f] ", st_mono_s() - log_t0);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	fflush(stderr);
	va_end(ap);
}

static void transition(st_ctl *c, int to, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void transition(st_ctl *c, int to, const char *fmt, ...)
{
	char why[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	logf_("[State Transition] %s -> %s. (%s)", state_names[c->state], state_names[to], why);
	c->state = to;
	c->state_since = wall_s();
}

/* ---- sockets ---- */

static int listen_on(st_ctl *c, const char *host, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		return st_fail(ST_EINVAL, "controller: '%s' is not an IPv4 address", host);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return st_fail(ST_EIO, "controller: socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	socklen_t len = sizeof(a);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
		int e = errno;
		close(fd);
		return st_fail(ST_EIO, "controller: cannot listen on %s:%d: %s", host, port, strerror(e));
	}
	/* the heartbeat datagrams: UDP on the same address and port */
	int ufd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (ufd < 0 || bind(ufd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;
		if (ufd >= 0)
			close(ufd);
		close(fd);
		st_fail(ST_EIO, "controller: cannot bind UDP %s:%d for the heartbeats: %s", host, ntohs(a.sin_port),
			strerror(e));
		return port ? ST_EIO : 1; /* any port: another try */
	}
	c->lfd = fd;
	c->ufd = ufd;
	snprintf(c->addr, sizeof(c->addr), "%s:%d", host, ntohs(a.sin_port));
	return 0;
}

/* listen_on; with port 0, again while the kernel's TCP port is taken for UDP. */
static int listen_any(st_ctl *c, const char *host, int port)
{
	int rc = 1;
	for (int t = 0; t < 20 && rc == 1; t++)
		rc = listen_on(c, host, port);
	return rc == 1 ? ST_EIO : rc;
}

static void conn_drop(st_ctl *c, int i, const char *why);

static int send_to(st_ctl *c, int i, json_t *msg)
{
	int rc = -1;
	/* every message names the controller's epoch: an agent obeys the newest it has seen */
	if (msg && c->conns[i].kind != C_FREE && !json_object_set_new(msg, "epoch", json_integer(c->epoch)))
		rc = st_proto_send(&c->conns[i].pc, msg);
	json_decref(msg);
	if (rc < 0 && c->conns[i].kind != C_FREE) {
		char why[300];
		snprintf(why, sizeof(why), "cannot send: %s", st_errmsg());
		conn_drop(c, i, why);
	}
	return rc;
}

/* Send msg (a new reference, consumed) to the agent of (slice, host). */
static int send_agent(st_ctl *c, int s, int h, json_t *msg)
{
	int i = c->sl[s].h[h].conn;
	if (i < 0) {
		json_decref(msg);
		return -1;
	}
	return send_to(c, i, msg);
}

/* ---- slices ---- */

static int host_ok(const st_ctl *c, const host *h, double now)
{
	return h->conn >= 0 && !h->noticed && now - h->last_hb <= c->o.heartbeat_timeout_s;
}

static int slice_healthy(const st_ctl *c, int s, double now)
{
	const slice *x = &c->sl[s];
	if (now < x->down_until)
		return 0;
	for (int h = 0; h < c->o.hosts_per_slice; h++)
		if (!host_ok(c, &x->h[h], now))
			return 0;
	return 1;
}

/* Repaired, its hosts back, but kept out by its back-off: a slice the group
 * may take anyway when fewer than --min-slices are healthy without it (the
 * back-off keeps a flapping slice out of a group that can run without it;
 * it must not stop the run). */
static int held_back(const st_ctl *c, int s, double now)
{
	const slice *x = &c->sl[s];
	if (now < x->repair_until || now >= x->down_until)
		return 0;
	for (int h = 0; h < c->o.hosts_per_slice; h++)
		if (!host_ok(c, &x->h[h], now))
			return 0;
	return 1;
}

static int in_group(const st_ctl *c, int s)
{
	if (!c->gen_active)
		return 0;
	for (int i = 0; i < c->g.k; i++)
		if (c->g.slices[i] == s)
			return 1;
	return 0;
}

static const char *slice_state(const st_ctl *c, int s, double now)
{
	if (in_group(c, s))
		return "in group";
	if (now < c->sl[s].repair_until)
		return "down";
	if (now < c->sl[s].down_until)
		return "back-off";
	return slice_healthy(c, s, now) ? "healthy" : "missing hosts";
}

/* Mark slice s down for down_s (times its back-off when it fails again soon
 * after returning). */
static void mark_down(st_ctl *c, int s, double down_s, int counts_backoff, const char *why)
{
	slice *x = &c->sl[s];
	double now = st_mono_s();
	if (counts_backoff && x->was_down && x->up_mono > 0 && now - x->up_mono < c->o.backoff_window_s) {
		x->backoff = x->backoff < BACKOFF_MAX ? x->backoff * 2 : BACKOFF_MAX;
		logf_("slice %d failed again %.1f s after returning: back-off x%g", s, now - x->up_mono, x->backoff);
	} else if (counts_backoff) {
		x->backoff = 1;
	}
	double d = down_s * (counts_backoff ? x->backoff : 1);
	if (now + d > x->down_until)
		x->down_until = now + d;
	if (now + down_s > x->repair_until)
		x->repair_until = now + down_s;
	x->was_down = 1;
	x->up_mono = 0;
	snprintf(x->why, sizeof(x->why), "%s", why);
	logf_("slice %d is down for %.1f s: %s", s, d, why);
}

/* Called every round: notice slices becoming healthy (for growth timing and
 * the back-off window) and state changes (for "since"). */
static void refresh_slices(st_ctl *c, double now)
{
	for (int s = 0; s < c->o.num_slices; s++) {
		slice *x = &c->sl[s];
		int ok = slice_healthy(c, s, now);
		if (ok && x->up_mono == 0) {
			x->up_mono = now;
			if (x->was_down)
				logf_("slice %d is healthy again", s);
		} else if (!ok && !in_group(c, s)) {
			x->up_mono = 0;
		}
		const char *st = slice_state(c, s, now);
		if (st != x->shown) {
			x->shown = st;
			x->since_wall = wall_s();
		}
	}
}

/* ---- the mesh ---- */

static const char *const dcn_keys[ST_NAXES] = {"dcn_data_parallelism", "dcn_fsdp_parallelism",
					       "dcn_tensor_parallelism"};

static int64_t dcn_value(const st_config *cfg, int a)
{
	return a == ST_AXIS_DATA ? cfg->dcn_data_parallelism
	       : a == ST_AXIS_FSDP ? cfg->dcn_fsdp_parallelism
				   : cfg->dcn_tensor_parallelism;
}

/* The mesh for k slices; ST_EINVAL naming the axis when it does not resolve
 * or an explicit DCN axis no longer fits. */
static int mesh_for(const st_ctl *c, int k, st_mesh *m)
{
	int rc = st_mesh_resolve(m, c->cfg, k, c->o.devices_per_slice);
	if (rc < 0) {
		return st_wrap(rc, "the mesh does not resolve for %d slice%s", k, k == 1 ? "" : "s");
	}
	for (int a = 0; a < ST_NAXES; a++) {
		int64_t v = dcn_value(c->cfg, a);
		if (v != -1 && v != m->dcn[a])
			return st_fail(ST_EINVAL, "%s=%lld does not fit %d slice%s (elastic runs give their DCN axes "
						  "as -1)",
				       dcn_keys[a], (long long)v, k, k == 1 ? "" : "s");
	}
	return 0;
}

static void mesh_text(const st_mesh *m, char *buf, size_t n)
{
	snprintf(buf, n, "%lld slice%s x %lld devices: data %lld (dcn %lld), fsdp %lld (dcn %lld), tensor %lld (dcn %lld)",
		 (long long)m->num_slices, m->num_slices == 1 ? "" : "s", (long long)m->devices_per_slice,
		 (long long)m->size[0], (long long)m->dcn[0], (long long)m->size[1], (long long)m->dcn[1],
		 (long long)m->size[2], (long long)m->dcn[2]);
}

/* The largest slice count in [min, avail] the mesh resolves for, else 0. */
static int best_k(const st_ctl *c, int avail)
{
	st_mesh m;
	if (avail > c->o.num_slices)
		avail = c->o.num_slices;
	for (int k = avail; k >= c->o.min_slices; k--)
		if (mesh_for(c, k, &m) == 0)
			return k;
	return 0;
}

/* ---- events and the summary ---- */

static void event(st_ctl *c, const char *kind, double when, int64_t step, json_t *slices, json_t *extra)
{
	json_t *e = json_pack("{s:s, s:f, s:I, s:o}", "event", kind, "time", when, "step", (json_int_t)step, "slices",
			      slices ? slices : json_array());
	if (!e) {
		json_decref(extra);
		return;
	}
	if (extra) {
		json_object_update(e, extra);
		json_decref(extra);
	}
	json_array_append_new(c->events, e);
}

static json_t *slice_list(const int *s, int n)
{
	json_t *a = json_array();
	for (int i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer(s[i]));
	return a;
}

/* Append the waiting events to metrics_file: only between generations. */
static void flush_events(st_ctl *c)
{
	size_t n = json_array_size(c->events);
	if (!n)
		return;
	if (c->cfg->metrics_file[0]) {
		/* one write(2) a line, O_APPEND: rank 0 may be appending its step
		 * records at the same time (a generation re-formed in place) */
		int fd = open(c->cfg->metrics_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0) {
			st_warn("cannot append to metrics_file '%s': %s", c->cfg->metrics_file, strerror(errno));
		} else {
			int bad = 0;
			for (size_t i = 0; i < n; i++) {
				char *line = json_dumps(json_array_get(c->events, i), JSON_COMPACT | JSON_REAL_PRECISION(17));
				size_t len = line ? strlen(line) : 0;
				if (line) {
					line[len] = '\n';
					bad |= write(fd, line, len + 1) != (ssize_t)(len + 1);
				}
				free(line);
			}
			if (close(fd) || bad)
				st_warn("cannot write metrics_file '%s'", c->cfg->metrics_file);
		}
	}
	json_array_clear(c->events);
}

static json_t *summary(const st_ctl *c)
{
	double good = 0, wall = st_mono_s() - c->start_mono;
	for (int64_t s = 0; s < c->steps; s++)
		good += c->kept[s];
	return json_pack("{s:s, s:i, s:i, s:i, s:I, s:O, s:f, s:f, s:f}", "event", "summary", "failures", c->failures,
			 "preemptions", c->preemptions, "resizes", c->resizes, "steps_lost", (json_int_t)c->steps_lost,
			 "recovery_s", c->recovery, "goodput", wall > 0 ? good / wall : 0.0, "good_s", good, "wall_s",
			 wall);
}

static void shutdown_agents(st_ctl *c)
{
	for (int i = 0; i < MAX_CONNS; i++)
		if (c->conns[i].kind == C_AGENT) {
			json_t *m = json_pack("{s:s}", "type", "shutdown");
			send_to(c, i, m);
		}
}

/* The run ends: the summary (metrics file and stdout), shutdown to the agents. */
static void finish(st_ctl *c, int state, int status, const char *why)
{
	if (c->done)
		return;
	transition(c, state, "%s", why);
	json_t *s = summary(c);
	if (s) {
		char *line = json_dumps(s, JSON_COMPACT | JSON_REAL_PRECISION(6));
		json_array_append(c->events, s);
		if (line) {
			printf("%s\n", line);
			fflush(stdout);
		}
		free(line);
		json_decref(s);
	}
	if (!c->gen_active)
		flush_events(c);
	if (!c->deposed) /* a deposed controller's workers belong to the newer one */
		shutdown_agents(c);
	c->done = 1;
	c->exit_status = status;
}

/* ---- generations ---- */

static void gen_release(gen *g)
{
	free(g->slices);
	free(g->w);
	free(g->culprit);
	memset(g, 0, sizeof(*g));
}

static int gen_slice_index(const gen *g, int s)
{
	for (int i = 0; i < g->k; i++)
		if (g->slices[i] == s)
			return i;
	return -1;
}

/* Send stop how to every agent holding workers of the generation. */
static void gen_stop(st_ctl *c, int how)
{
	gen *g = &c->g;
	g->stop_how = how;
	g->stop_mono = st_mono_s();
	for (int i = 0; i < g->k; i++)
		for (int h = 0; h < c->o.hosts_per_slice; h++)
			send_agent(c, g->slices[i], h,
				   json_pack("{s:s, s:i, s:s}", "type", "stop", "gen", g->id, "how", stop_names[how]));
}

/* c->g (released) laid out on k slices: its mesh, and each rank's slice
 * and host (slice-major ranks); no step seen yet. */
static int gen_layout(st_ctl *c, int k, const int *slices)
{
	gen *g = &c->g;
	int dps = c->o.devices_per_slice, per_host = dps / c->o.hosts_per_slice;
	g->k = k;
	g->world = k * dps;
	g->first_step = g->last_step = -1;
	g->start_mono = st_mono_s();
	if (!(g->slices = malloc((size_t)k * sizeof(int))) || !(g->w = calloc((size_t)g->world, sizeof(worker))) ||
	    !(g->culprit = calloc((size_t)c->o.num_slices, 1)))
		return st_fail(ST_ENOMEM, "out of memory");
	memcpy(g->slices, slices, (size_t)k * sizeof(int));
	for (int r = 0; r < g->world; r++) {
		g->w[r].slice = slices[r / dps];
		g->w[r].host = (r % dps) / per_host;
	}
	return mesh_for(c, k, &g->mesh);
}

/* A new generation of k slices in c->g (the previous one released): its
 * mesh, coordinator and the workers' environment (*env, a new reference).
 * Unless it keeps every slice of the one before, its number is in the run
 * directory's fence before anything of it is sent, so that no worker of an
 * older generation commits a checkpoint from then on. */
static int gen_init(st_ctl *c, int k, const int *slices, const gen *prev, json_t **env)
{
	gen *g = &c->g;
	/* a generation that keeps every slice of the one before (a growth)
	 * leaves no worker behind: the fence stays, and the save its workers
	 * have in flight still commits */
	int keeps_all = prev && prev->slices != NULL;
	for (int i = 0; keeps_all && i < prev->k; i++) {
		keeps_all = 0;
		for (int j = 0; j < k; j++)
			keeps_all |= slices[j] == prev->slices[i];
	}
	gen_release(g);
	*env = NULL;
	g->id = ++c->next_gen;
	int rc = keeps_all ? 0 : st_ckpt_fence_write(c->fence, g->id);
	if (rc < 0)
		return st_wrap(rc, "the generation fence");
	if ((rc = gen_layout(c, k, slices)) < 0)
		return rc;
	/* the coordinator (rank 0's store) on rank 0's host: its address, and
	 * the port its agent last found free there */
	const host *h0 = &c->sl[slices[0]].h[0];
	g->port = h0->port;
	snprintf(g->coord_host, sizeof(g->coord_host), "%s", h0->addr);
	char coord[96], v[32];
	snprintf(coord, sizeof(coord), strchr(g->coord_host, ':') ? "[%s]:%d" : "%s:%d", g->coord_host, g->port);
	json_t *e = json_object();
	if (!e)
		return st_fail(ST_ENOMEM, "out of memory");
	json_object_set_new(e, "SLICETRAIN_COORDINATOR", json_string(coord));
	snprintf(v, sizeof(v), "%d", g->world);
	json_object_set_new(e, "SLICETRAIN_WORLD_SIZE", json_string(v));
	snprintf(v, sizeof(v), "%d", k);
	json_object_set_new(e, "SLICETRAIN_NUM_SLICES", json_string(v));
	snprintf(v, sizeof(v), "%d", c->o.num_slices * c->o.devices_per_slice);
	json_object_set_new(e, "SLICETRAIN_ELASTIC_MAX_DEVICES", json_string(v));
	snprintf(v, sizeof(v), "%d", g->id);
	json_object_set_new(e, "SLICETRAIN_GENERATION", json_string(v));
	if (c->o.step_watchdog_ms > 0) {
		snprintf(v, sizeof(v), "%d", c->o.step_watchdog_ms);
		json_object_set_new(e, "SLICETRAIN_STEP_WATCHDOG_MS", json_string(v));
	}
	*env = e;
	return 0;
}

/* "start" to the agents of slices i0..k-1 of the generation (env: theirs). */
static void gen_send_starts(st_ctl *c, int i0, json_t *env)
{
	gen *g = &c->g;
	json_t *args = json_array();
	int per_host = c->o.devices_per_slice / c->o.hosts_per_slice;
	for (int i = i0; i < g->k; i++)
		for (int h = 0; h < c->o.hosts_per_slice; h++) {
			json_t *ranks = json_array();
			for (int d = 0; d < per_host; d++)
				json_array_append_new(ranks, json_integer(i * c->o.devices_per_slice + h * per_host + d));
			json_t *m = json_pack("{s:s, s:i, s:o, s:O, s:O, s:i, s:s, s:o}", "type", "start", "gen", g->id,
					      "ranks", ranks, "env", env, "args", args, "threads", c->o.threads, "config",
					      c->config_json, "slices", slice_list(g->slices, g->k));
			send_agent(c, g->slices[i], h, m);
		}
	json_decref(args);
}

static void gen_log(st_ctl *c, const char *how)
{
	gen *g = &c->g;
	char mesh[200], list[256] = "";
	mesh_text(&g->mesh, mesh, sizeof(mesh));
	for (int i = 0, len = 0; i < g->k && len < 200; i++)
		len += snprintf(list + len, sizeof(list) - (size_t)len, "%s%d", i ? "," : "", g->slices[i]);
	logf_("generation %d: %d worker%s on slice%s %s, coordinator %s:%d; mesh %s%s", g->id, g->world,
	      g->world == 1 ? "" : "s", g->k == 1 ? "" : "s", list, g->coord_host, g->port, mesh, how);
}

static int start_gen(st_ctl *c, int k, const int *slices)
{
	json_t *env;
	int rc = gen_init(c, k, slices, &c->g, &env);
	if (rc < 0) {
		json_decref(env);
		return rc;
	}
	gen_log(c, "");
	gen_send_starts(c, 0, env);
	json_decref(env);
	c->gen_active = 1;
	return 0;
}

/* Can the group move from mesh `from` to k slices in place: only the DCN
 * data axis changes, so every process keeps its shard (worker.h)? */
static int in_place_ok(const st_ctl *c, const st_mesh *from, int k)
{
	st_mesh m;
	if (!c->o.in_place || mesh_for(c, k, &m) < 0)
		return 0;
	for (int a = 0; a < ST_NAXES; a++)
		if (m.ici[a] != from->ici[a] || (a != ST_AXIS_DATA && m.dcn[a] != from->dcn[a]))
			return 0;
	return 1;
}

/*
 * Re-form in place: a new generation on slices[0..k), whose first nkeep are
 * slices of the running generation (their workers re-form: "reform" to
 * their agents) and the rest join (new workers, SLICETRAIN_JOIN=1: fed by a
 * peer). The old generation's workers on slices left out are killed.
 */
static int reform_gen(st_ctl *c, int k, const int *slices, int nkeep)
{
	gen old = c->g;
	memset(&c->g, 0, sizeof(c->g));
	json_t *env;
	int rc = gen_init(c, k, slices, &old, &env);
	gen *g = &c->g;
	g->from = old.id;
	int dps = c->o.devices_per_slice, per_host = dps / c->o.hosts_per_slice;
	for (int i = 0; rc == 0 && i < nkeep; i++) {
		int oi = gen_slice_index(&old, slices[i]);
		for (int h = 0; h < c->o.hosts_per_slice; h++) {
			json_t *ws = json_array();
			for (int d = 0; d < per_host; d++) {
				int r = i * dps + h * per_host + d, o = oi * dps + h * per_host + d;
				g->w[r].pid = old.w[o].pid;
				json_array_append_new(ws, json_pack("{s:i, s:i}", "old", o, "rank", r));
			}
			send_agent(c, slices[i], h, json_pack("{s:s, s:i, s:i, s:o, s:O, s:b, s:o}", "type", "reform",
							      "gen", g->id, "from", old.id, "workers", ws, "env", env,
							      "abort", nkeep == k, "slices", slice_list(g->slices, g->k)));
		}
	}
	if (rc == 0 && nkeep < k) {
		json_object_set_new(env, "SLICETRAIN_JOIN", json_string("1"));
		gen_send_starts(c, nkeep, env);
	}
	for (int r = 0; r < old.world; r++) /* the old generation's workers left out */
		if (!old.w[r].exited && (rc < 0 || gen_slice_index(g, old.w[r].slice) < 0 ||
					 gen_slice_index(g, old.w[r].slice) >= nkeep))
			send_agent(c, old.w[r].slice, old.w[r].host,
				   json_pack("{s:s, s:i, s:i}", "type", "kill", "gen", old.id, "rank", r));
	json_decref(env);
	free(c->prev_w);
	c->prev_w = old.w; /* their lines, until each worker says it re-formed */
	c->prev_world = old.world;
	old.w = NULL;
	gen_release(&old);
	if (rc < 0)
		return rc;
	char how[96];
	snprintf(how, sizeof(how), "; re-formed in place from generation %d%s", g->from,
		 nkeep < k ? ", the new slices fed by a peer" : "");
	gen_log(c, how);
	c->gen_active = 1;
	return 0;
}

/* A preemption notice for slice s (down for down_s afterwards); the first one counts. */
static void gen_preempt(gen *g, int s, double down_s)
{
	if (g->preempt)
		return;
	g->preempt = 1;
	g->preempt_slice = s;
	g->preempt_down = down_s;
	g->preempt_wall = wall_s();
}

static void gen_failure(st_ctl *c, int s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failure in the running generation: the culprit slice s (-1 unknown). */
static void gen_failure(st_ctl *c, int s, const char *fmt, ...)
{
	gen *g = &c->g;
	char why[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (s >= 0)
		g->culprit[s] = 1;
	if (g->failed)
		return;
	g->failed = 1;
	g->fail_mono = st_mono_s();
	g->fail_wall = wall_s();
	snprintf(g->reason, sizeof(g->reason), "%s", why);
	if (g->kill_sent > 0)
		logf_("failure detected %.3f s after the injected kill", g->fail_mono - g->kill_sent);
	if (!c->done)
		transition(c, S_RESTARTING, "%s", why);
	/* a generation that has not completed a step has nothing to save, and its
	 * survivors may be waiting for the lost worker inside the rendezvous:
	 * stop them now rather than after the grace period */
	if (g->first_step < 0 && !g->adopted && !g->bad_input && g->stop_how != STOP_KILL && g->nexited < g->world) {
		logf_("generation %d had not completed a step: stop how=kill", g->id);
		gen_stop(c, STOP_KILL);
	} else if (c->o.in_place && !g->bad_input && g->stop_how == STOP_NONE) {
		g->reform_wanted = 1; /* tick(), once this round's reports are in */
	}
}

/* A worker of a noticed generation ended without saving (killed by the
 * notice's SIGTERM before its stop handlers were installed, or never
 * started): before the generation's first step nothing is lost by stopping
 * it now, and its peers would otherwise wait for it until the grace. */
static void notice_unsaved(st_ctl *c, int r, const char *how)
{
	gen *g = &c->g;
	if (g->first_step >= 0 || g->stop_how == STOP_KILL || g->nexited >= g->world)
		return;
	logf_("worker rank %d %s before generation %d's first step: stop how=kill", r, how, g->id);
	gen_stop(c, STOP_KILL);
}

/* Worker r of the running generation ended with code (exit status, or
 * 128+signal; -1: lost with its agent); signal: the signal that killed it,
 * 0 if it exited (a trainer stopped by a notice exits with status 143). */
static void worker_exited(st_ctl *c, int r, int code, int signal, const char *why)
{
	gen *g = &c->g;
	worker *w = &g->w[r];
	if (w->exited)
		return;
	w->exited = 1;
	w->code = code;
	g->nexited++;
	if (g->stop_how == STOP_KILL || c->done)
		return;
	if (code == 0)
		return;
	if (code == ST_EXIT_RESIZE && (g->stop_how == STOP_RESIZE || g->stop_how == STOP_NOTICE))
		return;
	if (code == ST_EXIT_NOTICE && (g->stop_how == STOP_NOTICE || (!g->failed && g->stop_how == STOP_NONE))) {
		if (g->stop_how == STOP_NONE) {
			/* SIGTERM from outside to a worker: a preemption notice */
			g->stop_how = STOP_NOTICE;
			g->stop_mono = st_mono_s();
			gen_preempt(g, w->slice, c->o.repair_delay);
			transition(c, S_RESIZING, "worker rank %d of slice %d got a preemption notice (SIGTERM)", r,
				   w->slice);
		}
		if (signal == ST_SIG_NOTICE)
			notice_unsaved(c, r, "was killed by its SIGTERM");
		return;
	}
	if (code == ST_EXIT_RESIZE && !g->failed && g->stop_how == STOP_NONE) {
		g->stop_how = STOP_RESIZE; /* SIGUSR1 from outside: saved, stopped */
		g->stop_mono = st_mono_s();
		transition(c, S_RESIZING, "worker rank %d of slice %d stopped after a resize request (SIGUSR1)", r,
			   w->slice);
		return;
	}
	if (code == ST_EXIT_BAD_INPUT) {
		g->bad_input = 1;
		gen_failure(c, -1, "worker rank %d exited with status 2 (bad input)", r);
		return;
	}
	if (code == ST_EXIT_PEER)
		gen_failure(c, -1, "worker rank %d of slice %d exited with status 3 (a peer failed)", r, w->slice);
	else if (code == -1)
		gen_failure(c, w->slice, "worker rank %d of slice %d was lost with its agent", r, w->slice);
	else if (why)
		gen_failure(c, w->slice, "worker rank %d of slice %d was %.100s", r, w->slice, why);
	else if (signal)
		gen_failure(c, w->slice, "worker rank %d of slice %d was killed by signal %d", r, w->slice, signal);
	else
		gen_failure(c, w->slice, "worker rank %d of slice %d exited with status %d", r, w->slice, code);
}

/* The running generation's failure: its culprit slices down (repair delay,
 * back-off), counted, the event. -1 when it was one too many (the run then
 * ended, ERRORED, exit 3). */
static int account_failure(st_ctl *c)
{
	gen *g = &c->g;
	int any = 0;
	for (int s = 0; s < c->o.num_slices; s++)
		any |= g->culprit[s];
	if (!any) /* only "a peer failed" reports: blame the first reporter's slice */
		for (int r = 0; r < g->world && !any; r++)
			if (g->w[r].code == ST_EXIT_PEER)
				g->culprit[g->w[r].slice] = any = 1;
	int bad[64], nb = 0;
	for (int s = 0; s < c->o.num_slices; s++) {
		if (!g->culprit[s])
			continue;
		if (nb < 64)
			bad[nb++] = s;
		double d = c->sl[s].fault_down >= 0 ? c->sl[s].fault_down : c->o.repair_delay;
		c->sl[s].fault_down = -1;
		mark_down(c, s, d, 1, g->reason);
	}
	c->failures++;
	event(c, "failure", g->fail_wall, c->hi, slice_list(bad, nb),
	      json_pack("{s:s, s:i, s:i}", "reason", g->reason, "gen", g->id, "failures", c->failures));
	c->pending_recovery = g->fail_mono;
	c->grow_healthy = 0; /* a failure interrupted the growth: no growth time to report */
	if (c->o.max_failures >= 0 && c->failures > c->o.max_failures) {
		char why[300];
		snprintf(why, sizeof(why), "%d failures, more than --max-failures %d (the last: %s)", c->failures,
			 c->o.max_failures, g->reason);
		finish(c, S_ERRORED, 3, why);
		return -1;
	}
	return 0;
}

/*
 * After a failure (tick): re-form in place on the generation's slices that
 * are whole and healthy, when the generation completed a step (every worker
 * holds the state) and only the DCN data axis changes. 1 when done (or the
 * run ended on --max-failures), 0 when not possible.
 */
static int reform_after_failure(st_ctl *c, double now)
{
	gen *g = &c->g;
	g->reform_wanted = 0;
	if (!c->o.in_place || g->bad_input || c->done || g->stop_how != STOP_NONE || (g->first_step < 0 && !g->adopted))
		return 0;
	int keep[4096], nk = 0, dps = c->o.devices_per_slice, any = 0;
	for (int i = 0; i < g->k && nk < 4096; i++) {
		int s = g->slices[i], ok = !g->culprit[s] && now >= c->sl[s].down_until;
		any |= g->culprit[s];
		for (int h = 0; ok && h < c->o.hosts_per_slice; h++)
			ok = host_ok(c, &c->sl[s].h[h], now);
		for (int d = 0; ok && d < dps; d++)
			ok = !g->w[i * dps + d].exited;
		if (ok)
			keep[nk++] = s;
	}
	int k = best_k(c, nk);
	if (!any || !k || !in_place_ok(c, &g->mesh, k))
		return 0;
	int from = g->k;
	if (account_failure(c) < 0)
		return 1;
	if (k != from) {
		c->resizes++;
		event(c, "shrink", wall_s(), c->hi, slice_list(keep, k), json_pack("{s:i, s:i}", "from", from, "to", k));
	}
	flush_events(c);
	if (reform_gen(c, k, keep, k) < 0) {
		char why[300];
		snprintf(why, sizeof(why), "cannot re-form generation %d: %s", c->next_gen, st_errmsg());
		finish(c, S_ERRORED, 1, why);
	}
	return 1;
}

/* Every worker of the generation ended: account, then decide what comes next. */
static void gen_ended(st_ctl *c)
{
	gen *g = &c->g;
	double now = st_mono_s();
	c->gen_active = 0;
	c->last_k = g->k;
	int all_zero = 1;
	for (int r = 0; r < g->world; r++)
		all_zero &= g->w[r].code == 0;
	logf_("generation %d ended (%d workers)", g->id, g->world);
	if (c->interrupted || c->done) {
		flush_events(c);
		return;
	}
	if (g->bad_input) {
		finish(c, S_ERRORED, 2, "a worker found bad input (exit status 2): the run cannot go on");
		return;
	}
	if (all_zero && !g->failed) {
		finish(c, S_FINISHED, 0, "every worker finished its steps");
		return;
	}
	if (g->failed) {
		if (account_failure(c) < 0)
			return;
		flush_events(c);
		char lim[32] = "unlimited";
		if (c->o.max_failures >= 0)
			snprintf(lim, sizeof(lim), "%d", c->o.max_failures);
		transition(c, S_SCHEDULING, "generation %d stopped after the failure; failure %d (at most %s)", g->id,
			   c->failures, lim);
		return;
	}
	if (g->preempt) {
		c->preemptions++;
		int s = g->preempt_slice;
		mark_down(c, s, g->preempt_down, 0, "preempted");
		event(c, "preemption", g->preempt_wall, c->hi, slice_list(&s, 1), json_pack("{s:i}", "gen", g->id));
	}
	(void)now;
	flush_events(c);
	transition(c, S_SCHEDULING, "generation %d stopped after saving at step %lld", g->id, (long long)c->hi);
}

/* Rank 0 completed step n (seconds secs). */
static void on_step(st_ctl *c, int64_t n, double secs)
{
	gen *g = &c->g;
	double now = st_mono_s();
	if (g->first_step < 0) {
		g->first_step = n;
		if (c->hi > n) { /* a rollback: the steps after n were discarded */
			c->steps_lost += c->hi - n;
			for (int64_t s = n; s < c->hi && s < c->steps; s++)
				c->kept[s] = 0;
		}
		if (g->from) { /* re-formed in place: no process started anew, no checkpoint read */
			event(c, "reform", wall_s(), n, slice_list(g->slices, g->k),
			      json_pack("{s:i, s:i, s:I, s:f}", "gen", g->id, "from", g->from, "steps_lost",
					(json_int_t)(c->hi > n ? c->hi - n : 0), "seconds", now - g->start_mono));
			flush_events(c);
			transition(c, S_RUNNING, "generation %d re-formed in place on %d slice%s, at step %lld", g->id, g->k,
				   g->k == 1 ? "" : "s", (long long)n);
		}
		if (g->adopted)
			logf_("generation %d: step %lld is its first under this controller", g->id, (long long)n);
		else if (g->id > 1) {
			int64_t lost = c->hi > n ? c->hi - n : 0;
			if (!g->from)
				event(c, "restore", wall_s(), n, slice_list(g->slices, g->k),
				      json_pack("{s:i, s:I}", "gen", g->id, "steps_lost", (json_int_t)lost));
			logf_("generation %d resumed at step %lld on %d slice%s (%lld step%s lost); %.2f s after it started",
			      g->id, (long long)n, g->k, g->k == 1 ? "" : "s", (long long)lost, lost == 1 ? "" : "s",
			      now - g->start_mono);
		}
		c->hi = n;
		if (c->pending_recovery > 0) {
			json_array_append_new(c->recovery, json_real(now - c->pending_recovery));
			logf_("recovery: %.2f s from the failure's detection to the first step after it",
			      now - c->pending_recovery);
			c->pending_recovery = 0;
		}
		if (c->grow_healthy > 0) {
			logf_("growth: %.2f s from the slice being healthy to the first step on %d slices",
			      now - c->grow_healthy, g->k);
			c->grow_healthy = 0;
		}
	}
	g->last_step = n;
	if (n + 1 > c->hi)
		c->hi = n + 1;
	if (n >= 0 && n < c->steps)
		c->kept[n] = secs;
	/* injected faults */
	for (int f = 0; f < c->o.nfaults; f++) {
		st_ctl_fault *x = &c->faults[f];
		int i = gen_slice_index(g, x->slice);
		if (x->done || n < x->step || g->stop_how != STOP_NONE || g->failed || i < 0)
			continue; /* a slice out of the group: when it is back */
		x->done = 1;
		double down = x->down_s >= 0 ? x->down_s : c->o.repair_delay;
		if (x->kind == ST_FAULT_KILL) {
			int r = i * c->o.devices_per_slice;
			logf_("fault: SIGKILL to worker rank %d (slice %d) after step %lld", r, x->slice, (long long)n);
			c->sl[x->slice].fault_down = down;
			g->kill_sent = st_mono_s();
			send_agent(c, x->slice, g->w[r].host, json_pack("{s:s, s:i, s:i}", "type", "kill", "gen", g->id, "rank", r));
		} else {
			logf_("fault: preemption notice to slice %d after step %lld", x->slice, (long long)n);
			gen_preempt(g, x->slice, down);
			g->stop_how = STOP_NOTICE;
			g->stop_mono = st_mono_s();
			for (int h = 0; h < c->o.hosts_per_slice; h++)
				send_agent(c, x->slice, h, json_pack("{s:s, s:i, s:s}", "type", "stop", "gen", g->id, "how", "notice"));
			transition(c, S_RESIZING, "slice %d preempted (injected at step %lld)", x->slice, (long long)n);
		}
		break;
	}
}

/* A line of rank `rank`; prev: of the generation the current one re-formed
 * from (its steps before the re-formation are kept steps too). */
static void on_output(st_ctl *c, int rank, int err, const char *text, int prev)
{
	FILE *f = err ? stderr : stdout;
	if (rank)
		fprintf(f, "[rank %d] %s\n", rank, text);
	else
		fprintf(f, "%s\n", text);
	fflush(f);
	if (rank != 0 || err)
		return;
	long long n;
	double secs;
	if (sscanf(text, "completed step: %lld, seconds: %lf", &n, &secs) != 2)
		return;
	if (!prev) {
		on_step(c, n, secs);
	} else if (n >= 0 && n < c->steps) {
		c->kept[n] = secs;
		if (n + 1 > c->hi)
			c->hi = n + 1;
	}
}

/* ---- messages ---- */

static void conn_drop(st_ctl *c, int i, const char *why)
{
	conn *x = &c->conns[i];
	if (x->kind == C_FREE)
		return;
	if (x->kind == C_AGENT) {
		int s = x->slice, h = x->host;
		host *hh = &c->sl[s].h[h];
		hh->conn = -1;
		if (!c->done)
			logf_("agent of slice %d host %d (pid %ld) lost: %s", s, h, hh->pid, why);
		int was_noticed = hh->noticed;
		hh->noticed = 0;
		json_decref(hh->running);
		hh->running = NULL;
		if (c->gen_active && !c->done) {
			gen *g = &c->g;
			for (int r = 0; r < g->world; r++)
				if (g->w[r].slice == s && g->w[r].host == h && !g->w[r].exited) {
					if (was_noticed && !g->w[r].pid) {
						worker_exited(c, r, 143, 0, NULL);
						notice_unsaved(c, r, "was never started by its agent");
					} else if (was_noticed || g->stop_how == STOP_KILL)
						worker_exited(c, r, was_noticed ? 143 : -1, 0, NULL);
					else
						worker_exited(c, r, -1, 0, NULL);
				}
		} else if (c->gen_active) {
			gen *g = &c->g;
			for (int r = 0; r < g->world; r++)
				if (g->w[r].slice == s && g->w[r].host == h && !g->w[r].exited) {
					g->w[r].exited = 1;
					g->nexited++;
				}
		}
		if (!c->done && !was_noticed && !in_group(c, s))
			mark_down(c, s, c->o.repair_delay, 0, "agent lost");
		else if (!c->done && was_noticed && c->sl[s].down_until < st_mono_s() + 0.1)
			mark_down(c, s, c->o.repair_delay, 0, "preempted");
	} else if (x->kind == C_NEW) {
		st_auth_log_drop(&c->drops, "controller", x->peer, why); /* rate-limited */
	}
	st_proto_conn_release(&x->pc);
	json_decref(x->running);
	memset(x, 0, sizeof(*x));
	x->pc.fd = -1;
	x->kind = C_FREE;
}

static json_t *status_json(st_ctl *c)
{
	double now = st_mono_s(), wnow = wall_s();
	char mesh[200] = "";
	if (c->gen_active)
		mesh_text(&c->g.mesh, mesh, sizeof(mesh));
	json_t *sl = json_array();
	for (int s = 0; s < c->o.num_slices; s++) {
		json_t *hosts = json_array();
		for (int h = 0; h < c->o.hosts_per_slice; h++) {
			host *x = &c->sl[s].h[h];
			json_t *ws = json_array();
			for (int r = 0; c->gen_active && r < c->g.world; r++)
				if (c->g.w[r].slice == s && c->g.w[r].host == h)
					json_array_append_new(ws, json_pack("{s:i, s:I, s:b}", "rank", r, "pid",
									    (json_int_t)c->g.w[r].pid, "running",
									    !c->g.w[r].exited));
			json_array_append_new(hosts, json_pack("{s:i, s:I, s:s, s:b, s:f, s:o, s:f, s:b}", "host", h, "pid",
							       (json_int_t)(x->conn >= 0 ? x->pid : 0), "addr",
							       x->conn >= 0 ? x->addr : "", "connected", x->conn >= 0,
							       "last_heartbeat", x->conn >= 0 ? wnow - (now - x->last_hb) : 0.0,
							       "workers", ws, "compute_s",
							       x->compute_gen == c->g.id ? x->compute_s : -1.0, "slow", x->slow));
		}
		json_t *o = json_pack("{s:i, s:s, s:f, s:o}", "slice", s, "state", slice_state(c, s, now), "since",
				      c->sl[s].since_wall, "hosts", hosts);
		if (now < c->sl[s].down_until) {
			json_object_set_new(o, "why", json_string(c->sl[s].why));
			json_object_set_new(o, "down_until", json_real(wnow + c->sl[s].down_until - now));
		}
		json_array_append_new(sl, o);
	}
	return json_pack("{s:s, s:s, s:f, s:i, s:I, s:s, s:i, s:i, s:i, s:I, s:o}", "type", "status", "state",
			 state_names[c->state], "since", c->state_since, "gen", c->gen_active ? c->g.id : 0, "step",
			 (json_int_t)(c->gen_active ? c->g.last_step : -1), "mesh", mesh, "failures", c->failures,
			 "preemptions", c->preemptions, "resizes", c->resizes, "steps_lost",
			 (json_int_t)c->steps_lost, "slices", sl);
}

/* Refuse the connection i with a reason the agent prints (it exits 2): the
 * reply is flushed, then the connection closed. */
static int refuse(st_ctl *c, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(st_ctl *c, int i, const char *fmt, ...)
{
	char why[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	logf_("refusing %s: %s", c->conns[i].peer, why);
	c->conns[i].kind = C_STATUS; /* nothing more is read from it */
	if (send_to(c, i, json_pack("{s:s, s:s}", "type", "refused", "why", why)) == 0)
		c->conns[i].close_after_flush = 1;
	return 0;
}

/* hello: checked, then the host is pending until it says it sees the run
 * directory ("ready", after the welcome that names the probe file). */
/* A hello's "running" ({"gen":G,"world":W,"slices":[...],"workers":[{"rank":R,"pid":P},...]}):
 * well-formed, and this host's ranks of that layout. */
static int check_running(const st_ctl *c, const json_t *r, int s, int h)
{
	long long gen, world, rank, pid, x;
	const json_t *sl = json_object_get(r, "slices"), *ws = json_object_get(r, "workers"), *v;
	size_t i;
	int rc, dps = c->o.devices_per_slice, per_host = dps / c->o.hosts_per_slice;
	if ((rc = st_proto_get_int(r, "gen", 1, 1LL << 40, &gen)) < 0 ||
	    (rc = st_proto_get_int(r, "world", 1, (long long)dps * c->o.num_slices, &world)) < 0)
		return st_wrap(rc, "hello: running");
	if (!json_is_array(sl) || (long long)json_array_size(sl) * dps != world || !json_is_array(ws) ||
	    json_array_size(ws) > (size_t)per_host)
		return st_fail(ST_EPROTO, "hello: running: \"slices\" does not hold world / devices-per-slice slices, "
			       "or \"workers\" more than this host's devices");
	json_array_foreach(sl, i, v) {
		if (!json_is_integer(v) || (x = json_integer_value(v)) < 0 || x >= c->o.num_slices)
			return st_fail(ST_EPROTO, "hello: running: slice %zu is not one of the run's", i);
		for (size_t j = 0; j < i; j++)
			if (json_integer_value(json_array_get(sl, j)) == x)
				return st_fail(ST_EPROTO, "hello: running: slice %lld is listed twice", x);
	}
	json_array_foreach(ws, i, v) {
		if ((rc = st_proto_get_int(v, "rank", 0, world - 1, &rank)) < 0 ||
		    (rc = st_proto_get_int(v, "pid", 1, 1LL << 40, &pid)) < 0)
			return st_wrap(rc, "hello: running: worker %zu", i);
		if (json_integer_value(json_array_get(sl, (size_t)(rank / dps))) != s || (rank % dps) / per_host != h)
			return st_fail(ST_EPROTO, "hello: running: rank %lld is not slice %d host %d's in that layout", rank,
				       s, h);
	}
	return 0;
}

static int hello(st_ctl *c, int i, const json_t *m)
{
	long long ver, s, h, hps, dev, pid, port;
	const char *addr, *build, *release;
	int rc;
	if ((rc = st_proto_get_int(m, "version", 0, 1 << 30, &ver)) < 0)
		return rc;
	if (ver != ST_PROTO_VERSION)
		return refuse(c, i, "it speaks protocol version %lld, the controller %d: run the same slicetrain "
				    "build on every host", ver, ST_PROTO_VERSION);
	if ((rc = st_proto_get_int(m, "slice", 0, (1 << 30), &s)) < 0 ||
	    (rc = st_proto_get_int(m, "host", 0, (1 << 30), &h)) < 0 ||
	    (rc = st_proto_get_int(m, "hosts_per_slice", 1, 1 << 30, &hps)) < 0 ||
	    (rc = st_proto_get_int(m, "devices", 1, 1 << 30, &dev)) < 0 ||
	    (rc = st_proto_get_int(m, "pid", 1, 1LL << 40, &pid)) < 0 ||
	    (rc = st_proto_get_int(m, "port", 1, 65535, &port)) < 0 ||
	    (rc = st_proto_get_str(m, "addr", &addr)) < 0 || (rc = st_proto_get_str(m, "build", &build)) < 0 ||
	    (rc = st_proto_get_str(m, "release", &release)) < 0)
		return rc;
	if (strlen(addr) >= sizeof(c->conns[i].addr) || !st_addr_is_numeric(addr))
		return st_fail(ST_EPROTO, "hello: \"addr\" '%.60s' is not a numeric IP address", addr);
	const json_t *run = json_object_get(m, "running");
	if (run && (rc = check_running(c, run, (int)s, (int)h)) < 0)
		return rc;
	if (s >= c->o.num_slices)
		return refuse(c, i, "slice %lld is out of range: the run has %d slices", s, c->o.num_slices);
	if (h >= c->o.hosts_per_slice || hps != c->o.hosts_per_slice)
		return refuse(c, i, "host %lld of %lld hosts per slice; the run has %d", h, hps, c->o.hosts_per_slice);
	if (dev * c->o.hosts_per_slice != c->o.devices_per_slice)
		return refuse(c, i, "%lld devices per host; the run needs %d", dev,
			      c->o.devices_per_slice / c->o.hosts_per_slice);
	if (strcmp(build, c->build))
		return refuse(c, i, "the agent of slice %lld host %lld at %s runs slicetrain %.20s build %.20s; the "
				    "controller's workers run %s build %s: install the same binary on every host "
				    "(slicetrain version prints it)", s, h, addr, release, build, ST_VERSION, c->build);
	host *x = &c->sl[s].h[h];
	if (x->conn >= 0)
		return refuse(c, i, "slice %lld host %lld already has an agent (pid %ld at %s)", s, h, x->pid, x->addr);
	conn *cn = &c->conns[i];
	json_decref(cn->running);
	cn->running = run ? json_deep_copy(run) : NULL;
	cn->kind = C_PENDING;
	cn->slice = (int)s;
	cn->host = (int)h;
	cn->pid = (long)pid;
	cn->port = (int)port;
	snprintf(cn->addr, sizeof(cn->addr), "%s", addr);
	if (getrandom(&cn->session, sizeof(cn->session), 0) != (ssize_t)sizeof(cn->session))
		return st_fail(ST_EIO, "getrandom: %s", strerror(errno));
	char beat[24];
	snprintf(beat, sizeof(beat), "%016llx", (unsigned long long)cn->session);
	return send_to(c, i, json_pack("{s:s, s:i, s:s, s:s, s:s, s:s}", "type", "welcome", "version",
				       ST_PROTO_VERSION, "run_dir", c->run_dir, "probe", c->probe, "nonce", c->nonce,
				       "beat", beat)) < 0 ? 0 : 0;
}

/* The workers the agent of (s, h) kept from a controller before: stopped
 * (SIGKILL), with why in the log. */
static void stop_running(st_ctl *c, int s, int h, const char *why)
{
	host *x = &c->sl[s].h[h];
	json_int_t gen = json_integer_value(json_object_get(x->running, "gen"));
	size_t n = json_array_size(json_object_get(x->running, "workers"));
	if (n) {
		logf_("slice %d host %d still runs %zu worker(s) of generation %lld: stop how=kill (%s)", s, h, n,
		      (long long)gen, why);
		send_agent(c, s, h, json_pack("{s:s, s:I, s:s}", "type", "stop", "gen", gen, "how", "kill"));
	}
	json_decref(x->running);
	x->running = NULL;
}

/* A pending agent's answer to the welcome: "ready" (it sees the run
 * directory: the host joins), or "unfit" with why (refused). */
static int pending_msg(st_ctl *c, int i, const json_t *m, const char *type)
{
	conn *cn = &c->conns[i];
	if (!strcmp(type, "heartbeat"))
		return 0;
	if (!strcmp(type, "unfit")) {
		const char *why = json_string_value(json_object_get(m, "why"));
		logf_("refusing the agent of slice %d host %d at %s: %.400s", cn->slice, cn->host, cn->addr,
		      why ? why : "(no reason given)");
		cn->kind = C_STATUS;
		cn->close_after_flush = 1;
		return 0;
	}
	if (strcmp(type, "ready"))
		return st_fail(ST_EPROTO, "\"%.40s\" before \"ready\"", type);
	host *x = &c->sl[cn->slice].h[cn->host];
	if (x->conn >= 0)
		return refuse(c, i, "slice %d host %d already has an agent (pid %ld at %s)", cn->slice, cn->host,
			      x->pid, x->addr);
	cn->kind = C_AGENT;
	x->conn = i;
	x->pid = cn->pid;
	x->port = cn->port;
	x->session = cn->session;
	x->beat_seq = 0;
	snprintf(x->addr, sizeof(x->addr), "%s", cn->addr);
	x->noticed = 0;
	x->last_hb = st_mono_s();
	x->last_hb_wall = x->connected_wall = wall_s();
	logf_("agent of slice %d host %d connected (pid %ld, %s)", cn->slice, cn->host, x->pid, x->addr);
	json_decref(x->running);
	x->running = cn->running;
	cn->running = NULL;
	if (x->running && (c->g.id || c->gen_active))
		stop_running(c, cn->slice, cn->host, "this controller runs its own generations");
	return 0;
}

/* A worker rank of the running generation held by the agent of (s, h). */
static int own_rank(const st_ctl *c, const json_t *m, int s, int h, int *rank)
{
	long long g, r;
	int rc;
	if ((rc = st_proto_get_int(m, "gen", 0, 1LL << 40, &g)) < 0 ||
	    (rc = st_proto_get_int(m, "rank", 0, 1 << 30, &r)) < 0)
		return rc;
	if (c->gen_active && c->g.from && g == c->g.from && r < c->prev_world && c->prev_w[r].slice == s &&
	    c->prev_w[r].host == h) {
		*rank = (int)r;
		return 2; /* a worker of the generation re-formed from, not re-formed yet */
	}
	if (!c->gen_active || g != c->g.id)
		return 0; /* an old generation's straggler */
	if (r >= c->g.world || c->g.w[r].slice != s || c->g.w[r].host != h)
		return st_fail(ST_EPROTO, "rank %lld is not one of this agent's workers in generation %lld", r, g);
	*rank = (int)r;
	return 1;
}

/*
 * Stragglers: each host's compute up to the gradient collective, per step
 * (the slowest of its workers), against the median of the group's other
 * hosts' latest (with 2 hosts, the other's). A host at least STRAGGLER_FACTOR x the median for
 * --straggler-steps steps in a row is reported (log, event, nodes); with
 * --evict-stragglers its slice is taken out as after a failure (re-formed in
 * place) and comes back after the repair delay, the back-off doubling that
 * when it is slow again at once: rejoining the group for --straggler-steps
 * steps is the probe.
 */
static void on_compute(st_ctl *c, int s, int h, long long step, double v)
{
	gen *g = &c->g;
	host *x = &c->sl[s].h[h];
	if (x->compute_gen != g->id || step > x->compute_step) { /* a new step: its first worker's */
		x->compute_gen = g->id;
		x->compute_step = step;
		x->compute_s = v;
	} else if (step == x->compute_step && v > x->compute_s) {
		x->compute_s = v;
	} else {
		return;
	}
	if (c->o.straggler_steps <= 0 || g->k < 2 || g->failed || g->stop_how != STOP_NONE)
		return;
	double all[4096];
	int n = 0;
	for (int i = 0; i < g->k && n < 4096; i++)
		for (int hh = 0; hh < c->o.hosts_per_slice && n < 4096; hh++) {
			const host *y = &c->sl[g->slices[i]].h[hh];
			if (y != x && y->compute_gen == g->id && y->compute_step >= step - 1)
				all[n++] = y->compute_s;
		}
	if (n < 1)
		return;
	for (int i = 1; i < n; i++) /* insertion sort: a few hosts */
		for (int j = i; j > 0 && all[j] < all[j - 1]; j--) {
			double t = all[j];
			all[j] = all[j - 1];
			all[j - 1] = t;
		}
	double med = n % 2 ? all[n / 2] : (all[n / 2 - 1] + all[n / 2]) / 2;
	if (x->compute_s < STRAGGLER_FACTOR * med || x->compute_s - med < STRAGGLER_MIN_S) {
		if (x->slow)
			logf_("slice %d host %d is no longer slow (compute %.3f s, the group's median %.3f s)", s, h,
			      x->compute_s, med);
		x->slow_steps = x->slow = 0;
		return;
	}
	if (++x->slow_steps < c->o.straggler_steps || x->slow)
		return;
	x->slow = 1;
	logf_("slice %d host %d is slow: compute %.3f s, at least %.1f x the group's median (%.3f s) for %d steps in a "
	      "row", s, h, x->compute_s, STRAGGLER_FACTOR, med, x->slow_steps);
	event(c, "straggler", wall_s(), step, slice_list(&s, 1),
	      json_pack("{s:i, s:f, s:f, s:b}", "host", h, "compute_s", x->compute_s, "median_s", med, "evicted",
			c->o.evict_stragglers));
	if (c->o.evict_stragglers)
		gen_failure(c, s, "slice %d host %d is slow: compute %.3f s, the group's median %.3f s (--evict-stragglers)",
			    s, h, x->compute_s, med);
}

static int agent_msg(st_ctl *c, int i, const json_t *m, const char *type)
{
	conn *cn = &c->conns[i];
	int s = cn->slice, h = cn->host, r, rc;
	host *x = &c->sl[s].h[h];
	x->last_hb = st_mono_s();
	x->last_hb_wall = wall_s();
	if (!strcmp(type, "heartbeat")) { /* "port": one free on its host now (none: keep the last) */
		long long port;
		if (json_object_get(m, "port") && (rc = st_proto_get_int(m, "port", 1, 65535, &port)) < 0)
			return rc;
		if (json_object_get(m, "port"))
			x->port = (int)port;
		return 0;
	}
	if (!strcmp(type, "compute")) {
		long long step;
		double v;
		const json_t *sv = json_object_get(m, "s");
		if ((rc = own_rank(c, m, s, h, &r)) <= 0 || rc == 2)
			return rc < 0 ? rc : 0;
		if ((rc = st_proto_get_int(m, "step", 0, 1LL << 50, &step)) < 0)
			return rc;
		if (!json_is_number(sv) || (v = json_number_value(sv)) < 0 || v > 1e6)
			return st_fail(ST_EPROTO, "compute: \"s\" is not a number of seconds");
		on_compute(c, s, h, step, v);
		return 0;
	}
	if (!strcmp(type, "output")) {
		const char *stream, *text;
		if ((rc = own_rank(c, m, s, h, &r)) <= 0)
			return rc;
		int prev = rc == 2;
		if ((rc = st_proto_get_str(m, "stream", &stream)) < 0 || (rc = st_proto_get_str(m, "text", &text)) < 0)
			return rc;
		on_output(c, r, strcmp(stream, "out") != 0, text, prev);
		return 0;
	}
	if (!strcmp(type, "exit")) {
		long long st, sig, pid;
		if ((rc = own_rank(c, m, s, h, &r)) <= 0 || rc == 2) /* a worker left out of a re-formation */
			return rc < 0 ? rc : 0;
		if ((rc = st_proto_get_int(m, "status", -1, 255, &st)) < 0 ||
		    (rc = st_proto_get_int(m, "signal", 0, 64, &sig)) < 0 ||
		    (rc = st_proto_get_int(m, "pid", 0, 1LL << 40, &pid)) < 0)
			return rc;
		int code = st >= 0 ? (int)st : st_exit_signal((int)sig);
		if (st < 0 && !sig)
			code = -1;
		worker_exited(c, r, code, st < 0 ? (int)sig : 0, json_string_value(json_object_get(m, "why")));
		return 0;
	}
	if (!strcmp(type, "started")) {
		long long g;
		json_t *ws = json_object_get(m, "workers");
		if ((rc = st_proto_get_int(m, "gen", 0, 1LL << 40, &g)) < 0)
			return rc;
		if (!json_is_array(ws))
			return st_fail(ST_EPROTO, "started: \"workers\" is not an array");
		if (!c->gen_active || g != c->g.id)
			return 0;
		size_t k;
		json_t *w;
		json_array_foreach(ws, k, w) {
			long long rr, pid;
			if ((rc = st_proto_get_int(w, "rank", 0, c->g.world - 1, &rr)) < 0 ||
			    (rc = st_proto_get_int(w, "pid", 1, 1LL << 40, &pid)) < 0)
				return rc;
			if (c->g.w[rr].slice != s || c->g.w[rr].host != h)
				return st_fail(ST_EPROTO, "started: rank %lld is not this agent's", rr);
			c->g.w[rr].pid = (long)pid;
		}
		return 0;
	}
	if (!strcmp(type, "notice")) {
		logf_("slice %d host %d: preemption notice", s, h);
		x->noticed = 1;
		gen *g = &c->g;
		if (c->gen_active && !c->done && in_group(c, s) && !g->failed && g->stop_how != STOP_KILL) {
			gen_preempt(g, s, c->o.repair_delay);
			if (g->stop_how == STOP_NONE) {
				g->stop_how = STOP_NOTICE;
				g->stop_mono = st_mono_s();
				transition(c, S_RESIZING, "the agent of slice %d host %d got a preemption notice", s, h);
			}
		} else if (!c->done) {
			mark_down(c, s, c->o.repair_delay, 0, "preempted");
		}
		return 0;
	}
	return st_fail(ST_EPROTO, "unknown message type '%.40s' from an agent", type);
}

static void handle(st_ctl *c, int i, json_t *m)
{
	conn *cn = &c->conns[i];
	const char *type;
	int rc = st_proto_get_str(m, "type", &type);
	if (rc == 0) {
		if (cn->kind == C_NEW && !strcmp(type, "hello")) {
			rc = hello(c, i, m);
		} else if (cn->kind == C_NEW && !strcmp(type, "status")) {
			cn->kind = C_STATUS;
			json_t *st = status_json(c);
			rc = send_to(c, i, st);
			if (rc == 0)
				c->conns[i].close_after_flush = 1;
			return;
		} else if (cn->kind == C_NEW) {
			rc = st_fail(ST_EPROTO, "first message of type '%.40s' (want hello or status)", type);
		} else if (cn->kind == C_PENDING) {
			rc = pending_msg(c, i, m, type);
		} else if (cn->kind == C_AGENT) {
			rc = agent_msg(c, i, m, type);
		} else {
			rc = st_fail(ST_EPROTO, "message after status");
		}
	}
	if (rc < 0) {
		char why[300];
		snprintf(why, sizeof(why), "%s", st_errmsg());
		if (cn->kind == C_AGENT)
			logf_("dropping the agent of slice %d host %d: %s", cn->slice, cn->host, why);
		conn_drop(c, i, why);
	}
}

static void read_conn(st_ctl *c, int i)
{
	for (;;) {
		json_t *m = NULL;
		int rc = st_proto_recv(&c->conns[i].pc, &m);
		if (rc == 1) {
			handle(c, i, m);
			json_decref(m);
			if (c->conns[i].kind == C_FREE)
				return;
			continue;
		}
		if (rc == 0)
			return;
		char why[300];
		snprintf(why, sizeof(why), "%s", rc == ST_EPEER ? "connection closed" : st_errmsg());
		conn_drop(c, i, why);
		return;
	}
}

static void peer_name(int fd, char *buf, size_t cap)
{
	struct sockaddr_storage a;
	socklen_t len = sizeof(a);
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (getpeername(fd, (struct sockaddr *)&a, &len) == 0) {
		if (a.ss_family == AF_INET) {
			inet_ntop(AF_INET, &((struct sockaddr_in *)&a)->sin_addr, host, sizeof(host));
			port = ntohs(((struct sockaddr_in *)&a)->sin_port);
		} else if (a.ss_family == AF_INET6) {
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&a)->sin6_addr, host, sizeof(host));
			port = ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
		}
	}
	snprintf(buf, cap, "%s:%d", host, port);
}

static void accept_all(st_ctl *c)
{
	for (;;) {
		int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			return;
		int i, oldest = -1;
		for (i = 0; i < MAX_CONNS && c->conns[i].kind != C_FREE; i++)
			if (c->conns[i].kind == C_NEW && (oldest < 0 || c->conns[i].opened < c->conns[oldest].opened))
				oldest = i;
		if (i == MAX_CONNS && oldest >= 0) {
			/* full: the oldest connection that has not said hello makes room (a
			 * flood of silent connections must not lock agents out) */
			conn_drop(c, oldest, "evicted: the connection table is full");
			i = oldest;
		}
		if (i == MAX_CONNS) {
			logf_("too many connections: one refused");
			close(fd);
			continue;
		}
		st_sock_nodelay(fd);
		peer_name(fd, c->conns[i].peer, sizeof(c->conns[i].peer));
		if (st_proto_conn_init_server(&c->conns[i].pc, fd, &c->tok) < 0) {
			st_auth_log_drop(&c->drops, "controller", c->conns[i].peer, st_errmsg());
			continue;
		}
		c->conns[i].kind = C_NEW;
		c->conns[i].opened = st_mono_s();
	}
}

/* ---- the state machine ---- */

/*
 * A controller that starts while workers run (the one before it died, the
 * agents kept their workers and reconnected): their hellos said what runs.
 * The newest generation reported is taken over as it is: no worker
 * restarted, the group untouched; a rank no agent reported is a failure of
 * its slice (the survivors re-form in place, as after any failure);
 * workers of older generations are stopped. Waits ADOPT_WAIT_S for every
 * host first. 1: taken over (or waiting), 0: nothing runs.
 */
static int adopt(st_ctl *c, double now)
{
	int nconn = 0, nrep = 0;
	long long top = 0;
	const json_t *lay = NULL;
	for (int s = 0; s < c->o.num_slices; s++)
		for (int h = 0; h < c->o.hosts_per_slice; h++) {
			const host *x = &c->sl[s].h[h];
			nconn += x->conn >= 0;
			if (x->conn < 0 || !x->running)
				continue;
			nrep++;
			long long g = json_integer_value(json_object_get(x->running, "gen"));
			if (g > top) {
				top = g;
				lay = x->running;
			}
		}
	if (!nrep)
		return 0;
	if (nconn < c->o.num_slices * c->o.hosts_per_slice && now - c->start_mono < ADOPT_WAIT_S)
		return 1;
	json_t *sl = json_deep_copy(json_object_get(lay, "slices")); /* lay goes with its host's report */
	int k = (int)json_array_size(sl), ids[4096];
	for (int i = 0; i < k && i < 4096; i++)
		ids[i] = (int)json_integer_value(json_array_get(sl, (size_t)i));
	gen *g = &c->g;
	gen_release(g);
	g->id = (int)top;
	g->adopted = 1;
	if (!sl || k > 4096 || gen_layout(c, k, ids) < 0) {
		char why[300];
		snprintf(why, sizeof(why), "cannot take over generation %lld: %s", top, sl ? st_errmsg() : "out of memory");
		json_decref(sl);
		finish(c, S_ERRORED, 1, why);
		return 1;
	}
	int world = g->world;
	for (int r = 0; r < world; r++)
		g->w[r].exited = 1; /* until an agent reports it */
	for (int s = 0; s < c->o.num_slices; s++)
		for (int h = 0; h < c->o.hosts_per_slice; h++) {
			host *x = &c->sl[s].h[h];
			if (x->conn < 0 || !x->running)
				continue;
			if (json_integer_value(json_object_get(x->running, "gen")) != top ||
			    !json_equal(json_object_get(x->running, "slices"), sl)) {
				stop_running(c, s, h, "older than the generation this controller takes over");
				continue;
			}
			size_t i;
			const json_t *v;
			json_array_foreach(json_object_get(x->running, "workers"), i, v) {
				worker *w = &g->w[json_integer_value(json_object_get(v, "rank"))];
				w->pid = (long)json_integer_value(json_object_get(v, "pid"));
				w->exited = 0;
			}
			json_decref(x->running);
			x->running = NULL;
		}
	json_decref(sl);
	c->gen_active = 1;
	if (c->next_gen < g->id)
		c->next_gen = g->id;
	c->last_k = k;
	int kept = 0;
	for (int r = 0; r < world; r++)
		kept += !g->w[r].exited;
	transition(c, S_RUNNING, "generation %d taken over: %d of its %d workers kept running on %d slice%s while no "
				 "controller was up", g->id, kept, world, k, k == 1 ? "" : "s");
	for (int r = 0; r < world; r++)
		if (g->w[r].exited) {
			g->w[r].code = -1;
			g->nexited++;
			gen_failure(c, g->w[r].slice, "worker rank %d of slice %d was gone when this controller took over",
				    r, g->w[r].slice);
		}
	return 1;
}

static void schedule(st_ctl *c, double now)
{
	int healthy[4096], nh = 0;
	for (int s = 0; s < c->o.num_slices && nh < 4096; s++)
		if (slice_healthy(c, s, now))
			healthy[nh++] = s;
	if (c->state == S_INITIALIZING && !c->g.id && adopt(c, now))
		return;
	if (c->state == S_INITIALIZING) {
		if (nh < c->o.num_slices && !(nh >= c->o.min_slices && now - c->start_mono > INIT_WAIT_S)) {
			if (nh < c->o.min_slices && c->o.wait_timeout_s >= 0 &&
			    now - c->start_mono > c->o.wait_timeout_s) {
				char why[200];
				snprintf(why, sizeof(why), "%d of %d slices healthy after %.0f s, fewer than --min-slices %d "
					 "(--wait-timeout)", nh, c->o.num_slices, c->o.wait_timeout_s, c->o.min_slices);
				fprintf(stderr, "slicetrain: error: %s\n", why);
				finish(c, S_ERRORED, 3, why);
			}
			return;
		}
		transition(c, S_SCHEDULING, "%d of %d slices healthy", nh, c->o.num_slices);
	}
	for (int s = 0; s < c->o.num_slices && nh < c->o.min_slices; s++)
		if (held_back(c, s, now)) {
			logf_("slice %d taken before its back-off ends (%.1f s left): fewer than %d healthy without it", s,
			      c->sl[s].down_until - now, c->o.min_slices);
			c->sl[s].down_until = now;
			healthy[nh++] = s;
		}
	if (nh < c->o.min_slices) {
		if (!c->waiting_since) {
			logf_("waiting for at least %d healthy slice%s (%d now; at most %.0f s)", c->o.min_slices,
			      c->o.min_slices == 1 ? "" : "s", nh, c->o.wait_timeout_s);
			c->waiting_since = now;
		}
		if (c->o.wait_timeout_s >= 0 && now - c->waiting_since > c->o.wait_timeout_s) {
			char why[200];
			snprintf(why, sizeof(why), "fewer than %d healthy slice%s for %.0f s (--wait-timeout)",
				 c->o.min_slices, c->o.min_slices == 1 ? "" : "s", c->o.wait_timeout_s);
			fprintf(stderr, "slicetrain: error: %s\n", why);
			finish(c, S_ERRORED, 3, why);
		}
		return;
	}
	c->waiting_since = 0;
	int k = best_k(c, nh);
	if (!k) {
		st_mesh m;
		mesh_for(c, nh < c->o.num_slices ? nh : c->o.num_slices, &m);
		char why[400];
		snprintf(why, sizeof(why), "no group of %d to %d slices resolves: %s", c->o.min_slices, nh, st_errmsg());
		fprintf(stderr, "slicetrain: error: %s\n", why);
		finish(c, S_ERRORED, 2, why);
		return;
	}
	if (c->last_k && k != c->last_k) {
		c->resizes++;
		event(c, k < c->last_k ? "shrink" : "grow", wall_s(), c->hi, slice_list(healthy, k),
		      json_pack("{s:i, s:i}", "from", c->last_k, "to", k));
	}
	flush_events(c);
	if (start_gen(c, k, healthy) < 0) {
		char why[300];
		snprintf(why, sizeof(why), "cannot start generation %d: %s", c->next_gen, st_errmsg());
		finish(c, S_ERRORED, 1, why);
		return;
	}
	transition(c, S_RUNNING, "generation %d started on %d slice%s", c->g.id, k, k == 1 ? "" : "s");
}

static void maybe_grow(st_ctl *c, double now)
{
	gen *g = &c->g;
	if (g->failed || g->stop_how != STOP_NONE || g->last_step < 0 || g->last_step + 2 >= c->steps ||
	    g->k >= c->o.num_slices)
		return;
	int nh = 0;
	double newest = 0;
	for (int s = 0; s < c->o.num_slices; s++)
		if (in_group(c, s) || slice_healthy(c, s, now)) {
			nh++;
			if (!in_group(c, s) && c->sl[s].up_mono > newest)
				newest = c->sl[s].up_mono;
		}
	int k = best_k(c, nh);
	if (k <= g->k)
		return;
	c->grow_healthy = newest;
	if (in_place_ok(c, &g->mesh, k) && g->nexited == 0) {
		/* the workers re-form at the next step boundary; the new slices' are fed by a peer */
		int sl[4096], n = 0, from = g->k;
		for (int i = 0; i < g->k; i++)
			sl[n++] = g->slices[i];
		for (int s = 0; s < c->o.num_slices && n < k; s++)
			if (!in_group(c, s) && slice_healthy(c, s, now))
				sl[n++] = s;
		c->resizes++;
		event(c, "grow", wall_s(), c->hi, slice_list(sl, k), json_pack("{s:i, s:i}", "from", from, "to", k));
		flush_events(c);
		transition(c, S_RESIZING, "%d healthy slices: growing in place from %d to %d slices at the next step "
					  "boundary", nh, from, k);
		if (reform_gen(c, k, sl, from) < 0) {
			char why[300];
			snprintf(why, sizeof(why), "cannot re-form generation %d: %s", c->next_gen, st_errmsg());
			finish(c, S_ERRORED, 1, why);
		}
		return;
	}
	gen_stop(c, STOP_RESIZE);
	transition(c, S_RESIZING, "%d healthy slices: growing from %d to %d slices at the next step boundary", nh,
		   g->k, k);
}

/* This controller's epoch: one more than the newest in <run_dir>/controller,
 * claimed by creating its file there (O_EXCL: of two controllers starting
 * at once, one gets each number). The file holds the claimant's pid and
 * address, for people. */
static int claim_epoch(st_ctl *c)
{
	snprintf(c->epochs, sizeof(c->epochs), "%s/controller", c->run_dir);
	int rc = st_mkdir_p(c->epochs);
	if (rc < 0)
		return st_wrap(rc, "the controller epochs' directory");
	DIR *d = opendir(c->epochs);
	if (!d)
		return st_fail(ST_EIO, "%s: %s", c->epochs, strerror(errno));
	long long top = 0, n;
	struct dirent *e;
	char tail;
	while ((e = readdir(d)))
		if (sscanf(e->d_name, "epoch-%lld%c", &n, &tail) == 1 && n > top && n < (1LL << 40))
			top = n;
	closedir(d);
	for (long long want = top + 1; want < top + 1000; want++) {
		char path[ST_PATH_MAX + 64], text[160];
		snprintf(path, sizeof(path), "%s/epoch-%lld", c->epochs, want);
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 && errno == EEXIST)
			continue;
		if (fd < 0)
			return st_fail(ST_EIO, "cannot claim controller epoch %lld (%s): %s", want, path, strerror(errno));
		int len = snprintf(text, sizeof(text), "pid %d, listening on %s\n", (int)getpid(), c->addr);
		int ok = write(fd, text, (size_t)len) == len && fsync(fd) == 0;
		close(fd);
		if (!ok)
			return st_fail(ST_EIO, "cannot write %s: %s", path, strerror(errno));
		c->epoch = want;
		return 0;
	}
	return st_fail(ST_EIO, "cannot claim a controller epoch in %s", c->epochs);
}

/* Deposed: a controller of a newer epoch started on this run (it claimed
 * the next number). Looked at once a second. */
static int newer_epoch(st_ctl *c, double now)
{
	if (now - c->epoch_checked < 1.0)
		return 0;
	c->epoch_checked = now;
	char path[ST_PATH_MAX + 64];
	snprintf(path, sizeof(path), "%s/epoch-%lld", c->epochs, c->epoch + 1);
	return access(path, F_OK) == 0;
}

static void tick(st_ctl *c)
{
	double now = st_mono_s();
	/* heartbeats, hello timeouts, flushed status replies */
	for (int i = 0; i < MAX_CONNS; i++) {
		conn *x = &c->conns[i];
		if (x->kind == C_AGENT && now - c->sl[x->slice].h[x->host].last_hb > c->o.heartbeat_timeout_s) {
			char why[80];
			snprintf(why, sizeof(why), "no heartbeat for %.1f s", now - c->sl[x->slice].h[x->host].last_hb);
			conn_drop(c, i, why);
		} else if ((x->kind == C_NEW && now - x->opened > HELLO_TIMEOUT_S) ||
			   (x->kind == C_PENDING && now - x->opened > READY_TIMEOUT_S)) {
			conn_drop(c, i, x->pc.auth ? "no token proof in time" : "no hello in time");
		} else if (x->kind == C_STATUS && x->close_after_flush && x->pc.wlen == 0) {
			conn_drop(c, i, "status sent");
		}
	}
	refresh_slices(c, now);
	if (c->done)
		return;
	if (newer_epoch(c, now)) {
		c->deposed = 1;
		char why[200];
		snprintf(why, sizeof(why), "deposed: a controller of epoch %lld started on this run (this one is epoch "
			 "%lld); leaving its workers to it", c->epoch + 1, c->epoch);
		fprintf(stderr, "slicetrain: error: %s\n", why);
		finish(c, S_ERRORED, 3, why);
		return;
	}
	gen *g = &c->g;
	if (c->gen_active && g->failed && g->reform_wanted && !reform_after_failure(c, now) && !c->done) {
		/* the survivors wait for a re-formation (worker.h): none is coming */
		logf_("generation %d cannot re-form in place: stop how=kill; the group restarts from the newest "
		      "checkpoint", g->id);
		gen_stop(c, STOP_KILL);
	}
	if (c->gen_active) {
		if (g->failed && g->stop_how != STOP_KILL && now - g->fail_mono > c->o.grace_s &&
		    g->nexited < g->world) {
			logf_("%d worker%s still running %.0f s after the failure: stop how=kill", g->world - g->nexited,
			      g->world - g->nexited == 1 ? "" : "s", c->o.grace_s);
			gen_stop(c, STOP_KILL);
		}
		if (!g->failed && (g->stop_how == STOP_RESIZE || g->stop_how == STOP_NOTICE) &&
		    now - g->stop_mono > c->o.stop_grace_s && g->nexited < g->world) {
			logf_("%d worker%s still running %.0f s after stop how=%s: stop how=kill", g->world - g->nexited,
			      g->world - g->nexited == 1 ? "" : "s", c->o.stop_grace_s, stop_names[g->stop_how]);
			gen_stop(c, STOP_KILL);
		}
		if (g->nexited == g->world) {
			gen_ended(c);
		} else if (c->state == S_RUNNING) {
			maybe_grow(c, now);
		}
	}
	if (!c->gen_active && !c->done && (c->state == S_INITIALIZING || c->state == S_SCHEDULING))
		schedule(c, now);
}

/* ---- API ---- */

/* The config's paths made absolute against this process's directory: every
 * host's workers read them as the controller meant them (on one machine,
 * the same files; on many, the same paths of storage every host mounts). */
static int absolute_paths(st_config *cfg)
{
	char *paths[] = {cfg->base_output_directory, cfg->metrics_file, cfg->grain_eval_files, cfg->dataset_path,
			 cfg->tokenizer_path, cfg->load_parameters_path, cfg->load_full_state_path};
	char cwd[ST_PATH_MAX];
	if (!getcwd(cwd, sizeof(cwd)))
		return st_fail(ST_EIO, "cannot tell the current directory: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(paths) / sizeof(*paths); i++) {
		char *p = paths[i], abs[ST_PATH_MAX];
		if (!p[0] || p[0] == '/' || strstr(p, "://"))
			continue;
		if ((size_t)snprintf(abs, sizeof(abs), "%s/%s", cwd, p) >= sizeof(abs))
			return st_fail(ST_EINVAL, "the path %s/%s is too long", cwd, p);
		memcpy(p, abs, strlen(abs) + 1);
	}
	return 0;
}

/* The run directory (base_output_directory/run_name, made here when it is
 * not there) and in it a probe file holding a fresh nonce: each host's
 * agent must read it back before it joins, which proves that the host sees
 * the same run directory (checkpoints and metrics go there). */
static int make_probe(st_ctl *c)
{
	unsigned char r[16];
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, r, sizeof(r)) : -1;
	if (fd >= 0)
		close(fd);
	if (n != (ssize_t)sizeof(r))
		return st_fail(ST_EIO, "cannot read /dev/urandom");
	for (int i = 0; i < 16; i++)
		snprintf(c->nonce + 2 * i, 3, "%02x", r[i]);
	if ((size_t)snprintf(c->run_dir, sizeof(c->run_dir), "%s/%s", c->cfg->base_output_directory,
			     c->cfg->run_name) >= sizeof(c->run_dir))
		return st_fail(ST_EINVAL, "the run directory %s/%s is too long", c->cfg->base_output_directory,
			       c->cfg->run_name);
	int rc = st_mkdir_p(c->run_dir);
	if (rc < 0)
		return st_wrap(rc, "the run directory");
	snprintf(c->fence, sizeof(c->fence), "%s/%s", c->run_dir, ST_CKPT_FENCE_FILE);
	/* generations go on from the run's newest (a controller before this
	 * one): its workers, if any are left, are older than every new one */
	int64_t newest = 0;
	if ((rc = st_ckpt_fence_read(c->fence, &newest)) < 0)
		return rc;
	if (newest > INT_MAX / 2)
		return st_fail(ST_EINVAL, "%s: generation %lld: too many for this run", c->fence, (long long)newest);
	c->next_gen = (int)newest;
	if ((rc = claim_epoch(c)) < 0)
		return rc;
	snprintf(c->probe, sizeof(c->probe), "%s/.controller-%d.probe", c->run_dir, (int)getpid());
	if ((rc = st_write_file_atomic(c->probe, c->nonce, strlen(c->nonce))) < 0) {
		c->probe[0] = 0;
		return st_wrap(rc, "the run directory's probe file");
	}
	return 0;
}

int st_ctl_create(st_ctl **out, const st_ctl_opts *o)
{
	*out = NULL;
	if (o->num_slices < 1 || o->min_slices < 1 || o->min_slices > o->num_slices || o->hosts_per_slice < 1 ||
	    o->devices_per_slice < 1 || o->devices_per_slice % o->hosts_per_slice)
		return st_fail(ST_EINVAL, "controller: need 1 <= --min-slices <= --num-slices and --devices-per-slice "
					  "a multiple of --hosts-per-slice");
	st_ctl *c = calloc(1, sizeof(*c));
	if (!c)
		return st_fail(ST_ENOMEM, "out of memory");
	c->lfd = c->ufd = -1;
	c->o = *o;
	if (c->o.grace_s <= 0)
		c->o.grace_s = 5;
	if (c->o.stop_grace_s <= 0)
		c->o.stop_grace_s = 30;
	if (c->o.heartbeat_timeout_s <= 0)
		c->o.heartbeat_timeout_s = 1;
	if (c->o.backoff_window_s == 0)
		c->o.backoff_window_s = 30;
	if (c->o.wait_timeout_s == 0)
		c->o.wait_timeout_s = 600;
	snprintf(c->listen_host, sizeof(c->listen_host), "%s", o->listen_host ? o->listen_host : "127.0.0.1");
	int rc = ST_ENOMEM; /* until the allocations are done */
	for (int i = 0; i < MAX_CONNS; i++)
		c->conns[i].pc.fd = -1;
	c->events = json_array();
	c->recovery = json_array();
	c->cfg = calloc(1, sizeof(st_config));
	c->sl = calloc((size_t)o->num_slices, sizeof(slice));
	c->faults = calloc((size_t)o->nfaults + 1, sizeof(st_ctl_fault));
	if (!c->events || !c->recovery || !c->cfg || !c->sl || !c->faults)
		goto out;
	if (o->nfaults)
		memcpy(c->faults, o->faults, (size_t)o->nfaults * sizeof(st_ctl_fault));
	for (int s = 0; s < o->num_slices; s++) {
		if (!(c->sl[s].h = calloc((size_t)o->hosts_per_slice, sizeof(host))))
			goto out;
		c->sl[s].backoff = 1;
		c->sl[s].fault_down = -1;
		for (int h = 0; h < o->hosts_per_slice; h++)
			c->sl[s].h[h].conn = -1;
	}
	/* the config, loaded as the workers will load it */
	rc = st_config_load(c->cfg, o->config_path, o->nkv, o->kv);
	if (rc < 0)
		goto out;
	if (!c->cfg->enable_checkpointing) {
		rc = st_fail(ST_EINVAL, "elastic runs resume from checkpoints: enable_checkpointing must be true");
		goto out;
	}
	st_mesh m;
	if ((rc = mesh_for(c, o->num_slices, &m)) < 0)
		goto out;
	if ((rc = mesh_for(c, o->min_slices, &m)) < 0) {
		rc = st_wrap(rc, "the group cannot run on --min-slices %d", o->min_slices);
		goto out;
	}
	for (int k = o->min_slices + 1; k < o->num_slices; k++)
		if (mesh_for(c, k, &m) < 0)
			st_warn("the group cannot run on %d slice%s: %s", k, k == 1 ? "" : "s", st_errmsg());
	c->steps = c->cfg->steps > 0 ? c->cfg->steps : 0;
	rc = ST_ENOMEM;
	if (!(c->kept = calloc((size_t)c->steps + 1, sizeof(double))))
		goto out;
	/* the workers load the config resolved here (JSON, sent with each
	 * "start"): a host needs only the binary, and every generation resumes
	 * the same run (the run_name is pinned) */
	c->cfg->run_name_derived = 0;
	if ((rc = absolute_paths(c->cfg)) < 0 || (rc = st_config_to_json(c->cfg, &c->config_json)) < 0)
		goto out;
	const char *exe = getenv("SLICETRAIN_WORKER_EXE");
	if ((rc = st_build_id(exe && *exe ? exe : NULL, c->build)) < 0)
		goto out;
	if (o->token)
		c->tok = *o->token;
	if ((rc = st_auth_check_bind(&c->tok, c->listen_host)) < 0 || (rc = listen_any(c, c->listen_host, o->port)) < 0 ||
	    (rc = make_probe(c)) < 0)
		goto out;
	c->state = S_INITIALIZING;
	c->start_mono = log_t0 = st_mono_s();
	c->start_wall = c->state_since = wall_s();
	logf_("listening on %s, epoch %lld; %d slice%s (at least %d) x %d host%s x %d devices; max failures %d, repair delay %.1f s",
	      c->addr, c->epoch, o->num_slices, o->num_slices == 1 ? "" : "s", o->min_slices, o->hosts_per_slice,
	      o->hosts_per_slice == 1 ? "" : "s", o->devices_per_slice / o->hosts_per_slice, o->max_failures,
	      o->repair_delay);
	*out = c;
	return 0;
out:
	if (rc == ST_ENOMEM)
		st_fail(ST_ENOMEM, "out of memory");
	st_ctl_destroy(c); /* keeps the message */
	return rc;
}

void st_ctl_destroy(st_ctl *c)
{
	if (!c)
		return;
	for (int i = 0; i < MAX_CONNS; i++) {
		st_proto_conn_release(&c->conns[i].pc);
		json_decref(c->conns[i].running);
	}
	if (c->lfd >= 0)
		close(c->lfd);
	if (c->ufd >= 0)
		close(c->ufd);
	gen_release(&c->g);
	free(c->prev_w);
	for (int s = 0; c->sl && s < c->o.num_slices; s++) {
		for (int h = 0; c->sl[s].h && h < c->o.hosts_per_slice; h++)
			json_decref(c->sl[s].h[h].running);
		free(c->sl[s].h);
	}
	free(c->sl);
	if (c->probe[0])
		unlink(c->probe);
	free(c->config_json);
	free(c->faults);
	free(c->kept);
	free(c->cfg);
	json_decref(c->events);
	json_decref(c->recovery);
	free(c);
}

const char *st_ctl_address(const st_ctl *c) { return c->addr; }

int st_ctl_agents(const st_ctl *c)
{
	int n = 0;
	for (int i = 0; i < MAX_CONNS; i++)
		n += c->conns[i].kind == C_AGENT || c->conns[i].kind == C_PENDING;
	return n;
}

/* Heartbeat datagrams: each one that proves the token, names a connected
 * host with its session and a sequence number past the last counts as a
 * heartbeat of that host; anything else is dropped. */
static void read_beats(st_ctl *c)
{
	for (;;) {
		uint8_t buf[ST_PROTO_BEAT_LEN + 1];
		ssize_t n = recv(c->ufd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n < 0)
			return;
		st_proto_beat b;
		if (st_proto_beat_parse(buf, (size_t)n, &c->tok, &b) < 0 || b.slice >= (uint32_t)c->o.num_slices ||
		    b.host >= (uint32_t)c->o.hosts_per_slice)
			continue;
		host *x = &c->sl[b.slice].h[b.host];
		if (x->conn < 0 || b.session != x->session || b.seq <= x->beat_seq)
			continue;
		x->beat_seq = b.seq;
		x->last_hb = st_mono_s();
		x->last_hb_wall = wall_s();
	}
}

int st_ctl_poll(st_ctl *c, int timeout_ms)
{
	/* A controller that did not poll for a while (a blocked stdout, a
	 * stopped process) cannot tell silent agents from its own stall: the
	 * agents' heartbeats are credited with the gap. */
	double now = st_mono_s();
	if (c->last_round > 0 && now - c->last_round > 0.5) {
		for (int s = 0; s < c->o.num_slices; s++)
			for (int h = 0; h < c->o.hosts_per_slice; h++)
				if (c->sl[s].h[h].last_hb < now)
					c->sl[s].h[h].last_hb += now - c->last_round;
	}
	struct pollfd pfd[MAX_CONNS + 2];
	int idx[MAX_CONNS + 2], n = 0;
	pfd[n] = (struct pollfd){.fd = c->lfd, .events = POLLIN};
	idx[n++] = -1;
	pfd[n] = (struct pollfd){.fd = c->ufd, .events = POLLIN};
	idx[n++] = -2;
	for (int i = 0; i < MAX_CONNS; i++)
		if (c->conns[i].kind != C_FREE) {
			short ev = POLLIN;
			if (c->conns[i].pc.wlen)
				ev |= POLLOUT;
			pfd[n] = (struct pollfd){.fd = c->conns[i].pc.fd, .events = ev};
			idx[n++] = i;
		}
	int pr = poll(pfd, (nfds_t)n, timeout_ms);
	if (pr < 0 && errno != EINTR)
		return st_fail(ST_EIO, "controller: poll: %s", strerror(errno));
	for (int j = 0; pr > 0 && j < n; j++) {
		if (!pfd[j].revents)
			continue;
		int i = idx[j];
		if (i == -2) {
			read_beats(c);
			continue;
		}
		if (i < 0) {
			accept_all(c);
			continue;
		}
		if (c->conns[i].kind == C_FREE || c->conns[i].pc.fd != pfd[j].fd)
			continue;
		if (pfd[j].revents & POLLOUT) {
			if (st_proto_flush(&c->conns[i].pc) < 0) {
				conn_drop(c, i, "cannot send");
				continue;
			}
		}
		if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR))
			read_conn(c, i);
	}
	tick(c);
	c->last_round = st_mono_s();
	return 0;
}

int st_ctl_done(const st_ctl *c, int *exit_status)
{
	if (c->done && exit_status)
		*exit_status = c->exit_status;
	return c->done;
}

void st_ctl_interrupt(st_ctl *c, int sig)
{
	if (c->done)
		return;
	c->interrupted = sig;
	char why[80];
	snprintf(why, sizeof(why), "the controller got signal %d: stopping everything", sig);
	finish(c, S_ERRORED, st_exit_signal(sig), why);
}

int st_ctl_may_start_agent(const st_ctl *c, int slice, int host)
{
	if (c->done || slice < 0 || slice >= c->o.num_slices || host < 0 || host >= c->o.hosts_per_slice)
		return 0;
	return st_mono_s() >= c->sl[slice].repair_until && c->sl[slice].h[host].conn < 0;
}

void st_ctl_agent_exited(st_ctl *c, int slice, int host)
{
	if (slice < 0 || slice >= c->o.num_slices || host < 0 || host >= c->o.hosts_per_slice)
		return;
	int i = c->sl[slice].h[host].conn;
	if (i >= 0)
		conn_drop(c, i, "its process ended");
	else if (!c->done && st_mono_s() >= c->sl[slice].repair_until)
		mark_down(c, slice, c->o.repair_delay, 0, "agent process ended");
}

int st_ctl_worker_pids(const st_ctl *c, pid_t *pids, int cap)
{
	int n = 0;
	for (int r = 0; r < c->g.world && n < cap; r++)
		if (c->g.w && c->g.w[r].pid > 0)
			pids[n++] = (pid_t)c->g.w[r].pid;
	return n;
}
