/*
 * fuzz_worker_ctl - a worker's control channel from its agent
 * (elastic/worker.h): line JSON over the socketpair of
 * SLICETRAIN_CONTROL_FD, whose "reform" messages set SLICETRAIN_ variables
 * and are read back as the new group's environment (comm/env.c).
 *
 * No listener: the channel is a socketpair the agent made, so only the
 * agent writes to it; it is fuzzed because its parser takes what the agent
 * forwards from the controller (a message's "env" object) and turns it into
 * process environment and group coordinates.
 *
 * Input: byte 0: the piece size (k: k*k bytes a write, 0: all at once), the
 * rest the bytes the agent sends. After each piece st_worker_ctl_wait(0) is
 * called until it has nothing more; at the end the agent's side is closed.
 * Checked beyond "no crash, no leak, no sanitizer report": a reform's
 * generation is in 1..2^40 and its environment is consistent (0 <= rank <
 * world size, 1 <= slices <= world size, a coordinator string); after an
 * error nothing more is returned; the channel's end is ST_EPEER.
 * Every SLICETRAIN_ variable a message set is removed after each input;
 * glibc's setenv keeps each value it was given, so memory grows with the
 * number of distinct values (hundreds of MiB over 10 minutes at most).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "base/err.h"
#include "comm/comm.h"
#include "elastic/worker.h"

extern char **environ;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	st_log_quiet(1);
	return 0;
}

/* Remove every SLICETRAIN_ variable (the last input's reform set some),
 * whatever the length of its name. */
static void clear_vars(void)
{
	for (;;) {
		char *name = NULL;
		for (char **e = environ; e && *e; e++)
			if (!strncmp(*e, "SLICETRAIN_", 11)) {
				name = strndup(*e, strcspn(*e, "="));
				break;
			}
		if (!name)
			return;
		int rc = unsetenv(name);
		free(name);
		FUZZ_ASSERT(rc == 0);
	}
}

/* Wait(0) until nothing more: 0 while the channel lives, <0 once it ended. */
static int drain(st_worker_ctl *w, int *dead)
{
	for (int calls = 0; calls < 1 << 16; calls++) {
		st_reform r;
		memset(&r, 0xa5, sizeof(r));
		int rc = st_worker_ctl_wait(w, 0, &r);
		if (rc == 0)
			return 0;
		if (rc < 0) {
			FUZZ_ASSERT(rc == ST_EPEER || rc == ST_EPROTO || rc == ST_EIO);
			*dead = 1;
			return rc;
		}
		FUZZ_ASSERT(rc == 1 && !*dead);
		FUZZ_ASSERT(r.gen >= 1 && r.gen <= 1LL << 40);
		FUZZ_ASSERT(r.env.world_size >= 1 && r.env.rank >= 0 && r.env.rank < r.env.world_size);
		FUZZ_ASSERT(r.env.num_slices >= 1 && r.env.num_slices <= r.env.world_size);
		FUZZ_ASSERT(memchr(r.env.coordinator, 0, sizeof(r.env.coordinator)) && r.env.source);
	}
	FUZZ_ASSERT(!"st_worker_ctl_wait returned reforms without end");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t piece = data[0] ? (size_t)data[0] * data[0] : size;
	data++;
	size--;
	int sv[2];
	FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	clear_vars();
	static char var[64];
	snprintf(var, sizeof(var), "SLICETRAIN_CONTROL_FD=%d", sv[0]);
	FUZZ_ASSERT(putenv(var) == 0);
	st_elastic_env ee;
	FUZZ_ASSERT(st_elastic_env_read(&ee) == 0 && ee.control_fd == sv[0]);
	FUZZ_ASSERT(!getenv("SLICETRAIN_CONTROL_FD"));
	st_worker_ctl *w = NULL;
	FUZZ_ASSERT(st_worker_ctl_open(&w, ee.control_fd) == 0 && w);
	int dead = 0;
	for (size_t off = 0; off < size && !dead; off += piece) {
		size_t n = size - off < piece ? size - off : piece;
		FUZZ_ASSERT(fuzz_put(sv[1], data + off, n) == 0);
		drain(w, &dead);
	}
	if (!dead) {
		shutdown(sv[1], SHUT_WR);
		FUZZ_ASSERT(drain(w, &dead) < 0);
	}
	st_worker_ctl_close(w);
	close(sv[1]);
	clear_vars();
	return 0;
}
