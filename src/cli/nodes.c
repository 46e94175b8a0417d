/*
 * nodes.c - slicetrain nodes --controller HOST:PORT: the live picture of an
 * elastic run, like `ray list nodes`: asks the controller for its status
 * (elastic/proto.h) and prints the run's state, the group's mesh and step,
 * and one line per slice and host.
 */
#include "cli/cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/clock.h"
#include "base/err.h"
#include "elastic/proto.h"

static const char nodes_usage[] =
	"usage: slicetrain nodes --controller HOST:PORT [--token-file PATH] [--json]\n"
	"\n"
	"Asks an elastic run's controller (its address is printed by `slicetrain launch`\n"
	"at start) for the live picture: the run's state, the generation, the group's\n"
	"mesh and last completed step, then per slice its state (in group, healthy,\n"
	"down, missing hosts) and since when, and per host the agent's pid, its last\n"
	"heartbeat and its workers. --json prints the controller's answer as is.\n"
	"\n"
	"The controller asks for the run's token (docs/security.md): from --token-file\n"
	"PATH (`slicetrain launch` prints the path of the file it made, which it removes\n"
	"when the run ends), else from SLICETRAIN_TOKEN_FILE or SLICETRAIN_TOKEN.\n"
	"\n"
	"Exit status: 0 done, 1 the controller refused the token or did not answer,\n"
	"2 bad arguments (a token file that cannot be read included).\n"
	"\n"
	"example (ADDR and PATH: what `slicetrain launch` printed):\n"
	"  slicetrain nodes --controller ADDR --token-file PATH\n";

static void fmt_time(double t, char *buf, size_t n)
{
	if (t <= 0) {
		snprintf(buf, n, "-");
		return;
	}
	time_t s = (time_t)t;
	struct tm tm;
	gmtime_r(&s, &tm);
	strftime(buf, n, "%H:%M:%S", &tm);
}

