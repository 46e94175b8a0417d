/*
 * The elastic agent (`slicetrain agent`, src/elastic/agent.c) driven by a
 * fake controller played by this test over loopback TCP: hello's fields,
 * heartbeats, starting 2 ranks of a tiny real training (started with pids,
 * output lines forwarded and printed locally, exit status 0), stop
 * how=notice (exit 143), how=resize (SIGUSR1), kill of one rank (signal 9),
 * shutdown, a controller that closes its socket, malformed messages (bad
 * JSON, an unknown type, a huge line, a bad field), no welcome in time, a
 * SIGTERM to the agent (notice, workers stopped, exit 0), a SIGINT (workers
 * killed, exit 130), a SIGKILL of the agent (its workers die with it), bad
 * arguments (exit 2), an unreachable controller (exit 3). After each agent,
 * none of its workers' pids remains. Every wait is bounded; only pids this test started are
 * signalled.
 * The binary: $SLICETRAIN (set by tests/run.sh), else build/slicetrain.
 * timeout: 240
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "check.h"
#include "elastic/proto.h"
#include "free_port.h"

#define LONG_STEPS "steps=100000000"

static const char *bin, *root, *tmp;
static st_token tok; /* the agents get it as SLICETRAIN_TOKEN */

typedef struct ctl {
	int lfd, port;
	pid_t agent;
	int agent_status; /* after reaping; -1 before */
	st_proto_conn c;
	json_t *log;       /* messages received, not taken yet (no heartbeats, no output) */
	int heartbeats, outputs, closed;
	long long stepped_gen; /* generation of the last "completed step" line, -1 */
	char agent_out[512];
} ctl;

static double now_s(void) { return st_mono_s(); }

/* Start `slicetrain agent` against a new listener and accept its connection. */
/* Accept the agent's (next) connection on t->lfd: its token proof, and its
 * hello kept in t->log. 0, or -1 after a line on stderr. */
static int ctl_accept(ctl *t, const char *name)
{
	struct pollfd p = {.fd = t->lfd, .events = POLLIN};
	if (poll(&p, 1, 10000) <= 0) {
		fprintf(stderr, "%s: the agent did not connect\n", name);
		return -1;
	}
	int fd;
	t->closed = 0;
	if (st_proto_accept(t->lfd, &fd) != 1 || st_proto_conn_init_server(&t->c, fd, &tok) < 0)
		return -1;
	/* the agent's token proof, before its hello */
	json_t *m = NULL;
	int r = 0;
	for (int i = 0; i < 500 && t->c.auth && r == 0; i++) {
		struct pollfd q = {.fd = t->c.fd, .events = POLLIN};
		poll(&q, 1, 20);
		r = st_proto_recv(&t->c, &m);
	}
	if (t->c.auth || r < 0) {
		fprintf(stderr, "%s: the agent's token proof failed: %d %s\n", name, r, st_errmsg());
		return -1;
	}
	if (m) /* its hello came with the proof: keep it for the test */
		json_array_append_new(t->log, m);
	st_proto_flush_until(&t->c, st_mono_ns() + 2 * (int64_t)1000000000);
	return 0;
}

