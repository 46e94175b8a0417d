#include "train/summary.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "train/metrics.h"

int st_summary_dir(const st_config *c, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/%s/tensorboard", c->base_output_directory, c->run_name);
	if (n < 0 || (size_t)n >= cap)
		return st_fail(ST_EINVAL, "TensorBoard directory path is too long (base_output_directory/run_name)");
	return 0;
}

int st_summary_open(st_tfevents **out, const st_config *c)
{
	char dir[ST_PATH_MAX];
	int rc = st_summary_dir(c, dir, sizeof(dir));
	return rc < 0 ? rc : st_tfevents_open(out, dir);
}

/* One controller event line as a text summary: inline code, so that
 * markdown leaves its underscores alone. */
static int write_event(st_tfevents *w, const char *line, size_t len, int64_t step)
{
	json_error_t jerr;
	if (st_metrics_is_record(line) || !strstr(line, "\"event\""))
		return 0; /* a step's or an eval's record: no need to parse it */
	json_t *o = json_loadb(line, len, 0, &jerr);
	if (!o)
		return 0; /* not JSON: not the controller's */
	json_t *kind = json_object_get(o, "event"), *s = json_object_get(o, "step");
	int rc = 0;
	if (json_is_string(kind)) {
		char *text = malloc(len + 3);
		if (!text) {
			json_decref(o);
			return st_fail(ST_ENOMEM, "out of memory (TensorBoard text)");
		}
		text[0] = '`';
		memcpy(text + 1, line, len);
		text[len + 1] = '`';
		text[len + 2] = '\0';
		rc = st_tfevents_text(w, json_is_integer(s) ? json_integer_value(s) : step, "elastic/events", text);
		free(text);
	}
	json_decref(o);
	return rc;
}

int st_summary_controller_events(st_tfevents *w, const char *metrics_file, int64_t *off, int64_t step)
{
	if (!metrics_file[0])
		return 0;
	FILE *f = fopen(metrics_file, "r");
	if (!f)
		return 0; /* nothing written yet */
	struct stat st;
	if (fstat(fileno(f), &st) == 0 && *off > (int64_t)st.st_size)
		*off = -1; /* cut short since (rewritten): start over */
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int rc = 0;
	int64_t pos = 0;
	if (*off < 0) { /* the end of the last record: what came before is an earlier writer's */
		int64_t after = 0;
		while ((n = getline(&line, &cap, f)) > 0) {
			pos += n;
			if (line[n - 1] == '\n' && st_metrics_is_record(line))
				after = pos;
		}
		*off = after;
		clearerr(f);
	}
	if (fseeko(f, (off_t)*off, SEEK_SET) == 0) {
		pos = *off;
		/* complete lines only: a line still being written is read next time */
		while (rc == 0 && (n = getline(&line, &cap, f)) > 0 && line[n - 1] == '\n') {
			rc = write_event(w, line, (size_t)n - 1, step);
			pos += n;
			*off = pos;
		}
	}
	if (rc == 0 && ferror(f))
		rc = st_fail(ST_EIO, "cannot read metrics_file '%s' for the controller's events: %s", metrics_file,
			     strerror(errno));
	free(line);
	fclose(f);
	return rc;
}
