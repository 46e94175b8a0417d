/* free_port.h - a TCP port on loopback that is free right now (for tests
 * that start a worker group's rendezvous store). Exits the test on failure. */
#ifndef ST_TESTS_FREE_PORT_H
#define ST_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof(a);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || getsockname(fd, (struct sockaddr *)&a, &l) < 0) {
		perror("free_port");
		exit(1);
	}
	close(fd);
	return ntohs(a.sin_port);
}

#endif
