/*
 * The run token and the connection handshake (auth.h), on OpenSSL's
 * libcrypto: SHA-256 for the key, one-shot HMAC-SHA256 for the proofs,
 * CRYPTO_memcmp to compare them in constant time; nonces from getrandom().
 *
 * The token's bytes live only in a buffer of st_token_load, which is
 * cleansed before it returns; what stays is the key (its SHA-256). No
 * message of this file prints either.
 */
#include "comm/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "comm/net.h"

static const uint8_t auth_magic[4] = { 'S', 'T', 'A', '1' };

/* A token file is read up to this many bytes: a longer one is refused
 * (ST_AUTH_MAX_TOKEN plus room for surrounding whitespace). */
enum { TOKEN_FILE_MAX = 2 * ST_AUTH_MAX_TOKEN };

static int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* The key of token bytes p[0..n) with surrounding whitespace ignored;
 * source names where they came from in messages. */
static int token_from(st_token *t, const uint8_t *p, size_t n, const char *source, const char *what)
{
	while (n > 0 && is_space(p[0])) {
		p++;
		n--;
	}
	while (n > 0 && is_space(p[n - 1]))
		n--;
	if (n < ST_AUTH_MIN_TOKEN)
		return st_fail(ST_EINVAL, "%s: the run token is too short (%zu bytes, at least %d)", what, n,
			       ST_AUTH_MIN_TOKEN);
	if (n > ST_AUTH_MAX_TOKEN)
		return st_fail(ST_EINVAL, "%s: the run token is too long (more than %d bytes)", what, ST_AUTH_MAX_TOKEN);
	SHA256(p, n, t->key);
	t->set = 1;
	snprintf(t->source, sizeof(t->source), "%s", source);
	return 0;
}

/* name: where the path came from, for messages: the variable
 * SLICETRAIN_TOKEN_FILE ("SLICETRAIN_TOKEN_FILE=PATH: ...") or an option
 * such as "--token-file" ("--token-file PATH: ..."). */
static int token_file(st_token *t, const char *path, const char *name)
{
	char what[300];
	int option = name[0] == '-';
	snprintf(what, sizeof(what), "%.40s%s%.250s", name, option ? " " : "=", path);
	if (!*path)
		return st_fail(ST_EINVAL, option ? "%s needs the path of the run's token file" : "%s is set but empty",
			       name);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return st_fail(ST_EINVAL, "%s: cannot open the token file: %s", what, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) < 0) {
		int e = errno;
		close(fd);
		return st_fail(ST_EINVAL, "%s: %s", what, strerror(e));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: not a regular file", what);
	}
	if (sb.st_mode & 077) {
		close(fd);
		return st_fail(ST_EINVAL, "%s: the token file has mode %04o: it must be readable by its owner only "
					  "(chmod 600)", what, (unsigned)(sb.st_mode & 07777));
	}
	uint8_t *buf = malloc(TOKEN_FILE_MAX + 1);
	if (!buf) {
		close(fd);
		return st_fail(ST_ENOMEM, "out of memory");
	}
	size_t n = 0;
	int rc = 0;
	while (n <= TOKEN_FILE_MAX) {
		ssize_t r = read(fd, buf + n, TOKEN_FILE_MAX + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = st_fail(ST_EINVAL, "%s: cannot read the token file: %s", what, strerror(errno));
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	if (rc == 0 && n > TOKEN_FILE_MAX)
		rc = st_fail(ST_EINVAL, "%s: the run token is too long (more than %d bytes)", what, ST_AUTH_MAX_TOKEN);
	if (rc == 0)
		rc = token_from(t, buf, n, name, what);
	OPENSSL_cleanse(buf, TOKEN_FILE_MAX + 1);
	free(buf);
	return rc;
}

int st_token_load(st_token *t)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->source, sizeof(t->source), "none");
	const char *path = getenv("SLICETRAIN_TOKEN_FILE");
	if (path)
		return token_file(t, path, "SLICETRAIN_TOKEN_FILE");
	const char *tok = getenv("SLICETRAIN_TOKEN");
	if (tok)
		return token_from(t, (const uint8_t *)tok, strlen(tok), "SLICETRAIN_TOKEN", "SLICETRAIN_TOKEN");
	return 0;
}

int st_token_load_file(st_token *t, const char *path, const char *option)
{
	memset(t, 0, sizeof(*t));
	return token_file(t, path, option);
}

void st_token_clear(st_token *t)
{
	OPENSSL_cleanse(t->key, sizeof(t->key));
	t->set = 0;
}

/* 1 when a numeric address is loopback (127.0.0.0/8, ::1, ::ffff:127.x). */
static int addr_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
	if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a))
			return 1;
		return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
	}
	return 0;
}

