/*
 * bench/train_step - one device's training speed and memory, against the
 * machine's matrix-multiply rate and the PyTorch peer, in one run.
 *
 * For each thread count (OMP_NUM_THREADS, default 1 and 2):
 *   (a) slicetrain's steady-state step (median of the steps after the
 *       first) on llama3-125m, per_device_batch_size=4, max_target_length=512,
 *       remat none, fp32; and bf16 when `dtype=bfloat16` no longer warns that
 *       the bf16 path is not built;
 *   (b) oneDNN's own matrix-product rate at M=2048 tokens, N=2048, K=768
 *       (y = x W^T), fp32 through dnnl_sgemm and through the matmul primitive,
 *       and bf16 through the matmul primitive (median of 9 calls);
 *   (c) the PyTorch reference ../shared/bench/torch_llama_ref.py on the same
 *       shape (skipped, and said so, when absent).
 * Then, at the largest thread count, each remat policy at max_target_length
 * 1024: speed, peak resident memory (getrusage of the child) and what
 * `slicetrain plan` predicts.
 *
 * usage: bench/train_step [--threads 1,2] [--steps 5] [--torch-steps 2] [--no-torch]
 *                         [--no-remat] [--slicetrain build/slicetrain]
 * Run from the repository root (bench/train_step.sh builds and runs it).
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/err.h"
#include "config/config.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/gemm.h"
#include "train/plan.h"

#define MAXOUT (1 << 20)

typedef struct run {
	int rc;
	double step_s, tflops, tokens; /* medians over steady-state steps */
	int nsteps;
	double maxrss_gib;
	double cpu_share; /* CPU time / (wall time x threads): < 0.9 means other jobs competed */
	double act_mib;  /* "activations X MiB" from the log */
	int bf16_missing; /* the "not built yet" warning was printed */
	char out[MAXOUT];
} run;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	if (n <= 0)
		return 0;
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Run argv with OMP_NUM_THREADS=threads; output (stdout+stderr) into r->out,
 * peak RSS from wait4. */
