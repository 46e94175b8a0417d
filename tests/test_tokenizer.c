/*
 * test_tokenizer.c - src/text/tokenizer: byte-level BPE from tokenizer.json.
 *
 * A small tokenizer built here (the 256 byte tokens, a few merges, Llama 3's
 * split regex and special tokens) checks merges by rank, the byte-level
 * mapping, added tokens (special, lstrip/rstrip/single_word, normalized),
 * empty and invalid UTF-8 text, decoding (skip_special, U+FFFD for cut
 * characters, unknown ids), spans encoded separately and stitched, the
 * Oniguruma regex translations, and every kind of malformed file. Token
 * files: the .bin writer round trip (uint16 and uint32) and its abort.
 * Parity with Hugging Face on real text is tests/cli/tokenize_parity.sh,
 * which also runs this program with ST_TOKENIZER_DECODE_CASES (HF's
 * decode() of id lists) and ST_TOKENIZER_JSON.
 * timeout: 60
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "base/rng.h"
#include "check.h"
#include "data/tokfile.h"
#include "text/tokenizer.h"

static const char llama3_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2's bytes_to_unicode: the character that stands for byte b. */
static unsigned byte_char(int b)
{
	if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
		return (unsigned)b;
	int n = 0;
	for (int x = 0; x < b; x++)
		n += !((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae);
	return 256u + (unsigned)n;
}

/* The byte-level spelling of raw bytes s (UTF-8 of the mapped characters). */
static char *bl(const char *s)
{
	static char buf[8][256];
	static int k;
	char *o = buf[k++ % 8];
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = byte_char(*p);
		if (c < 0x80)
			o[n++] = (char)c;
		else {
			o[n++] = (char)(0xc0 | c >> 6);
			o[n++] = (char)(0x80 | (c & 0x3f));
		}
	}
	o[n] = 0;
	return o;
}

/* merges of the small tokenizer, in rank order ("a b" in raw bytes) */
static const char *merges[][2] = {
	{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}, {" wor", "l"},
	{" worl", "d"}, {"a", "a"}, {"aa", "a"}, {"\xe4", "\xbd"}, {"\xe4\xbd", "\xa0"},
};
#define NMERGES (sizeof(merges) / sizeof(merges[0]))

/* The small tokenizer as a JSON tree: ids 0-255 the bytes, 256.. the merges'
 * results, then <|begin_of_text|>, <|end_of_text|> (special) and "<x>" (not). */
static json_t *small_tokenizer(int pair_merges)
{
	json_t *vocab = json_object(), *m = json_array(), *added = json_array();
	for (int b = 0; b < 256; b++) {
		char s[2] = {(char)b, 0};
		json_object_set_new(vocab, b ? bl(s) : "\xc4\x80", json_integer(b)); /* byte 0 -> U+0100 */
	}
	for (size_t i = 0; i < NMERGES; i++) {
		char both[64];
		snprintf(both, sizeof(both), "%s%s", merges[i][0], merges[i][1]);
		json_object_set_new(vocab, bl(both), json_integer(256 + (int)i));
		if (pair_merges) {
			json_array_append_new(m, json_pack("[ss]", bl(merges[i][0]), bl(merges[i][1])));
		} else {
			char line[128];
			snprintf(line, sizeof(line), "%s %s", bl(merges[i][0]), bl(merges[i][1]));
			json_array_append_new(m, json_string(line));
		}
	}
	const char *specials[] = {"<|begin_of_text|>", "<|end_of_text|>", "<x>"};
	for (int i = 0; i < 3; i++)
		json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + (int)NMERGES + i,
						       "content", specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
						       "normalized", i == 2, "special", i < 2));
	return json_pack("{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}, "
			 "s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
			 "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer",
			 "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", llama3_regex, "behavior",
			 "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
			 "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
			 "use_regex", 1, "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix",
			 "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab,
			 "merges", m);
}

static st_tokenizer *load_tree(json_t *root, int *rc)
{
	char *s = json_dumps(root, JSON_COMPACT);
	st_tokenizer *t = NULL;
	*rc = st_tokenizer_parse(&t, s, strlen(s), "tok.json");
	free(s);
	return t;
}