int st_auth_host_is_loopback(const char *host)
{
	if (!host || !*host || !strcmp(host, "*"))
		return 0;
	if (!strcmp(host, "localhost"))
		return 1;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
	if (getaddrinfo(host, NULL, &hints, &res) != 0)
		return 0;
	int all = res != NULL;
	for (ai = res; ai; ai = ai->ai_next)
		if (!addr_loopback(ai->ai_addr))
			all = 0;
	freeaddrinfo(res);
	return all;
}

int st_auth_check_bind(const st_token *t, const char *host)
{
	if ((t && t->set) || st_auth_host_is_loopback(host))
		return 0;
	return st_fail(ST_EINVAL,
		       "refusing to listen on %s without a run token: it is not a loopback address, so anyone who "
		       "reaches it could join the run. Set SLICETRAIN_TOKEN_FILE to a file readable by its owner only "
		       "(chmod 600) that holds a secret of %d to %d bytes, the same for every process of the run "
		       "(docs/auth.md), or use a loopback coordinator (127.0.0.1)",
		       host && *host && strcmp(host, "*") ? host : "every address (*)", ST_AUTH_MIN_TOKEN,
		       ST_AUTH_MAX_TOKEN);
}

void st_auth_hmac(const st_token *t, const void *msg, size_t n, uint8_t out[ST_AUTH_MAC])
{
	static const uint8_t zeros[ST_AUTH_KEY];
	unsigned int len = ST_AUTH_MAC;
	if (!HMAC(EVP_sha256(), t && t->set ? t->key : zeros, ST_AUTH_KEY, msg, n, out, &len) || len != ST_AUTH_MAC)
		ST_BUG("HMAC-SHA256 failed");
}

/* HMAC(key, tag | ns | nc); a missing token means a key of zeros. */
static void proof_mac(const st_token *t, char tag, const uint8_t ns[ST_AUTH_NONCE], const uint8_t nc[ST_AUTH_NONCE],
		      uint8_t out[ST_AUTH_MAC])
{
	static const uint8_t zeros[ST_AUTH_KEY];
	uint8_t msg[1 + 2 * ST_AUTH_NONCE];
	unsigned int len = ST_AUTH_MAC;
	msg[0] = (uint8_t)tag;
	memcpy(msg + 1, ns, ST_AUTH_NONCE);
	memcpy(msg + 1 + ST_AUTH_NONCE, nc, ST_AUTH_NONCE);
	if (!HMAC(EVP_sha256(), t && t->set ? t->key : zeros, ST_AUTH_KEY, msg, sizeof(msg), out, &len) ||
	    len != ST_AUTH_MAC)
		ST_BUG("HMAC-SHA256 failed");
}

static int nonce(uint8_t out[ST_AUTH_NONCE])
{
	size_t n = 0;
	while (n < ST_AUTH_NONCE) {
		ssize_t r = getrandom(out + n, ST_AUTH_NONCE - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return st_fail(ST_EIO, "getrandom: %s", strerror(errno));
		n += (size_t)r;
	}
	return 0;
}

/* ---- client ---- */

int st_auth_cli_answer(st_auth_cli *a, const st_token *t, const uint8_t hello[ST_AUTH_HELLO],
		       uint8_t out[ST_AUTH_PROOF])
{
	int rc;
	if (memcmp(hello, auth_magic, sizeof(auth_magic)) != 0)
		return st_fail(ST_EPEER, "the peer did not start the run token's handshake (not a slicetrain "
					 "listener, or another version)");
	memcpy(a->ns, hello + 4, ST_AUTH_NONCE);
	if ((rc = nonce(a->nc)) < 0)
		return rc;
	memcpy(out, auth_magic, 4);
	memcpy(out + 4, a->nc, ST_AUTH_NONCE);
	proof_mac(t, 'c', a->ns, a->nc, out + 4 + ST_AUTH_NONCE);
	return 0;
}

int st_auth_cli_verify(const st_auth_cli *a, const st_token *t, const uint8_t mac[ST_AUTH_MAC])
{
	uint8_t want[ST_AUTH_MAC];
	proof_mac(t, 's', a->ns, a->nc, want);
	if (CRYPTO_memcmp(want, mac, ST_AUTH_MAC) != 0)
		return st_fail(ST_EAUTH, "the peer's proof of the run token is wrong (it holds a different token, "
					 "or none)");
	return 0;
}

int st_auth_client(int fd, const st_token *t, int64_t deadline)
{
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], mac[ST_AUTH_MAC];
	st_auth_cli a;
	int r = st_recv_full(fd, hello, sizeof(hello), deadline);
	if (r < 0)
		return st_fail(ST_EPEER, "handshake: %s before the peer's hello",
			       r == -ECONNRESET ? "the connection closed" : strerror(-r));
	if ((r = st_auth_cli_answer(&a, t, hello, proof)) < 0)
		return r;
	if ((r = st_send_full(fd, proof, sizeof(proof), deadline)) < 0)
		return st_fail(ST_EPEER, "handshake: cannot send the proof: %s", strerror(-r));
	r = st_recv_full(fd, mac, sizeof(mac), deadline);
	if (r == -ECONNRESET || r == -EPIPE)
		return st_fail(ST_EAUTH, "the peer refused this process's proof of the run token and closed the "
					 "connection (it holds a different token, or none)");
	if (r < 0)
		return st_fail(ST_EPEER, "handshake: %s waiting for the peer's proof", strerror(-r));
	return st_auth_cli_verify(&a, t, mac);
}

