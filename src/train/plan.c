#include "train/plan.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "kernels/cpu/kctx.h"
#include "shard/fsdp.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* Libraries, oneDNN's JIT code and scratch, stacks: measured 40-60 MiB. */
#define RUNTIME_BYTES (64ll << 20)

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static const char *remat_name(enum st_remat r)
{
	return r == ST_REMAT_FULL ? "full" : r == ST_REMAT_MINIMAL ? "minimal" : "none";
}

static double machine_memory(void)
{
	double pages = (double)sysconf(_SC_PHYS_PAGES), size = (double)sysconf(_SC_PAGESIZE);
	return pages > 0 && size > 0 ? pages * size : 0;
}

int st_plan_compute(st_plan *p, const st_config *c, int64_t num_slices, int64_t devices_per_slice,
		    double memory_bytes)
{
	memset(p, 0, sizeof(*p));
	if (num_slices < 1 || devices_per_slice < 1)
		return st_fail(ST_EINVAL, "--num-slices and --devices-per-slice must be at least 1");
	int rc = st_mesh_resolve(&p->mesh, c, num_slices, devices_per_slice);
	if (rc < 0)
		return rc;
	p->devices = num_slices * devices_per_slice;
	double b = c->per_device_batch_size;
	if (b < 1 || b != (double)(int64_t)b)
		return st_fail(ST_EINVAL, "per_device_batch_size must be a whole number >= 1 for now, got %g", b);
	int64_t B = (int64_t)b, tp = p->mesh.size[ST_AXIS_TENSOR], F = p->mesh.size[ST_AXIS_FSDP];
	st_llama_shape_from_config(&p->shape, c);
	const st_llama_shape *s = &p->shape;
	/* this process's tensor table (weights not allocated): the tensor-parallel
	 * parts divided by tp, the rest replicated; buffers are sized from it by
	 * the same functions that allocate them */
	st_llama m = ST_LLAMA_INIT;
	if ((rc = st_llama_check_config(c, &p->params)) < 0 ||
	    (rc = st_llama_init_tp(&m, s, (int)tp, 0, NULL, 0)) < 0)
		return rc;
	p->local = m.ls;
	p->layer_piece = st_llama_unit_numel(&m, 1);
	p->params_piece = m.nparams;
	p->params_device = ceil_div(p->params_piece, F);
	p->weights = 4 * p->params_device;
	p->grads = 4 * p->params_device;
	/* a resident model sums its micro-batches' gradients in a second buffer
	 * (train.c, sum_micro_batch) */
	if (F == 1 && c->gradient_accumulation_steps > 1)
		p->grads *= 2;
	p->optimizer = 8 * p->params_device;

	/* activations: a tensor-parallel group's micro-batch, one device's heads */
	p->rows = B * tp;
	p->T = c->max_target_length;
	p->global_batch = B * p->devices * c->gradient_accumulation_steps;
	if (F > 1) /* ZeRO-3 (st_fsdp) working buffers */
		p->fsdp_buffer = st_fsdp_bytes_for(&m, F, p->rows * p->T);
	int bf16 = c->dtype == ST_DTYPE_BF16;
	/* bf16 products read a bf16 copy of the resident weights; under ZeRO-3
	 * (weights gathered per unit) each weight is converted into one buffer
	 * as large as the largest product weight, counted with the activations */
	/* bf16_kernels: an explicit plan's fp32 operand copies and weight copy;
	 * auto (decided when the run starts) counts the most it can take: every
	 * site's fp32 operand copies, every gradient's bf16 copy and the bf16
	 * weight copy */
	st_kplan kp;
	int kauto = st_kplan_is_auto(c->bf16_kernels);
	if (kauto)
		memset(kp.f32, 1, sizeof(kp.f32));
	else if ((rc = st_kplan_parse(&kp, c->bf16_kernels)) < 0) {
		st_llama_release(&m);
		return rc;
	}
	st_llama_act_opts ao = {.tp = (int)tp, .bf16 = bf16,
				.weight_copy_elems = bf16 && F > 1 ? st_llama_largest_linear(&m) : 0,
				.kplan = bf16 ? &kp : NULL, .any_plan = bf16 && kauto};
	p->activations = st_llama_act_bytes_for(&p->local, p->rows, p->T, c->remat_policy, &ao);
	/* the kernels' workspace as st_llama_alloc_acts allocates it, its
	 * per-thread slices for this process's OpenMP threads (OMP_NUM_THREADS:
	 * set it as for the run), plus the token batch and the runtime */
	p->workspace = st_llama_workspace_bytes_for(&p->local, p->rows, p->T, c->remat_policy, &ao) +
		       4 * p->rows * (p->T + 1) + RUNTIME_BYTES;
	/* the matrix products' context as st_llama_alloc_acts allocates it:
	 * their scratch on this CPU, for the same threads, and their
	 * primitive table */
	p->kernel_ctx = st_llama_kctx_bytes_for(&p->local, p->rows, p->T, c->remat_policy, &ao);
	p->bf16_weights = bf16 && F == 1 && (kauto || st_kplan_bf16_weights(&kp)) ? 2 * p->params_piece : 0;
	/* checkpointing: st_ckpt_saver_reserve's host buffer, allocated when the
	 * run starts (its pages resident once a save's release copies into them;
	 * counted whole, as a slow disk can make a release copy all): the file image
	 * of what the process writes (its shard's weights and both AdamW moments;
	 * the device counted here is data replica 0, tensor rank 0, which also
	 * writes the replicated tensors), a header of 4096 + 512 bytes per piece,
	 * 1 MiB of slack, in 4 KiB pages (src/ckpt/save.c) */
	if (c->enable_checkpointing)
		p->checkpoint = ceil_div(4096 + 3 * (int64_t)m.ntensors * 512 + 3 * 4 * p->params_device + (1 << 20),
					 4096) * 4096;
	st_llama_release(&m);

	p->total = p->weights + p->grads + p->optimizer + p->fsdp_buffer + p->bf16_weights +
		   p->activations + p->workspace + p->kernel_ctx + p->checkpoint;
	p->memory = memory_bytes > 0 ? memory_bytes : machine_memory();
	p->fits = p->memory <= 0 || (double)p->total <= p->memory;
	p->flops = st_training_flops(c, (double)B);
	return 0;
}

