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
 * Direct mode (st_atomic_file_open_direct), for large files written once
 * (checkpoint shards): whole blocks go to the disk with O_DIRECT, bypassing
 * the page cache (no copy into it, no cached pages pushing the caller's
 * memory out). Alignment rules, per st_atomic_file_write call while the
 * file is direct, with B = st_atomic_file_align(f) (the file system's
 * O_DIRECT alignment, from statx; ST_ATOMIC_FILE_ALIGN where it does not
 * say; a divisor of ST_ATOMIC_FILE_ALIGN on the disks we run on, 512 on
 * most): buf must be B-aligned; its first n / B whole blocks are written
 * directly, and a remainder (a partial last block) is written buffered,
 * after which the file stays buffered for the rest of its writes. So:
 * aligned buffers of whole blocks, then at most one last write of any
 * length. An unaligned buf also
 * switches the file to buffered writes (correct, only slower). Where the
 * file system refuses O_DIRECT (tmpfs, some network file systems), at open
 * or at the first write, the file is written buffered instead, silently.
 * st_atomic_file_is_direct says which happened. commit is the same in both
 * modes (fsync, rename, fsync of the directory).
 *
 *   // buf from posix_memalign(&buf, ST_ATOMIC_FILE_ALIGN, cap)
 *   rc = st_atomic_file_open_direct(&f, path);
 *   if (rc == 0) st_atomic_file_write(&f, buf, n);  // n / 4096 blocks direct, the tail buffered
 *   if (rc == 0) rc = st_atomic_file_commit(&f);
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

/* Buffer address and block size for direct-mode writes: 4 KiB covers the
 * logical block size of the disks and file systems we run on. */
#define ST_ATOMIC_FILE_ALIGN 4096

typedef struct st_atomic_file {
	int fd;        /* -1 when not open */
	int direct;    /* writes still go out with O_DIRECT (direct mode only) */
	size_t align;  /* their block: memory address, length and offset (1 when buffered) */
	int err;       /* first error (sticky), 0 if none */
	char *path;    /* final path */
	char *tmp;     /* temporary path, "<path>.tmp.<pid>" */
	char *errmsg;  /* message of the first error, replayed by commit */
} st_atomic_file;

#define ST_ATOMIC_FILE_INIT { .fd = -1 }

/* Create the temporary file for path (mode 0644 less umask). The directory must exist. */
int st_atomic_file_open(st_atomic_file *f, const char *path);
/* The same in direct mode (see above). */
int st_atomic_file_open_direct(st_atomic_file *f, const char *path);
/* 1 while f's writes go out with O_DIRECT: opened direct, accepted by the
 * file system, and no partial block or unaligned buffer written yet. */
int st_atomic_file_is_direct(const st_atomic_file *f);
/* The block of f's direct writes (see above); 1 while f's writes are buffered
 * (any address and length then). */
size_t st_atomic_file_align(const st_atomic_file *f);
/* The block O_DIRECT needs on the open file fd (memory address, length and
 * offset): what statx reports (STATX_DIOALIGN), ST_ATOMIC_FILE_ALIGN where
 * it reports nothing. */
size_t st_direct_align(int fd);
/* Append n bytes. After a failure every later write returns the same error. */
int st_atomic_file_write(st_atomic_file *f, const void *buf, size_t n);
/* Overwrite n bytes at offset, inside what was written already (a header
 * whose counts are known only at the end). Buffered files only (ST_BUG in
 * direct mode); errors are sticky as for write. */
int st_atomic_file_write_at(st_atomic_file *f, const void *buf, size_t n, size_t offset);
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
