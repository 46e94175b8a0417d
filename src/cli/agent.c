#include "cli/cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/status.h"
#include "comm/net.h"
#include "elastic/agent.h"
#include "elastic/proto.h"

#define STOPPED_CLI_DEFAULT 1000

static const char agent_usage[] =
	"usage: slicetrain agent --controller HOST:PORT --slice S --host H --hosts-per-slice N\n"
	"                        --devices D [--threads-per-device T] [--grace SECONDS]\n"
	"                        [--connect-timeout SECONDS] [--welcome-timeout SECONDS] [--quiet]\n"
	"                        [--addr ADDRESS] [--port-range LO-HI] [--stopped-timeout-ms N]\n"
	"                        [--controller-grace SECONDS]\n"
	"\n"
	"The elastic agent of one host (docs/elastic.md): connects to the controller,\n"
	"says it is host H of slice S with D devices, then starts, stops and reports\n"
	"this host's worker processes (`slicetrain train ...`, one per device) as the\n"
	"controller says. Workers' lines are forwarded to the controller and printed\n"
	"here prefixed [rank R] (not with --quiet).\n"
	"\n"
	"  --threads-per-device T   OMP_NUM_THREADS when the controller gives none (default 1)\n"
	"  --grace SECONDS          after SIGTERM (preemption notice), the workers' time to\n"
	"                           save and exit before SIGKILL (default 30)\n"
	"  --connect-timeout S      keep trying to reach the controller this long (default 10)\n"
	"  --welcome-timeout S      the controller must answer hello within (default 10)\n"
	"  --addr ADDRESS           this host's address, which its workers bind and the\n"
	"                           others reach it at (default: the address this host\n"
	"                           reaches the controller from); not loopback needs the token\n"
	"  --port-range LO-HI       the ports this host's workers listen on (firewalls;\n"
	"                           default: any the kernel gives)\n"
	"  --stopped-timeout-ms N   a worker stopped this long (SIGSTOP, a debugger) is killed\n"
	"                           and reported hung: its slice is replaced (default 1000;\n"
	"                           0: never, e.g. to debug a worker)\n"
	"  --controller-grace S     the controller gone (its process, its host, the link):\n"
	"                           keep the workers training and reconnect for S seconds\n"
	"                           (default 60); a controller started meanwhile takes over\n"
	"                           what runs. 0: stop the workers at once\n"
	"\n"
	"The controller sends the run's resolved config: a host needs only this binary,\n"
	"the same build as the controller's (slicetrain version), and the run directory\n"
	"on shared storage (docs/hosts.md); a host without either is refused (exit 2).\n"
	"\n"
	"The run's token (docs/security.md) comes from SLICETRAIN_TOKEN_FILE or\n"
	"SLICETRAIN_TOKEN, and passes to the workers the same way. Workers run this\n"
	"binary, or SLICETRAIN_WORKER_EXE when set (the tests run a sanitized agent\n"
	"with optimized workers).\n"
	"\n"
	"Exit status: 0 the controller said shutdown, or SIGTERM and the workers stopped;\n"
	"3 the controller is unreachable or gone (past --controller-grace), 1 it broke\n"
	"the protocol, 2 bad arguments, 130 SIGINT. Workers never outlive the agent.\n";

