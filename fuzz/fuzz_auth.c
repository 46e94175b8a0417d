/*
 * fuzz_auth - the run token and the connection handshake (comm/auth.h):
 * both sides of the handshake fed hostile bytes, and the token's sources.
 *
 * Input: byte 0 % 8 is the mode, byte 1 a piece size for modes 0 and 1
 * (k: k*k % 97 + 1 bytes a call; 0: all at once), the rest the payload P.
 *   0  st_auth_srv_feed (the poll loops' server) fed P as the client's proof,
 *      in pieces;
 *   1  the same with the right proof (auth_oracle.h: the target holds the
 *      token) XORed with P's first 68 bytes (zeros: the right proof), then
 *      P's rest as the protocol's first bytes;
 *   2  st_auth_client against a scripted server on a socketpair: P[0] bit 0:
 *      the hello is P[1..37) as is (else "STA1" | P[1..33)); the answer is
 *      the right one XORed with P[37..69); P[0] bit 1: only (P[0] >> 2) of
 *      its bytes are sent;
 *   3  st_auth_server (the blocking server) against a scripted client whose
 *      proof is the right one XORed with P[1..69), cut after P[0] bytes
 *      when P[0] < 68;
 *   4  st_token_load from SLICETRAIN_TOKEN_FILE holding P[1..), with the
 *      file mode P[0] picks (0600, 0400, 0640, 0604, 0644, 0660);
 *   5  st_token_load from SLICETRAIN_TOKEN = P (up to its first NUL, at
 *      most 4160 bytes: past the longest token allowed);
 *   6  st_auth_check_bind and st_auth_host_is_loopback on a numeric host
 *      made from P (IPv4, 127.x, IPv6, v4-mapped, ::1, short IPv4 forms,
 *      "localhost", "*", ""; never a name, which would go to DNS), without
 *      a token and with one;
 *   7  st_auth_cli_answer on the hello P[0..36) (made "STA1" when P[0] bit
 *      0), st_auth_cli_verify on P[36..68) (the right answer when bit 1).
 * Checked, beyond "no crash, no leak, no sanitizer report, no hang":
 *   - a server accepts a proof only when it is the right one (and then
 *     answers with HMAC(key, "s" | ns | nc)); it takes at most the bytes
 *     that complete the proof; the hello is "STA1" | ns;
 *   - a client proves correctly to a well-formed hello and succeeds only
 *     when the server's answer is the right one, whole;
 *   - a token file readable by group or others is refused; a loaded token
 *     is SHA-256 of the token with surrounding space, tab, CR and LF
 *     removed (16..4096 bytes);
 *   - without a token a host may be bound exactly when it is loopback
 *     (127.0.0.0/8, ::1, ::ffff:127.x, localhost); with one, any host;
 *   - the client's proof is right for the hello's nonce and its own, and
 *     it accepts exactly the right answer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth_oracle.h"
#include "fuzz_util.h"
#include "base/clock.h"
#include "base/err.h"
#include "comm/auth.h"


static st_token tok;
static char tmpdir[256], tokpath[300];

static void cleanup(void)
{
	unlink(tokpath);
	rmdir(tmpdir);
}

/* The scripted peer of modes 2 and 3 runs on one helper thread made once:
 * a thread per input would make ASan keep millions of dead threads'
 * records (the process grew past 1 GiB in ten minutes). */
static pthread_t helper;
static pthread_mutex_t helper_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cv = PTHREAD_COND_INITIALIZER;
static void *(*helper_job)(void *);
static void *helper_arg;
static int helper_busy;

static void *helper_main(void *unused)
{
	pthread_mutex_lock(&helper_mu);
	for (;;) {
		while (!helper_busy)
			pthread_cond_wait(&helper_cv, &helper_mu);
		pthread_mutex_unlock(&helper_mu);
		helper_job(helper_arg);
		pthread_mutex_lock(&helper_mu);
		helper_busy = 0;
		pthread_cond_broadcast(&helper_cv);
	}
	return NULL;
}

/* Start job(arg) on the helper thread; helper_wait() waits for its end. */
static void helper_start(void *(*job)(void *), void *arg)
{
	pthread_mutex_lock(&helper_mu);
	helper_job = job;
	helper_arg = arg;
	helper_busy = 1;
	pthread_cond_broadcast(&helper_cv);
	pthread_mutex_unlock(&helper_mu);
}