/* ---- when it does not fit: a variant that does ---- */

/* The variants tried, each a change of the run; cost: how much it asks of
 * the user (the same results and hardware first, more hardware last). */
enum { V_REMAT = 1, V_FSDP = 2, V_HALVE = 3, V_BF16 = 6, V_DEVICES = 8 };
#define MAX_DEVICE_DOUBLINGS 4 /* up to 16x the devices per slice */

/* The config of one variant: remat full, the data axes as fsdp, the
 * per-device batch halved h times with as much more accumulation (the same
 * global batch), bf16, 2^d times the devices per slice as fsdp. 0, or -1
 * when the variant does not apply (a change to what the config already has,
 * a batch that does not halve). */
static int variant(const st_plan *p, const st_config *c, int remat, int fsdp, int h, int bf16, int d,
		   st_config *v, int64_t *dps)
{
	const st_mesh *m = &p->mesh;
	int64_t B = (int64_t)c->per_device_batch_size;
	if ((remat && c->remat_policy == ST_REMAT_FULL) || (bf16 && c->dtype == ST_DTYPE_BF16) ||
	    (fsdp && m->size[ST_AXIS_DATA] == 1) || B % ((int64_t)1 << h))
		return -1;
	*v = *c;
	if (remat)
		v->remat_policy = ST_REMAT_FULL;
	if (bf16)
		v->dtype = ST_DTYPE_BF16;
	v->per_device_batch_size = (double)(B >> h);
	v->gradient_accumulation_steps = c->gradient_accumulation_steps << h;
	/* the mesh, explicit: the resolved axes, data moved into fsdp, more
	 * devices in the slice's fsdp axis */
	int64_t k = (int64_t)1 << d, ici_data = fsdp ? 1 : m->ici[ST_AXIS_DATA],
		dcn_data = fsdp ? 1 : m->dcn[ST_AXIS_DATA];
	v->ici_data_parallelism = ici_data;
	v->ici_fsdp_parallelism = m->ici[ST_AXIS_FSDP] * (fsdp ? m->ici[ST_AXIS_DATA] : 1) * k;
	v->ici_tensor_parallelism = m->ici[ST_AXIS_TENSOR];
	v->dcn_data_parallelism = dcn_data;
	v->dcn_fsdp_parallelism = m->dcn[ST_AXIS_FSDP] * (fsdp ? m->dcn[ST_AXIS_DATA] : 1);
	v->dcn_tensor_parallelism = m->dcn[ST_AXIS_TENSOR];
	*dps = m->devices_per_slice * k;
	return *dps <= ST_PLAN_MAX_DEVICES_PER_SLICE ? 0 : -1;
}

