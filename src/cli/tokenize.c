/*
 * tokenize.c - slicetrain tokenize: text files and JSON lines -> one llm.c
 * .bin token file (src/text/tokenizer.h encodes, src/data/tokfile.h writes).
 *
 * Work goes in batches of about BATCH_BYTES of input: the main thread cuts
 * the inputs into units (a piece of CHUNK_BYTES of a text document, or a
 * group of JSON lines), OpenMP threads encode the units (each thread its
 * own st_tok_state), then the main thread writes the units' ids in input
 * order. Units never depend on the thread count, and a text document cut
 * into pieces is stitched exactly (st_tokenizer_encode_span: a piece whose
 * start was not a boundary of the whole document's encoding is encoded
 * again from the boundary the piece before it ended on), so the output is
 * the same bytes for any --threads.
 *
 * Errors stop everything before the file is committed: the first failing
 * unit in input order is reported (exit 2 for bad input), and the
 * temporary file is removed, as on SIGINT/SIGTERM (exit 128+N). No file
 * appears under the output name unless the whole input was tokenized.
 */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <omp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/status.h"
#include "base/file.h"
#include "config/config.h"
#include "data/tokfile.h"
#include "text/tokenizer.h"

static const char tokenize_usage[] =
	"usage: slicetrain tokenize [CONFIG.yml] [key=value ...] -o OUT.bin [options] INPUT...\n"
	"\n"
	"Encodes text with a Hugging Face tokenizer.json (byte-level BPE: Llama 3, GPT-2;\n"
	"ids equal to Hugging Face tokenizers') into one llm.c .bin token file, the format\n"
	"dataset_type=tokens reads (docs/data.md): uint16 ids for vocabularies up to 65536,\n"
	"uint32 above. Each document is preceded by BOS and followed by EOS (add_bos,\n"
	"add_eos). The output is written to OUT.bin.tmp.PID and renamed when all is done:\n"
	"an error or a signal leaves no OUT.bin.\n"
	"\n"
	"INPUT: a text file (one document), or JSON lines (*.jsonl, *.json, *.ndjson: one\n"
	"document per line, its text in the field --text-field; blank lines are skipped).\n"
	"Input must be UTF-8.\n"
	"\n"
	"config keys (MaxText's; from CONFIG.yml, default the embedded default job's, or key=value):\n"
	"  tokenizer_path=PATH   the tokenizer.json (required)\n"
	"  add_bos=true|false    BOS before each document (default true)\n"
	"  add_eos=true|false    EOS after each document (default true)\n"
	"options:\n"
	"  -o, --output OUT.bin  the token file to write\n"
	"  --text-field NAME     JSON lines: the field with the text (default: text)\n"
	"  --format auto|text|jsonl  how to read the INPUTs (default auto: by their names)\n"
	"  --bos TOKEN, --eos TOKEN  the tokens to use (default: <|begin_of_text|> and\n"
	"                        <|end_of_text|>, else <s> and </s>, else <|endoftext|>)\n"
	"  --threads N           encoding threads (default: OMP_NUM_THREADS, else all cores);\n"
	"                        the output is the same for any N\n"
	"  --quiet               no progress line\n"
	"\n"
	"Progress goes to stderr (a live line on a terminal), the summary to stdout:\n"
	"documents, tokens, tokens/s.\n"
	"\n"
	"example (the default job's held-out text, then 20 steps on it):\n"
	"  slicetrain tokenize tokenizer_path=data/default/tokenizer.json -o eval-tokens.bin data/default/eval.jsonl\n"
	"  slicetrain train configs/base.yml model_name=llama3-16m dataset_type=tokens \\\n"
	"      dataset_path=eval-tokens.bin max_target_length=128 per_device_batch_size=4 steps=20\n";

#define CHUNK_BYTES ((size_t)256 << 10) /* a text document is encoded in pieces of this size */
#define LINES_BYTES ((size_t)64 << 10)  /* JSON lines go to threads in groups of this size */
#define BATCH_BYTES ((size_t)8 << 20)   /* input encoded between two writes */

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

struct input {
	const char *path;
	char *data;
	size_t len;
	int mapped, jsonl;
};

enum unit_kind { UNIT_CHUNK, UNIT_LINES };

