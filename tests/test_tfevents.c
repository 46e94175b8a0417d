/*
 * test_tfevents.c - src/base/tfevents.c and CRC-32C (src/base/crc.c).
 *
 * CRC-32C against published vectors (RFC 3720 B.4 and the usual "123456789");
 * st_crc32_combine (the restore's parts) against st_crc32 of the whole, at
 * every split of a buffer and with a part of 5 MB, and zlib's "123456789";
 * records byte for byte against what Python's protobuf and TensorBoard's own
 * RecordWriter produce for the same events (the bytes below were printed by
 * tensorboard 2.21.0: Event(...).SerializeToString() through
 * tensorboard.summary.writer.record_writer.RecordWriter); the writer's file
 * name, its records read back and their CRCs checked; the order of names in
 * a directory that already holds a newer file; and the errors: a directory
 * that cannot be created (a regular file in the way, a path under /proc), an
 * empty or too long path, sticky write errors (a file size limit).
 * tests/cli/tensorboard.sh reads real runs' files with TensorBoard itself.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/crc.h"
#include "base/err.h"
#include "base/tfevents.h"
#include "check.h"

static char tmpdir[] = "/tmp/test_tfevents.XXXXXX";

static const unsigned char rec_version[] = {
	0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0x10,
	0x40, 0xfc, 0x54, 0xd9, 0x41, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45, 0x76, 0x65,
	0x6e, 0x74, 0x3a, 0x32, 0x33, 0x8d, 0x2f, 0xe9};
/* Event(wall_time=1700000001.5, step=7, summary: tag "learning/loss", simple_value 3.25) */
static const unsigned char rec_scalar[] = {
	0x23, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xb0, 0x9f, 0x77, 0x43, 0x09, 0x00, 0x00, 0x60,
	0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x07, 0x2a, 0x16, 0x0a, 0x14, 0x0a, 0x0d, 0x6c, 0x65, 0x61,
	0x72, 0x6e, 0x69, 0x6e, 0x67, 0x2f, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x50, 0x40, 0xc6,
	0x4b, 0xec, 0x72};
/* Event(wall_time=1700000003.0, step=300, summary: tag "x", simple_value -0.1f): a 2-byte varint */
static const unsigned char rec_scalar300[] = {
	0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0xc0,
	0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0xac, 0x02, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 0x78, 0x15,
	0xcd, 0xcc, 0xcc, 0xbd, 0x71, 0xe4, 0x60, 0x68};
/* Event(wall_time=1700000002.0, step=12, summary: tag "run/start", text "hello":
 * tensor {dtype DT_STRING, tensor_shape {}, string_val "hello"}, metadata plugin "text") */
static const unsigned char rec_text[] = {
	0x31, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x9d, 0x83, 0x83, 0xe9, 0x09, 0x00, 0x00, 0x80,
	0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x0c, 0x2a, 0x24, 0x0a, 0x22, 0x0a, 0x09, 0x72, 0x75, 0x6e,
	0x2f, 0x73, 0x74, 0x61, 0x72, 0x74, 0x42, 0x0b, 0x08, 0x07, 0x12, 0x00, 0x42, 0x05, 0x68, 0x65,
	0x6c, 0x6c, 0x6f, 0x4a, 0x08, 0x0a, 0x06, 0x0a, 0x04, 0x74, 0x65, 0x78, 0x74, 0xea, 0xac, 0x3d,
	0x81};