static void append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...)
{
	size_t len = strlen(buf);
	va_list ap;
	va_start(ap, fmt);
	if (len < cap)
		vsnprintf(buf + len, cap - len, fmt, ap);
	va_end(ap);
}

int st_plan_suggest(const st_plan *p, const st_config *c, double memory_bytes, st_plan_suggestion *out)
{
	memset(out, 0, sizeof(*out));
	if (p->fits || p->memory <= 0)
		return 0;
	st_config *v = malloc(sizeof(*v));
	if (!v)
		return st_fail(ST_ENOMEM, "out of memory");
	int best_cost = -1, halvings = 0;
	for (int64_t b = (int64_t)c->per_device_batch_size; b > 1 && b % 2 == 0; b /= 2)
		halvings++;
	st_plan q;
	for (int d = 0; d <= MAX_DEVICE_DOUBLINGS; d++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int h = 0; h <= halvings; h++)
				for (int fsdp = 0; fsdp < 2; fsdp++)
					for (int remat = 0; remat < 2; remat++) {
						int64_t dps;
						int cost = remat * V_REMAT + fsdp * V_FSDP + h * V_HALVE + bf16 * V_BF16 +
							   d * V_DEVICES;
						if ((best_cost >= 0 && cost >= best_cost) || cost == 0 ||
						    variant(p, c, remat, fsdp, h, bf16, d, v, &dps) < 0)
							continue;
						/* a variant the mesh or the model refuses is no suggestion */
						if (st_plan_compute(&q, v, p->mesh.num_slices, dps, memory_bytes) < 0 || !q.fits)
							continue;
						best_cost = cost;
						out->found = 1;
						out->plan = q;
						out->devices_per_slice = dps;
						out->overrides[0] = 0;
						if (remat)
							append(out->overrides, sizeof(out->overrides), "remat_policy=full ");
						if (bf16)
							append(out->overrides, sizeof(out->overrides), "dtype=bfloat16 ");
						if (h)
							append(out->overrides, sizeof(out->overrides),
							       "per_device_batch_size=%lld gradient_accumulation_steps=%lld ",
							       (long long)v->per_device_batch_size,
							       (long long)v->gradient_accumulation_steps);
						if (fsdp || d)
							append(out->overrides, sizeof(out->overrides),
							       "ici_data_parallelism=%lld ici_fsdp_parallelism=%lld "
							       "ici_tensor_parallelism=%lld dcn_data_parallelism=%lld "
							       "dcn_fsdp_parallelism=%lld dcn_tensor_parallelism=%lld ",
							       (long long)v->ici_data_parallelism, (long long)v->ici_fsdp_parallelism,
							       (long long)v->ici_tensor_parallelism, (long long)v->dcn_data_parallelism,
							       (long long)v->dcn_fsdp_parallelism, (long long)v->dcn_tensor_parallelism);
						size_t n = strlen(out->overrides);
						if (n)
							out->overrides[n - 1] = 0;
					}
	free(v);
	return out->found;
}

static void line(FILE *out, const char *what, int64_t bytes, const char *note)
{
	fprintf(out, "  %-12s %10.3f GiB  %s\n", what, (double)bytes / GIB, note);
}

