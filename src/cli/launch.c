#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/status.h"
#include "comm/auth.h"
#include "elastic/controller.h"
#include "elastic/proto.h"

static const char launch_usage[] =
	"usage: slicetrain launch --num-slices S --devices-per-slice D [--threads-per-device T]\n"
	"                         [--port P] -- [CONFIG.yml] [key=value ...]\n"
	"       slicetrain launch --num-slices S --min-slices M --devices-per-slice D\n"
	"                         [--hosts-per-slice H] [--max-failures N] [--repair-delay S]\n"
	"                         [--kill SLICE@STEP[:DOWN_S]] [--preempt SLICE@STEP[:DOWN_S]]\n"
	"                         [--preemption-grace S] [--heartbeat-timeout-ms N] [--wait-timeout S]\n"
	"                         [--restart-from-checkpoint] [--backoff-window S] [--step-watchdog-ms N]\n"
	"                         [--straggler-steps N] [--evict-stragglers]\n"
	"                         [--threads-per-device T] [--port P] -- [CONFIG.yml] [key=value ...]\n"
	"\n"
	"Starts S x D training processes on this machine (one per device, slice-major\n"
	"ranks): shared memory inside a slice, TCP between slices. Rank 0's output is\n"
	"printed as is, other ranks' lines prefixed with [rank N]. Exits non-zero if any\n"
	"rank fails, after stopping the others.\n"
	"\n"
	"Elastic mode (with --min-slices, --max-failures, --kill or --preempt;\n"
	"docs/elastic.md): an elastic controller (listening on 127.0.0.1:P, printed at\n"
	"start; `slicetrain nodes --controller ADDR` shows it) and one `slicetrain agent`\n"
	"per host. The group is formed from whole healthy slices, between M and S of\n"
	"them; a failed slice is repaired after --repair-delay seconds (default 10) and\n"
	"the group grows back at a step boundary. A failure (a worker or agent dying)\n"
	"re-forms the group in place on the slices left (no new process, no checkpoint\n"
	"read, 0 steps lost) when only the DCN data axis changes, and a slice that\n"
	"returns is fed the state by a peer; otherwise, or with\n"
	"--restart-from-checkpoint, the group restarts from the newest checkpoint.\n"
	"More than --max-failures\n"
	"(default 3, -1 unlimited) ends the run with status 3. --kill / --preempt inject\n"
	"a SIGKILL of one worker / a preemption notice to SLICE once the group completed\n"
	"STEP (the slice is down DOWN_S seconds, default the repair delay). After a\n"
	"preemption notice, workers get --preemption-grace seconds (default 30) to save\n"
	"and exit before SIGKILL. Fewer than M healthy slices for --wait-timeout seconds\n"
	"(default 600, -1 forever) ends the run with status 3. A slice that fails again\n"
	"within --backoff-window seconds (default 30; 0: never) of returning is kept\n"
	"out twice as long each time (back-off, up to 64x), unless the group needs it to\n"
	"reach M. A worker whose compute thread makes no progress outside collectives\n"
	"for max(--step-watchdog-ms (default 1000; 0: off), 3 x its longest such gap of\n"
	"the last 16 steps) is killed as hung and its slice replaced (docs/failures.md).\n"
	"A host whose compute up to the gradient collective is 1.5 x the other hosts'\n"
	"median (and 50 ms more) for --straggler-steps steps in a row is reported slow\n"
	"(default 0, off, for launch: its slices share one machine; 5 for controller);\n"
	"with --evict-stragglers its slice is taken out as after a failure.\n"
	"Ends with the summary line {\"event\":\"summary\",...} on stdout.\n"
	"\n"
	"The config part (after \"--\") is loaded here first: bad input, or missing\n"
	"data, ends the launch before anything starts (exit 2). Every worker gets the\n"
	"run's one run_name (a derived one is made here, once).\n"
	"\n"
	"examples (2 slices of 1 device; the same, elastic, slice 1 preempted after step 10):\n"
	"  slicetrain launch --num-slices 2 --devices-per-slice 1 -- configs/base.yml model_name=llama3-test \\\n"
	"      steps=20 per_device_batch_size=4 max_target_length=256\n"
	"  slicetrain launch --num-slices 2 --min-slices 1 --devices-per-slice 1 --preempt 1@10:2 -- \\\n"
	"      configs/base.yml model_name=llama3-test steps=60 per_device_batch_size=4 max_target_length=256 \\\n"
	"      checkpoint_period=10\n";

