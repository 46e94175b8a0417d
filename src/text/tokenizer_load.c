/*
 * tokenizer_load.c - tokenizer.json -> st_tokenizer (tokenizer_int.h).
 *
 * The file is untrusted input: every field is type-checked, every size is
 * bounded by the file's own size (ids may not be sparser than 4 per entry,
 * so a short file cannot ask for a huge id table), and whatever Hugging
 * Face would read differently from us is refused rather than guessed:
 * duplicate keys, ids or merges, added tokens whose listed id is not the one
 * Hugging Face assigns, pre-tokenizer steps or regex constructs we do not
 * reproduce exactly.
 *
 * Regexes are Oniguruma's (Hugging Face builds them with the onig crate);
 * we compile them with PCRE2 (UTF, UCP, MULTILINE: Oniguruma's ^ and $ are
 * line anchors) after translating what means something else in PCRE2:
 * \s is Unicode White_Space in Oniguruma but \p{Z}, \h and \v in PCRE2
 * (which adds U+180E), \w is L|M|N|Pc (PCRE2: L|N|_), \h is a hex digit
 * (PCRE2: horizontal space), \uHHHH is a code point. \b and \B (word
 * boundaries over the differing \w) are refused.
 */
#include "text/tokenizer_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/file.h"

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

const uint16_t st_tok_byte_char[256] = {
	0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a, 0x10b,
	0x10c, 0x10d, 0x10e, 0x10f, 0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117,
	0x118, 0x119, 0x11a, 0x11b, 0x11c, 0x11d, 0x11e, 0x11f, 0x120, 0x021, 0x022, 0x023,
	0x024, 0x025, 0x026, 0x027, 0x028, 0x029, 0x02a, 0x02b, 0x02c, 0x02d, 0x02e, 0x02f,
	0x030, 0x031, 0x032, 0x033, 0x034, 0x035, 0x036, 0x037, 0x038, 0x039, 0x03a, 0x03b,
	0x03c, 0x03d, 0x03e, 0x03f, 0x040, 0x041, 0x042, 0x043, 0x044, 0x045, 0x046, 0x047,
	0x048, 0x049, 0x04a, 0x04b, 0x04c, 0x04d, 0x04e, 0x04f, 0x050, 0x051, 0x052, 0x053,
	0x054, 0x055, 0x056, 0x057, 0x058, 0x059, 0x05a, 0x05b, 0x05c, 0x05d, 0x05e, 0x05f,
	0x060, 0x061, 0x062, 0x063, 0x064, 0x065, 0x066, 0x067, 0x068, 0x069, 0x06a, 0x06b,
	0x06c, 0x06d, 0x06e, 0x06f, 0x070, 0x071, 0x072, 0x073, 0x074, 0x075, 0x076, 0x077,
	0x078, 0x079, 0x07a, 0x07b, 0x07c, 0x07d, 0x07e, 0x121, 0x122, 0x123, 0x124, 0x125,
	0x126, 0x127, 0x128, 0x129, 0x12a, 0x12b, 0x12c, 0x12d, 0x12e, 0x12f, 0x130, 0x131,
	0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13a, 0x13b, 0x13c, 0x13d,
	0x13e, 0x13f, 0x140, 0x141, 0x142, 0x0a1, 0x0a2, 0x0a3, 0x0a4, 0x0a5, 0x0a6, 0x0a7,
	0x0a8, 0x0a9, 0x0aa, 0x0ab, 0x0ac, 0x143, 0x0ae, 0x0af, 0x0b0, 0x0b1, 0x0b2, 0x0b3,
	0x0b4, 0x0b5, 0x0b6, 0x0b7, 0x0b8, 0x0b9, 0x0ba, 0x0bb, 0x0bc, 0x0bd, 0x0be, 0x0bf,
	0x0c0, 0x0c1, 0x0c2, 0x0c3, 0x0c4, 0x0c5, 0x0c6, 0x0c7, 0x0c8, 0x0c9, 0x0ca, 0x0cb,
	0x0cc, 0x0cd, 0x0ce, 0x0cf, 0x0d0, 0x0d1, 0x0d2, 0x0d3, 0x0d4, 0x0d5, 0x0d6, 0x0d7,
	0x0d8, 0x0d9, 0x0da, 0x0db, 0x0dc, 0x0dd, 0x0de, 0x0df, 0x0e0, 0x0e1, 0x0e2, 0x0e3,
	0x0e4, 0x0e5, 0x0e6, 0x0e7, 0x0e8, 0x0e9, 0x0ea, 0x0eb, 0x0ec, 0x0ed, 0x0ee, 0x0ef,
	0x0f0, 0x0f1, 0x0f2, 0x0f3, 0x0f4, 0x0f5, 0x0f6, 0x0f7, 0x0f8, 0x0f9, 0x0fa, 0x0fb,
	0x0fc, 0x0fd, 0x0fe, 0x0ff,
};

