/*
 * mpi_allreduce - MPI_Allreduce (float, sum) timed like bench/collectives.c,
 * as the baseline for our allreduce. Build and run (bench/README.md):
 *
 *   mpicc -O2 -o build/bench/mpi_allreduce bench/mpi_allreduce.c
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/mpi_allreduce [-b 4K] [-e 256M] [-f 4] [-w 3] [-i 20]
 *
 * Each timed iteration is preceded by MPI_Barrier; its time is the slowest
 * rank's; the table shows the median over the timed iterations. Columns as
 * nccl-tests: size (bytes per rank), count, type, redop, time (us), algbw =
 * size / time, busbw = algbw * 2(n-1)/n (GB/s = 1e9 B/s).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	long lo = 4096, hi = 256L << 20, factor = 4;
	int warm = 3, iters = 20;
	MPI_Init(&argc, &argv);
	int bad = 0;
	for (int i = 1; i < argc && !bad; i += 2) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			bad = 1, fprintf(stderr, "%s: expected a value\n", o);
		else if (!strcmp(o, "-b"))
			bad = bench_size("-b", v, 4, 1L << 40, &lo) < 0;
		else if (!strcmp(o, "-e"))
			bad = bench_size("-e", v, 4, 1L << 40, &hi) < 0;
		else if (!strcmp(o, "-f"))
			bad = bench_long("-f", v, 2, 1L << 20, &factor) < 0;
		else if (!strcmp(o, "-w"))
			bad = bench_int("-w", v, 0, 1000000, &warm) < 0;
		else if (!strcmp(o, "-i"))
			bad = bench_int("-i", v, 1, 1000000, &iters) < 0;
		else
			bad = 1, fprintf(stderr, "usage: mpi_allreduce [-b 4K] [-e 256M] [-f 4] [-w 3] [-i 20]\n");
	}
	if (bad || hi < lo) {
		fprintf(stderr, "mpi_allreduce: bad arguments\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int rank, n;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	float *buf = malloc((size_t)hi);
	double *t = malloc(sizeof(double) * (size_t)iters), *tmax = malloc(sizeof(double) * (size_t)iters);
	if (!buf || !t || !tmax)
		MPI_Abort(MPI_COMM_WORLD, 1);
	for (long i = 0; i < hi / 4; i++)
		buf[i] = 0.5f;
	if (rank == 0) {
		printf("# MPI_Allreduce, %d ranks (OpenMPI, in place, float sum), warmup %d, median of %d\n", n, warm, iters);
		printf("#%11s %12s %6s %6s %10s %8s %8s\n", "size", "count", "type", "redop", "time", "algbw", "busbw");
		printf("#%11s %12s %6s %6s %10s %8s %8s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)");
	}
	for (long s = lo; s <= hi; s *= factor) {
		int count = (int)(s / 4);
		for (int w = 0; w < warm; w++)
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		for (int it = 0; it < iters; it++) {
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			t[it] = MPI_Wtime() - t0;
		}
		MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			qsort(tmax, (size_t)iters, sizeof(double), cmp);
			double med = tmax[iters / 2], alg = (double)s / med / 1e9;
			printf("%12ld %12d %6s %6s %10.1f %8.2f %8.2f\n", s, count, "float", "sum", med * 1e6, alg,
			       alg * 2.0 * (n - 1) / n);
			fflush(stdout);
		}
	}
	free(buf);
	free(t);
	free(tmax);
	MPI_Finalize();
	return 0;
}
