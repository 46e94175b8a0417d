/*
 * setup.c - everything before the first step, and after a re-formation:
 * the group and its mesh, the model and its shard (restored, initialized,
 * or received from a peer), ZeRO-3, the kernel plan, activations, and what
 * is bound to the group (data, eval, sinks, checkpoints); and their release.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16.h"
#include "train/kernels.h"
#include "train/trainer_int.h"

static const char *remat_name(enum st_remat r)
{
	return r == ST_REMAT_FULL ? "full" : r == ST_REMAT_MINIMAL ? "minimal" : "none";
}

/* Shape and cost, printed before any large allocation so that a model too big
 * for this machine still shows what it would be. */
static void print_header(const trainer *t)
{
	const st_config *c = t->c;
	st_info("Per train step: Total TFLOPs: %.3f, split as %.2f%% learnable weight flops and "
		"%.2f%% attention flops",
		t->flops.total / 1e12, 100 * t->flops.weights / t->flops.total,
		100 * t->flops.attention / t->flops.total);
	st_info("batch %lld x %lld tokens per device, gradient accumulation %lld, remat %s, %s, %d threads",
		(long long)t->B, (long long)t->T, (long long)t->accum, remat_name(c->remat_policy),
		c->dtype == ST_DTYPE_BF16 ? "bf16 activations and products (per bf16_kernels), fp32 weights" : "fp32",
		omp_get_max_threads());
	if (c->dtype == ST_DTYPE_BF16)
		st_info("bf16 matrix products: %s", st_amx_available()
			? "AMX (slicetrain's tile kernel; ST_AMX=0 for oneDNN's)"
			: "oneDNN's matmul (no AMX in use: see docs/kernels.md)");
}

/* Weights, gradients and two AdamW moments, in fp32. */
static int check_memory(int64_t nparams, const char *model)
{
	double need = 16.0 * (double)nparams;
	double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
	if (have > 0 && need > have)
		return st_fail(ST_ENOMEM,
			       "%s needs %.1f GiB for weights, gradients and optimizer state on one device; "
			       "this machine has %.1f GiB (shard it across devices, or pick a smaller model)",
			       model, need / (1 << 30), have / (1 << 30));
	return 0;
}

/*
 * Micro-batches per step on `world` devices. Under an elastic controller
 * (max_devices W_max: the group's device count at its maximum size) the
 * global batch stays that of W_max devices: accumulation
 * gradient_accumulation_steps * W_max / world, so the loss curve and the
 * sample order (by global sample index) do not depend on resizes; with
 * elastic_batch=scale it follows the devices (MaxText's behaviour).
 * max_devices 0: not elastic.
 */
static int elastic_accum(const st_config *c, int world, int64_t max_devices, int64_t *accum)
{
	*accum = c->gradient_accumulation_steps;
	if (!max_devices)
		return 0;
	if (max_devices < world)
		return st_fail(ST_EINVAL,
			       "SLICETRAIN_ELASTIC_MAX_DEVICES=%lld is smaller than this group's %d devices "
			       "(it is the device count at the maximum size)", (long long)max_devices, world);
	if (c->elastic_batch == ST_ELASTIC_BATCH_SCALE)
		return 0;
	int64_t micro = c->gradient_accumulation_steps * max_devices; /* micro-batches of one device per step */
	if (micro % world)
		return st_fail(ST_EINVAL,
			       "elastic_batch constant: the global batch of %lld devices (SLICETRAIN_ELASTIC_MAX_DEVICES) "
			       "x gradient_accumulation_steps %lld cannot be kept on %d devices (%d does not divide %lld; "
			       "use a device count that divides it, or elastic_batch=scale)",
			       (long long)max_devices, (long long)c->gradient_accumulation_steps, world, world,
			       (long long)micro);
	*accum = micro / world;
	return 0;
}

