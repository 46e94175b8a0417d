/*
 * net.h - socket helpers: host:port parsing, TCP listen and connect with
 * deadlines (CLOCK_MONOTONIC ns, base/clock.h), bounded full transfers.
 * Used by the worker group (src/comm) and the elastic layer (src/elastic).
 */
#ifndef ST_COMM_NET_H
#define ST_COMM_NET_H

#include <stddef.h>
#include <stdint.h>


/* "host:port" or "[v6]:port" -> host, port (1..65535). 0 or -1 (no message). */
int st_split_hostport(const char *s, char *host, size_t hostcap, int *port);
/* Strict decimal integer in [lo, hi]: no sign, spaces or trailing characters. 0 or -1. */
int st_parse_long(const char *s, long lo, long hi, long *out);
/* Listen on host (a name or numeric address: its first address that binds;
 * NULL, "" or "*": the wildcard, IPv6 dual stack, else IPv4) and port (0
 * picks one). Callers that accept peers check the address first with
 * st_auth_check_bind (comm/auth.h). 0, or -errno (-EADDRNOTAVAIL for a host
 * that does not resolve). */
int st_tcp_listen(const char *host, int port, int backlog, int *fd, int *bound_port);
/* 1 when s is a numeric IPv4 or IPv6 address, else 0. */
int st_addr_is_numeric(const char *s);
/* "LO-HI" (1 <= LO <= HI <= 65535) -> lo, hi. 0 or -1 (no message). */
int st_port_range_parse(const char *s, int *lo, int *hi);
/* st_tcp_listen on the first port of lo..hi that binds, trying them from
 * an offset that differs between processes (pid), so that processes of one
 * host starting together mostly find a free port at the first try; lo 0:
 * any port. 0, or -errno (-EADDRINUSE when every port of the range is taken). */
int st_tcp_listen_range(const char *host, int lo, int hi, int backlog, int *fd, int *bound_port);
/* A TCP port of lo..hi (lo 0: any) free right now on the numeric address
 * host: bound and released at once, never listening (a port scan never
 * sees it). The port, or -errno. */
int st_tcp_free_port(const char *host, int lo, int hi);
/* The local port of a socket, or -errno. */
int st_sock_port(int fd);
/* The peer of a connected socket for log lines: "a.b.c.d:port", "[v6]:port",
 * or "local pid P uid U" for a unix socket ("?" when unknown). 0 or -errno. */
int st_sock_peer_name(int fd, char *buf, size_t cap);
/* Connect to host:port, trying every address, until deadline (CLOCK_MONOTONIC
 * ns). The socket is blocking, CLOEXEC, TCP_NODELAY. 0, or -errno. */
int st_tcp_connect(const char *host, int port, int64_t deadline, int *fd);
/* Blocking-style full transfers on any socket, bounded by deadline.
 * 0, or -errno (-ETIMEDOUT, -ECONNRESET for end of stream). */
int st_send_full(int fd, const void *p, size_t n, int64_t deadline);
int st_recv_full(int fd, void *p, size_t n, int64_t deadline);
int st_set_nonblock(int fd, int on);
/* TCP_NODELAY, and linear retransmission timeouts while the stream is thin
 * (TCP_THIN_LINEAR_TIMEOUTS: heartbeats and small messages): a lost segment
 * is retried every 200 ms instead of after 200, 400, 800 ms..., so that 5%
 * packet loss does not hold a heartbeat back for seconds (docs/failures.md). */
void st_sock_nodelay(int fd);
/* Large buffers (SO_SNDBUFFORCE when allowed) and st_sock_nodelay on a data socket. */
void st_sock_tune(int fd);

#endif