static void helper_wait(void)
{
	pthread_mutex_lock(&helper_mu);
	while (helper_busy)
		pthread_cond_wait(&helper_cv, &helper_mu);
	pthread_mutex_unlock(&helper_mu);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	oracle_token(&tok);
	st_log_quiet(1);
	const char *t = getenv("TMPDIR");
	snprintf(tmpdir, sizeof(tmpdir), "%s/fuzz_auth.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("fuzz_auth: mkdtemp");
		exit(1);
	}
	snprintf(tokpath, sizeof(tokpath), "%s/token", tmpdir);
	atexit(cleanup);
	if (pthread_create(&helper, NULL, helper_main, NULL) != 0) {
		perror("fuzz_auth: pthread_create");
		exit(1);
	}
	return 0;
}

static int all_zero(const uint8_t *p, size_t n)
{
	uint8_t x = 0;
	for (size_t i = 0; i < n; i++)
		x |= p[i];
	return x == 0;
}

/* P[off, off + n) zero-padded into out. */
static void take(const uint8_t *p, size_t size, size_t off, uint8_t *out, size_t n)
{
	memset(out, 0, n);
	if (off < size)
		memcpy(out, p + off, size - off < n ? size - off : n);
}

/* ---- modes 0 and 1: the state machine ---- */

static void srv_feed(const uint8_t *p, size_t size, size_t piece, int with_proof)
{
	st_auth_srv a;
	uint8_t hello[ST_AUTH_HELLO], answer[ST_AUTH_MAC], right[ST_AUTH_PROOF];
	FUZZ_ASSERT(st_auth_srv_start(&a, hello) == 0);
	FUZZ_ASSERT(!memcmp(hello, "STA1", 4) && !memcmp(hello + 4, a.ns, ST_AUTH_NONCE) && !a.done);

	uint8_t *in = malloc(size + ST_AUTH_PROOF + 1);
	size_t len = 0;
	FUZZ_ASSERT(in);
	if (with_proof) {
		static const uint8_t nc[ST_AUTH_NONCE] = "the fuzzer's client nonce......";
		uint8_t mask[ST_AUTH_PROOF];
		take(p, size, 0, mask, sizeof(mask));
		oracle_proof(tok.key, hello, nc, in);
		for (size_t i = 0; i < ST_AUTH_PROOF; i++)
			in[i] ^= mask[i];
		len = ST_AUTH_PROOF;
		if (size > ST_AUTH_PROOF) {
			memcpy(in + len, p + ST_AUTH_PROOF, size - ST_AUTH_PROOF);
			len += size - ST_AUTH_PROOF;
		}
	} else {
		memcpy(in, p, size);
		len = size;
	}
	/* the right proof for the nonce the bytes carry */
	uint8_t nc[ST_AUTH_NONCE];
	take(in, len, 4, nc, sizeof(nc));
	oracle_proof(tok.key, hello, nc, right);

	size_t off = 0;
	int rc = 0;
	while (off < len) {
		size_t n = piece && len - off > piece ? piece : len - off, used = n + 1;
		rc = st_auth_srv_feed(&a, &tok, in + off, n, &used, answer);
		FUZZ_ASSERT(used <= n);
		off += used;
		if (rc != 0)
			break;
		FUZZ_ASSERT(used == n && off < ST_AUTH_PROOF && !a.done);
	}
	if (len < ST_AUTH_PROOF) {
		FUZZ_ASSERT(rc == 0 && off == len && !a.done);
	} else {
		/* the proof is complete at byte 68 exactly: later bytes are not taken */
		FUZZ_ASSERT(off == ST_AUTH_PROOF);
		int ok = !memcmp(in, right, ST_AUTH_PROOF);
		FUZZ_ASSERT(rc == (ok ? 1 : ST_EAUTH) && a.done == ok);
		if (ok) {
			uint8_t want[ST_AUTH_MAC];
			oracle_mac(tok.key, 's', a.ns, nc, want);
			FUZZ_ASSERT(!memcmp(answer, want, sizeof(want)));
		}
	}
	free(in);
}

/* ---- mode 2: the client against a scripted server ---- */

