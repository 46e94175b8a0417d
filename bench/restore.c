/*
 * bench/restore - the restore of one committed checkpoint step alone, as the
 * trainer does it: every tensor whole, into one block of fresh memory (the
 * tensors in the manifest's order), through st_ckpt_restore_step.
 *
 *   make build/bench/restore && build/bench/restore STEP_DIR [--drop]
 *
 * --drop: sync and drop the page cache first (echo 3 > drop_caches; root).
 * Prints one line: "restore: MB in S s (MB/s), CPU S s" (CPU: user + system
 * of the process during the restore, every thread) and the bytes read with
 * O_DIRECT straight into the destination. Interleave binaries
 * and compare against `dd bs=8M iflag=direct` of the shard (bench/README.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_cpu.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/pages.h"
#include "ckpt/ckpt_int.h"

static double cpu_s(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static int drop_caches(void)
{
	FILE *f;
	sync();
	if (!(f = fopen("/proc/sys/vm/drop_caches", "w")) || fputs("3\n", f) < 0 || fclose(f) != 0) {
		perror("bench/restore: cannot drop the page cache (/proc/sys/vm/drop_caches)");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ck_manifest m;
	st_ckpt_meta meta = {0};
	int64_t numel = 0, at = 0;

	if (argc < 2 || (argc == 3 && strcmp(argv[2], "--drop")) || argc > 3) {
		fprintf(stderr, "usage: %s STEP_DIR [--drop]\n", argv[0]);
		return 2;
	}
	if (ck_manifest_load(&m, argv[1], -1) < 0) {
		fprintf(stderr, "bench/restore: %s\n", st_errmsg());
		return 1;
	}
	st_ckpt_piece *pieces = calloc((size_t)m.ntensors, sizeof(*pieces));
	for (int i = 0; i < m.ntensors; i++)
		numel += m.tensors[i].shape[0] * (m.tensors[i].ndim == 2 ? m.tensors[i].shape[1] : 1);
	/* page-aligned and untouched, as the trainer's state (base/pages.h) */
	size_t bytes = (size_t)(numel > 0 ? numel : 1) * sizeof(float);
	float *block = st_pages_alloc(bytes);
	if (!pieces || !block) {
		fprintf(stderr, "bench/restore: out of memory\n");
		return 1;
	}
	for (int i = 0; i < m.ntensors; i++) {
		const struct ck_tensor *t = &m.tensors[i];
		st_ckpt_piece *p = &pieces[i];
		p->name = t->name;
		p->ndim = t->ndim;
		p->global_shape[0] = p->shape[0] = t->shape[0];
		p->global_shape[1] = p->shape[1] = t->ndim == 2 ? t->shape[1] : 0;
		p->data = block + at;
		at += t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
	}
	if (argc == 3 && drop_caches() < 0)
		return 1;
	double t0 = st_mono_s(), c0 = cpu_s();
	int rc = st_ckpt_restore_step(argv[1], NULL, &meta, m.ntensors, pieces);
	double dt = st_mono_s() - t0, dc = cpu_s() - c0;
	if (rc < 0) {
		fprintf(stderr, "bench/restore: %s\n", st_errmsg());
		return 1;
	}
	double mb = 4e-6 * (double)numel;
	char cpu[512];
	bench_cpu_model(cpu, sizeof(cpu));
	printf("cpu: %s\n", cpu);
	printf("restore: %.1f MB in %.3f s (%.0f MB/s), CPU %.3f s; %.1f MB read straight into the destination\n", mb,
	       dt, mb / dt, dc, 1e-6 * (double)meta.bytes_direct);
	st_ckpt_meta_release(&meta);
	ck_manifest_free(&m);
	free(pieces);
	st_pages_free(block, bytes);
	return 0;
}