#define NB (256 + (int)NMERGES)          /* <|begin_of_text|> */
#define ID_HELLO (256 + 3)
#define ID_WORLD (256 + 8)

/* encode text, compare with want[0..n) */
static void check_ids(st_tok_state *s, const char *text, size_t len, const int32_t *want, size_t n)
{
	st_tok_ids ids = ST_TOK_IDS_INIT;
	int rc = st_tokenizer_encode(s, text, len, &ids);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	int same = ids.n == n && (n == 0 || !memcmp(ids.v, want, n * sizeof(int32_t)));
	if (!same) {
		fprintf(stderr, "encode('%.*s'): got", (int)len, text);
		for (size_t i = 0; i < ids.n; i++)
			fprintf(stderr, " %d", ids.v[i]);
		fprintf(stderr, ", want");
		for (size_t i = 0; i < n; i++)
			fprintf(stderr, " %d", want[i]);
		fputc('\n', stderr);
	}
	CHECK(same);
	st_tok_ids_release(&ids);
}
#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

static void test_encode_decode(void)
{
	json_t *root = small_tokenizer(0);
	int rc;
	st_tokenizer *t = load_tree(root, &rc);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	json_decref(root);
	if (!t)
		return;
	st_tok_state *s;
	CHECK(st_tok_state_new(&s, t) == 0);
	CHECK(st_tokenizer_vocab_size(t) == NB + 3);
	CHECK(st_tokenizer_id(t, "<|end_of_text|>", 15) == NB + 1);
	CHECK(st_tokenizer_id(t, "nope", 4) == -1);
	CHECK(st_tokenizer_is_special(t, NB) && !st_tokenizer_is_special(t, NB + 2) && !st_tokenizer_is_special(t, 5));
	CHECK(st_tokenizer_resumable(t));

	check_ids(s, "hello world", 11, IDS(ID_HELLO, ID_WORLD));
	check_ids(s, "hello world", 11, IDS(ID_HELLO, ID_WORLD)); /* from the cache */
	/* "aaaa": (a,a) rank 9 leftmost first -> aa aa; (aa,a) cannot apply */
	check_ids(s, "aaaa", 4, IDS(256 + 9, 256 + 9));
	check_ids(s, "aaa", 3, IDS(256 + 10));
	/* special tokens in the text, a normalized added token, a cut-off one */
	check_ids(s, "<|begin_of_text|>hello<x><|end_of", 33,
		  IDS(NB, ID_HELLO, NB + 2, '<', '|', 'e', 'n', 'd', '_', 'o', 'f'));
	/* Llama 3's split: digits by 3, contractions any case, whitespace runs */
	check_ids(s, "12345", 5, IDS('1', '2', '3', '4', '5'));
	check_ids(s, "\xe4\xbd\xa0", 3, IDS(256 + 12));
	check_ids(s, "", 0, NULL, 0);
	check_ids(s, "a\0b", 3, IDS('a', 0, 'b'));

	st_tok_ids ids = ST_TOK_IDS_INIT;
	ids.n = 0;
	CHECK(st_tokenizer_encode(s, "ab\xff", 3, &ids) == ST_EINVAL);
	CHECK(strstr(st_errmsg(), "invalid UTF-8 at byte 2") != NULL);
	CHECK(ids.n == 0);
	CHECK(st_tokenizer_encode(s, "\xed\xa0\x80", 3, &ids) == ST_EINVAL); /* a surrogate */
	CHECK(st_tokenizer_encode(s, "\xc0\xaf", 2, &ids) == ST_EINVAL);     /* overlong */
	CHECK(st_tokenizer_encode(s, "\xf4\x90\x80\x80", 4, &ids) == ST_EINVAL); /* > U+10FFFF */
	CHECK(st_tokenizer_encode(s, "\xe4\xbd", 2, &ids) == ST_EINVAL);     /* cut */

	/* decode: byte-level inverse, specials kept or skipped, unknown ids left out,
	 * a character cut between tokens -> U+FFFD */
	char *out;
	size_t n;
	int32_t d1[] = {NB, ID_HELLO, 99999, -4, ID_WORLD, NB + 1};
	CHECK(st_tokenizer_decode(t, d1, 6, 0, &out, &n) == 0);
	CHECK(n == strlen(out) && !strcmp(out, "<|begin_of_text|>hello world<|end_of_text|>"));
	free(out);
	CHECK(st_tokenizer_decode(t, d1, 6, 1, &out, &n) == 0);
	CHECK(!strcmp(out, "hello world"));
	free(out);
	int32_t d2[] = {0xe4, 0xbd, 'x', 256 + 11, 256 + 12};
	CHECK(st_tokenizer_decode(t, d2, 5, 0, &out, &n) == 0);
	CHECK_MSG(!strcmp(out, "\xef\xbf\xbdx\xef\xbf\xbd\xe4\xbd\xa0"), "%s", out);
	free(out);
	const char *b;
	CHECK(st_tokenizer_token_bytes(t, ' ', &b, &n) == 0 && n == 1 && b[0] == ' ');
	CHECK(st_tokenizer_token_bytes(t, 12345, &b, &n) == ST_EINVAL);
	size_t tl;
	CHECK(!strcmp(st_tokenizer_token(t, ' ', &tl), "\xc4\xa0") && tl == 2); /* "Ġ" */

	/* spans: every start at a boundary stitches to the whole; a start that is
	 * not one is found out (the span before it does not end there) */
	const char *text = "hello world  \n\nhello<|begin_of_text|> 123456 aaaa   x\n";
	size_t len = strlen(text);
	st_tok_ids whole = ST_TOK_IDS_INIT;
	CHECK(st_tokenizer_encode(s, text, len, &whole) == 0);
	for (size_t step = 1; step <= len; step++) {
		st_tok_ids parts = ST_TOK_IDS_INIT;
		size_t pos = 0, end = 0;
		while (pos < len) {
			size_t want = pos + step < len ? pos + step : len;
			CHECK(st_tokenizer_encode_span(s, text, len, pos, want, &parts, &end) == 0);
			CHECK(end >= want || end == len);
			pos = end;
		}
		CHECK(parts.n == whole.n && !memcmp(parts.v, whole.v, whole.n * sizeof(int32_t)));
		st_tok_ids_release(&parts);
	}
	/* "hel|lo": a span from inside a piece ends elsewhere than the next start */
	size_t end;
	ids.n = 0;
	CHECK(st_tokenizer_encode_span(s, text, len, 0, 3, &ids, &end) == 0 && end == 5);
	st_tok_ids_release(&whole);
	st_tok_ids_release(&ids);
	st_tok_state_free(s);
	st_tokenizer_free(t);
}

