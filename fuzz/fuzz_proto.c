/*
 * fuzz_proto - the elastic controller/agent protocol (elastic/proto.h) as a
 * server reads it: the run token's handshake, then line-delimited JSON.
 *
 * Each input is one connection. The target plays the client on the other
 * end of a socketpair: it reads the server's 36-byte hello and, holding the
 * run's token (auth_oracle.h), sends a correct proof so that the fuzzer's
 * bytes reach the line parser; or it sends the fuzzer's own bytes as the
 * proof, or a correct proof with one byte changed. Then the rest of the
 * input, in pieces of a size the input chooses, with st_proto_recv drained
 * after each piece (the way the controller's poll loop reads).
 *
 * Also: the input as a heartbeat datagram (st_proto_beat_parse).
 * Input: byte 0: bits 0-1 the handshake (0, 3: a correct proof; 1: the
 * input's first 68 bytes are the proof; 2: a correct proof with the byte
 * at byte 1 % 68 XORed with byte 2 | 1), bits 2-5 the piece size (0: all
 * at once, else k*k bytes), bit 6: 64 KiB without a newline follow (the
 * line limit); bytes 1, 2 as said; the rest is the stream.
 *
 * Checked beyond "no crash, no leak, no sanitizer report":
 *   - no line is returned, and no answer sent, unless the proof was right;
 *   - the server's answer is HMAC(key, "s" | ns | nc), the hello starts "STA1";
 *   - every message is a JSON object with a string "type"; the fields each
 *     message type carries (proto.h) are read with the getters, with the
 *     controller's and agent's ranges, and a value they return is in range;
 *   - a message sent back with st_proto_send arrives as one line that
 *     parses to an equal object;
 *   - after the stream ends the connection reports ST_EPEER (or an error
 *     earlier), within a bounded number of calls.
 * What it cannot reach: the controller's and agent's handlers (hello,
 * agent_msg, check_start: static functions over their whole state); the
 * hostile-port test (bench/hostile.py) sends them mutated messages over TCP.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "auth_oracle.h"
#include "fuzz_util.h"
#include "base/err.h"
#include "elastic/proto.h"


static st_token tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	oracle_token(&tok);
	st_log_quiet(1);
	return 0;
}

/* An integer field read as the controller or agent reads it. */
static void int_field(const json_t *m, const char *key, long long lo, long long hi)
{
	long long v = lo - 1;
	if (st_proto_get_int(m, key, lo, hi, &v) == 0)
		FUZZ_ASSERT(v >= lo && v <= hi && json_is_integer(json_object_get(m, key)));
	else
		FUZZ_ASSERT(v == lo - 1);
}

static void str_field(const json_t *m, const char *key)
{
	const char *s = NULL;
	if (st_proto_get_str(m, key, &s) == 0)
		FUZZ_ASSERT(s && json_is_string(json_object_get(m, key)));
	else
		FUZZ_ASSERT(!s);
}

/* The fields proto.h lists for each type, read with the getters and the
 * ranges of controller.c and agent.c. */
