/*
 * Checkpoints (src/ckpt): save as 4 processes' row pieces, restore as 1, 2
 * and 3 processes' different splits (exact equality); atomic commit and
 * cleanup of uncommitted steps; fallback past damaged checkpoints (flipped
 * byte, truncated shard, bad manifest) and the error when none is usable;
 * agreement on the step across processes (threads standing in for
 * processes, with an in-process communicator); async overlap; pruning;
 * failure policies; malformed manifests and done records; verify and list;
 * pieces larger than a restore part (read in parts on several threads):
 * values, a flipped byte in any part, two damaged tensors, truncation, on
 * disk and on tmpfs; elastic generations (file names with and without one,
 * a shard write and a commit after the fence moved on, a done record of
 * another generation, malformed fence files), their order fixed by
 * synchronous saves and the before_write and before_commit hooks;
 * Hugging Face export (sharded) and import.
 *
 * The communicator here is a stand-in for src/comm (threads as processes):
 * it implements only what src/ckpt calls.
 */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/file.h"
#include "base/pages.h"
#include "base/crc.h"
#include "check.h"
#include "ckpt/ckpt.h"
#include "ckpt/ckpt_int.h"
#include "ckpt/safetensors.h"
#include "config/config.h"
#include "model/llama.h"

static char tmpdir[512];

/* A path under the scratch dir (8 rotating static buffers: copy with DIRVAR to keep one). */
static const char *tp(const char *fmt, ...)
{
	static char bufs[8][1200];
	static int k;
	char rel[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	k = (k + 1) % 8;
	snprintf(bufs[k], sizeof(bufs[k]), "%s/%s", tmpdir, rel);
	return bufs[k];
}

#define DIRVAR(var, ...)   \
	char var[1200];    \
	snprintf(var, sizeof(var), "%s", tp(__VA_ARGS__))

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p);
}

static void rm_tree(const char *p) { nftw(p, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* Runs fn with stderr captured; returns the text (static buffer). */
static const char *capture(void (*fn)(void *), void *arg)
{
	static char out[16384];
	char path[1100];
	snprintf(path, sizeof(path), "%s/stderr.txt", tmpdir);
	int saved = dup(2), fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	fflush(stderr);
	dup2(fd, 2);
	fn(arg);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	ssize_t got = read(fd, out, sizeof(out) - 1);
	out[got > 0 ? got : 0] = '\0';
	close(fd);
	return out;
}

/* ------------------------------------------------ an in-process communicator */

struct fake_group {
	pthread_barrier_t bar;
	int size;
	int64_t vals[16];
	char bcast[1 << 16];
	int calls; /* collectives made by rank 0 */
};

struct st_comm {
	int rank;
	struct fake_group *g;
};

int st_comm_rank(const st_comm *c) { return c->rank; }
int st_comm_size(const st_comm *c) { return c->g->size; }

int st_comm_allreduce(st_comm *c, void *buf, int64_t count, enum st_dtype dt, enum st_redop op)
{
	if (count != 1 || dt != ST_DTYPE_I64 || op != ST_MAX)
		ST_BUG("fake allreduce: only one I64 MAX");
	c->g->vals[c->rank] = *(int64_t *)buf;
	pthread_barrier_wait(&c->g->bar);
	int64_t m = c->g->vals[0];
	for (int i = 1; i < c->g->size; i++)
		m = c->g->vals[i] > m ? c->g->vals[i] : m;
	pthread_barrier_wait(&c->g->bar);
	*(int64_t *)buf = m;
	if (c->rank == 0)
		c->g->calls++;
	return 0;
}

int st_comm_broadcast(st_comm *c, void *buf, size_t bytes, int root)
{
	if (bytes > sizeof(c->g->bcast))
		ST_BUG("fake broadcast: too large");
	if (c->rank == root)
		memcpy(c->g->bcast, buf, bytes);
	pthread_barrier_wait(&c->g->bar);
	if (c->rank != root)
		memcpy(buf, c->g->bcast, bytes);
	pthread_barrier_wait(&c->g->bar);
	return 0;
}

/* ------------------------------------------------ a small model and its pieces */

struct tdef {
	const char *name;
	int ndim;
	int64_t shape[2];
};

static const struct tdef model[] = {
	{"model.embed_tokens.weight", 2, {12, 5}},
	{"optimizer.mu.model.embed_tokens.weight", 2, {12, 5}},
	{"optimizer.nu.model.embed_tokens.weight", 2, {12, 5}},
	{"model.layers.0.self_attn.q_proj.weight", 2, {7, 3}},
	{"optimizer.mu.model.layers.0.self_attn.q_proj.weight", 2, {7, 3}},
	{"optimizer.nu.model.layers.0.self_attn.q_proj.weight", 2, {7, 3}},
	{"model.norm.weight", 1, {9, 0}},
	{"optimizer.mu.model.norm.weight", 1, {9, 0}},
	{"optimizer.nu.model.norm.weight", 1, {9, 0}},
};
#define NT ((int)(sizeof(model) / sizeof(model[0])))

/* Element (i, j) of tensor t in checkpoint `version`: exact in float. */
static float value(int t, int64_t i, int64_t j, int version)
{
	return (float)(t * 1000 + i * 10 + j) + 0.25f * (float)version;
}

struct plist {
	int n;
	st_ckpt_piece p[64];
};

/*
 * Process p of P's pieces: each tensor split evenly (first pieces larger)
 * along rows, or along columns for 2-D tensors when by_cols. version >= 0
 * fills the values, -1 fills NaN (to be overwritten by a restore).
 */
static void make_pieces(struct plist *pl, const struct tdef *tensors, int nt, int p, int P, int by_cols,
			int version)
{
	pl->n = 0;
	for (int t = 0; t < nt; t++) {
		const struct tdef *d = &tensors[t];
		int dim = by_cols && d->ndim == 2 ? 1 : 0;
		int64_t size = d->shape[dim], lo = size * p / P, hi = size * (p + 1) / P;
		st_ckpt_piece *x = &pl->p[pl->n];
		if (pl->n == 64)
			ST_BUG("make_pieces: more than 64 pieces");
		if (hi <= lo)
			continue;
		pl->n++;
		memset(x, 0, sizeof(*x));
		x->name = d->name;
		x->ndim = d->ndim;
		x->global_shape[0] = d->shape[0];
		x->global_shape[1] = d->shape[1];
		x->shape[0] = d->shape[0];
		x->shape[1] = d->shape[1];
		x->offset[dim] = lo;
		x->shape[dim] = hi - lo;
		int64_t rows = d->ndim == 2 ? x->shape[0] : 1, cols = d->ndim == 2 ? x->shape[1] : x->shape[0];
		x->data = malloc((size_t)(rows * cols) * sizeof(float));
		for (int64_t i = 0; i < rows; i++)
			for (int64_t j = 0; j < cols; j++) {
				int64_t gi = d->ndim == 2 ? x->offset[0] + i : 0, gj = d->ndim == 2 ? x->offset[1] + j : x->offset[0] + j;
				x->data[i * cols + j] = version >= 0 ? value(t, gi, gj, version) : NAN;
			}
	}
}

/* Elements that differ from checkpoint `version`. */
static int64_t mismatches(const struct plist *pl, const struct tdef *tensors, int nt, int version)
{
	int64_t bad = 0;
	for (int k = 0; k < pl->n; k++) {
		const st_ckpt_piece *x = &pl->p[k];
		int t = 0;
		while (t < nt && strcmp(tensors[t].name, x->name))
			t++;
		int64_t rows = x->ndim == 2 ? x->shape[0] : 1, cols = x->ndim == 2 ? x->shape[1] : x->shape[0];
		for (int64_t i = 0; i < rows; i++)
			for (int64_t j = 0; j < cols; j++) {
				int64_t gi = x->ndim == 2 ? x->offset[0] + i : 0, gj = x->ndim == 2 ? x->offset[1] + j : x->offset[0] + j;
				bad += x->data[i * cols + j] != value(t, gi, gj, version);
			}
	}
	return bad;
}

static void free_pieces(struct plist *pl)
{
	for (int k = 0; k < pl->n; k++)
		free(pl->p[k].data);
	pl->n = 0;
}

static const char *config_json = "{\"base_emb_dim\":5,\"model_name\":\"tiny\"}";

static st_ckpt_meta meta_for(int64_t step)
{
	st_ckpt_meta m = {.step = step, .next_sample = step * 8, .data_shuffle_seed = 7, .init_weights_seed = -3,
			  .global_batch = 8, .config_json = config_json};
	snprintf(m.mesh, sizeof(m.mesh), "data=1 fsdp=4 tensor=1 (1 slice x 4)");
	return m;
}

static st_ckpt_opts opts_for(const char *dir, int p, int P)
{
	st_ckpt_opts o = {.dir = dir, .process = p, .process_count = P, .async = 1, .commit_timeout_ms = 20000,
			  .generation = ST_CKPT_NO_GENERATION};
	return o;
}

/* Save checkpoint `step` of tensors (values: version) as P processes with row splits. */
static void save_model(const char *dir, const struct tdef *tensors, int nt, int P, int64_t step, int version,
		       int async)
{
	st_ckpt_saver *s[8] = {0};
	struct plist pl[8];
	for (int p = 0; p < P; p++) {
		st_ckpt_opts o = opts_for(dir, p, P);
		o.async = async || P > 1; /* synchronous process 0 would wait for the others first */
		CHECK_MSG(st_ckpt_saver_create(&s[p], &o) == 0, "%s", st_errmsg());
	}
	for (int p = P - 1; p >= 0; p--) {
		st_ckpt_meta m = meta_for(step);
		make_pieces(&pl[p], tensors, nt, p, P, 0, version);
		CHECK_MSG(st_ckpt_save(s[p], &m, pl[p].n, pl[p].p) == 0, "%s", st_errmsg());
	}
	for (int p = 0; p < P; p++) {
		CHECK_MSG(st_ckpt_wait(s[p]) == 0, "%s", st_errmsg());
		st_ckpt_stats st;
		st_ckpt_saver_stats(s[p], &st);
		CHECK(st.saves == 1 && st.committed == 1 && st.failed == 0);
		st_ckpt_saver_free(s[p]);
		free_pieces(&pl[p]);
	}
}

static void save_as(const char *dir, int P, int64_t step, int version, int async)
{
	save_model(dir, model, NT, P, step, version, async);
}

/* Restore tensors as process p of P (split by rows or columns); returns rc, checks values against version. */
static int restore_model(const char *dir, const struct tdef *tensors, int nt, int p, int P, int by_cols,
			 int version, int64_t *step)
{
	struct plist pl;
	st_ckpt_meta m;
	int found = 0;
	make_pieces(&pl, tensors, nt, p, P, by_cols, -1);
	int rc = st_ckpt_restore_latest(dir, NULL, &m, pl.n, pl.p, &found);
	if (rc == 0 && found) {
		CHECK_MSG(mismatches(&pl, tensors, nt, version) == 0, "process %d of %d (%s): wrong values", p, P,
			  by_cols ? "columns" : "rows");
		CHECK(m.next_sample == m.step * 8 && m.data_shuffle_seed == 7 && m.init_weights_seed == -3 &&
		      m.global_batch == 8 && strstr(m.mesh, "fsdp=4"));
		CHECK(m.config_json && strstr(m.config_json, "\"base_emb_dim\":5"));
		*step = m.step;
		st_ckpt_meta_release(&m);
	} else if (rc == 0) {
		*step = -1;
	}
	free_pieces(&pl);
	return rc;
}

static int restore_as(const char *dir, int p, int P, int by_cols, int version, int64_t *step)
{
	return restore_model(dir, model, NT, p, P, by_cols, version, step);
}

/* ------------------------------------------------ tests */

static void test_header(void)
{
	float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
	st_safetensors_tensor t[] = {{"a", ST_DTYPE_F32, 2, {2, 3}, a}, {"b", ST_DTYPE_F32, 1, {2}, b}};
	const char *mk[] = {"k"}, *mv[] = {"v"};
	char *hdr, *whole;
	size_t hlen, wlen;
	CHECK(st_safetensors_write(tp("h.safetensors"), 2, t, 1, mk, mv) == 0);
	CHECK(st_safetensors_header(tp("h.safetensors"), 2, t, 1, mk, mv, &hdr, &hlen) == 0);
	CHECK(hlen % 8 == 0);
	CHECK(st_read_file(tp("h.safetensors"), 1 << 20, &whole, &wlen) == 0);
	CHECK(wlen == hlen + sizeof(a) + sizeof(b) && memcmp(whole, hdr, hlen) == 0 &&
	      memcmp(whole + hlen, a, sizeof(a)) == 0);
	free(hdr);
	free(whole);
	st_safetensors_tensor dup[] = {{"a", ST_DTYPE_F32, 1, {1}, NULL}, {"a", ST_DTYPE_F32, 1, {1}, NULL}};
	CHECK(st_safetensors_header("x", 2, dup, 0, NULL, NULL, &hdr, &hlen) == ST_EINVAL && !hdr);
}

/* 4 processes' row pieces -> 1, 2, 3 processes, rows and columns: exact equality */
static void test_reshard(void)
{
	DIRVAR(dir, "reshard/checkpoints");
	int64_t step;
	save_as(dir, 4, 10, 1, 1);
	CHECK(exists(tp("reshard/checkpoints/10/manifest.json")));
	CHECK(exists(tp("reshard/checkpoints/10/shard-00003-of-00004.safetensors")));
	CHECK(exists(tp("reshard/checkpoints/10/done-00002.json")));
	for (int P = 1; P <= 3; P++)
		for (int by_cols = 0; by_cols <= 1; by_cols++)
			for (int p = 0; p < P; p++) {
				int rc = restore_as(dir, p, P, by_cols, 1, &step);
				CHECK_MSG(rc == 0 && step == 10, "restore %d of %d: %s", p, P, st_errmsg());
			}
	/* the shard of a process is plain safetensors: partial pieces carry their box */
	st_safetensors *f;
	CHECK(st_safetensors_open(&f, tp("reshard/checkpoints/10/shard-00001-of-00004.safetensors")) == 0);
	const char *box = st_safetensors_meta(f, "model.embed_tokens.weight[3:6,0:5]");
	CHECK_MSG(box && strstr(box, "\"offset\":[3,0]"), "%s", box ? box : "(none)");
	CHECK(st_safetensors_find(f, "optimizer.nu.model.norm.weight[2:4]") != NULL);
	st_safetensors_close(f);
	/* a single process's shard holds whole tensors under their Hugging Face names */
	save_as(tp("single"), 1, 3, 2, 0);
	CHECK(st_safetensors_open(&f, tp("single/3/shard-00000-of-00001.safetensors")) == 0);
	CHECK(st_safetensors_find(f, "model.embed_tokens.weight") && st_safetensors_find(f, "optimizer.mu.model.norm.weight"));
	st_safetensors_close(f);
	CHECK(restore_as(tp("single"), 1, 2, 1, 2, &step) == 0 && step == 3);
	/* nothing to restore: found = 0 */
	struct plist pl;
	st_ckpt_meta m;
	int found = 1;
	make_pieces(&pl, model, NT, 0, 1, 0, -1);
	CHECK(st_ckpt_restore_latest(tp("nothing-here"), NULL, &m, pl.n, pl.p, &found) == 0 && !found);
	/* a different model: global shape mismatch and a missing tensor are errors, not fallbacks */
	pl.p[0].global_shape[0] = 13;
	pl.p[0].shape[0] = 13;
	CHECK(st_ckpt_restore_latest(dir, NULL, &m, pl.n, pl.p, &found) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "model.embed_tokens.weight") && strstr(st_errmsg(), "[13, 5]"), "%s", st_errmsg());
	pl.p[0].global_shape[0] = pl.p[0].shape[0] = 12;
	pl.p[1].name = "optimizer.mu.nothing";
	CHECK(st_ckpt_restore_latest(dir, NULL, &m, pl.n, pl.p, &found) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "optimizer.mu.nothing is not in this checkpoint"), "%s", st_errmsg());
	CHECK(exists(tp("reshard/checkpoints/10/manifest.json"))); /* not quarantined */
	free_pieces(&pl);
}