/* Added-token options and other tokenizer settings, against Hugging Face's results. */
static void test_options(void)
{
	int rc;
	json_t *root = small_tokenizer(1); /* merges as pairs */
	json_t *added = json_object_get(root, "added_tokens");
	/* <x> with lstrip and rstrip; a single_word token "ab" */
	json_object_set_new(json_array_get(added, 2), "lstrip", json_true());
	json_object_set_new(json_array_get(added, 2), "rstrip", json_true());
	json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", NB + 3, "content", "ab",
					       "single_word", 1, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0));
	st_tokenizer *t = load_tree(root, &rc);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	json_decref(root);
	if (!t)
		return;
	CHECK(!st_tokenizer_resumable(t));
	st_tok_state *s;
	CHECK(st_tok_state_new(&s, t) == 0);
	/* "hello  <x>  world": the spaces around <x> belong to it */
	check_ids(s, "hello  <x>  world", 17, IDS(ID_HELLO, NB + 2, 'w', 256 + 5, 'l', 'd'));
	/* single_word: "ab" alone is the token, inside "cabd" it is not */
	check_ids(s, "ab cabd", 7, IDS(NB + 3, ' ', 'c', 'a', 'b', 'd'));
	size_t end;
	st_tok_ids ids = ST_TOK_IDS_INIT;
	CHECK(st_tokenizer_encode_span(s, "ab ab", 5, 2, 5, &ids, &end) == ST_EINVAL);
	st_tok_ids_release(&ids);
	st_tok_state_free(s);
	st_tokenizer_free(t);

	/* ignore_merges: a whole piece in the vocabulary is taken as it is */
	root = small_tokenizer(0);
	json_t *model = json_object_get(root, "model");
	json_object_set_new(json_object_get(model, "vocab"), bl("aaaa"), json_integer(NB + 3));
	json_object_set_new(model, "ignore_merges", json_true());
	json_object_set_new(root, "added_tokens", json_array());
	t = load_tree(root, &rc);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	json_decref(root);
	if (t) {
		CHECK(st_tok_state_new(&s, t) == 0);
		check_ids(s, "aaaa", 4, IDS(NB + 3));
		check_ids(s, "<|begin_of_text|>", 17, IDS('<', '|', 'b', 'e', 'g', 'i', 'n', '_', 'o', 'f', '_', 't', 'e', 'x', 't', '|', '>'));
		st_tok_state_free(s);
		st_tokenizer_free(t);
	}

	/* Oniguruma semantics: \s is White_Space (not U+180E), \w is L|M|N|Pc, ^ a line start,
	 * empty matches as onig's find_iter; a Split with a String pattern */
	struct {
		const char *regex, *text;
		int nparts;
	} re_cases[] = {
		{"\\s", "a\xe1\xa0\x8e\xc2\x85", 2},           /* U+180E is not a space: "a\u180e" "\u0085" */
		{"\\w+", "x\xcc\x81\xc2\xb2_-", 2},            /* combining mark, superscript two, _ are word chars */
		{"^a", "a\nab\nb", 4},                         /* "a" "\n" "a" "b\nb" */
		{"x*", "xxaxb", 4},                            /* "xx" "a" "x" "b" */
	};
	for (size_t i = 0; i < sizeof(re_cases) / sizeof(re_cases[0]); i++) {
		root = small_tokenizer(0);
		json_t *split = json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers"), 0);
		json_object_set_new(split, "pattern", json_pack("{s:s}", "Regex", re_cases[i].regex));
		json_object_set_new(root, "added_tokens", json_array());
		/* a vocabulary where every piece is one token: no merges */
		json_object_set_new(json_object_get(root, "model"), "merges", json_array());
		t = load_tree(root, &rc);
		CHECK_MSG(rc == 0, "%s: %s", re_cases[i].regex, st_errmsg());
		json_decref(root);
		if (!t)
			continue;
		/* count pieces with an ignore-merges trick: the decoded text of each id
		 * is one byte, so count pieces through spans instead */
		CHECK(st_tok_state_new(&s, t) == 0);
		size_t len = strlen(re_cases[i].text), pos = 0;
		int parts = 0;
		ids = (st_tok_ids)ST_TOK_IDS_INIT;
		while (pos < len && st_tokenizer_resumable(t)) {
			CHECK(st_tokenizer_encode_span(s, re_cases[i].text, len, pos, pos + 1, &ids, &end) == 0);
			pos = end;
			parts++;
		}
		if (st_tokenizer_resumable(t))
			CHECK_MSG(parts == re_cases[i].nparts, "%s: %d pieces, want %d", re_cases[i].regex, parts,
				  re_cases[i].nparts);
		else
			CHECK(!strcmp(re_cases[i].regex, "^a")); /* ^ makes spans start at 0 only */
		st_tok_ids_release(&ids);
		st_tok_state_free(s);
		st_tokenizer_free(t);
	}
}

