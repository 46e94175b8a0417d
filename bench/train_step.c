/*
 * bench/train_step - one device's training speed and memory, against the
 * machine's matrix-multiply rate and PyPI PyTorch 2.x, in one run.
 *
 * --reps N (default 3) repetitions, interleaved: each repetition measures, for
 * each thread count (OMP_NUM_THREADS of the children, default 1 and 2):
 *   (a) oneDNN's own matrix-product rate at M=2048 tokens, N=2048, K=768
 *       (y = x W^T), fp32 through dnnl_sgemm and through the matmul primitive,
 *       and bf16 through the matmul primitive (median of 9 calls);
 *   (b) slicetrain's steady-state step (median of the steps after the
 *       first) on llama3-125m, per_device_batch_size=4, max_target_length=512,
 *       remat none, fp32; and bf16 when `dtype=bfloat16` no longer warns that
 *       the bf16 path is not built;
 *   (c) the PyTorch peer, bench/torch_peer.py in .venv-bench (PyPI torch,
 *       pinned by scripts/install-deps.sh --bench), on the same model (its
 *       shape from slicetrain's config) and batch, torch.set_num_threads as
 *       slicetrain's threads: eager fp32, torch.compile fp32, eager bf16
 *       autocast, torch.compile + bf16 autocast; warm-up (compilation)
 *       excluded (skipped, and said so, when .venv-bench is absent).
 * Every run is printed, then the medians over the repetitions and the ratios
 * slicetrain / PyTorch. Then, at the largest thread count, each remat policy
 * at max_target_length 1024: speed, peak resident memory (getrusage of the
 * child) and what `slicetrain plan` predicts. The header names the CPU.
 *
 * usage: bench/train_step [--threads 1,2] [--reps 3] [--steps 5] [--peer-steps 4]
 *                         [--peer-warmup 2] [--peer-modes eager,compile,bf16,compile-bf16]
 *                         [--st-modes fp32,bf16,bf16-fp32-kern]
 *                         [--python .venv-bench/bin/python] [--no-torch] [--no-remat]
 *                         [--slicetrain build/slicetrain]
 * --st-modes picks slicetrain's rows (default all three); a bad number or an
 * unknown mode is an error (exit 2).
 * Run from the repository root (bench/train_step.sh builds and runs it).
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_args.h"
#include "bench_cpu.h"
#include "base/err.h"
#include "config/config.h"
#include "kernels/cpu/amx.h"
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

/* The runs' output directory (base_output_directory), made by mkdtemp at the
 * start and removed at exit; PyTorch's inductor keeps its compiled kernels
 * under it too (TORCHINDUCTOR_CACHE_DIR, and TMPDIR for its precompiled
 * headers), so nothing is left in /tmp. */
static char outdir[] = "/tmp/slicetrain-bench.XXXXXX";
static char a_outdir[64];
static volatile sig_atomic_t stop_sig;
static volatile pid_t child;

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	remove(path);
	return 0;
}