static void flip_byte(const char *path, off_t at_from_end)
{
	int fd = open(path, O_RDWR);
	off_t end = lseek(fd, 0, SEEK_END);
	unsigned char b;
	CHECK(pread(fd, &b, 1, end - at_from_end) == 1);
	b ^= 0x40;
	CHECK(pwrite(fd, &b, 1, end - at_from_end) == 1);
	close(fd);
}

struct restore_call {
	const char *dir;
	int rc;
	int64_t step;
};

static void restore_quiet(void *arg)
{
	struct restore_call *c = arg;
	c->rc = restore_as(c->dir, 0, 1, 0, (int)c->step, &c->step);
}

static void create_saver_quiet(void *arg)
{
	st_ckpt_saver *s;
	st_ckpt_opts o = opts_for(arg, 0, 1);
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	st_ckpt_saver_free(s);
}

/* uncommitted dirs ignored and cleaned; damaged ones skipped with a warning; none usable: error */
static void test_atomicity(void)
{
	DIRVAR(dir, "atom");
	struct restore_call c = {.dir = dir};
	const char *err;

	save_as(dir, 2, 5, 5, 1);
	save_as(dir, 2, 10, 10, 1);
	/* a step whose save did not finish: shards and done records, no manifest */
	save_as(tp("atom-tmp"), 2, 15, 15, 1);
	CHECK(rename(tp("atom-tmp/15"), tp("atom/15")) == 0);
	CHECK(unlink(tp("atom/15/manifest.json")) == 0);
	c.step = 10;
	err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == 0 && c.step == 10 && !strstr(err, "warning"), "rc %d step %lld: %s", c.rc, (long long)c.step, err);
	err = capture(create_saver_quiet, (void *)dir);
	CHECK_MSG(strstr(err, "removing uncommitted checkpoint") && strstr(err, "/15"), "%s", err);
	CHECK(!exists(tp("atom/15")) && exists(tp("atom/10/manifest.json")));

	/* a flipped byte in step 10's data: fall back to 5, warn, move 10 aside */
	flip_byte(tp("atom/10/shard-00001-of-00002.safetensors"), 3);
	c.step = 5;
	err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == 0 && c.step == 5, "rc %d step %lld: %s", c.rc, (long long)c.step, err);
	CHECK_MSG(strstr(err, "checksum mismatch") && strstr(err, "shard-00001-of-00002.safetensors") &&
		  strstr(err, "optimizer.nu.model.norm.weight") && strstr(err, "falling back"), "%s", err);
	CHECK_MSG(strstr(err, "moved the unusable checkpoint"), "%s", err);
	CHECK(!exists(tp("atom/10")));

	/* a truncated shard in step 5 as well: nothing usable left */
	CHECK(truncate(tp("atom/5/shard-00000-of-00002.safetensors"), 100) == 0);
	c.step = 5;
	err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == ST_EINVAL, "rc %d: %s", c.rc, err);
	CHECK_MSG(strstr(st_errmsg(), "no usable checkpoint") && strstr(st_errmsg(), "truncated"), "%s", st_errmsg());
	CHECK_MSG(strstr(err, "file is truncated") && strstr(err, "shard-00000-of-00002"), "%s", err);

	/* a committed step whose manifest is damaged: skipped */
	save_as(tp("atom2"), 1, 1, 1, 0);
	save_as(tp("atom2"), 1, 2, 2, 0);
	CHECK(truncate(tp("atom2/2/manifest.json"), 40) == 0);
	DIRVAR(atom2, "atom2");
	c.dir = atom2;
	c.step = 1;
	err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == 0 && c.step == 1 && strstr(err, "bad JSON"), "rc %d: %s", c.rc, err);
	/* a missing shard */
	save_as(tp("atom3"), 2, 1, 1, 1);
	save_as(tp("atom3"), 2, 2, 2, 1);
	CHECK(unlink(tp("atom3/2/shard-00001-of-00002.safetensors")) == 0);
	DIRVAR(atom3, "atom3");
	c.dir = atom3;
	c.step = 1;
	err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == 0 && c.step == 1 && strstr(err, "cannot open shard"), "rc %d: %s", c.rc, err);
}

/* ---- agreement across processes (threads) ---- */

struct proc_arg {
	st_comm comm;
	const char *dir;
	int P, rc, found;
	int64_t step, bad;
};

static void *restore_proc(void *arg)
{
	struct proc_arg *a = arg;
	struct plist pl;
	st_ckpt_meta m;
	make_pieces(&pl, model, NT, a->comm.rank, a->P, 1, -1);
	a->rc = st_ckpt_restore_latest(a->dir, &a->comm, &m, pl.n, pl.p, &a->found);
	if (a->rc == 0 && a->found) {
		a->step = m.step;
		a->bad = mismatches(&pl, model, NT, (int)m.step);
		st_ckpt_meta_release(&m);
	}
	free_pieces(&pl);
	return NULL;
}

static void run_procs(void *arg)
{
	struct proc_arg *a = arg;
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, restore_proc, &a[i]);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
}

static void test_agreement(void)
{
	DIRVAR(dir, "agree");
	struct fake_group g = {.size = 3};
	struct proc_arg a[3];
	const char *err;

	pthread_barrier_init(&g.bar, NULL, 3);
	save_as(dir, 4, 1, 1, 1);
	save_as(dir, 4, 2, 2, 1);
	save_as(dir, 4, 3, 3, 1);
	/* step 3: damage model.norm.weight[6:9] in process 3's shard; restoring as 3
	 * processes, only process 2 reads that piece, but all must fall back to step 2 */
	flip_byte(tp("agree/3/shard-00003-of-00004.safetensors"), 25);
	for (int i = 0; i < 3; i++)
		a[i] = (struct proc_arg){.comm = {i, &g}, .dir = dir, .P = 3};
	err = capture(run_procs, a);
	for (int i = 0; i < 3; i++)
		CHECK_MSG(a[i].rc == 0 && a[i].found && a[i].step == 2 && a[i].bad == 0, "process %d: rc %d step %lld: %s", i,
			  a[i].rc, (long long)a[i].step, err);
	CHECK_MSG(strstr(err, "checksum mismatch") && strstr(err, "unusable on another process"), "%s", err);
	CHECK(!exists(tp("agree/3")) && exists(tp("agree/2/manifest.json")));
	pthread_barrier_destroy(&g.bar);
}

/* ---- async overlap, stall, pruning, policies ---- */

static double hook_start;
static void slow_hook(void *arg, int64_t step)
{
	(void)step;
	hook_start = st_mono_s();
	usleep(*(int *)arg * 1000);
}

