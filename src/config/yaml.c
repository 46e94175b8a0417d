#include "config/yaml.h"

#include "base/array.h"
#include "base/err.h"
#include "base/file.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- nodes ---- */

static st_ynode *node_new(enum st_ykind kind, int line, int col)
{
	st_ynode *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->kind = kind;
	n->line = line;
	n->col = col;
	return n;
}

st_ynode *st_ynode_new_scalar(const char *text, int quoted, int line, int col)
{
	st_ynode *n = node_new(ST_Y_SCALAR, line, col);
	if (!n)
		return NULL;
	n->text = strdup(text);
	if (!n->text) {
		free(n);
		return NULL;
	}
	n->quoted = quoted;
	return n;
}

void st_ynode_free(st_ynode *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->n; i++) {
		if (n->keys)
			st_ynode_free(n->keys[i]);
		st_ynode_free(n->items[i]);
	}
	free(n->keys);
	free(n->items);
	free(n->text);
	free(n);
}

/* Appends ITEM (and KEY, for maps) to N, growing the arrays. */
static int node_append(st_ynode *n, st_ynode *key, st_ynode *item, size_t *cap)
{
	size_t kcap = *cap; /* keys grow with items, to the same capacity */
	if (n->kind == ST_Y_MAP && st_array_reserve(&n->keys, &kcap, n->n, sizeof(*n->keys), 8) < 0)
		return -1;
	if (st_array_reserve(&n->items, cap, n->n, sizeof(*n->items), 8) < 0)
		return -1;
	if (n->kind == ST_Y_MAP)
		n->keys[n->n] = key;
	n->items[n->n++] = item;
	return 0;
}

const st_ynode *st_ymap_get(const st_ynode *map, const char *key)
{
	if (!map || map->kind != ST_Y_MAP)
		return NULL;
	for (size_t i = 0; i < map->n; i++)
		if (strcmp(map->keys[i]->text, key) == 0)
			return map->items[i];
	return NULL;
}

/* ---- parsing ---- */

struct parser {
	yaml_parser_t yp;
	const char *name;
	const char *text;
	size_t len;
};

/* Line and column (1-based) of byte OFFSET, for libyaml reader errors. */
static void offset_to_mark(const struct parser *ps, size_t offset, size_t *line, size_t *col)
{
	*line = 1;
	*col = 1;
	for (size_t i = 0; i < offset && i < ps->len; i++) {
		if (ps->text[i] == '\n') {
			(*line)++;
			*col = 1;
		} else {
			(*col)++;
		}
	}
}

static int parser_error(struct parser *ps)
{
	yaml_parser_t *p = &ps->yp;
	size_t line = p->problem_mark.line + 1, col = p->problem_mark.column + 1;
	const char *problem = p->problem ? p->problem : "malformed YAML";

	if (p->error == YAML_MEMORY_ERROR)
		return st_fail(ST_ENOMEM, "%s: out of memory while parsing YAML", ps->name);
	if (p->error == YAML_READER_ERROR) {
		offset_to_mark(ps, p->problem_offset, &line, &col);
		return st_fail(ST_EINVAL, "%s:%zu:%zu: %s (byte 0x%02x); is this a text YAML file?",
			       ps->name, line, col, problem, (unsigned)(p->problem_value & 0xff));
	}
	if (p->context)
		return st_fail(ST_EINVAL, "%s:%zu:%zu: %s %s (from line %zu)", ps->name, line, col,
			       p->context, problem, p->context_mark.line + 1);
	return st_fail(ST_EINVAL, "%s:%zu:%zu: %s", ps->name, line, col, problem);
}

static int next_event(struct parser *ps, yaml_event_t *ev)
{
	if (!yaml_parser_parse(&ps->yp, ev))
		return parser_error(ps);
	return 0;
}

static int ev_line(const yaml_event_t *ev) { return (int)ev->start_mark.line + 1; }
static int ev_col(const yaml_event_t *ev) { return (int)ev->start_mark.column + 1; }

