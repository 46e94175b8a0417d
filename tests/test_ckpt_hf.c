/*
 * Hugging Face round trip with the real model, and the checkpoint commands:
 *
 *  1. llama3-test (plain RoPE, then Llama 3.1 scaling) with random weights is
 *     saved as a checkpoint (parameters + AdamW moments, as 2 processes'
 *     pieces), exported with `slicetrain export` (sharded, small shard size),
 *     and tests/hf/hf_check.py loads the directory with transformers'
 *     LlamaForCausalLM (float64) and compares its loss on a batch with ours
 *     (1e-5 relative).
 *  2. Import: load_parameters_path=<that directory> gives our parameters bit
 *     for bit (st_ckpt_load_params into a fresh model).
 *  3. `slicetrain ckpt list` and `ckpt verify` on the checkpoint; a flipped
 *     byte makes verify exit 1 naming the file and the tensor.
 *
 * Python: $ST_HF_PYTHON, else <repo>/.venv-test/bin/python (made by
 * scripts/install-deps.sh --test), which must import transformers and
 * safetensors. If it cannot, the transformers check is reported skipped (a
 * missing dependency: a failure under CI=true) and hf_check.py checks the
 * export with /usr/bin/python3 and torch_oracle.py instead.
 * The binary: $SLICETRAIN (set by tests/run.sh), else build/slicetrain.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/err.h"
#include "base/rng.h"
#include "check.h"
#include "ckpt/ckpt.h"
#include "model/llama.h"

enum { B = 2, T = 32 };

static char tmpdir[512], root[1024], python[1200], binary[1200];
static int transformers; /* python imports transformers: hf_check.py must use it */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(p);
}

static int write_npy_i32(const char *path, const int32_t *v, int rows, int cols)
{
	char hdr[128];
	int n = snprintf(hdr, sizeof(hdr), "{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
	int pad = (64 - (10 + n + 1) % 64) % 64;
	unsigned short hl = (unsigned short)(n + pad + 1);
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	fwrite("\x93NUMPY\x01\x00", 1, 8, f);
	fwrite(&hl, 2, 1, f);
	fwrite(hdr, 1, (size_t)n, f);
	for (int i = 0; i < pad; i++)
		fputc(' ', f);
	fputc('\n', f);
	fwrite(v, sizeof(int32_t), (size_t)(rows * cols), f);
	return fclose(f);
}

/* Runs a shell command; returns its exit status, its output (stdout+stderr) in out. */
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	strncat(cmd, " 2>&1", sizeof(cmd) - strlen(cmd) - 1);
	FILE *p = popen(cmd, "r");
	size_t got = 0;
	if (!p)
		return -1;
	while (got + 1 < cap && fgets(out + got, (int)(cap - got), p))
		got += strlen(out + got);
	out[got] = '\0';
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Whether python imports modules (a comma-separated list). */
static int python_imports(const char *py, const char *modules)
{
	char out[256];
	return run(out, sizeof(out), "'%s' -c 'import %s'", py, modules) == 0;
}

/* Pieces of process p of P: every parameter split by rows, and its two moments. */
static int make_pieces(const st_llama *m, float *moments, int p, int P, st_ckpt_piece *out, char names[][96])
{
	int n = 0;
	for (int i = 0; i < m->ntensors; i++) {
		const st_tensor *t = &m->tensors[i];
		int64_t rows = t->shape[0], lo = rows * p / P, hi = rows * (p + 1) / P;
		int64_t cols = t->ndim == 2 ? t->shape[1] : 1; /* 1-D: split the only dimension */
		for (int k = 0; k < 3 && hi > lo; k++) {
			st_ckpt_piece *x = &out[n];
			float *base = k == 0 ? m->params : moments + (k - 1) * m->nparams;
			if (k == 0)
				snprintf(names[n], 96, "%s", t->name);
			else
				snprintf(names[n], 96, "optimizer.%s.%s", k == 1 ? "mu" : "nu", t->name);
			*x = (st_ckpt_piece){.name = names[n], .ndim = t->ndim,
					     .global_shape = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0}, .offset = {lo, 0},
					     .shape = {hi - lo, t->ndim == 2 ? t->shape[1] : 0},
					     .data = base + t->offset + lo * cols};
			n++;
		}
	}
	return n;
}

