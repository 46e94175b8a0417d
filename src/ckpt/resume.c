/*
 * resume.c - what a resumed run must keep from the checkpoint it resumes
 * (st_ckpt_check_resume, ckpt.h): the batch's shape, global batch and
 * sequence length, read from the checkpoint's meta and saved config.
 */
#include "ckpt/ckpt.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"

/* An integer of the saved config (a whole real too: per_device_batch_size
 * is written as a number); -1 when absent or not a number. */
static double saved_number(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	return json_is_number(v) ? json_number_value(v) : -1;
}

/* ", " between the parts of a message. */
static void add(char *buf, size_t cap, size_t *len, const char *part)
{
	if (*len < cap)
		*len += (size_t)snprintf(buf + *len, cap - *len, "%s%s", *len ? ", " : "", part);
}

int st_ckpt_check_resume(const st_ckpt_meta *meta, const st_config *c, int64_t global_batch, int batch_may_scale)
{
	if (c->resume_allow_batch_change)
		return 0;
	json_t *cfg = meta->config_json ? json_loads(meta->config_json, 0, NULL) : NULL;
	char was[512] = "", now[512] = "", part[160];
	size_t wl = 0, nl = 0;
	double seq = saved_number(cfg, "max_target_length");
	if (seq > 0 && (int64_t)seq != c->max_target_length) {
		snprintf(part, sizeof(part), "max_target_length %" PRId64, (int64_t)seq);
		add(was, sizeof(was), &wl, part);
		snprintf(part, sizeof(part), "max_target_length %" PRId64, c->max_target_length);
		add(now, sizeof(now), &nl, part);
	}
	if (!batch_may_scale && meta->global_batch > 0 && meta->global_batch != global_batch) {
		snprintf(part, sizeof(part), "a global batch of %" PRId64 " sequences", meta->global_batch);
		add(was, sizeof(was), &wl, part);
		snprintf(part, sizeof(part), "a global batch of %" PRId64 " sequences", global_batch);
		add(now, sizeof(now), &nl, part);
	}
	/* the global batch follows the devices (elastic_batch=scale): what
	 * each device trains must stay */
	double pdb = saved_number(cfg, "per_device_batch_size"), acc = saved_number(cfg, "gradient_accumulation_steps");
	if (batch_may_scale && pdb > 0 && acc > 0 &&
	    pdb * acc != c->per_device_batch_size * (double)c->gradient_accumulation_steps) {
		snprintf(part, sizeof(part), "per_device_batch_size %g x gradient_accumulation_steps %" PRId64, pdb,
			 (int64_t)acc);
		add(was, sizeof(was), &wl, part);
		snprintf(part, sizeof(part), "per_device_batch_size %g x gradient_accumulation_steps %" PRId64,
			 c->per_device_batch_size, c->gradient_accumulation_steps);
		add(now, sizeof(now), &nl, part);
	}
	json_decref(cfg);
	if (!wl)
		return 0;
	return st_fail(ST_EINVAL,
		       "run '%s' resumes the checkpoint of step %" PRId64 ", trained with %s; this run has %s: a resumed "
		       "run keeps the batch it was trained with (a new run needs a new run_name; "
		       "resume_allow_batch_change=true resumes with the new batch anyway)",
		       c->run_name, meta->step, was, now);
}
