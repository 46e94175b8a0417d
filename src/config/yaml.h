/*
 * yaml.h - YAML documents as a small tree (scalars, sequences, maps), on top
 * of libyaml. Internal to src/config/.
 *
 *   st_ynode *root;
 *   if (st_yaml_load_file("configs/base.yml", &root) < 0)   // ST_EINVAL, message set
 *           return rc;
 *   const st_ynode *v = st_ymap_get(root, "steps");
 *   st_yvalue val = st_yscalar_value(v);                     // ST_YV_INT, .i = 150001
 *   st_ynode_free(root);
 *
 * Scalars keep the text as written and resolve to a typed value the way
 * MaxText's loader (PyYAML/OmegaConf) reads them: plain 1_000 is an int,
 * 3.e-5 and 1e5 are floats, true/True/TRUE are booleans, null/~/None/none and
 * an empty plain scalar are null; quoted scalars are always strings.
 * Anchors are ignored and aliases rejected (configs have none; copying them
 * invites exponential blow-up). Documents nest at most ST_YAML_MAX_DEPTH deep.
 */
#ifndef ST_CONFIG_YAML_H
#define ST_CONFIG_YAML_H

#include <stddef.h>
#include <stdint.h>

#define ST_YAML_MAX_DEPTH 64
#define ST_YAML_MAX_BYTES (16u << 20)

enum st_ykind { ST_Y_SCALAR, ST_Y_SEQ, ST_Y_MAP };

typedef struct st_ynode st_ynode;
struct st_ynode {
	enum st_ykind kind;
	int line, col;     /* 1-based position in the source */
	char *text;        /* SCALAR: text as written, quotes removed */
	int quoted;        /* SCALAR: quoted or tagged !!str: always a string */
	size_t n;          /* SEQ: number of items; MAP: number of pairs */
	st_ynode **keys;   /* MAP: key scalars */
	st_ynode **items;  /* SEQ: items; MAP: values (items[i] belongs to keys[i]) */
};

enum st_yvtype { ST_YV_NULL, ST_YV_BOOL, ST_YV_INT, ST_YV_FLOAT, ST_YV_STR, ST_YV_SEQ, ST_YV_MAP };

typedef struct st_yvalue {
	enum st_yvtype type;
	int b;            /* BOOL */
	int64_t i;        /* INT (valid unless overflow) */
	double f;         /* FLOAT; for INT also the value as a double */
	int overflow;     /* INT or FLOAT out of range (1e999, 2**63) */
	const char *s;    /* STR: the text */
} st_yvalue;

/*
 * Parse a whole file. Returns 0 with *root (NULL for a file without any
 * document), or ST_EINVAL: "cannot read config 'X': <strerror>",
 * "X:line:col: <libyaml problem>", too large, aliases, too deep.
 * The caller frees *root with st_ynode_free().
 */
int st_yaml_load_file(const char *path, st_ynode **root);

/* Parse text (NAME is used in messages). Same contract as st_yaml_load_file. */
int st_yaml_parse(const char *name, const char *text, size_t len, st_ynode **root);

/* A new scalar node (copies TEXT); NULL when out of memory. */
st_ynode *st_ynode_new_scalar(const char *text, int quoted, int line, int col);

void st_ynode_free(st_ynode *n);

/* The value of KEY in a map node, or NULL. */
const st_ynode *st_ymap_get(const st_ynode *map, const char *key);

/* The typed value of a node (SEQ and MAP resolve to their kind only). */
st_yvalue st_ynode_value(const st_ynode *n);

/*
 * Deep equality by typed value: 500_000 equals 500000 and 5.e5, "silu"
 * equals silu, maps compare regardless of key order.
 */
int st_ynode_equal(const st_ynode *a, const st_ynode *b);

/* Write N as compact flow YAML into BUF (truncated with "..."). Returns BUF. */
char *st_ynode_format(const st_ynode *n, char *buf, size_t cap);

#endif