static int ctl_start(ctl *t, const char *name, const char *const *extra)
{
	*t = (ctl){.lfd = -1, .agent_status = -1, .c = ST_PROTO_CONN_INIT, .stepped_gen = -1};
	t->log = json_array();
	if (st_proto_listen("127.0.0.1", 0, &t->lfd, &t->port) < 0) {
		fprintf(stderr, "listen: %s\n", st_errmsg());
		return -1;
	}
	snprintf(t->agent_out, sizeof(t->agent_out), "%s/agent-%s.out", tmp, name);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", t->port);
	/* --controller-grace 0: an agent whose test is over exits once its
	 * connection closes (test_controller_returns gives its own) */
	const char *argv[32] = {bin, "agent", "--controller", addr, "--slice", "0", "--host", "0",
				"--hosts-per-slice", "1", "--devices", "2", "--controller-grace", "0"};
	int n = 14;
	for (int i = 0; extra && extra[i]; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	t->agent = fork();
	if (t->agent == 0) {
		int fd = open(t->agent_out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(bin, (char **)argv);
		_exit(127);
	}
	return ctl_accept(t, name);
}

/* Read what has arrived, waiting up to ms. */
static void pump(ctl *t, int ms)
{
	if (t->closed)
		return;
	struct pollfd p = {.fd = t->c.fd, .events = POLLIN};
	if (poll(&p, 1, ms) <= 0)
		return;
	json_t *m;
	int r;
	while ((r = st_proto_recv(&t->c, &m)) == 1) {
		const char *type = json_string_value(json_object_get(m, "type"));
		if (!strcmp(type, "heartbeat")) {
			t->heartbeats++;
			json_decref(m);
		} else if (!strcmp(type, "output")) {
			t->outputs++;
			const char *text = json_string_value(json_object_get(m, "text"));
			if (text && strstr(text, "completed step:"))
				t->stepped_gen = json_integer_value(json_object_get(m, "gen"));
			json_decref(m);
		} else {
			json_array_append_new(t->log, m);
		}
	}
	if (r < 0)
		t->closed = r;
}

/* The next message of this type (a new reference), or NULL after timeout_s. */
static json_t *take(ctl *t, const char *type, double timeout_s)
{
	double end = now_s() + timeout_s;
	for (;;) {
		size_t i;
		json_t *m;
		json_array_foreach(t->log, i, m) {
			if (!strcmp(json_string_value(json_object_get(m, "type")), type)) {
				json_incref(m);
				json_array_remove(t->log, i);
				return m;
			}
		}
		if (now_s() > end || t->closed)
			return NULL;
		pump(t, 20);
	}
}

/* The test controller's epoch: every message carries it, as a controller's does. */
#define EPOCH 4

static void send_msg(ctl *t, json_t *m)
{
	if (m && !json_object_get(m, "epoch"))
		json_object_set_new(m, "epoch", json_integer(EPOCH));
	CHECK(st_proto_send_new(&t->c, m) == 0);
	CHECK(st_proto_flush_until(&t->c, st_mono_ns() + 5 * (int64_t)1000000000) == 0);
}

/* An "exit" message of generation gen received and not taken yet (borrowed), or NULL. */
static json_t *exit_of(ctl *t, long long gen)
{
	size_t i;
	json_t *m;
	json_array_foreach(t->log, i, m) {
		if (!strcmp(json_string_value(json_object_get(m, "type")), "exit") &&
		    json_integer_value(json_object_get(m, "gen")) == gen)
			return m;
	}
	return NULL;
}

/* Wait for a "completed step" line of generation gen; stops early, saying
 * so, when a worker of gen exits first. */
static int wait_step(ctl *t, long long gen, double timeout_s)
{
	double end = now_s() + timeout_s;
	json_t *x = NULL;
	while (t->stepped_gen != gen && now_s() < end && !t->closed && !(x = exit_of(t, gen)))
		pump(t, 20);
	if (t->stepped_gen != gen && x)
		fprintf(stderr, "generation %lld: rank %lld exited (status %lld, signal %lld) before a step\n", gen,
			(long long)json_integer_value(json_object_get(x, "rank")),
			(long long)json_integer_value(json_object_get(x, "status")),
			(long long)json_integer_value(json_object_get(x, "signal")));
	return t->stepped_gen == gen;
}

/* The agent's exit status (waitpid's), or -1 (then it is SIGKILLed) after timeout_s.
 * Reads the connection meanwhile. */
static int wait_agent(ctl *t, double timeout_s)
{
	double end = now_s() + timeout_s;
	int st;
	while (now_s() < end) {
		pid_t r = waitpid(t->agent, &st, WNOHANG);
		if (r == t->agent) {
			t->agent_status = st;
			return st;
		}
		if (t->c.fd >= 0 && !t->closed)
			pump(t, 20);
		else
			usleep(20000);
	}
	fprintf(stderr, "the agent (pid %d) did not exit in %.0f s: SIGKILL\n", (int)t->agent, timeout_s);
	kill(t->agent, SIGKILL);
	waitpid(t->agent, &st, 0);
	t->agent_status = st;
	return -1;
}

static int exited_with(int st, int code) { return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == code; }

/* None of these pids is alive within timeout_s (they are not our children). */
static int pids_gone(const int *pids, int n, double timeout_s)
{
	double end = now_s() + timeout_s;
	for (;;) {
		int alive = 0;
		for (int i = 0; i < n; i++)
			if (pids[i] > 0 && kill(pids[i], 0) == 0) {
				char path[64], stat[256] = "";
				snprintf(path, sizeof(path), "/proc/%d/stat", pids[i]);
				FILE *f = fopen(path, "r");
				if (f) {
					if (!fgets(stat, sizeof(stat), f))
						stat[0] = 0;
					fclose(f);
				}
				const char *rp = strrchr(stat, ')');
				if (!(rp && rp[1] == ' ' && rp[2] == 'Z'))
					alive++;
			}
		if (!alive)
			return 1;
		if (now_s() > end)
			return 0;
		usleep(20000);
	}
}

/* How the connection ended (ST_EPEER when the agent closed it), reading
 * until then; 0 if it is still open after timeout_s. */
static int closed_within(ctl *t, double timeout_s)
{
	double end = now_s() + timeout_s;
	while (!t->closed && now_s() < end)
		pump(t, 20);
	return t->closed;
}

static void ctl_end(ctl *t)
{
	st_proto_conn_release(&t->c);
	t->closed = 1;
	if (t->agent > 0 && t->agent_status < 0)
		wait_agent(t, 20);
	if (t->lfd >= 0)
		close(t->lfd);
	json_decref(t->log);
	t->log = NULL;
	if (!check_failures) /* kept after a failure, for its reader */
		unlink(t->agent_out);
}

/* The welcome, naming a probe file in TMPDIR that holds nonce (the one
 * sent: want_nonce; another: the agent must find it unfit). */
static void send_welcome(ctl *t, const char *nonce, const char *want_nonce)
{
	char probe[600];
	snprintf(probe, sizeof(probe), "%s/probe-%d", tmp, t->port);
	FILE *f = fopen(probe, "w");
	CHECK(f && fputs(nonce, f) >= 0);
	if (f)
		fclose(f);
	send_msg(t, json_pack("{s:s,s:i,s:s,s:s,s:s,s:s}", "type", "welcome", "version", ST_PROTO_VERSION, "run_dir",
			      tmp, "probe", probe, "nonce", want_nonce, "beat", "00000000000000b1"));
}

static void welcome(ctl *t)
{
	json_t *h = take(t, "hello", 10);
	CHECK(h != NULL);
	json_decref(h);
	send_welcome(t, "5eed", "5eed");
	json_t *r = take(t, "ready", 10);
	CHECK(r != NULL);
	json_decref(r);
}

/* "start" of ranks 0 and 1 of a 1-slice, 2-device group. */
/* Start generation gen's 2 workers with steps ("steps=N") and extra
 * SLICETRAIN_ variables (NULL: none; taken). */
static void start_env(ctl *t, long long gen, const char *steps, json_t *extra)
{
	char coord[64], out[512], config[512], g[32];
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", free_port());
	snprintf(g, sizeof(g), "%lld", gen);
	snprintf(out, sizeof(out), "base_output_directory=%s/out", tmp);
	snprintf(config, sizeof(config), "%s/configs/base.yml", root);
	json_t *env = json_pack("{s:s,s:s,s:s,s:s}", "SLICETRAIN_WORLD_SIZE", "2", "SLICETRAIN_NUM_SLICES", "1",
				"SLICETRAIN_COORDINATOR", coord, "SLICETRAIN_GENERATION", g);
	if (extra)
		json_object_update(env, extra);
	json_decref(extra);
	/* data parallel: a group of one re-formed from it keeps its shard; the
	 * run's name pinned, as the real controller pins it (a group's workers
	 * refuse to derive one each) */
	json_t *args = json_pack("[s,s,s,s,s,s,s,s,s,s]", config, "model_name=llama3-test", steps, "per_device_batch_size=1",
				 "max_target_length=16", "enable_checkpointing=false", out, "ici_fsdp_parallelism=1",
				 "ici_data_parallelism=-1", "run_name=agent");
	send_msg(t, json_pack("{s:s,s:I,s:[i,i],s:o,s:o,s:i,s:[i]}", "type", "start", "gen", (json_int_t)gen, "ranks", 0,
			      1, "env", env, "args", args, "threads", 1, "slices", 0));
}

static void start(ctl *t, long long gen, const char *steps) { start_env(t, gen, steps, NULL); }

/* The "started" of gen: both ranks' pids into pids[rank]. */
static int started(ctl *t, long long gen, int pids[2])
{
	json_t *m = take(t, "started", 20);
	CHECK(m != NULL);
	if (!m)
		return 0;
	json_t *ws = json_object_get(m, "workers");
	CHECK(json_integer_value(json_object_get(m, "gen")) == gen);
	CHECK(json_array_size(ws) == 2);
	pids[0] = pids[1] = 0;
	for (size_t i = 0; i < json_array_size(ws) && i < 2; i++) {
		json_t *w = json_array_get(ws, i);
		long long r = json_integer_value(json_object_get(w, "rank"));
		if (r == 0 || r == 1)
			pids[r] = (int)json_integer_value(json_object_get(w, "pid"));
	}
	CHECK(pids[0] > 0 && pids[1] > 0 && pids[0] != pids[1]);
	json_decref(m);
	return pids[0] > 0 && pids[1] > 0;
}

/* Both exits of gen: status[rank], sig[rank]; checks their pids. */
static void exits(ctl *t, long long gen, const int pids[2], int status[2], int sig[2], double timeout_s)
{
	status[0] = status[1] = sig[0] = sig[1] = -100;
	for (int k = 0; k < 2; k++) {
		json_t *m = take(t, "exit", timeout_s);
		CHECK_MSG(m != NULL, "exit %d of generation %lld", k, gen);
		if (!m)
			return;
		long long r = json_integer_value(json_object_get(m, "rank"));
		CHECK(json_integer_value(json_object_get(m, "gen")) == gen);
		if (r == 0 || r == 1) {
			CHECK(json_integer_value(json_object_get(m, "pid")) == pids[r]);
			status[r] = (int)json_integer_value(json_object_get(m, "status"));
			sig[r] = (int)json_integer_value(json_object_get(m, "signal"));
		}
		json_decref(m);
	}
}

static int file_has(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char line[4096];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/* Start generation gen (a long run) and wait for its first step: 1 when it runs. */
static int running(ctl *t, long long gen, int pids[2])
{
	start(t, gen, LONG_STEPS);
	if (!started(t, gen, pids))
		return 0;
	int ok = wait_step(t, gen, 60);
	CHECK_MSG(ok, "generation %lld made no step", gen);
	return ok;
}

/* hello, heartbeats, a short run, notice, resize, kill, shutdown: one agent. */
static void test_lifecycle(void)
{
	ctl t;
	int pids[2], st[2], sig[2];
	/* the survivor is stopped on purpose below: the agent must not call it hung */
	if (ctl_start(&t, "lifecycle", (const char *[]){"--stopped-timeout-ms", "0", NULL}) < 0) {
		CHECK(0);
		ctl_end(&t);
		return;
	}
	json_t *h = take(&t, "hello", 10);
	CHECK(h != NULL);
	long long v;
	CHECK(st_proto_get_int(h, "version", ST_PROTO_VERSION, ST_PROTO_VERSION, &v) == 0);
	CHECK(st_proto_get_int(h, "slice", 0, 0, &v) == 0);
	CHECK(st_proto_get_int(h, "host", 0, 0, &v) == 0);
	CHECK(st_proto_get_int(h, "hosts_per_slice", 1, 1, &v) == 0);
	CHECK(st_proto_get_int(h, "devices", 2, 2, &v) == 0);
	CHECK(st_proto_get_int(h, "pid", t.agent, t.agent, &v) == 0);
	CHECK(st_proto_get_int(h, "port", 1, 65535, &v) == 0);
	const char *s;
	CHECK(st_proto_get_str(h, "addr", &s) == 0 && !strcmp(s, "127.0.0.1"));
	CHECK(st_proto_get_str(h, "build", &s) == 0 && strlen(s) == 16 && strspn(s, "0123456789abcdef") == 16);
	CHECK(st_proto_get_str(h, "release", &s) == 0 && *s);
	json_decref(h);
	send_welcome(&t, "5eed", "5eed");
	json_t *ready = take(&t, "ready", 10);
	CHECK(ready != NULL);
	json_decref(ready);
	double t0 = now_s();
	while (t.heartbeats < 3 && now_s() - t0 < 5)
		pump(&t, 50);
	CHECK_MSG(t.heartbeats >= 3, "%d heartbeats in 5 s", t.heartbeats);

	/* a short run: both ranks finish */
	start(&t, 1, "steps=3");
	if (started(&t, 1, pids)) {
		exits(&t, 1, pids, st, sig, 60);
		CHECK(st[0] == 0 && sig[0] == 0 && st[1] == 0 && sig[1] == 0);
		CHECK(t.stepped_gen == 1); /* rank 0's step lines came as "output" */
		CHECK(t.outputs >= 3);
		CHECK(file_has(t.agent_out, "[rank 0] completed step: 2"));
	}
	/* stop how=notice: SIGTERM, the workers stop after a step: 143 */
	if (running(&t, 2, pids)) {
		send_msg(&t, json_pack("{s:s,s:i,s:s}", "type", "stop", "gen", 2, "how", "notice"));
		exits(&t, 2, pids, st, sig, 30);
		CHECK_MSG(st[0] == 143 && st[1] == 143, "statuses %d %d", st[0], st[1]);
	}
	/* stop how=resize: SIGUSR1 reaches both (a worker saves and exits 138, or dies of it) */
	if (running(&t, 3, pids)) {
		send_msg(&t, json_pack("{s:s,s:i,s:s}", "type", "stop", "gen", 3, "how", "resize"));
		exits(&t, 3, pids, st, sig, 30);
		for (int r = 0; r < 2; r++)
			CHECK_MSG(st[r] == 138 || sig[r] == SIGUSR1, "rank %d: status %d signal %d", r, st[r], sig[r]);
	}
	/* kill one rank: signal 9; its peer waits for a re-formation (elastic/worker.h):
	 * "reform" makes it a group of one in generation 5, in the same process, whose
	 * step lines then come as generation 5's; stop how=kill ends it. The survivor
	 * is stopped until the reform is on its control channel, so that it often
	 * finds it at a step boundary, before its collectives see the failure: it
	 * must act on it then, as after a failure (the controller sends no other). */
	if (running(&t, 4, pids)) {
		kill(pids[0], SIGSTOP);
		send_msg(&t, json_pack("{s:s,s:i,s:i}", "type", "kill", "gen", 4, "rank", 1));
		send_msg(&t, json_pack("{s:s,s:i,s:i}", "type", "kill", "gen", 99, "rank", 1)); /* none: ignored */
		json_t *m = take(&t, "exit", 30);
		CHECK(m && json_integer_value(json_object_get(m, "rank")) == 1 &&
		      json_integer_value(json_object_get(m, "pid")) == pids[1] &&
		      json_integer_value(json_object_get(m, "signal")) == SIGKILL);
		json_decref(m);
		char coord[64];
		snprintf(coord, sizeof(coord), "127.0.0.1:%d", free_port());
		send_msg(&t, json_pack("{s:s,s:i,s:i,s:[{s:i,s:i}],s:{s:s,s:s,s:s,s:s}}", "type", "reform", "gen", 5, "from", 4,
				       "workers", "old", 0, "rank", 0, "env", "SLICETRAIN_WORLD_SIZE", "1",
				       "SLICETRAIN_NUM_SLICES", "1", "SLICETRAIN_COORDINATOR", coord, "SLICETRAIN_GENERATION", "5"));
		m = take(&t, "started", 20);
		json_t *w = m ? json_array_get(json_object_get(m, "workers"), 0) : NULL;
		CHECK_MSG(w && json_integer_value(json_object_get(m, "gen")) == 5 &&
			  json_array_size(json_object_get(m, "workers")) == 1 &&
			  json_integer_value(json_object_get(w, "rank")) == 0 &&
			  json_integer_value(json_object_get(w, "pid")) == pids[0], "reform: the survivor is rank 0 of generation 5");
		json_decref(m);
		kill(pids[0], SIGCONT);
		CHECK_MSG(wait_step(&t, 5, 60), "the re-formed group of one made no step");
		send_msg(&t, json_pack("{s:s,s:i,s:s}", "type", "stop", "gen", 5, "how", "kill"));
		m = take(&t, "exit", 30);
		CHECK(m && json_integer_value(json_object_get(m, "gen")) == 5 &&
		      json_integer_value(json_object_get(m, "pid")) == pids[0] &&
		      json_integer_value(json_object_get(m, "signal")) == SIGKILL);
		json_decref(m);
		/* a reform naming a worker that is gone: reported as an exit of the new generation (status 127) */
		send_msg(&t, json_pack("{s:s,s:i,s:i,s:[{s:i,s:i}],s:{s:s}}", "type", "reform", "gen", 6, "from", 5,
				       "workers", "old", 0, "rank", 0, "env", "SLICETRAIN_WORLD_SIZE", "1"));
		m = take(&t, "exit", 20);
		CHECK(m && json_integer_value(json_object_get(m, "gen")) == 6 &&
		      json_integer_value(json_object_get(m, "status")) == 127);
		json_decref(m);
		json_decref(take(&t, "started", 5));
		/* stale messages, replayed: a start of generation 4 and a reform into 5
		 * (this host is at 6) start nothing, answer nothing, and are logged */
		char coord2[64];
		snprintf(coord2, sizeof(coord2), "127.0.0.1:%d", free_port());
		send_msg(&t, json_pack("{s:s,s:i,s:[i],s:{s:s,s:s,s:s},s:[s],s:i}", "type", "start", "gen", 4, "ranks", 0,
				       "env", "SLICETRAIN_WORLD_SIZE", "1", "SLICETRAIN_NUM_SLICES", "1",
				       "SLICETRAIN_COORDINATOR", coord2, "args", "steps=1", "threads", 1));
		send_msg(&t, json_pack("{s:s,s:i,s:i,s:[{s:i,s:i}],s:{s:s}}", "type", "reform", "gen", 5, "from", 4,
				       "workers", "old", 0, "rank", 0, "env", "SLICETRAIN_WORLD_SIZE", "1"));
		m = take(&t, "started", 2);
		CHECK_MSG(!m, "a stale start or reform was answered");
		json_decref(m);
		CHECK(file_has(t.agent_out, "refused: a start of generation 4, older than generation 6"));
		CHECK(file_has(t.agent_out, "refused: a reform into generation 5, not newer than generation 6"));
	}
	/* shutdown with workers running: killed, reported, the agent exits 0;
	 * before it, orders of a deposed controller (an older epoch), replayed:
	 * a stop and a shutdown, which change nothing */
	if (running(&t, 7, pids)) {
		send_msg(&t, json_pack("{s:s,s:i,s:s,s:i}", "type", "stop", "gen", 7, "how", "kill", "epoch", EPOCH - 1));
		send_msg(&t, json_pack("{s:s,s:i}", "type", "shutdown", "epoch", EPOCH - 1));
		json_t *x = take(&t, "exit", 2);
		CHECK_MSG(!x && kill(pids[0], 0) == 0 && kill(pids[1], 0) == 0,
			  "an order of an older controller epoch was carried out");
		json_decref(x);
		CHECK(file_has(t.agent_out, "refused: a \"stop\" of controller epoch 3, not this host's controller's (epoch 4)"));
		CHECK(file_has(t.agent_out, "refused: a \"shutdown\" of controller epoch 3"));
		send_msg(&t, json_pack("{s:s}", "type", "shutdown"));
		exits(&t, 7, pids, st, sig, 20);
		CHECK(sig[0] == SIGKILL && sig[1] == SIGKILL);
		CHECK(exited_with(wait_agent(&t, 20), 0));
		CHECK(pids_gone(pids, 2, 0));
	}
	ctl_end(&t);
}

/* A new agent (args extra), welcomed, running generation gen (none if gen < 0).
 * 1 when all of that happened. */
static int setup(ctl *t, const char *name, const char *const *extra, long long gen, int pids[2])
{
	if (ctl_start(t, name, extra) < 0) {
		CHECK_MSG(0, "%s: no agent", name);
		return 0;
	}
	welcome(t);
	return gen < 0 || running(t, gen, pids);
}

static const char *const quiet[] = {"--quiet", NULL};

/* The controller goes away while workers run (default --controller-grace):
 * the agent keeps them and reconnects; its hello says what runs (the
 * generation, its layout, its workers). A welcome from an older controller
 * epoch is refused (it reconnects again); the newer one's is taken, its
 * orders carried out. */
static void test_controller_returns(void)
{
	ctl t;
	int pids[2] = {0, 0};
	if (!setup(&t, "returns", (const char *[]){"--quiet", "--controller-grace", "30", NULL}, 1, pids)) {
		ctl_end(&t);
		return;
	}
	st_proto_conn_release(&t.c);
	t.closed = 1;
	CHECK(kill(pids[0], 0) == 0 && kill(pids[1], 0) == 0);
	/* a controller of an older epoch answers first */
	if (ctl_accept(&t, "returns") == 0) {
		json_decref(take(&t, "hello", 10));
		send_msg(&t, json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:i}", "type", "welcome", "version", ST_PROTO_VERSION,
				       "run_dir", tmp, "probe", "/nonexistent", "nonce", "x", "beat", "00000000000000b1",
				       "epoch", EPOCH - 1));
		json_t *r = take(&t, "ready", 2);
		CHECK_MSG(!r, "the agent took a welcome of an older controller epoch");
		json_decref(r);
		st_proto_conn_release(&t.c);
		t.closed = 1;
	}
	CHECK(kill(pids[0], 0) == 0 && kill(pids[1], 0) == 0);
	if (ctl_accept(&t, "returns") == 0) {
		json_t *h = take(&t, "hello", 10), *run = json_object_get(h, "running");
		long long v;
		CHECK(st_proto_get_int(h, "epoch", EPOCH, EPOCH, &v) == 0);
		json_t *want = json_pack("[i]", 0);
		CHECK_MSG(run && st_proto_get_int(run, "gen", 1, 1, &v) == 0 && st_proto_get_int(run, "world", 2, 2, &v) == 0 &&
			  json_equal(json_object_get(run, "slices"), want) &&
			  json_array_size(json_object_get(run, "workers")) == 2, "hello's running: %s",
			  run ? json_dumps(run, JSON_COMPACT) : "(none)");
		json_decref(want);
		json_t *w0 = json_array_get(json_object_get(run, "workers"), 0);
		CHECK(w0 && json_integer_value(json_object_get(w0, "pid")) ==
				    pids[json_integer_value(json_object_get(w0, "rank"))]);
		json_decref(h);
		char probe[600];
		snprintf(probe, sizeof(probe), "%s/probe-%d", tmp, t.port);
		send_msg(&t, json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:i}", "type", "welcome", "version", ST_PROTO_VERSION,
				       "run_dir", tmp, "probe", probe, "nonce", "5eed", "beat", "00000000000000b2",
				       "epoch", EPOCH + 1));
		json_t *r = take(&t, "ready", 10);
		CHECK(r != NULL);
		json_decref(r);
		CHECK(file_has(t.agent_out, "refused: a welcome from controller epoch 3, older than epoch 4"));
		send_msg(&t, json_pack("{s:s,s:i,s:s,s:i}", "type", "stop", "gen", 1, "how", "kill", "epoch", EPOCH + 1));
		int st[2], sig[2];
		exits(&t, 1, pids, st, sig, 20);
		CHECK(sig[0] == SIGKILL && sig[1] == SIGKILL);
		send_msg(&t, json_pack("{s:s,s:i}", "type", "shutdown", "epoch", EPOCH + 1));
		CHECK(exited_with(wait_agent(&t, 20), 0));
	}
	ctl_end(&t);
}