static void walk_fields(const json_t *m)
{
	const char *type = NULL;
	FUZZ_ASSERT(st_proto_get_str(m, "type", &type) == 0 && type);
	if (!strcmp(type, "hello")) {
		int_field(m, "version", 0, 1 << 30);
		int_field(m, "slice", 0, 1 << 30);
		int_field(m, "host", 0, 1 << 30);
		int_field(m, "hosts_per_slice", 1, 1 << 30);
		int_field(m, "devices", 1, 1 << 30);
		int_field(m, "pid", 1, 1LL << 40);
		int_field(m, "port", 1, 65535);
		str_field(m, "addr");
		str_field(m, "build");
		str_field(m, "release");
	} else if (!strcmp(type, "heartbeat")) {
		int_field(m, "port", 1, 65535);
	} else if (!strcmp(type, "refused") || !strcmp(type, "unfit")) {
		str_field(m, "why");
	} else if (!strcmp(type, "started")) {
		int_field(m, "gen", 0, 1LL << 40);
		const json_t *ws = json_object_get(m, "workers"), *w;
		size_t i;
		json_array_foreach(ws, i, w) {
			int_field(w, "rank", 0, 1 << 30);
			int_field(w, "pid", 1, 1LL << 40);
		}
	} else if (!strcmp(type, "exit")) {
		int_field(m, "gen", 0, 1LL << 40);
		int_field(m, "rank", 0, 1 << 30);
		int_field(m, "status", -1, 255);
		int_field(m, "signal", 0, 64);
		int_field(m, "pid", 0, 1LL << 40);
	} else if (!strcmp(type, "output")) {
		int_field(m, "gen", 0, 1LL << 40);
		int_field(m, "rank", 0, 1 << 30);
		str_field(m, "stream");
		str_field(m, "text");
	} else if (!strcmp(type, "notice")) {
		int_field(m, "signal", 0, 64);
	} else if (!strcmp(type, "start")) {
		int_field(m, "gen", 0, 1LL << 53);
		int_field(m, "threads", 1, 4096);
		const json_t *a = json_object_get(m, "args"), *v;
		size_t i;
		json_array_foreach(a, i, v) FUZZ_ASSERT(v);
		const char *k;
		json_object_foreach((json_t *)json_object_get(m, "env"), k, v) str_field(json_object_get(m, "env"), k);
		str_field(m, "config");
	} else if (!strcmp(type, "stop") || !strcmp(type, "kill")) {
		int_field(m, "gen", 0, 1LL << 53);
		int_field(m, "rank", 0, 1 << 30);
		str_field(m, "how");
	} else if (!strcmp(type, "welcome")) {
		int_field(m, "version", 0, 1 << 30);
		str_field(m, "run_dir");
		str_field(m, "probe");
		str_field(m, "nonce");
	} else if (!strcmp(type, "reform")) {
		const json_t *env = NULL;
		if (st_proto_get_env(m, 64, &env) == 0)
			FUZZ_ASSERT(json_is_object(env) && json_object_size(env) <= 64);
		else
			FUZZ_ASSERT(!env);
	}
}

/* m sent back through the connection arrives as one line equal to it. */
static void round_trip(st_proto_conn *c, int peer, const json_t *m)
{
	int rc = st_proto_send(c, m);
	if (rc == ST_EINVAL)
		return; /* longer than a line once serialized: refused, nothing queued */
	FUZZ_ASSERT(rc == 0 && c->wlen == 0); /* a socketpair takes a line at once */
	static char line[ST_PROTO_MAX_LINE + 1];
	size_t n = 0;
	do {
		FUZZ_ASSERT(n < sizeof(line));
		FUZZ_ASSERT(fuzz_get(peer, (uint8_t *)line + n, 1) == 0);
	} while (line[n++] != '\n');
	json_t *back = json_loadb(line, n - 1, 0, NULL);
	FUZZ_ASSERT(back && json_equal(back, (json_t *)m));
	json_decref(back);
}