struct unit {
	enum unit_kind kind;
	struct input *in;
	const char *text; /* chunk: the whole document; lines: the first line */
	size_t len;
	size_t start, stop; /* chunk: its part of the document */
	int first, last;    /* chunk: the first / last of its document */
	int64_t line0;      /* lines: number of the first line */
	/* filled by the worker */
	st_tok_ids ids;
	size_t end;   /* chunk: where its span ended */
	int64_t docs; /* lines: documents */
	int rc;
	char *err;
};

struct job {
	st_tokenizer *tok;
	st_tok_state **states;
	int nthreads;
	int add_bos, add_eos;
	int32_t bos, eos;
	const char *field;
	st_tokfile_writer out;
	/* the batch */
	struct unit *u;
	size_t nu, cap;
	size_t batch_bytes;
	/* the text document being stitched */
	size_t doc_pos;
	/* counts */
	int64_t docs, tokens, bytes_done, bytes_total;
	int32_t max_id;
	double t0, last_progress;
	int progress, tty, progress_shown;
};

/* ---- errors of one unit ---- */

__attribute__((format(printf, 3, 4))) static void unit_fail(struct unit *u, int rc, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	u->rc = rc;
	u->err = strdup(msg);
}

static int64_t line_of(const char *text, size_t off)
{
	int64_t line = 1;
	for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + off - p))) != NULL; p++)
		line++;
	return line;
}

/* ---- workers ---- */

static void run_chunk(struct job *j, struct unit *u, st_tok_state *s)
{
	int rc = st_tokenizer_encode_span(s, u->text, u->len, u->start, u->stop, &u->ids, &u->end);
	if (rc < 0)
		unit_fail(u, rc, "%s: %s", u->in->path, st_errmsg());
}

static const char *json_kind(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_INTEGER: case JSON_REAL: return "a number";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	default: return "a string";
	}
}

static int add_id(st_tok_ids *ids, int32_t id)
{
	int rc = st_tok_ids_reserve(ids, 1);
	if (rc == 0)
		ids->v[ids->n++] = id;
	return rc;
}

static void run_lines(struct job *j, struct unit *u, st_tok_state *s)
{
	const char *p = u->text, *end = u->text + u->len;
	int64_t line = u->line0;
	for (; p < end; line++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		const char *q = p;
		p += n + 1;
		size_t k = 0;
		while (k < n && (q[k] == ' ' || q[k] == '\t' || q[k] == '\r'))
			k++;
		if (k == n)
			continue; /* a blank line */
		json_error_t jerr;
		json_t *obj = json_loadb(q, n, JSON_ALLOW_NUL, &jerr);
		if (!obj) {
			unit_fail(u, ST_EINVAL, "%s:%" PRId64 ": not a JSON line: %s (column %d)", u->in->path, line,
				  jerr.text, jerr.column);
			return;
		}
		const json_t *v = json_is_object(obj) ? json_object_get(obj, j->field) : NULL;
		if (!json_is_object(obj))
			unit_fail(u, ST_EINVAL, "%s:%" PRId64 ": the line is %s, not a JSON object", u->in->path, line,
				  json_kind(obj));
		else if (!v)
			unit_fail(u, ST_EINVAL, "%s:%" PRId64 ": no field '%s' (set the field with --text-field)",
				  u->in->path, line, j->field);
		else if (!json_is_string(v))
			unit_fail(u, ST_EINVAL, "%s:%" PRId64 ": field '%s' is %s, not a string", u->in->path, line,
				  j->field, json_kind(v));
		int rc = u->rc;
		if (rc == 0 && j->add_bos)
			rc = add_id(&u->ids, j->bos);
		if (rc == 0 && (rc = st_tokenizer_encode(s, json_string_value(v), json_string_length(v), &u->ids)) < 0)
			unit_fail(u, rc, "%s:%" PRId64 ": %s", u->in->path, line, st_errmsg());
		if (rc == 0 && j->add_eos)
			rc = add_id(&u->ids, j->eos);
		json_decref(obj);
		if (rc < 0) {
			if (!u->err)
				unit_fail(u, rc, "%s", st_errmsg());
			return;
		}
		u->docs++;
	}
}

/* ---- the main thread: batches ---- */