typedef struct worker {
	pid_t pid;
	int out_fd, err_fd; /* read ends; -1 when closed */
	char obuf[4096], ebuf[4096];
	size_t olen, elen;
	int status, done;
} worker;

/*
 * The run token (comm/auth.h): the user's (SLICETRAIN_TOKEN_FILE or
 * SLICETRAIN_TOKEN), else one made here: 32 random bytes, hex, in a file of
 * a new private directory (mode 0700, the file 0600) under $XDG_RUNTIME_DIR
 * or $TMPDIR or /tmp, passed to every process we start as
 * SLICETRAIN_TOKEN_FILE and removed when the launcher ends. dir gets the
 * directory made ("" when the user gave the token).
 */
static int run_token(char *dir, size_t cap, st_token *tok)
{
	dir[0] = 0;
	const char *f = getenv("SLICETRAIN_TOKEN_FILE"), *t = getenv("SLICETRAIN_TOKEN");
	if ((!f || !*f) && (!t || !*t)) {
		const char *base = getenv("XDG_RUNTIME_DIR");
		if (!base || !*base || access(base, W_OK) != 0)
			base = getenv("TMPDIR");
		if (!base || !*base)
			base = "/tmp";
		uint8_t key[32];
		char hex[65], path[PATH_MAX + 8];
		if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
			return st_fail(ST_EIO, "cannot make a run token: getrandom: %s", strerror(errno));
		for (int i = 0; i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", key[i]);
		if (snprintf(dir, cap, "%s/slicetrain-run.XXXXXX", base) >= (int)cap || !mkdtemp(dir)) {
			dir[0] = 0;
			return st_fail(ST_EIO, "cannot make a private directory for the run token under %s: %s", base,
				       strerror(errno));
		}
		snprintf(path, sizeof(path), "%s/token", dir);
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 || write(fd, hex, 64) != 64 || close(fd) != 0) {
			int e = errno;
			if (fd >= 0)
				close(fd);
			return st_fail(ST_EIO, "cannot write the run token file %s: %s", path, strerror(e));
		}
		setenv("SLICETRAIN_TOKEN_FILE", path, 1);
	}
	return st_token_load(tok);
}

static void remove_token(const char *dir)
{
	if (!dir[0])
		return;
	char path[PATH_MAX + 8];
	snprintf(path, sizeof(path), "%s/token", dir);
	unlink(path);
	rmdir(dir);
}

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

/* A port free right now on loopback (the kernel picks it). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int port = -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void setenv_int(const char *k, long v)
{
	char b[32];
	snprintf(b, sizeof(b), "%ld", v);
	setenv(k, b, 1);
}

/* Print complete lines from buf; keep a partial last line. */
static void flush_lines(FILE *f, int rank, char *buf, size_t *len, int final)
{
	size_t start = 0;
	for (size_t i = 0; i < *len; i++) {
		if (buf[i] != '\n')
			continue;
		if (rank)
			fprintf(f, "[rank %d] ", rank);
		fwrite(buf + start, 1, i + 1 - start, f);
		start = i + 1;
	}
	if (final || (start == 0 && *len == 4096)) { /* no newline in a full buffer: print it */
		if (*len > start) {
			if (rank)
				fprintf(f, "[rank %d] ", rank);
			fwrite(buf + start, 1, *len - start, f);
			fputc('\n', f);
		}
		start = *len;
	}
	memmove(buf, buf + start, *len - start);
	*len -= start;
	fflush(f);
}

static void drain(worker *w, int rank, int which)
{
	int *fd = which ? &w->err_fd : &w->out_fd;
	char *buf = which ? w->ebuf : w->obuf;
	size_t *len = which ? &w->elen : &w->olen;
	FILE *f = which ? stderr : stdout;
	ssize_t n = read(*fd, buf + *len, 4096 - *len);
	if (n > 0) {
		*len += (size_t)n;
		flush_lines(f, rank, buf, len, 0);
	} else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
		flush_lines(f, rank, buf, len, 1);
		close(*fd);
		*fd = -1;
	}
}

/* fork() whose child dies with the launcher (PR_SET_PDEATHSIG), even when
 * the launcher died between the fork and the prctl. */
static pid_t fork_child(void)
{
	pid_t launcher = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != launcher)
			_exit(1);
	}
	return pid;
}

