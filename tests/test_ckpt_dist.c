/*
 * Checkpoints across real processes (src/comm's communicator, forked
 * members on loopback): 4 processes save row pieces of three steps
 * (async); step 3 is then damaged in a piece that, restoring as 3 processes
 * with column splits, only one of them reads. All 3 must agree to fall back
 * to step 2 (exact values, the same meta everywhere) and the damaged step is
 * moved aside once. Then 2 processes restore step 2 by rows, and a
 * load_full_state_path-style restore of a missing step fails on every process.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/err.h"
#include "check.h"
#include "free_port.h"
#include "ckpt/ckpt.h"
#include "comm/comm.h"

static char dir[600];

static const struct {
	const char *name;
	int ndim;
	int64_t shape[2];
} model[] = {
	{"model.embed_tokens.weight", 2, {12, 5}},
	{"optimizer.mu.model.embed_tokens.weight", 2, {12, 5}},
	{"model.layers.0.self_attn.q_proj.weight", 2, {7, 3}},
	{"model.norm.weight", 1, {9, 0}},
	{"optimizer.nu.model.norm.weight", 1, {9, 0}},
};
#define NT ((int)(sizeof(model) / sizeof(model[0])))

static float value(int t, int64_t i, int64_t j, int64_t step) { return (float)(t * 1000 + i * 10 + j) + 0.5f * (float)step; }

/* Process p of P's pieces: rows, or columns of 2-D tensors; fill with step's values or NaN (fill < 0). */
static int pieces_for(st_ckpt_piece *out, int p, int P, int by_cols, int64_t fill)
{
	int n = 0;
	for (int t = 0; t < NT; t++) {
		int dim = by_cols && model[t].ndim == 2 ? 1 : 0;
		int64_t size = model[t].shape[dim], lo = size * p / P, hi = size * (p + 1) / P;
		if (hi <= lo)
			continue;
		st_ckpt_piece *x = &out[n++];
		*x = (st_ckpt_piece){.name = model[t].name, .ndim = model[t].ndim,
				     .global_shape = {model[t].shape[0], model[t].shape[1]},
				     .shape = {model[t].shape[0], model[t].shape[1]}};
		x->offset[dim] = lo;
		x->shape[dim] = hi - lo;
		int64_t rows = x->ndim == 2 ? x->shape[0] : 1, cols = x->ndim == 2 ? x->shape[1] : x->shape[0];
		x->data = malloc((size_t)(rows * cols) * sizeof(float));
		for (int64_t i = 0; i < rows; i++)
			for (int64_t j = 0; j < cols; j++) {
				int64_t gi = x->ndim == 2 ? x->offset[0] + i : 0, gj = x->ndim == 2 ? x->offset[1] + j : x->offset[0] + j;
				x->data[i * cols + j] = fill >= 0 ? value(t, gi, gj, fill) : NAN;
			}
	}
	return n;
}

static int64_t wrong(const st_ckpt_piece *ps, int n, int64_t step)
{
	int64_t bad = 0;
	for (int k = 0; k < n; k++) {
		const st_ckpt_piece *x = &ps[k];
		int t = 0;
		while (strcmp(model[t].name, x->name))
			t++;
		int64_t rows = x->ndim == 2 ? x->shape[0] : 1, cols = x->ndim == 2 ? x->shape[1] : x->shape[0];
		for (int64_t i = 0; i < rows; i++)
			for (int64_t j = 0; j < cols; j++) {
				int64_t gi = x->ndim == 2 ? x->offset[0] + i : 0, gj = x->ndim == 2 ? x->offset[1] + j : x->offset[0] + j;
				bad += x->data[i * cols + j] != value(t, gi, gj, step);
			}
	}
	return bad;
}

static void free_pieces(st_ckpt_piece *ps, int n)
{
	for (int k = 0; k < n; k++)
		free(ps[k].data);
}

typedef void (*body_fn)(st_comm *c, int rank, int P);

