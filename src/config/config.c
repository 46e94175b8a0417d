/*
 * config.c - builds a config from layers, MaxText style:
 *
 *   files:  the config file, after its base_config parents (child wins)
 *   model:  models/<model_name>.yml, when model_name is not "default"
 *   cli:    key=value overrides
 *
 * merged as files < model < cli, then typed through the key table
 * (config_keys.c) and derived/validated (config_check.c). Keys that a loaded
 * file holds but slicetrain does not implement are kept at their file value.
 */
#include "config/config_int.h"

#include "base/array.h"
#include "base/err.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CHAIN 16        /* base_config files, nested */
#define MAX_KEY_LEN 200     /* command-line key names */
#define UNIMPL_LISTED 8     /* unimplemented keys named in the warning */

static char config_dir[ST_PATH_MAX] = "configs";

void st_config_set_config_dir(const char *dir)
{
	snprintf(config_dir, sizeof(config_dir), "%s", dir && *dir ? dir : "configs");
}

const char *st_config_get_config_dir(void) { return config_dir; }

/* ---- layers: ordered key -> value maps ---- */

struct entry {
	const char *key;     /* canonical name (aliases resolved) */
	const char *given;   /* the name as written */
	const st_ynode *val;
	const char *file;    /* NULL: command line */
	int line;
};

struct layer {
	struct entry *v;
	size_t n, cap;
};

static struct entry *layer_find(const struct layer *l, const char *key)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i].key, key) == 0)
			return &l->v[i];
	return NULL;
}

/* Sets E's key in L (replacing an earlier value, keeping its position). */
static int layer_put(struct layer *l, const struct entry *e)
{
	struct entry *old = layer_find(l, e->key);
	if (old) {
		*old = *e;
		return 0;
	}
	int rc = st_array_reserve(&l->v, &l->cap, l->n, sizeof(*l->v), 64);
	if (rc < 0)
		return rc;
	l->v[l->n++] = *e;
	return 0;
}

static int layer_merge(struct layer *dst, const struct layer *src)
{
	int rc;
	for (size_t i = 0; i < src->n; i++)
		if ((rc = layer_put(dst, &src->v[i])) < 0)
			return rc;
	return 0;
}

/* snprintf at BUF+*LEN that never runs past CAP (the text is cut instead). */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*len >= cap - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (n > 0)
		*len += (size_t)n < cap - *len ? (size_t)n : cap - *len - 1;
}

/* "file:line" or "command line" */
static const char *entry_where(const struct entry *e, char *buf, size_t cap)
{
	if (!e->file)
		return "command line";
	snprintf(buf, cap, "%s:%d", e->file, e->line);
	return buf;
}

/* ---- the loader: owns every tree and string the layers point into ---- */

struct loader {
	st_ynode **trees;
	size_t ntrees, cap_trees;
	char **strs;
	size_t nstrs, cap_strs;
	const char *chain[MAX_CHAIN]; /* real paths of the base_config chain being loaded */
	int depth;
	struct layer files, model, cli, final;
	char where_buf[ST_PATH_MAX + 32];
};

static int keep_tree(struct loader *ld, st_ynode *t)
{
	int rc = st_array_reserve(&ld->trees, &ld->cap_trees, ld->ntrees, sizeof(*ld->trees), 16);
	if (rc < 0) {
		st_ynode_free(t);
		return rc;
	}
	ld->trees[ld->ntrees++] = t;
	return 0;
}

/* A copy of S owned by the loader, or NULL (message set). */
static const char *keep_str(struct loader *ld, const char *s)
{
	char *copy;
	if (st_array_reserve(&ld->strs, &ld->cap_strs, ld->nstrs, sizeof(*ld->strs), 16) < 0 || !(copy = strdup(s)))
		goto oom;
	ld->strs[ld->nstrs++] = copy;
	return copy;
oom:
	st_fail(ST_ENOMEM, "out of memory");
	return NULL;
}

static void loader_release(struct loader *ld)
{
	for (size_t i = 0; i < ld->ntrees; i++)
		st_ynode_free(ld->trees[i]);
	for (size_t i = 0; i < ld->nstrs; i++)
		free(ld->strs[i]);
	free(ld->trees);
	free(ld->strs);
	free(ld->files.v);
	free(ld->model.v);
	free(ld->cli.v);
	free(ld->final.v);
}

/* ---- config files ---- */

/* Directory part of PATH into BUF ("." when there is none). */
static void dir_of(const char *path, char *buf, size_t cap)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(buf, cap, ".");
	else if (slash == path)
		snprintf(buf, cap, "/");
	else
		snprintf(buf, cap, "%.*s", (int)(slash - path), path);
}