/* The inverse: bytes kept as themselves, and 0x100 + n for the n-th byte
 * that is not (0x00-0x20, then 0x7f-0xa0, then 0xad). */
int st_tok_char_byte(uint32_t cp)
{
	if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
		return (int)cp;
	if (cp < 0x100 || cp > 0x143)
		return -1;
	uint32_t n = cp - 0x100;
	return n < 33 ? (int)n : n < 67 ? (int)(0x7f + n - 33) : 0xad;
}

/* ---- hashing ---- */

uint64_t st_tok_hash(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		h = (h ^ st_tok_mix64(w)) * 0x9e3779b97f4a7c15ull;
		b += 8;
		n -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, b, n);
	return st_tok_mix64(h ^ w ^ ((uint64_t)n << 59));
}

static const char *key_of(const st_tokenizer *t, const struct tok_map *m, int32_t id, size_t *len)
{
	const struct tok_entry *e = &t->ent[id];
	*len = m->by_bytes ? e->bytes_len : e->text_len;
	return m->by_bytes ? e->bytes : e->text;
}

int32_t st_tok_map_get(const st_tokenizer *t, const struct tok_map *m, const char *key, size_t len)
{
	uint64_t h = st_tok_hash(key, len);
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		const struct tok_slot *s = &m->slot[i];
		if (s->id < 0)
			return -1;
		size_t klen;
		const char *k;
		if (s->hash == (uint32_t)(h >> 32) && (k = key_of(t, m, s->id, &klen), klen == len) && !memcmp(k, key, len))
			return s->id;
	}
}

static int map_init(struct tok_map *m, size_t n, int by_bytes)
{
	size_t cap = 16;
	while (cap < 2 * n + 2)
		cap *= 2;
	m->slot = malloc(cap * sizeof(*m->slot));
	if (!m->slot)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t i = 0; i < cap; i++)
		m->slot[i] = (struct tok_slot){0, -1};
	m->mask = cap - 1;
	m->by_bytes = by_bytes;
	return 0;
}

/* Insert id under its key; returns the id already there, or -1 when inserted. */
static int32_t map_put(st_tokenizer *t, struct tok_map *m, int32_t id)
{
	size_t len;
	const char *key = key_of(t, m, id, &len);
	int32_t old = st_tok_map_get(t, m, key, len);
	if (old >= 0)
		return old;
	uint64_t h = st_tok_hash(key, len);
	size_t i = h & m->mask;
	while (m->slot[i].id >= 0)
		i = (i + 1) & m->mask;
	m->slot[i] = (struct tok_slot){(uint32_t)(h >> 32), id};
	return -1;
}

/* ---- errors ---- */

struct loader {
	st_tokenizer *t;
	const char *name;
};

__attribute__((format(printf, 2, 3))) static int bad(const struct loader *L, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return st_fail(ST_EINVAL, "%s: %s", L->name, msg);
}

static const char *type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "?";
}

/* A short printable form of a token for messages. */
static const char *shown(const char *s, size_t n, char *buf, size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 8 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f || c == '\'')
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	if (o + 8 >= cap)
		o += (size_t)snprintf(buf + o, cap - o, "...");
	buf[o] = 0;
	return buf;
}

/* Optional boolean member: absent or null gives def. */
static int get_bool(const struct loader *L, const json_t *obj, const char *key, const char *where, int def, int *out)
{
	const json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return bad(L, "%s.%s is %s, expected true or false", where, key, type_name(v));
	*out = json_is_true(v);
	return 0;
}

/* ---- pool of token strings ---- */

static const char *pool_add(st_tokenizer *t, const char *s, size_t n)
{
	if (t->pool_len + n + 1 > t->pool_cap)
		ST_BUG("tokenizer pool too small (%zu + %zu > %zu)", t->pool_len, n + 1, t->pool_cap);
	char *p = t->pool + t->pool_len;
	memcpy(p, s, n);
	p[n] = 0;
	t->pool_len += n + 1;
	return p;
}

/* The ByteLevel decoder's view of a token: every character mapped back to
 * its byte, or, if one is outside the alphabet, the token's own UTF-8. */
static size_t text_to_bytes(const char *text, size_t n, char *out, int *all_mapped)
{
	size_t o = 0, i = 0;
	*all_mapped = 1;
	while (i < n) {
		size_t cl;
		uint32_t cp = st_tok_utf8_next((const unsigned char *)text + i, n - i, &cl);
		int b = st_tok_char_byte(cp);
		if (b < 0) {
			*all_mapped = 0;
			memcpy(out, text, n);
			return n;
		}
		out[o++] = (char)b;
		i += cl;
	}
	return o;
}

