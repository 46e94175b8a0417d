/*
 * generate.c - slicetrain generate: text from a checkpoint or a Hugging
 * Face model directory. The library does the work (infer/load.h reads the
 * model, infer/generate.h decodes over a KV cache and samples, text/
 * tokenizer.h encodes the prompt and turns tokens back into bytes); this
 * file reads the command line and the prompt, puts BOS and EOS where the
 * model expects them, and prints each token as it comes.
 */
#include "cli/cli.h"

#include <inttypes.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"
#include "config/config.h"
#include "infer/generate.h"
#include "infer/load.h"
#include "text/tokenizer.h"

static const char generate_usage[] =
	"usage: slicetrain generate MODEL_DIR [CONFIG.yml] [key=value ...] [options]\n"
	"\n"
	"Generates text with a Llama model. MODEL_DIR is a Hugging Face model directory\n"
	"(config.json and model.safetensors, as `slicetrain export` and transformers'\n"
	"save_pretrained write them) or a checkpoint: a step directory, or a run's\n"
	"checkpoints (or run) directory, meaning its newest committed step.\n"
	"\n"
	"The prompt is --prompt TEXT, else all of standard input (one trailing newline\n"
	"dropped). The new text is printed on stdout token by token as it comes; the\n"
	"speed (tokens/s) goes to stderr at the end. Decoding is incremental: a key/value\n"
	"cache holds every position, so each new token costs one token's forward pass.\n"
	"It stops at EOS (config.json's eos_token_id and the tokenizer's EOS), after\n"
	"--max-tokens new tokens, or when the sequence fills the model's context\n"
	"(max_target_length of a checkpoint, max_position_embeddings of config.json);\n"
	"a prompt that leaves no room for one new token is an error.\n"
	"\n"
	"config keys (MaxText's; from CONFIG.yml or key=value):\n"
	"  tokenizer_path=PATH   the tokenizer.json (default: tokenizer.json beside a\n"
	"                        Hugging Face model, else the checkpoint's tokenizer_path)\n"
	"  add_bos=true|false    BOS before the prompt (default: the checkpoint's add_bos;\n"
	"                        true for a Hugging Face model)\n"
	"options:\n"
	"  -p, --prompt TEXT     the prompt (default: standard input)\n"
	"  --prompt-ids IDS      the prompt as token ids, e.g. 128000,791,3363 (no tokenizer\n"
	"                        needed, nothing added)\n"
	"  --max-tokens N        new tokens at most (default 128)\n"
	"  --temperature T       0: greedy, the most likely token (default); > 0: sample\n"
	"                        from softmax(logits / T)\n"
	"  --top-p P             sample from the fewest most likely tokens whose\n"
	"                        probabilities add up to P (default 1: all)\n"
	"  --seed S              the seed of sampling: the same seed gives the same text\n"
	"                        (default 0)\n"
	"  --ignore-eos          go on past EOS\n"
	"  --ids                 print the new tokens' ids (EOS included) instead of text\n"
	"  --json                print one JSON object at the end instead: prompt_ids, ids,\n"
	"                        text, stop, eos_ids, timings\n"
	"\n"
	"examples (an export, and the default job's newest checkpoint):\n"
	"  slicetrain generate hf_model/ --prompt \"Once upon a time\" --max-tokens 64\n"
	"  echo \"The weather\" | slicetrain generate slicetrain_output/default --max-tokens 64 \\\n"
	"      --temperature 0.8 --top-p 0.95 --seed 7\n";

#define DEFAULT_MAX_TOKENS 128
#define MAX_PROMPT_BYTES ((size_t)1 << 30)

struct opts {
	const char *model, *config, *prompt, *prompt_ids;
	char **kv;
	int nkv;
	int64_t max_tokens;
	double temperature, top_p;
	int seed, ignore_eos, ids, json;
};

/* What on_token prints and keeps. */
struct out {
	st_tokenizer *tok;
	int mode; /* OUT_TEXT, OUT_IDS, OUT_JSON */
	st_utf8_stream stream;
	st_tok_ids ids;
};
enum { OUT_TEXT, OUT_IDS, OUT_JSON };

