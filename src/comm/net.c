/* Socket helpers: parsing, listening, connecting and full transfers with deadlines. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_int.h"

int st_parse_long(const char *s, long lo, long hi, long *out)
{
	if (!s || !*s || strlen(s) > 18)
		return -1;
	long v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (*p - '0');
	}
	if (v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int st_split_hostport(const char *s, char *host, size_t hostcap, int *port)
{
	const char *colon, *h = s;
	size_t hl;
	if (!s || !*s)
		return -1;
	if (s[0] == '[') {
		const char *end = strchr(s, ']');
		if (!end || end[1] != ':')
			return -1;
		h = s + 1;
		hl = (size_t)(end - h);
		colon = end + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || strchr(s, ':') != colon) /* bare IPv6 needs brackets */
			return -1;
		hl = (size_t)(colon - s);
	}
	if (hl == 0 || hl >= hostcap)
		return -1;
	for (size_t i = 0; i < hl; i++)
		if ((unsigned char)h[i] <= ' ' || h[i] == '/' || h[i] == '[' || h[i] == ']')
			return -1;
	long p;
	if (st_parse_long(colon + 1, 1, 65535, &p) < 0)
		return -1;
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (int)p;
	return 0;
}

int st_set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
	return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

void st_sock_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &one, sizeof(one));
}

void st_sock_tune(int fd)
{
	int big = 8 << 20;
	st_sock_nodelay(fd);
	/* Past net.core.[rw]mem_max only with CAP_NET_ADMIN; otherwise keep the
	 * kernel's autotuning (an explicit small SO_SNDBUF would disable it). */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)) == 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
}

/* A listening socket on one address. 0, or -errno. */
static int listen_addr(const struct sockaddr *sa, socklen_t sl, int backlog, int *fdp)
{
	int one = 1, zero = 0;
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* the wildcard IPv6 address also takes IPv4 (dual stack) */
	if (sa->sa_family == AF_INET6 &&
	    IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr))
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, sa, sl) < 0 || listen(fd, backlog) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	*fdp = fd;
	return 0;
}

int st_sock_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		return -errno;
	return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					: ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

int st_tcp_listen(const char *host, int port, int backlog, int *fdp, int *bound)
{
	struct addrinfo hints, *res, *ai;
	char ps[16];
	int fd = -1, r = -EADDRNOTAVAIL;
	if (host && (!*host || !strcmp(host, "*")))
		host = NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(ps, sizeof(ps), "%d", port);
	if (!host) {
		/* the wildcard: IPv6 dual stack, else IPv4 */
		struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_addr = in6addr_any,
					   .sin6_port = htons((uint16_t)port) };
		struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY),
					  .sin_port = htons((uint16_t)port) };
		r = listen_addr((struct sockaddr *)&a6, sizeof(a6), backlog, &fd);
		if (r == -EAFNOSUPPORT)
			r = listen_addr((struct sockaddr *)&a4, sizeof(a4), backlog, &fd);
	} else {
		int gr = getaddrinfo(host, ps, &hints, &res);
		if (gr != 0)
			return gr == EAI_SYSTEM ? -errno : -EADDRNOTAVAIL;
		for (ai = res; ai && fd < 0; ai = ai->ai_next)
			r = listen_addr(ai->ai_addr, ai->ai_addrlen, backlog, &fd);
		freeaddrinfo(res);
	}
	if (r < 0)
		return r;
	if ((r = st_sock_port(fd)) < 0) {
		close(fd);
		return r;
	}
	*bound = r;
	*fdp = fd;
	return 0;
}

int st_port_range_parse(const char *s, int *lo, int *hi)
{
	const char *dash = s ? strchr(s, '-') : NULL;
	char a[8];
	long l, h;
	if (!dash || dash - s < 1 || dash - s >= (long)sizeof(a))
		return -1;
	snprintf(a, sizeof(a), "%.*s", (int)(dash - s), s);
	if (st_parse_long(a, 1, 65535, &l) < 0 || st_parse_long(dash + 1, 1, 65535, &h) < 0 || l > h)
		return -1;
	*lo = (int)l;
	*hi = (int)h;
	return 0;
}