static void spawn(run *r, char *const argv[], int threads)
{
	memset(r, 0, sizeof(*r));
	int fd[2];
	if (pipe(fd) < 0) {
		r->rc = -1;
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		char t[16];
		snprintf(t, sizeof(t), "%d", threads);
		setenv("OMP_NUM_THREADS", t, 1);
		dup2(fd[1], 1);
		dup2(fd[1], 2);
		close(fd[0]);
		close(fd[1]);
		execv(argv[0], argv);
		fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fd[1]);
	double t0 = now_s();
	size_t n = 0;
	ssize_t k;
	while ((k = read(fd[0], r->out + n, sizeof(r->out) - 1 - n)) > 0 || (k < 0 && errno == EINTR))
		if (k > 0 && (n += (size_t)k) >= sizeof(r->out) - 1)
			break;
	r->out[n] = 0;
	close(fd[0]);
	int status = 0;
	struct rusage ru;
	memset(&ru, 0, sizeof(ru));
	while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
		;
	double wall = now_s() - t0;
	r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	r->maxrss_gib = (double)ru.ru_maxrss / (1024.0 * 1024.0);
	double cpu = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
		     (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
	r->cpu_share = wall > 0 ? cpu / (wall * threads) : 0;
}

/* Parse MaxText step lines; skip step 0 (warm-up: page faults, JIT). */
static void parse_steps(run *r)
{
	double s[256], f[256], t[256];
	int n = 0;
	for (char *p = strstr(r->out, "completed step: "); p && n < 256;
	     p = strstr(p + 1, "completed step: ")) {
		int step;
		double secs, tf, tok;
		if (sscanf(p, "completed step: %d, seconds: %lf, TFLOP/s/device: %lf, Tokens/s/device: %lf",
			   &step, &secs, &tf, &tok) == 4 &&
		    step > 0) {
			s[n] = secs;
			f[n] = tf;
			t[n] = tok;
			n++;
		}
	}
	r->nsteps = n;
	r->step_s = median(s, n);
	r->tflops = median(f, n);
	r->tokens = median(t, n);
	char *a = strstr(r->out, "activations ");
	if (a)
		sscanf(a, "activations %lf MiB", &r->act_mib);
	r->bf16_missing = strstr(r->out, "bf16 path is not built") != NULL;
}

static void train(run *r, const char *bin, int threads, int steps, const char *seq,
		  const char *remat, const char *dtype)
{
	char a_steps[32], a_seq[64], a_remat[64], a_dtype[64];
	snprintf(a_steps, sizeof(a_steps), "steps=%d", steps);
	snprintf(a_seq, sizeof(a_seq), "max_target_length=%s", seq);
	snprintf(a_remat, sizeof(a_remat), "remat_policy=%s", remat);
	snprintf(a_dtype, sizeof(a_dtype), "dtype=%s", dtype);
	char *argv[] = {(char *)bin, "train", "configs/base.yml", "model_name=llama3-125m",
			"per_device_batch_size=4", a_seq, a_remat, a_steps, a_dtype,
			"dataset_type=synthetic", "base_output_directory=/tmp/slicetrain-bench",
			"run_name=bench", "enable_checkpointing=false", NULL};
	spawn(r, argv, threads);
	parse_steps(r);
}

/* GFLOP/s of C(2048,2048) = A(2048,768) B(2048,768)^T, median of 9 calls
 * after 2 warm-ups. dtype: 0 fp32 sgemm, 1 fp32 matmul primitive, 2 bf16. */
static double matmul_rate(int dtype, int threads, double *cpu_share)
{
	enum { M = 2048, N = 2048, K = 768 };
	omp_set_num_threads(threads);
	float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)N * K * 4), *C = malloc((size_t)M * N * 4);
	uint16_t *Ah = malloc((size_t)M * K * 2), *Bh = malloc((size_t)N * K * 2);
	for (int64_t i = 0; i < (int64_t)M * K; i++)
		A[i] = (float)((i * 7) % 13) * 0.01f;
	for (int64_t i = 0; i < (int64_t)N * K; i++)
		B[i] = (float)((i * 5) % 11) * 0.01f;
	st_f32_to_bf16_array(Ah, A, (int64_t)M * K);
	st_f32_to_bf16_array(Bh, B, (int64_t)N * K);
	st_gemm_set_f32_backend(dtype == 1 ? ST_GEMM_MATMUL : ST_GEMM_SGEMM);
	double t[9];
	int rc = 0;
	struct rusage ru0, ru1;
	getrusage(RUSAGE_SELF, &ru0);
	double w0 = now_s();
	for (int i = 0; i < 11; i++) {
		double t0 = now_s();
		rc |= dtype == 2 ? st_gemm_bf16('N', 'T', M, N, K, 1.0f, Ah, K, Bh, K, 0.0f, C, N)
				 : st_gemm('N', 'T', M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
		if (i >= 2)
			t[i - 2] = now_s() - t0;
	}
	getrusage(RUSAGE_SELF, &ru1);
	double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
		     1e-6 * (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) +
		     (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
		     1e-6 * (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec);
	*cpu_share = cpu / ((now_s() - w0) * threads);
	st_gemm_set_f32_backend(ST_GEMM_SGEMM);
	free(A), free(B), free(C), free(Ah), free(Bh);
	return rc ? 0 : 2.0 * M * N * K / median(t, 9) / 1e9;
}

static void torch_ref(run *r, int threads, int steps, double *tokens, double *gflops)
{
	char a_thr[16], a_steps[16];
	snprintf(a_thr, sizeof(a_thr), "%d", threads);
	snprintf(a_steps, sizeof(a_steps), "%d", steps);
	char *argv[] = {"/usr/bin/python3", "../shared/bench/torch_llama_ref.py", "--threads", a_thr,
			"--steps", a_steps, NULL};
	spawn(r, argv, threads);
	*tokens = *gflops = 0;
	char *p = strstr(r->out, "tokens/s=");
	if (p)
		sscanf(p, "tokens/s=%lf model_GFLOP/s=%lf", tokens, gflops);
}

static double plan_total(const char *seq, const char *remat, double *act_bytes)
{
	st_config c;
	char a_seq[64], a_remat[64];
	snprintf(a_seq, sizeof(a_seq), "max_target_length=%s", seq);
	snprintf(a_remat, sizeof(a_remat), "remat_policy=%s", remat);
	char *ov[] = {"model_name=llama3-125m", "per_device_batch_size=4", a_seq, a_remat,
		      "base_output_directory=/tmp/slicetrain-bench", "run_name=bench"};
	st_plan p;
	if (st_config_load(&c, "configs/base.yml", 6, ov) < 0 || st_plan_compute(&p, &c, 1, 1, 0) < 0) {
		fprintf(stderr, "plan: %s\n", st_errmsg());
		return 0;
	}
	*act_bytes = (double)p.activations;
	return (double)p.total;
}

static void fail_tail(const run *r, const char *what)
{
	size_t n = strlen(r->out);
	fprintf(stderr, "%s failed (exit %d); last output:\n%s\n", what, r->rc,
		r->out + (n > 1500 ? n - 1500 : 0));
}

int main(int argc, char **argv)
{
	int threads[8] = {1, 2}, nthreads = 2, steps = 5, torch_steps = 2, do_torch = 1, do_remat = 1;
	const char *bin = "build/slicetrain";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			nthreads = 0;
			for (char *s = strtok(argv[++i], ","); s && nthreads < 8; s = strtok(NULL, ","))
				threads[nthreads++] = atoi(s);
		} else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
			steps = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--torch-steps") && i + 1 < argc) {
			torch_steps = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--no-torch")) {
			do_torch = 0;
		} else if (!strcmp(argv[i], "--no-remat")) {
			do_remat = 0;
		} else if (!strcmp(argv[i], "--slicetrain") && i + 1 < argc) {
			bin = argv[++i];
		} else {
			fprintf(stderr, "usage: %s [--threads 1,2] [--steps 5] [--torch-steps 2] [--no-torch] "
					"[--no-remat] [--slicetrain build/slicetrain]\n", argv[0]);
			return 2;
		}
	}
	if (steps < 2)
		steps = 2;
	st_config_set_config_dir("configs");
	int have_torch = do_torch && access("../shared/bench/torch_llama_ref.py", R_OK) == 0 &&
			 access("/usr/bin/python3", X_OK) == 0;

	/* is bf16 built? a one-step run of the tiny model says so */
	run *r = malloc(sizeof(*r));
	char *probe[] = {(char *)bin, "train", "configs/base.yml", "model_name=llama3-test",
			 "per_device_batch_size=1", "max_target_length=16", "steps=1", "dtype=bfloat16",
			 "dataset_type=synthetic", "base_output_directory=/tmp/slicetrain-bench",
			 "run_name=bench-probe", "enable_checkpointing=false", NULL};
	spawn(r, probe, 1);
	parse_steps(r);
	int bf16_model = r->rc == 0 && !r->bf16_missing;
	int cpu_bf16 = st_cpu_has_bf16();

	printf("bench/train_step: llama3-125m, batch 4 x 512, remat none; %s\n",
	       cpu_bf16 ? "CPU has AVX512_BF16" : st_cpu_bf16_message());
	printf("steady state: median of %d steps after the first; matmul: M=2048 N=2048 K=768, "
	       "median of 9\n", steps - 1);
	if (have_torch) {
		/* PyTorch's speed depends on the BLAS Debian's alternatives select */
		char blas[512] = "";
		ssize_t n = readlink("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", blas, sizeof(blas) - 1);
		if (n > 0)
			blas[n] = 0;
		printf("pytorch: median of %d steps after the first; libblas.so.3 -> %s%s\n", torch_steps,
		       n > 0 ? blas : "?",
		       n > 0 && strstr(blas, "/blas/") ? " (netlib reference BLAS: slow, single-threaded)" : "");
	}
	printf("\n");
	printf("%-3s %-9s %9s %9s %10s %8s %8s %9s %9s %5s\n", "thr", "run", "step s", "tokens/s",
	       "model GF/s", "vs mm", "vs torch", "peak GiB", "mm GF/s", "cpu");
	for (int ti = 0; ti < nthreads; ti++) {
		int th = threads[ti];
		double cs[3] = {0, 0, 0};
		double mm_sgemm = matmul_rate(0, th, &cs[0]), mm_prim = matmul_rate(1, th, &cs[1]);
		double mm_bf16 = cpu_bf16 ? matmul_rate(2, th, &cs[2]) : 0;
		double mm_f32 = mm_sgemm > mm_prim ? mm_sgemm : mm_prim;
		/* slicetrain first, PyTorch (slow) last */
		run *st = malloc(2 * sizeof(run)); /* 1 MiB of output each */
		int ok[2] = {0, 0};
		for (int bf = 0; bf < 2; bf++) {
			if (bf && !bf16_model)
				continue;
			train(&st[bf], bin, th, steps, "512", "none", bf ? "bfloat16" : "float32");
			ok[bf] = st[bf].rc == 0 && st[bf].nsteps > 0;
			if (!ok[bf])
				fail_tail(&st[bf], "slicetrain");
		}
		double torch_tok = 0, torch_gf = 0, torch_rss = 0, torch_cpu = 0;
		if (have_torch) {
			torch_ref(r, th, torch_steps, &torch_tok, &torch_gf);
			torch_rss = r->maxrss_gib;
			torch_cpu = r->cpu_share;
			if (r->rc != 0 || torch_tok <= 0)
				fail_tail(r, "PyTorch reference");
		}
		printf("%-3d %-9s %9s %9s %10s %8s %8s %9s %9.1f %5.2f  sgemm fp32\n", th, "oneDNN", "", "",
		       "", "", "", "", mm_sgemm, cs[0]);
		printf("%-3d %-9s %9s %9s %10s %8s %8s %9s %9.1f %5.2f  matmul fp32\n", th, "oneDNN", "", "",
		       "", "", "", "", mm_prim, cs[1]);
		if (cpu_bf16)
			printf("%-3d %-9s %9s %9s %10s %8s %8s %9s %9.1f %5.2f  matmul bf16\n", th, "oneDNN", "",
			       "", "", "", "", "", mm_bf16, cs[2]);
		if (have_torch && torch_tok > 0)
			printf("%-3d %-9s %9.3f %9.1f %10.1f %8.2f %8s %9.2f %9s %5.2f\n", th, "pytorch",
			       2048.0 / torch_tok, torch_tok, torch_gf, torch_gf / mm_f32, "1.00", torch_rss, "",
			       torch_cpu);
		else
			printf("%-3d %-9s %s\n", th, "pytorch",
			       do_torch ? "absent (../shared/bench/torch_llama_ref.py or /usr/bin/python3)"
					: "skipped (--no-torch)");
		for (int bf = 0; bf < 2; bf++) {
			if (bf && !bf16_model) {
				printf("%-3d %-9s not run: dtype=bfloat16 still runs in float32 (the model's bf16 path "
				       "is not built)\n", th, "st bf16");
				continue;
			}
			if (!ok[bf])
				continue;
			run *q = &st[bf];
			double mm = bf ? mm_bf16 : mm_f32;
			char vs_torch[16] = "-";
			if (torch_tok > 0)
				snprintf(vs_torch, sizeof(vs_torch), "%.2f", q->tokens / torch_tok);
			printf("%-3d %-9s %9.3f %9.1f %10.1f %8.2f %8s %9.2f %9s %5.2f\n", th,
			       bf ? "st bf16" : "st fp32", q->step_s, q->tokens, q->tflops * 1000,
			       mm > 0 ? q->tflops * 1000 / mm : 0, vs_torch, q->maxrss_gib, "", q->cpu_share);
		}
		if (ok[0] && ok[1])
			printf("%-3d bf16 / fp32 tokens/s: %.2fx\n", th, st[1].tokens / st[0].tokens);
		free(st);
		fflush(stdout);
	}
	printf("\n(vs mm: model GFLOP/s / the faster oneDNN fp32 rate of the same thread count, "
	       "bf16 runs / the bf16 rate; vs torch: tokens/s / PyTorch's;\n cpu: the child's CPU time / "
	       "(wall time x threads), below about 0.9 when other jobs took cores)\n");

	if (do_remat) {
		int th = threads[nthreads - 1];
		printf("\nremat policies: llama3-125m, batch 4 x 1024, fp32, %d threads\n", th);
		printf("%-8s %9s %9s %10s %9s %9s %7s %11s %11s %5s\n", "remat", "step s", "tokens/s",
		       "model GF/s", "peak GiB", "plan GiB", "rss/pl", "act MiB", "plan act", "cpu");
		const char *pol[] = {"none", "minimal", "full"};
		double act[3] = {0};
		for (int i = 0; i < 3; i++) {
			double pact = 0, ptot = plan_total("1024", pol[i], &pact);
			act[i] = pact;
			train(r, bin, th, steps > 3 ? 3 : steps, "1024", pol[i], "float32");
			if (r->rc != 0 || r->nsteps == 0) {
				fail_tail(r, "slicetrain");
				continue;
			}
			printf("%-8s %9.3f %9.1f %10.1f %9.2f %9.2f %7.2f %11.1f %11.1f %5.2f\n", pol[i],
			       r->step_s, r->tokens, r->tflops * 1000, r->maxrss_gib, ptot / (1 << 30),
			       ptot > 0 ? r->maxrss_gib * (1 << 30) / ptot : 0, r->act_mib, pact / (1 << 20),
			       r->cpu_share);
			fflush(stdout);
		}
		if (act[2] > 0)
			printf("activation memory none / full: %.2fx (plan)\n", act[0] / act[2]);
	}
	free(r);
	return 0;
}