static int chain_error(struct loader *ld, const char *real)
{
	char msg[900] = "";
	size_t len = 0;
	for (int i = 0; i < ld->depth; i++)
		append(msg, sizeof(msg), &len, "%s -> ", ld->chain[i]);
	return st_fail(ST_EINVAL, "base_config cycle: %s%s", msg, real);
}

/*
 * The older and newer name of one key (cosine_learning_rate_final_fraction,
 * learning_rate_final_fraction) in the same file must agree.
 */
static int check_alias_pair(const char *path, const st_ynode *root, size_t i)
{
	const char *given = root->keys[i]->text, *canon = st_ckey_canonical(given);
	const st_ynode *other;

	if (canon == given || !(other = st_ymap_get(root, canon)))
		return 0;
	if (st_ynode_equal(root->items[i], other))
		return 0;
	return st_fail(ST_EINVAL, "%s:%d: %s and %s (line %d) set different values; use %s only", path,
		       root->keys[i]->line, given, canon, other->line, canon);
}

static int load_file(struct loader *ld, const char *path, struct layer *dst);

/* Loads the file named by base_config (value BC, in file PATH) into DST. */
static int load_parent(struct loader *ld, const char *path, const st_ynode *bc, struct layer *dst)
{
	char dir[ST_PATH_MAX], parent[2 * ST_PATH_MAX];
	st_yvalue v = st_ynode_value(bc);

	if (v.type != ST_YV_STR || !v.s[0])
		return st_fail(ST_EINVAL, "%s:%d: base_config must name a YAML file", path, bc->line);
	if (v.s[0] == '/') {
		snprintf(parent, sizeof(parent), "%s", v.s);
	} else {
		dir_of(path, dir, sizeof(dir));
		snprintf(parent, sizeof(parent), "%s/%s", dir, v.s);
	}
	return load_file(ld, parent, dst);
}

/* Reads the entries of one parsed file (ROOT, from PATH) into DST. */
static int add_file_entries(struct loader *ld, const char *path, const st_ynode *root, struct layer *dst)
{
	const char *file = keep_str(ld, path);
	int rc;

	if (!file)
		return ST_ENOMEM;
	for (size_t i = 0; i < root->n; i++) {
		const char *given = root->keys[i]->text;
		struct entry e = {st_ckey_canonical(given), given, root->items[i], file, root->keys[i]->line};
		if (strcmp(given, "base_config") == 0)
			continue;
		if ((rc = check_alias_pair(path, root, i)) < 0 || (rc = layer_put(dst, &e)) < 0)
			return rc;
	}
	return 0;
}

/* Loads PATH (after its base_config chain) into DST; later files win. */
static int load_file(struct loader *ld, const char *path, struct layer *dst)
{
	char real[PATH_MAX];
	const st_ynode *bc;
	st_ynode *root;
	int rc;

	if ((rc = st_yaml_load_file(path, &root)) < 0)
		return rc;
	if (!root)
		return st_fail(ST_EINVAL, "%s: empty config file (expected key: value lines)", path);
	if ((rc = keep_tree(ld, root)) < 0)
		return rc;
	if (root->kind != ST_Y_MAP)
		return st_fail(ST_EINVAL, "%s:%d: the top level of a config must be a map of key: value lines",
			       path, root->line);
	if (!realpath(path, real))
		snprintf(real, sizeof(real), "%s", path);
	for (int i = 0; i < ld->depth; i++)
		if (strcmp(ld->chain[i], real) == 0)
			return chain_error(ld, real);
	if (ld->depth == MAX_CHAIN)
		return st_fail(ST_EINVAL, "%s: base_config chain longer than %d files", path, MAX_CHAIN);
	if (!(ld->chain[ld->depth] = keep_str(ld, real)))
		return ST_ENOMEM;
	ld->depth++;
	rc = 0;
	if ((bc = st_ymap_get(root, "base_config")))
		rc = load_parent(ld, path, bc, dst);
	ld->depth--;
	if (rc < 0)
		return rc;
	return add_file_entries(ld, path, root, dst);
}

/* ---- command line ---- */

static int valid_key_name(const char *key, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		char ch = key[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '_' || ch == '.' || ch == '-'))
			return 0;
	}
	return 1;
}

/* An alias and its canonical name given with different values on the command line. */
static int check_cli_alias(const struct layer *cli, const struct entry *e)
{
	const struct entry *old = layer_find(cli, e->key);
	if (!old || strcmp(old->given, e->given) == 0 || st_ynode_equal(old->val, e->val))
		return 0;
	return st_fail(ST_EINVAL, "command line: %s and %s set different values; use %s only", old->given,
		       e->given, e->key);
}