static int usage_error(const char *msg)
{
	fprintf(stderr, "slicetrain: error: %s (see slicetrain generate --help)\n", msg);
	return 2;
}

static int error_exit(int rc)
{
	fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
	return st_exit_status(rc);
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

/* "key=value" (a MODEL_DIR path may hold '=' after a '/'). */
static int is_override(const char *a)
{
	const char *eq = strchr(a, '=');
	return eq && eq > a && !memchr(a, '/', (size_t)(eq - a));
}

/* One of the overrides sets key. */
static int overrides_key(const struct opts *o, const char *key)
{
	size_t n = strlen(key);
	for (int i = 0; i < o->nkv; i++)
		if (!strncmp(o->kv[i], key, n) && o->kv[i][n] == '=')
			return 1;
	return 0;
}

static int parse_args(struct opts *o, int argc, char **argv)
{
	const st_cli_opt opts[] = {
		{.name = "--prompt", .alias = "-p", .kind = ST_CLI_STRING, .value = &o->prompt, .joined = 1},
		{.name = "--prompt-ids", .kind = ST_CLI_STRING, .value = &o->prompt_ids, .joined = 1},
		{.name = "--max-tokens", .kind = ST_CLI_COUNT, .value = &o->max_tokens, .joined = 1},
		{.name = "--temperature", .kind = ST_CLI_REAL, .value = &o->temperature, .joined = 1},
		{.name = "--top-p", .kind = ST_CLI_REAL, .value = &o->top_p, .joined = 1},
		{.name = "--seed", .kind = ST_CLI_INT, .value = &o->seed, .min = 0, .max = 2147483647, .joined = 1},
		{.name = "--ignore-eos", .kind = ST_CLI_FLAG, .value = &o->ignore_eos},
		{.name = "--ids", .kind = ST_CLI_FLAG, .value = &o->ids},
		{.name = "--json", .kind = ST_CLI_FLAG, .value = &o->json},
		{0},
	};
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int rc = st_cli_option(opts, argc, argv, &i);
		if (rc < 0)
			return rc;
		if (rc)
			continue;
		if (a[0] == '-' && a[1]) {
			const char *hint = st_cli_suggest_option(opts, NULL, a);
			return hint ? st_fail(ST_EINVAL, "unknown option '%s'; did you mean '%s'?", a, hint)
				    : st_fail(ST_EINVAL, "unknown option '%s'", a);
		}
		if (!o->config && !strchr(a, '=') && (has_suffix(a, ".yml") || has_suffix(a, ".yaml")))
			o->config = a;
		else if (is_override(a))
			o->kv[o->nkv++] = argv[i];
		else if (!o->model)
			o->model = a;
		else
			return st_fail(ST_EINVAL, "one MODEL_DIR, got '%s' and '%s'", o->model, a);
	}
	if (!o->model)
		return st_fail(ST_EINVAL, "generate needs a MODEL_DIR");
	if (o->prompt && o->prompt_ids)
		return st_fail(ST_EINVAL, "--prompt and --prompt-ids: give one");
	if (o->ids && o->json)
		return st_fail(ST_EINVAL, "--ids and --json: give one");
	return 0;
}

/* "1,2 3": ids separated by commas and/or white space. */
static int parse_ids(const char *s, st_tok_ids *out)
{
	const char *p = s;
	for (;;) {
		while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (!*p)
			return 0;
		char *end;
		long long v = strtoll(p, &end, 10);
		if (end == p || v < 0 || v > INT32_MAX || (*end && !strchr(", \t\n", *end)))
			return st_fail(ST_EINVAL, "--prompt-ids: '%.*s' is not a token id", (int)strcspn(p, ", \t\n"), p);
		int rc = st_tok_ids_reserve(out, 1);
		if (rc < 0)
			return rc;
		out->v[out->n++] = (int32_t)v;
		p = end;
	}
}

