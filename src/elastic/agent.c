/*
 * agent.c - the elastic agent (agent.h): one poll loop over the controller's
 * connection, a self-pipe woken by signals, and the workers' output pipes.
 */
#include "elastic/agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/array.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/file.h"
#include "base/status.h"
#include "base/version.h"
#include "comm/auth.h"
#include "comm/net.h"
#include "elastic/proto.h"

#define OUT_LINE 4096          /* a worker's output line is forwarded in pieces of at most this */
#define MAX_ARGS 4096          /* arguments and environment entries of one "start" */
#define MAX_RANK (1 << 20)
#define REAP_S 10.0            /* how long SIGKILLed workers may take to be reaped */
#define FINAL_FLUSH_S 1.0      /* the last reports' time to leave */
/* A worker stopped (SIGSTOP, a debugger) for --stopped-timeout-ms (default
 * 1000) is killed and reported hung: its slice is replaced and its peers
 * re-form without it, rather than wait out the group's heartbeat timeout
 * (docs/failures.md). */
#define STOPPED_DEFAULT_MS 1000
/* Past this many queued bytes, output lines are dropped (and counted) rather
 * than queued: a controller slow to read loses log lines, not the run. */
#define OUTPUT_QUEUE_MAX (ST_PROTO_MAX_QUEUE / 4)

typedef struct wstream {
	int fd; /* read end of the worker's stdout / stderr; -1 when closed */
	size_t len;
	char buf[OUT_LINE];
} wstream;

typedef struct worker {
	long long gen;
	int rank;
	pid_t pid;
	wstream s[2]; /* 0 stdout, 1 stderr */
	int ctl;      /* our end of its control channel (elastic/worker.h), -1 */
	long long next_gen; /* told to re-form as rank next_rank of next_gen (0: not) */
	int next_rank;
	char cbuf[1024];    /* its control channel's partial line */
	size_t clen;
	int64_t stopped_since; /* mono ns since its state is T (stopped), 0: running */
	const char *why;       /* why the agent killed it (its "exit" says), NULL: it did not */
	char whybuf[320];      /* ... when the worker said why (its watchdog's "hung") */
} worker;

typedef struct agent {
	const st_agent_opts *o;
	st_proto_conn c;
	int lost;         /* the connection failed: reports are dropped */
	long long dropped; /* output lines not forwarded since the last one that was */
	int err;          /* first failure of a send (the loop stops on it) */
	char errmsg[512];
	worker *w;        /* live (not yet reaped) workers */
	size_t nw, wcap;
	char exe[PATH_MAX];
	pid_t self;
	char addr[64];       /* this host's address: its workers bind it */
	char range[16];      /* SLICETRAIN_PORT_RANGE for the workers, "" none */
	int cfg_fd;          /* a memfd: the config the controller sent (-1 until the first "start") */
	char cfg[64];        /* /proc/self/fd/N: the workers' CONFIG (the fd is kept across exec) */
	char build[ST_BUILD_ID_LEN + 1];
	int ufd;             /* heartbeat datagrams to the controller, -1 until welcomed */
	long long newest;    /* the newest generation a start or reform named (fencing) */
	long long epoch;     /* the newest controller epoch a welcome named: older ones are refused */
	json_t *layout;      /* the newest generation's {"world":W,"slices":[...]} (its start or
			      * reform said), for a hello after the controller's return */
	int64_t lost_since;  /* mono ns: the controller's connection is gone since then, 0: connected */
	st_proto_beat beat;  /* their session and sequence */
} agent;

static volatile sig_atomic_t got_term, got_int;
static int wake_fd = -1; /* write end of the self-pipe */

static void on_signal(int sig)
{
	int e = errno;
	if (sig == SIGTERM)
		got_term = 1;
	else if (sig == SIGINT)
		got_int = 1;
	if (wake_fd >= 0 && write(wake_fd, "", 1) < 0) {
		/* full pipe: a wake-up is already pending */
	}
	errno = e;
}

/* ---- reporting ---- */

static void note_err(agent *a, int rc)
{
	if (rc >= 0 || a->err)
		return;
	a->err = rc;
	snprintf(a->errmsg, sizeof(a->errmsg), "%s", st_errmsg());
}

/* A line on stderr naming this agent: "slicetrain: agent S/H: ..." (a
 * warning when warn). */