static int parse_node(struct parser *ps, yaml_event_t *ev, int depth, st_ynode **out);

static int make_scalar(struct parser *ps, yaml_event_t *ev, st_ynode **out)
{
	const char *tag = (const char *)ev->data.scalar.tag;
	int quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
		     (tag && strcmp(tag, YAML_STR_TAG) == 0);
	*out = st_ynode_new_scalar((const char *)ev->data.scalar.value, quoted, ev_line(ev), ev_col(ev));
	return *out ? 0 : st_fail(ST_ENOMEM, "%s: out of memory", ps->name);
}

static int too_deep(struct parser *ps, yaml_event_t *ev)
{
	return st_fail(ST_EINVAL, "%s:%d:%d: YAML nested more than %d levels deep", ps->name,
		       ev_line(ev), ev_col(ev), ST_YAML_MAX_DEPTH);
}

static int parse_seq(struct parser *ps, yaml_event_t *start, int depth, st_ynode **out)
{
	size_t cap = 0;
	st_ynode *seq, *item = NULL;
	yaml_event_t ev;
	int rc;

	if (depth >= ST_YAML_MAX_DEPTH)
		return too_deep(ps, start);
	seq = node_new(ST_Y_SEQ, ev_line(start), ev_col(start));
	if (!seq)
		return st_fail(ST_ENOMEM, "%s: out of memory", ps->name);
	for (;;) {
		if ((rc = next_event(ps, &ev)) < 0)
			goto fail;
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			break;
		}
		rc = parse_node(ps, &ev, depth + 1, &item);
		yaml_event_delete(&ev);
		if (rc < 0)
			goto fail;
		if (node_append(seq, NULL, item, &cap) < 0) {
			st_ynode_free(item);
			rc = st_fail(ST_ENOMEM, "%s: out of memory", ps->name);
			goto fail;
		}
	}
	*out = seq;
	return 0;
fail:
	st_ynode_free(seq);
	return rc;
}

/* Reads one map key: a scalar, not already in MAP. */
static int parse_key(struct parser *ps, yaml_event_t *ev, const st_ynode *map, st_ynode **key)
{
	const st_ynode *dup;
	int rc;

	if (ev->type != YAML_SCALAR_EVENT)
		return st_fail(ST_EINVAL, "%s:%d:%d: map keys must be plain names, not %s", ps->name,
			       ev_line(ev), ev_col(ev), ev->type == YAML_ALIAS_EVENT ? "aliases" : "lists or maps");
	if ((rc = make_scalar(ps, ev, key)) < 0)
		return rc;
	for (size_t i = 0; i < map->n; i++) {
		dup = map->keys[i];
		if (strcmp(dup->text, (*key)->text) == 0) {
			rc = st_fail(ST_EINVAL, "%s:%d:%d: duplicate key '%s' (first set at line %d)",
				     ps->name, (*key)->line, (*key)->col, dup->text, dup->line);
			st_ynode_free(*key);
			*key = NULL;
			return rc;
		}
	}
	return 0;
}

static int parse_map(struct parser *ps, yaml_event_t *start, int depth, st_ynode **out)
{
	size_t cap = 0;
	st_ynode *map, *key = NULL, *val = NULL;
	yaml_event_t ev;
	int rc;

	if (depth >= ST_YAML_MAX_DEPTH)
		return too_deep(ps, start);
	map = node_new(ST_Y_MAP, ev_line(start), ev_col(start));
	if (!map)
		return st_fail(ST_ENOMEM, "%s: out of memory", ps->name);
	for (;;) {
		if ((rc = next_event(ps, &ev)) < 0)
			goto fail;
		if (ev.type == YAML_MAPPING_END_EVENT) {
			yaml_event_delete(&ev);
			break;
		}
		rc = parse_key(ps, &ev, map, &key);
		yaml_event_delete(&ev);
		if (rc < 0)
			goto fail;
		if ((rc = next_event(ps, &ev)) < 0)
			goto fail;
		rc = parse_node(ps, &ev, depth + 1, &val);
		yaml_event_delete(&ev);
		if (rc < 0)
			goto fail;
		if (node_append(map, key, val, &cap) < 0) {
			rc = st_fail(ST_ENOMEM, "%s: out of memory", ps->name);
			goto fail;
		}
		key = val = NULL;
	}
	*out = map;
	return 0;
fail:
	st_ynode_free(key);
	st_ynode_free(val);
	st_ynode_free(map);
	return rc;
}