typedef struct script {
	int fd;
	uint8_t hello[ST_AUTH_HELLO], mask[ST_AUTH_MAC];
	size_t answer_len;   /* bytes of the answer sent */
	int proof_right;     /* 1: the client's proof was right; 0 wrong; -1 none came */
} script;

static void *scripted_server(void *arg)
{
	script *s = arg;
	uint8_t proof[ST_AUTH_PROOF], want[ST_AUTH_PROOF];
	s->proof_right = -1;
	if (fuzz_put(s->fd, s->hello, sizeof(s->hello)) == 0 && fuzz_get(s->fd, proof, sizeof(proof)) == 0) {
		oracle_proof(tok.key, s->hello, proof + 4, want);
		s->proof_right = !memcmp(proof, want, sizeof(want));
		uint8_t answer[ST_AUTH_MAC];
		oracle_mac(tok.key, 's', s->hello + 4, proof + 4, answer);
		for (size_t i = 0; i < sizeof(answer); i++)
			answer[i] ^= s->mask[i];
		fuzz_put(s->fd, answer, s->answer_len);
	}
	shutdown(s->fd, SHUT_WR);
	return NULL;
}

static void client(const uint8_t *p, size_t size)
{
	script s = {0};
	uint8_t flags = size ? p[0] : 0;
	if (flags & 1) {
		take(p, size, 1, s.hello, sizeof(s.hello));
	} else {
		memcpy(s.hello, "STA1", 4);
		take(p, size, 1, s.hello + 4, ST_AUTH_NONCE);
	}
	take(p, size, 1 + ST_AUTH_HELLO, s.mask, sizeof(s.mask));
	s.answer_len = flags & 2 ? (size_t)(flags >> 2) % ST_AUTH_MAC : ST_AUTH_MAC;
	int sv[2];
	FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	s.fd = sv[1];
	helper_start(scripted_server, &s);
	int rc = st_auth_client(sv[0], &tok, st_mono_ns() + 5000000000LL);
	close(sv[0]); /* a server still waiting for a proof sees the end */
	helper_wait();
	close(sv[1]);
	int hello_ok = !memcmp(s.hello, "STA1", 4);
	FUZZ_ASSERT(rc == 0 || rc == ST_EAUTH || rc == ST_EPEER);
	if (hello_ok && s.proof_right >= 0)
		FUZZ_ASSERT(s.proof_right == 1); /* the client proves correctly to any nonce */
	int want_ok = hello_ok && s.answer_len == ST_AUTH_MAC && all_zero(s.mask, sizeof(s.mask));
	FUZZ_ASSERT((rc == 0) == want_ok);
}

/* ---- mode 3: the blocking server against a scripted client ---- */

typedef struct client_script {
	int fd;
	uint8_t mask[ST_AUTH_PROOF];
	size_t proof_len;
	int hello_ok, answer_right; /* -1: no answer came */
} client_script;

static void *client_thread(void *arg)
{
	client_script *s = arg;
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], answer[ST_AUTH_MAC], want[ST_AUTH_MAC];
	static const uint8_t nc[ST_AUTH_NONCE] = "nonce of the scripted client...";
	s->answer_right = -1;
	if (fuzz_get(s->fd, hello, sizeof(hello)) == 0) {
		s->hello_ok = !memcmp(hello, "STA1", 4);
		oracle_proof(tok.key, hello, nc, proof);
		for (size_t i = 0; i < sizeof(proof); i++)
			proof[i] ^= s->mask[i];
		/* then the end: a server waiting for the rest of a cut proof sees it at once */
		int sent = fuzz_put(s->fd, proof, s->proof_len);
		shutdown(s->fd, SHUT_WR);
		if (sent == 0 && fuzz_get(s->fd, answer, sizeof(answer)) == 0) {
			oracle_mac(tok.key, 's', hello + 4, proof + 4, want);
			s->answer_right = !memcmp(answer, want, sizeof(want));
		}
	}
	return NULL;
}