static void say(const agent *a, int warn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(const agent *a, int warn, const char *fmt, ...)
{
	char b[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	if (warn)
		st_warn("agent %d/%d: %s", a->o->slice, a->o->host, b);
	else
		st_info("agent %d/%d: %s", a->o->slice, a->o->host, b);
}

/* Send msg (its reference taken) unless the connection is gone. */
static void report(agent *a, json_t *msg)
{
	if (a->lost || a->c.fd < 0) {
		json_decref(msg);
		return;
	}
	int rc = st_proto_send_new(&a->c, msg);
	if (rc < 0) {
		note_err(a, rc);
		a->lost = 1;
	}
}

/* A JSON string of a worker's bytes: NULs and (when the bytes are not
 * UTF-8) bytes past ASCII become '?'. */
static json_t *text_json(const char *s, size_t n)
{
	char *t = malloc(n + 1);
	if (!t)
		return NULL;
	for (size_t i = 0; i < n; i++)
		t[i] = s[i] ? s[i] : '?';
	t[n] = 0;
	json_t *j = json_stringn(t, n);
	if (!j) {
		for (size_t i = 0; i < n; i++)
			if ((unsigned char)t[i] >= 0x80)
				t[i] = '?';
		j = json_stringn(t, n);
	}
	free(t);
	return j;
}

static void send_output(agent *a, const worker *w, int which, const char *s, size_t n)
{
	json_t *t = text_json(s, n);
	if (!t) {
		note_err(a, st_fail(ST_ENOMEM, "out of memory"));
		return;
	}
	report(a, json_pack("{s:s,s:I,s:i,s:s,s:o}", "type", "output", "gen", (json_int_t)w->gen,
			    "rank", w->rank, "stream", which ? "err" : "out", "text", t));
}

static void emit_line(agent *a, const worker *w, int which, const char *s, size_t n)
{
	if (!a->o->quiet) {
		FILE *f = which ? stderr : stdout;
		fprintf(f, "[rank %d] %.*s\n", w->rank, (int)n, s);
		fflush(f);
	}
	if (a->c.wlen > OUTPUT_QUEUE_MAX) {
		a->dropped++;
		return;
	}
	if (a->dropped) {
		char note[128];
		int k = snprintf(note, sizeof(note), "slicetrain agent: %lld output line%s dropped (the controller was "
				 "not reading)", a->dropped, a->dropped == 1 ? "" : "s");
		a->dropped = 0;
		send_output(a, w, 1, note, (size_t)k);
	}
	send_output(a, w, which, s, n);
}

/* Read what the stream has (once; final: until it is empty, then close it)
 * and emit its whole lines, a full buffer as one line, and at its end the
 * rest. */
static int drain(agent *a, worker *w, int which, int final)
{
	wstream *s = &w->s[which];
	int got = 0;
	while (s->fd >= 0) {
		ssize_t n = read(s->fd, s->buf + s->len, OUT_LINE - s->len);
		got |= n > 0;
		if (n < 0 && errno == EINTR)
			continue;
		int end = n == 0 || (n < 0 && (final || errno != EAGAIN));
		if (n > 0)
			s->len += (size_t)n;
		size_t start = 0;
		for (size_t i = 0; i < s->len; i++)
			if (s->buf[i] == '\n') {
				emit_line(a, w, which, s->buf + start, i - start);
				start = i + 1;
			}
		if ((end || (start == 0 && s->len == OUT_LINE)) && s->len > start) {
			emit_line(a, w, which, s->buf + start, s->len - start);
			start = s->len;
		}
		memmove(s->buf, s->buf + start, s->len - start);
		s->len -= start;
		if (end) {
			close(s->fd);
			s->fd = -1;
		}
		if (!final)
			break;
	}
	return got;
}

/* The worker re-formed (its "reformed" line on the control channel): what
 * it printed before belongs to its old generation, what follows to the new. */
static void take_reformed(agent *a, worker *w)
{
	for (int k = 0; k < 2; k++)
		while (drain(a, w, k, 0)) {
		}
	w->gen = w->next_gen;
	w->rank = w->next_rank;
	w->next_gen = 0;
}

/* A worker found hung (its watchdog's words, or the agent's): SIGKILL; its
 * "exit" says why, and the controller replaces its slice. */
static void kill_hung(agent *a, worker *w, const char *why)
{
	snprintf(w->whybuf, sizeof(w->whybuf), "hung: %s", why);
	for (char *p = w->whybuf; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	w->why = w->whybuf;
	say(a, 1, "rank %d (pid %d, generation %lld) %s: killed", w->rank, (int)w->pid, w->gen, w->why);
	kill(w->pid, SIGKILL);
}

/* Read the worker's control channel: "reformed", "hung" and "step" lines
 * (the last passed on as "compute"); its end closes it. */
static void read_ctl(agent *a, worker *w)
{
	ssize_t n = read(w->ctl, w->cbuf + w->clen, sizeof(w->cbuf) - 1 - w->clen);
	if (n <= 0) {
		if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
			close(w->ctl);
			w->ctl = -1;
		}
		return;
	}
	w->clen += (size_t)n;
	char *nl;
	while ((nl = memchr(w->cbuf, '\n', w->clen))) {
		json_t *m = json_loadb(w->cbuf, (size_t)(nl - w->cbuf), 0, NULL);
		const char *type = json_string_value(json_object_get(m, "type"));
		const char *hung = type && !strcmp(type, "hung") ? json_string_value(json_object_get(m, "why")) : NULL;
		long long g = type && !strcmp(type, "reformed") ? json_integer_value(json_object_get(m, "gen")) : -1;
		const json_t *cs = json_object_get(m, "compute_s"), *sn = json_object_get(m, "step");
		if (type && !strcmp(type, "step") && json_is_number(cs) && json_is_integer(sn))
			report(a, json_pack("{s:s,s:I,s:i,s:I,s:f}", "type", "compute", "gen", (json_int_t)w->gen, "rank",
					    w->rank, "step", json_integer_value(sn), "s", json_number_value(cs)));
		else if (hung && !w->why)
			kill_hung(a, w, hung);
		else if (g > 0 && g == w->next_gen)
			take_reformed(a, w);
		else if (!hung && !(type && !strcmp(type, "step")))
			say(a, 1, "rank %d: an unexpected line on its control channel", w->rank);
		json_decref(m);
		w->clen -= (size_t)(nl + 1 - w->cbuf);
		memmove(w->cbuf, nl + 1, w->clen);
	}
	if (w->clen == sizeof(w->cbuf) - 1) { /* a line too long: not ours */
		close(w->ctl);
		w->ctl = -1;
	}
}

/* ---- workers ---- */

static void setenv_int(const char *k, long v)
{
	char b[32];
	snprintf(b, sizeof(b), "%ld", v);
	setenv(k, b, 1);
}

/* The child's side of spawn: never returns. */
static void exec_worker(const agent *a, int rank, int threads, int pin, const json_t *env,
			const json_t *args, int out, int err, int ctl)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != a->self)
		_exit(1);
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	sigemptyset(&dfl.sa_mask);
	int sigs[] = {SIGTERM, SIGINT, SIGCHLD, SIGPIPE};
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &dfl, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0 && devnull != 0) {
		dup2(devnull, 0);
		close(devnull);
	}
	dup2(out, 1);
	dup2(err, 2);
	close(out);
	close(err);
	if (ctl >= 0 && fcntl(ctl, F_SETFD, 0) == 0) /* kept across exec */
		setenv_int("SLICETRAIN_CONTROL_FD", ctl);
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)env, k, v)
		setenv(k, json_string_value(v), 1);
	setenv("SLICETRAIN_ADDR", a->addr, 1);
	if (a->range[0])
		setenv("SLICETRAIN_PORT_RANGE", a->range, 1);
	setenv_int("SLICETRAIN_RANK", rank);
	setenv_int("OMP_NUM_THREADS", threads);
	if (pin) { /* the machine has a core for every thread of every rank up to this one */
		cpu_set_t set;
		CPU_ZERO(&set);
		for (int t = 0; t < threads; t++)
			CPU_SET(rank * threads + t, &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	size_t na = json_array_size(args), j = 2;
	char **argv = calloc(na + 4, sizeof(char *));
	if (!argv)
		_exit(127);
	argv[0] = (char *)"slicetrain";
	argv[1] = (char *)"train";
	if (a->cfg_fd >= 0 && fcntl(a->cfg_fd, F_SETFD, 0) == 0)
		argv[j++] = (char *)a->cfg;
	for (size_t i = 0; i < na; i++)
		argv[j++] = (char *)json_string_value(json_array_get(args, i));
	execv(a->exe, argv);
	fprintf(stderr, "slicetrain agent: cannot run %s: %s\n", a->exe, strerror(errno));
	_exit(127);
}

/* Fork one worker; 0, or <0 with errno's message (nothing left behind). */
static int spawn(agent *a, long long gen, int rank, int threads, int pin, const json_t *env,
		 const json_t *args)
{
	int po[2], pe[2], cs[2], rc;
	if ((rc = st_array_reserve(&a->w, &a->wcap, a->nw, sizeof(worker), 8)) < 0)
		return rc;
	if (pipe2(po, O_CLOEXEC) < 0)
		return st_fail(ST_EIO, "pipe: %s", strerror(errno));
	if (pipe2(pe, O_CLOEXEC) < 0) {
		rc = st_fail(ST_EIO, "pipe: %s", strerror(errno));
		close(po[0]);
		close(po[1]);
		return rc;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cs) < 0) {
		rc = st_fail(ST_EIO, "socketpair: %s", strerror(errno));
		close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
		return rc;
	}
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGCHLD);
	sigprocmask(SIG_BLOCK, &block, &old);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		close(cs[0]);
		exec_worker(a, rank, threads, pin, env, args, po[1], pe[1], cs[1]);
	}
	int e = errno;
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(po[1]);
	close(pe[1]);
	close(cs[1]);
	if (pid < 0) {
		close(po[0]);
		close(pe[0]);
		close(cs[0]);
		return st_fail(ST_EIO, "fork: %s", strerror(e));
	}
	fcntl(po[0], F_SETFL, O_NONBLOCK);
	fcntl(pe[0], F_SETFL, O_NONBLOCK);
	worker *w = &a->w[a->nw++];
	*w = (worker){.gen = gen, .rank = rank, .pid = pid, .ctl = cs[0]};
	w->s[0].fd = po[0];
	w->s[1].fd = pe[0];
	return 0;
}

