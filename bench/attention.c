/*
 * bench/attention - causal GQA attention forward + backward, fp32 kernels
 * (st_attention_*) against the bf16 ones (st_attention_*_bf16).
 *
 *   make build/bench/attention && build/bench/attention [B T H K D] [--runs N] [--threads 1,2]
 *                                                       [--dtype fp32|bf16|both]
 *
 * Default shape: B=4 T=512 H=12 K=4 D=64 (llama3-125m at
 * per_device_batch_size=4, max_target_length=512). For each thread count
 * (omp_set_num_threads) and each precision: one warm-up call, then the
 * median over --runs (default 7) of the forward time, the backward time and
 * their sum. The kernels' workspace is allocated once per thread count and
 * precision, before the calls, as the model does. GFLOP/s counts 2*B*H*T*T*D/2 flops per causal product: forward 2
 * products (QK^T, PV), backward 5 (scores again, dP, dV, dK, dQ). The last
 * column is the bf16 speed-up (fp32 time / bf16 time).
 * The machine may be shared: run it more than once and compare.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_args.h"
#include "bench_cpu.h"
#include "base/err.h"
#include "base/rng.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/ops.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static float *randn(int64_t n, uint64_t stream)
{
	float *x = malloc((size_t)n * sizeof(float));
	if (!x) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)st_rng_normal(5, stream, (uint64_t)i);
	return x;
}

#define USAGE "usage: %s [B T H K D] [--runs N] [--threads 1,2] [--dtype fp32|bf16|both]\n"

int main(int argc, char **argv)
{
	int64_t sh[5] = {4, 512, 12, 4, 64};
	int runs = 7, ns = 0, threads[8] = {1, 2}, nthreads = 2, prec0 = 0, prec1 = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
			if (bench_int("--runs", argv[++i], 1, 100000, &runs) < 0)
				return 2;
		} else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			nthreads = bench_int_list("--threads", argv[++i], 1, 1024, threads, 8);
			if (nthreads < 0)
				return 2;
		} else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
			const char *d = argv[++i];
			if (!strcmp(d, "fp32") || !strcmp(d, "bf16") || !strcmp(d, "both")) {
				prec0 = !strcmp(d, "bf16");
				prec1 = strcmp(d, "fp32") != 0;
			} else {
				fprintf(stderr, "--dtype: expected fp32, bf16 or both, got '%s'\n", d);
				return 2;
			}
		} else if (ns < 5) {
			long d;
			if (bench_long("shape (B T H K D)", argv[i], 1, 1L << 20, &d) < 0)
				return 2;
			sh[ns++] = d;
		} else {
			fprintf(stderr, USAGE, argv[0]);
			return 2;
		}
	}
	if (runs < 1 || (ns != 0 && ns != 5)) {
		fprintf(stderr, USAGE, argv[0]);
		return 2;
	}
	int64_t B = sh[0], T = sh[1], H = sh[2], K = sh[3], D = sh[4];
	int64_t nq = B * T * H * D, nk = B * T * K * D;
	float *q = randn(nq, 1), *k = randn(nk, 2), *v = randn(nk, 3), *g = randn(nq, 4);
	/* the bf16 kernels' inputs: q, k, v rounded, as the model keeps them */
	uint16_t *qh = malloc((size_t)nq * 2), *kh = malloc((size_t)nk * 2), *vh = malloc((size_t)nk * 2);
	float *o = malloc((size_t)nq * sizeof(float)), *lse = malloc((size_t)(B * H * T) * sizeof(float));
	float *dq = malloc((size_t)nq * sizeof(float)), *dk = malloc((size_t)nk * sizeof(float));
	float *dv = malloc((size_t)nk * sizeof(float));
	double *tf = malloc((size_t)runs * sizeof(double)), *tb = malloc((size_t)runs * sizeof(double));
	double *tt = malloc((size_t)runs * sizeof(double));
	if (!o || !lse || !dq || !dk || !dv || !tf || !tb || !tt || !qh || !kh || !vh) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	st_f32_to_bf16_array(qh, q, nq);
	st_f32_to_bf16_array(kh, k, nk);
	st_f32_to_bf16_array(vh, v, nk);
	double prod = 2.0 * (double)B * (double)H * (double)T * (double)T * (double)D / 2.0;
	char cpu[512];
	bench_cpu_model(cpu, sizeof(cpu));
	printf("attention B=%lld T=%lld H=%lld K=%lld D=%lld, median of %d runs\ncpu: %s\n", (long long)B,
	       (long long)T, (long long)H, (long long)K, (long long)D, runs, cpu);
	printf("%-7s %-5s %9s %9s %9s %9s %9s %9s %8s\n", "threads", "dtype", "fwd ms", "bwd ms",
	       "total ms", "fwd GF/s", "bwd GF/s", "tot GF/s", "speedup");
	for (int ti = 0; ti < nthreads; ti++) {
		omp_set_num_threads(threads[ti]);
		double total32 = 0;
		for (int prec = prec0; prec <= prec1; prec++) {
			st_ws ws = ST_WS_INIT;
			size_t wb = (prec ? st_attention_bf16_workspace_bytes : st_attention_workspace_bytes)(
				B, T, H, K, D, threads[ti]);
			if (st_ws_init(&ws, wb, threads[ti]) < 0) {
				fprintf(stderr, "%s\n", st_errmsg());
				return 1;
			}
			int rc = 0;
			for (int r = -1; r < runs; r++) {
				double t0 = now();
				if (prec)
					rc |= st_attention_forward_bf16(o, lse, qh, kh, vh, B, T, H, K, D, &ws);
				else
					rc |= st_attention_forward(o, lse, q, k, v, B, T, H, K, D, &ws);
				double t1 = now();
				if (prec)
					rc |= st_attention_backward_bf16(dq, dk, dv, g, o, lse, qh, kh, vh, B,
									 T, H, K, D, &ws);
				else
					rc |= st_attention_backward(dq, dk, dv, g, o, lse, q, k, v, B, T, H, K, D,
								    &ws);
				double t2 = now();
				if (r >= 0) {
					tf[r] = t1 - t0;
					tb[r] = t2 - t1;
					tt[r] = t2 - t0;
				}
			}
			st_ws_release(&ws);
			if (rc < 0) {
				fprintf(stderr, "%s\n", st_errmsg());
				return 1;
			}
			qsort(tf, (size_t)runs, sizeof(double), cmp_double);
			qsort(tb, (size_t)runs, sizeof(double), cmp_double);
			qsort(tt, (size_t)runs, sizeof(double), cmp_double);
			double f = tf[runs / 2], b = tb[runs / 2], t = tt[runs / 2];
			if (!prec)
				total32 = t;
			printf("%-7d %-5s %9.2f %9.2f %9.2f %9.1f %9.1f %9.1f", threads[ti],
			       prec ? "bf16" : "fp32", 1e3 * f, 1e3 * b, 1e3 * t, 2 * prod / f * 1e-9,
			       5 * prod / b * 1e-9, 7 * prod / t * 1e-9);
			if (prec && total32 > 0)
				printf(" %7.2fx", total32 / t);
			printf("\n");
		}
	}
	free(q), free(k), free(v), free(g), free(o), free(lse), free(dq), free(dk), free(dv);
	free(tf), free(tb), free(tt), free(qh), free(kh), free(vh);
	return 0;
}