/* The step watchdog: both workers' compute threads blocked by the hang
 * hook (their other threads go on) are found by their watchdogs, which
 * tell the agent; the agent kills them and reports each exit with why
 * "hung: stuck: ...". */
static void test_hung(void)
{
	ctl t;
	int pids[2], n = 0;
	char hang[600];
	snprintf(hang, sizeof(hang), "%s/agent-test-hang-%d", tmp, (int)getpid());
	unlink(hang);
	if (!setup(&t, "hung", NULL, -1, pids)) {
		ctl_end(&t);
		return;
	}
	start_env(&t, 1, LONG_STEPS, json_pack("{s:s,s:s,s:s}", "SLICETRAIN_STEP_WATCHDOG_MS", "200",
					       "SLICETRAIN_TEST_HANG_FILE", hang, "SLICETRAIN_MIN_STEP_SECONDS", "0.02"));
	if (started(&t, 1, pids) && wait_step(&t, 1, 60)) {
		for (int i = 0; i < 10; i++) /* a few measured steps: the watchdog arms */
			pump(&t, 20);
		int fd = open(hang, O_CREAT | O_WRONLY, 0600);
		CHECK(fd >= 0);
		close(fd);
		for (int r = 0; r < 2; r++) {
			json_t *m = take(&t, "exit", 20);
			const char *why = json_string_value(json_object_get(m, "why"));
			CHECK_MSG(m && why && !strncmp(why, "hung: stuck: no step progress", 29) &&
				  json_integer_value(json_object_get(m, "signal")) == SIGKILL,
				  "exit %d: why '%s'", r, why ? why : "(none)");
			n += m != NULL;
			json_decref(m);
		}
		CHECK(n == 2);
		CHECK(file_has(t.agent_out, "the compute thread is stuck: no step progress"));
	}
	unlink(hang);
	ctl_end(&t);
}

