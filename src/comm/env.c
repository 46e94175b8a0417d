/*
 * st_group_env_read: a process's place in the group, from the environment.
 *
 * The first convention with one of its trigger variables set supplies rank
 * and world size (docs/distributed.md has the table):
 *   slicetrain  SLICETRAIN_RANK / SLICETRAIN_WORLD_SIZE
 *   torchrun    RANK / WORLD_SIZE                 (also Ray Train's torch backend)
 *   jax         JAX_COORDINATOR_ADDRESS / JAX_PROCESS_COUNT / JAX_PROCESS_ID /
 *               MEGASCALE_COORDINATOR_ADDRESS
 *   slurm       SLURM_PROCID
 * SLICETRAIN_COORDINATOR, SLICETRAIN_NUM_SLICES and SLICETRAIN_SLICE_ID apply
 * on top of every convention (they are how the others are told what they
 * lack).
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

static int any_set(const char *const *names)
{
	for (; *names; names++)
		if (get(*names))
			return 1;
	return 0;
}

int st_group_env_read(st_group_env *e)
{
	static const char *const ours[] = { "SLICETRAIN_RANK", "SLICETRAIN_WORLD_SIZE", NULL };
	static const char *const torch[] = { "RANK", "WORLD_SIZE", NULL };
	static const char *const jax[] = { "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_COUNT", "JAX_PROCESS_ID",
					   "MEGASCALE_COORDINATOR_ADDRESS", NULL };
	static const char *const slurm[] = { "SLURM_PROCID", NULL };
	const char *rank_var = NULL, *world_var = NULL, *slices_var = NULL, *slice_var = NULL;
	int r, slice_given = 0;
	memset(e, 0, sizeof(*e));
	e->world_size = 1;
	e->num_slices = 1;
	e->local_rank = -1;
	e->source = "single";

	if (any_set(ours)) {
		e->source = "slicetrain";
		rank_var = "SLICETRAIN_RANK";
		world_var = "SLICETRAIN_WORLD_SIZE";
		if ((r = need_int(world_var, 1, MAX_WORLD, &e->world_size, "SLICETRAIN_RANK is set")) < 0)
			return r;
		if ((r = need_int(rank_var, 0, MAX_WORLD, &e->rank, "SLICETRAIN_WORLD_SIZE is set")) < 0)
			return r;
		if ((r = int_var("SLICETRAIN_LOCAL_RANK", 0, MAX_WORLD, &e->local_rank)) == ST_EINVAL)
			return r;
	} else if (any_set(torch)) {
		e->source = "torchrun";
		rank_var = "RANK";
		world_var = "WORLD_SIZE";
		if ((r = need_int(world_var, 1, MAX_WORLD, &e->world_size, "RANK is set")) < 0)
			return r;
		if ((r = need_int(rank_var, 0, MAX_WORLD, &e->rank, "WORLD_SIZE is set")) < 0)
			return r;
		if ((r = int_var("LOCAL_RANK", 0, MAX_WORLD, &e->local_rank)) == ST_EINVAL)
			return r;
	} else if (any_set(jax)) {
		e->source = "jax";
		world_var = "JAX_PROCESS_COUNT";
		if (get("MEGASCALE_NUM_SLICES")) {
			slices_var = "MEGASCALE_NUM_SLICES";
			if ((r = int_var(slices_var, 1, MAX_WORLD, &e->num_slices)) < 0)
				return r;
		}
		if (!get(world_var) && get("TPU_WORKER_HOSTNAMES")) {
			/* one process per TPU VM: the slice's host list times the slices */
			const char *h = get("TPU_WORKER_HOSTNAMES");
			int hosts = 1;
			for (const char *p = h; *p; p++)
				hosts += *p == ',';
			if (!*h || h[strlen(h) - 1] == ',' || strstr(h, ",,"))
				return st_fail(ST_EINVAL, "TPU_WORKER_HOSTNAMES='%s' is not a comma-separated host list", h);
			world_var = "TPU_WORKER_HOSTNAMES";
			e->world_size = hosts * e->num_slices;
		} else if ((r = need_int(world_var, 1, MAX_WORLD, &e->world_size, "JAX/MEGASCALE variables are set")) < 0) {
			return r;
		}
		if (get("MEGASCALE_SLICE_ID")) {
			slice_var = "MEGASCALE_SLICE_ID";
			if ((r = int_var(slice_var, 0, MAX_WORLD, &e->slice_id)) < 0)
				return r;
			slice_given = 1;
		}
		if (get("JAX_PROCESS_ID")) {
			rank_var = "JAX_PROCESS_ID";
			if ((r = int_var(rank_var, 0, MAX_WORLD, &e->rank)) < 0)
				return r;
		} else if (get("TPU_WORKER_ID")) {
			/* rank within the slice; needs the slice to place it globally */
			int w;
			rank_var = "TPU_WORKER_ID";
			if ((r = int_var(rank_var, 0, MAX_WORLD, &w)) < 0)
				return r;
			if (!slice_given && e->num_slices > 1)
				return st_fail(ST_EINVAL, "MEGASCALE_SLICE_ID is not set (needed with TPU_WORKER_ID "
							  "and MEGASCALE_NUM_SLICES=%d)", e->num_slices);
			if (e->world_size % e->num_slices)
				return st_fail(ST_EINVAL, "%s=%d is not divisible by MEGASCALE_NUM_SLICES=%d",
					       world_var, e->world_size, e->num_slices);
			int per = e->world_size / e->num_slices;
			if (w >= per)
				return st_fail(ST_EINVAL, "TPU_WORKER_ID=%d is out of range: a slice has %d processes "
							  "(%s=%d / MEGASCALE_NUM_SLICES=%d)",
					       w, per, world_var, e->world_size, e->num_slices);
			if (slice_given && e->slice_id >= e->num_slices)
				return st_fail(ST_EINVAL, "MEGASCALE_SLICE_ID=%d is out of range: MEGASCALE_NUM_SLICES=%d",
					       e->slice_id, e->num_slices);
			e->rank = (slice_given ? e->slice_id : 0) * per + w;
		} else {
			return st_fail(ST_EINVAL, "JAX_PROCESS_ID is not set (nor TPU_WORKER_ID)");
		}
	} else if (any_set(slurm)) {
		e->source = "slurm";
		rank_var = "SLURM_PROCID";
		world_var = "SLURM_NTASKS";
		if ((r = need_int(world_var, 1, MAX_WORLD, &e->world_size, "SLURM_PROCID is set")) < 0)
			return r;
		if ((r = int_var(rank_var, 0, MAX_WORLD, &e->rank)) < 0)
			return r;
		if ((r = int_var("SLURM_LOCALID", 0, MAX_WORLD, &e->local_rank)) == ST_EINVAL)
			return r;
	} else {
		e->rank = 0;
		e->local_rank = 0;
		/* our slice variables alone make no group */
		if (get("SLICETRAIN_COORDINATOR") || get("SLICETRAIN_NUM_SLICES") || get("SLICETRAIN_SLICE_ID"))
			return st_fail(ST_EINVAL, "SLICETRAIN_RANK and SLICETRAIN_WORLD_SIZE are not set, but other "
						  "SLICETRAIN_ group variables are");
		return 0;
	}

	/* our slice variables override any convention's */
	if (get("SLICETRAIN_NUM_SLICES")) {
		slices_var = "SLICETRAIN_NUM_SLICES";
		if ((r = int_var(slices_var, 1, MAX_WORLD, &e->num_slices)) < 0)
			return r;
	}
	if (get("SLICETRAIN_SLICE_ID")) {
		slice_var = "SLICETRAIN_SLICE_ID";
		if ((r = int_var(slice_var, 0, MAX_WORLD, &e->slice_id)) < 0)
			return r;
		slice_given = 1;
	}
	if (!slices_var)
		slices_var = "SLICETRAIN_NUM_SLICES";

	if (e->rank >= e->world_size)
		return st_fail(ST_EINVAL, "%s=%d is out of range: %s=%d", rank_var, e->rank, world_var, e->world_size);
	if (e->num_slices > e->world_size || e->world_size % e->num_slices)
		return st_fail(ST_EINVAL, "%s=%d does not divide the world size %s=%d", slices_var, e->num_slices,
			       world_var, e->world_size);
	int derived = e->rank / (e->world_size / e->num_slices);
	if (slice_given && e->slice_id != derived)
		return st_fail(ST_EINVAL, "%s=%d is inconsistent with %s=%d: ranks are slice-major, so rank %d of %d "
					  "in %d slices is in slice %d",
			       slice_var, e->slice_id, rank_var, e->rank, e->rank, e->world_size, e->num_slices,
			       derived);
	e->slice_id = derived;

	/* coordinator */
	const char *c = get("SLICETRAIN_COORDINATOR");
	if (c) {
		r = set_coord(e, "SLICETRAIN_COORDINATOR", c);
	} else if (strcmp(e->source, "jax") == 0 && get("JAX_COORDINATOR_ADDRESS")) {
		r = host_default_port(e, "JAX_COORDINATOR_ADDRESS", get("JAX_COORDINATOR_ADDRESS"), NULL, "1234");
	} else if (strcmp(e->source, "jax") == 0 && get("MEGASCALE_COORDINATOR_ADDRESS")) {
		r = host_default_port(e, "MEGASCALE_COORDINATOR_ADDRESS", get("MEGASCALE_COORDINATOR_ADDRESS"),
				      "MEGASCALE_PORT", "8081");
	} else if ((strcmp(e->source, "torchrun") == 0 || strcmp(e->source, "slurm") == 0) &&
		   (get("MASTER_ADDR") || get("MASTER_PORT"))) {
		if (!get("MASTER_ADDR") || !get("MASTER_PORT"))
			return st_fail(ST_EINVAL, "%s is not set (%s is)", get("MASTER_ADDR") ? "MASTER_PORT" : "MASTER_ADDR",
				       get("MASTER_ADDR") ? "MASTER_ADDR" : "MASTER_PORT");
		/* torchrun's agent (static and c10d rendezvous alike) hosts its own
		 * TCPStore on MASTER_PORT and says so: take the next port. */
		const char *use = get("TORCHELASTIC_USE_AGENT_STORE");
		long mp;
		char next[16];
		if (st_parse_long(get("MASTER_PORT"), 1, 65535, &mp) < 0)
			return st_fail(ST_EINVAL, "MASTER_PORT='%s' is not a port number (1..65535)", get("MASTER_PORT"));
		if (use && (strcmp(use, "True") == 0 || strcmp(use, "true") == 0 || strcmp(use, "1") == 0)) {
			if (mp == 65535)
				return st_fail(ST_EINVAL, "MASTER_PORT=65535 is torchrun's store (TORCHELASTIC_USE_AGENT_STORE), "
							  "and there is no next port: set SLICETRAIN_COORDINATOR");
			mp++;
		}
		snprintf(next, sizeof(next), "%ld", mp);
		r = set_coord2(e, "MASTER_ADDR", get("MASTER_ADDR"), "MASTER_PORT", next);
	} else if (e->world_size > 1) {
		const char *which = strcmp(e->source, "slicetrain") == 0 ? "SLICETRAIN_COORDINATOR is not set"
				  : strcmp(e->source, "jax") == 0
				      ? "no coordinator: set JAX_COORDINATOR_ADDRESS, MEGASCALE_COORDINATOR_ADDRESS or "
					"SLICETRAIN_COORDINATOR"
				      : "no coordinator: set SLICETRAIN_COORDINATOR or MASTER_ADDR and MASTER_PORT";
		return st_fail(ST_EINVAL, "%s (%s=%d)", which, world_var, e->world_size);
	}
	return r < 0 ? r : 0;
}