/* Worker `rank` of generation gen: by its tag, or by the tag it will have
 * once it re-formed (told to, not done yet: the controller already counts
 * it in gen, e.g. to stop it while it still joins the new group). */
static worker *find(agent *a, long long gen, int rank)
{
	for (size_t i = 0; i < a->nw; i++)
		if ((a->w[i].gen == gen && a->w[i].rank == rank && !a->w[i].next_gen) ||
		    (a->w[i].next_gen == gen && a->w[i].next_rank == rank))
			return &a->w[i];
	return NULL;
}

static int has_gen(const agent *a, long long gen)
{
	for (size_t i = 0; i < a->nw; i++)
		if (a->w[i].gen == gen || a->w[i].next_gen == gen)
			return 1;
	return 0;
}

static void signal_gen(agent *a, long long gen, int sig)
{
	for (size_t i = 0; i < a->nw; i++)
		if (gen < 0 || a->w[i].gen == gen || a->w[i].next_gen == gen)
			kill(a->w[i].pid, sig);
}

/* Workers stopped (state T or t in /proc/PID/stat) for the agent's
 * stopped_ms: SIGKILL, reported hung (the "why" of their exit). */
static void check_stopped(agent *a, int64_t now)
{
	int ms = a->o->stopped_ms ? a->o->stopped_ms : STOPPED_DEFAULT_MS;
	if (ms < 0)
		return;
	for (size_t i = 0; i < a->nw; i++) {
		worker *w = &a->w[i];
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)w->pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (n <= 0 || w->why)
			continue;
		buf[n] = 0;
		const char *rp = strrchr(buf, ')');
		int stopped = rp && (rp[2] == 'T' || rp[2] == 't');
		if (!stopped) {
			w->stopped_since = 0;
		} else if (!w->stopped_since) {
			w->stopped_since = now;
		} else if (now - w->stopped_since >= (int64_t)ms * 1000000) {
			kill_hung(a, w, "stopped (SIGSTOP or a debugger) past --stopped-timeout-ms");
		}
	}
}

/* Reap every worker that ended: its last output, then its "exit". */
static void reap(agent *a)
{
	int st;
	pid_t pid;
	while (a->nw > 0 && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
		for (size_t i = 0; i < a->nw; i++) {
			worker *w = &a->w[i];
			if (w->pid != pid)
				continue;
			drain(a, w, 0, 1);
			drain(a, w, 1, 1);
			int status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
			int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
			if (sig)
				say(a, 0, "rank %d (pid %d, generation %lld) was killed by signal %d",
					w->rank, (int)pid, w->gen, sig);
			else
				say(a, 0, "rank %d (pid %d, generation %lld) exited with status %d",
					w->rank, (int)pid, w->gen, status);
			if (w->next_gen) /* told to re-form: it belongs to the new generation */
				take_reformed(a, w);
			json_t *ex = json_pack("{s:s,s:I,s:i,s:i,s:i,s:i}", "type", "exit", "gen", (json_int_t)w->gen,
					       "rank", w->rank, "pid", (int)pid, "status", status, "signal", sig);
			if (ex && w->why)
				json_object_set_new(ex, "why", json_string(w->why));
			report(a, ex);
			if (w->ctl >= 0)
				close(w->ctl);
			a->w[i] = a->w[--a->nw];
			break;
		}
	}
}

/* Wait (bounded) until every worker is reaped, or the deadline. */
static void reap_until(agent *a, int wake, int64_t deadline)
{
	for (;;) {
		reap(a);
		int64_t left = deadline - st_mono_ns();
		if (a->nw == 0 || left <= 0)
			break;
		struct pollfd p = {.fd = wake, .events = POLLIN};
		int ms = left / 1000000 > 50 ? 50 : (int)(left / 1000000) + 1;
		if (poll(&p, 1, ms) > 0) {
			char b[64];
			while (read(wake, b, sizeof(b)) > 0) {
			}
		}
	}
	if (a->nw)
		say(a, 1, "%zu worker(s) not reaped after SIGKILL", a->nw);
}

static void kill_all(agent *a, int wake)
{
	signal_gen(a, -1, SIGKILL);
	reap_until(a, wake, st_mono_ns() + (int64_t)(REAP_S * 1e9));
}

/* ---- messages from the controller ---- */

