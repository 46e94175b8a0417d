# Shared helpers for the shell tests (sourced). $SLICETRAIN is the binary,
# $ST_ROOT the repository; each test gets a scratch directory $TMP, removed on exit.
set -u
: "${SLICETRAIN:?run through tests/run.sh}" "${ST_ROOT:?run through tests/run.sh}" "${ST_SAN_REPORT:?run through tests/run.sh}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/slicetrain-cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0 skips=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
# The end of every test: exit 1 after a failure, else 77 after a skip, else
# print "ok" (tests/run.sh fails a test that exits 0 without it) and exit 0.
finish() {
	[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
	[ "$skips" -eq 0 ] || exit 77
	echo "ok"; exit 0
}

# Skips (tests/run.sh counts them; see there). skip_part KIND REASON: a part
# of the test cannot run here; say why in one line and go on with the rest.
# KIND hardware: this machine lacks something (always a skip); dependency:
# something scripts/install-deps.sh --test provides is missing (a failure
# when CI=true). skip_hw / skip_dep REASON: the rest of the test cannot run.
skip_part() { echo "SKIP $1: $2"; skips=$((skips + 1)); }
skip_hw() { skip_part hardware "$*"; finish; }
skip_dep() { skip_part dependency "$*"; finish; }
# need_python MODULE...: /usr/bin/python3 imports them, else skip (dependency).
need_python() {
	local m
	for m in "$@"; do
		/usr/bin/python3 -c "import $m" 2>/dev/null || skip_dep "/usr/bin/python3 cannot import $m (python3-$m)"
	done
}

# status_is NAME RC WANT FILE: a command's exit status RC is WANT, and its
# output FILE holds no sanitizer report (tests/run.sh gives sanitizers their
# own status; a report that reached FILE fails too). Else a failure.
status_is() {
	if grep -qE "$ST_SAN_REPORT" "$4"; then
		fail "$1: sanitizer report (exit $2): $(grep -m1 -E "$ST_SAN_REPORT" "$4")"
	elif [ "$2" -ne "$3" ]; then
		fail "$1: exit status $2, want $3"
	else
		return 0
	fi
	sed 's/^/    /' "$4" | tail -n 5 >&2
	return 1
}

# expect_error NAME PATTERN -- ARGS...: slicetrain ARGS must exit 2, with one
# "slicetrain: error:" line on stderr that matches PATTERN (grep -E).
expect_error() {
	local name=$1 pattern=$2; shift 3
	"$SLICETRAIN" "$@" >"$TMP/out" 2>"$TMP/err"
	local rc=$?
	local nerr
	nerr=$(grep -c '^slicetrain: error:' "$TMP/err")
	if ! status_is "$name" $rc 2 "$TMP/err"; then
		: # said why
	elif [ "$nerr" -ne 1 ]; then
		fail "$name: $nerr error lines, want 1"; sed 's/^/    /' "$TMP/err" >&2
	elif ! grep '^slicetrain: error:' "$TMP/err" | grep -qE -- "$pattern"; then
		fail "$name: error does not match /$pattern/: $(grep '^slicetrain: error:' "$TMP/err")"
	else
		echo "ok   $name: $(grep '^slicetrain: error:' "$TMP/err")"
	fi
	grep -q 'completed step' "$TMP/out" && fail "$name: trained despite the error"
	return 0
}

# A TCP port free right now on loopback.
# a loopback port free now, at random below the kernel's ephemeral range
# (tests/free_port.h says why), else one the kernel picks
free_port() {
	/usr/bin/python3 -c 'import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for port in [random.randrange(10000, lo - 1000) for _ in range(100)] + [0]:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(s.getsockname()[1])
    break'
}

# The losses of a metrics file's training records (not its eval records or
# the controller's event lines), one per line, full precision.
metric_losses() {
	/usr/bin/python3 -c 'import json,sys; [print(repr(r["learning/loss"])) for r in map(json.loads, open(sys.argv[1])) if "learning/loss" in r]' "$1"
}
# The same as "STEP LOSS" lines.
metric_step_losses() {
	/usr/bin/python3 -c 'import json,sys; [print(r["step"], repr(r["learning/loss"])) for r in map(json.loads, open(sys.argv[1])) if "learning/loss" in r]' "$1"
}

# same_losses NAME A B N [REL]: metrics files A and B hold N training records each, for
# the same steps, with the same losses: bit for bit, or within REL relative.
same_losses() {
	/usr/bin/python3 - "$@" <<'PY' && return 0
import json, sys
name, a, b, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rel = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
def load(p):
    try:
        return [(r["step"], r["learning/loss"]) for r in map(json.loads, open(p)) if "learning/loss" in r]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{name}: {p}: {e}")
x, y = load(a), load(b)
if len(x) != n or len(y) != n:
    sys.exit(f"{name}: {len(x)} and {len(y)} records, want {n} each")
if [s for s, _ in x] != [s for s, _ in y]:
    sys.exit(f"{name}: different steps: {[s for s, _ in x][:5]}... and {[s for s, _ in y][:5]}...")
worst = max(abs(u - v) / max(abs(u), 1e-300) for (_, u), (_, v) in zip(x, y))
same = all(u == v for (_, u), (_, v) in zip(x, y))
print(f"{name}: {n} losses " + ("identical" if same else f"differ by up to {worst:.1e} relative"))
sys.exit(0 if same or worst <= rel else 1)
PY
	fail "$1: losses differ ($2, $3)"
	return 1
}

# controller_of LOG STEPS PID TRIES: wait (TRIES x 0.1 s at most, while PID
# runs) until the `slicetrain launch` log LOG names its elastic controller
# and the run's output STEPS (the same file or another) holds a completed
# step; then $addr is the controller's host:port and $tokf the token file
# the launcher printed (each empty when it never came).
controller_of() {
	local log=$1 steps=$2 pid=$3 tries=$4 i
	addr= tokf=
	for i in $(seq 1 "$tries"); do
		addr=$(sed -n 's/^slicetrain launch: elastic controller at \([^ ]*\) .*/\1/p' "$log")
		tokf=$(sed -n 's/^slicetrain launch: elastic controller at .* --token-file \([^)]*\)).*/\1/p' "$log")
		[ -n "$addr" ] && grep -q 'completed step' "$steps" && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}
