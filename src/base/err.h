/*
 * err.h - error reporting for library code.
 *
 * Library functions return 0 on success or a negative ST_E* code on failure,
 * after leaving a one-line message with st_fail(). Only main() decides to exit;
 * it maps codes to exit statuses with st_exit_status().
 *
 *   if (n <= 0) return st_fail(ST_EINVAL, "%s:%d: steps must be positive", file, line);
 *   ...
 *   if (rc < 0) { fprintf(stderr, "slicetrain: %s\n", st_errmsg()); return st_exit_status(rc); }
 *
 * The message buffer is thread-local. Programmer errors (broken invariants)
 * abort through ST_BUG().
 */
#ifndef ST_BASE_ERR_H
#define ST_BASE_ERR_H

#include <stdio.h>
#include <stdlib.h>

enum {
	ST_OK = 0,
	ST_EINVAL = -1,   /* bad user input: config, data file, arguments (exit 2) */
	ST_EIO = -2,      /* I/O failure on a file that looked valid (exit 1) */
	ST_ENOMEM = -3,   /* allocation failed (exit 1) */
	ST_EINTERNAL = -4, /* a library (oneDNN, libyaml) failed unexpectedly (exit 1) */
	ST_EINTR = -5,     /* stopped by a signal (exit 128 + signal, decided by main) */
	ST_EPEER = -6,     /* a peer of the worker group died or stopped answering (exit 3) */
	ST_EPROTO = -7,    /* a peer sent a message that breaks the protocol (exit 1) */
	ST_EAUTH = -8      /* a peer failed the run token's proof, or we failed its (exit 1) */
};

/* Record a message (printf-style) and return code. errno is preserved. */
int st_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message recorded on this thread ("" if none). */
const char *st_errmsg(void);
/* Wrap that message with a prefix: "PREFIX: MESSAGE" (printf-style
 * prefix), and return code, the error's own or another:
 *   if ((rc = st_llama_check_config(c, NULL)) < 0)
 *           return st_wrap(ST_EINVAL, "%s", where);   */
int st_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Process exit status for an error code: 0 for ST_OK, 2 for ST_EINVAL, 3 for
 * ST_EPEER (a peer failed: the elastic layer restarts the group), 1 otherwise. */
int st_exit_status(int code);

/* Warnings go to stderr, prefixed "slicetrain: warning: ". */
void st_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* While quiet (per process), st_warn and st_info print nothing: used so that
 * only rank 0 of a group prints what every rank would print alike. */
void st_log_quiet(int quiet);
/* Informational lines go to stderr, prefixed "slicetrain: ". */
void st_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define ST_BUG(...)                                                                  \
	do {                                                                         \
		fprintf(stderr, "BUG at %s:%d: ", __FILE__, __LINE__);               \
		fprintf(stderr, __VA_ARGS__);                                        \
		fputc('\n', stderr);                                                 \
		abort();                                                             \
	} while (0)

#endif
