/*
 * fuzz_util.h - what the fuzz targets share besides the handshake oracle:
 * a check that stops the target (libFuzzer then saves the input), and
 * whole reads and writes on the target's own socketpairs.
 */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "base/err.h"

/* A property the target checks: on failure, say which and abort. */
#define FUZZ_ASSERT(c)                                                                              \
	do {                                                                                        \
		if (!(c)) {                                                                         \
			fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
				#c, st_errmsg());                                                   \
			abort();                                                                    \
		}                                                                                   \
	} while (0)

/* All n bytes to fd; -1 when the peer is gone. */
static inline int fuzz_put(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* All n bytes from fd; -1 at the end of the stream or on an error. */
static inline int fuzz_get(int fd, uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t r = recv(fd, p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

#endif
