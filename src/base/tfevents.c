/*
 * tfevents.c - TensorBoard event files (tfevents.h).
 *
 * The few protobuf messages TensorBoard needs are encoded by hand: tensorflow
 * Event, Summary, Summary.Value, SummaryMetadata.PluginData, TensorProto and
 * TensorShapeProto (the .proto files in tensorboard/compat/proto), field numbers below.
 * Each message is encoded twice, first to count its bytes (a writer with no
 * buffer), then into place, so nested lengths need no second buffer.
 */
#include "base/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/array.h"
#include "base/crc.h"
#include "base/err.h"
#include "base/file.h"
#include "base/path.h"

/* ---- protobuf encoding ---- */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1 };
enum { VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2, VALUE_TENSOR = 8, VALUE_METADATA = 9 };
enum { METADATA_PLUGIN_DATA = 1, PLUGIN_NAME = 1 };
enum { TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8, DT_STRING = 7 };

/* Bytes go to p[0..cap); n counts every byte, stored or not. */
typedef struct pb {
	unsigned char *p;
	size_t cap, n;
} pb;

static void put_bytes(pb *b, const void *d, size_t n)
{
	if (b->n <= b->cap && n <= b->cap - b->n && n)
		memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void put_byte(pb *b, unsigned char c) { put_bytes(b, &c, 1); }

static void put_varint(pb *b, uint64_t v)
{
	for (; v >= 0x80; v >>= 7)
		put_byte(b, (unsigned char)(v | 0x80));
	put_byte(b, (unsigned char)v);
}

static void put_tag(pb *b, int field, int wire) { put_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_le(pb *b, uint64_t v, int nbytes)
{
	for (int i = 0; i < nbytes; i++)
		put_byte(b, (unsigned char)(v >> (8 * i)));
}

static void put_string(pb *b, int field, const char *s, size_t n)
{
	put_tag(b, field, WIRE_LEN);
	put_varint(b, n);
	put_bytes(b, s, n);
}

/* A nested message: its length, counted by running enc once without output. */
typedef void (*encode_fn)(pb *b, const void *arg);

static void put_message(pb *b, int field, encode_fn enc, const void *arg)
{
	pb count = {0};
	enc(&count, arg);
	put_tag(b, field, WIRE_LEN);
	put_varint(b, count.n);
	enc(b, arg);
}

/* proto3 leaves out fields at their default value, as Python's serializer does. */
static void event_head(pb *b, double wall_time, int64_t step)
{
	uint64_t bits;
	memcpy(&bits, &wall_time, sizeof(bits));
	if (bits) {
		put_tag(b, EVENT_WALL_TIME, WIRE_FIXED64);
		put_le(b, bits, 8);
	}
	if (step) {
		put_tag(b, EVENT_STEP, WIRE_VARINT);
		put_varint(b, (uint64_t)step);
	}
}

typedef struct value_arg {
	const char *tag;
	float value;      /* scalar */
	const char *text; /* text summary, else NULL */
} value_arg;

static void enc_plugin_data(pb *b, const void *arg)
{
	(void)arg;
	put_string(b, PLUGIN_NAME, "text", 4);
}

static void enc_metadata(pb *b, const void *arg) { put_message(b, METADATA_PLUGIN_DATA, enc_plugin_data, arg); }

static void enc_empty(pb *b, const void *arg)
{
	(void)b;
	(void)arg;
}

/* A scalar string tensor (shape present and empty, as make_tensor_proto sets it). */
static void enc_string_tensor(pb *b, const void *arg)
{
	const char *text = arg;
	put_tag(b, TENSOR_DTYPE, WIRE_VARINT);
	put_varint(b, DT_STRING);
	put_message(b, TENSOR_SHAPE, enc_empty, NULL);
	put_string(b, TENSOR_STRING_VAL, text, strlen(text));
}

static void enc_value(pb *b, const void *arg)
{
	const value_arg *v = arg;
	size_t n = strlen(v->tag);
	if (n)
		put_string(b, VALUE_TAG, v->tag, n);
	if (!v->text) {
		uint32_t bits;
		memcpy(&bits, &v->value, sizeof(bits));
		put_tag(b, VALUE_SIMPLE_VALUE, WIRE_FIXED32);
		put_le(b, bits, 4);
		return;
	}
	put_message(b, VALUE_TENSOR, enc_string_tensor, v->text);
	put_message(b, VALUE_METADATA, enc_metadata, NULL);
}

static void enc_summary(pb *b, const void *arg) { put_message(b, SUMMARY_VALUE, enc_value, arg); }

size_t st_tfevent_encode_version(unsigned char *out, size_t cap, double wall_time)
{
	pb b = {out, cap, 0};
	event_head(&b, wall_time, 0);
	put_string(&b, EVENT_FILE_VERSION, "brain.Event:2", 13);
	return b.n;
}

static size_t encode_value_event(unsigned char *out, size_t cap, double wall_time, int64_t step, const value_arg *v)
{
	pb b = {out, cap, 0};
	event_head(&b, wall_time, step);
	put_message(&b, EVENT_SUMMARY, enc_summary, v);
	return b.n;
}

size_t st_tfevent_encode_scalar(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag,
				float value)
{
	value_arg v = {tag, value, NULL};
	return encode_value_event(out, cap, wall_time, step, &v);
}

size_t st_tfevent_encode_text(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag,
			      const char *text)
{
	value_arg v = {tag, 0, text};
	return encode_value_event(out, cap, wall_time, step, &v);
}

/* ---- TFRecord framing ---- */

uint32_t st_tfrecord_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

size_t st_tfrecord_frame(unsigned char *out, const void *data, size_t n)
{
	for (int i = 0; i < 8; i++)
		out[i] = (unsigned char)((uint64_t)n >> (8 * i));
	le32(out + 8, st_tfrecord_mask_crc(st_crc32c(0, out, 8)));
	if (n)
		memmove(out + 12, data, n);
	le32(out + 12 + n, st_tfrecord_mask_crc(st_crc32c(0, out + 12, n)));
	return 16 + n;
}

/* ---- the writer ---- */

struct st_tfevents {
	int fd;
	int err; /* sticky: the first failure's code, its message in errmsg */
	char errmsg[600];
	unsigned char *buf; /* framed records not yet written */
	size_t len, cap;
	char path[ST_PATH_MAX];
};

#define FILE_PREFIX "events.out.tfevents."

static double wall_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int sticky(st_tfevents *w, int rc)
{
	if (!w->err) {
		w->err = rc;
		snprintf(w->errmsg, sizeof(w->errmsg), "%s", st_errmsg());
	}
	return rc;
}

static int check_sticky(st_tfevents *w)
{
	return w->err ? st_fail(w->err, "%s", w->errmsg) : 0;
}

/* Frame an event encoded by enc (called to count, then to write) onto the buffer. */
typedef size_t (*event_fn)(unsigned char *out, size_t cap, const void *arg);

static int append(st_tfevents *w, event_fn enc, const void *arg)
{
	int rc = check_sticky(w);
	if (rc < 0)
		return rc;
	size_t n = enc(NULL, 0, arg);
	if (n > SIZE_MAX / 2 || (rc = st_array_reserve(&w->buf, &w->cap, w->len + n + 16, 1, 4096)) < 0)
		return sticky(w, st_fail(ST_ENOMEM, "TensorBoard event of %zu bytes: out of memory", n));
	unsigned char *rec = w->buf + w->len;
	enc(rec + 12, n, arg); /* in place: framing moves nothing */
	w->len += st_tfrecord_frame(rec, rec + 12, n);
	return 0;
}

typedef struct event_args {
	double wall_time;
	int64_t step;
	value_arg v;
} event_args;

static size_t enc_version_event(unsigned char *out, size_t cap, const void *arg)
{
	return st_tfevent_encode_version(out, cap, ((const event_args *)arg)->wall_time);
}

static size_t enc_value_event(unsigned char *out, size_t cap, const void *arg)
{
	const event_args *a = arg;
	return encode_value_event(out, cap, a->wall_time, a->step, &a->v);
}

int st_tfevents_scalar(st_tfevents *w, int64_t step, const char *tag, double value)
{
	event_args a = {wall_now(), step, {tag, (float)value, NULL}};
	return append(w, enc_value_event, &a);
}

int st_tfevents_text(st_tfevents *w, int64_t step, const char *tag, const char *text)
{
	event_args a = {wall_now(), step, {tag, 0, text}};
	return append(w, enc_value_event, &a);
}

int st_tfevents_flush(st_tfevents *w)
{
	int rc = check_sticky(w);
	if (rc < 0)
		return rc;
	size_t off = 0;
	while (off < w->len) {
		ssize_t k = write(w->fd, w->buf + off, w->len - off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return sticky(w, st_fail(ST_EIO, "cannot write TensorBoard event file %s: %s", w->path,
						 k < 0 ? strerror(errno) : "no progress"));
		off += (size_t)k;
	}
	w->len = 0;
	return 0;
}

/* The largest <seconds> of the event files already in dir, or -1. */
static long long newest_second(const char *dir)
{
	long long best = -1;
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	struct dirent *e;
	size_t np = strlen(FILE_PREFIX);
	while ((e = readdir(d))) {
		const char *s = e->d_name;
		if (strncmp(s, FILE_PREFIX, np) != 0)
			continue;
		s += np;
		long long v = 0;
		int k = 0;
		for (; k < 10 && s[k] >= '0' && s[k] <= '9'; k++)
			v = v * 10 + (s[k] - '0');
		if (k == 10 && v > best)
			best = v;
	}
	closedir(d);
	return best;
}

int st_tfevents_open(st_tfevents **out, const char *dir)
{
	static int writers; /* this process's writers so far: the name's last part */
	*out = NULL;
	if (!dir || !*dir)
		return st_fail(ST_EINVAL, "TensorBoard directory: empty path");
	int rc = st_mkdir_p(dir);
	if (rc < 0) {
		return st_wrap(rc, "cannot create the TensorBoard directory");
	}
	st_tfevents *w = calloc(1, sizeof(*w));
	if (!w)
		return st_fail(ST_ENOMEM, "out of memory (TensorBoard writer)");
	w->fd = -1;
	char host[256] = "localhost";
	if (gethostname(host, sizeof(host)) < 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	host[sizeof(host) - 1] = '\0';
	for (char *p = host; *p; p++)
		if (*p == '/')
			*p = '_';
	long long secs = (long long)time(NULL), newest = newest_second(dir);
	if (newest >= secs)
		secs = newest + 1;
	for (int tries = 0; tries < 100 && w->fd < 0; tries++) {
		int n = snprintf(w->path, sizeof(w->path), "%s/" FILE_PREFIX "%010lld.%s.%d.%d", dir, secs, host,
				 (int)getpid(), __atomic_fetch_add(&writers, 1, __ATOMIC_RELAXED));
		if (n < 0 || (size_t)n >= sizeof(w->path)) {
			free(w);
			return st_fail(ST_EINVAL, "TensorBoard directory path is too long: %s", dir);
		}
		w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
		if (w->fd < 0 && errno != EEXIST) {
			rc = st_fail(ST_EIO, "cannot create TensorBoard event file %s: %s", w->path, strerror(errno));
			free(w);
			return rc;
		}
	}
	if (w->fd < 0) {
		free(w);
		return st_fail(ST_EIO, "cannot create a new TensorBoard event file in %s (every name taken)", dir);
	}
	event_args a = {.wall_time = wall_now()};
	if ((rc = append(w, enc_version_event, &a)) < 0 || (rc = st_tfevents_flush(w)) < 0) {
		st_tfevents_close(w);
		return rc;
	}
	*out = w;
	return 0;
}

const char *st_tfevents_path(const st_tfevents *w) { return w->path; }

int st_tfevents_close(st_tfevents *w)
{
	if (!w)
		return 0;
	int rc = w->err ? 0 : st_tfevents_flush(w);
	if (w->fd >= 0 && close(w->fd) < 0 && rc == 0 && !w->err)
		rc = st_fail(ST_EIO, "cannot close TensorBoard event file %s: %s", w->path, strerror(errno));
	if (w->err)
		rc = st_fail(w->err, "%s", w->errmsg);
	free(w->buf);
	free(w);
	return rc;
}