static void test_async(void)
{
	DIRVAR(dir, "async");
	int delay_ms = 400;
	st_ckpt_opts o = opts_for(dir, 0, 1);
	o.before_write = slow_hook;
	o.hook_arg = &delay_ms;
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta m = meta_for(1);
	st_ckpt_stats st;

	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 1, 0, 1);
	double t0 = st_mono_s();
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	double returned = st_mono_s() - t0;
	CHECK_MSG(returned < 0.2, "save took %.3f s with a %d ms write", returned, delay_ms);
	CHECK(!exists(tp("async/1/manifest.json")));
	/* the caller may change its buffers at once: the saved values are the copy */
	for (int k = 0; k < pl.n; k++)
		pl.p[k].data[0] = -1;
	CHECK(st_ckpt_wait(s) == 0);
	CHECK(st_mono_s() - t0 >= delay_ms / 1000.0);
	CHECK(exists(tp("async/1/manifest.json")));
	st_ckpt_saver_stats(s, &st);
	CHECK(st.saves == 1 && st.committed == 1 && st.last_step == 1 && st.last_stall_s < 0.2 && st.last_bytes > 0);
	/* the next save waits for the one in flight */
	m = meta_for(2);
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	m = meta_for(3);
	t0 = st_mono_s();
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	st_ckpt_saver_stats(s, &st);
	CHECK_MSG(st.last_wait_s > 0.2, "wait %.3f", st.last_wait_s);
	/* an already committed step is skipped */
	m = meta_for(2);
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	st_ckpt_saver_free(s); /* waits for step 3 */
	CHECK(exists(tp("async/3/manifest.json")));
	free_pieces(&pl);
	/* step 1 holds the values at its save; steps 2 and 3 the changed ones */
	make_pieces(&pl, model, NT, 0, 1, 0, -1);
	CHECK(st_ckpt_restore_step(tp("async/1"), NULL, &m, pl.n, pl.p) == 0 && m.step == 1);
	CHECK(pl.p[0].data[0] == value(0, 0, 0, 1) && pl.p[0].data[1] == value(0, 0, 1, 1));
	st_ckpt_meta_release(&m);
	int found;
	CHECK(st_ckpt_restore_latest(dir, NULL, &m, pl.n, pl.p, &found) == 0 && found && m.step == 3);
	CHECK(pl.p[0].data[0] == -1 && pl.p[0].data[1] == value(0, 0, 1, 1));
	st_ckpt_meta_release(&m);
	free_pieces(&pl);
}

/*
 * defer_copy: the writer copies the pieces (chunks of 2 MB, checksummed as
 * they land) while the caller keeps them; st_ckpt_saver_release copies what
 * is left and returns once the saver no longer reads them. Pieces of odd
 * sizes, so that chunks straddle pieces. Cases: the writer held back (the
 * release copies everything), the release racing the writer (a mix), no
 * release (the writer copies everything before the wait returns).
 */
static void test_defer(void)
{
	DIRVAR(dir, "defer");
	const int64_t sizes[3] = {(5 << 20) / 4 + 3, 7, (3 << 20) + 1}; /* floats */
	const char *names[3] = {"a", "optimizer.mu.a", "b"};
	st_ckpt_piece p[3], q[3];
	int delay_ms = 300;
	for (int i = 0; i < 3; i++) {
		p[i] = (st_ckpt_piece){.name = names[i], .ndim = 1, .global_shape = {sizes[i], 0}, .shape = {sizes[i], 0},
				       .data = malloc((size_t)sizes[i] * 4)};
		q[i] = p[i];
		q[i].data = malloc((size_t)sizes[i] * 4);
	}
	for (int c = 0; c < 5; c++) {
		st_ckpt_opts o = opts_for(dir, 0, 1);
		st_ckpt_saver *s;
		st_ckpt_meta m = meta_for(c + 1);
		st_ckpt_stats st;
		double held;
		o.defer_copy = 1;
		if (c == 0) {
			o.before_write = slow_hook;
			o.hook_arg = &delay_ms;
		}
		for (int i = 0; i < 3; i++)
			for (int64_t k = 0; k < sizes[i]; k++)
				p[i].data[k] = (float)(k % 100003) + 0.5f * (float)c + (float)i;
		CHECK(st_ckpt_saver_create(&s, &o) == 0);
		CHECK(st_ckpt_save(s, &m, 3, p) == 0);
		if (c < 4) {
			CHECK(st_ckpt_saver_release(s, &held) == 1);
			if (c == 0)
				CHECK_MSG(held < 0.25, "the release waited %.3f s for a writer held back %d ms", held,
					  delay_ms);
			CHECK(st_ckpt_saver_release(s, &held) == 0 && held == 0);
			/* the caller may change its pieces now */
			for (int i = 0; i < 3; i++)
				p[i].data[0] = p[i].data[sizes[i] - 1] = -1;
		}
		CHECK(st_ckpt_wait(s) == 0);
		CHECK(st_ckpt_saver_release(s, &held) == 0);
		st_ckpt_saver_stats(s, &st);
		CHECK(st.committed == 1 && st.failed == 0);
		st_ckpt_saver_free(s);
		CHECK(st_ckpt_restore_step(tp("defer/%d", c + 1), NULL, &m, 3, q) == 0 && m.step == c + 1);
		st_ckpt_meta_release(&m);
		for (int i = 0; i < 3; i++) {
			int64_t bad = 0;
			for (int64_t k = 0; k < sizes[i]; k++)
				bad += q[i].data[k] != (float)(k % 100003) + 0.5f * (float)c + (float)i;
			CHECK_MSG(bad == 0, "case %d piece %d: %lld values differ", c, i, (long long)bad);
		}
	}
	for (int i = 0; i < 3; i++) {
		free(p[i].data);
		free(q[i].data);
	}
}

/* Save pieces (defer_copy) as step `step` of dir; release right after the
 * save when `release`, then overwrite the pieces (the next update); restore
 * and compare with the values saved. *direct: the bytes written straight
 * from the pieces. release 2: 20 ms after the save. */
static void save_deferred(const char *dir, int64_t step, int n, st_ckpt_piece *p, int release, int64_t *direct)
{
	st_ckpt_opts o = opts_for(dir, 0, 1);
	st_ckpt_saver *s;
	st_ckpt_meta m = meta_for(step);
	st_ckpt_stats st;
	st_ckpt_piece q[4];
	char sd[1300];
	double held;
	o.defer_copy = 1;
	for (int i = 0; i < n; i++)
		for (int64_t k = 0; k < p[i].shape[0]; k++)
			p[i].data[k] = (float)(k % 99991) + 0.25f * (float)step + (float)i;
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	CHECK(st_ckpt_save(s, &m, n, p) == 0);
	if (release) {
		usleep(release > 1 ? 20000 : 0); /* 2: the writer is under way */
		CHECK(st_ckpt_saver_release(s, &held) == 1);
		for (int i = 0; i < n; i++) /* the update, while the writer may still write */
			memset(p[i].data, 0xff, (size_t)p[i].shape[0] * 4);
	}
	CHECK(st_ckpt_wait(s) == 0);
	st_ckpt_saver_stats(s, &st);
	CHECK(st.committed == 1 && st.failed == 0);
	*direct = st.last_direct_bytes;
	st_ckpt_saver_free(s);
	for (int i = 0; i < n; i++) {
		q[i] = p[i];
		q[i].data = malloc((size_t)p[i].shape[0] * 4);
	}
	snprintf(sd, sizeof(sd), "%s/%lld", dir, (long long)step);
	CHECK_MSG(st_ckpt_restore_step(sd, NULL, &m, n, q) == 0 && m.step == step,
		  "restore: %s", st_errmsg());
	st_ckpt_meta_release(&m);
	for (int i = 0; i < n; i++) {
		int64_t bad = 0;
		for (int64_t k = 0; k < p[i].shape[0]; k++)
			bad += q[i].data[k] != (float)(k % 99991) + 0.25f * (float)step + (float)i;
		CHECK_MSG(bad == 0, "step %lld piece %d: %lld values differ", (long long)step, i, (long long)bad);
		free(q[i].data);
	}
}

/*
 * defer_copy writes block-aligned pieces straight from the caller's memory
 * (base/pages.h buffers, back to back: one run) and sends the rest through
 * the host buffer: a piece at an unaligned address, a run's unaligned end.
 * A release in the middle of the write copies what is left; either way the
 * checkpoint holds the values saved, bit for bit, and verifies.
 */
static void test_direct(void)
{
	DIRVAR(dir, "direct");
	const int64_t big = 6 << 20; /* floats: 24 MB */
	const char *names[4] = {"a", "b", "optimizer.mu.a", "c"};
	/* a and b back to back in one page-aligned block; mu.a the same size elsewhere;
	 * c 1001 floats at an address 4 bytes past a block boundary */
	float *block = st_pages_alloc((size_t)(2 * big + 1001) * 4), *other = st_pages_alloc((size_t)big * 4);
	float *odd = malloc(1001 * 4 + 64);
	st_ckpt_piece p[4];
	int64_t direct;
	int64_t sizes[4] = {big - 128, big + 128, big, 1001};
	float *data[4] = {block, block + big - 128, other, odd + 1};
	CHECK(block && other && odd);
	if (!block || !other || !odd)
		return;
	for (int i = 0; i < 4; i++)
		p[i] = (st_ckpt_piece){.name = names[i], .ndim = 1, .global_shape = {sizes[i], 0}, .shape = {sizes[i], 0},
				       .data = data[i]};
	/* no release: all but c and the partial blocks around it straight from memory */
	save_deferred(dir, 1, 4, p, 0, &direct);
	CHECK_MSG(direct >= (3 * big - 8192) * 4 && direct < (3 * big + 1001) * 4,
		  "%lld of %lld bytes written straight from the pieces", (long long)direct, (long long)(3 * big + 1001) * 4);
	/* only the aligned pieces: all of it (data starts on a block boundary: the header is padded) */
	save_deferred(dir, 2, 3, p, 0, &direct);
	CHECK_MSG(direct == 3 * big * 4, "%lld of %lld bytes written straight from the pieces", (long long)direct,
		  (long long)3 * big * 4);
	/* a release at once: the writer has claimed little; the rest is copied, the pieces then overwritten */
	save_deferred(dir, 3, 4, p, 1, &direct);
	CHECK(direct < (3 * big + 1001) * 4);
	/* a release while the writer is under way: it waits for the extent in flight, copies the rest */
	save_deferred(dir, 4, 4, p, 2, &direct);
	CHECK(direct < (3 * big + 1001) * 4);
	printf("test_direct: after a release 20 ms into the write, %.1f of %.1f MB went straight from the pieces\n",
	       direct / 1e6, (3 * big + 1001) * 4 / 1e6);
	for (int step = 1; step <= 4; step++) {
		char sd[1300];
		int64_t pieces, bytes;
		snprintf(sd, sizeof(sd), "%s/%d", dir, step);
		CHECK(st_ckpt_verify(sd, &pieces, &bytes) == 0 && pieces == (step == 2 ? 3 : 4));
	}
	st_pages_free(block, (size_t)(2 * big + 1001) * 4);
	st_pages_free(other, (size_t)big * 4);
	free(odd);
}