static void show_progress(struct job *j, int final)
{
	double now = st_mono_s();
	if (!j->progress || (!final && now - j->last_progress < (j->tty ? 0.25 : 10.0)))
		return;
	if (!j->tty && !j->progress_shown && now - j->t0 < 3.0)
		return;
	j->last_progress = now;
	double secs = now - j->t0;
	char line[256];
	snprintf(line, sizeof(line), "tokenize: %.1f of %.1f MB (%.0f%%), %" PRId64 " documents, %" PRId64
		 " tokens, %.1f MB/s", (double)j->bytes_done / 1e6, (double)j->bytes_total / 1e6,
		 j->bytes_total ? 100.0 * (double)j->bytes_done / (double)j->bytes_total : 100.0, j->docs, j->tokens,
		 secs > 0 ? (double)j->bytes_done / 1e6 / secs : 0.0);
	if (j->tty)
		fprintf(stderr, "\r\033[Kslicetrain: %s%s", line, final ? "\n" : "");
	else
		fprintf(stderr, "slicetrain: %s\n", line);
	j->progress_shown = 1;
}

static int put_ids(struct job *j, const int32_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] > j->max_id)
			j->max_id = ids[i];
	j->tokens += (int64_t)n;
	return st_tokfile_writer_put(&j->out, ids, n);
}

/* Write a chunk's ids, stitched to the chunk before it (see the top of the file). */
static int write_chunk(struct job *j, struct unit *u)
{
	int rc;
	if (u->first) {
		j->doc_pos = 0;
		if (j->add_bos && (rc = put_ids(j, &j->bos, 1)) < 0)
			return rc;
	}
	if (j->doc_pos == u->start) {
		if ((rc = put_ids(j, u->ids.v, u->ids.n)) < 0)
			return rc;
		j->doc_pos = u->end;
	} else if (j->doc_pos < u->start) {
		ST_BUG("tokenize: a span ended at %zu, before the next one's start %zu", j->doc_pos, u->start);
	} else if (j->doc_pos < u->stop || u->last) {
		/* the chunk before ran past our start: our start was not a boundary */
		st_tok_ids ids = ST_TOK_IDS_INIT;
		size_t end;
		rc = st_tokenizer_encode_span(j->states[0], u->text, u->len, j->doc_pos, u->stop, &ids, &end);
		if (rc == 0)
			rc = put_ids(j, ids.v, ids.n);
		st_tok_ids_release(&ids);
		if (rc < 0)
			return rc;
		j->doc_pos = end;
	} /* else the whole chunk lies inside a piece of the chunk before */
	if (u->last) {
		if (j->doc_pos != u->len)
			ST_BUG("tokenize: a document's last span ended at %zu of %zu", j->doc_pos, u->len);
		if (j->add_eos && (rc = put_ids(j, &j->eos, 1)) < 0)
			return rc;
		j->docs++;
	}
	return 0;
}

static int run_batch(struct job *j)
{
	int rc = 0;
	long n = (long)j->nu;
#pragma omp parallel for schedule(dynamic, 1) num_threads(j->nthreads)
	for (long i = 0; i < n; i++) {
		struct unit *u = &j->u[i];
		if (got_signal)
			continue;
		st_tok_state *s = j->states[omp_get_thread_num()];
		if (u->kind == UNIT_CHUNK)
			run_chunk(j, u, s);
		else
			run_lines(j, u, s);
	}
	for (size_t i = 0; i < j->nu && rc == 0; i++) {
		struct unit *u = &j->u[i];
		if (got_signal)
			break;
		if (u->rc < 0) {
			rc = st_fail(u->rc, "%s", u->err ? u->err : "failed");
		} else if (u->kind == UNIT_CHUNK) {
			rc = write_chunk(j, u);
		} else {
			rc = put_ids(j, u->ids.v, u->ids.n);
			j->docs += u->docs;
		}
		j->bytes_done += (int64_t)(u->kind == UNIT_LINES ? u->len : u->stop - u->start);
	}
	for (size_t i = 0; i < j->nu; i++) {
		st_tok_ids_release(&j->u[i].ids);
		free(j->u[i].err);
	}
	j->nu = 0;
	j->batch_bytes = 0;
	if (rc == 0)
		show_progress(j, 0);
	return rc;
}

