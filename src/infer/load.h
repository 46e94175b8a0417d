/*
 * load.h - a model to generate with, read from a directory: a slicetrain
 * checkpoint (a step directory, or a checkpoints or run directory: its
 * newest committed step) or a Hugging Face Llama directory (config.json
 * and model.safetensors or an index with shards, as `slicetrain export`
 * and transformers' save_pretrained write them; F32, BF16, F16 weights).
 *
 *   st_infer_model im = ST_INFER_MODEL_INIT;
 *   if ((rc = st_infer_model_load(&im, dir)) < 0) ...   // message names the file
 *   ... st_decoder_create(&d, &im.m, ...) ...
 *   st_infer_model_release(&im);
 *
 * Besides the weights it gathers what generation needs to know about the
 * model: its context length, its end-of-sequence ids, where its tokenizer
 * is, whether its training put BOS before documents. Errors: ST_EINVAL for
 * a directory that holds no model or a malformed one (st_ckpt_model_config,
 * st_ckpt_load_params), ST_EIO, ST_ENOMEM.
 */
#ifndef ST_INFER_LOAD_H
#define ST_INFER_LOAD_H

#include <stdint.h>

#include "base/path.h"
#include "config/config.h"
#include "model/llama.h"

#define ST_INFER_MAX_EOS 16

typedef struct st_infer_model {
	st_llama m;              /* resident fp32 weights, one process */
	st_config *cfg;          /* the model's config (malloc'd): shape, max_target_length, ... */
	int hf;                  /* 1: a Hugging Face directory */
	char path[ST_PATH_MAX];  /* the directory the weights came from (a step directory for checkpoints) */
	int64_t context;         /* positions the model was made for */
	const char *context_key; /* where that comes from: "max_target_length" or "max_position_embeddings" */
	/* config.json's and generation_config.json's eos_token_id (an id or a
	 * list); none for a checkpoint */
	int32_t eos[ST_INFER_MAX_EOS];
	int neos;
	int32_t bos;             /* config.json's bos_token_id, -1 if none */
	/* tokenizer.json beside a Hugging Face model, or the checkpoint's
	 * tokenizer_path when that file exists; "" if neither */
	char tokenizer[ST_PATH_MAX];
	int add_bos;             /* the checkpoint's add_bos; 1 for Hugging Face */
	double load_s;           /* seconds to read the weights */
} st_infer_model;

#define ST_INFER_MODEL_INIT {.bos = -1} /* m: ST_LLAMA_INIT */

int st_infer_model_load(st_infer_model *im, const char *dir);
void st_infer_model_release(st_infer_model *im);

#endif