/*
 * Checksums the caller gives (st_ckpt_piece.crc32, as the trainer's update
 * computes them): stored as given, in every way of saving (deferred with and
 * without a release, async copy, synchronous); a checkpoint saved with right
 * ones restores and verifies, one with a wrong one is committed but fails to
 * restore and to verify (the saver used the given value, it did not checksum
 * the piece itself). Given for only some pieces: the saver checksums all.
 * The restores go into page-aligned memory laid out as the file: whole
 * blocks are read straight into it (meta.bytes_direct) where the file offset
 * and the address are both on a block (all of piece a but its last partial
 * block, the later parts of b once a read through the buffer has brought
 * the position onto a block), the rest through the read buffer; into memory
 * 4 bytes off that layout, nothing goes direct; the same values either way.
 */
static void test_given_crc(void)
{
	DIRVAR(dir, "given");
	const int64_t sizes[3] = {(3 << 20) + 5, 1000, 4 << 20};
	const char *names[3] = {"a", "optimizer.mu.a", "b"};
	st_ckpt_piece p[3], q[3];
	size_t all = (size_t)(sizes[0] + sizes[1] + sizes[2]) * 4;
	float *block = st_pages_alloc(all), *qblock = st_pages_alloc(all);
	CHECK(block != NULL && qblock != NULL);
	if (!block || !qblock)
		return;
	for (int i = 0, off = 0; i < 3; off += (int)sizes[i], i++) {
		p[i] = (st_ckpt_piece){.name = names[i], .ndim = 1, .global_shape = {sizes[i], 0}, .shape = {sizes[i], 0},
				       .data = block + off};
		q[i] = p[i];
		q[i].data = qblock + off;
	}
	/* mode: 0 deferred, 1 deferred with a release at once, 2 async copy, 3 synchronous; wrong: piece 2's crc + 1; 2: only piece 0 given */
	int step = 0;
	for (int mode = 0; mode < 4; mode++)
		for (int wrong = 0; wrong < 3; wrong++) {
			step++;
			st_ckpt_opts o = opts_for(dir, 0, 1);
			st_ckpt_saver *s;
			st_ckpt_meta m = meta_for(step);
			st_ckpt_stats st;
			double held;
			o.defer_copy = mode < 2;
			o.async = mode < 3;
			for (int i = 0; i < 3; i++) {
				for (int64_t k = 0; k < sizes[i]; k++)
					p[i].data[k] = (float)(k % 7919) * 0.5f + (float)(step + i);
				p[i].crc32 = st_crc32(0, p[i].data, (size_t)sizes[i] * 4) + (wrong == 1 && i == 2);
				p[i].has_crc32 = wrong < 2 || i == 0;
			}
			CHECK(st_ckpt_saver_create(&s, &o) == 0);
			CHECK_MSG(st_ckpt_save(s, &m, 3, p) == 0, "%s", st_errmsg());
			if (mode == 1) {
				CHECK(st_ckpt_saver_release(s, &held) == 1);
				for (int i = 0; i < 3; i++) /* the update, while the writer may still write */
					memset(p[i].data, 0xff, (size_t)sizes[i] * 4);
			}
			CHECK(st_ckpt_wait(s) == 0);
			st_ckpt_saver_stats(s, &st);
			CHECK(st.committed == 1 && st.failed == 0);
			st_ckpt_saver_free(s);
			char sd[1300];
			int64_t pieces, bytes;
			snprintf(sd, sizeof(sd), "%s/%d", dir, step);
			int rc = st_ckpt_restore_step(sd, NULL, &m, 3, q);
			if (rc == 0) {
				/* piece a starts on a block in the file and in q: all but its last partial block direct
				 * (unless the file system refuses O_DIRECT); mu.a and b start off a block */
				CHECK_MSG(m.bytes_direct == 0 || (m.bytes_direct >= sizes[0] * 4 - 4096 &&
								  m.bytes_direct < (int64_t)all - sizes[1] * 4),
					  "%lld bytes read straight into the destination", (long long)m.bytes_direct);
				if (mode == 0 && wrong == 0)
					printf("test_given_crc: %.1f of %.1f MB read straight into the destination\n",
					       1e-6 * (double)m.bytes_direct, 1e-6 * (double)all);
				st_ckpt_meta_release(&m);
			}
			if (rc == 0 && mode == 0 && wrong == 0) { /* off the file's alignment: all through the buffer */
				char *raw = malloc(all + 1024);
				char *base = (char *)(((uintptr_t)raw + 511) & ~(uintptr_t)511) + 4;
				st_ckpt_piece u[3];
				for (int i = 0, off = 0; i < 3; off += (int)sizes[i], i++) {
					u[i] = q[i];
					u[i].data = (float *)(void *)base + off;
				}
				CHECK(st_ckpt_restore_step(sd, NULL, &m, 3, u) == 0 && m.bytes_direct == 0);
				st_ckpt_meta_release(&m);
				for (int i = 0; i < 3; i++)
					CHECK(memcmp(u[i].data, q[i].data, (size_t)sizes[i] * 4) == 0);
				free(raw);
			}
			int vr = st_ckpt_verify(sd, &pieces, &bytes);
			if (wrong == 1) {
				CHECK_MSG(rc < 0 && vr < 0, "mode %d: a wrong given checksum was not what the saver stored "
					  "(restore %d, verify %d)", mode, rc, vr);
				continue;
			}
			CHECK_MSG(rc == 0 && vr == 0, "mode %d wrong %d: restore %d, verify %d: %s", mode, wrong, rc, vr,
				  st_errmsg());
			for (int i = 0; i < 3 && rc == 0; i++) {
				int64_t bad = 0;
				for (int64_t k = 0; k < sizes[i]; k++)
					bad += q[i].data[k] != (float)(k % 7919) * 0.5f + (float)(step + i);
				CHECK_MSG(bad == 0, "mode %d piece %d: %lld values differ", mode, i, (long long)bad);
			}
		}
	st_pages_free(block, all);
	st_pages_free(qblock, all);
}

/* a file system without O_DIRECT (tmpfs, on kernels that refuse it): buffered writes */
static void test_tmpfs(void)
{
	char dir[] = "/dev/shm/test_ckpt.XXXXXX";
	int64_t step;
	if (!mkdtemp(dir)) {
		check_skip_hw("tmpfs case: cannot create a directory in /dev/shm");
		return;
	}
	save_as(dir, 2, 4, 4, 1);
	CHECK(restore_as(dir, 0, 1, 1, 4, &step) == 0 && step == 4);
	rm_tree(dir);
}

/* ---- pieces larger than a restore part (4 MB): read in parts on several threads ---- */

static const struct tdef big_model[] = {
	{"big.weight", 2, {1031, 1029}}, /* 4.2 MB: two or three parts */
	{"odd.bias", 1, {1001, 0}},      /* leaves the next tensor's data off the block alignment */
	{"huge.bias", 1, {3000017, 0}},  /* 12 MB: four parts */
};
#define NBIG ((int)(sizeof(big_model) / sizeof(big_model[0])))

/* Where tensor name's first stored piece starts in step_dir's shard file (the only one here). */
static off_t data_offset(const char *step_dir, const char *name)
{
	struct ck_manifest m;
	off_t at = -1;
	if (ck_manifest_load(&m, step_dir, -1) == 0) {
		struct ck_tensor *t = ck_manifest_find(&m, name);
		if (t)
			at = (off_t)t->pieces[0].data_offset;
		ck_manifest_free(&m);
	}
	CHECK_MSG(at >= 0, "%s: no tensor %s", step_dir, name);
	return at;
}

/* flip_byte counting from the start of the file */
static void flip_at(const char *path, off_t at)
{
	struct stat st;
	CHECK(stat(path, &st) == 0);
	flip_byte(path, st.st_size - at);
}

/* st_ckpt_restore_step of big_model as one process: rc, values checked when it succeeds */
static int restore_big(const char *step_dir, int version)
{
	struct plist pl;
	st_ckpt_meta m;
	make_pieces(&pl, big_model, NBIG, 0, 1, 0, -1);
	int rc = st_ckpt_restore_step(step_dir, NULL, &m, pl.n, pl.p);
	if (rc == 0) {
		CHECK_MSG(mismatches(&pl, big_model, NBIG, version) == 0, "%s: wrong values", step_dir);
		st_ckpt_meta_release(&m);
	}
	free_pieces(&pl);
	return rc;
}

/* Corrupt and repair the shard of dir/1 (one process): each flipped byte named by its tensor,
 * the first in the requested order when there are two, a truncated file as truncated. */
static void damage_big(const char *dir)
{
	char step_dir[1200], shard[1300];
	snprintf(step_dir, sizeof(step_dir), "%s/1", dir);
	snprintf(shard, sizeof(shard), "%s/shard-00000-of-00001.safetensors", step_dir);
	off_t big = data_offset(step_dir, "big.weight"), huge = data_offset(step_dir, "huge.bias");
	const off_t in_huge[] = {0, 5000000, 12000067}; /* first, a middle and the last part */
	for (int k = 0; k < 3; k++) {
		flip_at(shard, huge + in_huge[k]);
		CHECK(restore_big(step_dir, 3) == ST_EIO);
		CHECK_MSG(strstr(st_errmsg(), "checksum mismatch in tensor huge.bias"), "byte %lld: %s",
			  (long long)in_huge[k], st_errmsg());
		flip_at(shard, huge + in_huge[k]);
	}
	CHECK_MSG(restore_big(step_dir, 3) == 0, "repaired: %s", st_errmsg());
	/* two damaged tensors: the first requested is reported, whichever thread finds which */
	flip_at(shard, huge + 7000000);
	flip_at(shard, big + 4200000);
	CHECK(restore_big(step_dir, 3) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "checksum mismatch in tensor big.weight"), "%s", st_errmsg());
	flip_at(shard, big + 4200000);
	flip_at(shard, huge + 7000000);
	/* a file that ends in the middle of huge.bias */
	CHECK(truncate(shard, huge + 6000000) == 0);
	CHECK(restore_big(step_dir, 3) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "file is truncated: tensor huge.bias"), "%s", st_errmsg());
}

static void test_large(void)
{
	DIRVAR(dir, "large");
	DIRVAR(dir2, "large2");
	int64_t step;
	/* the same mesh (each requested piece is a stored one: read in parts), and resharded */
	save_model(dir, big_model, NBIG, 1, 1, 3, 0);
	CHECK_MSG(restore_model(dir, big_model, NBIG, 0, 1, 0, 3, &step) == 0 && step == 1, "%s", st_errmsg());
	save_model(dir2, big_model, NBIG, 2, 1, 4, 1);
	for (int P = 1; P <= 3; P++)
		for (int p = 0; p < P; p++)
			CHECK_MSG(restore_model(dir2, big_model, NBIG, p, P, P == 3, 4, &step) == 0 && step == 1,
				  "%d of %d: %s", p, P, st_errmsg());
	damage_big(dir);
	/* the same without O_DIRECT (tmpfs): parts read buffered */
	char shm[] = "/dev/shm/test_ckpt.XXXXXX";
	if (!mkdtemp(shm)) {
		check_skip_hw("tmpfs case of large pieces: cannot create a directory in /dev/shm");
		return;
	}
	save_model(shm, big_model, NBIG, 1, 1, 3, 0);
	CHECK_MSG(restore_model(shm, big_model, NBIG, 0, 1, 0, 3, &step) == 0 && step == 1, "%s", st_errmsg());
	damage_big(shm);
	rm_tree(shm);
}