void st_plan_print(const st_plan *p, const st_config *c, const st_plan_suggestion *s, FILE *out)
{
	const st_mesh *m = &p->mesh;
	const st_llama_shape *l = &p->local;
	char note[256], dps[32];
	fprintf(out, "model: %s, %.3f B parameters (%lld)\n", c->model_name, (double)p->params / 1e9,
		(long long)p->params);
	fprintf(out,
		"mesh: %lld slice%s x %lld devices = %lld: data %lld (ici %lld, dcn %lld), fsdp %lld "
		"(ici %lld, dcn %lld), tensor %lld (ici %lld, dcn %lld)\n",
		(long long)m->num_slices, m->num_slices == 1 ? "" : "s", (long long)m->devices_per_slice,
		(long long)p->devices, (long long)m->size[ST_AXIS_DATA], (long long)m->ici[ST_AXIS_DATA],
		(long long)m->dcn[ST_AXIS_DATA], (long long)m->size[ST_AXIS_FSDP],
		(long long)m->ici[ST_AXIS_FSDP], (long long)m->dcn[ST_AXIS_FSDP],
		(long long)m->size[ST_AXIS_TENSOR], (long long)m->ici[ST_AXIS_TENSOR],
		(long long)m->dcn[ST_AXIS_TENSOR]);
	fprintf(out,
		"batch: %g x %lld tokens per device, %lld sequences per micro-batch of a tensor group, "
		"global batch %lld sequences (%lld tokens) per step, remat %s, dtype %s\n",
		c->per_device_batch_size, (long long)p->T, (long long)p->rows, (long long)p->global_batch,
		(long long)(p->global_batch * p->T), remat_name(c->remat_policy),
		c->dtype == ST_DTYPE_BF16 ? "bfloat16 (bf16 product inputs, residual stream and every kept activation; fp32 weights and AdamW state)"
					       : "float32");
	if (c->dtype == ST_DTYPE_BF16)
		fprintf(out, "bf16_kernels %s: %s\n", st_kplan_is_auto(c->bf16_kernels) ? "auto" : "explicit",
			st_kplan_is_auto(c->bf16_kernels)
				? "each product's kernel is timed when the run starts; counted here at most "
				  "(every product's fp32 operand copies and the bf16 weight copy)"
				: "the plan's fp32 operand copies and, when a product reads it, the bf16 weight copy");
	fprintf(out, "per device:\n");
	snprintf(note, sizeof(note), "fp32, %lld parameters: tensor piece %lld / fsdp %lld",
		 (long long)p->params_device, (long long)p->params_piece,
		 (long long)m->size[ST_AXIS_FSDP]);
	line(out, "weights", p->weights, note);
	line(out, "gradients", p->grads,
	     m->size[ST_AXIS_FSDP] == 1 && c->gradient_accumulation_steps > 1
		     ? "fp32, and their sum over micro-batches" : "fp32, sharded as the weights");
	line(out, "optimizer", p->optimizer, "AdamW m and v, fp32, sharded as the weights");
	if (p->fsdp_buffer)
		line(out, "fsdp buffers", p->fsdp_buffer,
		     "gathered weights (2 layers, output layer, embedding or the group's embedded tokens), one unit's gradients");
	if (p->bf16_weights)
		line(out, "bf16 weights", p->bf16_weights, "bf16 copy of the resident weights for products");
	if (p->checkpoint)
		line(out, "checkpoint", p->checkpoint,
		     "host buffer of the saver: weights and AdamW m and v of the shard (at most; resident only as far as "
		     "a save's release copies, none when the writer keeps up)");
	snprintf(note, sizeof(note),
		 "remat %s, %lld x %lld rows; per device: %lld heads, %lld kv heads, mlp %lld, vocab %lld",
		 remat_name(c->remat_policy), (long long)p->rows, (long long)p->T, (long long)l->H,
		 (long long)l->K, (long long)l->M, (long long)l->V);
	line(out, "activations", p->activations, note);
	line(out, "workspace", p->workspace, "kernels' workspace (attention's K/V layouts), batch, 64 MiB runtime");
	snprintf(note, sizeof(note),
		 "matrix products' kernel context on this CPU: %.2f MiB of packing and partial sums "
		 "(AMX, fp32 tiles), %.2f MiB primitive table",
		 (double)(p->kernel_ctx - (int64_t)st_kctx_bytes(0)) / (1 << 20),
		 (double)st_kctx_bytes(0) / (1 << 20));
	line(out, "kernel ctx", p->kernel_ctx, note);
	if (p->memory > 0)
		snprintf(note, sizeof(note), "of %.1f GiB: %s", p->memory / GIB,
			 p->fits ? "fits" : "DOES NOT FIT");
	else
		snprintf(note, sizeof(note), "(memory size unknown)");
	line(out, "total", p->total, note);
	if (s && s->found)
		fprintf(out, "fits (%.3f GiB of %.1f GiB) with: %s%s%s\n", (double)s->plan.total / GIB, p->memory / GIB,
			s->overrides, s->devices_per_slice != m->devices_per_slice ? " --devices-per-slice " : "",
			s->devices_per_slice != m->devices_per_slice ? (snprintf(dps, sizeof(dps), "%lld",
										 (long long)s->devices_per_slice), dps) : "");
	else if (s && !p->fits && p->memory > 0)
		fprintf(out, "no variant tried fits: remat_policy=full, the data axes as fsdp, a smaller "
			"per_device_batch_size with more gradient accumulation, dtype=bfloat16, up to %dx the devices "
			"per slice as fsdp\n", 1 << MAX_DEVICE_DOUBLINGS);
	fprintf(out,
		"FLOPs per device per step: %.2f TFLOP (%.2f weights, %.2f causal attention; MaxText's "
		"formula), %.2f GFLOP per token\n",
		p->flops.total / 1e12, p->flops.weights / 1e12, p->flops.attention / 1e12,
		p->flops.total / 1e9 /
			((double)p->T * c->per_device_batch_size * (double)c->gradient_accumulation_steps));
}