/* The controller goes away (closes) while workers run: with
 * --controller-grace 0 the agent stops them and exits 3. */
static void test_controller_closes(void)
{
	ctl t;
	int pids[2] = {0, 0};
	if (setup(&t, "closes", quiet, 1, pids)) {
		st_proto_conn_release(&t.c);
		int st = wait_agent(&t, 20);
		CHECK_MSG(exited_with(st, 3), "agent status 0x%x", st);
		CHECK(pids_gone(pids, 2, 0));
	}
	ctl_end(&t);
}

/* A message that breaks the protocol: the agent drops the connection, kills
 * its workers and exits 1. */
static void test_malformed(const char *name, const char *raw, size_t rawlen, int with_workers)
{
	ctl t;
	int pids[2] = {0, 0};
	if (!setup(&t, name, quiet, with_workers ? 1 : -1, pids)) {
		ctl_end(&t);
		return;
	}
	size_t off = 0;
	double end = now_s() + 10;
	while (off < rawlen && now_s() < end) { /* the agent may close before taking it all */
		ssize_t n = send(t.c.fd, raw + off, rawlen - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0)
			off += (size_t)n;
		else if (n < 0 && errno != EAGAIN && errno != EINTR)
			break;
		else
			pump(&t, 10);
	}
	int st = wait_agent(&t, 20);
	CHECK_MSG(exited_with(st, 1), "%s: agent status 0x%x", name, st);
	CHECK(pids_gone(pids, 2, 0));
	CHECK(closed_within(&t, 5) == ST_EPEER); /* closed from the agent's side */
	ctl_end(&t);
}