/* Fork P members of a fresh group; each runs body on the world communicator. Returns failures. */
static int run_group(int P, body_fn body)
{
	int port = free_port(), bad = 0;
	pid_t pids[8];
	fflush(stdout);
	fflush(stderr);
	for (int r = 0; r < P; r++) {
		if ((pids[r] = fork()) == 0) {
			char b[64];
			st_group *g;
			st_comm *c;
			int ranks[8];
			check_failures = 0;
			snprintf(b, sizeof(b), "%d", r);
			setenv("SLICETRAIN_RANK", b, 1);
			snprintf(b, sizeof(b), "%d", P);
			setenv("SLICETRAIN_WORLD_SIZE", b, 1);
			snprintf(b, sizeof(b), "127.0.0.1:%d", port);
			setenv("SLICETRAIN_COORDINATOR", b, 1);
			for (int i = 0; i < P; i++)
				ranks[i] = i;
			if (st_group_join(&g, NULL) < 0 || st_comm_create(&c, g, P, ranks) < 0) {
				fprintf(stderr, "rank %d: %s\n", r, st_errmsg());
				_exit(2);
			}
			body(c, r, P);
			st_comm_free(c);
			st_group_leave(g);
			_exit(check_result());
		}
	}
	for (int r = 0; r < P; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "member %d of %d failed (status %d)\n", r, P, st);
			bad++;
		}
	}
	return bad;
}

static void save_body(st_comm *c, int rank, int P)
{
	st_ckpt_opts o = {.dir = dir, .process = rank, .process_count = P, .async = 1,
			  .generation = ST_CKPT_NO_GENERATION};
	st_ckpt_saver *s;
	st_ckpt_piece ps[NT];
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	CHECK(st_comm_barrier(c) == 0); /* nobody saves before process 0's cleanup */
	for (int64_t step = 1; step <= 3; step++) {
		st_ckpt_meta m = {.step = step, .next_sample = 10 * step, .global_batch = 10, .config_json = "{}"};
		snprintf(m.mesh, sizeof(m.mesh), "fsdp=%d", P);
		int n = pieces_for(ps, rank, P, 0, step);
		CHECK_MSG(st_ckpt_save(s, &m, n, ps) == 0, "%s", st_errmsg());
		CHECK_MSG(st_ckpt_wait(s) == 0, "%s", st_errmsg()); /* the caller's pieces are reused */
		free_pieces(ps, n);
	}
	st_ckpt_saver_free(s);
}

static int64_t want_step;
static int by_cols;

static void restore_body(st_comm *c, int rank, int P)
{
	st_ckpt_piece ps[NT];
	st_ckpt_meta m;
	int found = 0, n = pieces_for(ps, rank, P, by_cols, -1);
	int rc = st_ckpt_restore_latest(dir, c, &m, n, ps, &found);
	CHECK_MSG(rc == 0 && found && m.step == want_step, "rank %d: rc %d found %d step %lld: %s", rank, rc, found,
		  (long long)(rc == 0 ? m.step : -1), st_errmsg());
	if (rc == 0 && found) {
		CHECK(wrong(ps, n, m.step) == 0 && m.next_sample == 10 * m.step && !strcmp(m.mesh, "fsdp=4"));
		st_ckpt_meta_release(&m);
	}
	/* a step that does not exist: every process fails, none hangs */
	char missing[700];
	snprintf(missing, sizeof(missing), "%s/99", dir);
	rc = st_ckpt_restore_step(missing, c, &m, n, ps);
	CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), "not a committed slicetrain checkpoint"), "rank %d: %d %s", rank,
		  rc, st_errmsg());
	free_pieces(ps, n);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p);
}

int main(void)
{
	const char *t = getenv("TMPDIR");
	char base[512], shard[800];
	snprintf(base, sizeof(base), "%s/test_ckpt_dist.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(base)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s/checkpoints", base);
	CHECK(run_group(4, save_body) == 0);

	/* damage model.norm.weight[6:9] of step 3 (process 3's shard, third piece from the end) */
	snprintf(shard, sizeof(shard), "%s/3/shard-00003-of-00004.safetensors", dir);
	int fd = open(shard, O_RDWR);
	off_t end = lseek(fd, 0, SEEK_END);
	unsigned char b = 0;
	CHECK(pread(fd, &b, 1, end - 12 - 2) == 1);
	b ^= 0x10;
	CHECK(pwrite(fd, &b, 1, end - 12 - 2) == 1);
	close(fd);

	want_step = 2;
	by_cols = 1;
	CHECK(run_group(3, restore_body) == 0);
	snprintf(shard, sizeof(shard), "%s/3", dir);
	CHECK(access(shard, F_OK) != 0); /* moved aside */
	by_cols = 0;
	CHECK(run_group(2, restore_body) == 0);

	nftw(base, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	if (check_failures)
		fprintf(stderr, "test_ckpt_dist: %d check(s) failed\n", check_failures);
	else
		printf("test_ckpt_dist: all checks passed\n");
	return check_result();
}
