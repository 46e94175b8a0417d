/*
 * tokenizer.h - byte-level BPE tokenizers read from Hugging Face
 * tokenizer.json (Llama 3, GPT-2 and their kin): text -> ids -> text.
 *
 * Encoding equals Hugging Face `tokenizers` (PyPI) `encode(text,
 * add_special_tokens=False).ids`, id for id: added tokens (special or not:
 * <|begin_of_text|> in a text is that token) are split out first, the
 * pre-tokenizer's regular expressions cut the rest into pieces (PCRE2 with
 * Unicode properties: Oniguruma's \s, \w, \h, ^ and $ are translated to
 * their PCRE2 equivalents), each piece's bytes are merged by the BPE ranks.
 * Nothing is added around the text: callers put BOS/EOS where they want
 * them (st_tokenizer_id). Decoding equals `decode(ids, skip_special_tokens)`.
 *
 *   st_tokenizer *t;
 *   if ((rc = st_tokenizer_load(&t, "tokenizer.json")) < 0) return rc;
 *   st_tok_state *s;                                  // one per thread
 *   if ((rc = st_tok_state_new(&s, t)) < 0) goto out;
 *   st_tok_ids ids = ST_TOK_IDS_INIT;
 *   rc = st_tokenizer_encode(s, text, len, &ids);    // appends to ids.v[0..ids.n)
 *   char *back; size_t nback;
 *   rc = st_tokenizer_decode(t, ids.v, ids.n, 0, &back, &nback);
 *   free(back); st_tok_ids_release(&ids); st_tok_state_free(s); st_tokenizer_free(t);
 *
 * Threads: a loaded st_tokenizer is read-only; any number of threads encode
 * with it at once, each with its own st_tok_state (regex match data and a
 * cache of the pieces it has merged, bounded). Results do not depend on the
 * state's history.
 *
 * What loads (anything else is ST_EINVAL naming the part of the file):
 * version "1.0"; model BPE (vocab, merges as "a b" strings or ["a", "b"]
 * pairs, ignore_merges, unk_token, fuse_unk; no dropout, subword prefix or
 * suffix, byte fallback); normalizer null; pre_tokenizer Split (Isolated,
 * String or Regex pattern) and ByteLevel steps, alone or in a Sequence,
 * ByteLevel last; added_tokens with single_word, lstrip, rstrip, normalized
 * (their ids as Hugging Face assigns them, which must be the ones the file
 * lists); decoder ByteLevel or null (checked when decoding);
 * post_processor, truncation and padding are not used.
 * Limits (ST_EINVAL): the file at most ST_TOKENIZER_MAX_FILE bytes, ids
 * below ST_TOKENIZER_MAX_ID, ids not sparser than 4 per entry (so a small
 * file cannot make a large table), no duplicate keys, ids or merges.
 *
 * Errors: ST_EINVAL (the file is missing or wrong, or the text is: the
 * message says where; for text, "invalid UTF-8 at byte N"), ST_EIO (the
 * file exists but reading it failed),
 * ST_ENOMEM, ST_EINTERNAL (PCRE2 failed while matching, e.g. its match
 * limit on a pathological text).
 */
#ifndef ST_TEXT_TOKENIZER_H
#define ST_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define ST_TOKENIZER_MAX_FILE ((size_t)1 << 30) /* bytes of tokenizer.json */
#define ST_TOKENIZER_MAX_ID (1 << 24)           /* ids are below this */

typedef struct st_tokenizer st_tokenizer;
typedef struct st_tok_state st_tok_state;

/* A growing array of ids: encode appends, the caller may reset n to 0. */
typedef struct st_tok_ids {
	int32_t *v;
	size_t n, cap;
} st_tok_ids;
#define ST_TOK_IDS_INIT {NULL, 0, 0}
/* Make room for `more` ids after v[n): 0 or ST_ENOMEM. */
int st_tok_ids_reserve(st_tok_ids *ids, size_t more);
void st_tok_ids_release(st_tok_ids *ids);

/* Read and check a tokenizer.json. *out is NULL on error. Messages start with path. */
int st_tokenizer_load(st_tokenizer **out, const char *path);
/* The same from memory; name stands for the file in messages. */
int st_tokenizer_parse(st_tokenizer **out, const char *json, size_t len, const char *name);
void st_tokenizer_free(st_tokenizer *t); /* NULL is fine */

/* One more than the largest id (model vocabulary and added tokens). */
int32_t st_tokenizer_vocab_size(const st_tokenizer *t);
/* The id of a token as tokenizer.json spells it ("<|begin_of_text|>",
 * "Ġthe"), -1 if there is none (Hugging Face's token_to_id). */
int32_t st_tokenizer_id(const st_tokenizer *t, const char *token, size_t len);
/* The token of an id as tokenizer.json spells it (*len its bytes), NULL for
 * an id the tokenizer does not have. */
