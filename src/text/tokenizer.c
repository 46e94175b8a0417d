/*
 * tokenizer.c - encoding and decoding with a loaded tokenizer
 * (tokenizer_load.c builds it).
 *
 * Encoding follows Hugging Face tokenizers 0.20 step for step:
 *   1. added tokens with normalized=false are found in the whole text,
 *      leftmost first, longest at a place (its Aho-Corasick LeftmostLongest
 *      find_iter; single_word, lstrip and rstrip as AddedVocabulary does);
 *   2. then those with normalized=true in each stretch between them;
 *   3. each remaining stretch is cut by the pre-tokenizer's regexes, level
 *      by level; matches and the text between them are pieces alike
 *      (Isolated), empty matches follow onig's find_iter (one right after a
 *      match is skipped);
 *   4. each piece's bytes are merged as BPE::merge_word / Word::merge_all
 *      do: a binary heap of (rank, position), lowest rank first, then the
 *      leftmost; an entry whose pair no longer gives its merged id is stale.
 *
 * Speed: PCRE2's JIT does the splitting; merges are looked up in an
 * open-addressing table keyed by the id pair; each state keeps a cache of
 * the pieces it has merged (cleared when full), so a word costs one hash
 * lookup after its first time.
 */
#include "text/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

/* ---- UTF-8 ---- */

