/*
 * agent.h - the elastic agent: one per host. It connects to the controller
 * (proto.h), says which slice and host it is, and starts, signals and reaps
 * its host's worker processes (`slicetrain train ...`) when the controller
 * says so, reporting their pids, output lines and exits.
 * docs/elastic-protocol.md ("Agent") describes its behaviour.
 *
 * Never an orphan: workers die with the agent (PR_SET_PDEATHSIG SIGKILL),
 * and an agent that loses its controller (closed connection, a message that
 * breaks the protocol, no welcome in time) kills and reaps its workers and
 * returns an error. The agent installs handlers for SIGTERM, SIGINT, SIGCHLD
 * and ignores SIGPIPE while it runs (restored on return): it owns its
 * process's children.
 */
#ifndef ST_ELASTIC_AGENT_H
#define ST_ELASTIC_AGENT_H

struct st_token;
typedef struct st_agent_opts {
	const char *controller;   /* "host:port" of the controller */
	const struct st_token *token; /* the run token (comm/auth.h); NULL: none */
	int slice;                /* this host's slice (>= 0) */
	int host;                 /* this host's index in its slice, < hosts_per_slice */
	int hosts_per_slice;      /* >= 1 */
	int devices;              /* devices (worker processes) on this host, >= 1 */
	int threads_per_device;   /* OMP_NUM_THREADS of a "start" that gives no "threads"; 0: 1 */
	double connect_timeout_s; /* keep trying to connect this long; 0: 10 */
	double welcome_timeout_s; /* the controller's welcome must come within; 0: 10 */
	double grace_s;           /* after SIGTERM, the workers' time to save and exit before
	                             SIGKILL; 0: 30 */
	const char *exe;          /* the binary workers run as `EXE train ARGS`; NULL: /proc/self/exe */
	int quiet;                /* do not print the workers' lines locally (they are still
	                             forwarded to the controller) */
	const char *addr;         /* the address this host's processes bind (numeric); NULL:
	                             the one this host reaches the controller from */
	int port_lo, port_hi;     /* the ports they listen on (firewalls); 0: any */
	int stopped_ms;           /* a worker stopped (SIGSTOP, a debugger) this long is killed
	                             and reported hung; 0: 1000, < 0: never */
	double controller_grace_s; /* the controller gone: keep the workers and reconnect this
	                             long (its hello says what runs); 0: stop at once */
} st_agent_opts;

/*
 * On connecting it says hello with its address, a port free there (again
 * in each heartbeat: the coordinator's when this host holds rank 0) and
 * its workers' build; the controller refuses a host whose build differs,
 * and one that cannot read back the probe file the welcome names in the
 * run directory (ST_EINVAL, the reason in the message).
 * Run the agent until the controller says "shutdown" (0), the agent got
 * SIGTERM and its workers have exited or were killed after the grace period
 * (0), or it stops on an error after killing and reaping its workers:
 * ST_EINVAL bad options, ST_EPEER the controller could not be reached or
 * went away (or sent no welcome in time; with controller_grace_s, not back
 * within it), ST_EPROTO the controller broke the
 * protocol, ST_EINTR SIGINT, ST_ENOMEM / ST_EIO. Errors carry a message.
 */
int st_agent_run(const st_agent_opts *o);

#endif