static void server(const uint8_t *p, size_t size)
{
	client_script s = {0};
	size_t cut = size ? p[0] : ST_AUTH_PROOF;
	s.proof_len = cut < ST_AUTH_PROOF ? cut : ST_AUTH_PROOF;
	take(p, size, 1, s.mask, sizeof(s.mask));
	int sv[2];
	FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	s.fd = sv[1];
	helper_start(client_thread, &s);
	int rc = st_auth_server(sv[0], &tok, st_mono_ns() + 5000000000LL);
	close(sv[0]);
	helper_wait();
	close(sv[1]);
	FUZZ_ASSERT(s.hello_ok);
	FUZZ_ASSERT(rc == 0 || rc == ST_EAUTH || rc == ST_EPEER);
	int want_ok = s.proof_len == ST_AUTH_PROOF && all_zero(s.mask, sizeof(s.mask));
	FUZZ_ASSERT((rc == 0) == want_ok);
	if (rc == 0)
		FUZZ_ASSERT(s.answer_right == 1);
	else
		FUZZ_ASSERT(s.answer_right == -1); /* no answer to a wrong or partial proof */
}

/* ---- modes 4 and 5: the token's sources ---- */

/* "surrounding whitespace": space, tab, CR, LF (as auth.c reads it) */
static int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A loaded token must be SHA-256 of the trimmed text, of an allowed length. */
static void check_loaded(const st_token *t, const uint8_t *p, size_t n)
{
	size_t b = 0, e = n;
	while (b < e && is_space(p[b]))
		b++;
	while (e > b && is_space(p[e - 1]))
		e--;
	FUZZ_ASSERT(t->set == 1);
	FUZZ_ASSERT(e - b >= ST_AUTH_MIN_TOKEN && e - b <= ST_AUTH_MAX_TOKEN);
	uint8_t want[ST_AUTH_KEY];
	SHA256(p + b, e - b, want);
	FUZZ_ASSERT(!memcmp(t->key, want, sizeof(want)));
}