static int parse_override(struct loader *ld, const char *arg)
{
	const char *eq = strchr(arg, '=');
	char key[MAX_KEY_LEN + 1];
	struct entry e = {0};
	st_ynode *val;
	size_t klen;
	int rc;

	if (!eq)
		return st_fail(ST_EINVAL, "command line: '%.200s' is not a key=value override", arg);
	klen = (size_t)(eq - arg);
	if (klen == 0)
		return st_fail(ST_EINVAL, "command line: '%.200s' has no key before '='", arg);
	if (klen > MAX_KEY_LEN || !valid_key_name(arg, klen))
		return st_fail(ST_EINVAL, "command line: '%.*s' is not a valid key name", klen > 200 ? 200 : (int)klen,
			       arg);
	memcpy(key, arg, klen);
	key[klen] = '\0';
	if (strcmp(key, "base_config") == 0)
		return st_fail(ST_EINVAL, "command line: base_config can only be set inside a config file");
	if ((rc = st_cvalue_parse(key, eq + 1, &val)) < 0)
		return rc;
	if ((rc = keep_tree(ld, val)) < 0)
		return rc;
	if (!(e.given = keep_str(ld, key)))
		return ST_ENOMEM;
	e.key = st_ckey_canonical(e.given);
	e.val = val;
	if ((rc = check_cli_alias(&ld->cli, &e)) < 0)
		return rc;
	return layer_put(&ld->cli, &e); /* the same key twice: the last one wins, as in MaxText */
}

static int parse_overrides(struct loader *ld, int n, char **overrides)
{
	int rc;
	for (int i = 0; i < n; i++)
		if ((rc = parse_override(ld, overrides[i] ? overrides[i] : "")) < 0)
			return rc;
	return 0;
}

/* ---- model files ---- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Appends the model names (*.yml) found in DIR/models to NAMES. */
static void collect_models(const char *dir, char **names, size_t *n, size_t max)
{
	char path[ST_PATH_MAX + 16];
	struct dirent *d;
	DIR *dp;

	snprintf(path, sizeof(path), "%s/models", dir);
	if (!(dp = opendir(path)))
		return;
	while ((d = readdir(dp)) && *n < max) {
		size_t len = strlen(d->d_name);
		if (len > 4 && strcmp(d->d_name + len - 4, ".yml") == 0 && d->d_name[0] != '.')
			if ((names[*n] = strndup(d->d_name, len - 4)))
				(*n)++;
	}
	closedir(dp);
}