static pid_t spawn(int rank, int argc, char **argv, const char *exe, int *out_fd, int *err_fd,
		   int threads, int pin)
{
	int po[2], pe[2];
	if (pipe(po) < 0)
		return -1;
	if (pipe(pe) < 0) {
		close(po[0]);
		close(po[1]);
		return -1;
	}
	pid_t pid = fork_child();
	if (pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		close(po[0]);
		close(po[1]);
		close(pe[0]);
		close(pe[1]);
		setenv_int("SLICETRAIN_RANK", rank);
		setenv_int("OMP_NUM_THREADS", threads);
		if (pin) { /* enough cores: give each device its own */
			long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
			cpu_set_t set;
			CPU_ZERO(&set);
			for (int t = 0; t < threads; t++)
				CPU_SET((rank * threads + t) % ncpu, &set);
			sched_setaffinity(0, sizeof(set), &set);
		}
		char **args = calloc((size_t)argc + 3, sizeof(char *));
		if (!args)
			_exit(1);
		args[0] = (char *)"slicetrain";
		args[1] = (char *)"train";
		for (int i = 0; i < argc; i++)
			args[i + 2] = argv[i];
		execv(exe, args);
		fprintf(stderr, "slicetrain launch: cannot run %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	if (pid < 0) {
		close(po[0]);
		close(pe[0]);
		return -1;
	}
	*out_fd = po[0];
	*err_fd = pe[0];
	return pid;
}

static int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return st_exit_signal(WTERMSIG(status));
	return 1;
}

/* The launcher's status for a worker that failed on its own: a worker killed
 * by a signal (that the launcher did not send) is a peer failure of the group,
 * as its peers report it; whichever of them is reaped first, the launcher
 * exits with the same status. */
static int failure_code(int status)
{
	return WIFSIGNALED(status) ? st_exit_status(ST_EPEER) : exit_code(status);
}

/* SLICE@STEP[:DOWN_S] */
static int parse_fault(const char *v, st_ctl_fault *f)
{
	char *end;
	memset(f, 0, sizeof(*f));
	errno = 0;
	long s = strtol(v, &end, 10);
	if (end == v || *end != '@' || s < 0 || s > ST_CLI_MAX_SLICES)
		return -1;
	const char *p = end + 1;
	long long step = strtoll(p, &end, 10);
	if (end == p || step < 0 || errno)
		return -1;
	f->down_s = -1;
	if (*end == ':') {
		p = end + 1;
		double d = strtod(p, &end);
		if (end == p || !(d >= 0) || d > 86400)
			return -1;
		f->down_s = d;
	}
	if (*end)
		return -1;
	f->slice = (int)s;
	f->step = step;
	return 0;
}

/* ---- elastic mode: the controller in this process, one agent process per host ---- */

typedef struct agent_proc {
	pid_t pid; /* 0: not running */
	int slice, host;
} agent_proc;

static pid_t spawn_agent(const char *exe, const char *addr, const st_ctl_opts *o, int grace, int s, int h)
{
	char sa[16], ha[16], hp[16], da[16], ta[16], ga[16];
	snprintf(ga, sizeof(ga), "%d", grace);
	snprintf(sa, sizeof(sa), "%d", s);
	snprintf(ha, sizeof(ha), "%d", h);
	snprintf(hp, sizeof(hp), "%d", o->hosts_per_slice);
	snprintf(da, sizeof(da), "%d", o->devices_per_slice / o->hosts_per_slice);
	snprintf(ta, sizeof(ta), "%d", o->threads);
	pid_t pid = fork_child();
	if (pid == 0) {
		signal(SIGPIPE, SIG_DFL);
		char *args[] = {(char *)"slicetrain", (char *)"agent", (char *)"--controller", (char *)addr,
				(char *)"--slice", sa, (char *)"--host", ha, (char *)"--hosts-per-slice", hp,
				(char *)"--devices", da, (char *)"--threads-per-device", ta, (char *)"--grace", ga,
				(char *)"--quiet", (char *)"--controller-grace", (char *)"0", NULL};
		execv(exe, args);
		fprintf(stderr, "slicetrain launch: cannot run %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	return pid;
}

/* The launcher's last act: SIGKILL what is left of its processes (agents,
 * and workers orphaned to this process as their subreaper), reap them. */
static void kill_leftovers(agent_proc *ap, int na, st_ctl *ctl)
{
	enum { MAX_PIDS = 4096 }; /* the workers looked for (a buffer on the stack) */
	pid_t wp[MAX_PIDS];
	int nw = st_ctl_worker_pids(ctl, wp, MAX_PIDS);
	for (int a = 0; a < na; a++)
		if (ap[a].pid > 0)
			kill(ap[a].pid, SIGKILL);
	for (int k = 0; k < nw; k++) { /* only our own children: a pid not reused by someone else */
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)wp[k]);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		char *rp = strrchr(buf, ')');
		int ppid = 0;
		char st;
		if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == getpid())
			kill(wp[k], SIGKILL);
	}
	double until = st_mono_s() + 10;
	while (st_mono_s() < until) {
		pid_t p = waitpid(-1, NULL, WNOHANG);
		if (p < 0 && errno == ECHILD)
			break;
		if (p == 0)
			usleep(10000);
	}
}

