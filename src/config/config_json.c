/*
 * config_json.c - the resolved config <-> JSON, for checkpoint manifests.
 *
 * Walks the typed key table (config_keys.c), so a key added there is saved
 * and restored without touching this file. Only keys whose field lives in
 * st_config are written; keys that only steer the derivation (rope_type,
 * global_parameter_scale, ...) are replaced by their result: the model shape
 * fields hold the scaled values and "rope_type" says whether Llama 3.1
 * scaling is on.
 */
#include "config/config_int.h"

#include "base/err.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The key's field, if it is a field of st_config (c comes first in st_cfull). */
static void *public_field(struct st_cfull *f, const struct st_ckey *k)
{
	if (k->alias_of || k->type == ST_K_FIXED || k->type == ST_K_LOADER || k->off >= sizeof(st_config))
		return NULL;
	return (char *)f + k->off;
}

int st_config_to_json(const st_config *c, char **out)
{
	struct st_cfull f = {.c = *c};
	size_t n;
	const struct st_ckey *keys = st_ckey_table(&n);
	json_t *root = json_object(), *v;

	*out = NULL;
	if (!root)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const struct st_ckey *k = &keys[i];
		void *field = public_field(&f, k);
		if (!field)
			continue;
		switch (k->type) {
		case ST_K_INT:
			v = json_integer(*(int64_t *)field);
			break;
		case ST_K_INT_NONE:
			v = *(int64_t *)field == -1 ? json_null() : json_integer(*(int64_t *)field);
			break;
		case ST_K_FLOAT:
			v = json_real(*(double *)field);
			break;
		case ST_K_BOOL:
			v = json_boolean(*(int *)field);
			break;
		case ST_K_STR:
			v = json_string((const char *)field);
			break;
		case ST_K_ENUM: {
			const char *name = st_ckey_enum_name(k, *(int *)field);
			v = name ? json_string(name) : json_integer(*(int *)field);
			break;
		}
		default:
			continue;
		}
		if (!v)
			goto bad_string;
		if (json_object_set_new(root, k->name, v) < 0)
			goto nomem;
	}
	if (json_object_set_new(root, "rope_type", json_string(c->rope_llama31 ? "llama3.1" : "default")) < 0)
		goto nomem;
	*out = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	return *out ? 0 : st_fail(ST_ENOMEM, "out of memory");
bad_string:
	json_decref(root);
	return st_fail(ST_EINVAL, "config: a string value is not valid UTF-8");
nomem:
	json_decref(root);
	return st_fail(ST_ENOMEM, "out of memory");
}

static int wrong_type(const char *key, const char *want)
{
	return st_fail(ST_EINVAL, "config JSON: key '%s' is not %s", key, want);
}

static int set_from_json(const struct st_ckey *k, void *field, json_t *v)
{
	switch (k->type) {
	case ST_K_INT_NONE:
		if (json_is_null(v)) {
			*(int64_t *)field = -1;
			return 0;
		}
		/* fall through */
	case ST_K_INT:
		if (!json_is_integer(v))
			return wrong_type(k->name, "an integer");
		*(int64_t *)field = json_integer_value(v);
		return 0;
	case ST_K_FLOAT:
		if (!json_is_number(v))
			return wrong_type(k->name, "a number");
		*(double *)field = json_number_value(v);
		return 0;
	case ST_K_BOOL:
		if (!json_is_boolean(v))
			return wrong_type(k->name, "true or false");
		*(int *)field = json_is_true(v);
		return 0;
	case ST_K_STR: {
		const char *s = json_string_value(v);
		if (json_is_null(v))
			s = "";
		if (!s)
			return wrong_type(k->name, "a string");
		if (strlen(s) >= k->size)
			return st_fail(ST_EINVAL, "config JSON: key '%s' is too long", k->name);
		memcpy(field, s, strlen(s) + 1);
		return 0;
	}
	case ST_K_ENUM: {
		const char *s = json_string_value(v);
		if (!s)
			return wrong_type(k->name, "a string");
		for (const struct st_cenum *e = k->enums; e->name; e++) {
			if (strcmp(e->name, s) == 0) {
				*(int *)field = e->value;
				return 0;
			}
		}
		return st_fail(ST_EINVAL, "config JSON: key '%s': unknown value '%s'", k->name, s);
	}
	default:
		return 0;
	}
}

int st_config_from_json(st_config *c, const char *text)
{
	static const char *const shape_keys[] = {"base_emb_dim", "base_num_query_heads", "base_num_kv_heads",
						 "base_num_decoder_layers", "base_mlp_dim", "head_dim", "vocab_size"};
	struct st_cfull f;
	json_error_t jerr;
	json_t *root, *v;
	size_t n;
	const struct st_ckey *keys = st_ckey_table(&n);
	int rc = 0;

	memset(c, 0, sizeof(*c));
	root = json_loads(text, 0, &jerr);
	if (!root)
		return st_fail(ST_EINVAL, "config JSON: %s (line %d)", jerr.text, jerr.line);
	if (!json_is_object(root)) {
		json_decref(root);
		return st_fail(ST_EINVAL, "config JSON: not an object");
	}
	st_ckeys_set_defaults(&f);
	for (size_t i = 0; i < n && rc == 0; i++) {
		void *field = public_field(&f, &keys[i]);
		if (field && (v = json_object_get(root, keys[i].name)))
			rc = set_from_json(&keys[i], field, v);
	}
	for (size_t i = 0; i < sizeof(shape_keys) / sizeof(shape_keys[0]) && rc == 0; i++) {
		v = json_object_get(root, shape_keys[i]);
		if (!json_is_integer(v) || json_integer_value(v) <= 0)
			rc = st_fail(ST_EINVAL, "config JSON: model shape key '%s' is missing or not positive",
				     shape_keys[i]);
	}
	if (rc == 0) {
		v = json_object_get(root, "rope_type");
		f.c.rope_llama31 = json_is_string(v) && strcmp(json_string_value(v), "llama3.1") == 0;
		*c = f.c;
	}
	json_decref(root);
	return rc;
}
