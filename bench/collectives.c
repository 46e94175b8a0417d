/*
 * collectives - bandwidth of our allreduce, reduce_scatter and allgather,
 * nccl-tests style, and OpenMPI's MPI_Allreduce on the same sizes.
 *
 *   build/bench/collectives [-n 2,4] [-m shm,tcp] [-c allreduce,reduce_scatter,allgather]
 *                           [-b 4K] [-e 256M] [-f 4] [-w 3] [-i 20] [--shared] [--mpi build/bench/mpi_allreduce]
 *
 * For each rank count (-n) and layout (-m: shm = one slice, shared memory;
 * tcp = one slice per rank, the cross-slice TCP path; hier = two slices,
 * shared memory inside and TCP across) it forks that many processes on this
 * machine, which join a group on a free port; when the ranks fit the CPUs,
 * rank r is bound to CPU r, as mpirun binds by default (--no-pin: not).
 * Every timed iteration is
 * preceded by a barrier; its time is the slowest rank's; the table shows the
 * median over the timed iterations (fixed counts: -w warmup, -i timed).
 * Columns as nccl-tests (doc/PERFORMANCE.md): size is the bytes per rank for
 * allreduce and the total bytes (count x type size x ranks) for
 * reduce_scatter and allgather; algbw = size / time; busbw = algbw x
 * 2(n-1)/n (allreduce) or (n-1)/n (reduce_scatter, allgather); GB/s = 1e9 B/s.
 * With --mpi, `mpirun --allow-run-as-root --oversubscribe -np N PROGRAM` runs
 * afterwards for each N (with --mpi-first: before ours), and a summary
 * compares allreduce busbw; bench/collectives.sh repeats the pair,
 * alternating which side runs first, and prints the medians. With
 * --shared each rank's buffer comes from st_pages_alloc and is shared with
 * st_comm_share (the trainer's gradient buffers, comm.h), so an in-slice
 * allreduce takes the path without slots; the other collectives and the
 * layouts across slices are unchanged by it.
 * Build: see bench/README.md.
 */
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_cpu.h"
#include "base/err.h"
#include "base/pages.h"
#include "comm/comm.h"

enum { MAXN = 64, MAXROWS = 64 };

typedef struct row { long size; double busbw; } row;

/* Results shared between the forked ranks and the parent. */
typedef struct shared {
	double join_ms;
	int nrows[3];
	row rows[3][MAXROWS];
} shared;

static long lo = 4096, hi = 256L << 20, factor = 4;
static int warm = 3, iters = 20, pin = 1, share = 0;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &l) < 0)
		return 29500;
	close(fd);
	return ntohs(a.sin_port);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static const char *names[3] = { "allreduce", "reduce_scatter", "allgather" };

static int run_op(st_comm *c, int op, float *a, float *b, long count, int64_t *counts)
{
	switch (op) {
	case 0: return st_comm_allreduce(c, a, count, ST_DTYPE_F32, ST_SUM);
	case 1: return st_comm_reduce_scatter(c, a, b, counts, ST_DTYPE_F32);
	default: return st_comm_allgather(c, b, a, counts, ST_DTYPE_F32);
	}
}

