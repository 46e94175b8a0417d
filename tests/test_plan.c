/*
 * `slicetrain plan`: MaxText's FLOPs figure for llama3-8b (95.5 TFLOPs per
 * device per step at batch 1 x 2048: 92.2 of weights, 3.3 of causal
 * attention), the tutorial's meshes, the planned bytes against what the code
 * allocates for a small model (parameter blocks, st_llama_act_bytes,
 * st_llama_workspace_bytes and st_llama_kctx_bytes after st_llama_alloc_acts,
 * per remat policy; the products' context also on the fp32 tiles), and
 * a mesh or model that does not resolve (ST_EINVAL).
 * Needs ST_ROOT (the repository root; tests/run.sh exports it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "check.h"
#include "kernels/cpu/gemm.h"
#include "model/llama.h"
#include "train/plan.h"

static char root[4096];

static const char *base_yml(void)
{
	static char p[4200];
	snprintf(p, sizeof(p), "%s/configs/base.yml", root);
	return p;
}

#define NOV(...) ((int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)))
#define LOAD(c, ...) st_config_load(c, base_yml(), NOV(__VA_ARGS__), (char **)(const char *[]){__VA_ARGS__})

static void test_llama3_8b(void)
{
	st_config c;
	/* the tutorial's 8B mesh: 2 slices x 16, ici fsdp 4 x tensor 4, dcn data auto */
	CHECK(LOAD(&c, "model_name=llama3-8b", "per_device_batch_size=1", "max_target_length=2048",
		   "ici_fsdp_parallelism=4", "ici_tensor_parallelism=4", "remat_policy=full") == 0);
	st_plan p;
	CHECK(st_plan_compute(&p, &c, 2, 16, 95.0 * (1 << 30)) == 0);
	CHECK_MSG(p.flops.total / 1e12 > 95.45 && p.flops.total / 1e12 < 95.55, "8B: %.3f TFLOPs",
		  p.flops.total / 1e12);
	CHECK_MSG(p.flops.weights / 1e12 > 92.15 && p.flops.weights / 1e12 < 92.25,
		  "8B weights: %.3f TFLOPs", p.flops.weights / 1e12);
	CHECK_MSG(p.flops.attention / 1e12 > 3.25 && p.flops.attention / 1e12 < 3.35,
		  "8B attention: %.3f TFLOPs", p.flops.attention / 1e12);
	CHECK(p.mesh.size[ST_AXIS_DATA] == 2 && p.mesh.size[ST_AXIS_FSDP] == 4 &&
	      p.mesh.size[ST_AXIS_TENSOR] == 4 && p.mesh.dcn[ST_AXIS_DATA] == 2);
	CHECK(p.params == 8030261248ll); /* Llama 3 8B */
	/* tensor pieces / 4, then fsdp / 4; gradients as weights, AdamW twice */
	CHECK(p.local.H == 8 && p.local.K == 2 && p.local.M == 14336 / 4 && p.local.V == 128256 / 4);
	CHECK(p.params_device == (p.params_piece + 3) / 4);
	CHECK(p.weights == 4 * p.params_device && p.grads == p.weights && p.optimizer == 2 * p.weights);
	CHECK(p.fsdp_buffer > 0 && p.rows == 4 && p.global_batch == 32);
	CHECK(p.activations > st_llama_act_bytes_for(&p.local, 4, 2048, ST_REMAT_FULL, NULL)); /* + tp buffers */
	CHECK(p.total == p.weights + p.grads + p.optimizer + p.fsdp_buffer + p.bf16_weights +
			 p.activations + p.workspace + p.kernel_ctx + p.checkpoint);
	CHECK(p.kernel_ctx >= (int64_t)st_kctx_bytes(0));
	CHECK(p.fits);
	st_plan_print(&p, &c, NULL, stdout);
}

static void test_llama3_70b(void)
{
	st_config c;
	CHECK(LOAD(&c, "model_name=llama3-70b", "per_device_batch_size=2", "max_target_length=4096",
		   "remat_policy=full", "ici_tensor_parallelism=4", "ici_fsdp_parallelism=4",
		   "dcn_fsdp_parallelism=2", "dcn_data_parallelism=1") == 0);
	st_plan p;
	CHECK(st_plan_compute(&p, &c, 2, 16, 16.0 * (1 << 30)) == 0);
	CHECK(p.mesh.size[ST_AXIS_DATA] == 1 && p.mesh.size[ST_AXIS_FSDP] == 8 &&
	      p.mesh.size[ST_AXIS_TENSOR] == 4);
	CHECK(p.params > 70000000000ll && p.params < 71000000000ll);
	CHECK(!p.fits); /* not in 16 GiB */
	/* MaxText's formula at 4096 (my arithmetic: 3548 TFLOPs at batch 2) */
	CHECK_MSG(p.flops.total / 1e12 > 3540 && p.flops.total / 1e12 < 3556, "70B: %.1f",
		  p.flops.total / 1e12);
}