static int parse_node(struct parser *ps, yaml_event_t *ev, int depth, st_ynode **out)
{
	*out = NULL;
	switch (ev->type) {
	case YAML_SCALAR_EVENT:
		return make_scalar(ps, ev, out);
	case YAML_SEQUENCE_START_EVENT:
		return parse_seq(ps, ev, depth, out);
	case YAML_MAPPING_START_EVENT:
		return parse_map(ps, ev, depth, out);
	case YAML_ALIAS_EVENT:
		return st_fail(ST_EINVAL, "%s:%d:%d: YAML aliases (*%s) are not supported in configs",
			       ps->name, ev_line(ev), ev_col(ev), (const char *)ev->data.alias.anchor);
	default:
		return st_fail(ST_EINVAL, "%s:%d:%d: unexpected YAML structure", ps->name, ev_line(ev),
			       ev_col(ev));
	}
}

/* stream: STREAM-START [DOCUMENT-START node DOCUMENT-END] STREAM-END */
static int parse_stream(struct parser *ps, st_ynode **root)
{
	yaml_event_t ev;
	int rc, ndocs = 0;

	*root = NULL;
	for (;;) {
		if ((rc = next_event(ps, &ev)) < 0)
			return rc;
		switch (ev.type) {
		case YAML_STREAM_END_EVENT:
			yaml_event_delete(&ev);
			return 0;
		case YAML_DOCUMENT_START_EVENT:
			if (++ndocs > 1) {
				rc = st_fail(ST_EINVAL, "%s:%d: more than one YAML document in a config file",
					     ps->name, ev_line(&ev));
				yaml_event_delete(&ev);
				return rc;
			}
			yaml_event_delete(&ev);
			if ((rc = next_event(ps, &ev)) < 0)
				return rc;
			rc = parse_node(ps, &ev, 0, root);
			yaml_event_delete(&ev);
			if (rc < 0)
				return rc;
			break;
		default: /* STREAM-START, DOCUMENT-END */
			yaml_event_delete(&ev);
			break;
		}
	}
}

int st_yaml_parse(const char *name, const char *text, size_t len, st_ynode **root)
{
	struct parser ps = {.name = name, .text = text, .len = len};
	int rc;

	*root = NULL;
	if (!yaml_parser_initialize(&ps.yp))
		return st_fail(ST_ENOMEM, "%s: cannot initialize the YAML parser", name);
	yaml_parser_set_input_string(&ps.yp, (const unsigned char *)text, len);
	rc = parse_stream(&ps, root);
	yaml_parser_delete(&ps.yp);
	if (rc < 0) {
		st_ynode_free(*root);
		*root = NULL;
	}
	return rc;
}

/* PATH into a NUL-terminated buffer, with the config's own messages. */
static int read_config(const char *path, char **buf, size_t *len)
{
	int rc = st_read_file(path, ST_YAML_MAX_BYTES, buf, len);
	if (rc == ST_EINVAL)
		return st_fail(ST_EINVAL, "cannot read config '%s': larger than %u MiB", path, ST_YAML_MAX_BYTES >> 20);
	if (rc == ST_ENOMEM)
		return st_fail(ST_ENOMEM, "cannot read config '%s': out of memory", path);
	if (rc < 0) /* errno: the failing open or read's */
		return st_fail(ST_EINVAL, "cannot read config '%s': %s", path, strerror(errno));
	return 0;
}

int st_yaml_load_file(const char *path, st_ynode **root)
{
	char *text;
	size_t len = 0;
	int rc;

	*root = NULL;
	if ((rc = read_config(path, &text, &len)) < 0)
		return rc;
	rc = st_yaml_parse(path, text, len, root);
	free(text);
	return rc;
}

