/*
 * comm_fuzz.h - what the worker group's fuzz targets (fuzz_store.c,
 * fuzz_frame.c) share: the run token they hold, loaded the way a worker
 * loads it (st_token_load from SLICETRAIN_TOKEN), and their check, which
 * aborts with the target's name, the failed condition and the last error
 * message, so that libFuzzer keeps the input.
 */
#ifndef FUZZ_COMM_FUZZ_H
#define FUZZ_COMM_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#include "base/err.h"
#include "comm/auth.h"

#define COMM_FUZZ_TOKEN "fuzz-run-token-0123456789abcdef"

#define FUZZ_ASSERT(c)                                                                            \
	do {                                                                                      \
		if (!(c)) {                                                                       \
			fprintf(stderr, "%s: %s:%d: check failed: %s (last error: %s)\n", FUZZ_NAME, \
				__FILE__, __LINE__, #c, st_errmsg());                             \
			abort();                                                                  \
		}                                                                                 \
	} while (0)

/* The token every input is run with; aborts if it cannot be loaded. */
static inline void comm_fuzz_token(st_token *t)
{
	setenv("SLICETRAIN_TOKEN", COMM_FUZZ_TOKEN, 1);
	unsetenv("SLICETRAIN_TOKEN_FILE");
	if (st_token_load(t) < 0 || !t->set) {
		fprintf(stderr, "%s: cannot load the token: %s\n", FUZZ_NAME, st_errmsg());
		abort();
	}
}

#endif
