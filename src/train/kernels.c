#include "train/kernels.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "kernels/cpu/bf16.h"

int st_train_choose_kernels(st_llama *m, const st_config *c, const st_par *p, const char *ckpt_plan, int64_t rows,
			    int64_t T, int lead)
{
	st_kplan plan = {{0}}; /* rank 0's, broadcast, unless given by the key or checkpoint */
	double ratio[ST_KS_COUNT];
	const char *from = "timing on rank 0";
	int rc = 0, timed = 0, has_ckpt = ckpt_plan && ckpt_plan[0];
	if (!st_kplan_is_auto(c->bf16_kernels)) {
		rc = st_kplan_parse(&plan, c->bf16_kernels);
		from = "the bf16_kernels key";
		if (rc == 0 && lead && has_ckpt && strcmp(ckpt_plan, c->bf16_kernels))
			st_warn("bf16_kernels differs from the plan the checkpoint was trained with (%s): "
				"results will not match the uninterrupted run bit for bit", ckpt_plan);
	} else if (has_ckpt) {
		rc = st_kplan_parse(&plan, ckpt_plan);
		from = "the checkpoint";
	} else if (p->rank == 0 && !st_cpu_has_bf16()) {
		memset(plan.f32, 1, sizeof(plan.f32));
		from = "this CPU (no bf16 products)";
	} else if (p->rank == 0) {
		st_kshape ks;
		st_llama_kernel_shape(m, rows, T, &ks);
		double t0 = st_mono_s();
		rc = st_kplan_time(&ks, 2, &plan, ratio);
		timed = 1;
		if (rc == 0)
			st_info("bf16 kernels timed on this CPU in %.2f s (rank 0, %d threads; fp32 time / bf16 time):",
				st_mono_s() - t0, omp_get_max_threads());
	}
	/* a plan from the key or the checkpoint, on a CPU without bf16 products */
	int given = !st_kplan_is_auto(c->bf16_kernels) || has_ckpt;
	if (rc == 0 && given && !st_cpu_has_bf16() && st_kplan_count_f32(&plan) < ST_KS_COUNT) {
		if (!st_kplan_is_auto(c->bf16_kernels))
			return st_fail(ST_EINVAL, "bf16_kernels=%s runs sites on the bf16 kernel, but %s: use "
				       "bf16_kernels=fp32 (or auto)", c->bf16_kernels, st_cpu_bf16_message());
		if (lead)
			st_warn("the checkpoint's kernel plan (%s) runs sites on the bf16 kernel, but %s: every "
				"site on fp32; results will not match the uninterrupted run bit for bit",
				ckpt_plan, st_cpu_bf16_message());
		memset(plan.f32, 1, sizeof(plan.f32));
	}
	if (rc < 0)
		return rc;
	if (p->world > 1 && (rc = st_comm_broadcast(p->world_comm, plan.f32, sizeof(plan.f32), 0)) < 0)
		return rc;
	if (lead) {
		char line[ST_KPLAN_STR_MAX];
		if (timed) {
			char *q = line;
			for (int i = 0; i < ST_KS_COUNT; i++)
				q += snprintf(q, sizeof(line) - (size_t)(q - line), "%s %s %.2f", i ? "," : "",
					      st_ksite_name(i), ratio[i]);
			st_info("  %s", line + 1);
		}
		st_kplan_format(&plan, line, sizeof(line));
		int n32 = st_kplan_count_f32(&plan);
		st_info("bf16 kernels from %s: %d of %d sites on the bf16 kernel, %d on fp32; to repeat: "
			"bf16_kernels=%s", from, ST_KS_COUNT - n32, ST_KS_COUNT, n32, line);
	}
	m->kplan = plan;
	return 0;
}