/* The controller of co for the workers' config part argv (a keeps what co
 * points into). 0, or the exit status after one error line. */
static int make_ctl(st_ctl_opts *co, int argc, char **argv, st_cli_config_args *a, st_ctl **ctl)
{
	int rc = st_cli_config_args_parse(a, argc, argv, NULL, "launch", ST_CLI_LEADING);
	if (rc == 0) {
		co->config = a->config;
		co->config_path = a->path;
		co->nkv = a->nkv;
		co->kv = a->kv;
		rc = st_ctl_create(ctl, co);
	}
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		st_cli_config_args_release(a);
		return st_exit_status(rc);
	}
	return 0;
}

static int launch_elastic(st_ctl_opts *co, int grace, int argc, char **argv)
{
	st_cli_config_args a;
	st_ctl *ctl;
	int rc = make_ctl(co, argc, argv, &a, &ctl);
	if (rc)
		return rc;
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		fprintf(stderr, "slicetrain launch: cannot find my own binary: %s\n", strerror(errno));
		st_ctl_destroy(ctl);
		st_cli_config_args_release(&a);
		return 1;
	}
	exe[n] = 0;
	/* workers whose agent died are re-parented here, to be reaped and, at
	 * the end, killed: no orphan outlives the launcher */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "slicetrain launch: elastic controller at %s (slicetrain nodes --controller %s "
		"--token-file %s)\n", st_ctl_address(ctl), st_ctl_address(ctl), getenv("SLICETRAIN_TOKEN_FILE") ?
		getenv("SLICETRAIN_TOKEN_FILE") : "(SLICETRAIN_TOKEN)");
	int na = co->num_slices * co->hosts_per_slice;
	agent_proc *ap = calloc((size_t)na, sizeof(agent_proc));
	if (!ap) {
		st_ctl_destroy(ctl);
		st_cli_config_args_release(&a);
		return 1;
	}
	for (int k = 0; k < na; k++) {
		ap[k].slice = k / co->hosts_per_slice;
		ap[k].host = k % co->hosts_per_slice;
	}
	int status = 1;
	double end_by = 0;
	for (;;) {
		if (got_signal && !st_ctl_done(ctl, NULL))
			st_ctl_interrupt(ctl, got_signal);
		int done = st_ctl_done(ctl, &status);
		for (int k = 0; k < na && !done; k++)
			if (ap[k].pid == 0 && st_ctl_may_start_agent(ctl, ap[k].slice, ap[k].host)) {
				ap[k].pid = spawn_agent(exe, st_ctl_address(ctl), co, grace, ap[k].slice, ap[k].host);
				if (ap[k].pid < 0) {
					fprintf(stderr, "slicetrain launch: cannot start an agent: %s\n", strerror(errno));
					ap[k].pid = 0;
				}
			}
		if (st_ctl_poll(ctl, 50) < 0)
			fprintf(stderr, "slicetrain launch: %s\n", st_errmsg());
		int st;
		pid_t pid;
		while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
			for (int k = 0; k < na; k++)
				if (ap[k].pid == pid) {
					ap[k].pid = 0;
					if (!st_ctl_done(ctl, NULL))
						fprintf(stderr, "slicetrain launch: the agent of slice %d host %d exited (%s %d)\n",
							ap[k].slice, ap[k].host, WIFSIGNALED(st) ? "signal" : "status",
							WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
					st_ctl_agent_exited(ctl, ap[k].slice, ap[k].host);
				}
		if (!st_ctl_done(ctl, &status))
			continue;
		/* the run ended: the agents got "shutdown"; give them the grace, then SIGKILL */
		if (end_by == 0)
			end_by = st_mono_s() + 5;
		int left = 0;
		for (int k = 0; k < na; k++)
			left += ap[k].pid > 0;
		if (!left || st_mono_s() > end_by || (got_signal && st_mono_s() > end_by - 3))
			break;
	}
	kill_leftovers(ap, na, ctl);
	free(ap);
	st_ctl_destroy(ctl);
	st_cli_config_args_release(&a);
	return status;
}

static int launch_static(int slices, int dps, int threads, int port, int argc, char **argv);

