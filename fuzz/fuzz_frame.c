/*
 * fuzz_frame - what a worker group's listener reads from a new connection
 * and from a control connection (comm/frame.h): the acceptor's state
 * machine (the run token's handshake on TCP, then the 40-byte hello), the
 * hello's judgement, then control frames; and the client's side of the
 * handshake against a fuzzed server (hello and answer).
 *
 * The target holds the run's token: a TCP connection starts with a correct
 * proof (st_auth_cli_answer, so that the fuzzer's bytes reach the hello
 * and frame checks), or with the input's own 68 bytes, or with a correct
 * proof with one byte flipped (both must be refused).
 *
 * Input: byte 0: bit 0 TCP (else a unix connection: no handshake), bits
 * 1-2 the handshake (0, 3: correct; 1: the next 68 bytes; 2: correct with
 * the byte chosen by the next byte flipped), bits 3-6 the piece size (0:
 * what st_accept_want asks, else k bytes), bit 7: the group's rank is 2
 * (else 0) of 4. Then the stream: the hello, then control frames, 40
 * bytes each, judged as from the hello's rank.
 * Checked beyond "no crash, no sanitizer report": no hello unless the proof
 * was right; the acceptor never takes more than it asked for or past the
 * hello; a hello is accepted only with the group's generation and nonce, another member's
 * rank and that member's pid, and a control hello only from a higher rank;
 * an abort names a rank of the group; the client refuses a wrong answer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_frame"
#include "comm_fuzz.h"
#include "comm/auth.h"
#include "comm/frame.h"


enum { SIZE = 4, MAX_REASON = 5 };
#define NONCE 0x0123456789abcdefull
#define GEN 7 /* the group's generation: a frame of any other is refused */

static st_token tok;
static const int32_t pids[SIZE] = { 4100, 4101, 4102, 4103 };
static int32_t pid_of(const void *ctx, int r) { return ((const int32_t *)ctx)[r]; }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	comm_fuzz_token(&tok);
	return 0;
}

/* The client's side: the input as the server's hello, then as its answer. */
static void client_side(const uint8_t *p, size_t n)
{
	uint8_t hello[ST_AUTH_HELLO] = { 0 }, proof[ST_AUTH_PROOF], mac[ST_AUTH_MAC] = { 0 };
	st_auth_cli cli;
	memcpy(hello, p, n < sizeof(hello) ? n : sizeof(hello));
	int r = st_auth_cli_answer(&cli, &tok, hello, proof);
	FUZZ_ASSERT(r == 0 || r == ST_EPEER);
	FUZZ_ASSERT(r == ST_EPEER || memcmp(hello, "STA1", 4) == 0);
	if (r < 0)
		return;
	if (n > sizeof(hello))
		memcpy(mac, p + sizeof(hello), n - sizeof(hello) < sizeof(mac) ? n - sizeof(hello) : sizeof(mac));
	/* a fuzzed answer is never right (it would have to know the client's fresh nonce) */
	FUZZ_ASSERT(st_auth_cli_verify(&cli, &tok, mac) == ST_EAUTH);
}

static void control_frames(const uint8_t *p, size_t n, int from)
{
	for (; n >= sizeof(st_frame); p += sizeof(st_frame), n -= sizeof(st_frame)) {
		st_frame f;
		const char *why = NULL;
		int reason = -1, rank = -1;
		if (st_frame_decode(p, sizeof(st_frame), &f, &why) < 0) {
			FUZZ_ASSERT(why != NULL);
			continue;
		}
		int type = st_ctrl_frame_check(&f, NONCE, GEN, from, SIZE, MAX_REASON, &reason, &rank, &why);
		if (type < 0) {
			FUZZ_ASSERT(why != NULL && (f.gen != GEN || f.nonce != NONCE || f.rank != from));
			continue;
		}
		FUZZ_ASSERT((uint32_t)type == f.type || (type == 0 && (f.type < F_HELLO_CTRL || f.type > F_FD)));
		if (type == F_ABORT)
			FUZZ_ASSERT(reason >= 0 && reason <= MAX_REASON && rank >= 0 && rank < SIZE);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;
	if (size < 1)
		return 0;
	int flags = data[off++];
	int tcp = flags & 1, mode = (flags >> 1) & 3, piece = (flags >> 3) & 15, self = flags & 128 ? 2 : 0;
	if (mode == 3)
		mode = 0;
	client_side(data + 1, size - 1);

	st_accept acc;
	st_auth_cli cli;
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], answer[ST_AUTH_MAC];
	FUZZ_ASSERT(st_accept_start(&acc, tcp, hello) == 0);
	int right = 1;
	if (tcp) {
		FUZZ_ASSERT(st_auth_cli_answer(&cli, &tok, hello, proof) == 0);
		if (mode == 1) {
			memset(proof, 0, sizeof(proof));
			size_t k = size - off < sizeof(proof) ? size - off : sizeof(proof);
			memcpy(proof, data + off, k);
			off += k;
			right = 0;
		} else if (mode == 2) {
			proof[(off < size ? data[off++] : 0) % sizeof(proof)] ^= 0x5a;
			right = 0;
		}
		size_t used;
		st_frame f;
		int r = st_accept_feed(&acc, &tok, proof, sizeof(proof), &used, answer, &f);
		if (!right) {
			FUZZ_ASSERT(r == ST_EAUTH);
			return 0;
		}
		FUZZ_ASSERT(r == ST_ACCEPT_ANSWER && used == sizeof(proof));
		FUZZ_ASSERT(st_auth_cli_verify(&cli, &tok, answer) == 0);
	}
	/* the hello, in the pieces the input chooses */
	st_frame hf;
	int got = 0;
	while (off < size && !got) {
		size_t want = st_accept_want(&acc), k = piece ? (size_t)piece : want, used;
		FUZZ_ASSERT(want >= 1 && want <= sizeof(st_frame));
		if (k > size - off)
			k = size - off;
		int r = st_accept_feed(&acc, &tok, data + off, k, &used, answer, &hf);
		FUZZ_ASSERT(used <= want && used <= k);
		off += used;
		FUZZ_ASSERT(r == ST_ACCEPT_MORE || r == ST_ACCEPT_HELLO);
		got = r == ST_ACCEPT_HELLO;
	}
	if (!got)
		return 0;
	st_hello_rules rules = { .self = self, .size = SIZE, .nonce = NONCE, .gen = GEN, .pid_of = pid_of, .ctx = pids };
	const char *why = NULL;
	int kind = st_hello_check(&rules, &hf, !tcp, &why);
	if (kind < 0) {
		FUZZ_ASSERT(why != NULL);
		return 0;
	}
	FUZZ_ASSERT(hf.magic == ST_FRAME_MAGIC && hf.gen == GEN && hf.nonce == NONCE && hf.rank >= 0 && hf.rank < SIZE &&
		    hf.rank != self && hf.aux == (uint32_t)pids[hf.rank]);
	FUZZ_ASSERT((kind == F_HELLO_CTRL && hf.rank > self) || (kind == F_HELLO_DATA && tcp));
	if (kind == F_HELLO_CTRL)
		control_frames(data + off, size - off, hf.rank);
	return 0;
}