/* the copy stall for a large piece (printed for the record; bounded loosely) */
static void test_stall(void)
{
	const int64_t n = 32 << 20; /* 128 MB */
	st_ckpt_piece p = {.name = "big", .ndim = 1, .global_shape = {n, 0}, .shape = {n, 0}, .data = malloc((size_t)n * 4)};
	st_ckpt_opts o = opts_for(tp("stall"), 0, 1);
	st_ckpt_saver *s;
	st_ckpt_stats st;
	for (int64_t i = 0; i < n; i++)
		p.data[i] = (float)i;
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	CHECK(st_ckpt_saver_reserve(s, 1, &p) == 0); /* buffer faulted in, in the background */
	for (int k = 1; k <= 2; k++) {
		st_ckpt_meta m = meta_for(k);
		CHECK(st_ckpt_save(s, &m, 1, &p) == 0);
		st_ckpt_saver_stats(s, &st);
		printf("save %d of 128 MB: stall %.1f ms (copy %.1f ms, %.2f GB/s)\n", k, 1e3 * st.last_stall_s,
		       1e3 * st.last_copy_s, 0.134 / st.last_copy_s);
		CHECK(st.last_stall_s < 2.0);
	}
	CHECK(st_ckpt_wait(s) == 0);
	st_ckpt_saver_stats(s, &st);
	printf("write of 128 MB (+fsync, commit): %.1f ms\n", 1e3 * (st.last_write_s + st.last_commit_s));
	st_ckpt_saver_free(s);
	free(p.data);
	rm_tree(tp("stall"));
}

static void test_prune(void)
{
	DIRVAR(dir, "prune");
	st_ckpt_opts o = opts_for(dir, 0, 1);
	o.max_to_keep = 2;
	o.async = 0;
	st_ckpt_saver *s;
	struct plist pl;
	int64_t *steps;
	int n;
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 1, 0, 1);
	for (int k = 1; k <= 4; k++) {
		st_ckpt_meta m = meta_for(k * 10);
		CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	}
	st_ckpt_saver_free(s);
	free_pieces(&pl);
	CHECK(ck_list_steps(dir, 0, &steps, &n) == 0);
	CHECK_MSG(n == 2 && steps[0] == 30 && steps[1] == 40, "n %d", n);
	free(steps);
}

struct policy_case {
	enum st_ckpt_failure_policy policy;
	int async, rc_save, rc_wait;
	st_ckpt_stats st;
};

static void failing_save(void *arg)
{
	struct policy_case *pc = arg;
	DIRVAR(dir, "policy%d%d", (int)pc->policy, pc->async);
	st_ckpt_opts o = opts_for(dir, 0, 1);
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta m = meta_for(5);
	o.failure_policy = pc->policy;
	o.async = pc->async;
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	st_write_file_atomic(tp("policy%d%d/5", (int)pc->policy, pc->async), "x", 1); /* a file where the step dir goes */
	make_pieces(&pl, model, NT, 0, 1, 0, 1);
	pc->rc_save = st_ckpt_save(s, &m, pl.n, pl.p);
	pc->rc_wait = st_ckpt_wait(s);
	m = meta_for(6); /* the next save works */
	if (pc->rc_save == 0 && pc->rc_wait == 0)
		CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0 && st_ckpt_wait(s) == 0);
	st_ckpt_saver_stats(s, &pc->st);
	st_ckpt_saver_free(s);
	free_pieces(&pl);
}

static void test_policies(void)
{
	for (int async = 0; async <= 1; async++) {
		struct policy_case cont = {.policy = ST_CKPT_FAIL_CONTINUE, .async = async},
				   stop = {.policy = ST_CKPT_FAIL_STOP, .async = async};
		const char *err = capture(failing_save, &cont);
		CHECK_MSG(cont.rc_save == 0 && cont.rc_wait == 0 && cont.st.failed == 1 && cont.st.committed == 1, "%s", err);
		CHECK_MSG(strstr(err, "checkpoint step 5 FAILED") && strstr(err, "training goes on"), "%s", err);
		CHECK(strstr(cont.st.last_error, "/5"));
		err = capture(failing_save, &stop);
		CHECK_MSG((async ? stop.rc_save == 0 && stop.rc_wait == ST_EIO : stop.rc_save == ST_EIO) && stop.st.failed == 1,
			  "async %d: %d %d: %s", async, stop.rc_save, stop.rc_wait, err);
		CHECK_MSG(strstr(err, "checkpoint step 5 FAILED") && strstr(err, "the run stops"), "%s", err);
	}
	/* process 0 waits for a process that never saves: a bounded wait and a clear error */
	st_ckpt_opts o = opts_for(tp("timeout"), 0, 2);
	o.commit_timeout_ms = 300;
	o.failure_policy = ST_CKPT_FAIL_STOP;
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta m = meta_for(1);
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 2, 0, 1);
	fflush(stderr);
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	CHECK(st_ckpt_wait(s) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "process 1 did not finish its shard within 0.3 s"), "%s", st_errmsg());
	/* and abort cuts such a wait short */
	o.commit_timeout_ms = 60000;
	st_ckpt_saver_free(s);
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	m = meta_for(2);
	double t0 = st_mono_s();
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	usleep(50000);
	st_ckpt_saver_abort(s);
	CHECK(st_ckpt_wait(s) == ST_EPEER && st_mono_s() - t0 < 5);
	st_ckpt_saver_free(s);
	free_pieces(&pl);
	/* invalid pieces are rejected at once */
	o = opts_for(tp("bad"), 0, 1);
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 1, 0, 1);
	pl.p[0].offset[0] = 1;
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == ST_EINVAL && strstr(st_errmsg(), "outside dimension 0"));
	pl.p[0].offset[0] = 0;
	free(pl.p[1].data);
	pl.p[1] = pl.p[0];
	CHECK(st_ckpt_save(s, &m, 2, pl.p) == ST_EINVAL && strstr(st_errmsg(), "passed twice"));
	pl.p[1].data = NULL; /* shared with piece 0 */
	m.config_json = NULL;
	CHECK(st_ckpt_save(s, &m, 1, pl.p) == ST_EINVAL && strstr(st_errmsg(), "resolved config"));
	st_ckpt_saver_free(s);
	free_pieces(&pl);
}

/* pieces of several processes that do not tile a tensor: process 0 refuses to commit */
static void test_tiling(void)
{
	st_ckpt_saver *s0, *s1;
	st_ckpt_opts o0 = opts_for(tp("tile"), 0, 2), o1 = opts_for(tp("tile"), 1, 2);
	struct plist a, b;
	st_ckpt_meta m = meta_for(1);
	o0.failure_policy = ST_CKPT_FAIL_STOP;
	CHECK(st_ckpt_saver_create(&s0, &o0) == 0 && st_ckpt_saver_create(&s1, &o1) == 0);
	make_pieces(&a, model, NT, 0, 2, 0, 1);
	make_pieces(&b, model, NT, 0, 2, 0, 1); /* process 1 saves process 0's boxes */
	CHECK(st_ckpt_save(s1, &m, b.n, b.p) == 0 && st_ckpt_save(s0, &m, a.n, a.p) == 0);
	CHECK(st_ckpt_wait(s1) == 0);
	fflush(stderr);
	CHECK(st_ckpt_wait(s0) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "overlap"), "%s", st_errmsg());
	CHECK(!exists(tp("tile/1/manifest.json")));
	st_ckpt_saver_free(s0);
	st_ckpt_saver_free(s1);
	free_pieces(&a);
	free_pieces(&b);
}

/* ---- malformed manifests and done records ---- */

static void expect_parse_error(const char *text, int done, const char *want)
{
	struct ck_manifest m;
	int rc = ck_manifest_parse(&m, "M", text, done, -1);
	CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), want), "want '%s', got rc %d: %s", want, rc, st_errmsg());
	if (rc == 0)
		ck_manifest_free(&m);
}

/* text of path with json edited by fn */
static char *edited(const char *path, void (*fn)(json_t *))
{
	json_error_t e;
	json_t *j = json_load_file(path, 0, &e);
	CHECK(j != NULL);
	fn(j);
	char *s = json_dumps(j, 0);
	json_decref(j);
	return s;
}

static json_t *piece0(json_t *j) { return json_array_get(json_object_get(json_array_get(json_object_get(j, "tensors"), 0), "pieces"), 0); }
static void drop_next_sample(json_t *j) { json_object_del(j, "next_sample"); }
static void drop_process(json_t *j) { json_object_del(j, "process"); }
static void box_out_of_range(json_t *j) { json_array_set_new(json_object_get(piece0(j), "offset"), 0, json_integer(11)); }
static void unknown_file(json_t *j) { json_object_set_new(piece0(j), "file", json_string("shard-00009-of-00009.safetensors")); }
static void bad_crc(json_t *j) { json_object_set_new(piece0(j), "crc32", json_integer(12345)); }
static void crc_range(json_t *j) { json_object_set_new(piece0(j), "crc32", json_integer(1LL << 40)); }
static void wrong_nbytes(json_t *j) { json_object_set_new(piece0(j), "nbytes", json_integer(4)); }
static void drop_piece(json_t *j) { json_array_remove(json_object_get(json_array_get(json_object_get(j, "tensors"), 0), "pieces"), 0); }
static void escape_name(json_t *j) { json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "name", json_string("../x")); }

static void test_malformed(void)
{
	DIRVAR(dir, "mal");
	DIRVAR(man, "mal/1/manifest.json");
	DIRVAR(done, "mal/1/done-00001.json");
	char *s;
	save_as(dir, 2, 1, 1, 1);
	save_as(dir, 2, 2, 2, 1);

	expect_parse_error("{\"format\": ", 0, "bad JSON");
	expect_parse_error("[]", 0, "not a JSON object");
	expect_parse_error("{\"format\": \"other\"}", 0, "is not a slicetrain checkpoint file");
	struct {
		void (*fn)(json_t *);
		const char *want;
	} cases[] = {
		{drop_next_sample, "missing field \"next_sample\""},
		{box_out_of_range, "box [11:17,0:5] is out of range"},
		{unknown_file, "unknown file \"shard-00009-of-00009.safetensors\""},
		{crc_range, "\"crc32\" is out of range"},
		{wrong_nbytes, "\"nbytes\" does not match the box"},
		{drop_piece, "pieces cover 30 of 60 elements"},
		{escape_name, "not a plain file name"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		s = edited(man, cases[i].fn);
		expect_parse_error(s, 0, cases[i].want);
		free(s);
	}
	/* done records: the same checks, plus their own fields */
	s = edited(done, drop_process);
	expect_parse_error(s, 1, "missing field \"process\"");
	free(s);
	s = edited(done, box_out_of_range);
	expect_parse_error(s, 1, "out of range");
	free(s);
	s = edited(done, unknown_file);
	expect_parse_error(s, 1, "unknown file");
	free(s);
	expect_parse_error("{]", 1, "bad JSON");

	/* end to end: a manifest whose checksum does not match the data -> fall back */
	s = edited(tp("mal/2/manifest.json"), bad_crc);
	CHECK(st_write_file_atomic(tp("mal/2/manifest.json"), s, strlen(s)) == 0);
	free(s);
	struct restore_call c = {.dir = dir, .step = 1};
	const char *err = capture(restore_quiet, &c);
	CHECK_MSG(c.rc == 0 && c.step == 1 && strstr(err, "checksum mismatch"), "%s", err);

	/* process 0 meets a malformed done record of process 1: the save fails, naming it */
	st_ckpt_opts o = opts_for(tp("mal2"), 0, 2);
	o.failure_policy = ST_CKPT_FAIL_STOP;
	st_ckpt_saver *sv;
	struct plist pl;
	st_ckpt_meta m = meta_for(3);
	CHECK(st_ckpt_saver_create(&sv, &o) == 0);
	CHECK(st_mkdir_p(tp("mal2/3")) == 0);
	CHECK(st_write_file_atomic(tp("mal2/3/done-00001.json"), "{oops", 5) == 0);
	make_pieces(&pl, model, NT, 0, 2, 0, 1);
	fflush(stderr);
	CHECK(st_ckpt_save(sv, &m, pl.n, pl.p) == 0);
	CHECK(st_ckpt_wait(sv) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "done-00001.json") && strstr(st_errmsg(), "bad JSON"), "%s", st_errmsg());
	st_ckpt_saver_free(sv);
	free_pieces(&pl);
}