/* One rank's whole sweep; rank 0 prints. */
static int rank_main(int rank, int n, int slices, int port, const int *ops, shared *sh, const char *label)
{
	st_group_env e = { .rank = rank, .world_size = n, .num_slices = slices, .local_rank = rank };
	e.slice_id = rank / (n / slices);
	snprintf(e.coordinator, sizeof(e.coordinator), "127.0.0.1:%d", port);
	e.source = "bench";
	st_group_opts o = { .env = &e };
	st_group *g;
	double t0 = now();
	if (st_group_join(&g, &o) < 0) {
		fprintf(stderr, "rank %d: %s\n", rank, st_errmsg());
		return 1;
	}
	double join_ms = (now() - t0) * 1e3;
	int ranks[MAXN];
	for (int i = 0; i < n; i++)
		ranks[i] = i;
	st_comm *c;
	if (st_comm_create(&c, g, n, ranks) < 0) {
		fprintf(stderr, "rank %d: %s\n", rank, st_errmsg());
		return 1;
	}
	/* the slowest join, as rank 0 sees it */
	double jm = join_ms;
	st_comm_allreduce(c, &jm, 1, ST_DTYPE_F64, ST_MAX);
	if (rank == 0)
		sh->join_ms = jm;
	float *a = share ? st_pages_alloc((size_t)hi) : malloc((size_t)hi), *b = malloc((size_t)hi / (size_t)n + 64);
	double *t = malloc(sizeof(double) * (size_t)iters);
	int64_t counts[MAXN];
	if (!a || !b || !t)
		return 1;
	if (share && st_comm_share(c, a, (size_t)hi) < 0) {
		fprintf(stderr, "rank %d: %s\n", rank, st_errmsg());
		return 1;
	}
	for (long i = 0; i < hi / 4; i++)
		a[i] = 0.5f;
	memset(b, 0, (size_t)hi / (size_t)n + 64);
	for (int op = 0; op < 3; op++) {
		if (!ops[op])
			continue;
		if (rank == 0) {
			printf("\n# %s, %d ranks, %s: warmup %d, median of %d\n", names[op], n, label, warm, iters);
			printf("#%11s %12s %6s %6s %10s %8s %8s\n", "size", "count", "type", "redop", "time", "algbw", "busbw");
			printf("#%11s %12s %6s %6s %10s %8s %8s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)");
		}
		for (long s = lo; s <= hi; s *= factor) {
			long count = op == 0 ? s / 4 : s / 4 / n; /* per rank */
			if (count < 1)
				continue;
			for (int i = 0; i < n; i++)
				counts[i] = count;
			int rc = 0;
			for (int w = 0; w < warm && !rc; w++)
				rc = run_op(c, op, a, b, count, counts);
			for (int it = 0; it < iters && !rc; it++) {
				rc = st_comm_barrier(c);
				double t1 = now();
				if (!rc)
					rc = run_op(c, op, a, b, count, counts);
				t[it] = now() - t1;
			}
			if (!rc)
				rc = st_comm_allreduce(c, t, iters, ST_DTYPE_F64, ST_MAX);
			if (rc) {
				fprintf(stderr, "rank %d: %s\n", rank, st_errmsg());
				return 1;
			}
			if (rank == 0) {
				qsort(t, (size_t)iters, sizeof(double), cmp);
				double med = t[iters / 2], bytes = op == 0 ? (double)s : (double)count * 4 * n;
				double alg = bytes / med / 1e9, bus = alg * (op == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n);
				printf("%12.0f %12ld %6s %6s %10.1f %8.2f %8.2f\n", bytes, op == 0 ? count : count * n, "float",
				       op == 2 ? "none" : "sum", med * 1e6, alg, bus);
				fflush(stdout);
				if (sh->nrows[op] < MAXROWS)
					sh->rows[op][sh->nrows[op]++] = (row){ (long)bytes, bus };
			}
		}
	}
	if (share)
		st_pages_free(a, (size_t)hi);
	else
		free(a);
	free(b);
	free(t);
	st_comm_free(c);
	st_group_leave(g);
	return 0;
}

static int run_layout(int n, const char *mode, const int *ops, shared *sh)
{
	int slices = !strcmp(mode, "shm") ? 1 : !strcmp(mode, "tcp") ? n : 2;
	char label[96];
	if (slices == 1)
		snprintf(label, sizeof(label), "in-slice (shared memory%s)", share ? "; buffer shared: st_comm_share" : "");
	else if (slices == n)
		snprintf(label, sizeof(label), "cross-slice (TCP, %d slices of 1)", slices);
	else
		snprintf(label, sizeof(label), "%d slices of %d (shared memory inside, TCP across)", slices, n / slices);
	if (n % slices || n > MAXN) {
		fprintf(stderr, "collectives: %d ranks cannot form %d slices\n", n, slices);
		return 1;
	}
	memset(sh, 0, sizeof(*sh));
	int port = free_port();
	pid_t pid[MAXN];
	fflush(stdout);
	for (int r = 0; r < n; r++) {
		pid[r] = fork();
		if (pid[r] == 0) {
			/* like mpirun's default binding: a core per rank when they fit */
			long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
			if (pin && n <= ncpu) {
				cpu_set_t cs;
				CPU_ZERO(&cs);
				CPU_SET(r, &cs);
				sched_setaffinity(0, sizeof(cs), &cs);
			}
			_exit(rank_main(r, n, slices, port, ops, sh, label));
		}
	}
	int bad = 0;
	for (int r = 0; r < n; r++) {
		int st;
		waitpid(pid[r], &st, 0);
		bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	printf("# group of %d joined in %.1f ms (slowest rank, st_group_join)\n", n, sh->join_ms);
	return bad;
}

/* Run the MPI baseline; returns its busbw per size in rows. */
static int run_mpi(const char *prog, int n, row *rows, int *nrows)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
		 "mpirun --allow-run-as-root --oversubscribe -np %d %s -b %ld -e %ld -f %ld -w %d -i %d 2>&1", n, prog,
		 lo, hi, factor, warm, iters);
	printf("\n# %s\n", cmd);
	fflush(stdout);
	FILE *p = popen(cmd, "r");
	if (!p)
		return 1;
	char line[512];
	*nrows = 0;
	while (fgets(line, sizeof(line), p)) {
		fputs(line, stdout);
		long size, count;
		double time, alg, bus;
		char type[16], red[16];
		if (line[0] != '#' && sscanf(line, "%ld %ld %15s %15s %lf %lf %lf", &size, &count, type, red, &time, &alg, &bus) == 7 &&
		    *nrows < MAXROWS)
			rows[(*nrows)++] = (row){ size, bus };
	}
	return pclose(p) != 0;
}

