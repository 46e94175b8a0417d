#include "base/file.h"

#include "base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The directory holding path: "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/". */
static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return strdup(".");
	size_t len = (size_t)(slash - path);
	if (len == 0)
		len = 1;
	char *dir = malloc(len + 1);
	if (!dir)
		return NULL;
	memcpy(dir, path, len);
	dir[len] = '\0';
	return dir;
}

static void release(st_atomic_file *f)
{
	if (f->fd >= 0)
		close(f->fd);
	free(f->path);
	free(f->tmp);
	free(f->errmsg);
	*f = (st_atomic_file)ST_ATOMIC_FILE_INIT;
}

/* Record the first error of f (message kept for commit) and return it. */
static int sticky(st_atomic_file *f, int code)
{
	if (!f->err) {
		f->err = code;
		f->errmsg = strdup(st_errmsg());
	}
	return f->err;
}

/* The block O_DIRECT needs on fd (memory address, length, offset): what
 * statx reports, ST_ATOMIC_FILE_ALIGN where it reports nothing. */
size_t st_direct_align(int fd)
{
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
	    sx.stx_dio_offset_align && sx.stx_dio_mem_align)
		return sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align : sx.stx_dio_mem_align;
	return ST_ATOMIC_FILE_ALIGN;
}

static int open_tmp(st_atomic_file *f, const char *path, int direct)
{
	*f = (st_atomic_file)ST_ATOMIC_FILE_INIT;
	if (!path || !*path)
		return st_fail(ST_EINVAL, "atomic file: empty path");
	size_t need = strlen(path) + 32;
	f->path = strdup(path);
	f->tmp = malloc(need);
	if (!f->path || !f->tmp) {
		release(f);
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	}
	snprintf(f->tmp, need, "%s.tmp.%ld", path, (long)getpid());
	int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
	f->fd = direct ? open(f->tmp, flags | O_DIRECT, 0644) : -1;
	f->direct = f->fd >= 0;
	f->align = f->direct ? st_direct_align(f->fd) : 1;
	if (f->fd < 0 && (!direct || errno == EINVAL)) /* EINVAL: no O_DIRECT on this file system */
		f->fd = open(f->tmp, flags, 0644);
	if (f->fd < 0) {
		int rc = st_fail(ST_EIO, "%s: cannot create: %s", f->tmp, strerror(errno));
		release(f);
		return rc;
	}
	return 0;
}

int st_atomic_file_open(st_atomic_file *f, const char *path) { return open_tmp(f, path, 0); }

int st_atomic_file_open_direct(st_atomic_file *f, const char *path) { return open_tmp(f, path, 1); }

int st_atomic_file_is_direct(const st_atomic_file *f) { return f->fd >= 0 && f->direct; }

size_t st_atomic_file_align(const st_atomic_file *f) { return st_atomic_file_is_direct(f) ? f->align : 1; }

/* Later writes of f go through the page cache. */
static int stop_direct(st_atomic_file *f)
{
	f->direct = 0;
	f->align = 1;
	int fl = fcntl(f->fd, F_GETFL);
	if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) < 0)
		return sticky(f, st_fail(ST_EIO, "%s: cannot leave O_DIRECT: %s", f->tmp, strerror(errno)));
	return 0;
}

/* write(2) until n bytes are out, at most 64 MiB per call. In direct mode a
 * write the file system refuses (EINVAL) is retried buffered. */