/* ---- list and verify ---- */

static void test_list_verify(void)
{
	DIRVAR(dir, "lv");
	st_ckpt_step_info *v;
	int64_t pieces, bytes;
	int n;
	save_as(dir, 2, 4, 4, 1);
	save_as(dir, 3, 8, 8, 1);
	CHECK(st_mkdir_p(tp("lv/12")) == 0);
	CHECK(st_write_file_atomic(tp("lv/12/done-00000.json"), "{}", 2) == 0);
	CHECK(st_ckpt_list(dir, &v, &n) == 0 && n == 3);
	CHECK(v[0].step == 4 && v[0].committed == 1 && v[0].process_count == 2 && v[0].nshards == 2 && v[0].bytes > 0);
	CHECK(v[1].step == 8 && v[1].committed == 1 && v[1].process_count == 3 && strstr(v[1].mesh, "fsdp=4"));
	CHECK(v[2].step == 12 && v[2].committed == 0 && v[2].ndone == 1);
	free(v);
	CHECK(st_ckpt_verify(tp("lv/8"), &pieces, &bytes) == 0);
	CHECK(pieces == 3 * NT && bytes == 4 * 3 * (12 * 5 + 7 * 3 + 9));
	CHECK(st_ckpt_verify(tp("lv/12"), &pieces, &bytes) == ST_EINVAL);
	flip_byte(tp("lv/8/shard-00002-of-00003.safetensors"), 1);
	fflush(stderr);
	CHECK(st_ckpt_verify(tp("lv/8"), &pieces, &bytes) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "shard-00002-of-00003.safetensors: checksum mismatch in tensor "
				       "optimizer.nu.model.norm.weight[6:9]"), "%s", st_errmsg());
}

/* ---- elastic generations: file names, the fence ---- */

/*
 * Process p of 2 of generation gen (ST_CKPT_NO_GENERATION: none), synchronous
 * under the stop policy, so that each call below is one step of a fixed
 * order: a process other than 0 has written its shard and done record when
 * its st_ckpt_save returns, and process 0 commits (or fails) inside its own.
 */
static st_ckpt_opts gen_opts(const char *run, int p, int64_t gen)
{
	static char dirs[4][1200], fences[4][1200];
	static int k;
	k = (k + 1) % 4;
	snprintf(dirs[k], sizeof(dirs[k]), "%s/checkpoints", run);
	snprintf(fences[k], sizeof(fences[k]), "%s/%s", run, ST_CKPT_FENCE_FILE);
	st_ckpt_opts o = opts_for(dirs[k], p, 2);
	o.async = 0;
	o.failure_policy = ST_CKPT_FAIL_STOP;
	o.generation = gen;
	o.fence = fences[k];
	return o;
}

/* Save step (its values: version step) with a saver of these options; the save's rc. */
static int gen_save(st_ckpt_opts o, int64_t step)
{
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta m = meta_for(step);
	int rc = st_ckpt_saver_create(&s, &o);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	if (rc < 0)
		return rc;
	make_pieces(&pl, model, NT, o.process, o.process_count, 0, (int)step);
	fflush(stderr);
	rc = st_ckpt_save(s, &m, pl.n, pl.p);
	if (rc == 0)
		rc = st_ckpt_wait(s);
	st_ckpt_saver_free(s);
	free_pieces(&pl);
	return rc;
}

/* the hooks move the run on to generation 7 (arg: the fence file) */
static void advance_fence(void *arg, int64_t step)
{
	(void)step;
	CHECK(st_ckpt_fence_write(arg, 7) == 0);
}

struct gen_call {
	st_ckpt_opts o;
	int64_t step;
	int rc;
	char err[512];
};

static void gen_save_call(void *arg)
{
	struct gen_call *c = arg;
	c->rc = gen_save(c->o, c->step);
	snprintf(c->err, sizeof(c->err), "%s", st_errmsg());
}

struct saver_call {
	st_ckpt_saver *s;
	const struct plist *pl;
	int64_t step;
	int rc;
	char err[512];
};

static void saver_save_call(void *arg)
{
	struct saver_call *c = arg;
	st_ckpt_meta m = meta_for(c->step);
	c->rc = st_ckpt_save(c->s, &m, c->pl->n, c->pl->p);
	if (c->rc == 0)
		c->rc = st_ckpt_wait(c->s);
	snprintf(c->err, sizeof(c->err), "%s", st_errmsg());
}

/* Both processes of generation gen save step, in the trainer's order: process
 * 0's saver first (its cleanup), then process 1's save, then process 0's. */
static int gen_save2(const char *run, int64_t gen, int64_t step)
{
	st_ckpt_opts o = gen_opts(run, 0, gen);
	struct plist pl;
	struct saver_call c = {.pl = &pl, .step = step};
	int rc = st_ckpt_saver_create(&c.s, &o);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	if (rc < 0)
		return rc;
	make_pieces(&pl, model, NT, 0, 2, 0, (int)step);
	if ((rc = gen_save(gen_opts(run, 1, gen), step)) == 0) {
		saver_save_call(&c);
		rc = c.rc;
	}
	st_ckpt_saver_free(c.s);
	free_pieces(&pl);
	return rc;
}

static void create_saver_quiet_opts(void *arg)
{
	st_ckpt_saver *s;
	CHECK(st_ckpt_saver_create(&s, arg) == 0);
	st_ckpt_saver_free(s);
}

/* The manifest of step_dir lists only files of generation gen, and records it. */
static void expect_generation(const char *step_dir, int64_t gen)
{
	struct ck_manifest m;
	char tag[32];
	snprintf(tag, sizeof(tag), "-g%06lld-", (long long)gen);
	CHECK_MSG(ck_manifest_load(&m, step_dir, -1) == 0, "%s", st_errmsg());
	CHECK_MSG(m.generation == gen, "%s: generation %lld, want %lld", step_dir, (long long)m.generation,
		  (long long)gen);
	CHECK(m.nfiles == 2);
	for (int f = 0; f < m.nfiles; f++)
		CHECK_MSG(gen < 0 ? !strchr(m.files[f].name, 'g') : strstr(m.files[f].name, tag) != NULL, "%s",
			  m.files[f].name);
	ck_manifest_free(&m);
}

/* (e) names and manifest with and without a generation; list, verify, restore, cleanup of both */
static void test_generation_names(void)
{
	DIRVAR(run, "gen-names");
	DIRVAR(dir, "gen-names/checkpoints");
	int64_t step, pieces, bytes;
	st_ckpt_step_info *v;
	int n;
	char *text;

	CHECK(gen_save2(run, 7, 1) == 0);
	CHECK(exists(tp("gen-names/checkpoints/1/shard-g000007-00000-of-00002.safetensors")));
	CHECK(exists(tp("gen-names/checkpoints/1/shard-g000007-00001-of-00002.safetensors")));
	CHECK(exists(tp("gen-names/checkpoints/1/done-g000007-00001.json")));
	CHECK(!exists(tp("gen-names/checkpoints/1/shard-00000-of-00002.safetensors")));
	expect_generation(tp("gen-names/checkpoints/1"), 7);
	CHECK(st_read_file(tp("gen-names/checkpoints/1/done-g000007-00001.json"), 1 << 20, &text, NULL) == 0);
	CHECK(strstr(text, "\"generation\": 7") != NULL);
	free(text);
	st_safetensors *f;
	CHECK(st_safetensors_open(&f, tp("gen-names/checkpoints/1/shard-g000007-00001-of-00002.safetensors")) == 0);
	const char *g = st_safetensors_meta(f, "slicetrain.generation");
	CHECK_MSG(g && !strcmp(g, "7"), "%s", g ? g : "(none)");
	st_safetensors_close(f);
	CHECK_MSG(restore_as(dir, 0, 1, 1, 1, &step) == 0 && step == 1, "%s", st_errmsg());
	CHECK_MSG(st_ckpt_verify(tp("gen-names/checkpoints/1"), &pieces, &bytes) == 0, "%s", st_errmsg());

	/* a fence at the save's own generation is no obstacle */
	CHECK(st_ckpt_fence_write(tp("gen-names/%s", ST_CKPT_FENCE_FILE), 7) == 0);
	CHECK(gen_save2(run, 7, 2) == 0);
	CHECK(exists(tp("gen-names/checkpoints/2/manifest.json")));

	/* without a generation: today's names, no "generation" field, the fence not read (it says 7) */
	CHECK(gen_save2(run, ST_CKPT_NO_GENERATION, 3) == 0);
	CHECK(exists(tp("gen-names/checkpoints/3/shard-00001-of-00002.safetensors")));
	CHECK(exists(tp("gen-names/checkpoints/3/done-00000.json")));
	expect_generation(tp("gen-names/checkpoints/3"), -1);
	CHECK(st_read_file(tp("gen-names/checkpoints/3/manifest.json"), 1 << 20, &text, NULL) == 0);
	CHECK(!strstr(text, "generation"));
	free(text);
	CHECK(restore_as(dir, 0, 1, 0, 3, &step) == 0 && step == 3);

	/* an uncommitted step of generation 7: listed with its files, then cleaned up */
	CHECK(gen_save(gen_opts(run, 1, 7), 4) == 0);
	CHECK(st_ckpt_list(dir, &v, &n) == 0 && n == 4);
	CHECK_MSG(v[3].step == 4 && v[3].committed == 0 && v[3].nshards == 1 && v[3].ndone == 1 &&
		  v[3].process_count == 2, "step %lld: committed %d, %d shards, %d done, %d processes",
		  (long long)v[3].step, v[3].committed, v[3].nshards, v[3].ndone, v[3].process_count);
	CHECK(v[0].committed == 1 && v[0].nshards == 2 && v[0].ndone == 2 && v[0].process_count == 2);
	free(v);
	CHECK(ck_is_shard_name("shard-g000007-00001-of-00002.safetensors", &n) && n == 2);
	CHECK(ck_is_shard_name("shard-00001-of-00003.safetensors", &n) && n == 3);
	CHECK(!ck_is_shard_name("shard-g000007-00001-of-00002.safetensors.tmp.123", &n));
	CHECK(!ck_is_shard_name("shard-gx-00001-of-00002.safetensors", &n));
	CHECK(ck_is_done_name("done-g000007-00001.json") && ck_is_done_name("done-00001.json"));
	CHECK(!ck_is_done_name("done-00001.json.tmp.77") && !ck_is_done_name("done-g7.json"));
	st_ckpt_opts o = gen_opts(run, 0, 7);
	const char *err = capture(create_saver_quiet_opts, &o);
	CHECK_MSG(strstr(err, "removing uncommitted checkpoint") && !exists(tp("gen-names/checkpoints/4")), "%s", err);
}

