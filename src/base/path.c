#include "base/path.h"

#include "base/err.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int st_path_join(char *buf, size_t cap, const char *a, const char *b)
{
	int n = snprintf(buf, cap, "%s/%s", a, b);
	if (n < 0 || (size_t)n >= cap)
		return st_fail(ST_EINVAL, "path too long: %.100s/%.100s...", a, b);
	return 0;
}

int st_file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int st_remove_dir(const char *path)
{
	char p[ST_PATH_MAX];
	struct dirent *d;
	DIR *dp = opendir(path);
	int rc = 0;

	if (!dp)
		return errno == ENOENT ? 0 : st_fail(ST_EIO, "%s: cannot open: %s", path, strerror(errno));
	while ((d = readdir(dp))) {
		if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, ".."))
			continue;
		if (st_path_join(p, sizeof(p), path, d->d_name) < 0 || (unlink(p) < 0 && errno != ENOENT))
			rc = st_fail(ST_EIO, "%s: cannot remove: %s", p, strerror(errno));
	}
	closedir(dp);
	if (rc == 0 && rmdir(path) < 0 && errno != ENOENT)
		rc = st_fail(ST_EIO, "%s: cannot remove: %s", path, strerror(errno));
	return rc;
}