static int check_start(agent *a, const json_t *m, long long *gen, long long *threads,
		       const json_t **ranks, const json_t **env, const json_t **args)
{
	int rc;
	if ((rc = st_proto_get_int(m, "gen", 0, (1LL << 53), gen)) < 0)
		return rc;
	*threads = a->o->threads_per_device > 0 ? a->o->threads_per_device : 1;
	if (json_object_get(m, "threads") && (rc = st_proto_get_int(m, "threads", 1, 4096, threads)) < 0)
		return rc;
	*ranks = json_object_get(m, "ranks");
	size_t nr = json_array_size(*ranks);
	if (!json_is_array(*ranks) || nr == 0 || nr > (size_t)a->o->devices)
		return st_fail(ST_EPROTO, "protocol: \"ranks\" is not an array of 1 to %d ranks", a->o->devices);
	for (size_t i = 0; i < nr; i++) {
		const json_t *r = json_array_get(*ranks, i);
		long long v = json_is_integer(r) ? json_integer_value(r) : -1;
		if (v < 0 || v >= MAX_RANK)
			return st_fail(ST_EPROTO, "protocol: \"ranks\"[%zu] is not a rank (0..%d)", i, MAX_RANK - 1);
		for (size_t j = 0; j < i; j++)
			if (json_integer_value(json_array_get(*ranks, j)) == v)
				return st_fail(ST_EPROTO, "protocol: rank %lld appears twice in \"ranks\"", v);
		if (find(a, *gen, (int)v))
			return st_fail(ST_EPROTO, "protocol: rank %lld of generation %lld is already running", v, *gen);
	}
	*args = json_object_get(m, "args");
	if (!json_is_array(*args) || json_array_size(*args) > MAX_ARGS)
		return st_fail(ST_EPROTO, "protocol: \"args\" is not an array of at most %d strings", MAX_ARGS);
	for (size_t i = 0; i < json_array_size(*args); i++)
		if (!json_is_string(json_array_get(*args, i)))
			return st_fail(ST_EPROTO, "protocol: \"args\"[%zu] is not a string", i);
	*env = json_object_get(m, "env");
	if (*env && (!json_is_object(*env) || json_object_size(*env) > MAX_ARGS))
		return st_fail(ST_EPROTO, "protocol: \"env\" is not an object of at most %d strings", MAX_ARGS);
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)*env, k, v)
		if (!*k || strchr(k, '=') || !json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
			return st_fail(ST_EPROTO, "protocol: \"env\" entry '%s' is not NAME: \"VALUE\"", k);
	return 0;
}

/* A start's "config" (the resolved config, JSON text): kept in a memfd
 * whose path /proc/self/fd/N each worker opens as its CONFIG (no file on
 * disk: nothing is left behind when the agent is killed). */
static int take_config(agent *a, const json_t *m)
{
	const json_t *cfg = json_object_get(m, "config");
	if (!cfg)
		return 0;
	if (!json_is_string(cfg) || json_string_length(cfg) > (1 << 20))
		return st_fail(ST_EPROTO, "protocol: \"config\" is not a string of at most 1 MiB");
	if (a->cfg_fd >= 0)
		return 0;
	int fd = memfd_create("slicetrain-config.json", MFD_CLOEXEC);
	if (fd < 0)
		return st_fail(ST_EIO, "agent: memfd_create: %s", strerror(errno));
	const char *text = json_string_value(cfg);
	size_t n = json_string_length(cfg), done = 0;
	while (done < n) {
		ssize_t w = write(fd, text + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = errno;
			close(fd);
			return st_fail(ST_EIO, "agent: cannot keep the config: %s", strerror(e));
		}
		done += (size_t)w;
	}
	a->cfg_fd = fd;
	snprintf(a->cfg, sizeof(a->cfg), "/proc/self/fd/%d", fd);
	return 0;
}

/* The layout of the generation a start or reform names: its world size
 * (the env's SLICETRAIN_WORLD_SIZE) and slices ("slices", from the
 * controller); none when either is missing. */
static void set_layout(agent *a, const json_t *m, const json_t *env)
{
	json_decref(a->layout);
	a->layout = NULL;
	const json_t *sl = json_object_get(m, "slices");
	const char *ws = env ? json_string_value(json_object_get(env, "SLICETRAIN_WORLD_SIZE")) : NULL;
	long world;
	if (!json_is_array(sl) || !ws || st_parse_long(ws, 1, MAX_RANK, &world) < 0)
		return;
	a->layout = json_pack("{s:I,s:O}", "world", (json_int_t)world, "slices", sl);
}

static int on_start(agent *a, const json_t *m, int draining)
{
	long long gen, threads;
	const json_t *ranks = NULL, *env = NULL, *args = NULL;
	int rc = check_start(a, m, &gen, &threads, &ranks, &env, &args);
	if (rc < 0 || (rc = take_config(a, m)) < 0)
		return rc;
	if (gen < a->newest) { /* a delayed or replayed message: no worker of an old generation */
		say(a, 1, "refused: a start of generation %lld, older than generation %lld", gen, a->newest);
		return 0;
	}
	a->newest = gen;
	set_layout(a, m, env);
	json_t *empty = json_object();
	if (!empty)
		return st_fail(ST_ENOMEM, "out of memory");
	if (!env)
		env = empty;
	if (draining) {
		say(a, 1, "generation %lld not started: this host is being preempted", gen);
		json_decref(empty);
		return 0;
	}
	size_t nr = json_array_size(ranks);
	long long maxrank = 0;
	for (size_t i = 0; i < nr; i++)
		if (json_integer_value(json_array_get(ranks, i)) > maxrank)
			maxrank = json_integer_value(json_array_get(ranks, i));
	int pin = (maxrank + 1) * threads <= sysconf(_SC_NPROCESSORS_ONLN);
	json_t *list = json_array();
	for (size_t i = 0; list && i < nr; i++) {
		int rank = (int)json_integer_value(json_array_get(ranks, i));
		if ((rc = spawn(a, gen, rank, (int)threads, pin, env, args)) < 0) {
			/* the controller sees it as a worker that could not run */
			say(a, 1, "cannot start rank %d: %s", rank, st_errmsg());
			report(a, json_pack("{s:s,s:I,s:i,s:i,s:i,s:i}", "type", "exit", "gen", (json_int_t)gen,
					    "rank", rank, "pid", 0, "status", 127, "signal", 0));
			continue;
		}
		json_array_append_new(list, json_pack("{s:i,s:i}", "rank", rank, "pid", (int)a->w[a->nw - 1].pid));
	}
	json_decref(empty);
	if (!list)
		return st_fail(ST_ENOMEM, "out of memory");
	say(a, 0, "generation %lld: started %zu worker(s)", gen, json_array_size(list));
	report(a, json_pack("{s:s,s:I,s:o}", "type", "started", "gen", (json_int_t)gen, "workers", list));
	return 0;
}

/*
 * reform: {"gen":G,"from":F,"workers":[{"old":R0,"rank":R},...],"env":{...}}:
 * each listed worker of generation F becomes rank R of generation G, told
 * over its control channel (elastic/worker.h) with env and its new rank;
 * answered with "started" for G. A listed worker that is gone is reported
 * as an exit of G (status 127), as a worker that could not start.
 */