/* (a) a shard write after the fence moved on, and a stale process 0's cleanup: refused */
static void test_generation_stale_write(void)
{
	DIRVAR(run, "gen-stale");
	DIRVAR(fence, "gen-stale/%s", ST_CKPT_FENCE_FILE);
	st_ckpt_opts o = gen_opts(run, 0, 5);
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta m = meta_for(3);
	st_ckpt_stats st;

	/* the fence moves while the save is in flight, before its writer starts */
	o.async = 1;
	o.process_count = 1;
	o.before_write = advance_fence;
	o.hook_arg = fence;
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 1, 0, 3);
	fflush(stderr);
	CHECK(st_ckpt_save(s, &m, pl.n, pl.p) == 0);
	CHECK(st_ckpt_wait(s) == ST_EIO);
	CHECK_MSG(strstr(st_errmsg(), "checkpoint step 3: generation 5 is stale (the run is at generation 7") &&
		  strstr(st_errmsg(), "not committed"), "%s", st_errmsg());
	st_ckpt_saver_stats(s, &st);
	CHECK(st.failed == 1 && st.committed == 0 && strstr(st.last_error, "is stale"));
	st_ckpt_saver_free(s);
	free_pieces(&pl);
	CHECK(!exists(tp("gen-stale/checkpoints/3"))); /* no shard, no step directory */

	/* process 0 of generation 5 removes nothing once generation 7 runs: that may be its save in flight */
	CHECK(st_mkdir_p(tp("gen-stale/checkpoints/9")) == 0);
	o = gen_opts(run, 0, 5);
	CHECK(st_ckpt_saver_create(&s, &o) == ST_EIO && !s);
	CHECK_MSG(strstr(st_errmsg(), "generation 5 is stale (the run is at generation 7") &&
		  strstr(st_errmsg(), "removing no uncommitted checkpoint"), "%s", st_errmsg());
	CHECK(exists(tp("gen-stale/checkpoints/9")));
	o = gen_opts(run, 1, 5); /* another process's saver removes nothing anyway */
	CHECK(st_ckpt_saver_create(&s, &o) == 0);
	st_ckpt_saver_free(s);
}

/* (b) every shard and done record of generation 5 written, then the fence moves before process 0 commits */
static void test_generation_stale_commit(void)
{
	DIRVAR(run, "gen-commit");
	DIRVAR(fence, "gen-commit/%s", ST_CKPT_FENCE_FILE);
	DIRVAR(dir, "gen-commit/checkpoints");
	st_ckpt_opts o = gen_opts(run, 0, 5);
	struct plist pl;
	struct saver_call c = {.pl = &pl, .step = 6};
	int64_t step = 0;

	CHECK(st_mkdir_p(run) == 0 && st_ckpt_fence_write(fence, 5) == 0);
	o.before_commit = advance_fence;
	o.hook_arg = fence;
	CHECK(st_ckpt_saver_create(&c.s, &o) == 0);
	make_pieces(&pl, model, NT, 0, 2, 0, 6);
	CHECK(gen_save(gen_opts(run, 1, 5), 6) == 0);
	const char *err = capture(saver_save_call, &c);
	CHECK_MSG(c.rc == ST_EIO && strstr(c.err, "checkpoint step 6: generation 5 is stale (the run is at generation 7") &&
		  strstr(c.err, "not committed"), "rc %d: %s", c.rc, c.err);
	CHECK_MSG(strstr(err, "checkpoint step 6 FAILED") && strstr(err, "is stale"), "%s", err);
	CHECK(exists(tp("gen-commit/checkpoints/6/done-g000005-00000.json")) &&
	      exists(tp("gen-commit/checkpoints/6/done-g000005-00001.json")));
	CHECK(!exists(tp("gen-commit/checkpoints/6/manifest.json")));
	CHECK(restore_as(dir, 0, 1, 0, 6, &step) == 0 && step == -1); /* nothing committed */
	st_ckpt_saver_free(c.s);
	free_pieces(&pl);
}

/* (c) a done record of another generation is not merged into this generation's commit */
static void test_generation_foreign_done(void)
{
	DIRVAR(run, "gen-foreign");
	DIRVAR(fence, "gen-foreign/%s", ST_CKPT_FENCE_FILE);
	st_ckpt_opts o = gen_opts(run, 0, 7);
	struct plist pl;
	char *text;
	int64_t step, pieces, bytes;

	o.commit_timeout_ms = 300;
	struct saver_call c = {.pl = &pl, .step = 4};
	CHECK(st_ckpt_saver_create(&c.s, &o) == 0); /* generation 7's process 0, its cleanup done */
	make_pieces(&pl, model, NT, 0, 2, 0, 4);
	/* generation 5's process 1 saves step 4 (it read the fence before generation 7 began) ... */
	CHECK(gen_save(gen_opts(run, 1, 5), 4) == 0);
	CHECK(st_ckpt_fence_write(fence, 7) == 0);
	/* ... and its record also lies under generation 7's name (copied, renamed) */
	CHECK(st_read_file(tp("gen-foreign/checkpoints/4/done-g000005-00001.json"), 1 << 20, &text, NULL) == 0);
	CHECK(st_write_file_atomic(tp("gen-foreign/checkpoints/4/done-g000007-00001.json"), text, strlen(text)) == 0);
	free(text);
	/* process 0 of generation 7 merges neither: it logs the record once and waits for its own */
	const char *err = capture(saver_save_call, &c);
	CHECK_MSG(c.rc == ST_EIO && strstr(c.err, "process 1 did not finish its shard"), "rc %d: %s", c.rc, c.err);
	CHECK_MSG(strstr(err, "ignoring") && strstr(err, "done-g000007-00001.json: a record of generation 5, this "
			  "save is generation 7"), "%s", err);
	const char *first = strstr(err, "ignoring");
	CHECK_MSG(first && !strstr(first + 1, "ignoring"), "logged more than once: %s", err);
	CHECK(!exists(tp("gen-foreign/checkpoints/4/manifest.json")));
	/* generation 7's process 1 writes its record: the commit takes it, and only generation 7's files */
	CHECK(gen_save(gen_opts(run, 1, 7), 4) == 0);
	saver_save_call(&c);
	CHECK_MSG(c.rc == 0, "%s", c.err);
	expect_generation(tp("gen-foreign/checkpoints/4"), 7);
	DIRVAR(dir, "gen-foreign/checkpoints");
	CHECK(restore_as(dir, 0, 1, 1, 4, &step) == 0 && step == 4);
	CHECK_MSG(st_ckpt_verify(tp("gen-foreign/checkpoints/4"), &pieces, &bytes) == 0, "%s", st_errmsg());
	st_ckpt_saver_free(c.s);
	free_pieces(&pl);
}

/* (d) a fence file that is not one generation number */
static void test_generation_bad_fence(void)
{
	DIRVAR(run, "gen-bad");
	DIRVAR(fence, "gen-bad/%s", ST_CKPT_FENCE_FILE);
	int64_t g = -1;
	static const char *const good[] = {"7", "7\n", "0\n", "123456789012345678"};
	static const int64_t want[] = {7, 7, 0, 123456789012345678};
	static const char *const bad[] = {"", "\n", "abc", "7x", "-3", " 7", "7 ", "7\n\n", "+7", "0x7",
					  "1234567890123456789", "7\n8"};
	CHECK(st_mkdir_p(run) == 0);
	CHECK(st_ckpt_fence_read(fence, &g) == 0 && g == -1); /* no file: no newer generation */
	for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
		CHECK(st_write_file_atomic(fence, good[i], strlen(good[i])) == 0);
		CHECK_MSG(st_ckpt_fence_read(fence, &g) == 1 && g == want[i], "'%s': %s", good[i], st_errmsg());
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		CHECK(st_write_file_atomic(fence, bad[i], strlen(bad[i])) == 0);
		int rc = st_ckpt_fence_read(fence, &g);
		CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), "malformed generation fence") &&
			  strstr(st_errmsg(), fence), "'%s': rc %d: %s", bad[i], rc, st_errmsg());
	}
	char big[100];
	memset(big, '7', sizeof(big));
	CHECK(st_write_file_atomic(fence, big, sizeof(big)) == 0);
	CHECK(st_ckpt_fence_read(fence, &g) == ST_EINVAL && strstr(st_errmsg(), "more than 64 bytes"));
	CHECK(st_ckpt_fence_write(fence, -1) == ST_EINVAL);
	CHECK(st_ckpt_fence_write(fence, 12) == 0 && st_ckpt_fence_read(fence, &g) == 1 && g == 12);
	CHECK(st_mkdir_p(tp("gen-bad/dir-fence")) == 0);
	CHECK(st_ckpt_fence_read(tp("gen-bad/dir-fence"), &g) == ST_EIO);
	/* a save meets it: fails naming the file, commits nothing */
	CHECK(st_write_file_atomic(fence, "seven\n", 6) == 0);
	struct gen_call c = {.o = gen_opts(run, 1, 5), .step = 2};
	const char *err = capture(gen_save_call, &c);
	CHECK_MSG(c.rc == ST_EINVAL && strstr(c.err, "checkpoint step 2: ") && strstr(c.err, fence) &&
		  strstr(c.err, "malformed generation fence: \"seven?\" is not a generation number"), "rc %d: %s", c.rc,
		  c.err);
	CHECK_MSG(strstr(err, "checkpoint step 2 FAILED"), "%s", err);
	CHECK(!exists(tp("gen-bad/checkpoints/2")));
	/* and a manifest or done record whose "generation" is not a generation is malformed */
	expect_parse_error("{\"format\": \"slicetrain.done\", \"version\": 1, \"step\": 1, \"process_count\": 1, "
			   "\"save_id\": \"0\", \"generation\": \"7\"}", 1, "field \"generation\" is not an integer");
	expect_parse_error("{\"format\": \"slicetrain.done\", \"version\": 1, \"step\": 1, \"process_count\": 1, "
			   "\"save_id\": \"0\", \"generation\": -2}", 1, "field \"generation\" is out of range");
}

/* ---- a resumed run keeps its checkpoint's batch (st_ckpt_check_resume) ---- */