static void token_file(const uint8_t *p, size_t size)
{
	static const mode_t modes[] = {0600, 0400, 0640, 0604, 0644, 0660};
	mode_t mode = modes[(size ? p[0] : 0) % 6];
	const uint8_t *text = size ? p + 1 : p;
	size_t n = size ? size - 1 : 0;
	unlink(tokpath);
	int fd = open(tokpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FUZZ_ASSERT(fd >= 0);
	FUZZ_ASSERT(write(fd, text, n) == (ssize_t)n && fchmod(fd, mode) == 0);
	close(fd);
	setenv("SLICETRAIN_TOKEN_FILE", tokpath, 1);
	unsetenv("SLICETRAIN_TOKEN");
	st_token t;
	memset(&t, 0xa5, sizeof(t));
	int rc = st_token_load(&t);
	unsetenv("SLICETRAIN_TOKEN_FILE");
	FUZZ_ASSERT(rc == 0 || rc == ST_EINVAL);
	if (mode & 077)
		FUZZ_ASSERT(rc < 0); /* readable by others: refused */
	if (rc == 0)
		check_loaded(&t, text, n);
}

static void token_env(const uint8_t *p, size_t size)
{
	/* putenv of one buffer, rewritten each time: setenv keeps every value
	 * it was ever given (glibc), so a new token per input would grow the
	 * process without bound */
	static char var[sizeof("SLICETRAIN_TOKEN=") + ST_AUTH_MAX_TOKEN + 64];
	const size_t pre = sizeof("SLICETRAIN_TOKEN=") - 1;
	size_t n = size < sizeof(var) - pre - 1 ? size : sizeof(var) - pre - 1;
	memcpy(var, "SLICETRAIN_TOKEN=", pre);
	memcpy(var + pre, p, n);
	var[pre + n] = 0;
	unsetenv("SLICETRAIN_TOKEN_FILE");
	FUZZ_ASSERT(putenv(var) == 0);
	st_token t;
	int rc = st_token_load(&t);
	unsetenv("SLICETRAIN_TOKEN");
	FUZZ_ASSERT(rc == 0 || rc == ST_EINVAL);
	if (rc == 0)
		check_loaded(&t, (const uint8_t *)var + pre, strlen(var + pre));
}

/* ---- mode 6: where a group may listen ---- */

/* Hosts are made numeric (or one of the names below) so that no input
 * reaches DNS: st_auth_check_bind resolves names, and a lookup is slow. */
static void check_bind(const uint8_t *p, size_t size)
{
	uint8_t b[17];
	char h[INET6_ADDRSTRLEN + 16];
	take(p, size, 0, b, sizeof(b));
	int loop = 0;
	switch (b[0] % 8) {
	case 0: /* IPv4 */
	case 1:
		snprintf(h, sizeof(h), "%u.%u.%u.%u", b[1], b[2], b[3], b[4]);
		loop = b[1] == 127;
		break;
	case 2: /* 127.x.y.z */
		snprintf(h, sizeof(h), "127.%u.%u.%u", b[2], b[3], b[4]);
		loop = 1;
		break;
	case 3: { /* IPv6, sometimes v4-mapped, sometimes ::1 */
		struct in6_addr a;
		memcpy(&a, b + 1, 16);
		if (b[0] & 8)
			memset(&a, 0, 15), a.s6_addr[15] = b[1] & 1;
		if (b[0] & 16) {
			memset(&a, 0, 10);
			a.s6_addr[10] = a.s6_addr[11] = 0xff;
		}
		inet_ntop(AF_INET6, &a, h, sizeof(h));
		loop = IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
		break;
	}
	case 4:
		strcpy(h, "localhost");
		loop = 1;
		break;
	case 5:
		strcpy(h, b[1] & 1 ? "*" : "");
		break;
	case 6: /* short forms inet_aton reads: 127.1, 2130706433 */
		snprintf(h, sizeof(h), "%u.%u", b[1], (unsigned)b[2] << 16 | (unsigned)b[3] << 8 | b[4]);
		loop = b[1] == 127;
		break;
	default:
		snprintf(h, sizeof(h), "%u", (unsigned)b[1] << 24 | (unsigned)b[2] << 16 | (unsigned)b[3] << 8 | b[4]);
		loop = b[1] == 127;
		break;
	}
	st_token none = {0};
	strcpy(none.source, "none");
	int rc = st_auth_check_bind(&none, h);
	FUZZ_ASSERT(rc == 0 || rc == ST_EINVAL);
	if ((rc == 0) != loop) {
		fprintf(stderr, "fuzz_auth: check_bind(\"%s\") without a token: %d\n", h, rc);
		FUZZ_ASSERT((rc == 0) == loop);
	}
	FUZZ_ASSERT(st_auth_host_is_loopback(h) == loop);
	FUZZ_ASSERT(st_auth_check_bind(&tok, h) == 0);
}

/* ---- mode 7: the client's two steps on any hello and answer ---- */

static void client_steps(const uint8_t *p, size_t size)
{
	uint8_t hello[ST_AUTH_HELLO], mac[ST_AUTH_MAC], proof[ST_AUTH_PROOF], want[ST_AUTH_PROOF];
	take(p, size, 0, hello, sizeof(hello));
	take(p, size, ST_AUTH_HELLO, mac, sizeof(mac));
	if (size && (p[0] & 1))
		memcpy(hello, "STA1", 4);
	st_auth_cli a;
	int rc = st_auth_cli_answer(&a, &tok, hello, proof);
	FUZZ_ASSERT((rc == 0) == !memcmp(hello, "STA1", 4));
	if (rc < 0)
		return;
	FUZZ_ASSERT(!memcmp(a.ns, hello + 4, ST_AUTH_NONCE) && !memcmp(proof + 4, a.nc, ST_AUTH_NONCE));
	oracle_proof(tok.key, hello, a.nc, want);
	FUZZ_ASSERT(!memcmp(proof, want, sizeof(want)));
	uint8_t right[ST_AUTH_MAC];
	oracle_mac(tok.key, 's', a.ns, a.nc, right);
	if (size && (p[0] & 2))
		memcpy(mac, right, sizeof(mac));
	rc = st_auth_cli_verify(&a, &tok, mac);
	FUZZ_ASSERT(rc == (memcmp(mac, right, sizeof(mac)) ? ST_EAUTH : 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	int mode = data[0] % 8;
	size_t piece = data[1] ? (size_t)data[1] * data[1] % 97 + 1 : 0;
	data += 2;
	size -= 2;
	switch (mode) {
	case 0: srv_feed(data, size, piece, 0); break;
	case 1: srv_feed(data, size, piece, 1); break;
	case 2: client(data, size); break;
	case 3: server(data, size); break;
	case 4: token_file(data, size); break;
	case 5: token_env(data, size); break;
	case 6: check_bind(data, size); break;
	case 7: client_steps(data, size); break;
	}
	return 0;
}