/* The prompt's text: --prompt, else standard input less one trailing newline. */
static int prompt_text(const struct opts *o, char **buf, const char **text, size_t *len)
{
	*buf = NULL;
	if (o->prompt) {
		*text = o->prompt;
		*len = strlen(o->prompt);
		return 0;
	}
	if (isatty(STDIN_FILENO))
		st_info("generate: reading the prompt from standard input (end it with Ctrl-D), or give --prompt TEXT");
	int rc = st_read_file("/dev/stdin", MAX_PROMPT_BYTES, buf, len);
	if (rc < 0)
		return rc == ST_EIO ? st_fail(ST_EINVAL, "cannot read the prompt from standard input: %s", st_errmsg()) : rc;
	if (*len && (*buf)[*len - 1] == '\n')
		(*buf)[--*len] = 0;
	if (*len && (*buf)[*len - 1] == '\r')
		(*buf)[--*len] = 0;
	*text = *buf;
	return 0;
}

static int on_token(void *ctx, int32_t id, int is_eos)
{
	struct out *w = ctx;
	int rc = st_tok_ids_reserve(&w->ids, 1);
	if (rc < 0)
		return rc;
	w->ids.v[w->ids.n++] = id;
	if (w->mode == OUT_IDS) {
		printf("%s%d", w->ids.n > 1 ? " " : "", (int)id);
	} else if (w->mode == OUT_TEXT && !is_eos) {
		const char *bytes, *text;
		size_t nb, nt;
		if (st_tokenizer_token_bytes(w->tok, id, &bytes, &nb) < 0)
			return 0; /* an id the tokenizer lacks: no text, as its decode */
		if ((rc = st_utf8_stream_add(&w->stream, bytes, nb, &text, &nt)) < 0)
			return rc;
		fwrite(text, 1, nt, stdout);
	}
	fflush(stdout);
	return 0;
}

/* The tokenizer.json to use: given in the config, else the one the model names. */
static int load_tokenizer(const struct opts *o, const st_config *user, const st_infer_model *im, st_tokenizer **tok,
			  const char **path)
{
	*tok = NULL;
	*path = NULL;
	if ((o->config || overrides_key(o, "tokenizer_path")) && user->tokenizer_path[0])
		*path = user->tokenizer_path;
	else if (im->tokenizer[0])
		*path = im->tokenizer;
	if (!*path) {
		if (o->prompt_ids)
			return 0;
		return st_fail(ST_EINVAL, "a text prompt needs a tokenizer: tokenizer_path=PATH/tokenizer.json (%s has "
			       "none beside it%s), or give --prompt-ids", o->model,
			       im->hf ? "" : " and its checkpoint names none that exists");
	}
	return st_tokenizer_load(tok, *path);
}

/* New tokens per second once the prompt is in: the first new token comes
 * from the prompt's pass, each later one costs one forward. */
static double decode_rate(const st_gen_result *r)
{
	return r->new_tokens > 1 && r->decode_s > 0 ? (double)(r->new_tokens - 1) / r->decode_s : 0.0;
}

static void print_json(const st_gen_result *r, const st_tok_ids *prompt, const struct out *w, const int32_t *eos,
		       int neos)
{
	json_t *j = json_object(), *pi = json_array(), *ids = json_array(), *e = json_array();
	for (size_t i = 0; i < prompt->n; i++)
		json_array_append_new(pi, json_integer(prompt->v[i]));
	for (size_t i = 0; i < w->ids.n; i++)
		json_array_append_new(ids, json_integer(w->ids.v[i]));
	for (int i = 0; i < neos; i++)
		json_array_append_new(e, json_integer(eos[i]));
	json_object_set_new(j, "prompt_ids", pi);
	json_object_set_new(j, "ids", ids);
	if (w->tok) {
		size_t n = w->ids.n - (r->stop == ST_GEN_EOS), len;
		char *text = NULL;
		if (st_tokenizer_decode(w->tok, w->ids.v, n, 0, &text, &len) == 0)
			json_object_set_new(j, "text", json_stringn(text, len));
		free(text);
	}
	json_object_set_new(j, "stop", json_string(st_gen_stop_name(r->stop)));
	json_object_set_new(j, "eos_ids", e);
	json_object_set_new(j, "prompt_tokens", json_integer(r->prompt_tokens));
	json_object_set_new(j, "new_tokens", json_integer(r->new_tokens));
	json_object_set_new(j, "prefill_s", json_real(r->prefill_s));
	json_object_set_new(j, "decode_s", json_real(r->decode_s));
	json_object_set_new(j, "prompt_tokens_per_s", json_real(r->prefill_s > 0 ? (double)r->prompt_tokens / r->prefill_s : 0));
	json_object_set_new(j, "tokens_per_s", json_real(decode_rate(r)));
	char *s = json_dumps(j, JSON_COMPACT);
	if (s)
		puts(s);
	free(s);
	json_decref(j);
}

