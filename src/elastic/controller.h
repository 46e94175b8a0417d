/*
 * controller.h - the elastic controller: one per run. It listens for agents
 * (elastic/proto.h), tracks slices, forms a worker group from whole healthy
 * slices, starts, stops and resizes generations of that group, and accounts
 * for failures, preemptions and lost steps (docs/elastic.md).
 *
 * One poll loop, no threads: the caller (slicetrain launch) calls
 * st_ctl_poll until st_ctl_done says the run ended. The state machine, in
 * the spirit of Ray Train v2, logs one line per transition on stderr:
 *   [State Transition] RUNNING -> RESTARTING. (worker rank 3 of slice 1 was killed by signal 9)
 *
 *   INITIALIZING  waiting for the agents of at least --min-slices slices
 *   SCHEDULING    choosing the group (largest slice count the mesh resolves
 *                 for) and starting a generation
 *   RUNNING       a generation trains
 *   RESTARTING    a failure: the generation is being stopped (survivors exit
 *                 3 by themselves; stop how=kill after the grace period)
 *   RESIZING      a grow (stop how=resize: save at the step boundary, exit
 *                 138) or a preemption (exit 143 after saving)
 *   FINISHED      every worker exited 0 after the last step (exit 0)
 *   ERRORED       too many failures (exit 3), fewer than --min-slices
 *                 healthy for --wait-timeout seconds (3), bad input (2), a
 *                 signal to the launcher (128+N)
 *
 * Library code: errors come back as ST_E* codes with a message.
 */
#ifndef ST_ELASTIC_CONTROLLER_H
#define ST_ELASTIC_CONTROLLER_H

#include <stdint.h>
#include <sys/types.h>

enum { ST_FAULT_KILL = 1, ST_FAULT_PREEMPT = 2 };

/* --kill / --preempt SLICE@STEP[:DOWN_S]: at the first completed step >=
 * STEP of a generation holding SLICE (a slice out of the group: once it is
 * back). down_s < 0: the repair delay. */
typedef struct st_ctl_fault {
	int kind, slice;
	int64_t step;
	double down_s;
	int done;
} st_ctl_fault;

typedef struct st_ctl_opts {
	const char *listen_host; /* IPv4 address; NULL: 127.0.0.1 (beyond loopback only with a token) */
	const struct st_token *token; /* the run token every connection proves (copied); NULL: none */
	int port;                /* 0: any free port */
	int num_slices, min_slices, hosts_per_slice, devices_per_slice, threads;
	int max_failures;        /* -1: unlimited */
	double repair_delay;     /* s */
	double backoff_window_s; /* a slice failing within this of its return is kept out
	                            twice as long each time (up to 64x); 0: 30, < 0: never */
	int in_place;            /* re-form in place where the mesh allows (worker.h); 0: always
	                            restart the group from the newest checkpoint */
	double grace_s;          /* stop how=kill this long after a failure (default 5) */
	double stop_grace_s;     /* ... and this long after a resize or a preemption notice
	                            when workers still run (default 30) */
	double heartbeat_timeout_s; /* an agent silent this long is lost (default 1) */
	int step_watchdog_ms;    /* the workers' step watchdog's floor (train/watchdog.h); 0: none */
	int straggler_steps;     /* a host 1.5 x the group's median compute this many steps in a row
	                            is slow (reported); 0: not looked for */
	int evict_stragglers;    /* ... and its slice is taken out, as after a failure */
	double wait_timeout_s;   /* fewer than min_slices healthy this long ends the run
	                            with status 3 (0: default 600; < 0: wait forever) */
	const char *config;      /* CONFIG.yml as the workers get it (NULL: none) */
	const char *config_path; /* the file to load here (config, or the default one) */
	int nkv;
	char **kv;               /* key=value overrides, as the workers get them */
	const st_ctl_fault *faults;
	int nfaults;
} st_ctl_opts;

typedef struct st_ctl st_ctl;

/* Agents connected now (those that said hello, ready or not). */
int st_ctl_agents(const st_ctl *c);

/* Load the config as the workers will, check that the mesh resolves for
 * --num-slices, listen. ST_EINVAL (bad input), ST_EIO (cannot listen). */
int st_ctl_create(st_ctl **out, const st_ctl_opts *o);
void st_ctl_destroy(st_ctl *c);
/* "HOST:PORT" the controller listens on. */
const char *st_ctl_address(const st_ctl *c);

/* One round: wait at most timeout_ms for messages, handle them, advance the
 * state machine. 0, or <0 on an internal error (the run is then errored). */
int st_ctl_poll(st_ctl *c, int timeout_ms);
/* 1 when the run ended (*exit_status: 0, 2, 3 or 128+N), else 0. */
int st_ctl_done(const st_ctl *c, int *exit_status);
/* The launcher got signal sig: stop everything, end with 128+sig. */
void st_ctl_interrupt(st_ctl *c, int sig);

/* For the process that runs the agents (one machine): may the agent of
 * (slice, host) be started now (its slice's repair delay is over and the
 * run goes on; a slice in back-off has its agents, the controller decides
 * when the group takes it)? */
int st_ctl_may_start_agent(const st_ctl *c, int slice, int host);
/* The agent process of (slice, host) ended: lose it now if still connected. */
void st_ctl_agent_exited(st_ctl *c, int slice, int host);
/* Worker pids the controller heard of (for a last SIGKILL sweep of
 * orphans): up to cap written, the count returned. */
int st_ctl_worker_pids(const st_ctl *c, pid_t *pids, int cap);

#endif
