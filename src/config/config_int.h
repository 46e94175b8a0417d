/*
 * config_int.h - internals shared by the config loader (config.c), the typed
 * key table (config_keys.c) and the derivation/validation step
 * (config_check.c). Not a public API.
 */
#ifndef ST_CONFIG_CONFIG_INT_H
#define ST_CONFIG_CONFIG_INT_H

#include "config/config.h"
#include "config/yaml.h"

#include <stddef.h>

enum st_rope_type { ST_ROPE_DEFAULT, ST_ROPE_LLAMA31 };

/* Everything the key table writes: the public struct plus keys that only
 * steer the derivation (they have no field in st_config). */
struct st_cfull {
	st_config c;
	int64_t global_parameter_scale;
	int override_model_config;
	int rope_type; /* enum st_rope_type */
	int rope_use_scale;
	int enable_dropout;
	double dropout_rate;
};

enum st_ckey_type {
	ST_K_INT,    /* int64_t; integral floats (1e3) accepted */
	ST_K_INT_NONE, /* as ST_K_INT, and None gives -1 (max_num_checkpoints_to_keep) */
	ST_K_FLOAT,  /* double, finite */
	ST_K_BOOL,   /* int 0/1 */
	ST_K_STR,    /* char[size]; None gives "" */
	ST_K_ENUM,   /* int, from the names in .enums */
	ST_K_FIXED,  /* MaxText key our Llama needs at one value: .def lists the accepted ones */
	ST_K_LOADER, /* read by the loader itself (base_config) */
};

struct st_cenum {
	const char *name;
	int value;
};

struct st_ckey {
	const char *name;
	enum st_ckey_type type;
	size_t off;  /* offset of the field in struct st_cfull */
	size_t size; /* ST_K_STR: size of the char array */
	const char *def; /* built-in default as YAML text (NULL: none); ST_K_FIXED: "a | b" accepted values */
	const struct st_cenum *enums; /* ST_K_ENUM: {NULL, 0}-terminated */
	const char *alias_of; /* set on an old name: the key it sets */
};

/* The key named NAME (an alias returns its own entry), or NULL. */
const struct st_ckey *st_ckey_find(const char *name);
/* The whole table, *n entries. */
const struct st_ckey *st_ckey_table(size_t *n);
/* NAME, or the key it is an older name of. */
const char *st_ckey_canonical(const char *name);
/* The first name of value V in enum key K's table ("none" for
 * remat_policy ST_REMAT_NONE, not its alias "save-all"), or NULL. */
const char *st_ckey_enum_name(const struct st_ckey *k, int v);

/* Fill F with the built-in defaults (the values in configs/base.yml). */
void st_ckeys_set_defaults(struct st_cfull *f);

/*
 * Check V against K's type and store it into F. WHERE names the source
 * ("file.yml:12" or "command line") for the error message.
 */
int st_ckey_set(struct st_cfull *f, const struct st_ckey *k, const st_ynode *v, const char *where);

/*
 * Parse a command-line value the YAML way: [a, b] lists, {k: v} maps, "quoted" strings,
 * anything else a plain scalar taken literally (so globs and #1 stay text).
 * KEY is used in messages. *out is freed by the caller.
 */
int st_cvalue_parse(const char *key, const char *text, st_ynode **out);

/* Source of a key's value for messages: "file:line", "command line" or "default". */
typedef const char *(*st_cwhere_fn)(const void *ctx, const char *key);

/*
 * Derive (global_parameter_scale, schedule length, run_name, output
 * directory, RoPE scaling) and validate F; then print the warnings that
 * belong to the final values (bf16, dropout, output directory).
 */
int st_cfull_finish(struct st_cfull *f, st_cwhere_fn where, const void *ctx);

#endif