/* A bad command line: one error line; exit 2. */
__attribute__((format(printf, 1, 2))) static int arg_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "slicetrain: error: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 2;
}

static int launch_run(st_ctl_opts *co, int grace, int slices, int dps, int threads, int port, int argc,
		      char **argv);

/* The options the loop below parses itself (for suggestions). */
static const char *const launch_extra[] = {"--kill", "--preempt", "--listen", "--help", NULL};

/* The command line of launch and controller, before "--". */
typedef struct eargs {
	int slices, dps, threads, port;
	int min_slices, hps, max_failures, repair, elastic, hb_ms, grace, wait_timeout, restart_only, backoff,
	    watchdog_ms, straggler_steps, evict;
	const char *listen; /* controller: --listen ADDR:PORT */
	st_ctl_fault faults[64];
	int nfaults;
} eargs;

/* Parse cmd's options up to "--" (*next: the first argument after it).
 * 0, 1 after printing usage (--help), or 2 after one error line. */
static int parse_eargs(int argc, char **argv, const char *cmd, const char *usage, eargs *e, int *next)
{
	*e = (eargs){.threads = 1, .hps = 1, .max_failures = 3, .repair = 10, .hb_ms = 1000, .grace = 30,
		     .wait_timeout = 600, .backoff = 30, .watchdog_ms = 1000};
	int ctl = !strcmp(cmd, "controller"), i;
	/* launch's slices share one machine: one slower than another is that machine's load */
	e->straggler_steps = ctl ? 5 : 0;
	const st_cli_opt opts[] = {
		{.name = "--num-slices", .kind = ST_CLI_INT, .value = &e->slices, .min = 1, .max = ST_CLI_MAX_SLICES},
		{.name = "--devices-per-slice", .kind = ST_CLI_INT, .value = &e->dps, .min = 1, .max = ST_CLI_MAX_DEVICES},
		{.name = "--threads-per-device", .kind = ST_CLI_INT, .value = &e->threads, .min = 1, .max = ST_CLI_MAX_THREADS},
		{.name = "--port", .kind = ST_CLI_INT, .value = &e->port, .min = 1, .max = 65535},
		{.name = "--min-slices", .kind = ST_CLI_INT, .value = &e->min_slices, .min = 1, .max = ST_CLI_MAX_SLICES},
		{.name = "--hosts-per-slice", .kind = ST_CLI_INT, .value = &e->hps, .min = 1, .max = ST_CLI_MAX_HOSTS},
		{.name = "--max-failures", .kind = ST_CLI_INT, .value = &e->max_failures, .min = -1, .max = 1 << 20},
		{.name = "--repair-delay", .kind = ST_CLI_INT, .value = &e->repair, .min = 0, .max = 86400},
		{.name = "--preemption-grace", .kind = ST_CLI_INT, .value = &e->grace, .min = 1, .max = 86400},
		{.name = "--heartbeat-timeout-ms", .kind = ST_CLI_INT, .value = &e->hb_ms, .min = 100, .max = 600000},
		{.name = "--wait-timeout", .kind = ST_CLI_INT, .value = &e->wait_timeout, .min = -1, .max = 1 << 20},
		{.name = "--restart-from-checkpoint", .kind = ST_CLI_FLAG, .value = &e->restart_only},
		{.name = "--backoff-window", .kind = ST_CLI_INT, .value = &e->backoff, .min = 0, .max = 86400},
		{.name = "--step-watchdog-ms", .kind = ST_CLI_INT, .value = &e->watchdog_ms, .min = 0, .max = 3600000},
		{.name = "--straggler-steps", .kind = ST_CLI_INT, .value = &e->straggler_steps, .min = 0, .max = 1 << 20},
		{.name = "--evict-stragglers", .kind = ST_CLI_FLAG, .value = &e->evict},
		{0},
	};
	/* the config part after "--" goes to the workers as is (plus the run's
	 * name): each one's `slicetrain train` parses and checks it too */
	for (i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--")) {
			i++;
			break;
		}
		if (st_cli_is_help(a)) {
			fputs(usage, stdout);
			return 1;
		}
		if (!strcmp(a, "--kill") || !strcmp(a, "--preempt")) {
			if (i + 1 >= argc || e->nfaults == 64 || parse_fault(argv[i + 1], &e->faults[e->nfaults]) < 0)
				return arg_error("%s needs SLICE@STEP[:DOWN_S] (at most 64 faults)", a);
			e->faults[e->nfaults++].kind = a[2] == 'k' ? ST_FAULT_KILL : ST_FAULT_PREEMPT;
			i++;
			e->elastic = 1;
			continue;
		}
		if (ctl && !strcmp(a, "--listen")) {
			if (i + 1 >= argc)
				return arg_error("--listen needs ADDRESS:PORT");
			e->listen = argv[++i];
			continue;
		}
		if (!strncmp(a, "--min-slices", 12) || !strncmp(a, "--max-failures", 14))
			e->elastic = 1;
		int rc = st_cli_option(opts, argc, argv, &i);
		if (rc == 0 && a[0] != '-')
			return arg_error("'%s' is not an option of slicetrain %s: the workers' CONFIG.yml and "
					 "key=value overrides come after '--' (slicetrain %s [options] -- [CONFIG.yml] "
					 "[key=value ...])", a, cmd, cmd);
		if (rc == 0) {
			st_cli_unknown_option(cmd, opts, launch_extra, a);
			return arg_error("%s", st_errmsg());
		}
		if (rc < 0)
			return arg_error("%s", st_errmsg());
	}
	*next = i;
	if (e->slices < 1 || e->dps < 1)
		return arg_error("%s needs --num-slices S and --devices-per-slice D (see slicetrain %s --help)", cmd, cmd);
	if (e->wait_timeout == 0)
		return arg_error("--wait-timeout is -1 (forever) or at least 1 second");
	if (e->watchdog_ms > 0 && e->watchdog_ms < 100)
		return arg_error("--step-watchdog-ms is 0 (no step watchdog) or at least 100");
	for (int f = 0; f < e->nfaults; f++)
		if (e->faults[f].slice >= e->slices)
			return arg_error("a fault names slice %d; the run has %d", e->faults[f].slice, e->slices);
	return 0;
}