/* SIGTERM to the agent: notice, workers get SIGTERM and stop, the agent exits 0. */
static void test_agent_sigterm(void)
{
	ctl t;
	int pids[2] = {0, 0}, st[2], sig[2];
	if (setup(&t, "sigterm", (const char *[]){"--quiet", "--grace", "20", NULL}, 7, pids)) {
		kill(t.agent, SIGTERM);
		json_t *n = take(&t, "notice", 10);
		CHECK(n != NULL);
		long long s = 0;
		CHECK(n && st_proto_get_int(n, "signal", 15, 15, &s) == 0);
		json_decref(n);
		exits(&t, 7, pids, st, sig, 30);
		CHECK_MSG(st[0] == 143 && st[1] == 143, "statuses %d %d", st[0], st[1]);
		CHECK(exited_with(wait_agent(&t, 20), 0));
		CHECK(pids_gone(pids, 2, 0));
	}
	ctl_end(&t);
}

/* SIGINT to the agent: its workers are killed and reported, it exits 130. */
static void test_agent_sigint(void)
{
	ctl t;
	int pids[2] = {0, 0}, st[2], sig[2];
	if (setup(&t, "sigint", quiet, 3, pids)) {
		kill(t.agent, SIGINT);
		exits(&t, 3, pids, st, sig, 20);
		CHECK(sig[0] == SIGKILL && sig[1] == SIGKILL);
		CHECK(exited_with(wait_agent(&t, 20), 130));
		CHECK(pids_gone(pids, 2, 0));
	}
	ctl_end(&t);
}