static int unknown_model(const char *name, const char *where, const char *top_dir)
{
	char *names[128], list[600];
	size_t n = 0, len = 0;

	collect_models(top_dir, names, &n, 128);
	if (strcmp(top_dir, config_dir) != 0)
		collect_models(config_dir, names, &n, 128);
	qsort(names, n, sizeof(names[0]), cmp_str);
	list[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
			append(list, sizeof(list), &len, "%s%s", len ? ", " : "", names[i]);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	if (strcmp(top_dir, config_dir) == 0)
		return st_fail(ST_EINVAL, "unknown model_name '%.100s' (%s): no models/%.100s.yml in %.300s; "
			       "available: %s", name, where, name, top_dir, n ? list : "(none)");
	return st_fail(ST_EINVAL, "unknown model_name '%.100s' (%s): no models/%.100s.yml in %.300s or %.300s; "
		       "available: %s", name, where, name, top_dir, config_dir, n ? list : "(none)");
}

/* The model file for NAME: <top_dir>/models/NAME.yml, then <config_dir>/models/NAME.yml. */
static int find_model(const char *name, const char *where, const char *top_dir, char *path, size_t cap)
{
	if (!name[0] || strchr(name, '/') || name[0] == '.' || strlen(name) > 200)
		return st_fail(ST_EINVAL, "%s: invalid model_name '%.200s'", where, name);
	snprintf(path, cap, "%s/models/%s.yml", top_dir, name);
	if (access(path, R_OK) == 0)
		return 0;
	snprintf(path, cap, "%s/models/%s.yml", config_dir, name);
	if (access(path, R_OK) == 0)
		return 0;
	return unknown_model(name, where, top_dir);
}

static int load_model(struct loader *ld, const char *top_path)
{
	const struct entry *e = layer_find(&ld->cli, "model_name");
	char top_dir[ST_PATH_MAX], path[2 * ST_PATH_MAX + 32], buf[ST_PATH_MAX + 32];
	const char *where;
	st_yvalue v;
	int rc;

	if (!e)
		e = layer_find(&ld->files, "model_name");
	if (!e)
		return 0;
	where = entry_where(e, buf, sizeof(buf));
	v = st_ynode_value(e->val);
	if (e->val->kind != ST_Y_SCALAR || v.type == ST_YV_NULL)
		return st_fail(ST_EINVAL, "%s: model_name must be a name", where);
	if (strcmp(e->val->text, "default") == 0)
		return 0;
	dir_of(top_path, top_dir, sizeof(top_dir));
	if ((rc = find_model(e->val->text, where, top_dir, path, sizeof(path))) < 0)
		return rc;
	ld->depth = 0;
	return load_file(ld, path, &ld->model);
}

/* ---- checks between layers ---- */

/* The file value of KEY: the model file's, else the config files'. */
static const struct entry *file_entry(const struct loader *ld, const char *key)
{
	const struct entry *e = layer_find(&ld->model, key);
	return e ? e : layer_find(&ld->files, key);
}

static const char *suggest_key(const struct loader *ld, const char *key)
{
	const char *best = NULL;
	int best_d = 1 << 30, d;
	size_t n;
	const struct st_ckey *table = st_ckey_table(&n);
	const struct layer *layers[] = {&ld->files, &ld->model};

	for (size_t i = 0; i < n; i++)
		if ((d = st_edit_distance(key, table[i].name)) < best_d)
			best_d = d, best = table[i].name;
	for (int l = 0; l < 2; l++)
		for (size_t i = 0; i < layers[l]->n; i++)
			if ((d = st_edit_distance(key, layers[l]->v[i].given)) < best_d)
				best_d = d, best = layers[l]->v[i].given;
	return best_d <= 2 + (int)strlen(key) / 3 ? best : NULL;
}

/*
 * Each command-line key must be ours, or a MaxText key that a loaded file
 * holds; a MaxText key we do not implement may only repeat its file value.
 */
static int check_cli_keys(const struct loader *ld)
{
	char fval[160], where[ST_PATH_MAX + 32];

	for (size_t i = 0; i < ld->cli.n; i++) {
		const struct entry *c = &ld->cli.v[i], *f = file_entry(ld, c->key);
		const char *hint;

		if (st_ckey_find(c->given))
			continue;
		if (!f) {
			hint = suggest_key(ld, c->given);
			if (hint)
				return st_fail(ST_EINVAL, "unknown key '%s'; did you mean '%s'?", c->given, hint);
			return st_fail(ST_EINVAL, "unknown key '%s' (not a slicetrain or MaxText config key)",
				       c->given);
		}
		if (!st_ynode_equal(c->val, f->val))
			return st_fail(ST_EINVAL, "key '%s' is not supported by slicetrain (MaxText key; only its "
				       "default %s is accepted, from %s)", c->given,
				       st_ynode_format(f->val, fval, sizeof(fval)), entry_where(f, where, sizeof(where)));
	}
	return 0;
}

/* MaxText: a model key and a CLI key with different values need override_model_config=true. */
static int check_model_conflicts(const struct loader *ld, int override_model_config)
{
	char list[700] = "";
	size_t len = 0;
	int n = 0;

	for (size_t i = 0; i < ld->cli.n; i++) {
		const struct entry *c = &ld->cli.v[i], *m = layer_find(&ld->model, c->key);
		if (!m || st_ynode_equal(c->val, m->val))
			continue;
		append(list, sizeof(list), &len, "%s'%s'", n ? ", " : "", c->key);
		n++;
	}
	if (n == 0 || override_model_config)
		return 0;
	return st_fail(ST_EINVAL, "Keys [%s] are overridden by both model config and command line with "
		       "different values. This is not allowed, unless setting override_model_config=true.", list);
}

static int read_override_flag(const struct loader *ld, int *flag)
{
	const struct entry *e = layer_find(&ld->cli, "override_model_config");
	struct st_cfull tmp = {0};
	char where[ST_PATH_MAX + 32];
	int rc;

	*flag = 0;
	if (!e)
		e = layer_find(&ld->files, "override_model_config");
	if (!e)
		return 0;
	rc = st_ckey_set(&tmp, st_ckey_find("override_model_config"), e->val,
			 entry_where(e, where, sizeof(where)));
	*flag = tmp.override_model_config;
	return rc;
}

/* ---- typing the merged layer ---- */

static const char *where_key(const void *ctx, const char *key)
{
	struct loader *ld = (struct loader *)ctx;
	const struct entry *e = layer_find(&ld->final, key);
	if (!e)
		return "default";
	return entry_where(e, ld->where_buf, sizeof(ld->where_buf));
}

static void warn_unimplemented(const struct layer *final)
{
	char names[900] = "";
	size_t len = 0;
	int n = 0;

	for (size_t i = 0; i < final->n; i++) {
		if (st_ckey_find(final->v[i].key))
			continue;
		if (n < UNIMPL_LISTED)
			append(names, sizeof(names), &len, "%s%.80s", n ? ", " : "", final->v[i].given);
		n++;
	}
	if (n == 0)
		return;
	if (n > UNIMPL_LISTED)
		append(names, sizeof(names), &len, ", ... (%d more)", n - UNIMPL_LISTED);
	st_warn("%d config key%s not implemented by slicetrain, kept at the file's value: %s", n,
		n == 1 ? " is" : "s are", names);
}

static int apply_final(struct loader *ld, struct st_cfull *f)
{
	char where[ST_PATH_MAX + 32];
	int rc;

	st_ckeys_set_defaults(f);
	for (size_t i = 0; i < ld->final.n; i++) {
		const struct entry *e = &ld->final.v[i];
		const struct st_ckey *k = st_ckey_find(e->given);
		if (!k)
			continue;
		if ((rc = st_ckey_set(f, k, e->val, entry_where(e, where, sizeof(where)))) < 0)
			return rc;
	}
	return 0;
}

/* PATH.json: a resolved config as st_config_to_json writes it (the elastic
 * controller's to its hosts' workers), taken as is: no overrides. */
static int load_resolved(st_config *c, const char *path, int noverrides)
{
	enum { MAX_JSON = 1 << 20 };
	if (noverrides)
		return st_fail(ST_EINVAL, "%s is a resolved config (JSON): it takes no key=value overrides", path);
	FILE *f = fopen(path, "rb");
	if (!f)
		return st_fail(ST_EINVAL, "cannot open config %s: %s", path, strerror(errno));
	char *text = malloc(MAX_JSON + 1);
	size_t n = text ? fread(text, 1, MAX_JSON + 1, f) : 0;
	int err = ferror(f);
	fclose(f);
	int rc;
	if (!text)
		rc = st_fail(ST_ENOMEM, "out of memory");
	else if (err || n > MAX_JSON)
		rc = st_fail(ST_EINVAL, "config %s: %s", path, err ? "cannot be read" : "over 1 MiB");
	else {
		text[n] = 0;
		rc = st_config_from_json(c, text);
		if (rc < 0)
			rc = st_wrap(rc, "config %s", path);
	}
	free(text);
	return rc;
}

/* A resolved config: PATH.json, or a file descriptor's path (/dev/fd/N,
 * /proc/self/fd/N: how an elastic agent passes it) whose text opens with '{'. */
static int is_resolved(const char *path)
{
	size_t n = strlen(path);
	if (n > 5 && !strcmp(path + n - 5, ".json"))
		return 1;
	if (strncmp(path, "/dev/fd/", 8) && strncmp(path, "/proc/self/fd/", 14))
		return 0;
	FILE *f = fopen(path, "rb");
	int c = f ? fgetc(f) : EOF;
	if (f)
		fclose(f);
	return c == '{';
}

int st_config_load(st_config *c, const char *path, int noverrides, char **overrides)
{
	struct loader ld = {0};
	struct st_cfull f;
	int rc, override_flag;

	memset(c, 0, sizeof(*c));
	if (!overrides)
		noverrides = 0;
	if (!path || !*path)
		return st_fail(ST_EINVAL, "no config file given");
	if (is_resolved(path))
		return load_resolved(c, path, noverrides);
	if ((rc = parse_overrides(&ld, noverrides, overrides)) < 0)
		goto out;
	if ((rc = load_file(&ld, path, &ld.files)) < 0)
		goto out;
	if ((rc = load_model(&ld, path)) < 0)
		goto out;
	if ((rc = check_cli_keys(&ld)) < 0)
		goto out;
	if ((rc = read_override_flag(&ld, &override_flag)) < 0)
		goto out;
	if ((rc = check_model_conflicts(&ld, override_flag)) < 0)
		goto out;
	if ((rc = layer_merge(&ld.final, &ld.files)) < 0 || (rc = layer_merge(&ld.final, &ld.model)) < 0 ||
	    (rc = layer_merge(&ld.final, &ld.cli)) < 0)
		goto out;
	if ((rc = apply_final(&ld, &f)) < 0)
		goto out;
	if ((rc = st_cfull_finish(&f, where_key, &ld)) < 0)
		goto out;
	warn_unimplemented(&ld.final);
	*c = f.c;
out:
	loader_release(&ld);
	return rc;
}