static int set_entry(st_tokenizer *t, int32_t id, const char *text, size_t n, unsigned flags, char *scratch)
{
	struct tok_entry *e = &t->ent[id];
	int all;
	e->text = pool_add(t, text, n);
	e->text_len = (uint32_t)n;
	size_t bn = text_to_bytes(text, n, scratch, &all);
	e->bytes = pool_add(t, scratch, bn);
	e->bytes_len = (uint32_t)bn;
	e->flags = flags;
	return all;
}

/* ---- regex translation ---- */

struct sbuf {
	char *p;
	size_t n, cap;
	int oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->cap ? b->cap * 2 : 256) + n;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}
static void sb_str(struct sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

#define ONIG_SPACE "\\p{White_Space}"
#define ONIG_NOT_SPACE "\\P{White_Space}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{N}\\p{Pc}"
#define ONIG_HEX "0-9a-fA-F"

/*
 * Oniguruma pattern -> PCRE2 pattern (see the top of the file). *top_caret
 * is set when ^ appears outside a character class (a line-start anchor:
 * encoding cannot then start in the middle of a text).
 */
static int translate(const struct loader *L, const char *where, const char *pat, size_t n, struct sbuf *out,
		     int *top_caret)
{
	int in_class = 0;
	*top_caret = 0;
	for (size_t i = 0; i < n; i++) {
		char c = pat[i];
		if (c == '\\' && i + 1 < n) {
			char e = pat[++i];
			switch (e) {
			case 's': sb_str(out, ONIG_SPACE); break;
			case 'S': sb_str(out, ONIG_NOT_SPACE); break;
			case 'w': sb_str(out, in_class ? ONIG_WORD : "[" ONIG_WORD "]"); break;
			case 'h': sb_str(out, in_class ? ONIG_HEX : "[" ONIG_HEX "]"); break;
			case 'W':
			case 'H':
				if (in_class)
					return bad(L, "%s: \\%c inside a character class is not supported", where, e);
				sb_str(out, e == 'W' ? "[^" ONIG_WORD "]" : "[^" ONIG_HEX "]");
				break;
			case 'b':
			case 'B':
				if (in_class) { /* [\b] is a backspace in both */
					sb_add(out, pat + i - 1, 2);
					break;
				}
				return bad(L, "%s: \\%c (word boundary) is not supported: Oniguruma's and PCRE2's "
					   "word characters differ", where, e);
			case 'u': {
				size_t k = 0;
				while (k < 4 && i + 1 + k < n && strchr("0123456789abcdefABCDEF", pat[i + 1 + k]) && pat[i + 1 + k])
					k++;
				if (k != 4)
					return bad(L, "%s: \\u needs 4 hex digits", where);
				sb_str(out, "\\x{");
				sb_add(out, pat + i + 1, 4);
				sb_str(out, "}");
				i += 4;
				break;
			}
			default: sb_add(out, pat + i - 1, 2);
			}
			continue;
		}
		if (!in_class && c == '[') {
			in_class = 1;
			sb_add(out, &c, 1);
			/* a ']' right after '[' or '[^' is a literal */
			if (i + 1 < n && pat[i + 1] == '^') {
				sb_add(out, "^", 1);
				i++;
			}
			if (i + 1 < n && pat[i + 1] == ']') {
				sb_add(out, "]", 1);
				i++;
			}
			continue;
		}
		if (in_class && c == '[')
			return bad(L, "%s: nested character classes are not supported", where);
		if (in_class && c == ']')
			in_class = 0;
		if (!in_class && c == '^')
			*top_caret = 1;
		sb_add(out, &c, 1);
	}
	if (out->oom)
		return st_fail(ST_ENOMEM, "out of memory");
	return 0;
}

static int add_level(const struct loader *L, const char *where, const char *pat, size_t n, int literal)
{
	st_tokenizer *t = L->t;
	struct sbuf tr = {0};
	int caret = 0, rc, err;
	PCRE2_SIZE off;
	if (t->nlevels == TOK_MAX_LEVELS)
		return bad(L, "%s: more than %d pre-tokenizer splits", where, TOK_MAX_LEVELS);
	if (literal)
		sb_add(&tr, pat, n);
	else if ((rc = translate(L, where, pat, n, &tr, &caret)) < 0)
		goto out;
	if (tr.oom) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)(tr.p ? tr.p : ""), tr.n, opts, &err, &off, NULL);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(err, msg, sizeof(msg));
		rc = bad(L, "%s: bad regex at offset %zu: %s", where, (size_t)off, (const char *)msg);
		goto out;
	}
	uint32_t lookbehind = 0;
	pcre2_pattern_info(re, PCRE2_INFO_MAXLOOKBEHIND, &lookbehind);
	if (lookbehind || caret)
		t->resumable = 0;
	struct tok_level *lv = &t->level[t->nlevels++];
	lv->re = re;
	lv->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
	rc = 0;
out:
	free(tr.p);
	return rc;
}