/* SIGKILL of the agent: its workers die with it (PR_SET_PDEATHSIG). */
static void test_agent_sigkill(void)
{
	ctl t;
	int pids[2] = {0, 0};
	if (setup(&t, "sigkill", quiet, 1, pids)) {
		kill(t.agent, SIGKILL);
		int st = wait_agent(&t, 10);
		CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		CHECK(pids_gone(pids, 2, 5));
		CHECK(closed_within(&t, 5) == ST_EPEER);
	}
	ctl_end(&t);
}

/* No welcome: the agent gives up after --welcome-timeout. */
static void test_no_welcome(void)
{
	ctl t;
	if (ctl_start(&t, "nowelcome", (const char *[]){"--welcome-timeout", "1", NULL}) < 0) {
		CHECK(0);
		ctl_end(&t);
		return;
	}
	double t0 = now_s();
	int st = wait_agent(&t, 10);
	CHECK_MSG(exited_with(st, 3), "agent status 0x%x", st);
	CHECK(now_s() - t0 < 5);
	ctl_end(&t);
}

/* Refused by the controller (another build, say), or unable to read the
 * run directory's probe back: the agent stops with status 2 and says why. */
static void test_refused(void)
{
	ctl t;
	if (ctl_start(&t, "refused", NULL) < 0) {
		CHECK(0);
		ctl_end(&t);
		return;
	}
	json_t *h = take(&t, "hello", 10);
	CHECK(h != NULL);
	json_decref(h);
	send_msg(&t, json_pack("{s:s,s:s}", "type", "refused", "why", "another build, say"));
	int st = wait_agent(&t, 10);
	CHECK_MSG(exited_with(st, 2), "refused: agent status 0x%x", st);
	ctl_end(&t);

	if (ctl_start(&t, "unfit", NULL) < 0) {
		CHECK(0);
		ctl_end(&t);
		return;
	}
	h = take(&t, "hello", 10);
	CHECK(h != NULL);
	json_decref(h);
	send_welcome(&t, "another run's", "5eed");
	json_t *u = take(&t, "unfit", 10);
	const char *why = u ? json_string_value(json_object_get(u, "why")) : NULL;
	CHECK_MSG(why && strstr(why, "cannot see the run directory") && strstr(why, tmp), "%s", why ? why : "no unfit");
	json_decref(u);
	st = wait_agent(&t, 10);
	CHECK_MSG(exited_with(st, 2), "unfit: agent status 0x%x", st);
	ctl_end(&t);
}