int group_setup(trainer *t, const st_group_env *env)
{
	const st_config *c = t->c;
	st_group_opts go = {.env = env, .generation = t->generation};
	int rc;
	if ((rc = st_group_join(&t->group, &go)) < 0)
		return rc;
	if ((rc = st_par_init(&t->par, c, t->group)) < 0)
		return rc;
	const st_par *p = &t->par;
	t->lead = p->rank == 0;
	t->B = (int64_t)c->per_device_batch_size;
	t->T = c->max_target_length;
	t->rows = t->B * p->mesh.size[ST_AXIS_TENSOR];
	t->max_devices = t->env.max_devices;
	if ((rc = elastic_accum(c, p->world, t->max_devices, &t->accum)) < 0)
		return rc;
	t->G = t->B * p->world * t->accum;
	t->flops = st_training_flops(c, (double)t->B);
	/* the formula counts gradient_accumulation_steps micro-batches; we run t->accum */
	double fk = (double)t->accum / (double)c->gradient_accumulation_steps;
	t->flops.weights *= fk;
	t->flops.attention *= fk;
	t->flops.total *= fk;
	st_par_describe(p, t->mesh_desc, sizeof(t->mesh_desc));
	if (t->lead) {
		st_info("mesh: %s", t->mesh_desc);
		if (t->max_devices) {
			char gen[32] = "";
			if (t->generation >= 0)
				snprintf(gen, sizeof(gen), " generation %lld", (long long)t->generation);
			st_info("elastic%s: %d of at most %lld devices, global batch %lld (elastic_batch %s)", gen, p->world,
				(long long)t->max_devices, (long long)t->G,
				c->elastic_batch == ST_ELASTIC_BATCH_SCALE ? "scale" : "constant");
		}
		if (!env)
			print_header(t);
	}
	return 0;
}

void group_release(trainer *t)
{
	st_par_release(&t->par);
	st_group_leave(t->group);
	t->group = NULL;
}

int bound_setup(trainer *t, int reformed)
{
	const st_config *c = t->c;
	const st_par *p = &t->par;
	int rc;
	if ((rc = st_run_ckpt_open(&t->ckpt, c, &t->shard, &t->model, p, t->kernels_set ? &t->model.kplan : NULL,
				   t->generation, &t->knobs)) < 0 ||
	    (reformed && (rc = st_run_ckpt_reserve(&t->ckpt)) < 0))
		return rc;
	if (!t->shard.alias && (rc = st_fsdp_create(&t->fsdp, &t->shard, &t->model, p, t->rows * t->T)) < 0)
		return rc;
	if ((rc = st_shard_share(&t->shard, p)) < 0)
		return rc;
	if ((rc = st_dataset_open(&t->data, c, t->G)) < 0)
		return rc;
	if (t->accum > 1 && t->shard.alias && !(t->gsum = malloc((size_t)t->model.nparams * sizeof(float))))
		return st_fail(ST_ENOMEM, "out of memory for the gradient sum (%.1f MB)", 4e-6 * (double)t->model.nparams);
	if ((rc = st_eval_open(&t->eval, c, t->G, t->lead)) < 0)
		return rc;
	/* under an elastic controller metrics_file holds every generation's
	 * records (and the controller's event lines between them): appended to */
	if ((rc = st_metrics_open(&t->out, c, t->lead, reformed || t->generation >= 0, t->generation >= 0, t->step0,
				  !reformed)) < 0)
		return rc;
	return st_test_knobs_open_log(&t->knobs, p->rank, p->coord[ST_AXIS_TENSOR] == 0);
}

void bound_release(trainer *t, int failed)
{
	st_run_ckpt_close(&t->ckpt, failed);
	st_fsdp_free(t->fsdp);
	t->fsdp = NULL;
	st_dataset_free(t->data);
	t->data = NULL;
	st_eval_close(&t->eval);
	st_metrics_close(&t->out);
	free(t->gsum);
	t->gsum = NULL;
	st_test_knobs_close_log(&t->knobs);
}

void describe_run(trainer *t)
{
	st_run_info r = {.world = t->par.world, .global_batch = t->G, .seq_len = t->T, .generation = t->generation,
			 .nparams = st_llama_count_params(&t->model.s)};
	snprintf(r.mesh, sizeof(r.mesh), "%s", t->mesh_desc);
	snprintf(r.origin, sizeof(r.origin), "%s", t->origin);
	st_metrics_describe(&t->out, &r);
}

/* The restored checkpoint's or the decided kernel plan (bf16). */
static int choose_kernels(trainer *t, const char *ckpt_plan)
{
	int rc = st_train_choose_kernels(&t->model, t->c, &t->par, ckpt_plan, t->rows, t->T, t->lead);
	if (rc < 0)
		return rc;
	t->kernels_set = 1;
	return st_run_ckpt_set_kernels(&t->ckpt, &t->model.kplan);
}