static int on_reform(agent *a, const json_t *m)
{
	long long gen, from;
	int rc;
	const json_t *ws = json_object_get(m, "workers"), *env;
	if ((rc = st_proto_get_int(m, "gen", 1, (1LL << 53), &gen)) < 0 ||
	    (rc = st_proto_get_int(m, "from", 1, (1LL << 53), &from)) < 0)
		return rc;
	if (gen <= a->newest) { /* a delayed or replayed message */
		say(a, 1, "refused: a reform into generation %lld, not newer than generation %lld", gen, a->newest);
		return 0;
	}
	if (!json_is_array(ws) || json_array_size(ws) == 0 || json_array_size(ws) > (size_t)a->o->devices)
		return st_fail(ST_EPROTO, "protocol: reform: \"workers\" is not an array of 1 to %d", a->o->devices);
	if ((rc = st_proto_get_env(m, MAX_ARGS, &env)) < 0)
		return st_wrap(rc, "protocol: reform");
	const json_t *ab = json_object_get(m, "abort");
	if (ab && !json_is_boolean(ab))
		return st_fail(ST_EPROTO, "protocol: reform: \"abort\" is not true or false");
	size_t i;
	json_t *x;
	long long olds[64], news[64];
	json_array_foreach(ws, i, x) {
		if (i >= 64)
			return st_fail(ST_EPROTO, "protocol: reform: more than 64 workers");
		if ((rc = st_proto_get_int(x, "old", 0, MAX_RANK - 1, &olds[i])) < 0 ||
		    (rc = st_proto_get_int(x, "rank", 0, MAX_RANK - 1, &news[i])) < 0)
			return rc;
	}
	json_t *list = json_array();
	if (!list)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t j = 0; j < json_array_size(ws); j++) {
		worker *w = find(a, from, (int)olds[j]);
		char *line = NULL;
		json_t *e = json_deep_copy(env), *msg = NULL;
		char rs[24];
		snprintf(rs, sizeof(rs), "%lld", news[j]);
		if (e && !json_object_set_new(e, "SLICETRAIN_RANK", json_string(rs)))
			msg = json_pack("{s:s,s:I,s:o}", "type", "reform", "gen", (json_int_t)gen, "env", e);
		else
			json_decref(e);
		if (msg)
			line = json_dumps(msg, JSON_COMPACT);
		json_decref(msg);
		int ok = 0;
		if (w && w->ctl >= 0 && line) {
			size_t n = strlen(line);
			line[n] = '\n'; /* json_dumps' NUL becomes the line's end */
			ok = st_send_full(w->ctl, line, n + 1, st_mono_ns() + 1000000000) == 0;
		}
		free(line);
		if (!ok) {
			say(a, 1, "reform: rank %lld of generation %lld is gone or cannot be told", olds[j], from);
			if (w)
				kill(w->pid, SIGKILL);
			report(a, json_pack("{s:s,s:I,s:i,s:i,s:i,s:i}", "type", "exit", "gen", (json_int_t)gen,
					    "rank", (int)news[j], "pid", 0, "status", 127, "signal", 0));
			continue;
		}
		if (json_is_true(ab)) /* a failure: give up the collectives in flight of generation from */
			sigqueue(w->pid, ST_SIG_ABORT, (union sigval){.sival_int = (int)from});
		w->next_gen = gen; /* its lines keep the old generation until it says "reformed" */
		w->next_rank = (int)news[j];
		json_array_append_new(list, json_pack("{s:i,s:i}", "rank", w->next_rank, "pid", (int)w->pid));
	}
	a->newest = gen;
	set_layout(a, m, env);
	say(a, 0, "generation %lld: %zu worker(s) of generation %lld re-form in place", gen, json_array_size(list), from);
	report(a, json_pack("{s:s,s:I,s:o}", "type", "started", "gen", (json_int_t)gen, "workers", list));
	return 0;
}

/* The welcome names the run directory and a probe file the controller
 * wrote there: this host must read the same nonce back ("ready"), else it
 * cannot see the run's storage ("unfit", and the agent stops: ST_EINVAL). */
static int check_run_dir(agent *a, const json_t *m)
{
	const char *dir, *probe, *nonce;
	int rc;
	if ((rc = st_proto_get_str(m, "run_dir", &dir)) < 0 || (rc = st_proto_get_str(m, "probe", &probe)) < 0 ||
	    (rc = st_proto_get_str(m, "nonce", &nonce)) < 0)
		return rc;
	char *got = NULL, why[900];
	size_t n = 0;
	rc = st_read_file(probe, 64, &got, &n);
	if (rc == 0 && n == strlen(nonce) && !memcmp(got, nonce, n)) {
		free(got);
		report(a, json_pack("{s:s}", "type", "ready"));
		return 0;
	}
	snprintf(why, sizeof(why), "this host (%s) cannot see the run directory %.300s: %.300s", a->addr, dir,
		 rc < 0 ? st_errmsg() : "its probe file holds another run's nonce");
	free(got);
	report(a, json_pack("{s:s,s:s}", "type", "unfit", "why", why));
	return st_fail(ST_EINVAL, "%s; every host must see the same run directory (shared storage: docs/hosts.md)",
		       why);
}

/* The heartbeat datagrams (proto.h): a UDP socket connected to the
 * controller's address and port, the session the welcome's "beat" gives. */
static int open_beats(agent *a, const json_t *m)
{
	const char *hex;
	int rc = st_proto_get_str(m, "beat", &hex);
	if (rc < 0)
		return rc;
	char *end;
	errno = 0;
	unsigned long long s = strtoull(hex, &end, 16);
	if (errno || end == hex || *end || strlen(hex) != 16)
		return st_fail(ST_EPROTO, "protocol: welcome: \"beat\" is not 16 hex digits");
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getpeername(a->c.fd, (struct sockaddr *)&ss, &sl) < 0)
		return st_fail(ST_EPEER, "agent: the controller's address: %s", strerror(errno));
	int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&ss, sl) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return st_fail(ST_EIO, "agent: a UDP socket for the heartbeats: %s", strerror(e));
	}
	a->ufd = fd;
	a->beat = (st_proto_beat){.slice = (uint32_t)a->o->slice, .host = (uint32_t)a->o->host, .session = s};
	return 0;
}

