/*
 * status.h - the exit statuses and signals between the launcher, the
 * agents and the workers (docs/elastic-protocol.md, "Framing and messages").
 * Both ends of each use these names.
 *
 *   worker exit  0    finished its steps
 *                1    any other failure (ST_EIO, ST_ENOMEM, ...)
 *                2    bad input (ST_EINVAL: config, data, arguments): a restart cannot help
 *                3    a peer of the worker group failed (ST_EPEER): the survivors' status
 *                128 + N  stopped by signal N: 143 after a preemption notice (SIGTERM) and
 *                     138 after a resize request (SIGUSR1), each once the state is saved
 */
#ifndef ST_BASE_STATUS_H
#define ST_BASE_STATUS_H

#include <signal.h>

enum {
	ST_EXIT_OK = 0,
	ST_EXIT_ERROR = 1,
	ST_EXIT_BAD_INPUT = 2,
	ST_EXIT_PEER = 3,
	ST_EXIT_SIGNAL_BASE = 128, /* + the signal's number */
};

/* A preemption notice: the group saves after the current step and stops. */
#define ST_SIG_NOTICE SIGTERM
/* The elastic controller's resize request to a worker: the same, for a re-formation by restart. */
#define ST_SIG_RESIZE SIGUSR1
/* The agent's abort (sigqueue, value: the generation): a peer was lost and the group re-forms;
 * the worker gives up the collectives in flight of that generation (st_group_abort_gen). */
#define ST_SIG_ABORT SIGUSR2

/* The exit status of a process stopped by signal sig (after its save). */
static inline int st_exit_signal(int sig) { return ST_EXIT_SIGNAL_BASE + sig; }

#define ST_EXIT_NOTICE (ST_EXIT_SIGNAL_BASE + ST_SIG_NOTICE) /* 143 */
#define ST_EXIT_RESIZE (ST_EXIT_SIGNAL_BASE + ST_SIG_RESIZE) /* 138 */

#endif