int st_cmd_agent(int argc, char **argv)
{
	const char *controller = NULL, *addr = NULL, *range = NULL;
	int port_lo = 0, port_hi = 0, stopped_ms = STOPPED_CLI_DEFAULT;
	int slice = -1, host = -1, hps = 0, devices = 0, threads = 1, grace = 30, cto = 10, wto = 10, quiet = 0;
	int ctl_grace = 60;
	const st_cli_opt opts[] = {
		{.name = "--slice", .kind = ST_CLI_INT, .value = &slice, .min = 0, .max = 1 << 20},
		{.name = "--host", .kind = ST_CLI_INT, .value = &host, .min = 0, .max = 1 << 20},
		{.name = "--hosts-per-slice", .kind = ST_CLI_INT, .value = &hps, .min = 1, .max = 1 << 20},
		{.name = "--devices", .kind = ST_CLI_INT, .value = &devices, .min = 1, .max = ST_CLI_MAX_DEVICES},
		{.name = "--threads-per-device", .kind = ST_CLI_INT, .value = &threads, .min = 1, .max = ST_CLI_MAX_THREADS},
		{.name = "--grace", .kind = ST_CLI_INT, .value = &grace, .min = 1, .max = 86400},
		{.name = "--connect-timeout", .kind = ST_CLI_INT, .value = &cto, .min = 1, .max = 86400},
		{.name = "--welcome-timeout", .kind = ST_CLI_INT, .value = &wto, .min = 1, .max = 86400},
		{.name = "--quiet", .kind = ST_CLI_FLAG, .value = &quiet},
		{.name = "--stopped-timeout-ms", .kind = ST_CLI_INT, .value = &stopped_ms, .min = 0, .max = 86400000},
		{.name = "--controller-grace", .kind = ST_CLI_INT, .value = &ctl_grace, .min = 0, .max = 86400},
		{0},
	};
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (st_cli_is_help(a)) {
			fputs(agent_usage, stdout);
			return 0;
		}
		if (!strcmp(a, "--controller") || !strcmp(a, "--addr") || !strcmp(a, "--port-range")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "slicetrain: error: %s needs %s\n", a,
					a[2] == 'c' ? "HOST:PORT" : a[2] == 'a' ? "an address" : "LO-HI");
				return 2;
			}
			*(a[2] == 'c' ? &controller : a[2] == 'a' ? &addr : &range) = argv[++i];
			continue;
		}
		int rc = st_cli_option(opts, argc, argv, &i);
		if (rc == 0 && a[0] == '-')
			st_cli_unknown_option("agent", opts,
					      (const char *const[]){"--controller", "--addr", "--port-range", NULL}, a);
		else if (rc == 0)
			st_fail(ST_EINVAL, "'%s' is not an option of slicetrain agent (see slicetrain agent --help)", a);
		if (rc <= 0) {
			fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
			return 2;
		}
	}
	if (!controller || slice < 0 || host < 0 || hps < 1 || devices < 1) {
		fprintf(stderr, "slicetrain: error: agent needs --controller, --slice, --host, --hosts-per-slice and "
				"--devices (see slicetrain agent --help)\n");
		return 2;
	}
	char h[256];
	int port;
	if (st_proto_parse_addr(controller, h, sizeof(h), &port) < 0) {
		fprintf(stderr, "slicetrain agent: --controller: %s\n", st_errmsg());
		return 2;
	}
	if (range && st_port_range_parse(range, &port_lo, &port_hi) < 0) {
		fprintf(stderr, "slicetrain: error: --port-range '%s' is not LO-HI (ports 1-65535, LO <= HI)\n", range);
		return 2;
	}
	if (host >= hps) {
		fprintf(stderr, "slicetrain agent: --host %d is not below --hosts-per-slice %d\n", host, hps);
		return 2;
	}
	st_token tok;
	if (st_token_load(&tok) < 0) {
		fprintf(stderr, "slicetrain agent: %s\n", st_errmsg());
		return 2;
	}
	const char *exe = getenv("SLICETRAIN_WORKER_EXE");
	if (exe && *exe && access(exe, X_OK) != 0) {
		fprintf(stderr, "slicetrain agent: SLICETRAIN_WORKER_EXE '%s' is not an executable file\n", exe);
		return 2;
	}
	st_agent_opts o = {
		.token = &tok, .exe = exe && *exe ? exe : NULL,
		.controller = controller, .slice = slice, .host = host, .hosts_per_slice = hps,
		.devices = devices, .threads_per_device = threads, .grace_s = grace,
		.connect_timeout_s = cto, .welcome_timeout_s = wto, .quiet = quiet,
		.addr = addr, .port_lo = port_lo, .port_hi = port_hi, .stopped_ms = stopped_ms ? stopped_ms : -1,
		.controller_grace_s = ctl_grace,
	};
	int rc = st_agent_run(&o);
	if (rc == 0)
		return 0;
	fprintf(stderr, "slicetrain agent: error: %s\n", st_errmsg());
	return rc == ST_EINTR ? st_exit_signal(SIGINT) : st_exit_status(rc);
}