static int add_unit(struct job *j, const struct unit *u, size_t bytes)
{
	if (j->nu == j->cap) {
		size_t cap = j->cap ? 2 * j->cap : 256;
		struct unit *v = realloc(j->u, cap * sizeof(*v));
		if (!v)
			return st_fail(ST_ENOMEM, "out of memory");
		j->u = v;
		j->cap = cap;
	}
	j->u[j->nu++] = *u;
	j->batch_bytes += bytes;
	return j->batch_bytes >= BATCH_BYTES ? run_batch(j) : 0;
}

/* A place near want to cut a text document: after a newline, before a
 * printable ASCII character (a piece boundary for Llama 3's and GPT-2's
 * regexes, and a good guess for others: st_tokenizer_encode_span checks). */
static size_t cut_near(const char *t, size_t len, size_t want)
{
	size_t limit = want + CHUNK_BYTES / 2 < len ? want + CHUNK_BYTES / 2 : len;
	for (size_t i = want; i + 1 < limit; i++)
		if (t[i] == '\n' && t[i + 1] > ' ' && t[i + 1] < 0x7f)
			return i + 1;
	for (size_t i = want; i + 1 < limit; i++) /* a space before a letter */
		if (t[i] == ' ' && ((t[i + 1] | 0x20) >= 'a' && (t[i + 1] | 0x20) <= 'z'))
			return i;
	size_t i = want; /* a character boundary */
	while (i < len && ((unsigned char)t[i] & 0xc0) == 0x80)
		i++;
	return i;
}

static int add_text(struct job *j, struct input *in)
{
	size_t bad;
	if (st_utf8_check(in->data, in->len, &bad) < 0)
		return st_fail(ST_EINVAL, "%s:%" PRId64 ": invalid UTF-8 at byte %zu of the file", in->path,
			       line_of(in->data, bad), bad);
	int split = st_tokenizer_resumable(j->tok);
	size_t start = 0;
	int rc = 0;
	while (rc == 0) {
		size_t stop = split && in->len - start > CHUNK_BYTES + CHUNK_BYTES / 2 ? cut_near(in->data, in->len, start + CHUNK_BYTES)
										    : in->len;
		struct unit u = {.kind = UNIT_CHUNK, .in = in, .text = in->data, .len = in->len, .start = start,
				 .stop = stop, .first = start == 0, .last = stop == in->len};
		rc = add_unit(j, &u, stop - start);
		if (stop == in->len)
			break;
		start = stop;
	}
	return rc;
}