/* Bad arguments: exit 2 with a message; nothing to connect to: exit 3. */
static void test_args(void)
{
	const char *cases[][14] = {
		{"agent", NULL},
		{"agent", "--controller", "nohostport", "--slice", "0", "--host", "0", "--hosts-per-slice", "1", "--devices", "1", NULL},
		{"agent", "--controller", "127.0.0.1:1", "--slice", "0", "--host", "1", "--hosts-per-slice", "1", "--devices", "1", NULL},
		{"agent", "--controller", "127.0.0.1:1", "--slice", "0", "--host", "0", "--hosts-per-slice", "1", "--devices", "0", NULL},
		{"agent", "--bogus", NULL},
		{"agent", "--controller", "127.0.0.1:1", "--slice", "0", "--host", "0", "--hosts-per-slice", "1", "--devices", "1", "--port-range", "9-3"},
		{"agent", "--controller", "127.0.0.1:1", "--slice", "0", "--host", "0", "--hosts-per-slice", "1", "--devices", "1", "--port-range"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *argv[16] = {bin};
		for (int k = 0; cases[i][k]; k++)
			argv[k + 1] = cases[i][k];
		pid_t p = fork();
		if (p == 0) {
			int fd = open("/dev/null", O_WRONLY);
			dup2(fd, 2);
			execv(bin, (char **)argv);
			_exit(127);
		}
		int st;
		waitpid(p, &st, 0);
		CHECK_MSG(exited_with(st, 2), "case %zu: status 0x%x", i, st);
	}
	/* a port nobody listens on */
	int port = free_port();
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	pid_t p = fork();
	if (p == 0) {
		execl(bin, bin, "agent", "--controller", addr, "--slice", "0", "--host", "0", "--hosts-per-slice", "1",
		      "--devices", "1", "--connect-timeout", "1", (char *)NULL);
		_exit(127);
	}
	int st;
	waitpid(p, &st, 0);
	CHECK_MSG(exited_with(st, 3), "unreachable controller: status 0x%x", st);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	bin = getenv("SLICETRAIN");
	if (!bin || !*bin)
		bin = "build/slicetrain";
	root = getenv("ST_ROOT");
	if (!root || !*root)
		root = ".";
	tmp = getenv("TMPDIR");
	if (!tmp || !*tmp)
		tmp = "/tmp";
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "no binary %s\n", bin);
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	setenv("SLICETRAIN_TOKEN", "a token for the agent tests, long enough", 1);
	unsetenv("SLICETRAIN_TOKEN_FILE");
	if (st_token_load(&tok) < 0 || !tok.set) {
		fprintf(stderr, "st_token_load: %s\n", st_errmsg());
		return 1;
	}
	test_args();
	test_no_welcome();
	test_refused();
	test_lifecycle();
	test_controller_closes();
	test_controller_returns();
	test_hung();
	static const char bad_json[] = "{\"type\":\"start\",\n";
	static const char unknown[] = "{\"type\":\"reboot\"}\n";
	static const char bad_field[] = "{\"type\":\"start\",\"gen\":1,\"ranks\":\"0\",\"args\":[]}\n";
	test_malformed("bad-json", bad_json, strlen(bad_json), 1);
	test_malformed("unknown-type", unknown, strlen(unknown), 1);
	test_malformed("bad-field", bad_field, strlen(bad_field), 0);
	size_t huge = 3 * (size_t)ST_PROTO_MAX_LINE;
	char *h = malloc(huge);
	memset(h, 'x', huge);
	h[0] = '{';
	test_malformed("huge-line", h, huge, 1);
	free(h);
	test_agent_sigterm();
	test_agent_sigint();
	test_agent_sigkill();
	return check_result();
}