const char *st_tokenizer_token(const st_tokenizer *t, int32_t id, size_t *len);
/* 1 for an added token marked special (<|end_of_text|>), else 0. */
int st_tokenizer_is_special(const st_tokenizer *t, int32_t id);
/* The bytes id stands for in decoded text (the byte-level inverse; an added
 * token's own text), for streaming output one token at a time; 0, or
 * ST_EINVAL for an unknown id. */
int st_tokenizer_token_bytes(const st_tokenizer *t, int32_t id, const char **bytes, size_t *len);
/*
 * 1 when encoding may start at any piece boundary of a text, not only at
 * its beginning (st_tokenizer_encode_span): no lookbehind or line-start
 * anchor in the pre-tokenizer, no prefix space, no added token with
 * single_word, lstrip or rstrip. Llama 3's and GPT-2's tokenizers are.
 */
int st_tokenizer_resumable(const st_tokenizer *t);

int st_tok_state_new(st_tok_state **out, const st_tokenizer *t);
void st_tok_state_free(st_tok_state *s); /* NULL is fine */

/*
 * Append the ids of text[0..len) to *out. text must be UTF-8 (checked:
 * ST_EINVAL "invalid UTF-8 at byte N"); it may hold NUL bytes. Empty text
 * gives no ids. On error *out keeps what it held before the call.
 */
int st_tokenizer_encode(st_tok_state *s, const char *text, size_t len, st_tok_ids *out);

/*
 * Encoding a long text in pieces, on several threads. Appends the ids of
 * text[start..*end), where *end is the first piece boundary at or after
 * stop (len at the end of the text), and returns 0. start must be 0 or a
 * boundary an earlier call returned in *end: then the ids of consecutive
 * spans, concatenated, are the ids of st_tokenizer_encode. A start guessed
 * at another place is only right if it is a boundary, which a caller
 * learns when the span before it ends exactly there (*end == that start);
 * otherwise it encodes again from that *end. Without st_tokenizer_resumable
 * the span always runs to the end of the text. text[0..len) must be valid
 * UTF-8 already (st_utf8_check), and start a character boundary.
 */
int st_tokenizer_encode_span(st_tok_state *s, const char *text, size_t len, size_t start, size_t stop,
			     st_tok_ids *out, size_t *end);

/*
 * ids -> text, as Hugging Face's decode: unknown ids are left out, special
 * tokens too when skip_special, the ByteLevel decoder turns tokens back
 * into bytes, and byte sequences that are not UTF-8 (a token cut in the
 * middle of a character) become U+FFFD. *out is malloc'd, NUL-terminated,
 * *len its length. ST_EINVAL when the tokenizer's decoder is not supported.
 */
int st_tokenizer_decode(const st_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
			size_t *len);

/* 0 when s[0..n) is UTF-8 (no overlong forms, surrogates or code points
 * above U+10FFFF); else ST_EINVAL "invalid UTF-8 at byte N" with N in *bad
 * (if not NULL). */
int st_utf8_check(const char *s, size_t n, size_t *bad);

/*
 * Decoding as tokens come (slicetrain generate streams its output): give
 * each token's bytes (st_tokenizer_token_bytes) to st_utf8_stream_add and
 * write out what it returns; st_utf8_stream_end returns the rest. The
 * outputs, concatenated, are the text st_tokenizer_decode(ids, n, 0) gives
 * for all the tokens at once (ByteLevel decoder): a character cut between
 * tokens is held until its last byte comes; bytes that cannot become a
 * character give one U+FFFD per maximal invalid part (from_utf8_lossy's
 * rule) as soon as that is known, and a cut character at the end one
 * U+FFFD. *text points into s, valid until the next call (*len may be 0).
 * 0 or ST_ENOMEM.
 */
typedef struct st_utf8_stream {
	unsigned char held[4]; /* the first bytes of a character cut between tokens */
	size_t nheld;
	char *out;             /* the last output */
	size_t cap;
} st_utf8_stream;
#define ST_UTF8_STREAM_INIT {{0}, 0, NULL, 0}
int st_utf8_stream_add(st_utf8_stream *s, const char *bytes, size_t n, const char **text, size_t *len);
int st_utf8_stream_end(st_utf8_stream *s, const char **text, size_t *len);
void st_utf8_stream_release(st_utf8_stream *s);

/*
 * The BOS and EOS tokens slicetrain knows by name, the first that t has:
 * BOS <|begin_of_text|> (Llama 3), <s>, <|startoftext|>, <|endoftext|>;
 * EOS <|end_of_text|>, </s>, <|endoftext|>. -1 when t has none.
 */
int32_t st_tokenizer_bos(const st_tokenizer *t);
int32_t st_tokenizer_eos(const st_tokenizer *t);

#endif