uint32_t st_tok_utf8_next(const unsigned char *p, size_t n, size_t *len)
{
	unsigned char c = p[0];
	if (c < 0x80 || n < 2) {
		*len = 1;
		return c;
	}
	if (c < 0xe0) {
		*len = 2;
		return (uint32_t)(c & 0x1f) << 6 | (p[1] & 0x3f);
	}
	if (c < 0xf0 || n < 4) {
		*len = n < 3 ? n : 3;
		return n < 3 ? 0xfffd : (uint32_t)(c & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
	}
	*len = 4;
	return (uint32_t)(c & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 | (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
}

int st_tok_is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
	       (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
	       cp == 0x3000;
}

/* Bytes of the longest prefix of p[0..n) that is a UTF-8 character or the
 * start of one (at least 1); *ok: a whole, valid character. Rust's
 * from_utf8_lossy replaces each such invalid prefix with one U+FFFD. */
static size_t utf8_prefix(const unsigned char *p, size_t n, int *ok)
{
	unsigned char c = p[0];
	*ok = 1;
	if (c < 0x80)
		return 1;
	size_t want;
	unsigned char lo = 0x80, hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf)
		want = 2;
	else if (c >= 0xe0 && c <= 0xef) {
		want = 3;
		if (c == 0xe0)
			lo = 0xa0;
		if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		want = 4;
		if (c == 0xf0)
			lo = 0x90;
		if (c == 0xf4)
			hi = 0x8f;
	} else {
		*ok = 0;
		return 1;
	}
	size_t i = 1;
	for (; i < want; i++) {
		if (i >= n || p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xbf)) {
			*ok = 0;
			return i;
		}
	}
	return want;
}

int st_utf8_check(const char *s, size_t n, size_t *bad)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		/* ASCII runs, 8 bytes at a time */
		while (i + 8 <= n) {
			uint64_t w;
			memcpy(&w, p + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		int ok;
		size_t k = utf8_prefix(p + i, n - i, &ok);
		if (!ok) {
			if (bad)
				*bad = i;
			return st_fail(ST_EINVAL, "invalid UTF-8 at byte %zu", i);
		}
		i += k;
	}
	return 0;
}

/* ---- ids ---- */

int st_tok_ids_reserve(st_tok_ids *ids, size_t more)
{
	if (ids->cap - ids->n >= more)
		return 0;
	size_t cap = ids->cap ? ids->cap : 256;
	while (cap - ids->n < more) {
		if (cap > SIZE_MAX / 2 / sizeof(int32_t))
			return st_fail(ST_ENOMEM, "out of memory");
		cap *= 2;
	}
	int32_t *v = realloc(ids->v, cap * sizeof(*v));
	if (!v)
		return st_fail(ST_ENOMEM, "out of memory");
	ids->v = v;
	ids->cap = cap;
	return 0;
}

void st_tok_ids_release(st_tok_ids *ids)
{
	free(ids->v);
	*ids = (st_tok_ids)ST_TOK_IDS_INIT;
}

/* ---- the per-thread state ---- */

#define CACHE_SLOTS (1u << 16)
#define CACHE_KEY_MAX 255
#define CACHE_KEY_BYTES ((size_t)4 << 20)
#define CACHE_IDS ((size_t)1 << 20)

struct cache_slot {
	uint32_t hash, key_off, ids_off;
	uint16_t klen, nids; /* klen 0: empty */
};

struct sym {
	int32_t id, prev, next, len; /* len 0: merged into the symbol before it */
};

struct heap_ent {
	int32_t rank, pos, id;
};

struct st_tok_state {
	const st_tokenizer *t;
	pcre2_match_data *md[TOK_MAX_LEVELS], *word_md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jit_stack;
	struct sym *sym;
	size_t sym_cap;
	struct heap_ent *heap;
	size_t heap_cap, nheap;
	char *pbuf; /* a piece with ByteLevel's prefix space */
	size_t pbuf_cap;
	struct cache_slot *cache;
	size_t cache_used;
	char *ckeys;
	size_t ckeys_n;
	int32_t *cids;
	size_t cids_n;
	/* the span being encoded */
	const char *doc;
	size_t start, stop, end;
	int stopped;
	st_tok_ids *out;
};

void st_tok_state_free(st_tok_state *s)
{
	if (!s)
		return;
	for (int i = 0; i < TOK_MAX_LEVELS; i++)
		pcre2_match_data_free(s->md[i]);
	pcre2_match_data_free(s->word_md);
	pcre2_match_context_free(s->mctx);
	pcre2_jit_stack_free(s->jit_stack);
	free(s->sym);
	free(s->heap);
	free(s->pbuf);
	free(s->cache);
	free(s->ckeys);
	free(s->cids);
	free(s);
}

int st_tok_state_new(st_tok_state **out, const st_tokenizer *t)
{
	st_tok_state *s = calloc(1, sizeof(*s));
	*out = NULL;
	if (!s)
		return st_fail(ST_ENOMEM, "out of memory");
	s->t = t;
	int ok = 1;
	for (int i = 0; i < t->nlevels; i++)
		ok &= (s->md[i] = pcre2_match_data_create_from_pattern(t->level[i].re, NULL)) != NULL;
	if (t->word_char)
		ok &= (s->word_md = pcre2_match_data_create_from_pattern(t->word_char, NULL)) != NULL;
	/* the JIT's default stack is 32 KiB; long runs of a repeated group can need more */
	ok &= (s->mctx = pcre2_match_context_create(NULL)) != NULL;
	ok &= (s->jit_stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL)) != NULL;
	s->cache = calloc(CACHE_SLOTS, sizeof(*s->cache));
	s->ckeys = malloc(CACHE_KEY_BYTES);
	s->cids = malloc(CACHE_IDS * sizeof(*s->cids));
	if (!ok || !s->cache || !s->ckeys || !s->cids) {
		st_tok_state_free(s);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
	*out = s;
	return 0;
}

/* ---- BPE ---- */

static const struct tok_merge_slot *merge_get(const st_tokenizer *t, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = (size_t)st_tok_mix64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		const struct tok_merge_slot *m = &t->merge[i];
		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
	}
}

static int heap_less(const struct heap_ent *x, const struct heap_ent *y)
{
	return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(st_tok_state *s, int32_t rank, int32_t pos, int32_t id)
{
	size_t i = s->nheap++;
	struct heap_ent e = {rank, pos, id};
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!heap_less(&e, &s->heap[p]))
			break;
		s->heap[i] = s->heap[p];
		i = p;
	}
	s->heap[i] = e;
}