static void round_trip(int llama31)
{
	char base_yml[1100], out[16384], dir[700], hf[700], tok[700];
	char *ov[] = {"model_name=llama3-test", "run_name=hf", "base_output_directory=/tmp/unused",
		      llama31 ? "rope_type=llama3.1" : "rope_type=default", "rope_original_max_position=64"};
	st_config c;
	st_llama_shape s;
	st_llama m = ST_LLAMA_INIT, m2 = ST_LLAMA_INIT;
	char *cj = NULL;
	int rc;

	snprintf(base_yml, sizeof(base_yml), "%s/configs/base.yml", root);
	snprintf(dir, sizeof(dir), "%s/run%d/checkpoints", tmpdir, llama31);
	snprintf(hf, sizeof(hf), "%s/hf%d", tmpdir, llama31);
	snprintf(tok, sizeof(tok), "%s/tokens%d.npy", tmpdir, llama31);
	CHECK_MSG((rc = st_config_load(&c, base_yml, 5, ov)) == 0, "%s", st_errmsg());
	if (rc)
		return;
	CHECK(c.rope_llama31 == llama31);
	CHECK(st_config_to_json(&c, &cj) == 0);
	st_llama_shape_from_config(&s, &c);
	CHECK(st_llama_init(&m, &s) == 0 && st_llama_init(&m2, &s) == 0);
	st_llama_init_weights(&m, 1234 + (uint64_t)llama31);
	/* norms at 1 and biases nowhere: perturb the norms so that they are tested too */
	for (int i = 0; i < m.ntensors; i++)
		if (m.tensors[i].ndim == 1)
			for (int64_t k = 0; k < m.tensors[i].numel; k++)
				m.params[m.tensors[i].offset + k] = 1.0f + 0.1f * (float)st_rng_normal(99, (uint64_t)i, (uint64_t)k);
	float *moments = malloc((size_t)(2 * m.nparams) * sizeof(float));
	for (int64_t k = 0; k < 2 * m.nparams; k++)
		moments[k] = (float)k * 1e-6f;

	/* save as 2 processes, then export through the binary */
	st_ckpt_piece pieces[2][400];
	char names[2][400][96];
	st_ckpt_saver *sv[2];
	for (int p = 0; p < 2; p++) { /* process 0 first: it cleans up before anyone saves */
		st_ckpt_opts o = {.dir = dir, .process = p, .process_count = 2, .async = 1,
				  .generation = ST_CKPT_NO_GENERATION};
		CHECK(st_ckpt_saver_create(&sv[p], &o) == 0);
	}
	for (int p = 1; p >= 0; p--) {
		st_ckpt_meta meta = {.step = 5, .next_sample = 40, .global_batch = 8, .config_json = cj};
		snprintf(meta.mesh, sizeof(meta.mesh), "data=1 fsdp=2 tensor=1");
		int n = make_pieces(&m, moments, p, 2, pieces[p], names[p]);
		CHECK_MSG(st_ckpt_save(sv[p], &meta, n, pieces[p]) == 0, "%s", st_errmsg());
	}
	for (int p = 0; p < 2; p++) {
		CHECK_MSG(st_ckpt_wait(sv[p]) == 0, "%s", st_errmsg());
		st_ckpt_saver_free(sv[p]);
	}
	rc = run(out, sizeof(out), "'%s' export '%s' '%s' --shard-size 150KB", binary, dir, hf);
	CHECK_MSG(rc == 0 && strstr(out, "exported step 5"), "export: exit %d: %s", rc, out);
	CHECK(access(strcat(strcpy(out, hf), "/model.safetensors.index.json"), R_OK) == 0);

	/* our loss on a batch, and transformers' */
	int32_t tokens[B * (T + 1)];
	double loss_sum = 0;
	for (int i = 0; i < B * (T + 1); i++)
		tokens[i] = (int32_t)(st_rng_u64(7, (uint64_t)llama31, (uint64_t)i) % (uint64_t)s.V);
	CHECK(write_npy_i32(tok, tokens, B, T + 1) == 0);
	CHECK(st_llama_alloc_acts(&m, B, T, ST_REMAT_NONE) == 0);
	CHECK(st_llama_forward_loss(&m, tokens, &loss_sum) == 0);
	double loss = loss_sum / (B * T);
	rc = run(out, sizeof(out), "'%s' '%s/tests/hf/hf_check.py' --model '%s' --tokens '%s' --loss %.12g%s", python, root,
		 hf, tok, loss, transformers ? " --require-transformers" : "");
	printf("%s", out);
	CHECK_MSG(rc == 0, "hf_check exit %d", rc);

	/* import: bit for bit, onto 3 processes' row pieces of a fresh model */
	for (int p = 0; p < 3; p++) {
		st_ckpt_piece want[400];
		char wn[400][96];
		int n = 0;
		for (int i = 0; i < m2.ntensors; i++) {
			const st_tensor *t = &m2.tensors[i];
			int64_t lo = t->shape[0] * p / 3, hi = t->shape[0] * (p + 1) / 3, cols = t->ndim == 2 ? t->shape[1] : 1;
			if (hi <= lo)
				continue;
			snprintf(wn[n], 96, "%s", t->name);
			want[n] = (st_ckpt_piece){.name = wn[n], .ndim = t->ndim,
						  .global_shape = {t->shape[0], t->ndim == 2 ? t->shape[1] : 0}, .offset = {lo, 0},
						  .shape = {hi - lo, t->ndim == 2 ? t->shape[1] : 0},
						  .data = m2.params + t->offset + lo * cols};
			n++;
		}
		CHECK_MSG(st_ckpt_load_params(hf, &c, NULL, n, want) == 0, "%s", st_errmsg());
	}
	CHECK(memcmp(m.params, m2.params, (size_t)m.nparams * sizeof(float)) == 0);
	memset(m2.params, 0, (size_t)m.nparams * sizeof(float));

	/* the checkpoint commands on it */
	rc = run(out, sizeof(out), "'%s' ckpt list '%s'", binary, dir);
	CHECK_MSG(rc == 0 && strstr(out, "committed") && strstr(out, "fsdp=2"), "list: exit %d: %s", rc, out);
	rc = run(out, sizeof(out), "'%s' ckpt verify '%s'", binary, dir);
	CHECK_MSG(rc == 0 && strstr(out, "ok ("), "verify: exit %d: %s", rc, out);
	if (!llama31) {
		char shard[800];
		snprintf(shard, sizeof(shard), "%s/5/shard-00000-of-00002.safetensors", dir);
		int fd = open(shard, O_RDWR);
		unsigned char b = 0;
		off_t end = lseek(fd, 0, SEEK_END);
		CHECK(pread(fd, &b, 1, end - 2) == 1);
		b ^= 1;
		CHECK(pwrite(fd, &b, 1, end - 2) == 1);
		close(fd);
		rc = run(out, sizeof(out), "'%s' ckpt verify '%s/5'", binary, dir);
		CHECK_MSG(rc == 1 && strstr(out, "shard-00000-of-00002.safetensors: checksum mismatch in tensor "
						  "optimizer.nu.lm_head.weight[0:128,0:64]"),
			  "verify after a flip: exit %d: %s", rc, out);
		/* export reads the parameters only: the damaged moment does not stop it */
		rc = run(out, sizeof(out), "'%s' export '%s' '%s/ok'", binary, dir, tmpdir);
		CHECK_MSG(rc == 0, "export: exit %d: %s", rc, out);
		/* a damaged parameter (the first bytes of data: model.embed_tokens.weight) does */
		uint64_t hlen = 0;
		fd = open(shard, O_RDWR);
		CHECK(pread(fd, &hlen, 8, 0) == 8 && pread(fd, &b, 1, (off_t)(8 + hlen + 5)) == 1);
		b ^= 1;
		CHECK(pwrite(fd, &b, 1, (off_t)(8 + hlen + 5)) == 1);
		close(fd);
		rc = run(out, sizeof(out), "'%s' export '%s' '%s/bad'", binary, dir, tmpdir);
		CHECK_MSG(rc == 1 && strstr(out, "slicetrain: error:") &&
			  strstr(out, "checksum mismatch in tensor model.embed_tokens.weight[0:128,0:64]"),
			  "export of a damaged checkpoint: exit %d: %s", rc, out);
		CHECK(access(strcat(strcpy(out, tmpdir), "/bad/config.json"), F_OK) != 0);
	}
	free(moments);
	free(cj);
	st_llama_release(&m);
	st_llama_release(&m2);
}