static void test_crc32c(void)
{
	unsigned char buf[32];
	CHECK(st_crc32c(0, "123456789", 9) == 0xE3069283u);
	CHECK(st_crc32c(0, "", 0) == 0);
	memset(buf, 0, sizeof(buf));
	CHECK(st_crc32c(0, buf, 32) == 0x8A9136AAu); /* RFC 3720 B.4 */
	memset(buf, 0xff, sizeof(buf));
	CHECK(st_crc32c(0, buf, 32) == 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)i;
	CHECK(st_crc32c(0, buf, 32) == 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		buf[i] = (unsigned char)(31 - i);
	CHECK(st_crc32c(0, buf, 32) == 0x113FDB5Cu);
	/* chained in parts == in one piece */
	CHECK(st_crc32c(st_crc32c(0, buf, 13), buf + 13, 19) == st_crc32c(0, buf, 32));
	/* and not zlib's polynomial */
	CHECK(st_crc32(0, "123456789", 9) == 0xCBF43926u);
	CHECK(st_tfrecord_mask_crc(0) == 0xa282ead8u);
}

/* Encode with enc, frame, compare with the bytes TensorBoard's writer made. */
static void check_record(const char *what, const unsigned char *want, size_t want_len, size_t n_event,
			 const unsigned char *event)
{
	unsigned char out[256];
	CHECK_MSG(16 + n_event == want_len, "%s: event %zu bytes, record %zu", what, n_event, want_len);
	if (16 + n_event != want_len || want_len > sizeof(out))
		return;
	size_t n = st_tfrecord_frame(out, event, n_event);
	CHECK(n == want_len);
	CHECK_MSG(memcmp(out, want, want_len) == 0, "%s: record differs from TensorBoard's", what);
}

static void test_encoding(void)
{
	unsigned char ev[256];
	size_t n = st_tfevent_encode_version(ev, sizeof(ev), 1700000000.25);
	check_record("file_version", rec_version, sizeof(rec_version), n, ev);
	n = st_tfevent_encode_scalar(ev, sizeof(ev), 1700000001.5, 7, "learning/loss", 3.25f);
	check_record("scalar", rec_scalar, sizeof(rec_scalar), n, ev);
	n = st_tfevent_encode_scalar(ev, sizeof(ev), 1700000003.0, 300, "x", -0.1f);
	check_record("scalar step 300", rec_scalar300, sizeof(rec_scalar300), n, ev);
	n = st_tfevent_encode_text(ev, sizeof(ev), 1700000002.0, 12, "run/start", "hello");
	check_record("text", rec_text, sizeof(rec_text), n, ev);
	/* too small a buffer: the size needed, nothing written past cap */
	memset(ev, 0xee, sizeof(ev));
	CHECK(st_tfevent_encode_text(ev, 10, 1700000002.0, 12, "run/start", "hello") == sizeof(rec_text) - 16);
	for (size_t i = 10; i < sizeof(ev); i++)
		CHECK(ev[i] == 0xee);
	/* a negative step is a 10-byte varint, as protobuf writes int64 */
	n = st_tfevent_encode_scalar(ev, sizeof(ev), 1.0, -1, "t", 1.0f);
	CHECK(n == 9 + 11 + 2 + 2 + 3 + 5);
}

/* Read a whole file. */
static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	unsigned char *p = NULL;
	size_t cap = 0, n = 0, k;
	do {
		if (n + 4096 > cap) {
			cap = cap * 2 + 4096;
			p = realloc(p, cap);
			if (!p)
				abort();
		}
		k = fread(p + n, 1, cap - n, f);
		n += k;
	} while (k > 0);
	fclose(f);
	*len = n;
	return p;
}

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Walk the records of a file; every CRC must hold. The number of records. */
static int count_records(const unsigned char *p, size_t len)
{
	int n = 0;
	size_t off = 0;
	while (off < len) {
		if (len - off < 16)
			return -1;
		uint64_t m = 0;
		for (int i = 0; i < 8; i++)
			m |= (uint64_t)p[off + i] << (8 * i);
		if (rd32(p + off + 8) != st_tfrecord_mask_crc(st_crc32c(0, p + off, 8)) || m > len - off - 16)
			return -1;
		if (rd32(p + off + 12 + m) != st_tfrecord_mask_crc(st_crc32c(0, p + off + 12, m)))
			return -1;
		off += 16 + m;
		n++;
	}
	return n;
}

static int count_event_files(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
	closedir(d);
	return n;
}

static void test_writer(void)
{
	char dir[512], host[256] = "", want[600];
	snprintf(dir, sizeof(dir), "%s/run/tensorboard", tmpdir);
	st_tfevents *w;
	long long t0 = (long long)time(NULL);
	CHECK(st_tfevents_open(&w, dir) == 0); /* creates the directories */
	if (!w)
		return;
	gethostname(host, sizeof(host));
	snprintf(want, sizeof(want), "%s/events.out.tfevents.", dir);
	const char *path = st_tfevents_path(w);
	CHECK(strncmp(path, want, strlen(want)) == 0);
	long long secs = atoll(path + strlen(want));
	CHECK(secs >= t0 && secs <= t0 + 2);
	snprintf(want, sizeof(want), ".%s.%d.", host, (int)getpid());
	CHECK_MSG(strstr(path, want) != NULL, "%s lacks %s", path, want);
	size_t len;
	unsigned char *p = slurp(path, &len);
	CHECK(p && len == sizeof(rec_version)); /* the version record is on disk at once */
	CHECK(p && memcmp(p, rec_version, 8) == 0 && memcmp(p + 21, rec_version + 21, 15) == 0); /* but wall_time, CRCs */
	free(p);
	for (int s = 0; s < 5; s++) {
		CHECK(st_tfevents_scalar(w, s, "learning/loss", 10.0 - s) == 0);
		CHECK(st_tfevents_scalar(w, s, "perf/step_time_seconds", 0.5) == 0);
	}
	char big[20000];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	CHECK(st_tfevents_text(w, 0, "config", big) == 0);
	p = slurp(path, &len);
	CHECK(p && len == sizeof(rec_version)); /* nothing written before the flush */
	free(p);
	CHECK(st_tfevents_flush(w) == 0);
	p = slurp(path, &len);
	CHECK(p && count_records(p, len) == 12);
	free(p);
	CHECK(st_tfevents_close(w) == 0);

	/* a second writer in the same directory: a new file that sorts after the first */
	char future[700];
	snprintf(future, sizeof(future), "%s/events.out.tfevents.%010lld.zzz.1.0", dir, t0 + 100);
	FILE *f = fopen(future, "w");
	CHECK(f != NULL);
	if (f)
		fclose(f);
	CHECK(st_tfevents_open(&w, dir) == 0);
	if (w) {
		snprintf(want, sizeof(want), "%s/events.out.tfevents.%010lld.", dir, t0 + 101);
		CHECK_MSG(strncmp(st_tfevents_path(w), want, strlen(want)) == 0, "%s does not start with %s",
			  st_tfevents_path(w), want);
		CHECK(strcmp(st_tfevents_path(w), future) > 0);
		CHECK(st_tfevents_close(w) == 0);
	}
	CHECK(count_event_files(dir) == 3);
}