static struct heap_ent heap_pop(st_tok_state *s)
{
	struct heap_ent top = s->heap[0], last = s->heap[--s->nheap];
	size_t i = 0, n = s->nheap;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && heap_less(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!heap_less(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (n)
		s->heap[i] = last;
	return top;
}

static int grow_scratch(st_tok_state *s, size_t n)
{
	if (n <= s->sym_cap)
		return 0;
	size_t cap = s->sym_cap ? s->sym_cap : 64;
	while (cap < n)
		cap *= 2;
	struct sym *sym = realloc(s->sym, cap * sizeof(*sym));
	if (sym)
		s->sym = sym;
	/* each merge pushes at most two entries, and there are fewer merges than symbols */
	struct heap_ent *heap = realloc(s->heap, 3 * cap * sizeof(*heap));
	if (heap)
		s->heap = heap;
	if (!sym || !heap)
		return st_fail(ST_ENOMEM, "out of memory");
	s->sym_cap = cap;
	s->heap_cap = 3 * cap;
	return 0;
}

static void sym_add(st_tok_state *s, size_t *n, int32_t id, int32_t len)
{
	if (*n > 0)
		s->sym[*n - 1].next = (int32_t)*n;
	s->sym[*n] = (struct sym){id, (int32_t)*n - 1, -1, len};
	(*n)++;
}

/* BPE::merge_word and Word::merge_all on the bytes of one piece; the ids go to out. */
static int merge_word(st_tok_state *s, const unsigned char *p, size_t n, st_tok_ids *out)
{
	const st_tokenizer *t = s->t;
	int rc;
	if ((rc = grow_scratch(s, n)) < 0)
		return rc;
	size_t ns = 0;
	int32_t unk_len = 0;
	for (size_t i = 0; i < n; i++) {
		int32_t id = t->byte_id[p[i]];
		if (id >= 0) {
			if (unk_len) {
				sym_add(s, &ns, t->unk_id, unk_len);
				unk_len = 0;
			}
			sym_add(s, &ns, id, 1);
		} else if (t->unk_id >= 0) {
			if (unk_len && !t->fuse_unk) {
				sym_add(s, &ns, t->unk_id, unk_len);
				unk_len = 0;
			}
			unk_len++;
		}
		/* no unk_token: Hugging Face drops a byte the vocabulary lacks */
	}
	if (unk_len)
		sym_add(s, &ns, t->unk_id, unk_len);

	struct sym *sym = s->sym;
	s->nheap = 0;
	for (size_t i = 0; i + 1 < ns; i++) {
		const struct tok_merge_slot *m = merge_get(t, sym[i].id, sym[i + 1].id);
		if (m)
			heap_push(s, m->rank, (int32_t)i, m->id);
	}
	while (s->nheap) {
		struct heap_ent top = heap_pop(s);
		struct sym *cur = &sym[top.pos];
		if (cur->len == 0 || cur->next < 0)
			continue;
		int32_t next_pos = cur->next;
		struct sym right = sym[next_pos];
		const struct tok_merge_slot *m = merge_get(t, cur->id, right.id);
		if (!m || m->id != top.id)
			continue; /* stale: the pair changed since it was pushed */
		cur->id = top.id;
		cur->len += right.len;
		cur->next = right.next;
		sym[next_pos].len = 0;
		if (right.next >= 0)
			sym[right.next].prev = top.pos;
		if (cur->prev >= 0) {
			const struct tok_merge_slot *pm = merge_get(t, sym[cur->prev].id, cur->id);
			if (pm)
				heap_push(s, pm->rank, cur->prev, pm->id);
		}
		if (cur->next >= 0) {
			const struct tok_merge_slot *nm = merge_get(t, cur->id, sym[cur->next].id);
			if (nm)
				heap_push(s, nm->rank, top.pos, nm->id);
		}
	}
	if ((rc = st_tok_ids_reserve(out, ns)) < 0)
		return rc;
	for (size_t i = 0; i < ns; i++)
		if (sym[i].len)
			out->v[out->n++] = sym[i].id;
	return 0;
}

/* ---- the piece cache ---- */

static void cache_clear(st_tok_state *s)
{
	memset(s->cache, 0, CACHE_SLOTS * sizeof(*s->cache));
	s->cache_used = s->ckeys_n = s->cids_n = 0;
}

static const struct cache_slot *cache_find(const st_tok_state *s, const char *p, size_t n, uint64_t h, size_t *slot)
{
	for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
		const struct cache_slot *c = &s->cache[i];
		if (!c->klen) {
			*slot = i;
			return NULL;
		}
		if (c->hash == (uint32_t)(h >> 32) && c->klen == n && !memcmp(s->ckeys + c->key_off, p, n))
			return c;
	}
}

static void cache_put(st_tok_state *s, const char *p, size_t n, uint64_t h, size_t slot, const int32_t *ids,
		      size_t nids)
{
	if (s->cache_used * 2 >= CACHE_SLOTS || s->ckeys_n + n > CACHE_KEY_BYTES || s->cids_n + nids > CACHE_IDS) {
		cache_clear(s);
		cache_find(s, p, n, h, &slot);
	}
	struct cache_slot *c = &s->cache[slot];
	*c = (struct cache_slot){(uint32_t)(h >> 32), (uint32_t)s->ckeys_n, (uint32_t)s->cids_n, (uint16_t)n,
				 (uint16_t)nids};
	memcpy(s->ckeys + s->ckeys_n, p, n);
	memcpy(s->cids + s->cids_n, ids, nids * sizeof(*ids));
	s->ckeys_n += n;
	s->cids_n += nids;
	s->cache_used++;
}

/* The ids of one piece (BPE::tokenize_with_cache). */
static int piece_ids(st_tok_state *s, const char *p, size_t n)
{
	const st_tokenizer *t = s->t;
	st_tok_ids *out = s->out;
	int rc;
	if (n == 0)
		return 0;
	if ((rc = st_tok_ids_reserve(out, n)) < 0)
		return rc;
	if (t->ignore_merges) {
		int32_t id = st_tok_map_get(t, &t->by_bytes, p, n);
		if (id >= 0) {
			out->v[out->n++] = id;
			return 0;
		}
	}
	if (n == 1 && t->byte_id[(unsigned char)p[0]] >= 0) {
		out->v[out->n++] = t->byte_id[(unsigned char)p[0]];
		return 0;
	}
	if (n > CACHE_KEY_MAX)
		return merge_word(s, (const unsigned char *)p, n, out);
	uint64_t h = st_tok_hash(p, n);
	size_t slot;
	const struct cache_slot *c = cache_find(s, p, n, h, &slot);
	if (c) {
		memcpy(out->v + out->n, s->cids + c->ids_off, c->nids * sizeof(int32_t));
		out->n += c->nids;
		return 0;
	}
	size_t n0 = out->n;
	if ((rc = merge_word(s, (const unsigned char *)p, n, out)) < 0)
		return rc;
	cache_put(s, p, n, h, slot, out->v + n0, out->n - n0);
	return 0;
}

/* ---- pre-tokenizer levels ---- */

static int regex_error(const st_tok_state *s, int rc, size_t at)
{
	PCRE2_UCHAR msg[256];
	pcre2_get_error_message(rc, msg, sizeof(msg));
	return st_fail(ST_EINTERNAL, "%s: the pre-tokenizer's regex failed near byte %zu of the text: %s", s->t->name, at,
		       (const char *)msg);
}

/* A piece produced at the top level starting at p: 1 when the span stops
 * there (the first piece boundary at or after stop). */
static int stop_at(st_tok_state *s, const char *p)
{
	size_t off = (size_t)(p - s->doc);
	if (off >= s->stop && off > s->start) {
		s->end = off;
		s->stopped = 1;
		return 1;
	}
	return 0;
}

static int levels(st_tok_state *s, const char *p, size_t n, int lv, int top);

/* Cut p[0..n) with level lv's regex, each piece on to the next level.
 * Returns 0, 1 when the span stopped (top level only), or an error. */
static int cut(st_tok_state *s, const char *p, size_t n, int lv, int top)
{
	const struct tok_level *L = &s->t->level[lv];
	pcre2_match_data *md = s->md[lv];
	size_t last_end = 0, prev = 0, last_match = SIZE_MAX;
	int rc;
	while (last_end <= n) {
		rc = L->jit ? pcre2_jit_match(L->re, (PCRE2_SPTR)p, n, last_end, 0, md, s->mctx)
			    : pcre2_match(L->re, (PCRE2_SPTR)p, n, last_end, PCRE2_NO_UTF_CHECK, md, s->mctx);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			return regex_error(s, rc, (size_t)(p - s->doc) + last_end);
		const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t ms = ov[0], me = ov[1];
		if (ms > me || me > n)
			return regex_error(s, PCRE2_ERROR_INTERNAL, (size_t)(p - s->doc) + ms);
		if (ms == me) {
			size_t cl = 1;
			if (me < n)
				st_tok_utf8_next((const unsigned char *)p + me, n - me, &cl);
			last_end = me + cl;
			if (me == last_match)
				continue; /* an empty match right after a match */
		} else {
			last_end = me;
		}
		last_match = me;
		if (prev != ms) {
			if (top && stop_at(s, p + prev))
				return 1;
			if ((rc = levels(s, p + prev, ms - prev, lv + 1, 0)) < 0)
				return rc;
		}
		if (me > ms) {
			if (top && stop_at(s, p + ms))
				return 1;
			if ((rc = levels(s, p + ms, me - ms, lv + 1, 0)) < 0)
				return rc;
		}
		prev = me;
	}
	if (prev != n) {
		if (top && stop_at(s, p + prev))
			return 1;
		if ((rc = levels(s, p + prev, n - prev, lv + 1, 0)) < 0)
			return rc;
	}
	return 0;
}

/* A piece at level lv: ByteLevel's prefix space where it applies, the
 * regex of lv, or (past the last level) BPE. */
static int levels(st_tok_state *s, const char *p, size_t n, int lv, int top)
{
	const st_tokenizer *t = s->t;
	int bl = t->bytelevel_level >= 0 ? t->bytelevel_level : t->nlevels;
	if (lv == bl && t->prefix_space && n > 0 && p[0] != ' ') {
		/* (never at the top level of a span: prefix_space makes a tokenizer not resumable) */
		if (n + 1 > s->pbuf_cap) {
			char *b = realloc(s->pbuf, n + 1);
			if (!b)
				return st_fail(ST_ENOMEM, "out of memory");
			s->pbuf = b;
			s->pbuf_cap = n + 1;
		}
		s->pbuf[0] = ' ';
		memmove(s->pbuf + 1, p, n);
		return levels(s, s->pbuf, n + 1, lv, 0);
	}
	if (lv < t->nlevels)
		return cut(s, p, n, lv, top);
	if (top && stop_at(s, p))
		return 1;
	return piece_ids(s, p, n);
}

/* ---- added tokens ---- */

/* Oniguruma's \w at the character starting at byte i of x[a..b). */
static int word_at(st_tok_state *s, const char *x, size_t i, size_t b)
{
	return pcre2_match(s->t->word_char, (PCRE2_SPTR)x, b, i, PCRE2_NO_UTF_CHECK, s->word_md, NULL) >= 0;
}

static size_t prev_char(const char *x, size_t a, size_t i)
{
	do
		i--;
	while (i > a && ((unsigned char)x[i] & 0xc0) == 0x80);
	return i;
}

/*
 * The next added token of set in the sentence x[a..b), searching from *pos
 * (AddedVocabulary::find_matches). On a match: 1, [*ms, *me) its span
 * (with lstrip/rstrip whitespace), *id, and *pos past it.
 */
static int next_added(st_tok_state *s, const struct tok_added_set *set, const char *x, size_t a, size_t b,
		      size_t *pos, size_t start_offset, size_t *ms, size_t *me, int32_t *id)
{
	if (!set->n)
		return 0;
	size_t i = *pos;
	while (i < b) {
		unsigned char c = (unsigned char)x[i];
		uint32_t lo = set->first[c], hi = set->first[c + 1], k;
		if (lo == hi) {
			i++;
			continue;
		}
		const struct tok_added *tok = NULL;
		for (k = lo; k < hi; k++)
			if (set->v[k]->len <= b - i && !memcmp(x + i, set->v[k]->content, set->v[k]->len)) {
				tok = set->v[k];
				break;
			}
		if (!tok) {
			i++;
			continue;
		}
		size_t start = i, stop = i + tok->len;
		if (tok->single_word) {
			int start_space = start == a || !word_at(s, x, prev_char(x, a, start), start);
			int stop_space = stop == b || !word_at(s, x, stop, b);
			if (!start_space || !stop_space) {
				i = stop; /* the search goes on after the discarded match */
				continue;
			}
		}
		if (tok->lstrip) {
			size_t ns = start;
			while (ns > a) {
				size_t q = prev_char(x, a, ns), cl;
				if (!st_tok_is_space(st_tok_utf8_next((const unsigned char *)x + q, b - q, &cl)))
					break;
				ns = q;
			}
			start = ns > start_offset ? ns : start_offset;
		}
		if (tok->rstrip) {
			while (stop < b) {
				size_t cl;
				if (!st_tok_is_space(st_tok_utf8_next((const unsigned char *)x + stop, b - stop, &cl)))
					break;
				stop += cl;
			}
		}
		*ms = start;
		*me = stop;
		*id = tok->id;
		*pos = stop;
		return 1;
	}
	return 0;
}

static int push_id(st_tok_state *s, int32_t id)
{
	int rc = st_tok_ids_reserve(s->out, 1);
	if (rc == 0)
		s->out->v[s->out->n++] = id;
	return rc;
}

/* Pass 2: tokens with normalized=true inside x[a..b), the stretches between them to the pre-tokenizer. */
static int pass_normalized(st_tok_state *s, size_t a, size_t b)
{
	const char *x = s->doc;
	size_t pos = a, from = a, ms, me;
	int32_t id;
	int rc;
	while (next_added(s, &s->t->norm_set, x, a, b, &pos, from, &ms, &me, &id)) {
		if (ms > from && (rc = levels(s, x + from, ms - from, 0, 1)) != 0)
			return rc;
		if (stop_at(s, x + ms))
			return 1;
		if ((rc = push_id(s, id)) < 0)
			return rc;
		from = me;
	}
	if (b > from && (rc = levels(s, x + from, b - from, 0, 1)) != 0)
		return rc;
	return 0;
}

int st_tokenizer_encode_span(st_tok_state *s, const char *text, size_t len, size_t start, size_t stop,
			     st_tok_ids *out, size_t *end)
{
	const st_tokenizer *t = s->t;
	size_t n0 = out->n, pos = start, from = start, ms, me;
	int32_t id;
	int rc = 0;
	if (start > len)
		ST_BUG("st_tokenizer_encode_span: start %zu past the end %zu", start, len);
	if (!t->resumable && start != 0)
		return st_fail(ST_EINVAL, "%s: this tokenizer cannot start encoding in the middle of a text", t->name);
	s->doc = text;
	s->start = start;
	s->stop = t->resumable ? stop : SIZE_MAX;
	s->stopped = 0;
	s->out = out;
	/* pass 1: tokens with normalized=false, in the whole text */
	while (rc == 0 && next_added(s, &t->raw_set, text, start, len, &pos, from, &ms, &me, &id)) {
		if (ms > from && (rc = pass_normalized(s, from, ms)) != 0)
			break;
		if (stop_at(s, text + ms)) {
			rc = 1;
			break;
		}
		if ((rc = push_id(s, id)) < 0)
			break;
		from = me;
	}
	if (rc == 0 && len > from)
		rc = pass_normalized(s, from, len);
	s->out = NULL;
	if (rc < 0) {
		out->n = n0;
		return rc;
	}
	*end = rc == 1 ? s->end : len;
	return 0;
}

int st_tokenizer_encode(st_tok_state *s, const char *text, size_t len, st_tok_ids *out)
{
	size_t end;
	int rc = st_utf8_check(text, len, NULL);
	if (rc < 0)
		return rc;
	return st_tokenizer_encode_span(s, text, len, 0, len, out, &end);
}

/* ---- ids -> text ---- */

int st_tokenizer_decode(const st_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len)
{
	size_t total = 0, o = 0;
	*out = NULL;
	*len = 0;
	if (t->decoder == TOK_DECODER_OTHER)
		return st_fail(ST_EINVAL, "%s: decoding needs a ByteLevel decoder (or none)", t->name);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->nids || !t->ent[ids[i]].text)
			continue;
		total += t->ent[ids[i]].text_len + 1; /* bytes_len <= text_len */
	}
	/* every invalid byte may become the 3 bytes of U+FFFD */
	char *raw = malloc(total + 1), *res = malloc(3 * total + 1);
	if (!raw || !res) {
		free(raw);
		free(res);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	size_t r = 0;
	int first = 1;
	for (size_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= t->nids || !t->ent[ids[i]].text)
			continue;
		const struct tok_entry *e = &t->ent[ids[i]];
		/* skip_special_tokens drops tokens whose text is a special added token's */
		if (skip_special && (e->flags & TOK_SPECIAL))
			continue;
		if (t->decoder == TOK_DECODER_NONE) { /* tokens joined by spaces */
			if (!first)
				raw[r++] = ' ';
			memcpy(raw + r, e->text, e->text_len);
			r += e->text_len;
		} else {
			memcpy(raw + r, e->bytes, e->bytes_len);
			r += e->bytes_len;
		}
		first = 0;
	}
	for (size_t i = 0; i < r;) {
		int ok;
		size_t k = utf8_prefix((const unsigned char *)raw + i, r - i, &ok);
		if (ok) {
			memcpy(res + o, raw + i, k);
			o += k;
		} else {
			memcpy(res + o, "\xef\xbf\xbd", 3);
			o += 3;
		}
		i += k;
	}
	res[o] = 0;
	free(raw);
	*out = res;
	*len = o;
	return 0;
}

