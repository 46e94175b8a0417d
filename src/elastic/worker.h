/*
 * worker.h - a worker's side of the elastic agent: the control channel over
 * which the agent tells a running worker to re-form its group in place
 * (no new process, no checkpoint read; docs/elastic.md, "Re-forming in
 * place").
 *
 * The agent starts each worker with SLICETRAIN_CONTROL_FD=N, one end of a
 * socketpair. Messages are the protocol's lines (elastic/proto.h):
 *   agent -> worker  {"type":"reform","gen":G,"env":{"SLICETRAIN_RANK":"R",...}}
 *                    join generation G's group with this environment (the
 *                    group variables of comm/env.c: rank, world size,
 *                    coordinator, slices) at once when the worker's group
 *                    failed, else at the next step boundary the group agrees on
 *   worker -> agent  {"type":"reformed","gen":G}   done: what it prints from now
 *                    on is generation G's
 *                    {"type":"step","step":N,"compute_s":X}   step N done: its compute
 *                    up to the gradient collective took X s (the controller finds stragglers)
 *                    {"type":"hung","why":"..."}   the step watchdog (train/watchdog.h)
 *                    found its compute thread stuck: the agent kills it and
 *                    reports it hung (its slice is replaced)
 * The agent closing its end means "no re-formation is coming": the worker
 * exits as before (status 3 after a peer failure).
 *
 *   st_worker_ctl *w;
 *   rc = st_worker_ctl_open(&w, env.control_fd); // NULL *w without one (st_elastic_env_read)
 *   rc = st_worker_ctl_wait(w, 0, &r);      // 1: r holds a reform; 0: none yet
 *   rc = st_worker_ctl_wait(w, 60000, &r);  // ... waiting at most 60 s
 *   st_worker_ctl_close(w);
 */
#ifndef ST_ELASTIC_WORKER_H
#define ST_ELASTIC_WORKER_H

#include "comm/comm.h"

typedef struct st_worker_ctl st_worker_ctl;

typedef struct st_reform {
	long long gen;
	st_group_env env;       /* the new group's place of this worker */
	st_elastic_env elastic; /* and its elastic variables (the global batch's device count) */
} st_reform;

/* The control channel on fd (SLICETRAIN_CONTROL_FD, st_elastic_env_read),
 * or *out NULL when fd < 0. ST_EINVAL when fd is not an open stream socket. */
int st_worker_ctl_open(st_worker_ctl **out, int fd);
/* Wait at most timeout_ms (0: just look) for a reform message. 1 and *r; 0
 * when none came; ST_EPEER when the agent closed the channel; ST_EPROTO for
 * a message that breaks the protocol (the channel is then closed). */
int st_worker_ctl_wait(st_worker_ctl *w, int timeout_ms, st_reform *r);
/* Tell the agent that this worker re-formed into generation gen: its
 * output from now on is that generation's ({"type":"reformed","gen":G}). */
int st_worker_ctl_ack(st_worker_ctl *w, long long gen);
/* Tell the agent that step `step` is done, its compute taking compute_s. */
int st_worker_ctl_step(st_worker_ctl *w, long long step, double compute_s);
/* Tell the agent that this worker's compute thread is stuck (why: what
 * the watchdog saw). Safe from another thread than the one that waits. */
int st_worker_ctl_hung(st_worker_ctl *w, const char *why);
void st_worker_ctl_close(st_worker_ctl *w);

#endif