static double num(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static void print_status(const json_t *st)
{
	char since[32], hb[32];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
	fmt_time(num(st, "since"), since, sizeof(since));
	const char *mesh = json_string_value(json_object_get(st, "mesh"));
	char step[32] = "-";
	if (num(st, "step") >= 0)
		snprintf(step, sizeof(step), "%lld", (long long)num(st, "step"));
	printf("state %s since %s UTC; controller epoch %lld; generation %lld; step %s; failures %lld, preemptions "
	       "%lld, resizes %lld, steps lost %lld\n",
	       json_string_value(json_object_get(st, "state")), since, (long long)num(st, "epoch"), (long long)num(st, "gen"),
	       step,
	       (long long)num(st, "failures"), (long long)num(st, "preemptions"),
	       (long long)num(st, "resizes"), (long long)num(st, "steps_lost"));
	printf("mesh: %s\n", mesh && *mesh ? mesh : "(no group running)");
	printf("%-6s %-14s %-10s %-5s %-15s %-8s %-15s %s\n", "SLICE", "STATE", "SINCE", "HOST", "ADDRESS", "AGENT",
	       "HEARTBEAT", "WORKERS (rank:pid)");
	size_t i, j, k;
	json_t *s, *h, *w;
	json_array_foreach(json_object_get(st, "slices"), i, s) {
		fmt_time(num(s, "since"), since, sizeof(since));
		json_t *hosts = json_object_get(s, "hosts");
		json_array_foreach(hosts, j, h) {
			double last = num(h, "last_heartbeat");
			if (json_is_true(json_object_get(h, "connected")) && last > 0)
				snprintf(hb, sizeof(hb), "%.1f s ago", now - last > 0 ? now - last : 0);
			else
				snprintf(hb, sizeof(hb), "-");
			char ws[512] = "";
			size_t len = 0;
			json_array_foreach(json_object_get(h, "workers"), k, w) {
				if (len + 40 < sizeof(ws))
					len += (size_t)snprintf(ws + len, sizeof(ws) - len, "%s%lld:%lld%s", len ? " " : "",
								(long long)num(w, "rank"), (long long)num(w, "pid"),
								json_is_true(json_object_get(w, "running")) ? "" : "(exited)");
			}
			char pid[24] = "-";
			if (num(h, "pid") > 0)
				snprintf(pid, sizeof(pid), "%lld", (long long)num(h, "pid"));
			const char *addr = json_string_value(json_object_get(h, "addr"));
			printf("%-6lld %-14s %-10s %-5lld %-15s %-8s %-15s %s\n", (long long)num(s, "slice"),
			       j ? "" : json_string_value(json_object_get(s, "state")), j ? "" : since,
			       (long long)num(h, "host"), addr && *addr ? addr : "-", pid, hb, ws);
			if (json_is_true(json_object_get(h, "slow")) && num(h, "compute_s") >= 0)
				printf("       host %lld is slow: compute %.3f s a step, 1.5 x the group's median or more\n",
				       (long long)num(h, "host"), num(h, "compute_s"));
			else if (json_is_true(json_object_get(h, "slow")))
				printf("       host %lld is slow (out of the group)\n", (long long)num(h, "host"));
		}
		const char *why = json_string_value(json_object_get(s, "why"));
		if (why)
			printf("       down until %s UTC: %s\n", (fmt_time(num(s, "down_until"), since, sizeof(since)), since),
			       why);
	}
}

/* A bad command line: one error line; exit 2. */
static int arg_error(const char *msg)
{
	fprintf(stderr, "slicetrain: error: %s\n", msg);
	return 2;
}

/* The run's token: --token-file PATH, else the environment's. */
static int load_token(st_token *tok, const char *token_file)
{
	if (!token_file)
		return st_token_load(tok);
	int rc = st_token_load_file(tok, token_file, "--token-file");
	if (rc < 0 && *token_file && access(token_file, F_OK) != 0) {
		char msg[600];
		snprintf(msg, sizeof(msg), "%s", st_errmsg());
		return st_fail(rc, "%s (the token file slicetrain launch makes is removed when its run ends)", msg);
	}
	return rc;
}

/* The controller refused our proof of the token: say which token was
 * offered, and how to give the run's. */
static int refused(const st_token *tok, const char *token_file)
{
	char msg[600];
	snprintf(msg, sizeof(msg), "%s", st_errmsg());
	if (!tok->set)
		return st_fail(ST_EAUTH, "%s: this process has no token: give the run's with --token-file PATH (`slicetrain "
			       "launch` prints `slicetrain nodes --controller ADDR --token-file PATH` at start)", msg);
	return st_fail(ST_EAUTH, "%s: the token of %s%s%s is not this run's: give the run's with --token-file PATH "
		       "(`slicetrain launch` prints the path at start)", msg, tok->source, token_file ? " " : "",
		       token_file ? token_file : "");
}

int st_cmd_nodes(int argc, char **argv)
{
	const char *addr = NULL, *token_file = NULL;
	int as_json = 0;
	const st_cli_opt opts[] = {
		{.name = "--controller", .kind = ST_CLI_STRING, .value = &addr, .joined = 1},
		{.name = "--token-file", .kind = ST_CLI_STRING, .value = &token_file, .joined = 1},
		{.name = "--json", .kind = ST_CLI_FLAG, .value = &as_json},
		{0},
	};
	for (int i = 0; i < argc; i++) {
		if (st_cli_is_help(argv[i])) {
			fputs(nodes_usage, stdout);
			return 0;
		}
		int rc = st_cli_option(opts, argc, argv, &i);
		if (rc < 0)
			return arg_error(st_errmsg());
		if (rc > 0)
			continue;
		if (argv[i][0] == '-') {
			st_cli_unknown_option("nodes", opts, NULL, argv[i]);
			return arg_error(st_errmsg());
		}
		st_fail(ST_EINVAL, "'%s' is not an option of slicetrain nodes (the address goes with --controller: "
			"slicetrain nodes --controller HOST:PORT --token-file PATH)", argv[i]);
		return arg_error(st_errmsg());
	}
	if (!addr || !*addr)
		return arg_error("nodes needs --controller HOST:PORT (the address `slicetrain launch` prints at start; "
				 "see slicetrain nodes --help)");
	int fd = -1, rc;
	st_token tok;
	if ((rc = load_token(&tok, token_file)) < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return st_exit_status(rc);
	}
	if ((rc = st_proto_connect(addr, &tok, st_mono_ns() + 5 * (int64_t)1000000000, &fd)) < 0) {
		if (rc == ST_EAUTH)
			refused(&tok, token_file);
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return rc == ST_EINVAL ? 2 : 1;
	}
	st_proto_conn c = ST_PROTO_CONN_INIT;
	if ((rc = st_proto_conn_init(&c, fd)) < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return 1;
	}
	json_t *req = json_pack("{s:s}", "type", "status"), *ans = NULL;
	rc = req ? st_proto_send(&c, req) : st_fail(ST_ENOMEM, "out of memory");
	json_decref(req);
	double deadline = st_mono_s() + 5;
	while (rc >= 0 && !ans) {
		struct pollfd p = {.fd = c.fd, .events = POLLIN | (c.wlen ? POLLOUT : 0)};
		double left = deadline - st_mono_s();
		if (left <= 0) {
			rc = st_fail(ST_EPEER, "no answer from the controller at %s within 5 s", addr);
			break;
		}
		if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR) {
			rc = st_fail(ST_EIO, "poll: %s", strerror(errno));
			break;
		}
		if (c.wlen && (rc = st_proto_flush(&c)) < 0)
			break;
		rc = st_proto_recv(&c, &ans);
		if (rc == ST_EPEER)
			rc = st_fail(ST_EPEER, "the controller at %s closed the connection", addr);
	}
	st_proto_conn_release(&c);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		json_decref(ans);
		return 1;
	}
	if (as_json) {
		char *s = json_dumps(ans, JSON_COMPACT);
		if (s)
			printf("%s\n", s);
		free(s);
	} else {
		print_status(ans);
	}
	json_decref(ans);
	return 0;
}