static void remove_outdir(void) { nftw(outdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* SIGINT, SIGTERM, SIGHUP: stop the running child; the bench exits (and
 * removes outdir) when that child is gone. */
static void on_signal(int sig)
{
	stop_sig = sig;
	if (child > 0)
		kill(child, SIGTERM);
}

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
	if (pid > 0)
		child = pid;
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
	child = 0;
	if (stop_sig) {
		fprintf(stderr, "bench/train_step: stopped by signal %d\n", (int)stop_sig);
		exit(128 + stop_sig);
	}
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
		  const char *remat, const char *dtype, const char *extra)
{
	char a_steps[32], a_seq[64], a_remat[64], a_dtype[64];
	snprintf(a_steps, sizeof(a_steps), "steps=%d", steps);
	snprintf(a_seq, sizeof(a_seq), "max_target_length=%s", seq);
	snprintf(a_remat, sizeof(a_remat), "remat_policy=%s", remat);
	snprintf(a_dtype, sizeof(a_dtype), "dtype=%s", dtype);
	char *argv[] = {(char *)bin, "train", "configs/base.yml", "model_name=llama3-125m",
			"per_device_batch_size=4", a_seq, a_remat, a_steps, a_dtype,
			"dataset_type=synthetic", a_outdir,
			"run_name=bench", "enable_checkpointing=false", (char *)extra, NULL};
	spawn(r, argv, threads);
	parse_steps(r);
}

/* GFLOP/s of C(2048,2048) = A(2048,768) B(2048,768)^T, median of 9 calls
 * after 2 warm-ups. dtype: 0 fp32 sgemm, 1 fp32 matmul primitive, 2 bf16
 * (oneDNN's matmul), 3 bf16 (slicetrain's AMX kernel, st_gemm_bf16's path
 * where the CPU has AMX). */
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
	enum st_gemm_backend be = st_gemm_f32_backend();
	st_gemm_set_f32_backend(dtype == 1 ? ST_GEMM_MATMUL : ST_GEMM_SGEMM);
	st_amx_set_enabled(dtype == 3);
	/* the products' context, sized for this shape on the path just chosen */
	st_gemm_shape sh = {dtype >= 2 ? ST_GEMM_BF16 : ST_GEMM_F32, 'N', 'T', M, N, K};
	st_kctx kc = ST_KCTX_INIT;
	int rc = st_kctx_init(&kc, st_gemm_workspace_bytes(&sh, threads), threads) < 0;
	double t[9] = {0};
	struct rusage ru0, ru1;
	getrusage(RUSAGE_SELF, &ru0);
	double w0 = now_s();
	for (int i = 0; i < 11; i++) {
		double t0 = now_s();
		rc |= dtype >= 2 ? st_gemm_bf16('N', 'T', M, N, K, 1.0f, Ah, K, Bh, K, 0.0f, C, N, &kc)
				 : st_gemm('N', 'T', M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, &kc);
		if (i >= 2)
			t[i - 2] = now_s() - t0;
	}
	getrusage(RUSAGE_SELF, &ru1);
	double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
		     1e-6 * (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) +
		     (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
		     1e-6 * (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec);
	*cpu_share = cpu / ((now_s() - w0) * threads);
	st_gemm_set_f32_backend(be);
	st_amx_set_enabled(1);
	st_kctx_release(&kc);
	free(A), free(B), free(C), free(Ah), free(Bh);
	return rc ? 0 : 2.0 * M * N * K / median(t, 9) / 1e9;
}

/* The PyPI PyTorch peer (bench/torch_peer.py in .venv-bench) in one mode; the model's
 * shape is passed from slicetrain's own config. */
static void torch_peer(run *r, const char *python, const st_config *c, const char *mode,
		       int threads, int steps, int warmup, double *tokens)
{
	/* --flag value pairs after the script, mode and thread count */
	const struct { const char *flag; double v; } kv[] = {
		{"--threads", threads}, {"--steps", steps}, {"--warmup", warmup}, {"--emb", (double)c->emb_dim},
		{"--layers", (double)c->num_decoder_layers}, {"--heads", (double)c->num_query_heads},
		{"--kv", (double)c->num_kv_heads}, {"--head_dim", (double)c->head_dim}, {"--mlp", (double)c->mlp_dim},
		{"--vocab", (double)c->vocab_size}, {"--theta", c->rope_theta}, {"--eps", c->norm_eps},
		{"--batch", 4}, {"--seq", 512}};
	enum { NKV = sizeof(kv) / sizeof(kv[0]) };
	char val[NKV][32], *argv[4 + 2 * NKV + 1] = {(char *)python, "bench/torch_peer.py", "--mode", (char *)mode};
	for (int i = 0; i < NKV; i++) {
		snprintf(val[i], sizeof(val[i]), "%.17g", kv[i].v);
		argv[4 + 2 * i] = (char *)kv[i].flag;
		argv[5 + 2 * i] = val[i];
	}
	argv[4 + 2 * NKV] = NULL;
	spawn(r, argv, threads);
	*tokens = 0;
	char *p = strstr(r->out, "median_step_s=");
	if (p)
		sscanf(p, "median_step_s=%*f tokens/s=%lf", tokens);
}

static double load1(void)
{
	double l[1] = {0};
	return getloadavg(l, 1) == 1 ? l[0] : -1;
}

static double plan_total(const char *seq, const char *remat, double *act_bytes)
{
	st_config c;
	char a_seq[64], a_remat[64];
	snprintf(a_seq, sizeof(a_seq), "max_target_length=%s", seq);
	snprintf(a_remat, sizeof(a_remat), "remat_policy=%s", remat);
	char *ov[] = {"model_name=llama3-125m", "per_device_batch_size=4", a_seq, a_remat,
		      a_outdir, "run_name=bench"};
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

/* one measured row of one repetition at one thread count */
enum { R_SGEMM, R_MATMUL, R_MMBF16, R_AMXBF16, R_TMM32, R_TMM16, R_ST32, R_STBF16, R_STB32, R_PEER0, NROWS = R_PEER0 + 4 };
static const char *const peer_modes[4] = {"eager", "compile", "bf16", "compile-bf16"};
static const char *const st_modes[3] = {"fp32", "bf16", "bf16-fp32-kern"}; /* rows R_ST32 .. R_STB32 */
static const char *row_name[NROWS] = {"oneDNN sgemm fp32", "oneDNN matmul fp32", "oneDNN matmul bf16",
				      "st AMX bf16",
				      "torch mm fp32",     "torch mm bf16",
				      "st fp32",           "st bf16",            "st bf16 fp32-kern", "torch eager fp32",
				      "torch compile fp32", "torch eager bf16",  "torch compile bf16"};
typedef struct meas {
	int ok;
	double tokens, step_s, gflops, rss_gib, cpu, load; /* mm rows: gflops only */
} meas;
#define MAXREPS 9

static double med_of(meas m[][8][NROWS], int reps, int ti, int row, int field)
{
	double v[MAXREPS];
	int n = 0;
	for (int k = 0; k < reps; k++)
		if (m[k][ti][row].ok)
			v[n++] = field == 0 ? m[k][ti][row].tokens
				 : field == 1 ? m[k][ti][row].step_s
				 : field == 2 ? m[k][ti][row].gflops
					      : m[k][ti][row].rss_gib;
	return n ? median(v, n) : 0;
}

int main(int argc, char **argv)
{
	int threads[8] = {1, 2}, nthreads = 2, steps = 5, peer_steps = 4, peer_warmup = 2, reps = 3;
	int do_torch = 1, do_remat = 1, mode_on[4] = {1, 1, 1, 1}, st_on[3] = {1, 1, 1};
	const char *bin = "build/slicetrain", *python = ".venv-bench/bin/python";
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;
		if (!strcmp(argv[i], "--threads") && v) {
			nthreads = bench_int_list("--threads", v, 1, 1024, threads, 8);
			bad = nthreads < 0;
		} else if (!strcmp(argv[i], "--steps") && v) {
			bad = bench_int("--steps", v, 2, 100000, &steps);
		} else if (!strcmp(argv[i], "--reps") && v) {
			bad = bench_int("--reps", v, 1, MAXREPS, &reps);
		} else if (!strcmp(argv[i], "--peer-steps") && v) {
			bad = bench_int("--peer-steps", v, 1, 100000, &peer_steps);
		} else if (!strcmp(argv[i], "--peer-warmup") && v) {
			bad = bench_int("--peer-warmup", v, 0, 100000, &peer_warmup);
		} else if (!strcmp(argv[i], "--peer-modes") && v) {
			bad = bench_names("--peer-modes", v, peer_modes, 4, mode_on);
		} else if (!strcmp(argv[i], "--st-modes") && v) {
			bad = bench_names("--st-modes", v, st_modes, 3, st_on);
		} else if (!strcmp(argv[i], "--python") && v) {
			python = v;
		} else if (!strcmp(argv[i], "--no-torch")) {
			do_torch = 0;
			continue;
		} else if (!strcmp(argv[i], "--no-remat")) {
			do_remat = 0;
			continue;
		} else if (!strcmp(argv[i], "--slicetrain") && v) {
			bin = v;
		} else {
			bad = 1;
		}
		if (bad) {
			fprintf(stderr, "usage: %s [--threads 1,2] [--reps 3] [--steps 5] [--peer-steps 4] "
					"[--peer-warmup 2] [--peer-modes eager,compile,bf16,compile-bf16] "
					"[--st-modes fp32,bf16,bf16-fp32-kern] [--python .venv-bench/bin/python] "
					"[--no-torch] [--no-remat] [--slicetrain build/slicetrain]\n", argv[0]);
			return 2;
		}
		i++;
	}
	if (!mkdtemp(outdir)) {
		fprintf(stderr, "bench/train_step: cannot create %s: %s\n", outdir, strerror(errno));
		return 1;
	}
	atexit(remove_outdir);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	snprintf(a_outdir, sizeof(a_outdir), "base_output_directory=%s", outdir);
	char cache[96];
	snprintf(cache, sizeof(cache), "%s/inductor", outdir);
	setenv("TORCHINDUCTOR_CACHE_DIR", cache, 1);
	setenv("TMPDIR", outdir, 1); /* inductor's precompiled headers follow the temp dir */
	st_config_set_config_dir("configs");
	st_config mc;
	char *mov[] = {"model_name=llama3-125m", a_outdir, "run_name=bench"};
	if (st_config_load(&mc, "configs/base.yml", 3, mov) < 0) {
		fprintf(stderr, "config: %s\n", st_errmsg());
		return 1;
	}
	int have_torch = do_torch && access(python, X_OK) == 0 && access("bench/torch_peer.py", R_OK) == 0;

	/* is bf16 built? a one-step run of the tiny model says so */
	run *r = malloc(sizeof(*r));
	char *probe[] = {(char *)bin, "train", "configs/base.yml", "model_name=llama3-test",
			 "per_device_batch_size=1", "max_target_length=16", "steps=1", "dtype=bfloat16",
			 "dataset_type=synthetic", a_outdir,
			 "run_name=bench-probe", "enable_checkpointing=false", NULL};
	spawn(r, probe, 1);
	parse_steps(r);
	int bf16_model = r->rc == 0 && !r->bf16_missing;
	int cpu_bf16 = st_cpu_has_bf16(), amx = st_amx_available();

	char cpu[512];
	bench_cpu_model(cpu, sizeof(cpu));
	printf("bench/train_step: llama3-125m, batch 4 x 512, remat none; %s; %s\n",
	       cpu_bf16 ? "CPU has AVX512_BF16" : st_cpu_bf16_message(),
	       amx ? "bf16 products on slicetrain's AMX kernel (ST_AMX=0: oneDNN's)"
		   : "bf16 products on oneDNN's matmul (no AMX in use)");
	printf("cpu: %s\n", cpu);
	printf("model: emb %lld, layers %lld, heads %lld, kv heads %lld, head_dim %lld, mlp %lld, vocab %lld, "
	       "rope theta %g, eps %g, untied output layer\n",
	       (long long)mc.emb_dim, (long long)mc.num_decoder_layers, (long long)mc.num_query_heads,
	       (long long)mc.num_kv_heads, (long long)mc.head_dim, (long long)mc.mlp_dim,
	       (long long)mc.vocab_size, mc.rope_theta, mc.norm_eps);
	printf("%d repetitions, interleaved (each: every thread count, every row; slicetrain's rows in an order rotated by one "
	       "per repetition); slicetrain: median of %d "
	       "steps after the first; matmul: M=2048 N=2048 K=768, median of 9\n", reps, steps - 1);
	if (have_torch) {
		run *v = malloc(sizeof(*v));
		char *vargv[] = {(char *)python, "-c",
				 "import torch; print('torch', torch.__version__, '| cpu capability',"
				 " torch.backends.cpu.get_cpu_capability(), '| mkldnn', torch.backends.mkldnn.is_available())",
				 NULL};
		spawn(v, vargv, 1);
		v->out[strcspn(v->out, "\n")] = 0;
		printf("peer: %s bench/torch_peer.py (%s): median of %d steps after %d untimed warm-up steps "
		       "(torch.compile's compilation among them); modes:", python, v->out, peer_steps, peer_warmup);
		for (int m = 0; m < 4; m++)
			if (mode_on[m])
				printf(" %s", peer_modes[m]);
		printf("\n");
		free(v);
	} else {
		printf("peer: %s (scripts/install-deps.sh --bench creates .venv-bench)\n",
		       do_torch ? "absent" : "skipped (--no-torch)");
	}
	printf("load average at start: %.2f\n\n", load1());
	fflush(stdout);

	static meas m[MAXREPS][8][NROWS];
	memset(m, 0, sizeof(m));
	printf("%-4s %-3s %-19s %9s %9s %10s %9s %5s %6s\n", "rep", "thr", "run", "step s", "tokens/s",
	       "GF/s", "peak GiB", "cpu", "load1");
	for (int k = 0; k < reps; k++) {
		for (int ti = 0; ti < nthreads; ti++) {
			int th = threads[ti];
			meas *row = m[k][ti];
			for (int d = 0; d < 4; d++) {
				if ((d == 2 && !cpu_bf16) || (d == 3 && !amx))
					continue;
				row[d].load = load1();
				row[d].gflops = matmul_rate(d, th, &row[d].cpu);
				row[d].ok = row[d].gflops > 0;
			}
			/* fp32; bf16 as auto plans it; bf16 storage on the fp32 kernels
			 * (what auto picks where bf16 products are slower). Their order
			 * rotates by one each repetition: on the VMs measured the run
			 * that came first after a pause was sometimes faster, which a
			 * fixed order would have credited to fp32 every time. */
			for (int j = 0; j < 3; j++) {
				int bf = (j + k) % 3;
				if (!st_on[bf] || (bf && !bf16_model))
					continue;
				meas *q = &row[R_ST32 + bf];
				q->load = load1();
				train(r, bin, th, steps, "512", "none", bf ? "bfloat16" : "float32",
				      bf == 2 ? "bf16_kernels=fp32" : NULL);
				q->ok = r->rc == 0 && r->nsteps > 0;
				if (!q->ok) {
					fail_tail(r, "slicetrain");
					continue;
				}
				q->tokens = r->tokens, q->step_s = r->step_s, q->gflops = r->tflops * 1000;
				q->rss_gib = r->maxrss_gib, q->cpu = r->cpu_share;
			}
			/* model FLOPs per token, MaxText's formula (slicetrain's log line) */
			double fpt = 0; /* the same for every dtype: the first row run */
			for (int d = R_ST32; d <= R_STB32 && fpt == 0; d++)
				fpt = row[d].ok ? row[d].gflops / row[d].tokens : 0;
			for (int md = 0; have_torch && md < 4; md++) {
				if (!mode_on[md])
					continue;
				meas *q = &row[R_PEER0 + md];
				q->load = load1();
				double tok = 0;
				torch_peer(r, python, &mc, peer_modes[md], th, peer_steps, peer_warmup, &tok);
				q->ok = r->rc == 0 && tok > 0;
				if (!q->ok) {
					fail_tail(r, peer_modes[md]);
					continue;
				}
				q->tokens = tok, q->step_s = 2048.0 / tok, q->gflops = fpt * tok;
				q->rss_gib = r->maxrss_gib, q->cpu = r->cpu_share;
				char *pm = strstr(r->out, "peer_mm: fp32_GFLOP/s=");
				if (pm && sscanf(pm, "peer_mm: fp32_GFLOP/s=%lf bf16_GFLOP/s=%lf", &row[R_TMM32].gflops,
						 &row[R_TMM16].gflops) == 2) {
					row[R_TMM32].ok = row[R_TMM16].ok = 1;
					row[R_TMM32].load = row[R_TMM16].load = q->load;
					row[R_TMM32].cpu = row[R_TMM16].cpu = -1;
				}
			}
			for (int i = 0; i < NROWS; i++) {
				meas *q = &row[i];
				if (!q->ok)
					continue;
				if (i < R_ST32 && q->cpu < 0)
					printf("%-4d %-3d %-19s %9s %9s %10.1f %9s %5s %6.2f\n", k + 1, th, row_name[i],
					       "", "", q->gflops, "", "", q->load);
				else if (i < R_ST32)
					printf("%-4d %-3d %-19s %9s %9s %10.1f %9s %5.2f %6.2f\n", k + 1, th, row_name[i],
					       "", "", q->gflops, "", q->cpu, q->load);
				else
					printf("%-4d %-3d %-19s %9.3f %9.1f %10.1f %9.2f %5.2f %6.2f\n", k + 1, th,
					       row_name[i], q->step_s, q->tokens, q->gflops, q->rss_gib, q->cpu, q->load);
			}
			fflush(stdout);
		}
	}
	printf("\n(cpu: the child's CPU time / (wall time x threads) over the whole run, warm-up and compilation "
	       "included,\n below about 0.9 when other jobs took cores; load1: 1-minute load average when the row "
	       "started)\n");

	printf("\nmedians of %d repetitions\n", reps);
	printf("%-3s %-19s %9s %9s %10s %8s %9s\n", "thr", "run", "step s", "tokens/s", "GF/s", "vs mm",
	       "peak GiB");
	for (int ti = 0; ti < nthreads; ti++) {
		int th = threads[ti];
		double mm32 = fmax(med_of(m, reps, ti, R_SGEMM, 2), med_of(m, reps, ti, R_MATMUL, 2));
		double mm16 = fmax(med_of(m, reps, ti, R_MMBF16, 2), med_of(m, reps, ti, R_AMXBF16, 2));
		for (int i = 0; i < NROWS; i++) {
			double tok = med_of(m, reps, ti, i, 0), gf = med_of(m, reps, ti, i, 2);
			if (i < R_ST32 ? gf <= 0 : tok <= 0)
				continue;
			if (i < R_ST32) {
				printf("%-3d %-19s %9s %9s %10.1f\n", th, row_name[i], "", "", gf);
				continue;
			}
			int isbf = i == R_STBF16 || i == R_PEER0 + 2 || i == R_PEER0 + 3;
			double mm = isbf ? mm16 : mm32;
			printf("%-3d %-19s %9.3f %9.1f %10.1f %8.2f %9.2f\n", th, row_name[i],
			       med_of(m, reps, ti, i, 1), tok, gf, mm > 0 ? gf / mm : 0, med_of(m, reps, ti, i, 3));
		}
	}
	printf("(vs mm: model GFLOP/s / the faster oneDNN fp32 rate of the same thread count, bf16 rows / the "
	       "faster bf16 rate, oneDNN's or the AMX kernel's)\n");

	printf("\nratios of median tokens/s (targets: fp32 >= 1.30x torch, bf16 >= 1.50x torch's bf16; bf16 >= "
	       "1.6x fp32 where the bf16 products are faster,\n else >= 0.97x; the fp32 kernels' bf16 >= 0.97x fp32: "
	       "what a CPU whose bf16 products are slower runs); per repetition in brackets\n");
	struct { int a, b; double target; } rat[] = {{R_ST32, R_PEER0 + 0, 1.3}, {R_ST32, R_PEER0 + 1, 1.3},
						     {R_STBF16, R_PEER0 + 2, 1.5}, {R_STBF16, R_PEER0 + 3, 1.5},
						     {R_STBF16, R_ST32, 1.6}, {R_STB32, R_ST32, 0.97}};
	for (int ti = 0; ti < nthreads; ti++) {
		/* bf16 / fp32: 1.6x where the bf16 products (oneDNN's or AMX) beat the fp32 ones
		 * at this thread count, else (slower or none) 0.97x */
		double mm32 = fmax(med_of(m, reps, ti, R_SGEMM, 2), med_of(m, reps, ti, R_MATMUL, 2));
		int bf16_faster = fmax(med_of(m, reps, ti, R_MMBF16, 2), med_of(m, reps, ti, R_AMXBF16, 2)) > mm32;
		for (size_t j = 0; j < sizeof(rat) / sizeof(rat[0]); j++) {
			double x = med_of(m, reps, ti, rat[j].a, 0), y = med_of(m, reps, ti, rat[j].b, 0);
			if (x <= 0 || y <= 0)
				continue;
			double target = rat[j].a == R_STBF16 && rat[j].b == R_ST32 && !bf16_faster ? 0.97 : rat[j].target;
			printf("%-3d %-19s / %-19s %6.2fx", threads[ti], row_name[rat[j].a], row_name[rat[j].b], x / y);
			if (target > 0)
				printf("  %s (%.2fx)", x / y >= target ? "met" : "NOT met", target);
			printf("  [");
			for (int k = 0; k < reps; k++) {
				meas *p = &m[k][ti][rat[j].a], *q = &m[k][ti][rat[j].b];
				if (p->ok && q->ok)
					printf("%s%.2f", k ? " " : "", p->tokens / q->tokens);
				else
					printf("%s-", k ? " " : "");
			}
			printf("]\n");
		}
	}
	printf("load average at end: %.2f\n", load1());
	fflush(stdout);

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
			train(r, bin, th, steps > 3 ? 3 : steps, "1024", pol[i], "float32", NULL);
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