/* ---- ids -> text, one token at a time ---- */

/* p[0..n) is the start of a character that more bytes may complete. */
static int utf8_incomplete(const unsigned char *p, size_t n)
{
	int ok;
	return n > 0 && p[0] >= 0xc2 && p[0] <= 0xf4 && utf8_prefix(p, n, &ok) == n && !ok;
}

/* Append the text of c[0..k) (ok: a whole character, else U+FFFD) to s->out at *o. */
static void utf8_emit(st_utf8_stream *s, size_t *o, const unsigned char *c, size_t k, int ok)
{
	memcpy(s->out + *o, ok ? (const void *)c : "\xef\xbf\xbd", ok ? k : 3);
	*o += ok ? k : 3;
}

/* Decode the held bytes and p[0..n) into s->out; hold a character cut at
 * the end, unless final. */
static int utf8_stream(st_utf8_stream *s, const unsigned char *p, size_t n, int final, const char **text,
		       size_t *len)
{
	size_t need = 3 * (s->nheld + n) + 1, o = 0, i = 0, k;
	int ok;
	if (need > s->cap) {
		char *b = realloc(s->out, need);
		if (!b)
			return st_fail(ST_ENOMEM, "out of memory");
		s->out = b;
		s->cap = need;
	}
	if (s->nheld) { /* the cut character first: its bytes so far and up to 4 more */
		unsigned char w[8];
		size_t more = n < 4 ? n : 4;
		memcpy(w, s->held, s->nheld);
		memcpy(w + s->nheld, p, more);
		k = utf8_prefix(w, s->nheld + more, &ok);
		if (!ok && !final && k == s->nheld + more && more == n) { /* still cut */
			memcpy(s->held, w, k);
			s->nheld = k;
			i = n;
		} else {
			utf8_emit(s, &o, w, k, ok);
			i = k - s->nheld; /* the held bytes were a valid start: k >= nheld */
			s->nheld = 0;
		}
	}
	while (i < n) {
		k = utf8_prefix(p + i, n - i, &ok);
		if (!ok && !final && i + k == n && utf8_incomplete(p + i, k)) {
			memcpy(s->held, p + i, k);
			s->nheld = k;
			break;
		}
		utf8_emit(s, &o, p + i, k, ok);
		i += k;
	}
	s->out[o] = 0;
	*text = s->out;
	*len = o;
	return 0;
}

