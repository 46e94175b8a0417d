/*
 * hf.c - Hugging Face interop: export a checkpoint's parameters as a
 * LlamaForCausalLM model directory (config.json + safetensors, sharded with
 * an index above a size threshold), and load parameters from such a
 * directory (load_parameters_path). Names and layouts are already Hugging
 * Face's (DESIGN.md: rotate_half RoPE, (out, in) linear weights), so no
 * tensor is permuted on the way.
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"
#include "base/file.h"
#include "ckpt/safetensors.h"
#include "model/llama.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_SHARD_BYTES INT64_C(5000000000) /* transformers' max_shard_size "5GB" */

/* The model's tensor table for config c (global shapes, HF names), in the
 * model's order. *out malloc'd. */
static int model_tensors(const st_config *c, const char *where, st_tensor **out, int *n)
{
	st_llama_shape s;
	st_tensor *t;
	int64_t nt;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = st_llama_check_config(c, NULL)) < 0) {
		return st_wrap(ST_EINVAL, "%s", where);
	}
	st_llama_shape_from_config(&s, c);
	nt = st_llama_num_tensors(&s);
	if (nt > INT_MAX / (int64_t)sizeof(*t) || !(t = calloc((size_t)nt, sizeof(*t))))
		return st_fail(ST_ENOMEM, "out of memory");
	for (int64_t i = 0; i < nt; i++)
		st_llama_tensor_at(&s, i, &t[i]);
	*out = t;
	*n = (int)nt;
	return 0;
}

/* ---------------------------------------------------------------- export */

static json_t *hf_config(const st_config *c)
{
	json_t *j = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s, s:b, s:f, s:b, s:f, s:i, "
			      "s:b, s:s, s:b}",
			      "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
			      (json_int_t)c->emb_dim, "intermediate_size", (json_int_t)c->mlp_dim, "num_attention_heads",
			      (json_int_t)c->num_query_heads, "num_key_value_heads", (json_int_t)c->num_kv_heads,
			      "head_dim", (json_int_t)c->head_dim, "num_hidden_layers", (json_int_t)c->num_decoder_layers,
			      "vocab_size", (json_int_t)c->vocab_size, "rms_norm_eps", c->norm_eps, "rope_theta",
			      c->rope_theta, "hidden_act", "silu", "attention_bias", 0, "attention_dropout", 0.0,
			      "mlp_bias", 0, "initializer_range", 0.02, "pretraining_tp", 1, "tie_word_embeddings", 0,
			      "torch_dtype", "float32", "use_cache", 1);
	int64_t max_pos = c->max_target_length;
	if (!j)
		return NULL;
	if (c->rope_llama31) {
		json_t *rs = json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor", c->rope_scale_factor,
				       "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor",
				       c->rope_high_freq_factor, "original_max_position_embeddings",
				       (json_int_t)c->rope_original_max_len);
		if (json_object_set_new(j, "rope_scaling", rs) < 0)
			goto fail;
		int64_t scaled = (int64_t)((double)c->rope_original_max_len * c->rope_scale_factor);
		if (scaled > max_pos)
			max_pos = scaled;
	} else if (json_object_set_new(j, "rope_scaling", json_null()) < 0) {
		goto fail;
	}
	if (json_object_set_new(j, "max_position_embeddings", json_integer(max_pos)) < 0)
		goto fail;
	if (c->vocab_size == 128256 && /* the Llama 3 tokenizer's special tokens */
	    (json_object_set_new(j, "bos_token_id", json_integer(128000)) < 0 ||
	     json_object_set_new(j, "eos_token_id", json_integer(128001)) < 0))
		goto fail;
	return j;
fail:
	json_decref(j);
	return NULL;
}

static int write_json(const char *path, json_t *j)
{
	char *text = json_dumps(j, JSON_INDENT(2));
	int rc;
	if (!text)
		return st_fail(ST_ENOMEM, "out of memory");
	size_t len = strlen(text);
	text[len] = '\n'; /* replaces the NUL: written with its length */
	rc = st_write_file_atomic(path, text, len + 1);
	free(text);
	return rc;
}

