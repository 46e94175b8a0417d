/*
 * st_group_env_read: a process's place in the group, from the environment.
 *
 * Each launcher convention is one entry of the table `conventions` below,
 * in order of precedence: ours, torchrun (also Ray Train's torch backend),
 * JAX / MEGASCALE, Slurm. The first one with a trigger variable set supplies
 * rank, world size and a coordinator (docs/distributed.md has the table of
 * variables). SLICETRAIN_COORDINATOR, SLICETRAIN_NUM_SLICES and
 * SLICETRAIN_SLICE_ID apply on top of every convention (they are how the
 * others are told what they lack).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "comm/comm_int.h"

enum { MAX_WORLD = 1 << 20 };

static const char *get(const char *name)
{
	const char *v = getenv(name);
	return v; /* an empty value counts as set (and is then malformed) */
}

/* 1: absent (out untouched), 0: parsed, ST_EINVAL: malformed. */
static int int_var(const char *name, long lo, long hi, int *out)
{
	const char *v = get(name);
	long x;
	if (!v)
		return 1;
	if (st_parse_long(v, lo, hi, &x) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not an integer in [%ld, %ld]", name, v, lo, hi);
	*out = (int)x;
	return 0;
}

static int need_int(const char *name, long lo, long hi, int *out, const char *why)
{
	int r = int_var(name, lo, hi, out);
	if (r == 1)
		return st_fail(ST_EINVAL, "%s is not set (%s)", name, why);
	return r;
}

/* host:port into e->coordinator; name names the variable for messages. */
static int set_coord(st_group_env *e, const char *name, const char *val)
{
	char host[240];
	int port;
	if (st_split_hostport(val, host, sizeof(host), &port) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not host:port (port 1..65535; IPv6 as [addr]:port)",
			       name, val);
	if (strchr(host, ':'))
		snprintf(e->coordinator, sizeof(e->coordinator), "[%s]:%d", host, port);
	else
		snprintf(e->coordinator, sizeof(e->coordinator), "%s:%d", host, port);
	return 0;
}

/* host + separate port variable (MASTER_ADDR/MASTER_PORT, MEGASCALE_*). */
static int set_coord2(st_group_env *e, const char *hname, const char *hval, const char *pname,
		      const char *pval)
{
	long port;
	if (!*hval || strlen(hval) > 200 || strchr(hval, '/') || strchr(hval, ' '))
		return st_fail(ST_EINVAL, "%s='%s' is not a host name or address", hname, hval);
	if (st_parse_long(pval, 1, 65535, &port) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not a port number (1..65535)", pname, pval);
	if (strchr(hval, ':') && hval[0] != '[')
		snprintf(e->coordinator, sizeof(e->coordinator), "[%s]:%ld", hval, port);
	else
		snprintf(e->coordinator, sizeof(e->coordinator), "%s:%ld", hval, port);
	char h[256];
	int p;
	if (st_split_hostport(e->coordinator, h, sizeof(h), &p) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not a host name or address", hname, hval);
	return 0;
}

/* "host", "host:port", "[v6]:port" or a bare IPv6 address; a missing port
 * comes from the variable pname, else dflt (JAX: 1234 as MaxText's CPU
 * path and XPK use; MEGASCALE: 8081 as Ray and the GKE TPU webhook set). */
static int host_default_port(st_group_env *e, const char *name, const char *val, const char *pname,
			     const char *dflt)
{
	const char *pv = pname ? get(pname) : NULL;
	int colons = 0;
	for (const char *p = val; *p; p++)
		colons += *p == ':';
	if (!pv && (val[0] == '[' ? strstr(val, "]:") != NULL : colons == 1))
		return set_coord(e, name, val);
	if (val[0] == '[') {
		if (pv || val[strlen(val) - 1] != ']')
			return st_fail(ST_EINVAL, "%s='%s' is not host, host:port or [addr]:port", name, val);
		char h[200];
		snprintf(h, sizeof(h), "%.*s", (int)strlen(val) - 2, val + 1);
		return set_coord2(e, name, h, pname ? pname : name, dflt);
	}
	if (colons == 1)
		return st_fail(ST_EINVAL, "%s='%s' has a port, and %s is set too", name, val, pname);
	return set_coord2(e, name, val, pv ? pname : name, pv ? pv : dflt);
}

/* Which variables gave the place, for messages; NULL: not given. */
typedef struct origin {
	const char *rank, *world, *slices, *slice;
} origin;

/* A launcher convention: the variables that select it, how it gives rank
 * and world size, and its own coordinator. */
typedef struct convention {
	const char *source;      /* st_group_env.source */
	const char *triggers[5]; /* any of them set selects the convention (NULL-terminated) */
	const char *rank_var, *world_var, *local_var; /* for read_named */
	int (*read)(const struct convention *c, st_group_env *e, origin *o);
	/* into e->coordinator: 0, ST_EINVAL, or 1 when the convention gives none */
	int (*coordinator)(st_group_env *e);
	const char *no_coordinator; /* the error when a group has no coordinator */
} convention;

/* An optional integer variable: when set, parsed into *out and named in *given. */
static int given_int(const char *name, long lo, long hi, int *out, const char **given)
{
	if (!get(name))
		return 0;
	*given = name;
	return int_var(name, lo, hi, out);
}

/* Rank, world size and local rank from one variable each; rank and world
 * size each needed once the other is set. */
static int read_named(const convention *c, st_group_env *e, origin *o)
{
	char why[64];
	int r;
	o->rank = c->rank_var;
	o->world = c->world_var;
	snprintf(why, sizeof(why), "%s is set", c->rank_var);
	if ((r = need_int(c->world_var, 1, MAX_WORLD, &e->world_size, why)) < 0)
		return r;
	snprintf(why, sizeof(why), "%s is set", c->world_var);
	if ((r = need_int(c->rank_var, 0, MAX_WORLD, &e->rank, why)) < 0)
		return r;
	r = int_var(c->local_var, 0, MAX_WORLD, &e->local_rank);
	return r < 0 ? r : 0;
}

/* JAX's world: JAX_PROCESS_COUNT, else one process per TPU VM: the hosts
 * of TPU_WORKER_HOSTNAMES times the slices. */
static int read_jax_world(st_group_env *e, origin *o)
{
	const char *h = get("TPU_WORKER_HOSTNAMES");
	o->world = "JAX_PROCESS_COUNT";
	if (get(o->world) || !h)
		return need_int(o->world, 1, MAX_WORLD, &e->world_size, "JAX/MEGASCALE variables are set");
	int hosts = 1;
	for (const char *p = h; *p; p++)
		hosts += *p == ',';
	if (!*h || h[strlen(h) - 1] == ',' || strstr(h, ",,"))
		return st_fail(ST_EINVAL, "TPU_WORKER_HOSTNAMES='%s' is not a comma-separated host list", h);
	o->world = "TPU_WORKER_HOSTNAMES";
	e->world_size = hosts * e->num_slices;
	return 0;
}

/* TPU_WORKER_ID is the rank within the slice: placed globally by
 * MEGASCALE_SLICE_ID (needed with more than one slice). */
static int rank_from_tpu_worker(st_group_env *e, origin *o)
{
	int w, r;
	o->rank = "TPU_WORKER_ID";
	if ((r = int_var(o->rank, 0, MAX_WORLD, &w)) < 0)
		return r;
	if (!o->slice && e->num_slices > 1)
		return st_fail(ST_EINVAL, "MEGASCALE_SLICE_ID is not set (needed with TPU_WORKER_ID "
					  "and MEGASCALE_NUM_SLICES=%d)", e->num_slices);
	if (e->world_size % e->num_slices)
		return st_fail(ST_EINVAL, "%s=%d is not divisible by MEGASCALE_NUM_SLICES=%d", o->world, e->world_size,
			       e->num_slices);
	int per = e->world_size / e->num_slices;
	if (w >= per)
		return st_fail(ST_EINVAL, "TPU_WORKER_ID=%d is out of range: a slice has %d processes "
					  "(%s=%d / MEGASCALE_NUM_SLICES=%d)",
			       w, per, o->world, e->world_size, e->num_slices);
	if (o->slice && e->slice_id >= e->num_slices)
		return st_fail(ST_EINVAL, "MEGASCALE_SLICE_ID=%d is out of range: MEGASCALE_NUM_SLICES=%d", e->slice_id,
			       e->num_slices);
	e->rank = (o->slice ? e->slice_id : 0) * per + w;
	return 0;
}

/* JAX / MEGASCALE: slices and slice id from MEGASCALE_*, the world as
 * read_jax_world, the rank from JAX_PROCESS_ID, else from TPU_WORKER_ID. */
static int read_jax(const convention *c, st_group_env *e, origin *o)
{
	int r;
	if ((r = given_int("MEGASCALE_NUM_SLICES", 1, MAX_WORLD, &e->num_slices, &o->slices)) < 0 ||
	    (r = read_jax_world(e, o)) < 0 ||
	    (r = given_int("MEGASCALE_SLICE_ID", 0, MAX_WORLD, &e->slice_id, &o->slice)) < 0)
		return r;
	if (get("JAX_PROCESS_ID")) {
		o->rank = "JAX_PROCESS_ID";
		return int_var(o->rank, 0, MAX_WORLD, &e->rank);
	}
	if (get("TPU_WORKER_ID"))
		return rank_from_tpu_worker(e, o);
	return st_fail(ST_EINVAL, "JAX_PROCESS_ID is not set (nor TPU_WORKER_ID)");
}

/* MASTER_ADDR:MASTER_PORT (torchrun, Ray Train's torch backend, Slurm). */
static int coordinator_master(st_group_env *e)
{
	const char *addr = get("MASTER_ADDR"), *port = get("MASTER_PORT");
	if (!addr && !port)
		return 1;
	if (!addr || !port)
		return st_fail(ST_EINVAL, "%s is not set (%s is)", addr ? "MASTER_PORT" : "MASTER_ADDR",
			       addr ? "MASTER_ADDR" : "MASTER_PORT");
	/* torchrun's agent (static and c10d rendezvous alike) hosts its own
	 * TCPStore on MASTER_PORT and says so: take the next port. */
	const char *use = get("TORCHELASTIC_USE_AGENT_STORE");
	long mp;
	char next[16];
	if (st_parse_long(port, 1, 65535, &mp) < 0)
		return st_fail(ST_EINVAL, "MASTER_PORT='%s' is not a port number (1..65535)", port);
	if (use && (strcmp(use, "True") == 0 || strcmp(use, "true") == 0 || strcmp(use, "1") == 0)) {
		if (mp == 65535)
			return st_fail(ST_EINVAL, "MASTER_PORT=65535 is torchrun's store (TORCHELASTIC_USE_AGENT_STORE), "
						  "and there is no next port: set SLICETRAIN_COORDINATOR");
		mp++;
	}
	snprintf(next, sizeof(next), "%ld", mp);
	return set_coord2(e, "MASTER_ADDR", addr, "MASTER_PORT", next);
}

/* JAX_COORDINATOR_ADDRESS, else MEGASCALE_COORDINATOR_ADDRESS. */
static int coordinator_jax(st_group_env *e)
{
	const char *v;
	if ((v = get("JAX_COORDINATOR_ADDRESS")))
		return host_default_port(e, "JAX_COORDINATOR_ADDRESS", v, NULL, "1234");
	if ((v = get("MEGASCALE_COORDINATOR_ADDRESS")))
		return host_default_port(e, "MEGASCALE_COORDINATOR_ADDRESS", v, "MEGASCALE_PORT", "8081");
	return 1;
}

static const char no_master[] = "no coordinator: set SLICETRAIN_COORDINATOR or MASTER_ADDR and MASTER_PORT";

/* In order of precedence. */
static const convention conventions[] = {
	{ "slicetrain", { "SLICETRAIN_RANK", "SLICETRAIN_WORLD_SIZE" }, "SLICETRAIN_RANK", "SLICETRAIN_WORLD_SIZE",
	  "SLICETRAIN_LOCAL_RANK", read_named, NULL, "SLICETRAIN_COORDINATOR is not set" },
	{ "torchrun", { "RANK", "WORLD_SIZE" }, "RANK", "WORLD_SIZE", "LOCAL_RANK", read_named, coordinator_master,
	  no_master },
	{ "jax", { "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_COUNT", "JAX_PROCESS_ID", "MEGASCALE_COORDINATOR_ADDRESS" },
	  NULL, NULL, NULL, read_jax, coordinator_jax,
	  "no coordinator: set JAX_COORDINATOR_ADDRESS, MEGASCALE_COORDINATOR_ADDRESS or SLICETRAIN_COORDINATOR" },
	{ "slurm", { "SLURM_PROCID" }, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", read_named, coordinator_master,
	  no_master },
};

/* The first convention with one of its triggers set, or NULL. */
static const convention *find_convention(void)
{
	for (size_t i = 0; i < sizeof(conventions) / sizeof(conventions[0]); i++)
		for (const char *const *t = conventions[i].triggers; *t; t++)
			if (get(*t))
				return &conventions[i];
	return NULL;
}

/* SLICETRAIN_NUM_SLICES and SLICETRAIN_SLICE_ID override any convention's. */
static int read_our_slices(st_group_env *e, origin *o)
{
	int r = given_int("SLICETRAIN_NUM_SLICES", 1, MAX_WORLD, &e->num_slices, &o->slices);
	return r < 0 ? r : given_int("SLICETRAIN_SLICE_ID", 0, MAX_WORLD, &e->slice_id, &o->slice);
}

/* Rank within the world, slices dividing it, a given slice id agreeing with
 * the rank (slice-major); the slice id is then the derived one. */
static int check_place(st_group_env *e, const origin *o)
{
	const char *slices = o->slices ? o->slices : "SLICETRAIN_NUM_SLICES";
	if (e->rank >= e->world_size)
		return st_fail(ST_EINVAL, "%s=%d is out of range: %s=%d", o->rank, e->rank, o->world, e->world_size);
	if (e->num_slices > e->world_size || e->world_size % e->num_slices)
		return st_fail(ST_EINVAL, "%s=%d does not divide the world size %s=%d", slices, e->num_slices, o->world,
			       e->world_size);
	int derived = e->rank / (e->world_size / e->num_slices);
	if (o->slice && e->slice_id != derived)
		return st_fail(ST_EINVAL, "%s=%d is inconsistent with %s=%d: ranks are slice-major, so rank %d of %d "
					  "in %d slices is in slice %d",
			       o->slice, e->slice_id, o->rank, e->rank, e->rank, e->world_size, e->num_slices, derived);
	e->slice_id = derived;
	return 0;
}

/* SLICETRAIN_COORDINATOR, else the convention's own; a group needs one. */
static int read_coordinator(const convention *c, st_group_env *e, const origin *o)
{
	const char *v = get("SLICETRAIN_COORDINATOR");
	if (v)
		return set_coord(e, "SLICETRAIN_COORDINATOR", v);
	int r = c->coordinator ? c->coordinator(e) : 1;
	if (r != 1)
		return r;
	if (e->world_size > 1)
		return st_fail(ST_EINVAL, "%s (%s=%d)", c->no_coordinator, o->world, e->world_size);
	return 0;
}

int st_group_env_read(st_group_env *e)
{
	origin o = { 0 };
	int r;
	memset(e, 0, sizeof(*e));
	e->world_size = 1;
	e->num_slices = 1;
	e->local_rank = -1;
	e->source = "single";
	const convention *c = find_convention();
	if (!c) {
		e->local_rank = 0;
		/* our slice variables alone make no group */
		if (get("SLICETRAIN_COORDINATOR") || get("SLICETRAIN_NUM_SLICES") || get("SLICETRAIN_SLICE_ID"))
			return st_fail(ST_EINVAL, "SLICETRAIN_RANK and SLICETRAIN_WORLD_SIZE are not set, but other "
						  "SLICETRAIN_ group variables are");
		return 0;
	}
	e->source = c->source;
	if ((r = c->read(c, e, &o)) < 0 || (r = read_our_slices(e, &o)) < 0 || (r = check_place(e, &o)) < 0)
		return r;
	return read_coordinator(c, e, &o);
}

/* An elastic variable: unset or empty -> 1 (absent), else parsed (0) or ST_EINVAL. */
static int elastic_var(const char *name, long lo, long hi, long *out, const char *what)
{
	const char *v = get(name);
	if (!v || !*v)
		return 1;
	if (st_parse_long(v, lo, hi, out) < 0)
		return st_fail(ST_EINVAL, "%s='%s' is not %s", name, v, what);
	return 0;
}

int st_elastic_env_read(st_elastic_env *e)
{
	long x;
	int r;
	*e = (st_elastic_env){.generation = -1, .joiner = 0, .max_devices = 0, .control_fd = -1};
	if ((r = elastic_var("SLICETRAIN_GENERATION", 0, 1L << 40, &x, "a generation number (0 or more)")) < 0)
		return r;
	if (r == 0)
		e->generation = x;
	if ((r = elastic_var("SLICETRAIN_JOIN", 0, 1, &x, "0 or 1")) < 0)
		return r;
	e->joiner = r == 0 && x == 1;
	if ((r = elastic_var("SLICETRAIN_ELASTIC_MAX_DEVICES", 1, MAX_WORLD, &x,
			     "a device count (a whole number >= 1: the group's devices at its maximum size)")) < 0)
		return r;
	if (r == 0)
		e->max_devices = x;
	if ((r = elastic_var("SLICETRAIN_STEP_WATCHDOG_MS", 0, 3600000, &x,
			     "a number of milliseconds (0: no step watchdog, else 100 to 3600000)")) < 0)
		return r;
	if (r == 0 && x > 0 && x < 100)
		return st_fail(ST_EINVAL, "SLICETRAIN_STEP_WATCHDOG_MS=%ld is below 100 ms (0: no step watchdog)", x);
	e->watchdog_ms = r == 0 ? (int)x : 0;
	const char *fd = get("SLICETRAIN_CONTROL_FD");
	if (fd) {
		if (st_parse_long(fd, 3, 1 << 20, &x) < 0)
			return st_fail(ST_EINVAL, "SLICETRAIN_CONTROL_FD='%s' is not the number of an open stream socket",
				       fd);
		e->control_fd = (int)x;
		unsetenv("SLICETRAIN_CONTROL_FD"); /* not for the processes this one might start */
	}
	return 0;
}