static st_ctl_opts ctl_opts(const eargs *e)
{
	return (st_ctl_opts){.port = e->port, .num_slices = e->slices,
			     .min_slices = e->min_slices ? e->min_slices : e->slices, .hosts_per_slice = e->hps,
			     .devices_per_slice = e->dps, .threads = e->threads, .max_failures = e->max_failures,
			     .repair_delay = e->repair, .in_place = !e->restart_only,
			     .heartbeat_timeout_s = e->hb_ms / 1000.0, .stop_grace_s = e->grace,
			     .wait_timeout_s = e->wait_timeout, .faults = e->faults, .nfaults = e->nfaults,
			     .backoff_window_s = e->backoff ? e->backoff : -1, .step_watchdog_ms = e->watchdog_ms,
			     .straggler_steps = e->straggler_steps, .evict_stragglers = e->evict};
}

/* The config part: loaded once here, its data checked, the run's name
 * fixed for every worker (before anything is started or written). 0, or
 * the exit status after one error line. */
static int prepare_run(int argc, char **argv, st_cli_run *run)
{
	int rc = st_cli_launch_prepare(argc, argv, run);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return st_exit_status(rc);
	}
	return 0;
}

int st_cmd_launch(int argc, char **argv)
{
	eargs e;
	int i = 0, rc = parse_eargs(argc, argv, "launch", launch_usage, &e, &i);
	if (rc)
		return rc == 1 ? 0 : rc;
	st_cli_run run;
	if ((rc = prepare_run(argc - i, argv + i, &run)) != 0)
		return rc;
	st_ctl_opts co = ctl_opts(&e);
	rc = launch_run(e.elastic ? &co : NULL, e.grace, e.slices, e.dps, e.threads, e.port, run.argc, run.argv);
	st_cli_run_release(&run);
	return rc;
}

/* The run with its token (made here unless the user gave one): elastic
 * (co) or a static group. */
static int launch_run(st_ctl_opts *co, int grace, int slices, int dps, int threads, int port, int argc,
		      char **argv)
{
	st_token tok;
	char dir[PATH_MAX];
	int rc = run_token(dir, sizeof(dir), &tok);
	if (rc < 0) {
		fprintf(stderr, "slicetrain launch: %s\n", st_errmsg());
		rc = st_exit_status(rc);
	} else if (co) {
		co->token = &tok;
		rc = launch_elastic(co, grace, argc, argv);
	} else {
		rc = launch_static(slices, dps, threads, port, argc, argv);
	}
	remove_token(dir);
	return rc;
}