static int add_jsonl(struct job *j, struct input *in)
{
	const char *p = in->data, *end = in->data + in->len;
	int64_t line = 1;
	int rc = 0, any = 0;
	while (p < end && rc == 0) {
		const char *q = p;
		int64_t lines = 0;
		while (q < end && (q - p < (ptrdiff_t)LINES_BYTES || lines == 0)) {
			const char *nl = memchr(q, '\n', (size_t)(end - q));
			for (const char *c = q; !any && c < (nl ? nl : end); c++)
				any = !(*c == ' ' || *c == '\t' || *c == '\r');
			q = nl ? nl + 1 : end;
			lines++;
		}
		struct unit u = {.kind = UNIT_LINES, .in = in, .text = p, .len = (size_t)(q - p), .line0 = line};
		rc = add_unit(j, &u, u.len);
		line += lines;
		p = q;
	}
	if (rc == 0 && !any)
		return st_fail(ST_EINVAL, "%s: no JSON lines (only blank lines)", in->path);
	return rc;
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static int open_input(struct input *in)
{
	struct stat st;
	/* non-blocking: a FIFO with no writer yet must not hold the open
	 * against SIGINT/SIGTERM (the pipe loop below waits in ppoll) */
	int fd = open(in->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return st_fail(errno == ENOENT ? ST_EINVAL : ST_EIO, "%s: cannot open: %s", in->path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		int rc = st_fail(ST_EIO, "%s: cannot stat: %s", in->path, strerror(errno));
		close(fd);
		return rc;
	}
	if (S_ISDIR(st.st_mode)) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: is a directory", in->path);
	}
	if (S_ISREG(st.st_mode) && st.st_size > 0) {
		in->len = (size_t)st.st_size;
		in->data = mmap(NULL, in->len, PROT_READ, MAP_PRIVATE, fd, 0);
		close(fd);
		if (in->data == MAP_FAILED) {
			in->data = NULL;
			return st_fail(ST_EIO, "%s: cannot map: %s", in->path, strerror(errno));
		}
		in->mapped = 1;
		madvise(in->data, in->len, MADV_SEQUENTIAL);
		return 0;
	}
	if (S_ISREG(st.st_mode)) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: empty file", in->path);
	}
	/* A pipe: read it whole. SIGINT and SIGTERM stay blocked except inside
	 * ppoll, so one that comes between the check of got_signal and the
	 * wait still ends the wait (a read could block past it). */
	size_t cap = 0;
	int rc = 0;
	sigset_t stop, old;
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigprocmask(SIG_BLOCK, &stop, &old);
	for (;;) {
		if (in->len == cap) {
			char *p = realloc(in->data, cap = cap ? 2 * cap : (size_t)1 << 20);
			if (!p) {
				rc = st_fail(ST_ENOMEM, "out of memory");
				break;
			}
			in->data = p;
		}
		if (got_signal)
			break;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (ppoll(&pf, 1, NULL, &old) < 0) {
			if (errno == EINTR)
				continue;
			rc = st_fail(ST_EIO, "%s: cannot wait for input: %s", in->path, strerror(errno));
			break;
		}
		ssize_t r = read(fd, in->data + in->len, cap - in->len);
		if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		if (r < 0) {
			rc = st_fail(ST_EIO, "%s: cannot read: %s", in->path, strerror(errno));
			break;
		}
		if (r == 0)
			break;
		in->len += (size_t)r;
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(fd);
	if (rc == 0 && in->len == 0)
		rc = st_fail(ST_EINVAL, "%s: empty input", in->path);
	return rc;
}

static void close_input(struct input *in)
{
	if (in->mapped)
		munmap(in->data, in->len);
	else
		free(in->data);
	in->data = NULL;
	in->mapped = 0;
}

/* ---- the command line ---- */

struct opts {
	const char *output, *field, *format, *bos, *eos;
	int threads, quiet;
};

/* A string option: "--name VALUE" or "--name=VALUE" (short: "-o VALUE"). 1 taken, 0 not this option. */
static int string_option(const char *name, const char *alias, int argc, char **argv, int *i, const char **out)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (!strncmp(a, name, n) && a[n] == '=') {
		*out = a + n + 1;
		return 1;
	}
	if (strcmp(a, name) && !(alias && !strcmp(a, alias)))
		return 0;
	if (*i + 1 >= argc)
		return st_fail(ST_EINVAL, "%s needs a value", name);
	*out = argv[++*i];
	return 1;
}

/* "key=value" with a config key's shape (a file name with '=' in it is an INPUT). */
static int is_override(const char *a)
{
	const char *eq = strchr(a, '=');
	if (!eq || eq == a)
		return 0;
	for (const char *p = a; p < eq; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (p > a && *p >= '0' && *p <= '9')))
			return 0;
	return 1;
}

static int usage_error(const char *msg)
{
	fprintf(stderr, "slicetrain: error: %s (see slicetrain tokenize --help)\n", msg);
	return 2;
}

/* The token named by an option, else the one slicetrain knows by name (dflt). */
static int32_t pick_token(const st_tokenizer *t, const char *given, int32_t (*dflt)(const st_tokenizer *))
{
	return given ? st_tokenizer_id(t, given, strlen(given)) : dflt(t);
}

static int resolve_bos_eos(struct job *j, const struct opts *o, const char *tok_path)
{
	if (j->add_bos) {
		j->bos = pick_token(j->tok, o->bos, st_tokenizer_bos);
		if (j->bos < 0)
			return o->bos ? st_fail(ST_EINVAL, "%s has no token '%s' (--bos)", tok_path, o->bos)
				      : st_fail(ST_EINVAL, "%s has none of the BOS tokens slicetrain knows (<|begin_of_text|>, "
							"<s>, <|startoftext|>, <|endoftext|>): name one with --bos TOKEN, or "
							"set add_bos=false", tok_path);
	}
	if (j->add_eos) {
		j->eos = pick_token(j->tok, o->eos, st_tokenizer_eos);
		if (j->eos < 0)
			return o->eos ? st_fail(ST_EINVAL, "%s has no token '%s' (--eos)", tok_path, o->eos)
				      : st_fail(ST_EINVAL, "%s has none of the EOS tokens slicetrain knows (<|end_of_text|>, "
							"</s>, <|endoftext|>): name one with --eos TOKEN, or set add_eos=false",
						tok_path);
	}
	return 0;
}