int st_utf8_stream_add(st_utf8_stream *s, const char *bytes, size_t n, const char **text, size_t *len)
{
	return utf8_stream(s, (const unsigned char *)bytes, n, 0, text, len);
}

int st_utf8_stream_end(st_utf8_stream *s, const char **text, size_t *len)
{
	return utf8_stream(s, (const unsigned char *)"", 0, 1, text, len);
}

void st_utf8_stream_release(st_utf8_stream *s)
{
	free(s->out);
	*s = (st_utf8_stream)ST_UTF8_STREAM_INIT;
}

/* ---- lookups ---- */

static int32_t first_known(const st_tokenizer *t, const char *const *names)
{
	for (; *names; names++) {
		int32_t id = st_tokenizer_id(t, *names, strlen(*names));
		if (id >= 0)
			return id;
	}
	return -1;
}

int32_t st_tokenizer_bos(const st_tokenizer *t)
{
	static const char *const names[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<|endoftext|>", NULL};
	return first_known(t, names);
}

int32_t st_tokenizer_eos(const st_tokenizer *t)
{
	static const char *const names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", NULL};
	return first_known(t, names);
}

int32_t st_tokenizer_vocab_size(const st_tokenizer *t) { return t->nids; }

int32_t st_tokenizer_id(const st_tokenizer *t, const char *token, size_t len)
{
	return st_tok_map_get(t, &t->by_text, token, len);
}

const char *st_tokenizer_token(const st_tokenizer *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->nids || !t->ent[id].text)
		return NULL;
	if (len)
		*len = t->ent[id].text_len;
	return t->ent[id].text;
}

int st_tokenizer_is_special(const st_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->nids && (t->ent[id].flags & TOK_SPECIAL) != 0;
}

int st_tokenizer_token_bytes(const st_tokenizer *t, int32_t id, const char **bytes, size_t *len)
{
	if (id < 0 || id >= t->nids || !t->ent[id].text)
		return st_fail(ST_EINVAL, "%s: no token has id %d", t->name, id);
	*bytes = t->ent[id].bytes;
	*len = t->ent[id].bytes_len;
	return 0;
}

int st_tokenizer_resumable(const st_tokenizer *t) { return t->resumable; }