void st_plan_print_json(const st_plan *p, const st_config *c, const st_plan_suggestion *s, FILE *out)
{
	const st_mesh *m = &p->mesh;
	json_t *o = json_object();
	if (!o) {
		fprintf(out, "{}\n");
		return;
	}
#define INT(k, v) json_object_set_new(o, k, json_integer((json_int_t)(v)))
#define REAL(k, v) json_object_set_new(o, k, json_real(v))
	json_object_set_new(o, "model", json_string(c->model_name));
	INT("params", p->params);
	INT("params_piece", p->params_piece);
	INT("params_device", p->params_device);
	INT("devices", p->devices);
	INT("data", m->size[ST_AXIS_DATA]);
	INT("fsdp", m->size[ST_AXIS_FSDP]);
	INT("tensor", m->size[ST_AXIS_TENSOR]);
	INT("rows", p->rows);
	INT("seq", p->T);
	INT("global_batch", p->global_batch);
	json_object_set_new(o, "remat", json_string(remat_name(c->remat_policy)));
	INT("weights_bytes", p->weights);
	INT("grads_bytes", p->grads);
	INT("optimizer_bytes", p->optimizer);
	INT("fsdp_buffer_bytes", p->fsdp_buffer);
	INT("bf16_weights_bytes", p->bf16_weights);
	INT("checkpoint_bytes", p->checkpoint);
	INT("activation_bytes", p->activations);
	INT("workspace_bytes", p->workspace);
	INT("kernel_ctx_bytes", p->kernel_ctx);
	INT("total_bytes", p->total);
	REAL("memory_bytes", p->memory);
	json_object_set_new(o, "fits", json_boolean(p->fits));
	if (s && s->found)
		json_object_set_new(o, "suggestion", json_pack("{s:s, s:I, s:I}", "overrides", s->overrides,
							       "devices_per_slice", (json_int_t)s->devices_per_slice,
							       "total_bytes", (json_int_t)s->plan.total));
	else if (s && !p->fits && p->memory > 0)
		json_object_set_new(o, "suggestion", json_null());
	REAL("tflops_per_device_step", p->flops.total / 1e12);
	REAL("tflops_weights", p->flops.weights / 1e12);
	REAL("tflops_attention", p->flops.attention / 1e12);
#undef INT
#undef REAL
	char *txt = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
	fprintf(out, "%s\n", txt ? txt : "{}");
	free(txt);
	json_decref(o);
}
