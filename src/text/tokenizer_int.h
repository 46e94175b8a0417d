/*
 * tokenizer_int.h - the loaded tokenizer, shared by tokenizer_load.c (which
 * builds it from tokenizer.json) and tokenizer.c (which encodes and
 * decodes with it). Not an API.
 */
#ifndef ST_TEXT_TOKENIZER_INT_H
#define ST_TEXT_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Pre-tokenizer regex levels: each cuts the pieces of the level before. */
#define TOK_MAX_LEVELS 8

enum { TOK_IN_VOCAB = 1, TOK_ADDED = 2, TOK_SPECIAL = 4 };
enum tok_decoder { TOK_DECODER_NONE, TOK_DECODER_BYTELEVEL, TOK_DECODER_OTHER };

/* One id: its token as the file spells it, and the bytes it decodes to. */
struct tok_entry {
	const char *text;   /* in t->pool, NUL-terminated; NULL: no token has this id */
	const char *bytes;  /* in t->pool: ByteLevel inverse of text, or text itself */
	uint32_t text_len, bytes_len;
	unsigned flags;     /* TOK_* */
};

/* Open addressing from a string to an id; the key is the entry's text or bytes. */
struct tok_slot {
	uint32_t hash;
	int32_t id; /* -1: empty */
};
struct tok_map {
	struct tok_slot *slot;
	size_t mask; /* capacity - 1, capacity a power of two */
	int by_bytes; /* keys are entries' bytes (else their text) */
};

/* (left id, right id) -> (rank, merged id). */
struct tok_merge_slot {
	uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
	int32_t rank, id;
};

struct tok_added {
	const char *content; /* = the entry's text */
	uint32_t len;
	int32_t id;
	unsigned char single_word, lstrip, rstrip, normalized, special;
};

/* Added tokens matched in one pass: leftmost, then longest. */
struct tok_added_set {
	struct tok_added **v; /* sorted by first byte, then longest first */
	size_t n;
	uint32_t first[257]; /* v[first[b] .. first[b+1]) start with byte b */
	unsigned char any_strip; /* some token has single_word, lstrip or rstrip */
};

struct tok_level {
	pcre2_code *re;
	int jit; /* JIT-compiled */
};

struct st_tokenizer {
	char *name;
	struct tok_entry *ent;
	int32_t nids;   /* max id + 1 */
	int32_t model_vocab_size; /* entries of model.vocab (Hugging Face's get_vocab_size) */
	char *pool;
	size_t pool_len, pool_cap;

	struct tok_map by_text;  /* every token, as spelled in the file */
	struct tok_map by_bytes; /* model vocabulary, by the bytes it stands for */
	struct tok_merge_slot *merge;
	size_t merge_mask;
	int32_t byte_id[256]; /* the model id of each single byte, -1 if none */
	int32_t unk_id;       /* -1: no unk_token */
	int fuse_unk, ignore_merges;

	struct tok_added *added;
	size_t nadded;
	struct tok_added_set raw_set, norm_set; /* normalized: false / true */
	pcre2_code *word_char; /* Oniguruma's \w, for single_word (NULL if unused) */

	struct tok_level level[TOK_MAX_LEVELS];
	int nlevels;
	int bytelevel_level; /* index of the ByteLevel regex level, -1 if use_regex is false */
	int prefix_space;    /* ByteLevel add_prefix_space */
	int resumable;
	enum tok_decoder decoder;
};

/* Hashing and lookups shared by load and encode. */
uint64_t st_tok_hash(const void *p, size_t n);
int32_t st_tok_map_get(const st_tokenizer *t, const struct tok_map *m, const char *key, size_t len);
static inline uint64_t st_tok_mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* The byte-level alphabet: byte -> code point and back (-1: not in it). */
extern const uint16_t st_tok_byte_char[256];
int st_tok_char_byte(uint32_t cp);

/* Decode one UTF-8 character of valid text at p (n bytes left): its code point, *len its bytes. */
uint32_t st_tok_utf8_next(const unsigned char *p, size_t n, size_t *len);
/* Oniguruma's \s: Unicode White_Space. */
int st_tok_is_space(uint32_t cp);

#endif