int main(void)
{
	const char *t = getenv("TMPDIR"), *r = getenv("ST_ROOT"), *py = getenv("ST_HF_PYTHON"), *bin = getenv("SLICETRAIN");
	snprintf(root, sizeof(root), "%s", r && *r ? r : ".");
	snprintf(tmpdir, sizeof(tmpdir), "%s/test_ckpt_hf.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	if (py && *py)
		snprintf(python, sizeof(python), "%s", py);
	else
		snprintf(python, sizeof(python), "%s/.venv-test/bin/python", root);
	transformers = python_imports(python, "transformers, safetensors");
	if (!transformers) {
		check_skip_dep("the transformers check of the export: %s cannot import transformers and safetensors "
			       "(scripts/install-deps.sh --test makes .venv-test); checked with torch_oracle.py instead",
			       python);
		snprintf(python, sizeof(python), "/usr/bin/python3");
	}
	if (!python_imports(python, "torch, numpy")) {
		check_skip_dep("the whole test: %s cannot import torch and numpy (python3-torch, python3-numpy)", python);
		rmdir(tmpdir);
		return check_result();
	}
	if (bin && *bin)
		snprintf(binary, sizeof(binary), "%s", bin);
	else
		snprintf(binary, sizeof(binary), "%s/build/slicetrain", root);
	printf("python: %s, slicetrain: %s\n", python, binary);
	round_trip(0);
	round_trip(1);
	nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	if (check_failures)
		fprintf(stderr, "test_ckpt_hf: %d check(s) failed\n", check_failures);
	else
		printf("test_ckpt_hf: all checks passed\n");
	return check_result();
}
