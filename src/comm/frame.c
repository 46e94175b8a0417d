/* The worker group's frames, hellos and the acceptor's handshake, as pure functions (frame.h). */
#include "comm/frame.h"

#include <string.h>

int st_frame_decode(const uint8_t *b, size_t n, st_frame *f, const char **why)
{
	if (n != sizeof(*f)) {
		*why = "not a whole frame";
		return -1;
	}
	memcpy(f, b, sizeof(*f));
	if (f->magic != ST_FRAME_MAGIC) {
		*why = "wrong frame magic";
		return -1;
	}
	return 0;
}

int st_hello_check(const st_hello_rules *r, const st_frame *f, int is_unix, const char **why)
{
	if (f->magic != ST_FRAME_MAGIC)
		*why = "not a slicetrain hello (wrong magic)";
	else if (f->gen < r->gen)
		*why = "a hello from an older generation (a stale worker): refused";
	else if (f->gen > r->gen)
		*why = "a hello from a newer generation (this worker is the stale one)";
	else if (f->nonce != r->nonce)
		*why = "a hello for another group (wrong group nonce)";
	else if (f->rank < 0 || f->rank >= r->size || f->rank == r->self)
		*why = "a hello from a rank that is not another member";
	else if (f->aux != (uint32_t)r->pid_of(r->ctx, f->rank))
		*why = "a hello whose pid is not that rank's";
	else if (f->type == F_HELLO_CTRL && f->rank < r->self)
		*why = "a control hello from a lower rank (the higher rank connects)";
	else if (f->type == F_HELLO_DATA && is_unix)
		*why = "a data hello on a unix socket";
	else if (f->type != F_HELLO_CTRL && f->type != F_HELLO_DATA)
		*why = "not a hello";
	else
		return (int)f->type;
	return -1;
}

int st_ctrl_frame_check(const st_frame *f, uint64_t nonce, uint64_t gen, int from, int size, int max_reason,
			int *abort_reason, int *abort_rank, const char **why)
{
	if (f->magic == ST_FRAME_MAGIC && f->gen != gen) {
		*why = "a control frame of another generation: refused";
		return -1;
	}
	if (f->magic != ST_FRAME_MAGIC || f->nonce != nonce || f->rank != from) {
		*why = "malformed control frame (magic, group nonce or sender)";
		return -1;
	}
	if (f->type == F_ABORT) {
		int valid = f->aux > 0 && f->aux <= (uint32_t)max_reason && f->key < (uint64_t)size;
		*abort_reason = valid ? (int)f->aux : 0;
		*abort_rank = valid ? (int)f->key : from;
	}
	return f->type >= F_HELLO_CTRL && f->type <= F_FD ? (int)f->type : 0;
}

int st_accept_start(st_accept *a, int need_auth, uint8_t hello[ST_AUTH_HELLO])
{
	memset(a, 0, sizeof(*a));
	a->need_auth = need_auth;
	return need_auth ? st_auth_srv_start(&a->auth, hello) : 0;
}

size_t st_accept_want(const st_accept *a)
{
	if (a->need_auth && !a->auth.done)
		return ST_AUTH_PROOF - a->auth.have;
	return sizeof(a->buf) - a->n;
}

int st_accept_feed(st_accept *a, const st_token *t, const uint8_t *in, size_t n, size_t *used,
		   uint8_t answer[ST_AUTH_MAC], st_frame *f)
{
	*used = 0;
	if (a->need_auth && !a->auth.done) {
		int r = st_auth_srv_feed(&a->auth, t, in, n, used, answer);
		return r < 0 ? r : r == 1 ? ST_ACCEPT_ANSWER : ST_ACCEPT_MORE;
	}
	if (a->n == sizeof(a->buf)) {
		memcpy(f, a->buf, sizeof(*f));
		return ST_ACCEPT_HELLO;
	}
	size_t k = sizeof(a->buf) - a->n < n ? sizeof(a->buf) - a->n : n;
	memcpy(a->buf + a->n, in, k);
	a->n += k;
	*used = k;
	if (a->n < sizeof(a->buf))
		return ST_ACCEPT_MORE;
	memcpy(f, a->buf, sizeof(*f));
	return ST_ACCEPT_HELLO;
}