int st_cmd_generate(int argc, char **argv)
{
	struct opts o = {.max_tokens = DEFAULT_MAX_TOKENS, .top_p = 1.0};
	st_infer_model im = ST_INFER_MODEL_INIT;
	st_config *user = calloc(1, sizeof(*user));
	st_tok_ids prompt = ST_TOK_IDS_INIT;
	st_tok_state *ts = NULL;
	st_decoder *dec = NULL;
	st_sampler smp = ST_SAMPLER_INIT;
	struct out w = {.stream = ST_UTF8_STREAM_INIT, .ids = ST_TOK_IDS_INIT};
	const char *tok_path = NULL;
	char *stdin_buf = NULL;
	int rc;

	for (int i = 0; i < argc; i++)
		if (st_cli_is_help(argv[i])) {
			fputs(generate_usage, stdout);
			free(user);
			return 0;
		}
	if (!user || !(o.kv = calloc((size_t)argc + 1, sizeof(char *)))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = parse_args(&o, argc, argv)) < 0) {
		rc = usage_error(st_errmsg());
		goto out;
	}
	if (o.config || o.nkv) { /* tokenizer_path and add_bos, as the other commands read them */
		char path[ST_PATH_MAX + 16];
		const char *dir = st_cli_use_config_dir();
		snprintf(path, sizeof(path), "%s", o.config ? o.config : "");
		if (!o.config)
			snprintf(path, sizeof(path), "%s/default.yml", dir);
		if ((rc = st_config_load(user, path, o.nkv, o.kv)) < 0)
			goto fail;
	}
	/* everything about the prompt that needs no model is checked first */
	if (o.prompt && !o.prompt[0]) {
		rc = st_fail(ST_EINVAL, "the prompt is empty");
		goto fail;
	}
	if (o.prompt_ids && (rc = parse_ids(o.prompt_ids, &prompt)) < 0)
		goto fail;
	if (o.prompt_ids && !prompt.n) {
		rc = st_fail(ST_EINVAL, "--prompt-ids: no ids");
		goto fail;
	}
	if ((rc = st_infer_model_load(&im, o.model)) < 0)
		goto fail;
	const st_llama_shape *s = &im.m.s;
	int64_t nparams = st_llama_count_params(s);
	st_info("generate: %s (%.1fM parameters, %" PRId64 " layers, vocabulary %" PRId64 ", context %" PRId64
		") loaded in %.2f s", im.path, (double)nparams / 1e6, s->L, s->V, im.context, im.load_s);
	if ((rc = st_sampler_init(&smp, s->V, o.temperature, o.top_p, (uint64_t)o.seed)) < 0 ||
	    (rc = load_tokenizer(&o, user, &im, &w.tok, &tok_path)) < 0)
		goto fail;

	if (!o.prompt_ids) {
		const char *text = NULL;
		size_t len = 0;
		int add_bos = o.config || overrides_key(&o, "add_bos") ? user->add_bos : im.add_bos;
		if ((rc = prompt_text(&o, &stdin_buf, &text, &len)) < 0)
			goto fail;
		if (!len) {
			rc = st_fail(ST_EINVAL, "the prompt is empty");
			goto fail;
		}
		int32_t bos = st_tokenizer_bos(w.tok);
		if (bos < 0)
			bos = im.bos;
		if (add_bos && bos < 0)
			st_warn("%s names no BOS token slicetrain knows (and config.json no bos_token_id): the prompt starts "
				"without one (add_bos=false says so)", tok_path);
		if (add_bos && bos >= 0) {
			if ((rc = st_tok_ids_reserve(&prompt, 1)) < 0)
				goto fail;
			prompt.v[prompt.n++] = bos;
		}
		if ((rc = st_tok_state_new(&ts, w.tok)) < 0)
			goto fail;
		if ((rc = st_tokenizer_encode(ts, text, len, &prompt)) < 0) {
			rc = st_wrap(rc, "the prompt");
			goto fail;
		}
	}
	if ((int64_t)prompt.n >= im.context) {
		rc = st_fail(ST_EINVAL, "the prompt has %zu tokens, and the model's context is %" PRId64 " (%s of %s): "
			     "it leaves no room for a new token (at most %" PRId64 " prompt tokens)", prompt.n, im.context,
			     im.context_key, im.path, im.context - 1);
		goto fail;
	}

	/* EOS: the model's ids and the tokenizer's */
	int32_t eos[ST_INFER_MAX_EOS + 1];
	int neos = 0;
	if (!o.ignore_eos) {
		memcpy(eos, im.eos, (size_t)im.neos * sizeof(int32_t));
		neos = im.neos;
		int32_t te = w.tok ? st_tokenizer_eos(w.tok) : -1, known = 0;
		for (int i = 0; i < neos; i++)
			known |= eos[i] == te;
		if (te >= 0 && te < s->V && !known)
			eos[neos++] = te;
	}
	st_gen_opts go = {.max_tokens = o.max_tokens, .eos = eos, .neos = neos};
	int64_t room = (int64_t)prompt.n + o.max_tokens - 1, cap = im.context - 1 < room ? im.context - 1 : room;
	if ((rc = st_decoder_create(&dec, &im.m, cap)) < 0)
		goto fail;
	w.mode = o.json ? OUT_JSON : o.ids || !w.tok ? OUT_IDS : OUT_TEXT;
	st_gen_result r;
	if ((rc = st_generate(dec, &smp, prompt.v, (int64_t)prompt.n, &go, on_token, &w, &r)) < 0)
		goto fail;
	if (w.mode == OUT_TEXT) {
		const char *text;
		size_t nt;
		if ((rc = st_utf8_stream_end(&w.stream, &text, &nt)) < 0)
			goto fail;
		fwrite(text, 1, nt, stdout);
		if (isatty(STDOUT_FILENO))
			fputc('\n', stdout);
	} else if (w.mode == OUT_IDS) {
		fputc('\n', stdout);
	} else {
		print_json(&r, &prompt, &w, eos, neos);
	}
	fflush(stdout);
	char rate[64] = "";
	if (r.new_tokens > 1)
		snprintf(rate, sizeof(rate), ", then %.1f tokens/s", decode_rate(&r));
	st_info("generate: %" PRId64 " new tokens in %.2f s (prompt: %" PRId64 " tokens in %.3f s, %.1f tokens/s%s); "
		"stop: %s; %d thread%s", r.new_tokens, r.prefill_s + r.decode_s, r.prompt_tokens, r.prefill_s,
		r.prefill_s > 0 ? (double)r.prompt_tokens / r.prefill_s : 0.0, rate, st_gen_stop_name(r.stop),
		omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
	rc = 0;
	goto out;
fail:
	fflush(stdout);
	rc = error_exit(rc);
out:
	st_decoder_free(dec);
	st_sampler_release(&smp);
	st_tok_state_free(ts);
	st_tokenizer_free(w.tok);
	st_utf8_stream_release(&w.stream);
	st_tok_ids_release(&w.ids);
	st_tok_ids_release(&prompt);
	st_infer_model_release(&im);
	free(stdin_buf);
	free(o.kv);
	free(user);
	return rc;
}
