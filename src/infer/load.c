/*
 * load.c - a model to generate with, from a checkpoint or a Hugging Face
 * directory (load.h). The config comes first (st_ckpt_model_config), then
 * a one-process model of that shape whose tensors are the pieces
 * st_ckpt_load_params fills, whole; the rest (EOS ids, the tokenizer's
 * place) is read from the files beside the weights.
 */
#include "infer/load.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "ckpt/ckpt.h"

/* Add the ids of key (an integer or a list of them) in file dir/name, when
 * the file and the key exist; a malformed file or value is ST_EINVAL. */
static int read_token_ids(st_infer_model *im, const char *dir, const char *name, const char *key, int32_t *one)
{
	char path[ST_PATH_MAX];
	json_error_t jerr;
	json_t *j, *v;
	int rc;
	if ((rc = st_path_join(path, sizeof(path), dir, name)) < 0)
		return rc;
	if (!st_file_exists(path))
		return 0;
	if (!(j = json_load_file(path, 0, &jerr)))
		return st_fail(ST_EINVAL, "%s:%d: not JSON: %s", path, jerr.line, jerr.text);
	v = json_object_get(j, key);
	size_t n = json_is_array(v) ? json_array_size(v) : v && !json_is_null(v) ? 1 : 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
		int64_t id = json_is_integer(e) ? json_integer_value(e) : -1;
		if (id < 0 || id >= im->m.s.V)
			rc = st_fail(ST_EINVAL, "%s: \"%s\" must be a token id below vocab_size %lld, or a list of them",
				     path, key, (long long)im->m.s.V);
		else if (one)
			*one = (int32_t)id;
		else {
			int known = 0;
			for (int k = 0; k < im->neos; k++)
				known |= im->eos[k] == id;
			if (!known && im->neos == ST_INFER_MAX_EOS)
				rc = st_fail(ST_EINVAL, "%s: more than %d EOS ids", path, ST_INFER_MAX_EOS);
			else if (!known)
				im->eos[im->neos++] = (int32_t)id;
		}
	}
	json_decref(j);
	return rc;
}

int st_infer_model_load(st_infer_model *im, const char *dir)
{
	st_ckpt_piece *pieces = NULL;
	st_llama_shape shape;
	int rc;

	*im = (st_infer_model)ST_INFER_MODEL_INIT;
	if (!(im->cfg = calloc(1, sizeof(*im->cfg))))
		return st_fail(ST_ENOMEM, "out of memory");
	if ((rc = st_ckpt_model_config(dir, im->cfg, im->path, sizeof(im->path), &im->hf)) < 0 ||
	    (rc = st_llama_check_config(im->cfg, NULL)) < 0)
		goto fail;
	st_llama_shape_from_config(&shape, im->cfg);
	if ((rc = st_llama_init(&im->m, &shape)) < 0)
		goto fail;
	if (!(pieces = calloc((size_t)im->m.ntensors, sizeof(*pieces)))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < im->m.ntensors; i++) {
		const st_tensor *t = &im->m.tensors[i];
		pieces[i] = (st_ckpt_piece){.name = t->name, .ndim = t->ndim,
					    .global_shape = {t->global_shape[0], t->global_shape[1]},
					    .shape = {t->shape[0], t->shape[1]}, .data = im->m.params + t->offset};
	}
	double t0 = st_mono_s();
	rc = st_ckpt_load_params(im->path, im->cfg, NULL, im->m.ntensors, pieces);
	im->load_s = st_mono_s() - t0;
	free(pieces);
	if (rc < 0)
		goto fail;
	im->context = im->cfg->max_target_length;
	im->context_key = im->hf ? "max_position_embeddings" : "max_target_length";
	if (im->hf) {
		char tok[ST_PATH_MAX];
		im->add_bos = 1;
		if ((rc = read_token_ids(im, im->path, "config.json", "eos_token_id", NULL)) < 0 ||
		    (rc = read_token_ids(im, im->path, "generation_config.json", "eos_token_id", NULL)) < 0 ||
		    (rc = read_token_ids(im, im->path, "config.json", "bos_token_id", &im->bos)) < 0 ||
		    (rc = st_path_join(tok, sizeof(tok), im->path, "tokenizer.json")) < 0)
			goto fail;
		if (st_file_exists(tok))
			snprintf(im->tokenizer, sizeof(im->tokenizer), "%s", tok);
	} else {
		im->add_bos = im->cfg->add_bos;
		if (im->cfg->tokenizer_path[0] && st_file_exists(im->cfg->tokenizer_path))
			snprintf(im->tokenizer, sizeof(im->tokenizer), "%s", im->cfg->tokenizer_path);
	}
	return 0;
fail:
	st_infer_model_release(im);
	return rc;
}

void st_infer_model_release(st_infer_model *im)
{
	st_llama_release(&im->m);
	free(im->cfg);
	*im = (st_infer_model)ST_INFER_MODEL_INIT;
}