int main(int argc, char **argv)
{
	int ns[8] = { 2, 4 }, nn = 2, ops[3] = { 1, 1, 1 };
	static const char *const mode_names[3] = { "shm", "tcp", "hier" };
	static const char *const op_names[3] = { "allreduce", "reduce_scatter", "allgather" };
	int mode_on[3] = { 1, 1, 0 };
	const char *mpi = NULL;
	int mpi_first = 0;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--shared")) {
			share = 1;
			continue;
		}
		if (!strcmp(argv[i], "--no-pin")) {
			pin = 0;
			continue;
		} else if (!strcmp(argv[i], "--mpi-first")) {
			mpi_first = 1;
			continue;
		} else if (!strcmp(argv[i], "--mpi") && v) {
			mpi = v;
		} else if (!strcmp(argv[i], "-n") && v) {
			if ((nn = bench_int_list("-n", v, 2, MAXN, ns, 8)) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-m") && v) {
			if (bench_names("-m", v, mode_names, 3, mode_on) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-c") && v) {
			if (bench_names("-c", v, op_names, 3, ops) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-b") && v) {
			if (bench_size("-b", v, 4, 1L << 40, &lo) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-e") && v) {
			if (bench_size("-e", v, 4, 1L << 40, &hi) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-f") && v) {
			if (bench_long("-f", v, 2, 1L << 20, &factor) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-w") && v) {
			if (bench_int("-w", v, 0, 1000000, &warm) < 0)
				return 2;
		} else if (!strcmp(argv[i], "-i") && v) {
			if (bench_int("-i", v, 1, 1000000, &iters) < 0)
				return 2;
		} else {
			fprintf(stderr, "usage: %s [-n 2,4] [-m shm,tcp,hier] [-c allreduce,reduce_scatter,allgather] "
					"[-b 4K] [-e 256M] [-f 4] [-w 3] [-i 20] [--no-pin] [--shared] [--mpi PROGRAM [--mpi-first]]\n",
				argv[0]);
			return 2;
		}
		i++;
	}
	if (mpi_first && !mpi) {
		fprintf(stderr, "collectives: --mpi-first needs --mpi PROGRAM\n");
		return 2;
	}
	if (lo < 4 || hi < lo || factor < 2 || warm < 0 || iters < 1) {
		fprintf(stderr, "collectives: bad sizes or counts\n");
		return 2;
	}
	for (int i = 0; i < nn; i++)
		if (ns[i] < 2 || ns[i] > MAXN) {
			fprintf(stderr, "collectives: -n values must be 2..%d\n", MAXN);
			return 2;
		}
	setvbuf(stdout, NULL, _IOLBF, 0);
	shared *sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	char cpu[512];
	bench_cpu_model(cpu, sizeof(cpu));
	printf("# slicetrain collectives: sizes %ld..%ld x%ld, float\n# cpu: %s\n", lo, hi, factor, cpu);
	static row ours[8][MAXROWS], theirs[8][MAXROWS];
	int nours[8] = { 0 }, ntheirs[8] = { 0 }, bad = 0;
	if (mpi && mpi_first)
		for (int k = 0; k < nn; k++)
			bad += run_mpi(mpi, ns[k], theirs[k], &ntheirs[k]);
	for (int k = 0; k < nn; k++)
		for (int m = 0; m < 3; m++) {
			if (!mode_on[m])
				continue;
			bad += run_layout(ns[k], mode_names[m], ops, sh);
			if (m == 0) {
				nours[k] = sh->nrows[0];
				memcpy(ours[k], sh->rows[0], sizeof(ours[k]));
			}
		}
	if (mpi) {
		if (!mpi_first)
			for (int k = 0; k < nn; k++)
				bad += run_mpi(mpi, ns[k], theirs[k], &ntheirs[k]);
		for (int k = 0; k < nn; k++) {
			if (!nours[k] || !ntheirs[k])
				continue;
			printf("\n# allreduce busbw, %d ranks in one slice: slicetrain vs OpenMPI MPI_Allreduce (GB/s)\n", ns[k]);
			printf("#%11s %10s %10s %8s\n", "size", "slicetrain", "OpenMPI", "ratio");
			for (int i = 0; i < nours[k]; i++)
				for (int j = 0; j < ntheirs[k]; j++)
					if (ours[k][i].size == theirs[k][j].size)
						printf("%12ld %10.2f %10.2f %8.2f\n", ours[k][i].size, ours[k][i].busbw,
						       theirs[k][j].busbw, ours[k][i].busbw / theirs[k][j].busbw);
		}
	}
	return bad ? 1 : 0;
}