static void test_check_resume(void)
{
	DIRVAR(dir, "resume");
	const char *root = getenv("ST_ROOT");
	char cfgdir[1024], base[1100], *cj = NULL;
	char *ov[] = {"model_name=llama3-test", "run_name=resume", "base_output_directory=/tmp/x",
		      "max_target_length=16", "per_device_batch_size=2"};
	st_config c, c2;
	st_ckpt_saver *s;
	struct plist pl;
	st_ckpt_meta r = {0};
	int found = 0;

	snprintf(cfgdir, sizeof(cfgdir), "%s/configs", root && *root ? root : ".");
	snprintf(base, sizeof(base), "%s/base.yml", cfgdir);
	st_config_set_config_dir(cfgdir);
	CHECK_MSG(st_config_load(&c, base, 5, ov) == 0, "%s", st_errmsg());
	CHECK(!c.resume_allow_batch_change); /* the default */
	CHECK(st_config_to_json(&c, &cj) == 0);
	/* a checkpoint of this config trained at a global batch of 8 (2 rows on
	 * 4 devices), through a real save and restore (the manifest's meta and
	 * saved config, as a resuming trainer has them) */
	st_ckpt_opts o = opts_for(dir, 0, 1);
	o.async = 0;
	CHECK_MSG(st_ckpt_saver_create(&s, &o) == 0, "%s", st_errmsg());
	make_pieces(&pl, model, NT, 0, 1, 0, 1);
	st_ckpt_meta m = meta_for(10);
	m.config_json = cj;
	m.global_batch = 8;
	CHECK_MSG(st_ckpt_save(s, &m, pl.n, pl.p) == 0, "%s", st_errmsg());
	st_ckpt_saver_free(s);
	free_pieces(&pl);
	make_pieces(&pl, model, NT, 0, 1, 0, -1);
	CHECK_MSG(st_ckpt_restore_latest(dir, NULL, &r, pl.n, pl.p, &found) == 0 && found, "%s", st_errmsg());
	free_pieces(&pl);
	CHECK(r.global_batch == 8 && r.step == 10);

	/* the same batch, on another mesh (4 rows on 2 devices): resumes */
	c2 = c;
	c2.per_device_batch_size = 4;
	CHECK_MSG(st_ckpt_check_resume(&r, &c2, 8, 0) == 0, "%s", st_errmsg());
	/* another global batch: refused, naming both values and the override */
	CHECK(st_ckpt_check_resume(&r, &c, 4, 0) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "step 10") && strstr(st_errmsg(), "trained with a global batch of 8 sequences") &&
		  strstr(st_errmsg(), "this run has a global batch of 4 sequences") &&
		  strstr(st_errmsg(), "resume_allow_batch_change=true") && !strstr(st_errmsg(), "max_target_length"),
		  "%s", st_errmsg());
	/* another sequence length */
	c2 = c;
	c2.max_target_length = 32;
	CHECK(st_ckpt_check_resume(&r, &c2, 8, 0) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "trained with max_target_length 16; this run has max_target_length 32") &&
		  !strstr(st_errmsg(), "global batch"), "%s", st_errmsg());
	/* both */
	CHECK(st_ckpt_check_resume(&r, &c2, 12, 0) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "trained with max_target_length 16, a global batch of 8 sequences; this run has "
				       "max_target_length 32, a global batch of 12 sequences"), "%s", st_errmsg());
	/* the explicit override */
	c2.resume_allow_batch_change = 1;
	CHECK_MSG(st_ckpt_check_resume(&r, &c2, 12, 0) == 0, "%s", st_errmsg());
	/* elastic_batch=scale: the global batch follows the devices, what a
	 * device trains is compared instead */
	CHECK_MSG(st_ckpt_check_resume(&r, &c, 4, 1) == 0, "%s", st_errmsg());
	c2 = c;
	c2.gradient_accumulation_steps = 2;
	CHECK(st_ckpt_check_resume(&r, &c2, 8, 1) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "per_device_batch_size 2 x gradient_accumulation_steps 1; this run has "
				       "per_device_batch_size 2 x gradient_accumulation_steps 2"), "%s", st_errmsg());
	/* what a checkpoint does not record is not compared */
	st_ckpt_meta bare = {.step = 3};
	CHECK(st_ckpt_check_resume(&bare, &c2, 5, 0) == 0);
	st_ckpt_meta_release(&r);
	free(cj);
}

/* ---- Hugging Face export and import ---- */

static void test_hf(void)
{
	const char *root = getenv("ST_ROOT");
	char cfgdir[1024], base[1100];
	char *ov[] = {"model_name=llama3-test", "run_name=hf", "rope_type=llama3.1", "base_output_directory=/tmp/x"};
	st_config c;
	st_llama_shape shape;
	struct tdef *td;
	struct plist *pl = calloc(1, sizeof(*pl) * 4);
	int nt;
	char *cj;

	snprintf(cfgdir, sizeof(cfgdir), "%s/configs", root && *root ? root : ".");
	snprintf(base, sizeof(base), "%s/base.yml", cfgdir);
	st_config_set_config_dir(cfgdir);
	CHECK_MSG(st_config_load(&c, base, 4, ov) == 0, "%s", st_errmsg());
	CHECK(st_config_to_json(&c, &cj) == 0);
	st_llama_shape_from_config(&shape, &c);
	nt = (int)st_llama_num_tensors(&shape);
	CHECK(nt == 3 + 9 * 2);
	st_tensor *ht = calloc((size_t)nt, sizeof(*ht));
	td = calloc((size_t)nt, sizeof(*td));
	for (int i = 0; i < nt; i++) {
		st_llama_tensor_at(&shape, i, &ht[i]);
		td[i] = (struct tdef){ht[i].name, ht[i].ndim, {ht[i].global_shape[0], ht[i].global_shape[1]}};
	}
	CHECK(!strcmp(td[nt - 1].name, "lm_head.weight") && td[2].shape[0] == 64 && td[2].shape[1] == 64);

	/* save the parameters as 2 processes (column splits), export with tiny shards */
	st_ckpt_saver *s[2];
	for (int p = 0; p < 2; p++) { /* process 0 first: it cleans up before anyone saves */
		st_ckpt_opts o = opts_for(tp("hf/checkpoints"), p, 2);
		CHECK(st_ckpt_saver_create(&s[p], &o) == 0);
	}
	for (int p = 1; p >= 0; p--) {
		st_ckpt_meta m = meta_for(7);
		m.config_json = cj;
		make_pieces(&pl[p], td, nt, p, 2, 1, 3);
		CHECK(st_ckpt_save(s[p], &m, pl[p].n, pl[p].p) == 0);
	}
	for (int p = 0; p < 2; p++) {
		CHECK_MSG(st_ckpt_wait(s[p]) == 0, "%s", st_errmsg());
		st_ckpt_saver_free(s[p]);
		free_pieces(&pl[p]);
	}
	int64_t total = 0;
	for (int i = 0; i < nt; i++)
		total += 4 * td[i].shape[0] * (td[i].ndim == 2 ? td[i].shape[1] : 1);
	CHECK_MSG(st_ckpt_export_hf(tp("hf/checkpoints"), tp("hf/out"), 100000) == 0, "%s", st_errmsg());
	CHECK(exists(tp("hf/out/config.json")) && exists(tp("hf/out/model.safetensors.index.json")));
	json_error_t e;
	json_t *idx = json_load_file(tp("hf/out/model.safetensors.index.json"), 0, &e), *cfg;
	char first[128] = "", last[128] = "";
	CHECK(idx && json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) == total);
	CHECK(json_object_size(json_object_get(idx, "weight_map")) == (size_t)nt);
	snprintf(first, sizeof(first), "%s", json_string_value(json_object_get(json_object_get(idx, "weight_map"),
									      "model.embed_tokens.weight")));
	snprintf(last, sizeof(last), "%s", json_string_value(json_object_get(json_object_get(idx, "weight_map"),
									     "lm_head.weight")));
	json_decref(idx);
	/* shards of at most 100 kB: the 16 kB-64 kB tensors make several files */
	int nfiles = 0;
	CHECK_MSG(sscanf(last, "model-%*d-of-%d.safetensors", &nfiles) == 1 && nfiles > 2 &&
		  !strncmp(first, "model-00001-of-", 15), "%s %s", first, last);
	CHECK(exists(tp("hf/out/%s", first)) && exists(tp("hf/out/%s", last)) && !exists(tp("hf/out/model.safetensors")));
	for (int f = 1; f <= nfiles; f++) {
		struct stat st;
		CHECK(stat(tp("hf/out/model-%05d-of-%05d.safetensors", f, nfiles), &st) == 0 && st.st_size < 100000 + 4096);
	}
	cfg = json_load_file(tp("hf/out/config.json"), 0, &e);
	CHECK(cfg && json_integer_value(json_object_get(cfg, "hidden_size")) == 64 &&
	      json_integer_value(json_object_get(cfg, "num_key_value_heads")) == 2 &&
	      json_integer_value(json_object_get(cfg, "head_dim")) == 16 &&
	      !strcmp(json_string_value(json_object_get(json_object_get(cfg, "rope_scaling"), "rope_type")), "llama3") &&
	      json_is_false(json_object_get(cfg, "tie_word_embeddings")) &&
	      !strcmp(json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)), "LlamaForCausalLM"));
	json_decref(cfg);

	/* import: every piece bit for bit, onto 3 processes' row splits */
	for (int p = 0; p < 3; p++) {
		make_pieces(&pl[p], td, nt, p, 3, 0, -1);
		CHECK_MSG(st_ckpt_load_params(tp("hf/out"), &c, NULL, pl[p].n, pl[p].p) == 0, "%s", st_errmsg());
		CHECK(mismatches(&pl[p], td, nt, 3) == 0);
		free_pieces(&pl[p]);
	}
	/* ... and from the checkpoint step dir itself */
	make_pieces(&pl[0], td, nt, 0, 1, 0, -1);
	CHECK_MSG(st_ckpt_load_params(tp("hf/checkpoints/7"), &c, NULL, pl[0].n, pl[0].p) == 0, "%s", st_errmsg());
	CHECK(mismatches(&pl[0], td, nt, 3) == 0);
	/* re-export unsharded: the old shards go */
	CHECK(st_ckpt_export_hf(tp("hf/checkpoints/7"), tp("hf/out"), 0) == 0);
	CHECK(exists(tp("hf/out/model.safetensors")) && !exists(tp("hf/out/%s", first)) &&
	      !exists(tp("hf/out/model.safetensors.index.json")));
	CHECK(st_ckpt_load_params(tp("hf/out"), &c, NULL, pl[0].n, pl[0].p) == 0 && mismatches(&pl[0], td, nt, 3) == 0);
	/* a model that does not match config.json */
	st_config other = c;
	other.vocab_size = 300;
	CHECK(st_ckpt_load_params(tp("hf/out"), &other, NULL, pl[0].n, pl[0].p) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "vocab_size is 256") && strstr(st_errmsg(), "vocab_size 300"), "%s", st_errmsg());
	CHECK(st_ckpt_load_params(tp("hf"), &c, NULL, pl[0].n, pl[0].p) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "neither a committed slicetrain checkpoint"), "%s", st_errmsg());
	CHECK(st_ckpt_load_params(tp("hf/checkpoints"), &c, NULL, pl[0].n, pl[0].p) == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), "name one, e.g."), "%s", st_errmsg());
	CHECK(st_ckpt_export_hf(tp("hf/nothing"), tp("hf/out2"), 0) == ST_EINVAL && strstr(st_errmsg(), "no such directory"));
	free_pieces(&pl[0]);
	free(pl);
	free(td);
	free(ht);
	free(cj);
}

int main(void)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof(tmpdir), "%s/test_ckpt.XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_header();
	test_reshard();
	test_atomicity();
	test_agreement();
	test_async();
	test_defer();
	test_direct();
	test_given_crc();
	test_stall();
	test_tmpfs();
	test_large();
	test_prune();
	test_policies();
	test_tiling();
	test_malformed();
	test_list_verify();
	test_generation_names();
	test_generation_stale_write();
	test_generation_stale_commit();
	test_generation_foreign_done();
	test_generation_bad_fence();
	test_check_resume();
	test_hf();
	rm_tree(tmpdir);
	if (check_failures)
		fprintf(stderr, "test_ckpt: %d check(s) failed\n", check_failures);
	else
		printf("test_ckpt: all checks passed\n");
	return check_result();
}