/* The step directory ckpt names: itself if committed, else the newest
 * committed step of the checkpoints directory it names (itself, or a run
 * directory's checkpoints/: st_ckpt_resolve_dir, as generate and ckpt list). */
static int resolve_ckpt(const char *ckpt, char *step_dir, size_t cap)
{
	char p[ST_PATH_MAX], dir[ST_PATH_MAX];
	int64_t *steps;
	int n, rc;

	if ((rc = st_path_join(p, sizeof(p), ckpt, CK_MANIFEST)) < 0)
		return rc;
	if (st_file_exists(p)) {
		snprintf(step_dir, cap, "%s", ckpt);
		return 0;
	}
	st_ckpt_resolve_dir(ckpt, dir, sizeof(dir));
	if ((rc = ck_list_steps(dir, 1, &steps, &n)) < 0)
		return rc == ST_EIO ? st_fail(ST_EINVAL, "%s: not a checkpoint directory", ckpt) : rc;
	if (n == 0) {
		free(steps);
		if (access(ckpt, F_OK) != 0)
			return st_fail(ST_EINVAL, "%s: no such directory", ckpt);
		return st_fail(ST_EINVAL, "%s: neither a committed checkpoint (no %s) nor a checkpoints or run "
			       "directory holding one", ckpt, CK_MANIFEST);
	}
	rc = ck_step_dir(step_dir, cap, dir, steps[n - 1]);
	free(steps);
	return rc;
}

/* Remove model files of an earlier export that this one did not write. */
static void remove_stale(const char *out_dir, char **written, int nwritten)
{
	char p[ST_PATH_MAX];
	struct dirent *d;
	DIR *dp = opendir(out_dir);
	if (!dp)
		return;
	while ((d = readdir(dp))) {
		const char *nm = d->d_name;
		int ours = 0, model = !strcmp(nm, "model.safetensors") || !strcmp(nm, "model.safetensors.index.json") ||
				      (!strncmp(nm, "model-", 6) && strstr(nm, "-of-") &&
				       strlen(nm) > 12 && !strcmp(nm + strlen(nm) - 12, ".safetensors"));
		for (int i = 0; i < nwritten; i++)
			ours |= !strcmp(written[i], nm);
		if (model && !ours && st_path_join(p, sizeof(p), out_dir, nm) == 0 && unlink(p) == 0)
			st_info("export: removed %s (from an earlier export)", p);
	}
	closedir(dp);
}

