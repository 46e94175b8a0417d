/*
 * worker.c - the worker's end of the agent's control channel (worker.h):
 * protocol lines over a socketpair, read with proto.c's framing.
 */
#include "elastic/worker.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "comm/net.h"
#include "elastic/proto.h"

struct st_worker_ctl {
	st_proto_conn c;
	pthread_mutex_t send_mu; /* the trainer's ack and the watchdog's hung */
};

int st_worker_ctl_open(st_worker_ctl **out, int fd)
{
	*out = NULL;
	if (fd < 0)
		return 0;
	int type = 0;
	socklen_t len = sizeof(type);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM)
		return st_fail(ST_EINVAL, "SLICETRAIN_CONTROL_FD=%d is not the number of an open stream socket", fd);
	st_worker_ctl *w = calloc(1, sizeof(*w));
	if (!w)
		return st_fail(ST_ENOMEM, "out of memory");
	int rc = st_proto_conn_init(&w->c, fd);
	if (rc < 0) {
		free(w);
		return rc;
	}
	pthread_mutex_init(&w->send_mu, NULL);
	*out = w;
	return 0;
}

/* A reform message: its variables set in this process's environment (only
 * SLICETRAIN_ ones), then read as a group environment. */
static int take_reform(const json_t *m, st_reform *r)
{
	long long gen;
	int rc = st_proto_get_int(m, "gen", 1, 1LL << 40, &gen);
	if (rc < 0)
		return rc;
	const json_t *env;
	if ((rc = st_proto_get_env(m, 1 << 12, &env)) < 0)
		return st_wrap(rc, "protocol: reform");
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)env, k, v)
		setenv(k, json_string_value(v), 1);
	if ((rc = st_group_env_read(&r->env)) < 0 || (rc = st_elastic_env_read(&r->elastic)) < 0) {
		return st_wrap(ST_EPROTO, "protocol: reform");
	}
	r->gen = gen;
	return 0;
}

int st_worker_ctl_wait(st_worker_ctl *w, int timeout_ms, st_reform *r)
{
	int64_t deadline = st_mono_ns() + (int64_t)timeout_ms * 1000000;
	for (;;) {
		json_t *m = NULL;
		int rc = st_proto_recv(&w->c, &m);
		if (rc == 1) {
			const char *type = json_string_value(json_object_get(m, "type"));
			if (strcmp(type, "reform"))
				rc = st_fail(ST_EPROTO, "protocol: the agent sent '%.40s' (want reform)", type);
			else
				rc = take_reform(m, r);
			json_decref(m);
			if (rc < 0) {
				st_proto_conn_release(&w->c);
				return rc;
			}
			return 1;
		}
		if (rc < 0) {
			if (rc != ST_EPEER)
				st_proto_conn_release(&w->c);
			return rc == ST_EPEER ? st_fail(ST_EPEER, "the agent closed the control channel") : rc;
		}
		int64_t left = deadline - st_mono_ns();
		if (left <= 0)
			return 0;
		struct pollfd p = {.fd = w->c.fd, .events = POLLIN};
		if (poll(&p, 1, (int)(left / 1000000) + 1) < 0 && errno != EINTR)
			return st_fail(ST_EIO, "poll: %s", strerror(errno));
	}
}

/* One line to the agent, sent within 1 s. */
static int send_line(st_worker_ctl *w, json_t *m)
{
	pthread_mutex_lock(&w->send_mu);
	int rc = st_proto_send_new(&w->c, m);
	if (rc == 0)
		rc = st_proto_flush_until(&w->c, st_mono_ns() + 1000000000);
	pthread_mutex_unlock(&w->send_mu);
	return rc;
}

int st_worker_ctl_ack(st_worker_ctl *w, long long gen)
{
	return send_line(w, json_pack("{s:s, s:I}", "type", "reformed", "gen", (json_int_t)gen));
}

int st_worker_ctl_step(st_worker_ctl *w, long long step, double compute_s)
{
	return send_line(w, json_pack("{s:s, s:I, s:f}", "type", "step", "step", (json_int_t)step, "compute_s", compute_s));
}

int st_worker_ctl_hung(st_worker_ctl *w, const char *why)
{
	return send_line(w, json_pack("{s:s, s:s}", "type", "hung", "why", why));
}

void st_worker_ctl_close(st_worker_ctl *w)
{
	if (!w)
		return;
	st_proto_conn_release(&w->c);
	pthread_mutex_destroy(&w->send_mu);
	free(w);
}