static void send_beat(agent *a)
{
	uint8_t d[ST_PROTO_BEAT_LEN];
	static const st_token none;
	if (a->ufd < 0)
		return;
	a->beat.seq++;
	st_proto_beat_make(d, a->o->token ? a->o->token : &none, &a->beat);
	if (send(a->ufd, d, sizeof(d), MSG_DONTWAIT) < 0) {
		/* lost like a dropped packet: the TCP heartbeats and the next datagram go on */
	}
}

/* A port free right now on this host's address (in the port range): the
 * coordinator's when this host holds rank 0. 0 when none is. */
static int free_port(const agent *a)
{
	int port = st_tcp_free_port(a->addr, a->o->port_lo, a->o->port_hi);
	return port > 0 ? port : 0;
}

/* 1: shutdown; 0: go on; <0: a protocol error. */
static int on_message(agent *a, const json_t *m, int *welcomed, int draining)
{
	const char *type = json_string_value(json_object_get(m, "type"));
	long long gen, v;
	int rc;
	if (!*welcomed) {
		if (!strcmp(type, "refused")) {
			const char *why = json_string_value(json_object_get(m, "why"));
			return st_fail(ST_EINVAL, "the controller refused this host: %.500s", why ? why : "(no reason)");
		}
		if (strcmp(type, "welcome"))
			return st_fail(ST_EPROTO, "protocol: \"%s\" before \"welcome\"", type);
		if ((rc = st_proto_get_int(m, "version", 0, INT_MAX, &v)) < 0)
			return rc;
		if (v != ST_PROTO_VERSION)
			return st_fail(ST_EPROTO, "protocol: the controller speaks version %lld, not %d", v,
				       ST_PROTO_VERSION);
		long long ep;
		if ((rc = st_proto_get_int(m, "epoch", 1, 1LL << 40, &ep)) < 0)
			return rc;
		if (ep < a->epoch) {
			say(a, 1, "refused: a welcome from controller epoch %lld, older than epoch %lld (a deposed "
			    "controller): reconnecting", ep, a->epoch);
			return st_fail(ST_EPEER, "a welcome from a deposed controller (epoch %lld)", ep);
		}
		a->epoch = ep;
		if ((rc = check_run_dir(a, m)) < 0 || (rc = open_beats(a, m)) < 0)
			return rc;
		*welcomed = 1;
		if (a->lost_since) {
			say(a, 0, "controller back (epoch %lld) after %.1f s; %zu worker(s) kept", ep,
			    (double)(st_mono_ns() - a->lost_since) / 1e9, a->nw);
			a->lost_since = 0;
		}
		return 0;
	}
	long long ep;
	if ((rc = st_proto_get_int(m, "epoch", 1, 1LL << 40, &ep)) < 0)
		return rc;
	if (ep != a->epoch) { /* a delayed or replayed order of another controller */
		say(a, 1, "refused: a \"%.20s\" of controller epoch %lld, not this host's controller's (epoch %lld)",
		    type, ep, a->epoch);
		return 0;
	}
	if (!strcmp(type, "welcome"))
		return 0;
	if (!strcmp(type, "start"))
		return on_start(a, m, draining);
	if (!strcmp(type, "reform"))
		return on_reform(a, m);
	if (!strcmp(type, "stop")) {
		const char *how;
		if ((rc = st_proto_get_int(m, "gen", 0, (1LL << 53), &gen)) < 0 ||
		    (rc = st_proto_get_str(m, "how", &how)) < 0)
			return rc;
		int sig = !strcmp(how, "resize") ? ST_SIG_RESIZE : !strcmp(how, "notice") ? ST_SIG_NOTICE
							 : !strcmp(how, "kill")   ? SIGKILL : 0;
		if (!sig)
			return st_fail(ST_EPROTO, "protocol: \"how\" is '%s', not resize, notice or kill", how);
		if (gen < a->newest && !has_gen(a, gen))
			say(a, 1, "refused: a stop of generation %lld, older than generation %lld", gen, a->newest);
		signal_gen(a, gen, sig);
		return 0;
	}
	if (!strcmp(type, "kill")) {
		if ((rc = st_proto_get_int(m, "gen", 0, (1LL << 53), &gen)) < 0 ||
		    (rc = st_proto_get_int(m, "rank", 0, MAX_RANK - 1, &v)) < 0)
			return rc;
		worker *w = find(a, gen, (int)v);
		if (w)
			kill(w->pid, SIGKILL);
		return 0;
	}
	if (!strcmp(type, "shutdown"))
		return 1;
	return st_fail(ST_EPROTO, "protocol: unknown message type '%s'", type);
}

/* ---- the loop ---- */

static int check_opts(const st_agent_opts *o)
{
	if (!o->controller || !*o->controller)
		return st_fail(ST_EINVAL, "agent: no controller address");
	if (o->slice < 0 || o->hosts_per_slice < 1 || o->host < 0 || o->host >= o->hosts_per_slice)
		return st_fail(ST_EINVAL, "agent: host %d is not in 0..%d (hosts per slice %d), or slice %d < 0",
			       o->host, o->hosts_per_slice - 1, o->hosts_per_slice, o->slice);
	if (o->devices < 1 || o->threads_per_device < 0)
		return st_fail(ST_EINVAL, "agent: devices must be >= 1");
	return 0;
}

static double or_default(double v, double d) { return v > 0 ? v : d; }

static int64_t after_s(double s) { return st_mono_ns() + (int64_t)(s * 1e9); }

/* What this host runs, for a controller that takes over: the newest
 * generation's layout and its workers here; NULL when none run. */
static json_t *running(const agent *a)
{
	if (!a->nw || !a->layout)
		return NULL;
	json_t *ws = json_array(), *r = json_deep_copy(a->layout);
	for (size_t i = 0; ws && i < a->nw; i++)
		if (a->w[i].gen == a->newest && !a->w[i].next_gen)
			json_array_append_new(ws, json_pack("{s:i,s:i}", "rank", a->w[i].rank, "pid", (int)a->w[i].pid));
	if (!ws || !r || json_object_set_new(r, "gen", json_integer(a->newest)) ||
	    json_object_set_new(r, "workers", ws)) {
		json_decref(r);
		return NULL;
	}
	return r;
}

static void send_hello(agent *a, int port)
{
	const st_agent_opts *o = a->o;
	json_t *m = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:i,s:s,s:s,s:I}", "type", "hello", "version",
			      ST_PROTO_VERSION, "slice", o->slice, "host", o->host, "hosts_per_slice",
			      o->hosts_per_slice, "devices", o->devices, "pid", (int)a->self, "addr", a->addr, "port",
			      port, "build", a->build, "release", ST_VERSION, "epoch", (json_int_t)a->epoch);
	json_t *r = running(a);
	if (m && r)
		json_object_set_new(m, "running", r);
	report(a, m);
}

