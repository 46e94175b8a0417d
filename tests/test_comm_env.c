/*
 * Bootstrap inputs: st_group_env_read for each launcher convention, their
 * precedence and malformed values (one case each), the elastic launcher's
 * variables (st_elastic_env_read), the rendezvous store (operations,
 * waiting, malformed requests, random garbage), and st_wrap.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "check.h"
#include "comm/comm.h"
#include "comm/comm_int.h"
#include "comm/store.h"

static const char *const all_vars[] = {
	"SLICETRAIN_COORDINATOR", "SLICETRAIN_RANK", "SLICETRAIN_WORLD_SIZE", "SLICETRAIN_NUM_SLICES",
	"SLICETRAIN_SLICE_ID", "SLICETRAIN_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
	"MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_COUNT",
	"JAX_PROCESS_ID", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS",
	"MEGASCALE_PORT", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
	NULL,
};

/* Set "NAME=value" pairs on a clean environment. */
static void env(const char *const *kv)
{
	for (const char *const *v = all_vars; *v; v++)
		unsetenv(*v);
	for (; kv && *kv; kv++) {
		char name[128];
		const char *eq = strchr(*kv, '=');
		snprintf(name, sizeof(name), "%.*s", (int)(eq - *kv), *kv);
		setenv(name, eq + 1, 1);
	}
}

#define ENV(...) env((const char *const[]){ __VA_ARGS__, NULL })

static void expect_ok(const char *src, int rank, int world, int slices, int slice, const char *coord)
{
	st_group_env e;
	int rc = st_group_env_read(&e);
	CHECK_MSG(rc == 0, "%s: %s", src, st_errmsg());
	if (rc)
		return;
	CHECK_MSG(strcmp(e.source, src) == 0, "source %s, want %s", e.source, src);
	CHECK_MSG(e.rank == rank && e.world_size == world && e.num_slices == slices && e.slice_id == slice,
		  "%s: rank %d/%d slices %d slice %d", src, e.rank, e.world_size, e.num_slices, e.slice_id);
	CHECK_MSG(strcmp(e.coordinator, coord) == 0, "%s: coordinator '%s', want '%s'", src, e.coordinator, coord);
}

static void expect_err(const char *what, const char *needle)
{
	st_group_env e;
	int rc = st_group_env_read(&e);
	CHECK_MSG(rc == ST_EINVAL, "%s: rc %d", what, rc);
	CHECK_MSG(strstr(st_errmsg(), needle) != NULL, "%s: message '%s' lacks '%s'", what, st_errmsg(), needle);
}