int trainer_setup(trainer *t)
{
	const st_config *c = t->c;
	int rc;
	if ((rc = st_elastic_env_read(&t->env)) < 0 || (rc = st_test_knobs_read(&t->knobs)) < 0)
		return rc;
	t->generation = t->env.generation;
	int joiner = t->env.joiner;
	if ((rc = st_worker_ctl_open(&t->ctl, t->env.control_fd)) < 0 || (rc = group_setup(t, NULL)) < 0)
		return rc;
	const st_par *p = &t->par;
	st_llama_shape shape;
	st_llama_shape_from_config(&shape, c);
	int64_t nparams;
	if ((rc = st_llama_check_config(c, &nparams)) < 0 || (rc = check_memory(nparams, c->model_name)) < 0)
		return rc;
	/* with fsdp > 1 the model is not resident: ZeRO-3 gathers it unit by unit */
	int resident = p->mesh.size[ST_AXIS_FSDP] == 1;
	if ((rc = st_llama_init_tp(&t->model, &shape, (int)p->mesh.size[ST_AXIS_TENSOR], p->coord[ST_AXIS_TENSOR],
				   p->tp, resident)) < 0)
		return rc;
	if (c->dtype == ST_DTYPE_BF16) {
		/* bf16 storage everywhere; without bf16 products every site runs on
		 * the fp32 kernels (train/kernels.h) */
		t->model.bf16 = 1;
		if (!st_cpu_has_bf16() && t->lead)
			st_info("dtype bfloat16: %s; bf16 storage, every product on the fp32 kernels",
				st_cpu_bf16_message());
	}
	st_run_restored r = {0};
	if ((rc = st_shard_init(&t->shard, &t->model, p)) < 0 || (rc = bound_setup(t, 0)) < 0)
		return rc;
	int scale = t->max_devices > 0 && c->elastic_batch == ST_ELASTIC_BATCH_SCALE;
	if (!joiner && (rc = st_run_ckpt_restore(&t->ckpt, &t->shard, &t->model, p, t->G, scale, t->lead, &r)) < 0)
		return rc;
	if (r.found) {
		t->step0 = r.step;
		t->sample0 = r.next_sample;
	}
	if (!joiner && !r.found) /* a fresh start (or every checkpoint was unusable): initial weights */
		st_shard_init_weights(&t->shard, &t->model, (uint64_t)c->init_weights_seed);
	if ((rc = st_run_ckpt_reserve(&t->ckpt)) < 0)
		return rc;
	if (joiner)
		snprintf(t->origin, sizeof(t->origin), "joined: the state received from a peer");
	else if (r.found && t->step0 > 0)
		snprintf(t->origin, sizeof(t->origin), "restored from the checkpoint of step %lld", (long long)t->step0);
	else if (r.found)
		snprintf(t->origin, sizeof(t->origin), "weights loaded from %.170s",
			 c->load_full_state_path[0] ? c->load_full_state_path : c->load_parameters_path);
	else
		snprintf(t->origin, sizeof(t->origin), "fresh weights (init_weights_seed %lld)",
			 (long long)c->init_weights_seed);
	t->done = joiner ? -1 : t->step0;
	if (t->model.bf16 && !joiner && (rc = choose_kernels(t, r.kernels)) < 0)
		return rc;
	if (resident && (rc = st_shard_gather_params(&t->shard, &t->model, p)) == 0)
		rc = st_llama_weights_changed(&t->model);
	if (rc < 0 || (rc = st_llama_alloc_acts(&t->model, t->rows, t->T, c->remat_policy)) < 0)
		return rc;
	t->tokens = malloc((size_t)(t->rows * (t->T + 1)) * sizeof(int32_t));
	if (!t->tokens)
		return st_fail(ST_ENOMEM, "out of memory for the batch");
	/* an elastic group: a joiner gets the state from a peer */
	if ((t->ctl || joiner) && (rc = trainer_sync_state(t)) < 0)
		return rc;
	describe_run(t);
	if (t->lead) {
		st_info("activations %.1f MiB (remat %s; %lld bytes)", (double)st_llama_act_bytes(&t->model) / (1 << 20),
			remat_name(c->remat_policy), (long long)st_llama_act_bytes(&t->model));
		if (t->fsdp)
			st_info("fsdp buffers %.1f MiB (%lld bytes)", (double)st_fsdp_buffer_bytes(t->fsdp) / (1 << 20),
				(long long)st_fsdp_buffer_bytes(t->fsdp));
	}
	return 0;
}

void trainer_release(trainer *t, int failed)
{
	bound_release(t, failed);
	st_llama_release(&t->model);
	st_shard_release(&t->shard);
	free(t->tokens);
	group_release(t);
	st_worker_ctl_close(t->ctl);
}