/* Every way a tokenizer.json can be wrong: ST_EINVAL with a message naming the part. */
static void test_malformed(void)
{
	struct {
		const char *what, *want; /* want: a piece of the message */
		void (*edit)(json_t *root);
		const char *raw;         /* instead of an edit: the file's text */
	} cases[] = {
		{"empty", "empty file", NULL, ""},
		{"not JSON", "not valid JSON", NULL, "{\"model\": "},
		{"top level", "top level is an array", NULL, "[]"},
		{"duplicate key", "duplicate", NULL, "{\"model\": {}, \"model\": {}}"},
		{"no model", "no model", NULL, "{\"version\": \"1.0\"}"},
		{"model type", "model.type 'WordPiece' is not supported", NULL, "{\"model\": {\"type\": \"WordPiece\"}}"},
		{"no vocab", "model.vocab is missing", NULL, "{\"model\": {\"type\": \"BPE\", \"merges\": []}}"},
		{"merges type", "model.merges is missing or not an array", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": {}}}"},
		{"empty vocab", "model.vocab is empty", NULL, "{\"model\": {\"vocab\": {}, \"merges\": []}}"},
		{"id type", "model.vocab['a'] is a string, expected an integer id", NULL,
		 "{\"model\": {\"vocab\": {\"a\": \"0\"}, \"merges\": []}}"},
		{"negative id", "out of range", NULL, "{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}"},
		{"huge id", "out of range", NULL, "{\"model\": {\"vocab\": {\"a\": 99999999999}, \"merges\": []}}"},
		{"sparse ids", "too sparse", NULL, "{\"model\": {\"vocab\": {\"a\": 16000000}, \"merges\": []}}"},
		{"duplicate id", "id 0 is given to both", NULL, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}"},
		{"version", "unknown tokenizer version", NULL, "{\"version\": \"2.0\", \"model\": {}}"},
		{"bad merge string", "is not two tokens separated by one space", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a  a\"]}}"},
		{"merge token unknown", "'b' is not in model.vocab", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0, \"ab\": 1}, \"merges\": [\"a b\"]}}"},
		{"merged token unknown", "the merged token 'aa' is not in model.vocab", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}"},
		{"duplicate merge", "repeats merge 0", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a\", \"a a\"]}}"},
		{"mixed merges", "expected a string", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a\", [\"a\", \"a\"]]}}"},
		{"merge number", "model.merges[0] is an integer", NULL,
		 "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [5]}}"},
		{"dropout", "dropout must be null", NULL, "{\"model\": {\"dropout\": 0.1, \"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"no pre-tokenizer", "no pre_tokenizer", NULL, "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"normalizer", "normalizer 'NFC' is not supported", NULL,
		 "{\"normalizer\": {\"type\": \"NFC\"}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"pre-tokenizer type", "pre-tokenizer 'Whitespace' is not supported", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"no ByteLevel", "has no ByteLevel step", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}, "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"ByteLevel not last", "after ByteLevel is not supported", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", "
		 "\"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\"}]}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"behavior", "behavior 'Removed' is not supported", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Removed\"}, "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"bad regex", "bad regex at offset", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"word boundary", "word boundary) is not supported", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\bx\"}, \"behavior\": \"Isolated\"}, "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"pattern type", "pattern must be", NULL,
		 "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": \"x\", \"behavior\": \"Isolated\"}, "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added not array", "added_tokens is an object", NULL,
		 "{\"added_tokens\": {}, \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added id type", "added_tokens[0].id is missing or not an integer", NULL,
		 "{\"added_tokens\": [{\"content\": \"<s>\"}], \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added wrong id", "lists id 5, but Hugging Face gives it id 1", NULL,
		 "{\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\"}], \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added flag type", "added_tokens[0].special is a string", NULL,
		 "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": \"yes\"}], \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added duplicate", "repeats added_tokens[0]", NULL,
		 "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\"}, {\"id\": 1, \"content\": \"<s>\"}], "
		 "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
		{"added empty", "empty content", NULL,
		 "{\"added_tokens\": [{\"id\": 1, \"content\": \"\"}], \"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		st_tokenizer *t = (st_tokenizer *)1;
		int rc = st_tokenizer_parse(&t, cases[i].raw, strlen(cases[i].raw), "tok.json");
		CHECK_MSG(rc == ST_EINVAL && t == NULL, "%s: rc %d", cases[i].what, rc);
		CHECK_MSG(strstr(st_errmsg(), cases[i].want) != NULL && !strncmp(st_errmsg(), "tok.json", 8),
			  "%s: message '%s' lacks '%s'", cases[i].what, st_errmsg(), cases[i].want);
		st_tokenizer_free(t == (st_tokenizer *)1 ? NULL : t);
	}
	/* a file that is not there, and one too large to read */
	st_tokenizer *t;
	CHECK(st_tokenizer_load(&t, "/nonexistent/tokenizer.json") == ST_EINVAL && t == NULL);
	CHECK(strstr(st_errmsg(), "/nonexistent/tokenizer.json") != NULL);
}

/* st_tokfile_writer: uint16 and uint32 files read back by st_tokfile; abort leaves nothing. */
static void test_writer(void)
{
	char dir[] = "/tmp/test_tokenizer.XXXXXX", path[64];
	if (!mkdtemp(dir)) {
		CHECK(0);
		return;
	}
	snprintf(path, sizeof(path), "%s/t.bin", dir);
	int64_t vocabs[] = {65536, 128256};
	for (int k = 0; k < 2; k++) {
		st_tokfile_writer w = ST_TOKFILE_WRITER_INIT;
		unlink(path);
		CHECK(st_tokfile_writer_open(&w, path, vocabs[k]) == 0);
		CHECK(access(path, F_OK) != 0); /* only the temporary exists */
		static int32_t ids[300000];
		for (int i = 0; i < 300000; i++)
			ids[i] = (int32_t)(((int64_t)i * 7919) % vocabs[k]);
		CHECK(st_tokfile_writer_put(&w, ids, 100) == 0);
		CHECK(st_tokfile_writer_put(&w, ids + 100, 299900) == 0);
		int32_t bad = (int32_t)vocabs[k];
		CHECK(st_tokfile_writer_put(&w, &bad, 1) == ST_EINVAL);
		CHECK(st_tokfile_writer_commit(&w) == 0);
		st_tokfile f = ST_TOKFILE_INIT;
		CHECK(st_tokfile_open(&f, path) == 0);
		CHECK(f.ntokens == 300000 && f.itemsize == (k ? 4 : 2));
		CHECK(st_tokfile_check_ids(&f, vocabs[k]) == 0);
		int32_t back[1000];
		st_tokfile_get(&f, 299000, 1000, back);
		CHECK(!memcmp(back, ids + 299000, sizeof(back)));
		st_tokfile_release(&f);
	}
	unlink(path);
	st_tokfile_writer w = ST_TOKFILE_WRITER_INIT;
	CHECK(st_tokfile_writer_open(&w, path, 100) == 0);
	int32_t one = 5;
	CHECK(st_tokfile_writer_put(&w, &one, 1) == 0);
	st_tokfile_writer_abort(&w);
	st_tokfile_writer_abort(&w); /* twice is fine */
	CHECK(access(path, F_OK) != 0);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A %s)\"", dir);
	CHECK(system(cmd) == 0); /* no temporary left */
	rmdir(dir);
}