static void test_env(void)
{
	/* nothing set: a single process */
	ENV(NULL);
	expect_ok("single", 0, 1, 1, 0, "");

	/* each convention */
	ENV("SLICETRAIN_RANK=5", "SLICETRAIN_WORLD_SIZE=8", "SLICETRAIN_NUM_SLICES=2", "SLICETRAIN_COORDINATOR=node0:29500");
	expect_ok("slicetrain", 5, 8, 2, 1, "node0:29500");
	ENV("SLICETRAIN_RANK=3", "SLICETRAIN_WORLD_SIZE=4", "SLICETRAIN_NUM_SLICES=2", "SLICETRAIN_SLICE_ID=1",
	    "SLICETRAIN_LOCAL_RANK=1", "SLICETRAIN_COORDINATOR=[::1]:7000");
	expect_ok("slicetrain", 3, 4, 2, 1, "[::1]:7000");
	ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500");
	expect_ok("torchrun", 1, 2, 1, 0, "10.0.0.1:29500");
	ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=fe80::1", "MASTER_PORT=29500");
	expect_ok("torchrun", 0, 2, 1, 0, "[fe80::1]:29500");
	/* torchrun's agent store sits on MASTER_PORT: the next port is ours */
	ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400", "TORCHELASTIC_USE_AGENT_STORE=True");
	expect_ok("torchrun", 1, 2, 1, 0, "h:29401");
	ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400", "TORCHELASTIC_USE_AGENT_STORE=False");
	expect_ok("torchrun", 1, 2, 1, 0, "h:29400");
	ENV("JAX_COORDINATOR_ADDRESS=10.0.0.2:1234", "JAX_PROCESS_COUNT=8", "JAX_PROCESS_ID=6",
	    "MEGASCALE_NUM_SLICES=2", "MEGASCALE_SLICE_ID=1");
	expect_ok("jax", 6, 8, 2, 1, "10.0.0.2:1234");
	ENV("JAX_COORDINATOR_ADDRESS=coord", "JAX_PROCESS_COUNT=2", "JAX_PROCESS_ID=1");
	expect_ok("jax", 1, 2, 1, 0, "coord:1234");
	/* multislice TPU: per-slice worker id placed by the slice */
	ENV("MEGASCALE_COORDINATOR_ADDRESS=slice0-host0", "MEGASCALE_NUM_SLICES=2", "MEGASCALE_SLICE_ID=1",
	    "TPU_WORKER_ID=2", "TPU_WORKER_HOSTNAMES=h0,h1,h2,h3");
	expect_ok("jax", 6, 8, 2, 1, "slice0-host0:8081");
	ENV("MEGASCALE_COORDINATOR_ADDRESS=c", "MEGASCALE_PORT=9000", "JAX_PROCESS_COUNT=4", "JAX_PROCESS_ID=0",
	    "MEGASCALE_NUM_SLICES=4");
	expect_ok("jax", 0, 4, 4, 0, "c:9000");
	ENV("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "MASTER_ADDR=n1", "MASTER_PORT=1");
	expect_ok("slurm", 3, 4, 1, 0, "n1:1");
	ENV("SLURM_PROCID=2", "SLURM_NTASKS=4", "SLICETRAIN_COORDINATOR=n2:2000", "SLICETRAIN_NUM_SLICES=2");
	expect_ok("slurm", 2, 4, 2, 1, "n2:2000");
	ENV("SLURM_PROCID=0", "SLURM_NTASKS=1");
	expect_ok("slurm", 0, 1, 1, 0, "");

	/* precedence: ours > torchrun > jax > slurm; our coordinator overrides */
	ENV("SLICETRAIN_RANK=1", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1", "RANK=0", "WORLD_SIZE=4",
	    "MASTER_ADDR=b", "MASTER_PORT=2");
	expect_ok("slicetrain", 1, 2, 1, 0, "a:1");
	ENV("RANK=2", "WORLD_SIZE=4", "MASTER_ADDR=b", "MASTER_PORT=2", "JAX_COORDINATOR_ADDRESS=c:3",
	    "JAX_PROCESS_COUNT=8", "JAX_PROCESS_ID=7", "SLURM_PROCID=0", "SLURM_NTASKS=16");
	expect_ok("torchrun", 2, 4, 1, 0, "b:2");
	ENV("JAX_COORDINATOR_ADDRESS=c:3", "JAX_PROCESS_COUNT=8", "JAX_PROCESS_ID=7", "SLURM_PROCID=0",
	    "SLURM_NTASKS=16", "MASTER_ADDR=b", "MASTER_PORT=2");
	expect_ok("jax", 7, 8, 1, 0, "c:3");
	ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=b", "MASTER_PORT=2", "SLICETRAIN_COORDINATOR=mine:4000",
	    "SLICETRAIN_NUM_SLICES=2");
	expect_ok("torchrun", 1, 2, 2, 1, "mine:4000");
	ENV("JAX_COORDINATOR_ADDRESS=c:3", "JAX_PROCESS_COUNT=4", "JAX_PROCESS_ID=3", "MEGASCALE_NUM_SLICES=4",
	    "SLICETRAIN_NUM_SLICES=2", "SLICETRAIN_COORDINATOR=z:9");
	expect_ok("jax", 3, 4, 2, 1, "z:9");

	/* malformed and inconsistent values, one case each */
	ENV("SLICETRAIN_RANK=1", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("missing world", "SLICETRAIN_WORLD_SIZE is not set");
	ENV("SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("missing rank", "SLICETRAIN_RANK is not set");
	ENV("SLICETRAIN_RANK=x1", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("rank not a number", "SLICETRAIN_RANK='x1'");
	ENV("SLICETRAIN_RANK=-1", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("negative rank", "SLICETRAIN_RANK='-1'");
	ENV("SLICETRAIN_RANK=1 ", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("trailing space", "SLICETRAIN_RANK='1 '");
	ENV("SLICETRAIN_RANK=", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("empty rank", "SLICETRAIN_RANK=''");
	ENV("SLICETRAIN_RANK=2", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("rank out of range", "SLICETRAIN_RANK=2 is out of range");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=0", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("zero world", "SLICETRAIN_WORLD_SIZE='0'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=99999999999", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("huge world", "SLICETRAIN_WORLD_SIZE='99999999999'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=6", "SLICETRAIN_NUM_SLICES=4", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("slices do not divide", "SLICETRAIN_NUM_SLICES=4 does not divide");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_NUM_SLICES=0", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("zero slices", "SLICETRAIN_NUM_SLICES='0'");
	ENV("SLICETRAIN_RANK=1", "SLICETRAIN_WORLD_SIZE=4", "SLICETRAIN_NUM_SLICES=2", "SLICETRAIN_SLICE_ID=1",
	    "SLICETRAIN_COORDINATOR=a:1");
	expect_err("slice inconsistent", "SLICETRAIN_SLICE_ID=1 is inconsistent with SLICETRAIN_RANK=1");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2");
	expect_err("no coordinator", "SLICETRAIN_COORDINATOR is not set");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a");
	expect_err("coordinator without port", "SLICETRAIN_COORDINATOR='a' is not host:port");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:0");
	expect_err("port 0", "SLICETRAIN_COORDINATOR='a:0'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:65536");
	expect_err("port too big", "SLICETRAIN_COORDINATOR='a:65536'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=:80");
	expect_err("empty host", "SLICETRAIN_COORDINATOR=':80'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=::1:80");
	expect_err("bare ipv6", "SLICETRAIN_COORDINATOR='::1:80'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a b:80");
	expect_err("space in host", "SLICETRAIN_COORDINATOR='a b:80'");
	ENV("SLICETRAIN_RANK=0", "SLICETRAIN_WORLD_SIZE=2", "SLICETRAIN_COORDINATOR=a:1", "SLICETRAIN_LOCAL_RANK=q");
	expect_err("local rank", "SLICETRAIN_LOCAL_RANK='q'");
	ENV("SLICETRAIN_COORDINATOR=a:1");
	expect_err("coordinator alone", "SLICETRAIN_RANK and SLICETRAIN_WORLD_SIZE are not set");
	ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a");
	expect_err("master port missing", "MASTER_PORT is not set");
	ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=http");
	expect_err("master port text", "MASTER_PORT='http'");
	ENV("RANK=0", "WORLD_SIZE=2");
	expect_err("torchrun no coordinator", "no coordinator");
	ENV("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=65535", "TORCHELASTIC_USE_AGENT_STORE=True");
	expect_err("agent store on the last port", "no next port");
	ENV("RANK=3", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=1");
	expect_err("torch rank out of range", "RANK=3 is out of range: WORLD_SIZE=2");
	ENV("LOCAL_RANK=0", "RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=z");
	expect_err("torch local rank", "LOCAL_RANK='z'");
	ENV("JAX_COORDINATOR_ADDRESS=c:1", "JAX_PROCESS_ID=0");
	expect_err("jax count missing", "JAX_PROCESS_COUNT is not set");
	ENV("JAX_COORDINATOR_ADDRESS=c:1", "JAX_PROCESS_COUNT=2");
	expect_err("jax id missing", "JAX_PROCESS_ID is not set");
	ENV("JAX_COORDINATOR_ADDRESS=c:99999", "JAX_PROCESS_COUNT=2", "JAX_PROCESS_ID=0");
	expect_err("jax bad port", "JAX_COORDINATOR_ADDRESS");
	ENV("JAX_COORDINATOR_ADDRESS=c:1", "JAX_PROCESS_COUNT=4", "JAX_PROCESS_ID=0", "MEGASCALE_NUM_SLICES=2",
	    "MEGASCALE_SLICE_ID=1");
	expect_err("megascale slice inconsistent", "MEGASCALE_SLICE_ID=1 is inconsistent with JAX_PROCESS_ID=0");
	ENV("MEGASCALE_COORDINATOR_ADDRESS=c", "MEGASCALE_PORT=0", "JAX_PROCESS_COUNT=2", "JAX_PROCESS_ID=0");
	expect_err("megascale port", "MEGASCALE_PORT='0'");
	ENV("MEGASCALE_COORDINATOR_ADDRESS=c", "MEGASCALE_NUM_SLICES=2", "TPU_WORKER_ID=0",
	    "TPU_WORKER_HOSTNAMES=a,b");
	expect_err("tpu worker without slice", "MEGASCALE_SLICE_ID is not set");
	ENV("MEGASCALE_COORDINATOR_ADDRESS=c", "MEGASCALE_NUM_SLICES=2", "MEGASCALE_SLICE_ID=0", "TPU_WORKER_ID=2",
	    "TPU_WORKER_HOSTNAMES=a,b");
	expect_err("tpu worker out of range", "TPU_WORKER_ID=2 is out of range");
	ENV("MEGASCALE_COORDINATOR_ADDRESS=c", "TPU_WORKER_ID=0", "TPU_WORKER_HOSTNAMES=a,,b");
	expect_err("tpu hostnames", "TPU_WORKER_HOSTNAMES='a,,b'");
	ENV("SLURM_PROCID=0", "SLURM_NTASKS=2");
	expect_err("slurm no coordinator", "no coordinator");
	ENV("SLURM_PROCID=0");
	expect_err("slurm ntasks missing", "SLURM_NTASKS is not set");
	ENV("SLURM_PROCID=7", "SLURM_NTASKS=4", "SLICETRAIN_COORDINATOR=a:1");
	expect_err("slurm procid range", "SLURM_PROCID=7 is out of range: SLURM_NTASKS=4");
	ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLICETRAIN_COORDINATOR=a:1", "SLURM_LOCALID=-2");
	expect_err("slurm localid", "SLURM_LOCALID='-2'");

	/* random garbage never crashes the parser, and never yields a bad place */
	unsigned seed = 12345;
	for (int t = 0; t < 2000; t++) {
		char v[4][24];
		for (int k = 0; k < 4; k++) {
			int len = (int)(rand_r(&seed) % 12);
			for (int i = 0; i < len; i++)
				v[k][i] = "0123456789:[]ab -+."[rand_r(&seed) % 19];
			v[k][len] = 0;
		}
		env(NULL);
		setenv("SLICETRAIN_RANK", v[0], 1);
		setenv("SLICETRAIN_WORLD_SIZE", v[1], 1);
		setenv("SLICETRAIN_NUM_SLICES", v[2], 1);
		setenv("SLICETRAIN_COORDINATOR", v[3], 1);
		st_group_env e;
		int rc = st_group_env_read(&e);
		CHECK(rc == 0 || rc == ST_EINVAL);
		if (rc == 0)
			CHECK(e.rank >= 0 && e.rank < e.world_size && e.world_size % e.num_slices == 0 &&
			      e.slice_id == e.rank / (e.world_size / e.num_slices));
	}
	env(NULL);
}

/* ---- the store ---- */

typedef struct setter { int port; } setter;

static void *late_setter(void *arg)
{
	setter *s = arg;
	usleep(100000);
	st_store *c;
	if (st_store_connect(&c, "127.0.0.1", s->port, NULL, st_mono_ns() + 2000000000LL) == 0) {
		st_store_set(c, "late", "v", 1);
		st_store_close(c);
	}
	return NULL;
}

/* A connection past the handshake (no token: the server has none either). */
static int raw_connect(int port)
{
	int fd;
	int64_t dl = st_mono_ns() + 1000000000LL;
	if (st_tcp_connect("127.0.0.1", port, dl, &fd) < 0)
		return -1;
	if (st_auth_client(fd, NULL, dl) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A malformed request makes the server drop that client; 1 if it closed. */
static int server_drops(int port, const void *req, size_t n)
{
	int fd = raw_connect(port);
	if (fd < 0)
		return 0;
	if (send(fd, req, n, MSG_NOSIGNAL) < 0) {
	}
	char b[16];
	int r = st_recv_full(fd, b, sizeof(b), st_mono_ns() + 2000000000LL);
	close(fd);
	return r == -ECONNRESET;
}

static void test_store(void)
{
	st_store_server *srv;
	CHECK(st_store_serve(&srv, "127.0.0.1", 0, NULL, NULL) == 0);
	int port = st_store_server_port(srv);
	st_store *c;
	int64_t dl = st_mono_ns() + 2000000000LL;
	CHECK(st_store_connect(&c, "localhost", port, NULL, dl) == 0);
	CHECK(st_store_set(c, "a", "hello", 5) == 0);
	void *v;
	size_t n;
	CHECK(st_store_get(c, "a", &v, &n, dl) == 0 && n == 5 && memcmp(v, "hello", 5) == 0);
	free(v);
	int64_t x;
	CHECK(st_store_add(c, "ctr", 5, &x) == 0 && x == 5);
	CHECK(st_store_add(c, "ctr", -2, &x) == 0 && x == 3);
	CHECK(st_store_add(c, "a", 1, &x) < 0); /* not a counter: the server drops us */
	st_store_close(c);

	/* get waits until another client sets the key */
	CHECK(st_store_connect(&c, "127.0.0.1", port, NULL, dl) == 0);
	pthread_t th;
	setter s = { port };
	pthread_create(&th, NULL, late_setter, &s);
	int64_t t0 = st_mono_ns();
	CHECK(st_store_get(c, "late", &v, &n, st_mono_ns() + 3000000000LL) == 0 && n == 1);
	CHECK(st_mono_ns() - t0 >= 50000000);
	free(v);
	pthread_join(th, NULL);
	/* and times out otherwise, naming the key */
	CHECK(st_store_get(c, "never", &v, &n, st_mono_ns() + 100000000LL) == ST_EPEER);
	CHECK(strstr(st_errmsg(), "never") && strstr(st_errmsg(), "timed out"));
	st_store_close(c);

	/* barrier of three clients */
	st_store *b[3];
	for (int i = 0; i < 3; i++)
		CHECK(st_store_connect(&b[i], "127.0.0.1", port, NULL, dl) == 0);
	CHECK(st_store_add(b[0], "bar/count", 1, &x) == 0 && st_store_add(b[1], "bar/count", 1, &x) == 0);
	CHECK(st_store_barrier(b[2], "bar", 3, dl) == 0);
	CHECK(st_store_get(b[0], "bar/done", &v, &n, dl) == 0);
	free(v);
	for (int i = 0; i < 3; i++)
		st_store_close(b[i]);

	/* malformed requests: bad op, empty key, huge key, huge value, GET with a value */
	uint32_t bad[][3] = { { 9, 1, 0 }, { 1, 0, 0 }, { 1, 5000, 0 }, { 1, 1, (64u << 20) + 1 }, { 2, 1, 4 }, { 3, 1, 3 } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint8_t req[64] = { 0 };
		memcpy(req, bad[i], 12);
		CHECK_MSG(server_drops(port, req, ST_STORE_HEADER + 8), "malformed request %zu not dropped", i);
	}
	uint8_t nul[] = { 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 'a', 0, 'b' };
	CHECK(server_drops(port, nul, sizeof(nul)));
	/* a request of another generation (this store's is 0): dropped */
	uint8_t stale[] = { 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 'k' };
	CHECK(server_drops(port, stale, sizeof(stale)));
	/* random garbage from many clients; the server keeps serving */
	unsigned seed = 7;
	for (int t = 0; t < 200; t++) {
		int fd = raw_connect(port);
		if (fd < 0)
			continue;
		uint8_t g[64];
		size_t len = 1 + rand_r(&seed) % sizeof(g);
		for (size_t i = 0; i < len; i++)
			g[i] = (uint8_t)rand_r(&seed);
		if (send(fd, g, len, MSG_NOSIGNAL) < 0) {
		}
		close(fd);
	}
	dl = st_mono_ns() + 2000000000LL;
	if (st_store_connect(&c, "127.0.0.1", port, NULL, dl) == 0) {
		CHECK(st_store_get(c, "a", &v, &n, dl) == 0 && n == 5);
		free(v);
		st_store_close(c);
	} else {
		CHECK_MSG(0, "store unusable after garbage: %s", st_errmsg());
	}
	st_store_server_stop(srv);

	/* connecting to nothing retries, then fails with the address */
	t0 = st_mono_ns();
	CHECK(st_store_connect(&c, "127.0.0.1", port, NULL, st_mono_ns() + 300000000LL) == ST_EPEER);
	CHECK(strstr(st_errmsg(), "cannot reach the coordinator 127.0.0.1:") != NULL);
	CHECK(st_mono_ns() - t0 >= 200000000LL);
}

static void test_hostport(void)
{
	char h[64];
	int p;
	CHECK(st_split_hostport("a.b:1", h, sizeof(h), &p) == 0 && strcmp(h, "a.b") == 0 && p == 1);
	CHECK(st_split_hostport("[::1]:65535", h, sizeof(h), &p) == 0 && strcmp(h, "::1") == 0 && p == 65535);
	const char *bad[] = { "", "a", "a:", ":1", "a:1x", "a:+1", "[::1]", "[::1]1", "::1:2", "a:65536", "a b:1", "a:-1" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_MSG(st_split_hostport(bad[i], h, sizeof(h), &p) < 0, "accepted '%s'", bad[i]);
}

static void test_single_group(void)
{
	/* no variables: a group of one, collectives are copies */
	env(NULL);
	st_group *g;
	CHECK(st_group_join(&g, NULL) == 0);
	if (!g)
		return;
	CHECK(st_group_rank(g) == 0 && st_group_size(g) == 1 && st_group_num_slices(g) == 1);
	st_comm *c;
	int r0 = 0;
	CHECK(st_comm_create(&c, g, 1, &r0) == 0);
	double x[3] = { 1, 2, 3 }, y[3];
	int64_t cnt = 3;
	CHECK(st_comm_allreduce(c, x, 3, ST_DTYPE_F64, ST_SUM) == 0 && x[2] == 3);
	CHECK(st_comm_allgather(c, x, y, &cnt, ST_DTYPE_F64) == 0 && y[1] == 2);
	CHECK(st_comm_reduce_scatter(c, x, y, &cnt, ST_DTYPE_F64) == 0 && y[0] == 1);
	CHECK(st_comm_broadcast(c, x, sizeof(x), 0) == 0);
	CHECK(st_comm_barrier(c) == 0);
	CHECK(st_comm_allreduce(c, x, -1, ST_DTYPE_F64, ST_SUM) == ST_EINVAL);
	CHECK(st_comm_allreduce(c, x, 1, (enum st_dtype)7, ST_SUM) == ST_EINVAL);
	CHECK(st_comm_broadcast(c, x, 8, 1) == ST_EINVAL);
	int bad[2] = { 0, 0 };
	st_comm *c2;
	CHECK(st_comm_create(&c2, g, 2, bad) == ST_EINVAL);
	int other = 1;
	CHECK(st_comm_create(&c2, g, 1, &other) == ST_EINVAL);
	st_comm_free(c);
	st_group_leave(g);
	st_group_leave(NULL);
}

/* The elastic launcher's variables (st_elastic_env_read): absent, each set,
 * and malformed ones refused naming the variable. */
static void test_elastic_env(void)
{
	static const char *const vars[] = {"SLICETRAIN_GENERATION", "SLICETRAIN_JOIN", "SLICETRAIN_ELASTIC_MAX_DEVICES",
					   "SLICETRAIN_CONTROL_FD", "SLICETRAIN_STEP_WATCHDOG_MS"};
	enum { NV = sizeof(vars) / sizeof(vars[0]) };
	for (int i = 0; i < NV; i++)
		unsetenv(vars[i]);
	st_elastic_env e;
	CHECK(st_elastic_env_read(&e) == 0);
	CHECK(e.generation == -1 && !e.joiner && e.max_devices == 0 && e.control_fd == -1 && e.watchdog_ms == 0);
	/* empty values count as absent, as the launcher leaves them */
	setenv("SLICETRAIN_GENERATION", "", 1);
	setenv("SLICETRAIN_ELASTIC_MAX_DEVICES", "", 1);
	CHECK(st_elastic_env_read(&e) == 0 && e.generation == -1 && e.max_devices == 0);
	setenv("SLICETRAIN_GENERATION", "7", 1);
	setenv("SLICETRAIN_JOIN", "1", 1);
	setenv("SLICETRAIN_ELASTIC_MAX_DEVICES", "4", 1);
	setenv("SLICETRAIN_CONTROL_FD", "9", 1);
	setenv("SLICETRAIN_STEP_WATCHDOG_MS", "1500", 1);
	CHECK(st_elastic_env_read(&e) == 0);
	CHECK(e.generation == 7 && e.joiner && e.max_devices == 4 && e.control_fd == 9 && e.watchdog_ms == 1500);
	setenv("SLICETRAIN_STEP_WATCHDOG_MS", "0", 1);
	CHECK(st_elastic_env_read(&e) == 0 && e.watchdog_ms == 0);
	CHECK_MSG(!getenv("SLICETRAIN_CONTROL_FD"), "SLICETRAIN_CONTROL_FD is left for child processes");
	setenv("SLICETRAIN_JOIN", "0", 1);
	CHECK(st_elastic_env_read(&e) == 0 && !e.joiner);
	static const struct {
		const char *var, *value;
	} bad[] = {
		{"SLICETRAIN_GENERATION", "x"}, {"SLICETRAIN_GENERATION", "-1"}, {"SLICETRAIN_GENERATION", "3 "},
		{"SLICETRAIN_JOIN", "2"}, {"SLICETRAIN_JOIN", "yes"}, {"SLICETRAIN_ELASTIC_MAX_DEVICES", "0"},
		{"SLICETRAIN_ELASTIC_MAX_DEVICES", "99999999999999999999"}, {"SLICETRAIN_CONTROL_FD", ""},
		{"SLICETRAIN_CONTROL_FD", "2"}, {"SLICETRAIN_CONTROL_FD", "fd"}, {"SLICETRAIN_STEP_WATCHDOG_MS", "50"},
		{"SLICETRAIN_STEP_WATCHDOG_MS", "-1"}, {"SLICETRAIN_STEP_WATCHDOG_MS", "3600001"},
		{"SLICETRAIN_STEP_WATCHDOG_MS", "1s"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (int k = 0; k < NV; k++)
			unsetenv(vars[k]);
		setenv(bad[i].var, bad[i].value, 1);
		int rc = st_elastic_env_read(&e);
		CHECK_MSG(rc == ST_EINVAL && strstr(st_errmsg(), bad[i].var), "%s='%s': rc %d, '%s'", bad[i].var,
			  bad[i].value, rc, st_errmsg());
	}
	for (int i = 0; i < NV; i++)
		unsetenv(vars[i]);
}

/* st_wrap: the current message under a prefix, with the code given. */
static void test_wrap(void)
{
	st_fail(ST_EIO, "disk full");
	CHECK(st_wrap(ST_EINVAL, "saving %s", "step 5") == ST_EINVAL);
	CHECK_MSG(!strcmp(st_errmsg(), "saving step 5: disk full"), "'%s'", st_errmsg());
	char big[2000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	st_fail(ST_EIO, "%s", big);
	CHECK(st_wrap(ST_EIO, "p") == ST_EIO && !strncmp(st_errmsg(), "p: xxx", 6));
	st_fail(ST_EIO, "inner");
	st_wrap(ST_EIO, "%s", big); /* a prefix filling the buffer: cut, no overflow */
	CHECK(strlen(st_errmsg()) < 1024);
}

int main(void)
{
	test_elastic_env();
	test_wrap();
	test_env();
	test_hostport();
	test_store();
	test_single_group();
	return check_result();
}
