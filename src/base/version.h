/*
 * version.h - what this binary is: its version, and its build (a digest of
 * the executable file), which the elastic controller compares across hosts
 * (docs/hosts.md): hosts running different builds could not train one
 * group bit for bit, so a host with another build is refused.
 */
#ifndef ST_BASE_VERSION_H
#define ST_BASE_VERSION_H

#include <stddef.h>

#define ST_VERSION "0.2.0"
#define ST_BUILD_ID_LEN 16 /* hex characters of the build id */

/*
 * The build id of the executable at path (NULL: this process's own,
 * /proc/self/exe): the first ST_BUILD_ID_LEN hex characters of the SHA-256
 * of its bytes, into out (ST_BUILD_ID_LEN + 1 bytes). 0, or ST_EIO naming
 * the file.
 */
int st_build_id(const char *path, char out[ST_BUILD_ID_LEN + 1]);

#endif