static int launch_static(int slices, int dps, int threads, int port, int argc, char **argv)
{
	int world = slices * dps;
	if (!port && (port = free_port()) < 0) {
		fprintf(stderr, "slicetrain launch: cannot find a free port: %s\n", strerror(errno));
		return 1;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		fprintf(stderr, "slicetrain launch: cannot find my own binary: %s\n", strerror(errno));
		return 1;
	}
	exe[n] = 0;
	char coord[64];
	snprintf(coord, sizeof(coord), "127.0.0.1:%d", port);
	setenv("SLICETRAIN_COORDINATOR", coord, 1);
	setenv_int("SLICETRAIN_WORLD_SIZE", world);
	setenv_int("SLICETRAIN_NUM_SLICES", slices);
	int pin = (long)world * threads <= sysconf(_SC_NPROCESSORS_ONLN);

	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	worker *w = calloc((size_t)world, sizeof(worker));
	if (!w)
		return 1;
	int rc = 0, started = 0;
	for (int r = 0; r < world; r++) {
		w[r].out_fd = w[r].err_fd = -1;
		w[r].pid = spawn(r, argc, argv, exe, &w[r].out_fd, &w[r].err_fd, threads, pin);
		if (w[r].pid < 0) {
			fprintf(stderr, "slicetrain launch: cannot start rank %d: %s\n", r, strerror(errno));
			rc = 1;
			break;
		}
		started++;
	}
	fprintf(stderr, "slicetrain launch: %d rank%s (%d slice%s x %d), %d thread%s each, coordinator %s\n",
		started, started == 1 ? "" : "s", slices, slices == 1 ? "" : "s", dps, threads,
		threads == 1 ? "" : "s", coord);

	int alive = started, first_fail = -1;
	double stop_at = 0; /* when SIGKILL follows SIGTERM */
	int stopping = rc != 0;
	if (stopping) {
		for (int r = 0; r < started; r++)
			kill(w[r].pid, SIGTERM);
		stop_at = st_mono_s() + 10;
	}
	struct pollfd *pfd = calloc((size_t)(2 * world), sizeof(struct pollfd));
	for (;;) {
		int np = 0;
		for (int r = 0; r < started; r++)
			for (int k = 0; k < 2; k++) {
				int fd = k ? w[r].err_fd : w[r].out_fd;
				if (fd >= 0)
					pfd[np++] = (struct pollfd){.fd = fd, .events = POLLIN};
			}
		if (alive == 0 && np == 0)
			break;
		int pr = poll(pfd, (nfds_t)np, 100);
		if (pr > 0) {
			for (int j = 0; j < np; j++) {
				if (!(pfd[j].revents & (POLLIN | POLLHUP | POLLERR)))
					continue;
				for (int r = 0; r < started; r++) {
					if (pfd[j].fd == w[r].out_fd)
						drain(&w[r], r, 0);
					else if (pfd[j].fd == w[r].err_fd)
						drain(&w[r], r, 1);
				}
			}
		}
		int st;
		pid_t pid;
		while (alive > 0 && (pid = waitpid(-1, &st, WNOHANG)) > 0) {
			for (int r = 0; r < started; r++) {
				if (w[r].pid != pid || w[r].done)
					continue;
				w[r].done = 1;
				w[r].status = st;
				alive--;
				if (exit_code(st) != 0 && first_fail < 0 && !stopping) {
					first_fail = r;
					if (WIFSIGNALED(st))
						fprintf(stderr, "slicetrain launch: rank %d was killed by signal %d; stopping the others\n",
							r, WTERMSIG(st));
					else
						fprintf(stderr, "slicetrain launch: rank %d exited with status %d; stopping the others\n",
							r, exit_code(st));
				}
			}
		}
		if ((first_fail >= 0 || got_signal) && !stopping) {
			stopping = 1;
			if (got_signal && first_fail < 0)
				fprintf(stderr, "slicetrain launch: signal %d: stopping the workers\n", (int)got_signal);
			for (int r = 0; r < started; r++)
				if (!w[r].done)
					kill(w[r].pid, SIGTERM);
			stop_at = st_mono_s() + 10;
		}
		if (stopping && alive > 0 && st_mono_s() > stop_at) {
			for (int r = 0; r < started; r++)
				if (!w[r].done)
					kill(w[r].pid, SIGKILL);
			stop_at = st_mono_s() + 1e9;
		}
	}
	free(pfd);
	if (rc == 0 && first_fail >= 0)
		rc = failure_code(w[first_fail].status);
	else if (rc == 0 && got_signal)
		rc = st_exit_signal(got_signal);
	else if (rc == 0)
		for (int r = 0; r < started; r++)
			if (exit_code(w[r].status) != 0) {
				rc = exit_code(w[r].status);
				break;
			}
	free(w);
	return rc;
}

/* ---- slicetrain controller: the controller alone, for agents on other hosts ---- */