/* HF's decode() of id lists (tests/text/hf_ref.py --decoded): same text, both skip modes. */
static void test_decode_cases(const char *tok_path, const char *cases_path)
{
	st_tokenizer *t;
	int rc = st_tokenizer_load(&t, tok_path);
	CHECK_MSG(rc == 0, "%s", st_errmsg());
	if (rc < 0)
		return;
	json_error_t jerr;
	FILE *f = fopen(cases_path, "r");
	CHECK(f != NULL);
	char *line = NULL;
	size_t cap = 0;
	int n = 0;
	while (f && getline(&line, &cap, f) > 0) {
		json_t *c = json_loads(line, JSON_ALLOW_NUL, &jerr); /* a decoded text may hold U+0000 */
		CHECK_MSG(c != NULL, "decode case %d: not JSON: %s", n, jerr.text);
		if (!c) {
			n++;
			continue;
		}
		json_t *ids = json_object_get(c, "ids");
		size_t k = json_array_size(ids);
		int32_t *v = malloc((k + 1) * sizeof(*v));
		for (size_t i = 0; i < k; i++)
			v[i] = (int32_t)json_integer_value(json_array_get(ids, i));
		for (int skip = 0; skip < 2; skip++) {
			char *out;
			size_t len;
			const json_t *want = json_object_get(c, skip ? "text_skip" : "text");
			CHECK(st_tokenizer_decode(t, v, k, skip, &out, &len) == 0);
			CHECK_MSG(len == json_string_length(want) && !memcmp(out, json_string_value(want), len),
				  "decode case %d (skip %d) differs from Hugging Face", n, skip);
			free(out);
		}
		free(v);
		json_decref(c);
		n++;
	}
	free(line);
	if (f)
		fclose(f);
	printf("decode: %d cases equal to Hugging Face's\n", n);
	st_tokenizer_free(t);
}