static int write_all(st_atomic_file *f, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(f->fd, p, n > ((size_t)64 << 20) ? ((size_t)64 << 20) : n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EINVAL && f->direct) { /* O_DIRECT refused at write time */
			if (stop_direct(f) < 0)
				return f->err;
			continue;
		}
		if (w <= 0)
			return sticky(f, st_fail(ST_EIO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress"));
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int st_atomic_file_write(st_atomic_file *f, const void *buf, size_t n)
{
	if (f->err)
		return f->err;
	if (f->fd < 0)
		ST_BUG("st_atomic_file_write on a file that is not open");
	const char *p = buf;
	if (f->direct) {
		size_t whole = (uintptr_t)p % f->align ? 0 : n / f->align * f->align;
		if (whole && write_all(f, p, whole) < 0)
			return f->err;
		p += whole;
		n -= whole;
		if (n > 0 && f->direct && stop_direct(f) < 0) /* a partial block, or an unaligned buffer */
			return f->err;
	}
	return write_all(f, p, n) < 0 ? f->err : 0;
}

int st_atomic_file_write_at(st_atomic_file *f, const void *buf, size_t n, size_t offset)
{
	if (f->err)
		return f->err;
	if (f->fd < 0 || f->direct)
		ST_BUG("st_atomic_file_write_at on a file that is not open, or in direct mode");
	const char *p = buf;
	while (n > 0) {
		ssize_t w = pwrite(f->fd, p, n, (off_t)offset);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return sticky(f, st_fail(ST_EIO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress"));
		p += w;
		n -= (size_t)w;
		offset += (size_t)w;
	}
	return 0;
}

int st_atomic_file_commit(st_atomic_file *f)
{
	int rc;
	if (f->fd < 0 && !f->err)
		ST_BUG("st_atomic_file_commit on a file that is not open");
	if (f->err) {
		rc = f->errmsg ? st_fail(f->err, "%s", f->errmsg) : f->err;
		goto fail;
	}
	if (fsync(f->fd) < 0) {
		rc = st_fail(ST_EIO, "%s: fsync failed: %s", f->tmp, strerror(errno));
		goto fail;
	}
	/* close reports deferred write-back errors on some file systems (NFS) */
	int fd = f->fd;
	f->fd = -1;
	if (close(fd) < 0) {
		rc = st_fail(ST_EIO, "%s: close failed: %s", f->tmp, strerror(errno));
		goto fail;
	}
	if (rename(f->tmp, f->path) < 0) {
		rc = st_fail(ST_EIO, "%s: cannot rename %s into place: %s", f->path, f->tmp,
			     strerror(errno));
		goto fail;
	}
	char *dir = dir_of(f->path);
	if (!dir) {
		release(f);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	rc = st_fsync_dir(dir);
	free(dir);
	release(f);
	return rc;
fail:
	st_atomic_file_abort(f);
	return rc;
}

void st_atomic_file_abort(st_atomic_file *f)
{
	if (f->tmp)
		unlink(f->tmp); /* best effort: also after a failed rename */
	release(f);
}

int st_write_file_atomic(const char *path, const void *data, size_t n)
{
	st_atomic_file f;
	int rc = st_atomic_file_open(&f, path);
	if (rc < 0)
		return rc;
	st_atomic_file_write(&f, data, n);
	return st_atomic_file_commit(&f);
}

int st_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return st_fail(ST_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
	int rc = 0;
	/* EINVAL: the file system cannot sync directories; nothing more can be done. */
	if (fsync(fd) < 0 && errno != EINVAL)
		rc = st_fail(ST_EIO, "%s: fsync of directory failed: %s", dir, strerror(errno));
	close(fd);
	return rc;
}

static int mkdir_one(const char *path)
{
	if (mkdir(path, 0755) == 0)
		return 0;
	int e = errno;
	struct stat st;
	if (e == EEXIST && stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		return st_fail(ST_EIO, "%s: exists and is not a directory", path);
	}
	return st_fail(ST_EIO, "%s: cannot create directory: %s", path, strerror(e));
}

int st_mkdir_p(const char *path)
{
	if (!path || !*path)
		return st_fail(ST_EINVAL, "mkdir: empty path");
	char *buf = strdup(path);
	if (!buf)
		return st_fail(ST_ENOMEM, "%s: out of memory", path);
	int rc = 0;
	/* Create each prefix ending before a '/', skipping the root and repeated slashes. */
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/' || p[-1] == '/')
			continue;
		*p = '\0';
		rc = mkdir_one(buf);
		*p = '/';
		if (rc < 0)
			goto out;
	}
	rc = mkdir_one(buf);
out:
	free(buf);
	return rc;
}

int st_read_file(const char *path, size_t max, char **out, size_t *len)
{
	struct stat st;
	size_t cap, got = 0;
	char *buf = NULL, *nb, probe;
	int fd, rc = 0, e;

	*out = NULL;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return st_fail(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = st_fail(ST_EIO, "%s: cannot stat: %s", path, strerror(errno));
		goto out;
	}
	if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) {
		rc = st_fail(ST_EINVAL, "%s: too large (%lld bytes)", path, (long long)st.st_size);
		goto out;
	}
	/* the size stat gives when it knows one (it may still change while we read) */
	cap = S_ISREG(st.st_mode) ? (size_t)st.st_size : 4096;
	if (cap > max)
		cap = max;
	if (!(buf = malloc(cap + 1))) {
		rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (;;) {
		/* full: read one byte to tell the end of the file from more data */
		int full = got == cap;
		ssize_t r = full ? read(fd, &probe, 1) : read(fd, buf + got, cap - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = st_fail(ST_EIO, "%s: read failed: %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		if (full) {
			if (cap >= max) {
				rc = st_fail(ST_EINVAL, "%s: too large (more than %zu bytes)", path, max);
				goto out;
			}
			cap = cap < 2048 ? 4096 : cap > max / 2 ? max : 2 * cap;
			if (cap > max)
				cap = max;
			if (!(nb = realloc(buf, cap + 1))) {
				rc = st_fail(ST_ENOMEM, "%s: out of memory", path);
				goto out;
			}
			buf = nb;
			buf[got] = probe;
		}
		got += (size_t)r;
	}
	buf[got] = '\0';
	*out = buf;
	buf = NULL;
	if (len)
		*len = got;
out:
	e = errno;
	close(fd);
	free(buf);
	errno = e; /* the failing call's, for callers that word their own message */
	return rc;
}
