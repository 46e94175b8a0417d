/*
 * file.h - durable file writes, and reading a whole file.
 *
 * A file that must survive a crash (checkpoint shard, manifest, weights) is
 * written to a temporary name next to its final path, fsynced, renamed over
 * the final path, and the directory is fsynced. Readers therefore see either
 * the old file or the complete new one, never a torn write.
 *
 * Whole buffer:
 *
 *   if ((rc = st_write_file_atomic("out/manifest.json", buf, len)) < 0) return rc;
 *
 * Streaming (the first failing write makes the error sticky, so callers may
 * check only the final commit):
 *
 *   st_atomic_file f = ST_ATOMIC_FILE_INIT;
 *   int rc = st_atomic_file_open(&f, path);     // creates "<path>.tmp.<pid>"
 *   if (rc < 0) return rc;
 *   st_atomic_file_write(&f, hdr, hdr_len);
 *   st_atomic_file_write(&f, data, data_len);
 *   rc = st_atomic_file_commit(&f);             // fsync, rename, fsync(dir); on error: abort
 *
 * To give up without committing call st_atomic_file_abort(&f), which removes
 * the temporary. commit and abort both release the struct; abort on a
 * released (or ST_ATOMIC_FILE_INIT) struct does nothing, so `goto fail`
 * paths may call it unconditionally.
 *
 * Errors: ST_EIO with "PATH: what failed: strerror" (ST_ENOMEM for allocation).
 * Temporaries of a process killed mid-write are left behind as
 * "<path>.tmp.<pid>"; they never shadow the final name.
 */
#ifndef ST_BASE_FILE_H
#define ST_BASE_FILE_H

#include <stddef.h>

typedef struct st_atomic_file {
	int fd;        /* -1 when not open */
	int err;       /* first error (sticky), 0 if none */
	char *path;    /* final path */
	char *tmp;     /* temporary path, "<path>.tmp.<pid>" */
	char *errmsg;  /* message of the first error, replayed by commit */
} st_atomic_file;

#define ST_ATOMIC_FILE_INIT { .fd = -1 }

/* Create the temporary file for path (mode 0644 less umask). The directory must exist. */
int st_atomic_file_open(st_atomic_file *f, const char *path);
/* Append n bytes. After a failure every later write returns the same error. */
int st_atomic_file_write(st_atomic_file *f, const void *buf, size_t n);
/* fsync the temporary, rename it to the final path, fsync the directory.
 * Returns the sticky error if a write had failed (and removes the temporary). */
int st_atomic_file_commit(st_atomic_file *f);
/* Close and unlink the temporary; safe on an unopened or released struct. */
void st_atomic_file_abort(st_atomic_file *f);

/* Write data[0..n) to path atomically (open + write + commit). */
int st_write_file_atomic(const char *path, const void *data, size_t n);

/*
 * Read the whole file at path into a malloc'd buffer with a NUL after the
 * data (*out; *len, if not NULL, the byte count without the NUL). Works on
 * files whose size stat does not know (pipes, /proc). Errors: ST_EIO "PATH:
 * cannot open|read ...: strerror" with errno left as the failing call set
 * it (so callers may word their own message), ST_EINVAL "PATH: larger than
 * N bytes" when the file holds more than max bytes, ST_ENOMEM. *out is
 * NULL on error.
 */
int st_read_file(const char *path, size_t max, char **out, size_t *len);

/* fsync a directory so that renames and creations inside it are durable. */
int st_fsync_dir(const char *dir);

/* Create a directory and its missing parents (mode 0755 less umask), like
 * `mkdir -p`. An existing directory is fine; an existing non-directory is ST_EIO. */
int st_mkdir_p(const char *path);

#endif
