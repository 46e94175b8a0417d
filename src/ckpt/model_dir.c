/*
 * model_dir.c - what model a directory holds, as a config, before its
 * parameters are read (st_ckpt_model_config, ckpt.h): the config a
 * checkpoint was saved with, or one made from a Hugging Face config.json,
 * the inverse of what export writes (hf.c). A Hugging Face file comes from
 * anywhere, so every key used is checked for its type and range and the
 * features this Llama lacks (biases, other activations, other RoPE
 * scalings) are refused by name rather than loaded wrong.
 */
#include "ckpt/ckpt_int.h"

#include "base/err.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A positive integer key: *v, or dflt (> 0) when absent; dflt 0: required. */
static int pos_int(const char *where, json_t *cfg, const char *key, int64_t dflt, int64_t *v)
{
	json_t *j = json_object_get(cfg, key);
	if (!j || (json_is_null(j) && dflt > 0)) {
		if (dflt <= 0)
			return st_fail(ST_EINVAL, "%s: no \"%s\" (a Llama's config.json has it)", where, key);
		*v = dflt;
		return 0;
	}
	if (!json_is_integer(j) || json_integer_value(j) <= 0 || json_integer_value(j) > (INT64_C(1) << 40))
		return st_fail(ST_EINVAL, "%s: \"%s\" must be a positive integer", where, key);
	*v = json_integer_value(j);
	return 0;
}

static int pos_real(const char *where, json_t *cfg, const char *key, double dflt, double *v)
{
	json_t *j = json_object_get(cfg, key);
	if (!j && dflt > 0) {
		*v = dflt;
		return 0;
	}
	if (!json_is_number(j) || !(json_number_value(j) > 0) || !isfinite(json_number_value(j)))
		return st_fail(ST_EINVAL, "%s: \"%s\" must be a positive number", where, key);
	*v = json_number_value(j);
	return 0;
}

/* key, when present, must be the string want (or false when want is NULL). */
static int must_be(const char *where, json_t *cfg, const char *key, const char *want, const char *why)
{
	json_t *j = json_object_get(cfg, key);
	if (!j || json_is_null(j))
		return 0;
	if (want ? json_is_string(j) && !strcmp(json_string_value(j), want) : json_is_false(j))
		return 0;
	return st_fail(ST_EINVAL, "%s: \"%s\" must be %s%s%s: %s", where, key, want ? "\"" : "false", want ? want : "",
		       want ? "\"" : "", why);
}