/* The controller's connection failed with rc. With --controller-grace
 * (and not stopping), keep the workers and reconnect: 0. Else rc. */
static int controller_gone(agent *a, int rc, int draining)
{
	if (a->o->controller_grace_s <= 0 || draining || rc != ST_EPEER || !a->epoch)
		return rc; /* (never welcomed: no controller to wait for yet) */
	if (!a->lost_since) {
		a->lost_since = st_mono_ns();
		say(a, 1, "%s; keeping %zu worker(s) and reconnecting for up to %.0f s (--controller-grace)", st_errmsg(),
		    a->nw, a->o->controller_grace_s);
	}
	st_proto_conn_release(&a->c);
	a->lost = 1;
	a->err = 0;
	if (a->ufd >= 0)
		close(a->ufd);
	a->ufd = -1;
	return 0;
}

/* The controller's connection fails once 5 s of what it sent stay
 * unacknowledged (a controller host gone silent): the agent then
 * reconnects, rather than wait out TCP's retransmissions (many minutes). */
static void bound_silence(int fd)
{
	unsigned int ms = 5000;
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

/* Reconnect once (at most a second): a new connection and its hello. */
static void reconnect(agent *a)
{
	static const st_token none;
	int fd;
	if (st_proto_connect(a->o->controller, a->o->token ? a->o->token : &none, st_mono_ns() + 1000000000, &fd) < 0)
		return;
	bound_silence(fd);
	if (st_proto_conn_init(&a->c, fd) < 0)
		return;
	a->lost = 0;
	send_hello(a, free_port(a));
}

/* The loop proper, once connected and hello is sent. 0 or an error. */
static int serve(agent *a, int wake)
{
	const st_agent_opts *o = a->o;
	int welcomed = 0, draining = 0, killed = 0;
	int64_t welcome_by = after_s(or_default(o->welcome_timeout_s, 10)), next_try = 0;
	int64_t hb_ns = (int64_t)ST_PROTO_HEARTBEAT_MS * 1000000, next_hb = st_mono_ns() + hb_ns;
	int64_t beat_ns = (int64_t)ST_PROTO_BEAT_MS * 1000000, next_beat = st_mono_ns();
	int64_t drain_by = 0;
	struct pollfd *pfd = NULL;
	size_t *who = NULL, pcap = 0;
	int rc = 0;
	for (;;) {
		char b[64];
		while (read(wake, b, sizeof(b)) > 0) {
		}
		reap(a);
		if (a->err) {
			st_fail(a->err, "%s", a->errmsg);
			if ((rc = controller_gone(a, a->err, draining)) < 0)
				break;
			welcomed = 0;
		}
		if (a->lost_since) { /* the controller is gone: back within the grace, or stop */
			int64_t now = st_mono_ns();
			if (now - a->lost_since > (int64_t)(a->o->controller_grace_s * 1e9)) {
				rc = st_fail(ST_EPEER, "agent: no controller at %s for %.0f s (--controller-grace): stopping",
					     o->controller, a->o->controller_grace_s);
				break;
			}
			if (a->c.fd < 0 && now >= next_try) {
				reconnect(a);
				next_try = now + 500000000;
				if (a->c.fd >= 0)
					welcome_by = after_s(or_default(o->welcome_timeout_s, 10));
			}
		}
		if (got_int) {
			rc = st_fail(ST_EINTR, "agent: interrupted (SIGINT): workers killed");
			break;
		}
		int64_t now = st_mono_ns();
		if (got_term && !draining) {
			draining = 1;
			drain_by = after_s(or_default(o->grace_s, 30));
			say(a, 0, "SIGTERM: passing the preemption notice to %zu worker(s)", a->nw);
			signal_gen(a, -1, SIGTERM);
			report(a, json_pack("{s:s,s:i}", "type", "notice", "signal", SIGTERM));
			continue;
		}
		if (draining && a->nw == 0)
			break;
		if (draining && killed && now >= drain_by) /* kill_all below warns */
			break;
		if (draining && !killed && now >= drain_by) {
			say(a, 1, "%zu worker(s) still running after the grace period: SIGKILL", a->nw);
			signal_gen(a, -1, SIGKILL);
			killed = 1;
			drain_by = after_s(REAP_S);
		}
		if (!welcomed && a->c.fd >= 0 && now >= welcome_by) {
			rc = st_fail(ST_EPEER, "agent: no welcome from the controller at %s within %.0f s",
				     o->controller, or_default(o->welcome_timeout_s, 10));
			if ((rc = controller_gone(a, rc, draining)) < 0)
				break;
			continue;
		}
		if (now >= next_beat) {
			if (welcomed)
				send_beat(a);
			next_beat = now + beat_ns;
		}
		if (now >= next_hb) {
			check_stopped(a, now);
			next_hb = now + hb_ns;
			if (!welcomed)
				continue;
			int port = free_port(a);
			if (port > 0)
				report(a, json_pack("{s:s,s:i}", "type", "heartbeat", "port", port));
			else
				report(a, json_pack("{s:s}", "type", "heartbeat"));
			continue;
		}
		int64_t until = next_hb < next_beat ? next_hb : next_beat;
		if (!welcomed && a->c.fd >= 0 && welcome_by < until)
			until = welcome_by;
		if (a->lost_since && a->c.fd < 0 && next_try < until)
			until = next_try;
		if (draining && drain_by < until)
			until = drain_by;
		/* poll set: the connection, the self-pipe, every open output pipe */
		size_t need = 2 + 3 * a->nw;
		if (need > pcap) {
			struct pollfd *np = realloc(pfd, need * sizeof(*pfd));
			if (np)
				pfd = np;
			size_t *nw = np ? realloc(who, need * sizeof(*who)) : NULL;
			if (!np || !nw) {
				rc = st_fail(ST_ENOMEM, "out of memory");
				break;
			}
			who = nw;
			pcap = need;
		}
		size_t np = 0;
		pfd[np++] = (struct pollfd){.fd = a->c.fd, .events = POLLIN | (a->c.wlen ? POLLOUT : 0)};
		pfd[np++] = (struct pollfd){.fd = wake, .events = POLLIN};
		for (size_t i = 0; i < a->nw; i++)
			for (int k = 0; k < 3; k++) {
				int fd = k < 2 ? a->w[i].s[k].fd : a->w[i].ctl;
				if (fd >= 0) {
					who[np] = 3 * i + (size_t)k;
					pfd[np++] = (struct pollfd){.fd = fd, .events = POLLIN};
				}
			}
		int ms = until > now ? (int)((until - now) / 1000000) + 1 : 0;
		int pr = poll(pfd, (nfds_t)np, ms);
		if (pr < 0 && errno != EINTR) {
			rc = st_fail(ST_EIO, "agent: poll: %s", strerror(errno));
			break;
		}
		if (pr <= 0)
			continue;
		for (size_t j = 2; j < np; j++)
			if (pfd[j].revents && who[j] % 3 == 2)
				read_ctl(a, &a->w[who[j] / 3]);
			else if (pfd[j].revents)
				drain(a, &a->w[who[j] / 3], (int)(who[j] % 3), 0);
		if (pfd[0].revents & POLLOUT) {
			int fr = st_proto_flush(&a->c);
			if (fr < 0) {
				if ((rc = controller_gone(a, fr, draining)) < 0)
					break;
				welcomed = 0;
				continue;
			}
		}
		if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
			json_t *m;
			int r;
			while ((r = st_proto_recv(&a->c, &m)) == 1) {
				r = on_message(a, m, &welcomed, draining);
				json_decref(m);
				if (r != 0)
					break;
			}
			if (r == 1) { /* shutdown */
				say(a, 0, "shutdown: stopping %zu worker(s)", a->nw);
				break;
			}
			if (r < 0) {
				rc = r == ST_EINVAL ? st_wrap(r, "agent: controller %s", o->controller)
						    : st_wrap(r, "agent: the controller at %s %s", o->controller,
							      r == ST_EPEER ? "is gone" : "broke the protocol");
				if ((rc = controller_gone(a, rc, draining)) < 0)
					break;
				welcomed = 0;
			}
		}
	}
	free(pfd);
	free(who);
	return rc;
}