int st_ckpt_export_hf(const char *ckpt, const char *out_dir, int64_t shard_bytes)
{
	char step_dir[ST_PATH_MAX], path[ST_PATH_MAX], what[64];
	struct ck_manifest m = {0};
	struct ck_reader r;
	st_progress prog;
	st_tensor *want = NULL;
	st_config c;
	int nwant = 0, nfiles = 0, rc;
	int *file_of = NULL;
	char **fnames = NULL;
	float *buf = NULL;
	json_t *index = NULL, *cfg = NULL;
	int64_t total = 0, biggest = 0;

	if (shard_bytes <= 0)
		shard_bytes = DEFAULT_SHARD_BYTES;
	ck_reader_init(&r, NULL, &m);
	if ((rc = resolve_ckpt(ckpt, step_dir, sizeof(step_dir))) < 0 || (rc = ck_manifest_load(&m, step_dir, -1)) < 0)
		goto out;
	r.dir = step_dir;
	if ((rc = st_config_from_json(&c, m.config_json)) < 0) {
		rc = st_wrap(ST_EINVAL, "%s/%s", step_dir, CK_MANIFEST);
		goto out;
	}
	if ((rc = model_tensors(&c, step_dir, &want, &nwant)) < 0)
		goto out;
	for (int i = 0; i < nwant; i++) {
		const struct ck_tensor *t = ck_manifest_find(&m, want[i].name);
		if (!t) {
			rc = st_fail(ST_EINVAL, "%s: tensor %s is missing from the checkpoint", step_dir, want[i].name);
			goto out;
		}
		if (t->ndim != want[i].ndim || t->shape[0] != want[i].global_shape[0] ||
		    t->shape[1] != want[i].global_shape[1]) {
			rc = st_fail(ST_EINVAL, "%s: tensor %s does not have the shape its config gives", step_dir,
				     want[i].name);
			goto out;
		}
		total += want[i].numel * 4;
		if (want[i].numel > biggest)
			biggest = want[i].numel;
	}

	/* the files: one, or greedy shards of at most shard_bytes (a bigger tensor alone) */
	if (!(file_of = calloc((size_t)nwant, sizeof(*file_of))) || !(fnames = calloc((size_t)nwant + 1, sizeof(*fnames))) ||
	    !(buf = malloc((size_t)biggest * sizeof(float)))) {
		rc = st_fail(ST_ENOMEM, "export: out of memory (the largest tensor has %" PRId64 " elements)", biggest);
		goto out;
	}
	int64_t cur = 0;
	for (int i = 0; i < nwant; i++) {
		int64_t b = want[i].numel * 4;
		if (nfiles == 0 || (total > shard_bytes && cur > 0 && cur + b > shard_bytes)) {
			nfiles++;
			cur = 0;
		}
		file_of[i] = nfiles - 1;
		cur += b;
	}
	for (int f = 0; f < nfiles; f++) {
		if (nfiles == 1)
			fnames[f] = strdup("model.safetensors");
		else if (asprintf(&fnames[f], "model-%05d-of-%05d.safetensors", f + 1, nfiles) < 0)
			fnames[f] = NULL;
		if (!fnames[f]) {
			rc = st_fail(ST_ENOMEM, "out of memory");
			goto out;
		}
	}
	if ((rc = st_mkdir_p(out_dir)) < 0)
		goto out;

	snprintf(what, sizeof(what), "export of step %" PRId64, m.step);
	st_progress_init(&prog, what, total);
	r.progress = &prog;
	if (nfiles > 1 && (!(index = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)total,
					       "weight_map")))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	for (int f = 0, first = 0; f < nfiles; f++) {
		int last = first, cnt;
		while (last < nwant && file_of[last] == f)
			last++;
		cnt = last - first;
		st_safetensors_tensor *tt = calloc((size_t)cnt, sizeof(*tt));
		const char *mk[] = {"format"}, *mv[] = {"pt"};
		char *hdr = NULL;
		size_t hlen;
		st_atomic_file af = ST_ATOMIC_FILE_INIT;
		if (!tt) {
			rc = st_fail(ST_ENOMEM, "out of memory");
			goto out;
		}
		for (int i = 0; i < cnt; i++)
			tt[i] = (st_safetensors_tensor){want[first + i].name, ST_DTYPE_F32, want[first + i].ndim,
					       {want[first + i].global_shape[0], want[first + i].global_shape[1]}, NULL};
		if ((rc = st_path_join(path, sizeof(path), out_dir, fnames[f])) == 0 &&
		    (rc = st_safetensors_header(path, cnt, tt, 1, mk, mv, &hdr, &hlen)) == 0 &&
		    (rc = st_atomic_file_open(&af, path)) == 0) {
			st_atomic_file_write(&af, hdr, hlen);
			for (int i = 0; i < cnt && rc == 0; i++) {
				const st_tensor *w = &want[first + i];
				st_ckpt_piece p = {.name = w->name, .ndim = w->ndim,
						   .global_shape = {w->global_shape[0], w->global_shape[1]},
						   .shape = {w->global_shape[0], w->global_shape[1]}, .data = buf};
				if ((rc = ck_fill_piece(&r, &p)) == 0)
					rc = st_atomic_file_write(&af, buf, (size_t)w->numel * 4);
				if (rc == 0 && index)
					rc = json_object_set_new(json_object_get(index, "weight_map"), w->name,
								 json_string(fnames[f])) < 0 ? st_fail(ST_ENOMEM, "out of memory") : 0;
			}
			if (rc == 0)
				rc = st_atomic_file_commit(&af);
		}
		st_atomic_file_abort(&af);
		free(hdr);
		free(tt);
		if (rc < 0)
			goto out;
		first = last;
	}
	st_progress_end(&prog);
	if (index && ((rc = st_path_join(path, sizeof(path), out_dir, "model.safetensors.index.json")) < 0 ||
		      (rc = write_json(path, index)) < 0))
		goto out;
	if (!(cfg = hf_config(&c))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = st_path_join(path, sizeof(path), out_dir, "config.json")) < 0 || (rc = write_json(path, cfg)) < 0)
		goto out;
	fnames[nfiles] = index ? "model.safetensors.index.json" : NULL;
	remove_stale(out_dir, fnames, nfiles + (index ? 1 : 0));
	fnames[nfiles] = NULL;
	st_info("exported step %" PRId64 " of %s (%s, %.3f GB of float32 parameters) to %s: config.json and %d "
		"safetensors file%s", m.step, step_dir, c.model_name, (double)total / 1e9, out_dir, nfiles,
		nfiles == 1 ? "" : "s");
