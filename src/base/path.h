/*
 * path.h - path strings and directories: joining into a fixed buffer,
 * testing for a regular file, removing a flat directory.
 *
 *   char p[ST_PATH_MAX];
 *   if ((rc = st_path_join(p, sizeof(p), dir, "manifest.json")) < 0) return rc;
 *   if (st_file_exists(p)) ...
 *
 * Errors: ST_EINVAL "path too long: ..." from st_path_join (so a path that
 * cannot be formed is reported as bad input, never truncated); ST_EIO naming
 * the path and strerror from st_remove_dir.
 */
#ifndef ST_BASE_PATH_H
#define ST_BASE_PATH_H

#include <stddef.h>

/* Longest path we build or accept (Linux PATH_MAX), including the NUL. */
#define ST_PATH_MAX 4096

/* "a/b" into buf[0..cap); ST_EINVAL if it does not fit. */
int st_path_join(char *buf, size_t cap, const char *a, const char *b);
/* 1 if path names a regular file (following links), else 0. */
int st_file_exists(const char *path);
/* Remove the entries of directory path (plain files: there is no recursion
 * into subdirectories), then the directory itself. A missing directory is
 * fine (0). Every entry is tried; the first failure is returned. */
int st_remove_dir(const char *path);

#endif
