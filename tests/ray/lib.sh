# Shared helpers of the Ray tests (sourced; tests/ray/run.sh sets the
# environment). $SLICETRAIN is the binary, $ST_ROOT the checkout, $ST_RAY_VENV
# the venv of scripts/install-deps.sh --ray. Each test gets a scratch
# directory $TMP (short: Ray's unix sockets live under it), removed on exit
# after its cluster, if it started one, is down.
set -u
: "${SLICETRAIN:?run through tests/ray/run.sh}" "${ST_ROOT:?run through tests/ray/run.sh}" "${ST_RAY_VENV:?}"
TMP=$(mktemp -d /tmp/st-ray.XXXXXX)
PY=$ST_RAY_VENV/bin/python
CLUSTER="$ST_ROOT/deploy/ray/local-cluster.sh"
failures=0 cluster_up=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
finish() {
	[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
	echo "ok"; exit 0
}
# On exit: the cluster down (every process of its namespace, by pid; Ray's
# daemons and the forwarder run in sessions of their own, so tests/ray/run.sh
# would not see them left); a failure to stop them fails the test.
cleanup() {
	local rc=$?
	if [ "$cluster_up" = 1 ] && ! ST_RAY_DIR=$TMP/c "$CLUSTER" down >"$TMP/down.out" 2>&1; then
		echo "FAIL: local-cluster.sh down: $(tail -1 "$TMP/down.out")" >&2
		rc=1
	fi
	rm -rf "$TMP"
	exit $rc
}
trap cleanup EXIT

# A TCP port free on this namespace's loopback: 8265 (the tutorial's) when it
# is (SO_REUSEADDR as the forwarder binds it: an earlier test's connections in
# TIME_WAIT do not make it taken).
host_port() {
	"$PY" - <<'PY'
import socket
for p in (8265, 0):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p)); print(s.getsockname()[1]); break
    except OSError:
        continue
    finally:
        s.close()
PY
}

# cluster_up ARGS...: deploy/ray/local-cluster.sh up in $TMP/c; sets PORT,
# ADDRESS (the dashboard as the ray CLI takes it) and the CLI's environment.
cluster_up() {
	PORT=$(host_port)
	export ST_RAY_DIR=$TMP/c ST_RAY_PORT=$PORT SLICETRAIN_BIN=$SLICETRAIN
	cluster_up=1
	"$CLUSTER" up "$@" || { fail "local-cluster.sh up failed"; finish; }
	eval "$("$CLUSTER" env)"
	ADDRESS=http://localhost:$PORT
	DATA=$ST_RAY_DIR/data
	[ "$PORT" = 8265 ] || echo "note: 8265 is taken on this machine; the dashboard is forwarded to $PORT"
}

# The working directory of a job, as the tutorial's: the trainer and base.yml.
make_workdir() {
	mkdir -p "$TMP/work"
	cp "$ST_ROOT/deploy/ray/slicetrain_elastic_trainer.py" "$TMP/work/"
	cp "$ST_ROOT/configs/base.yml" "$TMP/work/base.yml"
}

# The pids of slicetrain processes in the cluster's namespace.
st_pids() {
	local p
	for p in $("$CLUSTER" pids); do
		[ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(readlink -f "$SLICETRAIN")" ] && echo "$p"
	done
	return 0
}

# job_status ID: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED
job_status() {
	ray job status --address "$ADDRESS" "$1" 2>/dev/null | grep -oiE "(pending|running|succeeded|failed|stopped)" |
		tail -1 | tr '[:lower:]' '[:upper:]'
}

# wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds; 1 on timeout.
wait_for() {
	local secs=$1 what=$2 t0=$SECONDS
	shift 2
	until "$@"; do
		[ $((SECONDS - t0)) -ge "$secs" ] && { fail "timed out after $secs s waiting for $what"; return 1; }
		sleep 0.5
	done
	return 0
}

# The step of the newest record in a metrics file (-1: none).
last_step() {
	"$PY" -c 'import json,sys
s=-1
try:
    for l in open(sys.argv[1]):
        r=json.loads(l)
        if "step" in r: s=r["step"]
except (OSError, ValueError): pass
print(s)' "$1"
}

# The submission id in `ray job submit`'s output file.
job_id() { grep -oE "Job '[^']+' submitted successfully" "$1" | head -1 | cut -d"'" -f2; }
