/*
 * fence.c - the generation fence of elastic runs (docs/checkpoints.md,
 * "Generations"). A host that was partitioned away and declared dead may
 * come back with workers that still run an older generation; their saves
 * must not be committed, nor mix with the newer generation's files. The
 * controller writes the newest generation to <run_dir>/generation before it
 * starts any worker of it; a saver reads it before it writes its shard and,
 * on process 0, again right before the manifest. The file is the only
 * channel: the writer thread has no communicator, and an old worker may no
 * longer reach the controller at all.
 *
 * What is left between process 0's last check and its manifest's rename is
 * a commit of a checkpoint whose files are all of the old generation (each
 * done record is checked against the save's generation): a consistent
 * checkpoint of its step, not a mix of two generations.
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FENCE_MAX_BYTES 64

int st_ckpt_fence_path(const st_config *c, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/%s/%s", c->base_output_directory, c->run_name, ST_CKPT_FENCE_FILE);
	if (n < 0 || (size_t)n >= cap)
		return st_fail(ST_EINVAL, "generation fence path is too long (base_output_directory/run_name)");
	return 0;
}

int st_ckpt_fence_write(const char *path, int64_t generation)
{
	char text[32];
	if (generation < 0)
		return st_fail(ST_EINVAL, "generation fence %s: generation %" PRId64 " is negative", path, generation);
	int n = snprintf(text, sizeof(text), "%" PRId64 "\n", generation);
	return st_write_file_atomic(path, text, (size_t)n);
}

/* Up to 32 bytes of text for a message, anything unprintable as '?'. */
static void printable(char *out, size_t cap, const char *text, size_t len)
{
	size_t i;
	for (i = 0; i < len && i < 32 && i + 1 < cap; i++)
		out[i] = isprint((unsigned char)text[i]) ? text[i] : '?';
	out[i] = '\0';
}

int st_ckpt_fence_read(const char *path, int64_t *generation)
{
	char *text, shown[40];
	size_t len, digits = 0;
	int64_t v = 0;
	int rc = st_read_file(path, FENCE_MAX_BYTES, &text, &len);
	if (rc == ST_EIO && errno == ENOENT)
		return 0;
	if (rc == ST_EINVAL)
		return st_fail(ST_EINVAL, "%s: malformed generation fence: more than %d bytes (it holds one "
			       "generation number)", path, FENCE_MAX_BYTES);
	if (rc < 0)
		return rc;
	while (digits < len && digits < 18 && text[digits] >= '0' && text[digits] <= '9')
		v = v * 10 + (text[digits++] - '0');
	int ok = digits > 0 && (digits == len || (digits + 1 == len && text[digits] == '\n'));
	printable(shown, sizeof(shown), text, len);
	free(text);
	if (!ok)
		return st_fail(ST_EINVAL, "%s: malformed generation fence: \"%s\" is not a generation number (the "
			       "elastic controller writes one decimal number)", path, shown);
	*generation = v;
	return 1;
}

int ck_fence_check(const st_ckpt_opts *o, int64_t step)
{
	char what[48];
	int64_t newest;
	int rc;
	if (o->generation < 0 || !o->fence)
		return 0;
	if (step >= 0)
		snprintf(what, sizeof(what), "checkpoint step %" PRId64, step);
	else
		snprintf(what, sizeof(what), "checkpoint saver");
	if ((rc = st_ckpt_fence_read(o->fence, &newest)) < 0)
		return st_wrap(rc, "%s", what);
	if (rc == 0 || newest <= o->generation)
		return 0;
	return st_fail(ST_EIO, "%s: generation %" PRId64 " is stale (the run is at generation %" PRId64 ", %s): %s",
		       what, o->generation, newest, o->fence,
		       step >= 0 ? "not committed" : "removing no uncommitted checkpoint");
}