/* This host's address: --addr (checked to be one of this host's: it must
 * bind), else the one the connection to the controller leaves from. */
static int host_addr(agent *a, int fd)
{
	if (a->o->addr) {
		int lfd, port;
		if (!st_addr_is_numeric(a->o->addr))
			return st_fail(ST_EINVAL, "agent: --addr %s is not a numeric IP address", a->o->addr);
		int r = st_tcp_listen(a->o->addr, 0, 1, &lfd, &port);
		if (r < 0)
			return st_fail(ST_EINVAL, "agent: --addr %s is not an address of this host: %s", a->o->addr,
				       strerror(-r));
		close(lfd);
		snprintf(a->addr, sizeof(a->addr), "%s", a->o->addr);
		return 0;
	}
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0 ||
	    !inet_ntop(ss.ss_family, ss.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
								: (void *)&((struct sockaddr_in *)&ss)->sin_addr,
		       a->addr, sizeof(a->addr)))
		return st_fail(ST_EIO, "agent: cannot tell this host's address: %s", strerror(errno));
	return 0;
}

int st_agent_run(const st_agent_opts *o)
{
	int rc = check_opts(o);
	if (rc < 0)
		return rc;
	agent a = {.o = o, .c = ST_PROTO_CONN_INIT, .self = getpid(), .cfg_fd = -1, .ufd = -1};
	if (o->exe) {
		snprintf(a.exe, sizeof(a.exe), "%s", o->exe);
	} else {
		ssize_t n = readlink("/proc/self/exe", a.exe, sizeof(a.exe) - 1);
		if (n <= 0)
			return st_fail(ST_EIO, "agent: cannot find my own binary: %s", strerror(errno));
		a.exe[n] = 0;
	}
	if ((rc = st_build_id(a.exe, a.build)) < 0)
		return rc;
	if (o->port_lo > 0)
		snprintf(a.range, sizeof(a.range), "%d-%d", o->port_lo, o->port_hi);
	int fd;
	st_token none = {0};
	if ((rc = st_proto_connect(o->controller, o->token ? o->token : &none,
				   after_s(or_default(o->connect_timeout_s, 10)), &fd)) < 0)
		return rc;
	bound_silence(fd);
	if ((rc = st_proto_conn_init(&a.c, fd)) < 0)
		return rc;
	int wp[2] = {-1, -1}, port = 0;
	if ((rc = host_addr(&a, fd)) < 0 || (rc = st_auth_check_bind(o->token ? o->token : &none, a.addr)) < 0) {
		st_proto_conn_release(&a.c);
		return rc;
	}
	if ((port = free_port(&a)) <= 0) {
		rc = st_fail(ST_EINVAL, "agent: no port free on %s%s%s", a.addr, a.range[0] ? " in --port-range " : "",
			     a.range);
		goto early;
	}
	if (pipe2(wp, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = st_fail(ST_EIO, "agent: pipe: %s", strerror(errno));
		goto early;
	}
	got_term = got_int = 0;
	wake_fd = wp[1];
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART}, ign = {.sa_handler = SIG_IGN};
	struct sigaction old_term, old_int, old_chld, old_pipe;
	sigemptyset(&sa.sa_mask);
	sigemptyset(&ign.sa_mask);
	sigaction(SIGTERM, &sa, &old_term);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGCHLD, &sa, &old_chld);
	sigaction(SIGPIPE, &ign, &old_pipe);

	send_hello(&a, port);
	say(&a, 0, "%d device%s at %s, connected to %s", o->devices, o->devices == 1 ? "" : "s", a.addr,
	    o->controller);
	rc = serve(&a, wp[0]);
	char msg[512];
	snprintf(msg, sizeof(msg), "%s", st_errmsg());
	if (rc == ST_EPEER || rc == ST_EPROTO) { /* no more reports: the connection is gone */
		a.lost = 1;
		st_proto_conn_release(&a.c);
	}
	if (a.nw && rc != 0)
		say(&a, 1, "killing %zu worker(s)", a.nw);
	kill_all(&a, wp[0]);
	if (!a.lost && a.c.fd >= 0)
		st_proto_flush_until(&a.c, after_s(FINAL_FLUSH_S));
	st_proto_conn_release(&a.c);
	json_decref(a.layout);
	free(a.w);
	sigaction(SIGTERM, &old_term, NULL);
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGCHLD, &old_chld, NULL);
	sigaction(SIGPIPE, &old_pipe, NULL);
	wake_fd = -1;
	close(wp[0]);
	close(wp[1]);
	if (a.cfg_fd >= 0)
		close(a.cfg_fd);
	if (a.ufd >= 0)
		close(a.ufd);
	return rc < 0 ? st_fail(rc, "%s", msg) : 0;
early:
	st_proto_conn_release(&a.c);
	if (a.cfg_fd >= 0)
		close(a.cfg_fd);
	if (a.ufd >= 0)
		close(a.ufd);
	return rc;
}