static int hf_config(const char *dir, st_config *c)
{
	char where[ST_PATH_MAX];
	json_error_t jerr;
	json_t *cfg = NULL;
	int rc;

	if ((rc = st_path_join(where, sizeof(where), dir, "config.json")) < 0)
		return rc;
	if (!(cfg = json_load_file(where, JSON_REJECT_DUPLICATES, &jerr)))
		return st_fail(ST_EINVAL, "%s:%d: not JSON: %s", where, jerr.line, jerr.text);
	if (!json_is_object(cfg)) {
		rc = st_fail(ST_EINVAL, "%s: not a JSON object", where);
		goto out;
	}
	if ((rc = must_be(where, cfg, "model_type", "llama", "slicetrain runs Llama models")) < 0 ||
	    (rc = must_be(where, cfg, "hidden_act", "silu", "Llama's SwiGLU")) < 0 ||
	    (rc = must_be(where, cfg, "attention_bias", NULL, "this Llama has no biases")) < 0 ||
	    (rc = must_be(where, cfg, "mlp_bias", NULL, "this Llama has no biases")) < 0)
		goto out;
	int64_t E, M, H, K, L, V, D, ctx;
	double eps, theta;
	if ((rc = pos_int(where, cfg, "hidden_size", 0, &E)) < 0 || (rc = pos_int(where, cfg, "intermediate_size", 0, &M)) < 0 ||
	    (rc = pos_int(where, cfg, "num_attention_heads", 0, &H)) < 0 ||
	    (rc = pos_int(where, cfg, "num_hidden_layers", 0, &L)) < 0 || (rc = pos_int(where, cfg, "vocab_size", 0, &V)) < 0 ||
	    (rc = pos_int(where, cfg, "num_key_value_heads", H, &K)) < 0 ||
	    (rc = pos_int(where, cfg, "head_dim", E / H > 0 ? E / H : 1, &D)) < 0 ||
	    (rc = pos_int(where, cfg, "max_position_embeddings", 2048, &ctx)) < 0 ||
	    (rc = pos_real(where, cfg, "rms_norm_eps", 1e-6, &eps)) < 0 ||
	    (rc = pos_real(where, cfg, "rope_theta", 10000.0, &theta)) < 0)
		goto out;
	if (H % K) {
		rc = st_fail(ST_EINVAL, "%s: num_attention_heads %" PRId64 " is not a multiple of num_key_value_heads %" PRId64,
			     where, H, K);
		goto out;
	}
	if (D % 2) {
		rc = st_fail(ST_EINVAL, "%s: head_dim %" PRId64 " must be even (RoPE rotates pairs)", where, D);
		goto out;
	}
	json_t *rs = json_object_get(cfg, "rope_scaling");
	int llama31 = 0;
	double factor = 0, lo = 0, hi = 0, orig = 0;
	if (rs && !json_is_null(rs)) {
		json_t *type = json_object_get(rs, "rope_type");
		if (!type)
			type = json_object_get(rs, "type");
		if (!json_is_object(rs) || !json_is_string(type)) {
			rc = st_fail(ST_EINVAL, "%s: \"rope_scaling\" must be null or an object with a \"rope_type\"", where);
			goto out;
		}
		if (!strcmp(json_string_value(type), "llama3")) {
			int64_t o;
			llama31 = 1;
			if ((rc = pos_real(where, rs, "factor", 0, &factor)) < 0 ||
			    (rc = pos_real(where, rs, "low_freq_factor", 0, &lo)) < 0 ||
			    (rc = pos_real(where, rs, "high_freq_factor", 0, &hi)) < 0 ||
			    (rc = pos_int(where, rs, "original_max_position_embeddings", 0, &o)) < 0)
				goto out;
			orig = (double)o;
			if (!(hi > lo)) {
				rc = st_fail(ST_EINVAL, "%s: rope_scaling high_freq_factor must exceed low_freq_factor", where);
				goto out;
			}
		} else if (strcmp(json_string_value(type), "default") != 0) {
			rc = st_fail(ST_EINVAL, "%s: rope_scaling type \"%s\" is not supported (only Llama 3.1's \"llama3\")",
				     where, json_string_value(type));
			goto out;
		}
	}
	/* every other key at its default; the shape is set below */
	if ((rc = st_config_from_json(c, "{\"base_emb_dim\": 1, \"base_num_query_heads\": 1, \"base_num_kv_heads\": 1, "
				      "\"base_num_decoder_layers\": 1, \"base_mlp_dim\": 1, \"head_dim\": 1, "
				      "\"vocab_size\": 1}")) < 0)
		goto out;
	snprintf(c->model_name, sizeof(c->model_name), "%s", "config.json");
	c->emb_dim = E;
	c->mlp_dim = M;
	c->num_query_heads = H;
	c->num_kv_heads = K;
	c->num_decoder_layers = L;
	c->head_dim = D;
	c->vocab_size = V;
	c->norm_eps = eps;
	c->rope_theta = theta;
	c->rope_llama31 = llama31;
	if (llama31) {
		c->rope_scale_factor = factor;
		c->rope_low_freq_factor = lo;
		c->rope_high_freq_factor = hi;
		c->rope_original_max_len = (int64_t)orig;
	}
	c->max_target_length = ctx;
	c->tokenizer_path[0] = 0;
out:
	json_decref(cfg);
	return rc;
}

int st_ckpt_model_config(const char *dir, st_config *c, char *path, size_t cap, int *hf)
{
	char p[ST_PATH_MAX], ckdir[ST_PATH_MAX];
	struct stat st;
	struct ck_manifest m = {0};
	int64_t *steps = NULL;
	int n = 0, rc;

	memset(c, 0, sizeof(*c));
	*hf = 0;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return st_fail(ST_EINVAL, "%s: no such directory", dir);
	if ((rc = st_path_join(p, sizeof(p), dir, CK_MANIFEST)) < 0)
		return rc;
	if (!st_file_exists(p)) {
		if ((rc = st_path_join(p, sizeof(p), dir, "config.json")) < 0)
			return rc;
		if (st_file_exists(p)) {
			*hf = 1;
			snprintf(path, cap, "%s", dir);
			return hf_config(dir, c);
		}
		st_ckpt_resolve_dir(dir, ckdir, sizeof(ckdir));
		if ((rc = ck_list_steps(ckdir, 1, &steps, &n)) < 0)
			return rc;
		if (n == 0) {
			free(steps);
			return st_fail(ST_EINVAL, "%s: no model here: neither a Hugging Face model directory (config.json) "
				       "nor a committed checkpoint (a step directory with %s, or a checkpoints or run "
				       "directory holding one)", dir, CK_MANIFEST);
		}
		rc = ck_step_dir(p, sizeof(p), ckdir, steps[n - 1]);
		free(steps);
		if (rc < 0)
			return rc;
	} else {
		snprintf(p, sizeof(p), "%s", dir);
	}
	if ((rc = ck_manifest_load(&m, p, -1)) < 0)
		return rc;
	if (!m.config_json)
		rc = st_fail(ST_EINVAL, "%s/%s: no config", p, CK_MANIFEST);
	else if ((rc = st_config_from_json(c, m.config_json)) < 0) {
		rc = st_wrap(ST_EINVAL, "%s/%s", p, CK_MANIFEST);
	}
	ck_manifest_free(&m);
	if (rc == 0)
		snprintf(path, cap, "%s", p);
	return rc;
}