static int tokenize_all(struct job *j, struct input *in, int nin, const char *format)
{
	int rc = 0;
	for (int i = 0; i < nin && rc == 0 && !got_signal; i++) {
		if ((rc = open_input(&in[i])) < 0)
			break;
		j->bytes_total += (int64_t)in[i].len;
		in[i].jsonl = !strcmp(format, "jsonl") ||
			      (!strcmp(format, "auto") && (has_suffix(in[i].path, ".jsonl") || has_suffix(in[i].path, ".json") ||
							   has_suffix(in[i].path, ".ndjson")));
	}
	for (int i = 0; i < nin && rc == 0 && !got_signal; i++) {
		rc = in[i].jsonl ? add_jsonl(j, &in[i]) : add_text(j, &in[i]);
		/* inputs before the one being batched are done with */
		for (int k = 0; rc == 0 && k <= i && j->nu == 0; k++)
			if (in[k].data)
				close_input(&in[k]);
	}
	if (rc == 0 && !got_signal)
		rc = run_batch(j);
	return rc;
}

int st_cmd_tokenize(int argc, char **argv)
{
	struct opts o = {.field = "text", .format = "auto"};
	const st_cli_opt cli_opts[] = {
		{.name = "--threads", .kind = ST_CLI_INT, .value = &o.threads, .min = 1, .max = 1024, .joined = 1},
		{.name = "--quiet", .kind = ST_CLI_FLAG, .value = &o.quiet},
		{0},
	};
	const char *config = NULL;
	char **kv = calloc((size_t)argc + 1, sizeof(char *));
	struct input *in = calloc((size_t)argc + 1, sizeof(*in));
	st_config *c = calloc(1, sizeof(*c));
	int nkv = 0, nin = 0, rc;
	struct job j = {.out = ST_TOKFILE_WRITER_INIT, .max_id = -1};
	char msg[600];

	if (!kv || !in || !c) {
		fprintf(stderr, "slicetrain: error: out of memory\n");
		rc = 1;
		goto out;
	}
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (st_cli_is_help(a)) {
			fputs(tokenize_usage, stdout);
			rc = 0;
			goto out;
		}
		if ((rc = string_option("--output", "-o", argc, argv, &i, &o.output)) ||
		    (rc = string_option("--text-field", NULL, argc, argv, &i, &o.field)) ||
		    (rc = string_option("--format", NULL, argc, argv, &i, &o.format)) ||
		    (rc = string_option("--bos", NULL, argc, argv, &i, &o.bos)) ||
		    (rc = string_option("--eos", NULL, argc, argv, &i, &o.eos)) ||
		    (rc = st_cli_option(cli_opts, argc, argv, &i))) {
			if (rc < 0) {
				rc = usage_error(st_errmsg());
				goto out;
			}
			continue;
		}
		if (a[0] == '-' && a[1]) {
			static const char *const own[] = {"--output", "--text-field", "--format", "--bos", "--eos", NULL};
			const char *hint = st_cli_suggest_option(cli_opts, own, a);
			snprintf(msg, sizeof(msg), "unknown option '%.200s'%s%.40s%s", a, hint ? "; did you mean '" : "",
				 hint ? hint : "", hint ? "'?" : "");
			rc = usage_error(msg);
			goto out;
		}
		if (!config && !nkv && !nin && !strchr(a, '=') && (has_suffix(a, ".yml") || has_suffix(a, ".yaml")))
			config = a;
		else if (is_override(a))
			kv[nkv++] = argv[i];
		else
			in[nin++].path = a;
	}
	if (!o.output) {
		rc = usage_error("tokenize needs -o OUT.bin");
		goto out;
	}
	if (!nin) {
		rc = usage_error("tokenize needs at least one INPUT file");
		goto out;
	}
	if (strcmp(o.format, "auto") && strcmp(o.format, "text") && strcmp(o.format, "jsonl")) {
		snprintf(msg, sizeof(msg), "--format '%.100s' is not auto, text or jsonl", o.format);
		rc = usage_error(msg);
		goto out;
	}
	if (!*o.field) {
		rc = usage_error("--text-field needs a name");
		goto out;
	}

	/* the config: tokenizer_path, add_bos, add_eos (MaxText's keys) */
	char path[PATH_MAX + 16];
	const char *dir = st_cli_use_config_dir();
	snprintf(path, sizeof(path), "%s", config ? config : "");
	if (!config)
		snprintf(path, sizeof(path), "%s/default.yml", dir);
	if ((rc = st_config_load(c, path, nkv, kv)) < 0)
		goto fail;
	if (!c->tokenizer_path[0]) {
		rc = st_fail(ST_EINVAL, "tokenize needs a tokenizer: tokenizer_path=PATH/tokenizer.json");
		goto fail;
	}
	j.add_bos = c->add_bos;
	j.add_eos = c->add_eos;
	j.field = o.field;

	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	j.t0 = st_mono_s();
	if ((rc = st_tokenizer_load(&j.tok, c->tokenizer_path)) < 0 || (rc = resolve_bos_eos(&j, &o, c->tokenizer_path)) < 0)
		goto fail;
	double t_loaded = st_mono_s();
	j.nthreads = o.threads;
	if (!j.nthreads) {
		const char *env = getenv("OMP_NUM_THREADS");
		j.nthreads = env && atoi(env) > 0 ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
		if (j.nthreads < 1)
			j.nthreads = 1;
		if (j.nthreads > 1024)
			j.nthreads = 1024;
	}
	if (!(j.states = calloc((size_t)j.nthreads, sizeof(*j.states)))) {
		rc = st_fail(ST_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < j.nthreads; i++)
		if ((rc = st_tok_state_new(&j.states[i], j.tok)) < 0)
			goto fail;
	j.progress = !o.quiet;
	j.tty = isatty(STDERR_FILENO);
	if ((rc = st_tokfile_writer_open(&j.out, o.output, st_tokenizer_vocab_size(j.tok))) < 0)
		goto fail;
	rc = tokenize_all(&j, in, nin, o.format);
	if (rc == 0 && !got_signal && j.tokens == 0)
		rc = st_fail(ST_EINVAL, "no tokens: every document is empty (and add_bos, add_eos are false)");
	if (got_signal) {
		st_tokfile_writer_abort(&j.out);
		if (j.progress_shown && j.tty)
			fputc('\n', stderr);
		fprintf(stderr, "slicetrain: tokenize stopped by signal %d; %s not written\n", (int)got_signal, o.output);
		rc = st_exit_signal(got_signal);
		goto out;
	}
	if (rc < 0)
		goto fail;
	int itemsize = j.out.itemsize;
	if ((rc = st_tokfile_writer_commit(&j.out)) < 0)
		goto fail;
	show_progress(&j, 1);
	/* rates over the encoding and writing, after the tokenizer's load */
	double now = st_mono_s(), secs = now - t_loaded;
	printf("tokenized %d file%s: %" PRId64 " documents, %" PRId64 " tokens, %.1f MB in %.2f s (%.0f tokens/s, "
	       "%.2f MB/s, %d thread%s; tokenizer loaded in %.2f s) -> %s (uint%d, ids < %d)\n",
	       nin, nin == 1 ? "" : "s", j.docs, j.tokens, (double)j.bytes_total / 1e6, secs,
	       secs > 0 ? (double)j.tokens / secs : 0.0, secs > 0 ? (double)j.bytes_total / 1e6 / secs : 0.0,
	       j.nthreads, j.nthreads == 1 ? "" : "s", t_loaded - j.t0, o.output, 8 * itemsize, j.max_id + 1);
	rc = 0;
	goto out;
fail:
	st_tokfile_writer_abort(&j.out);
	if (j.progress_shown && j.tty)
		fputc('\n', stderr);
	fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
	rc = st_exit_status(rc);
out:
	for (int i = 0; i < nin; i++)
		if (in[i].data)
			close_input(&in[i]);
	for (size_t i = 0; i < j.nu; i++) {
		st_tok_ids_release(&j.u[i].ids);
		free(j.u[i].err);
	}
	free(j.u);
	for (int i = 0; j.states && i < j.nthreads; i++)
		st_tok_state_free(j.states[i]);
	free(j.states);
	st_tokenizer_free(j.tok);
	free(kv);
	free(in);
	free(c);
	return rc;
}