/* Planned bytes = what a single process allocates, for each remat policy,
 * fp32 and bf16 (the all-fp32 kernel plan: every fp32 operand copy, no bf16
 * weight copy); bf16_kernels=auto counts the most a plan can take. */
/* c's model (3 x 40 tokens, every product site on the fp32 kernels in bf16
 * mode) with its activations, workspace and kernel context allocated. */
static void alloc_model(st_llama *m, const st_config *c, int bf16)
{
	st_llama_shape s;
	st_llama_shape_from_config(&s, c);
	CHECK(st_llama_init(m, &s) == 0);
	m->bf16 = bf16;
	memset(m->kplan.f32, 1, sizeof(m->kplan.f32));
	CHECK(st_llama_alloc_acts(m, 3, 40, c->remat_policy) == 0);
}

static void test_small_model_bytes(void)
{
	const char *remat[] = {"remat_policy=none", "remat_policy=minimal", "remat_policy=full"};
	for (int i = 0; i < 6; i++) {
		int bf16 = i >= 3;
		st_config c;
		CHECK(LOAD(&c, "model_name=llama3-test", "per_device_batch_size=3",
			   "max_target_length=40", remat[i % 3], bf16 ? "dtype=bfloat16" : "dtype=float32",
			   "bf16_kernels=fp32") == 0);
		st_plan p, pauto;
		CHECK(st_plan_compute(&p, &c, 1, 1, 0) == 0);
		snprintf(c.bf16_kernels, sizeof(c.bf16_kernels), "auto");
		CHECK(st_plan_compute(&pauto, &c, 1, 1, 0) == 0);
		st_llama m = ST_LLAMA_INIT;
		alloc_model(&m, &c, bf16);
		CHECK(p.bf16_weights == 0);
		CHECK(pauto.bf16_weights == (bf16 ? 2 * m.nparams : 0));
		CHECK(pauto.activations == p.activations);
		CHECK_MSG(p.activations == st_llama_act_bytes(&m), "%s%s: planned %lld, allocated %lld",
			  remat[i % 3], bf16 ? " bf16" : "", (long long)p.activations,
			  (long long)st_llama_act_bytes(&m));
		/* the workspace: the kernels' (as allocated, for this process's
		 * threads), the token batch (3 x 41 ids), the 64 MiB runtime */
		int64_t ws = st_llama_workspace_bytes(&m);
		CHECK_MSG(ws > 0 && p.workspace == ws + 4 * 3 * 41 + (64 << 20),
			  "%s%s: planned workspace %lld, kernels' workspace allocated %lld", remat[i % 3],
			  bf16 ? " bf16" : "", (long long)p.workspace, (long long)ws);
		/* the products' context, as allocated for this CPU and threads */
		CHECK_MSG(p.kernel_ctx == st_llama_kctx_bytes(&m) && p.kernel_ctx >= (int64_t)st_kctx_bytes(0),
			  "%s%s: planned kernel context %lld, allocated %lld", remat[i % 3], bf16 ? " bf16" : "",
			  (long long)p.kernel_ctx, (long long)st_llama_kctx_bytes(&m));
		CHECK(p.params == m.nparams && p.params_piece == m.nparams && p.params_device == m.nparams);
		CHECK(p.weights == m.nparams * (int64_t)sizeof(*m.params));
		CHECK(p.grads == m.nparams * (int64_t)sizeof(*m.grads));
		CHECK(p.optimizer == 2 * m.nparams * (int64_t)sizeof(float));
		CHECK(p.fsdp_buffer == 0 && p.rows == 3);
		st_llama_release(&m);
	}
}

/* Mixed kernel plans: the planned bytes are what the model allocates, and
 * auto's count bounds every plan's. */
static void test_mixed_plans(void)
{
	st_config c;
	CHECK(LOAD(&c, "model_name=llama3-test", "per_device_batch_size=3", "max_target_length=40",
		   "remat_policy=none", "dtype=bfloat16", "bf16_kernels=auto") == 0);
	st_plan pauto;
	CHECK(st_plan_compute(&pauto, &c, 1, 1, 0) == 0);
	st_llama m = ST_LLAMA_INIT;
	st_llama_shape s;
	st_llama_shape_from_config(&s, &c);
	CHECK(st_llama_init(&m, &s) == 0);
	m.bf16 = 1;
	uint64_t x = 12345;
	for (int t = 0; t < 40; t++) {
		for (int i = 0; i < ST_KS_COUNT; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			m.kplan.f32[i] = (unsigned char)(x >> 62 & 1);
		}
		CHECK(st_llama_alloc_acts(&m, 3, 40, ST_REMAT_NONE) == 0);
		char str[ST_KPLAN_STR_MAX];
		st_kplan_format(&m.kplan, str, sizeof(str));
		snprintf(c.bf16_kernels, sizeof(c.bf16_kernels), "%s", str);
		st_plan p;
		CHECK(st_plan_compute(&p, &c, 1, 1, 0) == 0);
		CHECK_MSG(p.activations == st_llama_act_bytes(&m), "plan %s: planned %lld, allocated %lld",
			  str, (long long)p.activations, (long long)st_llama_act_bytes(&m));
		CHECK_MSG(p.activations <= pauto.activations, "plan %s: %lld bytes, more than auto's %lld",
			  str, (long long)p.activations, (long long)pauto.activations);
	}
	st_llama_release(&m);
}