/* ---- server ---- */

int st_auth_srv_start(st_auth_srv *a, uint8_t out[ST_AUTH_HELLO])
{
	memset(a, 0, sizeof(*a));
	int rc = nonce(a->ns);
	if (rc < 0)
		return rc;
	memcpy(out, auth_magic, 4);
	memcpy(out + 4, a->ns, ST_AUTH_NONCE);
	return 0;
}

int st_auth_srv_feed(st_auth_srv *a, const st_token *t, const uint8_t *in, size_t n, size_t *used,
		     uint8_t out[ST_AUTH_MAC])
{
	*used = 0;
	if (a->done)
		return 1;
	if (a->have > ST_AUTH_PROOF)
		ST_BUG("st_auth_srv: corrupt state");
	size_t take = ST_AUTH_PROOF - a->have;
	if (take > n)
		take = n;
	if (take)
		memcpy(a->in + a->have, in, take);
	a->have += take;
	*used = take;
	if (a->have < ST_AUTH_PROOF)
		return 0;
	if (memcmp(a->in, auth_magic, sizeof(auth_magic)) != 0)
		return st_fail(ST_EAUTH, "not the run token's handshake (garbage or another protocol)");
	const uint8_t *nc = a->in + 4;
	uint8_t want[ST_AUTH_MAC];
	proof_mac(t, 'c', a->ns, nc, want);
	if (CRYPTO_memcmp(want, a->in + 4 + ST_AUTH_NONCE, ST_AUTH_MAC) != 0)
		return st_fail(ST_EAUTH, "wrong proof of the run token (a different token, none, or a replayed "
					 "handshake)");
	proof_mac(t, 's', a->ns, nc, out);
	a->done = 1;
	return 1;
}

int st_auth_server(int fd, const st_token *t, int64_t deadline)
{
	st_auth_srv a;
	uint8_t hello[ST_AUTH_HELLO], proof[ST_AUTH_PROOF], mac[ST_AUTH_MAC];
	size_t used;
	int r = st_auth_srv_start(&a, hello);
	if (r < 0)
		return r;
	if ((r = st_send_full(fd, hello, sizeof(hello), deadline)) < 0)
		return st_fail(ST_EPEER, "handshake: cannot send the hello: %s", strerror(-r));
	if ((r = st_recv_full(fd, proof, sizeof(proof), deadline)) < 0)
		return st_fail(ST_EPEER, "handshake: %s before the peer's proof",
			       r == -ECONNRESET ? "the connection closed" : strerror(-r));
	if ((r = st_auth_srv_feed(&a, t, proof, sizeof(proof), &used, mac)) < 0)
		return r;
	if ((r = st_send_full(fd, mac, sizeof(mac), deadline)) < 0)
		return st_fail(ST_EPEER, "handshake: cannot send the answer: %s", strerror(-r));
	return 0;
}

/* ---- logging refused connections ---- */

void st_auth_log_drop(st_drop_log *l, const char *where, const char *peer, const char *why)
{
	int64_t now = st_mono_ns();
	int saved = errno;
	if (now - l->window_start > (int64_t)ST_DROP_LOG_WINDOW_S * 1000000000) {
		if (l->suppressed)
			fprintf(stderr, "slicetrain: warning: %s: %lu more connections dropped in %d s (not logged)\n",
				where, l->suppressed, ST_DROP_LOG_WINDOW_S);
		l->window_start = now;
		l->logged = 0;
		l->suppressed = 0;
	}
	l->total++;
	if (l->logged < ST_DROP_LOG_BURST) {
		l->logged++;
		/* not st_warn: refused connections are logged on every rank */
		fprintf(stderr, "slicetrain: warning: %s: connection dropped from %s: %s\n", where,
			peer && *peer ? peer : "?", why);
	} else {
		l->suppressed++;
	}
	errno = saved;
}
