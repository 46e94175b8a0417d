/* free_port.h - a TCP port on loopback that is free right now (for tests
 * that start a worker group's rendezvous store). Exits the test on failure.
 *
 * Taken at random below the kernel's ephemeral range
 * (/proc/sys/net/ipv4/ip_local_port_range), where no outgoing connection
 * of another test can be given it between this check and the bind of the
 * process the port is meant for (a port the kernel picks with bind(0) is in
 * that range). Falls back to bind(0) when 100 tries find none. */
#ifndef ST_TESTS_FREE_PORT_H
#define ST_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int free_port_try(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons((unsigned short)port)};
	socklen_t l = sizeof(a);
	if (fd < 0) {
		perror("free_port");
		exit(1);
	}
	int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr *)&a, &l) == 0;
	close(fd);
	return ok ? ntohs(a.sin_port) : -1;
}

static int free_port(void)
{
	static unsigned seed;
	int lo = 32768;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%d", &lo) != 1)
			lo = 32768;
		fclose(f);
	}
	if (!seed)
		seed = (unsigned)getpid() ^ (unsigned)time(NULL);
	for (int i = 0; lo > 11000 && i < 100; i++) {
		int port = 10000 + (int)(rand_r(&seed) % (unsigned)(lo - 11000));
		if ((port = free_port_try(port)) > 0)
			return port;
	}
	int port = free_port_try(0);
	if (port < 0) {
		perror("free_port");
		exit(1);
	}
	return port;
}

#endif