/*
 * Streaming decode (st_utf8_stream, what slicetrain generate prints): the
 * outputs token by token, concatenated, are st_tokenizer_decode's text of
 * all of them, for random id sequences over the small tokenizer's byte
 * tokens (characters cut between tokens, invalid bytes, a cut character at
 * the end), merges and added tokens; and cut characters are held back.
 */
static void test_stream(void)
{
	int rc;
	json_t *root = small_tokenizer(0);
	st_tokenizer *t = load_tree(root, &rc);
	json_decref(root);
	CHECK(rc == 0);
	if (!t)
		return;
	/* "é" (c3 a9) in two tokens: nothing after the first */
	st_utf8_stream s = ST_UTF8_STREAM_INIT;
	const char *out;
	size_t n;
	CHECK(st_utf8_stream_add(&s, "a\xc3", 2, &out, &n) == 0 && n == 1 && out[0] == 'a');
	CHECK(st_utf8_stream_add(&s, "\xa9", 1, &out, &n) == 0 && n == 2 && !memcmp(out, "\xc3\xa9", 2));
	/* a cut 4-byte character given byte by byte, then a bad continuation: U+FFFD, then the byte */
	CHECK(st_utf8_stream_add(&s, "\xf0", 1, &out, &n) == 0 && n == 0);
	CHECK(st_utf8_stream_add(&s, "\x9f", 1, &out, &n) == 0 && n == 0);
	CHECK(st_utf8_stream_add(&s, "x", 1, &out, &n) == 0 && n == 4 && !memcmp(out, "\xef\xbf\xbdx", 4));
	/* a cut character at the end: one U+FFFD */
	CHECK(st_utf8_stream_add(&s, "\xe4\xbd", 2, &out, &n) == 0 && n == 0);
	CHECK(st_utf8_stream_end(&s, &out, &n) == 0 && n == 3 && !memcmp(out, "\xef\xbf\xbd", 3));
	st_utf8_stream_release(&s);

	int32_t ids[40];
	int cases = 3000, bad = 0;
	for (int c = 0; c < cases; c++) {
		int len = 1 + (int)st_rng_below(9, 1, (uint64_t)c, 39);
		for (int i = 0; i < len; i++) {
			uint64_t r = st_rng_u64(9, 2 + (uint64_t)c, (uint64_t)i);
			/* mostly UTF-8 lead and continuation bytes, some ASCII, merges and specials */
			ids[i] = r % 8 == 0 ? (int32_t)(r / 8 % 128) : r % 8 == 1 ? (int32_t)(256 + r / 8 % (NMERGES + 3))
									  : (int32_t)(0x80 + r / 8 % 0x78);
		}
		char *want, *got = NULL;
		size_t nwant, ngot = 0;
		CHECK(st_tokenizer_decode(t, ids, (size_t)len, 0, &want, &nwant) == 0);
		s = (st_utf8_stream)ST_UTF8_STREAM_INIT;
		for (int i = 0; i <= len; i++) {
			const char *b;
			size_t nb;
			if (i < len)
				CHECK(st_tokenizer_token_bytes(t, ids[i], &b, &nb) == 0 &&
				      st_utf8_stream_add(&s, b, nb, &out, &n) == 0);
			else
				CHECK(st_utf8_stream_end(&s, &out, &n) == 0);
			got = realloc(got, ngot + n + 1);
			memcpy(got + ngot, out, n);
			ngot += n;
		}
		if (ngot != nwant || memcmp(got, want, nwant))
			bad++;
		st_utf8_stream_release(&s);
		free(want);
		free(got);
	}
	printf("streaming decode: %d of %d random id sequences differ from st_tokenizer_decode\n", bad, cases);
	CHECK(bad == 0);
	st_tokenizer_free(t);
}

int main(void)
{
	const char *tok = getenv("ST_TOKENIZER_JSON"), *cases = getenv("ST_TOKENIZER_DECODE_CASES");
	if (tok && cases) {
		test_decode_cases(tok, cases);
		return check_result();
	}
	test_encode_decode();
	test_options();
	test_malformed();
	test_writer();
	test_stream();
	return check_result();
}