int st_addr_is_numeric(const char *s)
{
	unsigned char buf[16];
	return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* Where a process starts trying the n ports of a range: spread by pid. */
static int range_start(int n)
{
	return (int)((unsigned)getpid() * 2654435761u % (unsigned)n);
}

int st_tcp_listen_range(const char *host, int lo, int hi, int backlog, int *fd, int *bound)
{
	if (lo <= 0)
		return st_tcp_listen(host, 0, backlog, fd, bound);
	int n = hi - lo + 1, r = -EADDRINUSE;
	int start = range_start(n);
	for (int i = 0; i < n; i++) {
		r = st_tcp_listen(host, lo + (start + i) % n, backlog, fd, bound);
		if (r != -EADDRINUSE && r != -EACCES)
			return r;
	}
	return -EADDRINUSE;
}

int st_tcp_free_port(const char *host, int lo, int hi)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	socklen_t sl;
	if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		sl = sizeof(*a4);
	} else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		sl = sizeof(*a6);
	} else {
		return -EADDRNOTAVAIL;
	}
	int n = lo > 0 ? hi - lo + 1 : 1;
	int start = lo > 0 ? range_start(n) : 0, r = -EADDRINUSE;
	for (int i = 0; i < n; i++) {
		uint16_t port = lo > 0 ? (uint16_t)(lo + (start + i) % n) : 0;
		if (ss.ss_family == AF_INET)
			a4->sin_port = htons(port);
		else
			a6->sin6_port = htons(port);
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (bind(fd, (struct sockaddr *)&ss, sl) == 0) {
			r = st_sock_port(fd);
			close(fd);
			return r;
		}
		r = -errno;
		close(fd);
		if (r != -EADDRINUSE && r != -EACCES)
			return r;
	}
	return -EADDRINUSE;
}

/* "a.b.c.d:port", "[v6]:port", or for a unix socket "local pid P uid U". */
int st_sock_peer_name(int fd, char *buf, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char a[INET6_ADDRSTRLEN] = "?";
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
		snprintf(buf, cap, "?");
		return -errno;
	}
	if (ss.ss_family == AF_UNIX) {
		struct ucred uc;
		socklen_t ul = sizeof(uc);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0)
			snprintf(buf, cap, "local pid %d uid %u", (int)uc.pid, (unsigned)uc.uid);
		else
			snprintf(buf, cap, "local ?");
		return 0;
	}
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], a, sizeof(a));
			snprintf(buf, cap, "%s:%d", a, ntohs(s6->sin6_port));
		} else {
			inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
			snprintf(buf, cap, "[%s]:%d", a, ntohs(s6->sin6_port));
		}
		return 0;
	}
	struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
	inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
	snprintf(buf, cap, "%s:%d", a, ntohs(s4->sin_port));
	return 0;
}

static int wait_fd(int fd, short ev, int64_t deadline)
{
	for (;;) {
		int64_t left = deadline - st_mono_ns();
		if (left <= 0)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = fd, .events = ev };
		int ms = (int)(left / 1000000) + 1;
		int r = poll(&p, 1, ms);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

int st_tcp_connect(const char *host, int port, int64_t deadline, int *fdp)
{
	struct addrinfo hints, *res, *ai;
	char ps[16];
	int err = -EHOSTUNREACH;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	int gr = getaddrinfo(host, ps, &hints, &res);
	if (gr != 0)
		return gr == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (fd < 0) {
			err = -errno;
			continue;
		}
		int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
		if (r < 0 && errno == EINPROGRESS) {
			r = wait_fd(fd, POLLOUT, deadline);
			if (r == 0) {
				int so = 0;
				socklen_t sl = sizeof(so);
				getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
				r = so ? -so : 0;
			}
		} else if (r < 0) {
			r = -errno;
		}
		if (r == 0) {
			st_set_nonblock(fd, 0);
			st_sock_nodelay(fd);
			freeaddrinfo(res);
			*fdp = fd;
			return 0;
		}
		err = r;
		close(fd);
	}
	freeaddrinfo(res);
	return err;
}

int st_send_full(int fd, const void *p, size_t n, int64_t deadline)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			c += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int r = wait_fd(fd, POLLOUT, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

int st_recv_full(int fd, void *p, size_t n, int64_t deadline)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = recv(fd, c, n, MSG_DONTWAIT);
		if (r > 0) {
			c += r;
			n -= (size_t)r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int w = wait_fd(fd, POLLIN, deadline);
		if (w < 0)
			return w;
	}
	return 0;
}