out:
	ck_reader_release(&r);
	ck_manifest_free(&m);
	for (int f = 0; fnames && f < nfiles; f++)
		free(fnames[f]);
	free(fnames);
	free(file_of);
	free(want);
	free(buf);
	json_decref(index);
	json_decref(cfg);
	return rc;
}

/* ---------------------------------------------------------------- import */

struct hf_dir {
	const char *dir;
	json_t *weight_map;   /* NULL: single model.safetensors */
	int nopen;
	char *names[256];
	st_safetensors *files[256];
};

static int hf_open(struct hf_dir *h, const char *fname, st_safetensors **out)
{
	char path[ST_PATH_MAX];
	int rc;
	for (int i = 0; i < h->nopen; i++)
		if (!strcmp(h->names[i], fname)) {
			*out = h->files[i];
			return 0;
		}
	if (!fname[0] || strchr(fname, '/') || fname[0] == '.')
		return st_fail(ST_EINVAL, "%s: weight_map names \"%s\", not a plain file name", h->dir, fname);
	if (h->nopen == 256)
		return st_fail(ST_EINVAL, "%s: more than 256 safetensors files", h->dir);
	if ((rc = st_path_join(path, sizeof(path), h->dir, fname)) < 0 || (rc = st_safetensors_open(out, path)) < 0)
		return rc;
	if (!(h->names[h->nopen] = strdup(fname))) {
		st_safetensors_close(*out);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	h->files[h->nopen++] = *out;
	return 0;
}

/* The open file holding tensor name, and its info; NULL info if absent. */
static int hf_find(struct hf_dir *h, const char *name, st_safetensors **f, const st_safetensors_info **info)
{
	int rc;
	*info = NULL;
	if (h->weight_map) {
		json_t *fn = json_object_get(h->weight_map, name);
		if (!fn)
			return 0;
		if (!json_is_string(fn))
			return st_fail(ST_EINVAL, "%s: weight_map[%s] is not a file name", h->dir, name);
		if ((rc = hf_open(h, json_string_value(fn), f)) < 0)
			return rc;
	} else if ((rc = hf_open(h, "model.safetensors", f)) < 0) {
		return rc;
	}
	*info = st_safetensors_find(*f, name);
	if (!*info && h->weight_map)
		return st_fail(ST_EINVAL, "%s: weight_map puts %s in %s, which does not hold it", h->dir, name,
			       st_safetensors_path(*f));
	return 0;
}

static int64_t jint(json_t *cfg, const char *key, int64_t dflt)
{
	json_t *v = json_object_get(cfg, key);
	return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static void warn_real(json_t *cfg, const char *key, double ours, const char *our_key)
{
	json_t *v = json_object_get(cfg, key);
	if (json_is_number(v) && fabs(json_number_value(v) - ours) > 1e-6 * fabs(ours))
		st_warn("load_parameters_path: config.json has %s %g, this run uses %s %g", key, json_number_value(v),
			our_key, ours);
}

static int check_hf_config(const char *dir, json_t *cfg, const st_config *c)
{
	int64_t H = jint(cfg, "num_attention_heads", -1), E = jint(cfg, "hidden_size", -1);
	const struct {
		const char *key, *ours;
		int64_t theirs, want;
	} dims[] = {
		{"hidden_size", "emb_dim", E, c->emb_dim},
		{"intermediate_size", "mlp_dim", jint(cfg, "intermediate_size", -1), c->mlp_dim},
		{"num_attention_heads", "num_query_heads", H, c->num_query_heads},
		{"num_key_value_heads", "num_kv_heads", jint(cfg, "num_key_value_heads", H), c->num_kv_heads},
		{"head_dim", "head_dim", jint(cfg, "head_dim", H > 0 ? E / H : -1), c->head_dim},
		{"num_hidden_layers", "num_decoder_layers", jint(cfg, "num_hidden_layers", -1), c->num_decoder_layers},
		{"vocab_size", "vocab_size", jint(cfg, "vocab_size", -1), c->vocab_size},
	};
	json_t *mt = json_object_get(cfg, "model_type"), *rs = json_object_get(cfg, "rope_scaling");

	for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
		if (dims[i].theirs != dims[i].want)
			return st_fail(ST_EINVAL, "%s/config.json: %s is %" PRId64 ", but model %s has %s %" PRId64
				       " (choose the matching model_name)", dir, dims[i].key, dims[i].theirs, c->model_name,
				       dims[i].ours, dims[i].want);
	if (json_is_string(mt) && strcmp(json_string_value(mt), "llama") != 0)
		st_warn("load_parameters_path: %s/config.json has model_type %s, loading it as llama", dir,
			json_string_value(mt));
	warn_real(cfg, "rope_theta", c->rope_theta, "rope_max_timescale");
	warn_real(cfg, "rms_norm_eps", c->norm_eps, "normalization_layer_epsilon");
	int theirs31 = json_is_object(rs) && json_is_string(json_object_get(rs, "rope_type")) &&
		       !strcmp(json_string_value(json_object_get(rs, "rope_type")), "llama3");
	if (theirs31 != c->rope_llama31)
		st_warn("load_parameters_path: %s/config.json %s Llama 3.1 RoPE scaling, this run %s", dir,
			theirs31 ? "uses" : "does not use", c->rope_llama31 ? "does" : "does not");
	else if (theirs31) {
		warn_real(rs, "factor", c->rope_scale_factor, "rope_scale_factor");
		warn_real(rs, "low_freq_factor", c->rope_low_freq_factor, "rope_low_freq_factor");
		warn_real(rs, "high_freq_factor", c->rope_high_freq_factor, "rope_high_freq_factor");
	}
	return 0;
}

int ck_hf_load(const char *dir, const st_config *c, int n, st_ckpt_piece *pieces)
{
	char path[ST_PATH_MAX];
	json_t *cfg = NULL, *index = NULL;
	json_error_t jerr;
	struct hf_dir h = {.dir = dir};
	st_progress prog;
	float *tmp = NULL;
	size_t tmp_cap = 0;
	int64_t total = 0;
	int rc, tied;

	if ((rc = st_path_join(path, sizeof(path), dir, "config.json")) < 0)
		return rc;
	if (!(cfg = json_load_file(path, 0, &jerr)) || !json_is_object(cfg)) {
		rc = st_fail(ST_EINVAL, "%s: %s", path, cfg ? "not a JSON object" : jerr.text);
		goto out;
	}
	if ((rc = check_hf_config(dir, cfg, c)) < 0)
		goto out;
	tied = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
	if ((rc = st_path_join(path, sizeof(path), dir, "model.safetensors.index.json")) < 0)
		goto out;
	if (st_file_exists(path)) {
		if (!(index = json_load_file(path, 0, &jerr)) ||
		    !json_is_object(h.weight_map = json_object_get(index, "weight_map"))) {
			rc = st_fail(ST_EINVAL, "%s: %s", path, index ? "no \"weight_map\" object" : jerr.text);
			goto out;
		}
	} else if ((rc = st_path_join(path, sizeof(path), dir, "model.safetensors")) < 0 || !st_file_exists(path)) {
		rc = rc < 0 ? rc : st_fail(ST_EINVAL, "%s: no model.safetensors or model.safetensors.index.json", dir);
		goto out;
	}
	for (int i = 0; i < n; i++)
		total += ck_piece_numel(&pieces[i]) * 4;
	st_progress_init(&prog, "import", total);
	for (int i = 0; i < n; i++) {
		st_ckpt_piece *p = &pieces[i];
		const char *name = p->name;
		const st_safetensors_info *info;
		st_safetensors *f = NULL;
		if ((rc = hf_find(&h, name, &f, &info)) < 0)
			goto out;
		if (!info && tied && !strcmp(name, "lm_head.weight")) {
			name = "model.embed_tokens.weight";
			if ((rc = hf_find(&h, name, &f, &info)) < 0)
				goto out;
		}
		if (!info) {
			rc = st_fail(ST_EINVAL, "%s: tensor %s is missing", dir, p->name);
			goto out;
		}
		if (info->ndim != p->ndim || info->shape[0] != p->global_shape[0] ||
		    (p->ndim == 2 && info->shape[1] != p->global_shape[1])) {
			rc = st_fail(ST_EINVAL, "%s: tensor %s has %d dimension(s) [%" PRId64 "%s...], the model wants [%" PRId64
				     "%s%" PRId64 "]", st_safetensors_path(f), name, info->ndim, info->shape[0],
				     info->ndim > 1 ? ", " : "", p->global_shape[0], p->ndim == 2 ? ", " : "",
				     p->ndim == 2 ? p->global_shape[1] : (int64_t)0);
			goto out;
		}
		struct ck_box whole = {.ndim = p->ndim, .shape = {p->global_shape[0], p->ndim == 2 ? p->global_shape[1] : 0}};
		struct ck_box pb = ck_piece_box(p);
		if (ck_box_numel(&pb) == info->numel) {
			rc = st_safetensors_read_f32(f, name, p->data, info->numel);
		} else {
			if ((size_t)info->numel * 4 > tmp_cap) {
				free(tmp);
				tmp_cap = 0;
				if (!(tmp = malloc((size_t)info->numel * 4))) {
					rc = st_fail(ST_ENOMEM, "out of memory reading %s", name);
					goto out;
				}
				tmp_cap = (size_t)info->numel * 4;
			}
			rc = st_safetensors_read_f32(f, name, tmp, info->numel);
			for (int64_t r = 0; rc == 0 && r < (p->ndim == 2 ? pb.shape[0] : 1); r++) {
				if (p->ndim == 1)
					memcpy(p->data, tmp + pb.offset[0], (size_t)pb.shape[0] * 4);
				else
					memcpy(p->data + r * pb.shape[1], tmp + (pb.offset[0] + r) * whole.shape[1] + pb.offset[1],
					       (size_t)pb.shape[1] * 4);
			}
		}
		if (rc < 0)
			goto out;
		st_progress_add(&prog, ck_box_numel(&pb) * 4);
	}
	st_progress_end(&prog);
out:
	for (int i = 0; i < h.nopen; i++) {
		st_safetensors_close(h.files[i]);
		free(h.names[i]);
	}
	free(tmp);
	json_decref(cfg);
	json_decref(index);
	return rc;
}