/* GPT-2's split, used by ByteLevel when use_regex is true. */
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre_step(const struct loader *L, const json_t *step, const char *where, int *seen_bytelevel)
{
	st_tokenizer *t = L->t;
	const json_t *type = json_object_get(step, "type");
	if (!json_is_object(step))
		return bad(L, "%s is %s, expected an object", where, type_name(step));
	if (!json_is_string(type))
		return bad(L, "%s.type is missing or not a string", where);
	const char *ty = json_string_value(type);
	if (*seen_bytelevel)
		return bad(L, "%s: a %s step after ByteLevel is not supported (ByteLevel must come last)", where, ty);
	if (!strcmp(ty, "Sequence")) {
		const json_t *list = json_object_get(step, "pretokenizers");
		if (!json_is_array(list))
			return bad(L, "%s.pretokenizers is missing or not an array", where);
		for (size_t i = 0; i < json_array_size(list); i++) {
			char sub[200];
			snprintf(sub, sizeof(sub), "%.150s.pretokenizers[%zu]", where, i);
			int rc = load_pre_step(L, json_array_get(list, i), sub, seen_bytelevel);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (!strcmp(ty, "Split")) {
		const json_t *pat = json_object_get(step, "pattern"), *beh = json_object_get(step, "behavior");
		const json_t *inv = json_object_get(step, "invert");
		if (!json_is_object(pat) || json_object_size(pat) != 1)
			return bad(L, "%s.pattern must be {\"Regex\": ...} or {\"String\": ...}", where);
		const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
		const json_t *p = re ? re : lit;
		if (!json_is_string(p))
			return bad(L, "%s.pattern must be {\"Regex\": STRING} or {\"String\": STRING}", where);
		if (!json_is_string(beh))
			return bad(L, "%s.behavior is missing or not a string", where);
		if (strcmp(json_string_value(beh), "Isolated"))
			return bad(L, "%s.behavior '%s' is not supported (only Isolated)", where, json_string_value(beh));
		if (inv && !json_is_boolean(inv))
			return bad(L, "%s.invert is %s, expected true or false", where, type_name(inv));
		/* with Isolated, matches and the text between them are pieces alike: invert changes nothing */
		char w[200];
		snprintf(w, sizeof(w), "%.150s.pattern", where);
		return add_level(L, w, json_string_value(p), json_string_length(p), re == NULL);
	}
	if (!strcmp(ty, "ByteLevel")) {
		int prefix, use_regex, rc;
		if ((rc = get_bool(L, step, "add_prefix_space", where, 0, &prefix)) < 0 ||
		    (rc = get_bool(L, step, "use_regex", where, 1, &use_regex)) < 0)
			return rc;
		*seen_bytelevel = 1;
		t->prefix_space = prefix;
		if (prefix)
			t->resumable = 0;
		if (use_regex) {
			t->bytelevel_level = t->nlevels;
			return add_level(L, where, gpt2_regex, sizeof(gpt2_regex) - 1, 0);
		}
		return 0;
	}
	return bad(L, "%s: pre-tokenizer '%s' is not supported (slicetrain reads byte-level BPE: Split and ByteLevel)",
		   where, ty);
}

/* ---- added tokens ---- */

static int cmp_added(const void *a, const void *b)
{
	const struct tok_added *x = *(struct tok_added *const *)a, *y = *(struct tok_added *const *)b;
	unsigned char cx = (unsigned char)x->content[0], cy = (unsigned char)y->content[0];
	if (cx != cy)
		return cx < cy ? -1 : 1;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

static int build_set(st_tokenizer *t, struct tok_added_set *s, int normalized)
{
	size_t n = 0;
	for (size_t i = 0; i < t->nadded; i++)
		n += t->added[i].normalized == normalized;
	s->v = calloc(n ? n : 1, sizeof(*s->v));
	if (!s->v)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t i = 0; i < t->nadded; i++)
		if (t->added[i].normalized == normalized) {
			s->v[s->n++] = &t->added[i];
			if (t->added[i].single_word || t->added[i].lstrip || t->added[i].rstrip)
				s->any_strip = 1;
		}
	qsort(s->v, s->n, sizeof(*s->v), cmp_added);
	size_t k = 0;
	for (int b = 0; b <= 256; b++) {
		while (k < s->n && (unsigned char)s->v[k]->content[0] < b)
			k++;
		s->first[b] = (uint32_t)k;
	}
	s->first[256] = (uint32_t)s->n;
	return 0;
}

/* Hugging Face's AddedVocabulary::add_tokens, one token at a time: the id of a
 * token already known (model vocabulary or added), else the next free one. */
static int32_t hf_added_id(st_tokenizer *t, const char *content, size_t len, int32_t max_added)
{
	int32_t id = st_tok_map_get(t, &t->by_text, content, len);
	if (id >= 0)
		return id;
	if (max_added < 0)
		return t->model_vocab_size;
	return (max_added >= t->model_vocab_size || t->model_vocab_size == 0) ? max_added + 1 : t->model_vocab_size;
}

/* ---- the whole file ---- */

static int count_added_max(const struct loader *L, const json_t *added, int64_t *max_id)
{
	for (size_t i = 0; i < json_array_size(added); i++) {
		const json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
		const json_t *content = json_object_get(a, "content");
		if (!json_is_object(a))
			return bad(L, "added_tokens[%zu] is %s, expected an object", i, type_name(a));
		if (!json_is_string(content))
			return bad(L, "added_tokens[%zu].content is missing or not a string", i);
		if (!json_is_integer(id))
			return bad(L, "added_tokens[%zu].id is missing or not an integer", i);
		json_int_t v = json_integer_value(id);
		if (v < 0 || v >= ST_TOKENIZER_MAX_ID)
			return bad(L, "added_tokens[%zu].id %lld is out of range (0 to %d)", i, (long long)v, ST_TOKENIZER_MAX_ID - 1);
		if (v > *max_id)
			*max_id = v;
	}
	return 0;
}

static int load_vocab(const struct loader *L, const json_t *vocab, char *scratch)
{
	st_tokenizer *t = L->t;
	const char *key;
	json_t *v;
	char buf[80];
	json_object_foreach((json_t *)vocab, key, v) {
		size_t klen = strlen(key); /* jansson keys stop at a NUL: such keys are refused below */
		if (!json_is_integer(v))
			return bad(L, "model.vocab['%s'] is %s, expected an integer id", shown(key, klen, buf, sizeof(buf)),
				   type_name(v));
		int32_t id = (int32_t)json_integer_value(v);
		if (t->ent[id].text) {
			char buf2[80];
			return bad(L, "model.vocab: id %d is given to both '%s' and '%s'", id,
				   shown(t->ent[id].text, t->ent[id].text_len, buf, sizeof(buf)), shown(key, klen, buf2, sizeof(buf2)));
		}
		if (!klen)
			return bad(L, "model.vocab: an empty token (id %d)", id);
		int all = set_entry(t, id, key, klen, TOK_IN_VOCAB, scratch);
		map_put(t, &t->by_text, id);
		if (all)
			map_put(t, &t->by_bytes, id);
	}
	return 0;
}

static int merge_put(st_tokenizer *t, uint64_t key, int32_t rank, int32_t id)
{
	size_t i = (size_t)st_tok_mix64(key) & t->merge_mask;
	while (t->merge[i].key != UINT64_MAX) {
		if (t->merge[i].key == key)
			return t->merge[i].rank;
		i = (i + 1) & t->merge_mask;
	}
	t->merge[i] = (struct tok_merge_slot){key, rank, id};
	return -1;
}

/* A model token's id from its text, -1 when model.vocab does not have it. */
static int32_t model_id(const st_tokenizer *t, const char *s, size_t n)
{
	int32_t id = st_tok_map_get(t, &t->by_text, s, n);
	return id >= 0 && (t->ent[id].flags & TOK_IN_VOCAB) ? id : -1;
}

static int load_merges(const struct loader *L, const json_t *merges, char *scratch)
{
	st_tokenizer *t = L->t;
	size_t n = json_array_size(merges), cap = 16;
	char b1[80], b2[80];
	while (cap < 2 * n + 2)
		cap *= 2;
	t->merge = malloc(cap * sizeof(*t->merge));
	if (!t->merge)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t i = 0; i < cap; i++)
		t->merge[i].key = UINT64_MAX;
	t->merge_mask = cap - 1;
	int32_t rank = 0;
	int legacy = -1;
	for (size_t i = 0; i < n; i++) {
		const json_t *m = json_array_get(merges, i);
		const char *a, *b;
		size_t alen, blen;
		if (legacy < 0)
			legacy = json_is_string(m);
		if (legacy && json_is_string(m)) {
			const char *s = json_string_value(m);
			size_t len = json_string_length(m);
			if (len >= 8 && !memcmp(s, "#version", 8))
				continue;
			const char *sp = memchr(s, ' ', len);
			if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
				return bad(L, "model.merges[%zu] '%s' is not two tokens separated by one space", i,
					   shown(s, len, b1, sizeof(b1)));
			a = s;
			alen = (size_t)(sp - s);
			b = sp + 1;
			blen = len - alen - 1;
		} else if (!legacy && json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			alen = json_string_length(json_array_get(m, 0));
			b = json_string_value(json_array_get(m, 1));
			blen = json_string_length(json_array_get(m, 1));
		} else {
			return bad(L, "model.merges[%zu] is %s, expected %s", i, type_name(m),
				   legacy ? "a string \"a b\" like the merges before it" : "a pair [\"a\", \"b\"] like the merges before it");
		}
		int32_t ia = model_id(t, a, alen), ib = model_id(t, b, blen);
		if (ia < 0 || ib < 0)
			return bad(L, "model.merges[%zu]: '%s' is not in model.vocab", i,
				   ia < 0 ? shown(a, alen, b1, sizeof(b1)) : shown(b, blen, b2, sizeof(b2)));
		memcpy(scratch, a, alen);
		memcpy(scratch + alen, b, blen);
		int32_t id = model_id(t, scratch, alen + blen);
		if (id < 0)
			return bad(L, "model.merges[%zu]: the merged token '%s' is not in model.vocab", i,
				   shown(scratch, alen + blen, b1, sizeof(b1)));
		int32_t dup = merge_put(t, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, rank, id);
		if (dup >= 0)
			return bad(L, "model.merges[%zu] '%s %s' repeats merge %d", i, shown(a, alen, b1, sizeof(b1)),
				   shown(b, blen, b2, sizeof(b2)), dup);
		rank++;
	}
	return 0;
}

static int load_model(const struct loader *L, const json_t *model)
{
	st_tokenizer *t = L->t;
	const json_t *type = json_object_get(model, "type"), *v;
	int rc;
	if (!json_is_object(model))
		return bad(L, "model is %s, expected an object", model ? type_name(model) : "missing");
	if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE")))
		return bad(L, "model.type %s%s%s is not supported (only BPE)", json_is_string(type) ? "'" : "",
			   json_is_string(type) ? json_string_value(type) : type_name(type), json_is_string(type) ? "'" : "");
	static const char *unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
	for (size_t i = 0; i < 2; i++)
		if ((v = json_object_get(model, unsupported[i])) && !json_is_null(v))
			return bad(L, "model.%s is not supported (byte-level BPE has none)", unsupported[i]);
	if ((v = json_object_get(model, "dropout")) && !json_is_null(v) &&
	    !(json_is_number(v) && json_number_value(v) == 0))
		return bad(L, "model.dropout must be null (dropout makes encoding random)");
	int byte_fallback;
	if ((rc = get_bool(L, model, "byte_fallback", "model", 0, &byte_fallback)) < 0 ||
	    (rc = get_bool(L, model, "fuse_unk", "model", 0, &t->fuse_unk)) < 0 ||
	    (rc = get_bool(L, model, "ignore_merges", "model", 0, &t->ignore_merges)) < 0)
		return rc;
	if (byte_fallback)
		return bad(L, "model.byte_fallback is not supported");
	if (!json_is_object(json_object_get(model, "vocab")))
		return bad(L, "model.vocab is missing or not an object");
	if (!json_is_array(json_object_get(model, "merges")))
		return bad(L, "model.merges is missing or not an array");
	return 0;
}

static int load_added(const struct loader *L, const json_t *added, char *scratch)
{
	st_tokenizer *t = L->t;
	size_t n = json_array_size(added);
	int32_t max_added = -1;
	char buf[80];
	t->added = calloc(n ? n : 1, sizeof(*t->added));
	if (!t->added)
		return st_fail(ST_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		const json_t *a = json_array_get(added, i), *c = json_object_get(a, "content");
		const char *content = json_string_value(c);
		size_t len = json_string_length(c);
		int32_t listed = (int32_t)json_integer_value(json_object_get(a, "id"));
		int f[5], rc;
		static const char *flag[] = {"single_word", "lstrip", "rstrip", "normalized", "special"};
		char where[40];
		snprintf(where, sizeof(where), "added_tokens[%zu]", i);
		for (int k = 0; k < 5; k++)
			if ((rc = get_bool(L, a, flag[k], where, k == 3 ? 1 : 0, &f[k])) < 0)
				return rc;
		if (!len)
			return bad(L, "added_tokens[%zu] has empty content", i);
		for (size_t k = 0; k < t->nadded; k++)
			if (t->added[k].len == len && !memcmp(t->added[k].content, content, len))
				return bad(L, "added_tokens[%zu] '%s' repeats added_tokens[%zu]", i, shown(content, len, buf, sizeof(buf)), k);
		int32_t id = hf_added_id(t, content, len, max_added);
		if (id != listed)
			return bad(L, "added_tokens[%zu] '%s' lists id %d, but Hugging Face gives it id %d", i,
				   shown(content, len, buf, sizeof(buf)), listed, id);
		if (id >= t->nids)
			ST_BUG("added token id %d outside the table (%d)", id, t->nids);
		if (t->ent[id].text && (t->ent[id].text_len != len || memcmp(t->ent[id].text, content, len))) {
			char buf2[80];
			return bad(L, "added_tokens[%zu] '%s' gets id %d, which model.vocab gives to '%s'", i,
				   shown(content, len, buf, sizeof(buf)), id,
				   shown(t->ent[id].text, t->ent[id].text_len, buf2, sizeof(buf2)));
		}
		if (!t->ent[id].text) {
			set_entry(t, id, content, len, 0, scratch);
			map_put(t, &t->by_text, id);
		}
		t->ent[id].flags |= TOK_ADDED | (f[4] ? TOK_SPECIAL : 0);
		if (id > max_added)
			max_added = id;
		t->added[t->nadded++] = (struct tok_added){t->ent[id].text, (uint32_t)len, id, (unsigned char)f[0],
							   (unsigned char)f[1], (unsigned char)f[2], (unsigned char)f[3],
							   (unsigned char)f[4]};
	}
	/* an added token that is also in model.vocab is matched as an added token:
	 * its content is the entry's text (the same string) */
	if (build_set(t, &t->raw_set, 0) < 0 || build_set(t, &t->norm_set, 1) < 0)
		return st_fail(ST_ENOMEM, "out of memory");
	if (t->raw_set.any_strip || t->norm_set.any_strip) {
		int err;
		PCRE2_SIZE off;
		t->resumable = 0;
		t->word_char = pcre2_compile((PCRE2_SPTR) "[" ONIG_WORD "]", PCRE2_ZERO_TERMINATED,
					     PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, NULL);
		if (!t->word_char)
			return st_fail(ST_EINTERNAL, "PCRE2 cannot compile the word class (error %d)", err);
	}
	return 0;
}

static int parse_root(const struct loader *L, const json_t *root)
{
	st_tokenizer *t = L->t;
	const json_t *model, *vocab, *merges, *added, *v;
	int rc;
	char *scratch = NULL;

	if (!json_is_object(root))
		return bad(L, "the top level is %s, expected an object", type_name(root));
	if ((v = json_object_get(root, "version")) && (!json_is_string(v) || strcmp(json_string_value(v), "1.0")))
		return bad(L, "unknown tokenizer version (expected \"1.0\")");
	model = json_object_get(root, "model");
	if (!model)
		return bad(L, "no model");
	if ((rc = load_model(L, model)) < 0)
		return rc;
	vocab = json_object_get(model, "vocab");
	merges = json_object_get(model, "merges");
	added = json_object_get(root, "added_tokens");
	if (added && !json_is_null(added) && !json_is_array(added))
		return bad(L, "added_tokens is %s, expected an array", type_name(added));
	if (added && json_is_null(added))
		added = NULL;
	if ((v = json_object_get(root, "normalizer")) && !json_is_null(v)) {
		const json_t *ty = json_is_object(v) ? json_object_get(v, "type") : NULL;
		return bad(L, "normalizer '%s' is not supported (byte-level BPE tokenizers have none)",
			   json_is_string(ty) ? json_string_value(ty) : "?");
	}

	/* the id table: sized by the largest id, which may not exceed 4 per entry */
	int64_t max_id = -1, entries = (int64_t)json_object_size(vocab) + (added ? (int64_t)json_array_size(added) : 0);
	size_t text_bytes = 0;
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)vocab, key, val) {
		if (!json_is_integer(val)) {
			char buf[80];
			return bad(L, "model.vocab['%s'] is %s, expected an integer id", shown(key, strlen(key), buf, sizeof(buf)),
				   type_name(val));
		}
		{
			json_int_t id = json_integer_value(val);
			if (id < 0 || id >= ST_TOKENIZER_MAX_ID) {
				char buf[80];
				return bad(L, "model.vocab['%s'] has id %lld, out of range (0 to %d)",
					   shown(key, strlen(key), buf, sizeof(buf)), (long long)id, ST_TOKENIZER_MAX_ID - 1);
			}
			if (id > max_id)
				max_id = id;
		}
		text_bytes += strlen(key) + 1;
	}
	if (added && (rc = count_added_max(L, added, &max_id)) < 0)
		return rc;
	for (size_t i = 0; added && i < json_array_size(added); i++)
		text_bytes += json_string_length(json_object_get(json_array_get(added, i), "content")) + 1;
	if (max_id < 0)
		return bad(L, "model.vocab is empty");
	if (max_id >= 4 * entries + 1024)
		return bad(L, "ids are too sparse: the largest is %lld for %lld tokens", (long long)max_id, (long long)entries);
	t->nids = (int32_t)max_id + 1;
	t->model_vocab_size = (int32_t)json_object_size(vocab);
	t->pool_cap = 2 * text_bytes + 16;
	size_t longest = 0;
	json_object_foreach((json_t *)vocab, key, val) {
		size_t kl = strlen(key);
		if (kl > longest)
			longest = kl;
	}
	for (size_t i = 0; merges && i < json_array_size(merges); i++) {
		const json_t *m = json_array_get(merges, i);
		size_t l = json_is_string(m) ? json_string_length(m) : 0;
		if (json_is_array(m))
			for (size_t k = 0; k < json_array_size(m); k++)
				l += json_string_length(json_array_get(m, k));
		if (l > longest)
			longest = l;
	}
	for (size_t i = 0; added && i < json_array_size(added); i++) {
		size_t l = json_string_length(json_object_get(json_array_get(added, i), "content"));
		if (l > longest)
			longest = l;
	}
	t->ent = calloc((size_t)t->nids, sizeof(*t->ent));
	t->pool = malloc(t->pool_cap);
	scratch = malloc(longest + 16);
	if (!t->ent || !t->pool || !scratch) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = map_init(&t->by_text, (size_t)entries, 0)) < 0 || (rc = map_init(&t->by_bytes, json_object_size(vocab), 1)) < 0)
		goto out;
	if ((rc = load_vocab(L, vocab, scratch)) < 0 || (rc = load_merges(L, merges, scratch)) < 0)
		goto out;
	for (int b = 0; b < 256; b++) {
		char c = (char)b;
		t->byte_id[b] = st_tok_map_get(t, &t->by_bytes, &c, 1);
	}
	t->unk_id = -1;
	if ((v = json_object_get(model, "unk_token")) && !json_is_null(v)) {
		if (!json_is_string(v)) {
			rc = bad(L, "model.unk_token is %s, expected a string or null", type_name(v));
			goto out;
		}
		t->unk_id = model_id(t, json_string_value(v), json_string_length(v));
		if (t->unk_id < 0) {
			rc = bad(L, "model.unk_token '%s' is not in model.vocab", json_string_value(v));
			goto out;
		}
	}
	if (added && (rc = load_added(L, added, scratch)) < 0)
		goto out;
	if (!added && ((rc = build_set(t, &t->raw_set, 0)) < 0 || (rc = build_set(t, &t->norm_set, 1)) < 0))
		goto out;

	v = json_object_get(root, "pre_tokenizer");
	if (!v || json_is_null(v)) {
		rc = bad(L, "no pre_tokenizer: slicetrain reads byte-level BPE, which needs a ByteLevel pre-tokenizer");
		goto out;
	}
	int seen = 0;
	if ((rc = load_pre_step(L, v, "pre_tokenizer", &seen)) < 0)
		goto out;
	if (!seen) {
		rc = bad(L, "pre_tokenizer has no ByteLevel step (slicetrain reads byte-level BPE only)");
		goto out;
	}
	v = json_object_get(root, "decoder");
	if (!v || json_is_null(v))
		t->decoder = TOK_DECODER_NONE;
	else if (json_is_object(v) && json_is_string(json_object_get(v, "type")) &&
		 !strcmp(json_string_value(json_object_get(v, "type")), "ByteLevel"))
		t->decoder = TOK_DECODER_BYTELEVEL;
	else
		t->decoder = TOK_DECODER_OTHER;
	rc = 0;