/* ---- scalar values ---- */

static int is_one_of(const char *s, const char *const *words)
{
	for (; *words; words++)
		if (strcmp(s, *words) == 0)
			return 1;
	return 0;
}

/* Copies S without '_' separators into BUF; 0 if it does not fit. */
static int strip_underscores(const char *s, char *buf, size_t cap)
{
	size_t n = 0;
	for (; *s; s++) {
		if (*s == '_')
			continue;
		if (n + 1 >= cap)
			return 0;
		buf[n++] = *s;
	}
	buf[n] = '\0';
	return 1;
}

/* Skips [0-9][0-9_]*; returns the count of digits seen. */
static size_t skip_digits(const char **p)
{
	size_t n = 0;
	if (**p < '0' || **p > '9')
		return 0;
	while ((**p >= '0' && **p <= '9') || **p == '_') {
		if (**p != '_')
			n++;
		(*p)++;
	}
	return n;
}

static int looks_int(const char *s)
{
	if (*s == '+' || *s == '-')
		s++;
	return skip_digits(&s) > 0 && *s == '\0';
}

/* [-+]? digits? ( . digits? )? ( [eE] [-+]? digits )?, with a '.' or an exponent. */
static int looks_float(const char *s)
{
	size_t before, after = 0;
	int dot = 0, exp = 0;

	if (*s == '+' || *s == '-')
		s++;
	before = skip_digits(&s);
	if (*s == '.') {
		dot = 1;
		s++;
		after = skip_digits(&s);
	}
	if (before + after == 0)
		return 0;
	if (*s == 'e' || *s == 'E') {
		s++;
		if (*s == '+' || *s == '-')
			s++;
		if (*s < '0' || *s > '9')
			return 0;
		while (*s >= '0' && *s <= '9')
			s++;
		exp = 1;
	}
	return *s == '\0' && (dot || exp);
}

static void resolve_int(const char *text, st_yvalue *v)
{
	char buf[128];
	v->type = ST_YV_INT;
	if (!strip_underscores(text, buf, sizeof(buf))) {
		v->overflow = 1;
		v->f = text[0] == '-' ? -HUGE_VAL : HUGE_VAL;
		return;
	}
	errno = 0;
	v->i = strtoll(buf, NULL, 10);
	v->overflow = errno == ERANGE;
	v->f = strtod(buf, NULL);
}

static void resolve_float(const char *text, st_yvalue *v)
{
	char buf[128];
	v->type = ST_YV_FLOAT;
	if (!strip_underscores(text, buf, sizeof(buf))) {
		v->overflow = 1;
		v->f = HUGE_VAL;
		return;
	}
	v->f = strtod(buf, NULL);
	v->overflow = isinf(v->f);
}

st_yvalue st_ynode_value(const st_ynode *n)
{
	static const char *const nulls[] = {"", "~", "null", "Null", "NULL", "None", "none", NULL};
	static const char *const trues[] = {"true", "True", "TRUE", NULL};
	static const char *const falses[] = {"false", "False", "FALSE", NULL};
	static const char *const infs[] = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", NULL};
	static const char *const ninfs[] = {"-.inf", "-.Inf", "-.INF", NULL};
	static const char *const nans[] = {".nan", ".NaN", ".NAN", NULL};
	st_yvalue v = {.type = ST_YV_STR};

	if (n->kind != ST_Y_SCALAR) {
		v.type = n->kind == ST_Y_SEQ ? ST_YV_SEQ : ST_YV_MAP;
		return v;
	}
	v.s = n->text;
	if (n->quoted)
		return v;
	if (is_one_of(n->text, nulls)) {
		v.type = ST_YV_NULL;
	} else if (is_one_of(n->text, trues) || is_one_of(n->text, falses)) {
		v.type = ST_YV_BOOL;
		v.b = is_one_of(n->text, trues);
	} else if (looks_int(n->text)) {
		resolve_int(n->text, &v);
	} else if (looks_float(n->text)) {
		resolve_float(n->text, &v);
	} else if (is_one_of(n->text, infs) || is_one_of(n->text, ninfs)) {
		v.type = ST_YV_FLOAT;
		v.f = is_one_of(n->text, infs) ? HUGE_VAL : -HUGE_VAL;
	} else if (is_one_of(n->text, nans)) {
		v.type = ST_YV_FLOAT;
		v.f = NAN;
	}
	return v;
}