/* st_proto_recv until it has nothing more; 0 while the connection lives. */
static int drain(st_proto_conn *c, int peer, int *accepted, const uint8_t hello[ST_AUTH_HELLO],
		 const uint8_t *proof, int proof_ok)
{
	for (int calls = 0;; calls++) {
		FUZZ_ASSERT(calls < 1 << 20);
		json_t *m = NULL;
		int rc = st_proto_recv(c, &m);
		if (!*accepted && !c->auth) {
			/* the proof was accepted: it must have been right, and the answer too */
			FUZZ_ASSERT(proof_ok);
			uint8_t want[ST_AUTH_MAC], got[ST_AUTH_MAC];
			oracle_mac(tok.key, 's', hello + 4, proof + 4, want);
			FUZZ_ASSERT(fuzz_get(peer, got, sizeof(got)) == 0);
			FUZZ_ASSERT(!memcmp(want, got, sizeof(want)));
			*accepted = 1;
		}
		if (rc == 0) {
			FUZZ_ASSERT(!m);
			return 0;
		}
		if (rc < 0) {
			FUZZ_ASSERT(!m && (rc == ST_EPROTO || rc == ST_EPEER || rc == ST_EAUTH));
			FUZZ_ASSERT(rc != ST_EAUTH || !proof_ok);
			return rc;
		}
		FUZZ_ASSERT(rc == 1 && m && *accepted && json_is_object(m));
		walk_fields(m);
		round_trip(c, peer, m);
		json_decref(m);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* the same bytes as a heartbeat datagram: only a 48-byte one with the
	 * token's MAC parses, and it makes the same bytes again */
	st_proto_beat b;
	if (st_proto_beat_parse(data, size, &tok, &b) == 0) {
		uint8_t again[ST_PROTO_BEAT_LEN];
		st_proto_beat_make(again, &tok, &b);
		FUZZ_ASSERT(size == ST_PROTO_BEAT_LEN && !memcmp(again, data, 32) && !memcmp(again + 32, data + 32, 16));
	}
	if (size < 3)
		return 0;
	int mode = data[0] & 3, piece = (data[0] >> 2) & 15, pad = data[0] & 64;
	size_t flip = data[1] % ST_AUTH_PROOF;
	uint8_t xor = data[2] | 1;
	data += 3;
	size -= 3;

	int sv[2];
	FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	st_proto_conn c = ST_PROTO_CONN_INIT;
	FUZZ_ASSERT(st_proto_conn_init_server(&c, sv[0], &tok) == 0);
	uint8_t hello[ST_AUTH_HELLO];
	FUZZ_ASSERT(fuzz_get(sv[1], hello, sizeof(hello)) == 0);
	FUZZ_ASSERT(!memcmp(hello, "STA1", 4));

	/* the client's bytes: proof (unless the input is it), stream, padding */
	size_t cap = ST_AUTH_PROOF + size + (pad ? ST_PROTO_MAX_LINE : 0), len = 0;
	uint8_t *out = malloc(cap ? cap : 1);
	FUZZ_ASSERT(out);
	int proof_ok = 0;
	uint8_t proof[ST_AUTH_PROOF] = {0};
	if (mode != 1) {
		static const uint8_t nc[ST_AUTH_NONCE] = "client nonce of the fuzz target";
		oracle_proof(tok.key, hello, nc, proof);
		if (mode == 2)
			proof[flip] ^= xor;
		proof_ok = mode != 2;
		memcpy(out, proof, sizeof(proof));
		len = sizeof(proof);
	} else if (size >= ST_AUTH_PROOF) {
		/* only a proof equal to the right one may pass */
		uint8_t right[ST_AUTH_PROOF];
		oracle_proof(tok.key, hello, data + 4, right);
		memcpy(proof, data, sizeof(proof));
		proof_ok = !memcmp(right, data, sizeof(right));
	}
	memcpy(out + len, data, size);
	len += size;
	if (pad) {
		memset(out + len, 'A', ST_PROTO_MAX_LINE);
		len += ST_PROTO_MAX_LINE;
	}

	/* the input's bytes in pieces, the padding in 16 KiB ones */
	int accepted = 0, rc = 0;
	size_t step = piece ? (size_t)piece * piece : len, unpadded = len - (pad ? ST_PROTO_MAX_LINE : 0);
	for (size_t off = 0; off < len && rc == 0;) {
		size_t n = off < unpadded ? step : 16 << 10, end = off + n < len ? off + n : len;
		if (off < unpadded && end > unpadded)
			end = unpadded;
		FUZZ_ASSERT(fuzz_put(sv[1], out + off, end - off) == 0);
		rc = drain(&c, sv[1], &accepted, hello, proof, proof_ok);
		off = end;
	}
	if (rc == 0) {
		/* the client is done: what is left is read, then the end is seen */
		shutdown(sv[1], SHUT_WR);
		rc = drain(&c, sv[1], &accepted, hello, proof, proof_ok);
		FUZZ_ASSERT(rc < 0);
	}
	free(out);
	st_proto_conn_release(&c);
	close(sv[1]);
	return 0;
}