out:
	free(scratch);
	return rc;
}

void st_tokenizer_free(st_tokenizer *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->nlevels; i++)
		pcre2_code_free(t->level[i].re);
	pcre2_code_free(t->word_char);
	free(t->raw_set.v);
	free(t->norm_set.v);
	free(t->added);
	free(t->merge);
	free(t->by_text.slot);
	free(t->by_bytes.slot);
	free(t->ent);
	free(t->pool);
	free(t->name);
	free(t);
}

int st_tokenizer_parse(st_tokenizer **out, const char *json, size_t len, const char *name)
{
	json_error_t jerr;
	int rc;
	*out = NULL;
	if (len > ST_TOKENIZER_MAX_FILE)
		return st_fail(ST_EINVAL, "%s: larger than %zu bytes", name, ST_TOKENIZER_MAX_FILE);
	st_tokenizer *t = calloc(1, sizeof(*t));
	if (!t || !(t->name = strdup(name))) {
		free(t);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	t->resumable = 1;
	t->bytelevel_level = -1;
	struct loader L = {t, t->name};
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root) {
		rc = len == 0 ? st_fail(ST_EINVAL, "%s: empty file, not a tokenizer.json", name)
			      : st_fail(ST_EINVAL, "%s:%d:%d: not valid JSON: %s", name, jerr.line, jerr.column, jerr.text);
		st_tokenizer_free(t);
		return rc;
	}
	rc = parse_root(&L, root);
	json_decref(root);
	if (rc < 0) {
		st_tokenizer_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

int st_tokenizer_load(st_tokenizer **out, const char *path)
{
	char *buf;
	size_t len;
	*out = NULL;
	int rc = st_read_file(path, ST_TOKENIZER_MAX_FILE, &buf, &len);
	/* a path that names no readable file is the user's mistake, as a bad file is */
	if (rc == ST_EIO && (errno == ENOENT || errno == ENOTDIR || errno == EISDIR || errno == EACCES))
		rc = ST_EINVAL;
	if (rc < 0)
		return rc;
	rc = st_tokenizer_parse(out, buf, len, path);
	free(buf);
	return rc;
}