static int is_number(const st_yvalue *v) { return v->type == ST_YV_INT || v->type == ST_YV_FLOAT; }

static int scalar_equal(const st_ynode *a, const st_ynode *b)
{
	st_yvalue va = st_ynode_value(a), vb = st_ynode_value(b);

	if (is_number(&va) && is_number(&vb)) {
		if (va.type == ST_YV_INT && vb.type == ST_YV_INT && !va.overflow && !vb.overflow)
			return va.i == vb.i;
		return va.f == vb.f;
	}
	if (va.type != vb.type)
		return 0;
	switch (va.type) {
	case ST_YV_NULL:
		return 1;
	case ST_YV_BOOL:
		return va.b == vb.b;
	default:
		return strcmp(va.s, vb.s) == 0;
	}
}

int st_ynode_equal(const st_ynode *a, const st_ynode *b)
{
	if (a->kind != b->kind)
		return 0;
	switch (a->kind) {
	case ST_Y_SCALAR:
		return scalar_equal(a, b);
	case ST_Y_SEQ:
		if (a->n != b->n)
			return 0;
		for (size_t i = 0; i < a->n; i++)
			if (!st_ynode_equal(a->items[i], b->items[i]))
				return 0;
		return 1;
	case ST_Y_MAP:
		if (a->n != b->n)
			return 0;
		for (size_t i = 0; i < a->n; i++) {
			const st_ynode *other = st_ymap_get(b, a->keys[i]->text);
			if (!other || !st_ynode_equal(a->items[i], other))
				return 0;
		}
		return 1;
	}
	return 0;
}

/* ---- formatting ---- */

struct sbuf {
	char *buf;
	size_t cap, len;
	int full;
};

static void sb_puts(struct sbuf *sb, const char *s)
{
	for (; *s && !sb->full; s++) {
		if (sb->len + 4 >= sb->cap) { /* room for "..." and NUL */
			memcpy(sb->buf + sb->len, "...", 3);
			sb->len += 3;
			sb->full = 1;
			break;
		}
		sb->buf[sb->len++] = *s;
	}
	sb->buf[sb->len] = '\0';
}

static void format_node(struct sbuf *sb, const st_ynode *n)
{
	switch (n->kind) {
	case ST_Y_SCALAR:
		if (n->quoted || n->text[0] == '\0') {
			sb_puts(sb, "\"");
			sb_puts(sb, n->text);
			sb_puts(sb, "\"");
		} else {
			sb_puts(sb, n->text);
		}
		break;
	case ST_Y_SEQ:
		sb_puts(sb, "[");
		for (size_t i = 0; i < n->n; i++) {
			if (i)
				sb_puts(sb, ", ");
			format_node(sb, n->items[i]);
		}
		sb_puts(sb, "]");
		break;
	case ST_Y_MAP:
		sb_puts(sb, "{");
		for (size_t i = 0; i < n->n; i++) {
			if (i)
				sb_puts(sb, ", ");
			sb_puts(sb, n->keys[i]->text);
			sb_puts(sb, ": ");
			format_node(sb, n->items[i]);
		}
		sb_puts(sb, "}");
		break;
	}
}

char *st_ynode_format(const st_ynode *n, char *buf, size_t cap)
{
	struct sbuf sb = {.buf = buf, .cap = cap};
	if (cap < 8) {
		if (cap)
			buf[0] = '\0';
		return buf;
	}
	buf[0] = '\0';
	format_node(&sb, n);
	return buf;
}