/* bf16 keeps its memory saving whatever the kernel plan: at the bench's
 * shape (llama3-125m, 4 x 512, no remat) activations at most 0.55x fp32's
 * (issue 14), for the all-bf16 plan, the all-fp32 one and auto's bound. */
static void test_bf16_saving(void)
{
	const char *kernels[] = {"bf16_kernels=bf16", "bf16_kernels=fp32", "bf16_kernels=auto"};
	st_config c;
	st_plan f32;
	CHECK(LOAD(&c, "model_name=llama3-125m", "per_device_batch_size=4", "max_target_length=512",
		   "remat_policy=none", "dtype=float32") == 0);
	CHECK(st_plan_compute(&f32, &c, 1, 1, 0) == 0);
	for (int i = 0; i < 3; i++) {
		st_plan p;
		CHECK(LOAD(&c, "model_name=llama3-125m", "per_device_batch_size=4",
			   "max_target_length=512", "remat_policy=none", "dtype=bfloat16", kernels[i]) == 0);
		CHECK(st_plan_compute(&p, &c, 1, 1, 0) == 0);
		double r = (double)p.activations / (double)f32.activations;
		printf("bench shape, %s: activations %.3f GiB = %.3fx fp32's %.3f GiB\n", kernels[i],
		       p.activations / 1073741824.0, r, f32.activations / 1073741824.0);
		CHECK_MSG(r <= 0.55, "%s: activations %.3fx fp32's", kernels[i], r);
	}
}

/* The products' kernel context on the fp32 tiles (the back end where
 * oneDNN runs without AVX-512), fp32 and bf16 on the fp32 kernels: planned
 * as allocated, and more than the primitive table (the weight gradients'
 * packing or partial sums). */
static void test_kernel_ctx_tiles(void)
{
	enum st_gemm_backend be = st_gemm_f32_backend();
	st_gemm_set_f32_backend(ST_GEMM_TILES);
	for (int bf16 = 0; bf16 <= 1; bf16++) {
		st_config c;
		CHECK(LOAD(&c, "model_name=llama3-test", "per_device_batch_size=3", "max_target_length=40",
			   bf16 ? "dtype=bfloat16" : "dtype=float32", "bf16_kernels=fp32") == 0);
		st_plan p;
		CHECK(st_plan_compute(&p, &c, 1, 1, 0) == 0);
		st_llama m = ST_LLAMA_INIT;
		alloc_model(&m, &c, bf16);
		CHECK_MSG(p.kernel_ctx == st_llama_kctx_bytes(&m) && p.kernel_ctx > (int64_t)st_kctx_bytes(0),
			  "tiles%s: planned kernel context %lld, allocated %lld", bf16 ? " bf16" : "",
			  (long long)p.kernel_ctx, (long long)st_llama_kctx_bytes(&m));
		st_llama_release(&m);
	}
	st_gemm_set_f32_backend(be);
}

static void test_bad_input(void)
{
	st_config c;
	st_plan p;
	/* 32 heads do not split 3 ways */
	CHECK(LOAD(&c, "model_name=llama3-8b", "ici_tensor_parallelism=3", "ici_fsdp_parallelism=1") == 0);
	CHECK(st_plan_compute(&p, &c, 1, 3, 0) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "not divisible by the tensor parallelism") != NULL);
	/* a mesh that does not match the devices */
	CHECK(LOAD(&c, "model_name=llama3-8b", "ici_fsdp_parallelism=4", "ici_tensor_parallelism=4") == 0);
	CHECK(st_plan_compute(&p, &c, 1, 8, 0) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "does not match the product") != NULL);
	/* the command line's bad input: tests/cli/plan_bad_input.sh */
}

int main(void)
{
	const char *r = getenv("ST_ROOT");
	snprintf(root, sizeof(root), "%s", r && *r ? r : ".");
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/configs", root);
	st_config_set_config_dir(dir);
	test_llama3_8b();
	test_llama3_70b();
	test_small_model_bytes();
	test_mixed_plans();
	test_bf16_saving();
	test_kernel_ctx_tiles();
	test_bad_input();
	return check_result();
}