static const char controller_usage[] =
	"usage: slicetrain controller --listen ADDRESS:PORT --num-slices S --devices-per-slice D\n"
	"                             [--min-slices M] [--hosts-per-slice H] [--max-failures N]\n"
	"                             [--repair-delay S] [--kill SLICE@STEP[:DOWN_S]] [--preempt ...]\n"
	"                             [--preemption-grace S] [--heartbeat-timeout-ms N] [--wait-timeout S]\n"
	"                             [--restart-from-checkpoint] [--backoff-window S]\n"
	"                             [--step-watchdog-ms N] [--straggler-steps N] [--evict-stragglers]\n"
	"                             [--threads-per-device T]\n"
	"                             -- [CONFIG.yml] [key=value ...]\n"
	"\n"
	"The elastic controller of a run on many hosts (docs/hosts.md), without agents of\n"
	"its own: each host runs `slicetrain agent --controller ADDRESS:PORT --slice S\n"
	"--host H --hosts-per-slice H --devices D/H`, started by systemd, Kubernetes, Slurm\n"
	"or by hand, before or after the controller. The options are launch's elastic ones\n"
	"(slicetrain launch --help). The config part is loaded and checked here; the\n"
	"resolved config goes to every host with each start, so a host needs only this\n"
	"binary (the same build: a host with another is refused) and the run directory,\n"
	"base_output_directory/run_name, on storage every host sees (one that does not\n"
	"see it is refused). PORT 0: any free port (printed).\n"
	"\n"
	"The run token (SLICETRAIN_TOKEN_FILE or SLICETRAIN_TOKEN; never an argument) is\n"
	"required to listen on anything but loopback; every agent, worker and\n"
	"`slicetrain nodes` proves it. Exit status as launch's: 0 the run finished, 2 bad\n"
	"input, 3 too many failures or too few slices for --wait-timeout, 128+N signal N.\n";

int st_cmd_controller(int argc, char **argv)
{
	eargs e;
	int i = 0, rc = parse_eargs(argc, argv, "controller", controller_usage, &e, &i);
	if (rc)
		return rc == 1 ? 0 : rc;
	char host[256];
	int port;
	if (!e.listen)
		return arg_error("controller needs --listen ADDRESS:PORT (the address agents reach it at)");
	size_t ln = strlen(e.listen);
	if (ln > 2 && !strcmp(e.listen + ln - 2, ":0")) { /* any port */
		int b = e.listen[0] == '[' && e.listen[ln - 3] == ']'; /* [v6]:0 */
		snprintf(host, sizeof(host), "%.*s", (int)ln - 2 - 2 * b, e.listen + b);
		port = 0;
	} else if (st_proto_parse_addr(e.listen, host, sizeof(host), &port) < 0) {
		return arg_error("--listen: %s", st_errmsg());
	}
	if (e.port)
		return arg_error("controller takes its port in --listen ADDRESS:PORT, not --port");
	st_token tok;
	if (st_token_load(&tok) < 0 || st_auth_check_bind(&tok, host) < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return 2;
	}
	st_cli_run run;
	if ((rc = prepare_run(argc - i, argv + i, &run)) != 0)
		return rc;
	st_ctl_opts co = ctl_opts(&e);
	co.listen_host = host;
	co.port = port;
	co.token = tok.set ? &tok : NULL;
	st_cli_config_args a;
	st_ctl *ctl;
	if ((rc = make_ctl(&co, run.argc, run.argv, &a, &ctl)) != 0) {
		st_cli_run_release(&run);
		return rc;
	}
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	fprintf(stderr, "slicetrain controller: listening on %s (slicetrain agent --controller %s ...; slicetrain "
		"nodes --controller %s)\n", st_ctl_address(ctl), st_ctl_address(ctl), st_ctl_address(ctl));
	int status = 1;
	double end_by = 0;
	for (;;) {
		if (got_signal && !st_ctl_done(ctl, NULL))
			st_ctl_interrupt(ctl, got_signal);
		if (st_ctl_poll(ctl, 100) < 0)
			fprintf(stderr, "slicetrain controller: %s\n", st_errmsg());
		if (!st_ctl_done(ctl, &status))
			continue;
		/* the run ended: the agents were told to shut down; let them go */
		if (end_by == 0)
			end_by = st_mono_s() + 5;
		if (st_ctl_agents(ctl) == 0 || st_mono_s() > end_by)
			break;
	}
	st_ctl_destroy(ctl);
	st_cli_config_args_release(&a);
	st_cli_run_release(&run);
	return status;
}