static void test_errors(void)
{
	st_tfevents *w = (st_tfevents *)1;
	char path[600], longp[5000];
	CHECK(st_tfevents_open(&w, "") == ST_EINVAL && w == NULL);
	/* a regular file where a directory should be */
	snprintf(path, sizeof(path), "%s/file", tmpdir);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "%s/file/tensorboard", tmpdir);
	CHECK(st_tfevents_open(&w, path) == ST_EIO && w == NULL);
	CHECK_MSG(strstr(st_errmsg(), "TensorBoard directory") && strstr(st_errmsg(), "file"), "%s", st_errmsg());
	snprintf(path, sizeof(path), "%s/file", tmpdir);
	CHECK(st_tfevents_open(&w, path) == ST_EIO && w == NULL);
	/* not writable even for root */
	CHECK(st_tfevents_open(&w, "/proc/self/tensorboard") < 0 && w == NULL);
	CHECK_MSG(strstr(st_errmsg(), "/proc/self/tensorboard") != NULL, "%s", st_errmsg());
	/* a directory name too long for a file inside it */
	memset(longp, 'd', sizeof(longp));
	memcpy(longp, tmpdir, strlen(tmpdir));
	longp[strlen(tmpdir)] = '/';
	longp[4080] = '\0';
	CHECK(st_tfevents_open(&w, longp) < 0 && w == NULL);
	/* a write that fails (a file size limit: EFBIG) is reported, and stays */
	struct rlimit old, small = {4096, RLIM_INFINITY};
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/limited", tmpdir);
	CHECK(st_tfevents_open(&w, dir) == 0);
	if (w && getrlimit(RLIMIT_FSIZE, &old) == 0) {
		signal(SIGXFSZ, SIG_IGN);
		small.rlim_max = old.rlim_max;
		CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
		char big[8192];
		memset(big, 'b', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		CHECK(st_tfevents_text(w, 1, "big", big) == 0);
		CHECK(st_tfevents_flush(w) == ST_EIO);
		CHECK_MSG(strstr(st_errmsg(), "cannot write TensorBoard event file") != NULL, "%s", st_errmsg());
		CHECK(st_tfevents_scalar(w, 2, "x", 1.0) == ST_EIO); /* sticky */
		CHECK(st_tfevents_flush(w) == ST_EIO);
		CHECK(st_tfevents_close(w) == ST_EIO);
		setrlimit(RLIMIT_FSIZE, &old);
		signal(SIGXFSZ, SIG_DFL);
	} else if (w) {
		st_tfevents_close(w);
	}
	CHECK(st_tfevents_close(NULL) == 0);
}

static int rm_rf(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd);
}

/* parts checksummed apart and combined == the whole (the restore checks a piece read in parts) */
static void test_crc32_combine(void)
{
	size_t n = (size_t)5 << 20;
	unsigned char *buf = malloc(n);
	uint64_t x = 88172645463325252ull;
	CHECK(buf);
	if (!buf)
		return;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
	CHECK(st_crc32(0, "123456789", 9) == 0xCBF43926u);
	CHECK(st_crc32_combine(st_crc32(0, "1234", 4), st_crc32(0, "56789", 5), 5) == 0xCBF43926u);
	uint32_t whole = st_crc32(0, buf, 1000);
	int bad = 0;
	for (size_t k = 0; k <= 1000; k++) /* every split, empty parts included */
		bad += st_crc32_combine(st_crc32(0, buf, k), st_crc32(0, buf + k, 1000 - k), 1000 - k) != whole;
	CHECK_MSG(bad == 0, "%d of 1001 splits combine wrongly", bad);
	/* a large second part, and three parts combined left to right */
	CHECK(st_crc32_combine(st_crc32(0, buf, 3), st_crc32(0, buf + 3, n - 3), n - 3) == st_crc32(0, buf, n));
	uint32_t c = st_crc32_combine(st_crc32(0, buf, 4096), st_crc32(0, buf + 4096, 777), 777);
	c = st_crc32_combine(c, st_crc32(0, buf + 4873, n - 4873), n - 4873);
	CHECK(c == st_crc32(0, buf, n));
	free(buf);
}

int main(void)
{
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	test_crc32c();
	test_crc32_combine();
	test_encoding();
	test_writer();
	test_errors();
	rm_rf(tmpdir);
	return check_result();
}
