# Shared helpers for the shell tests (sourced). $SLICETRAIN is the binary,
# $ST_ROOT the repository; each test gets a scratch directory $TMP, removed on exit.
set -u
: "${SLICETRAIN:?run through tests/run.sh}" "${ST_ROOT:?run through tests/run.sh}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/slicetrain-cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
finish() { [ "$failures" -eq 0 ] && echo "ok" || { echo "$failures failure(s)"; exit 1; }; }

# expect_error NAME PATTERN -- ARGS...: slicetrain ARGS must exit 2, with one
# "slicetrain: error:" line on stderr that matches PATTERN (grep -E).
expect_error() {
	local name=$1 pattern=$2; shift 3
	"$SLICETRAIN" "$@" >"$TMP/out" 2>"$TMP/err"
	local rc=$?
	local nerr
	nerr=$(grep -c '^slicetrain: error:' "$TMP/err")
	if [ $rc -ne 2 ]; then
		fail "$name: exit status $rc, want 2"; sed 's/^/    /' "$TMP/err" >&2
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
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The losses of a metrics file, one per line, full precision.
metric_losses() { /usr/bin/python3 -c 'import json,sys; [print(repr(json.loads(l)["learning/loss"])) for l in open(sys.argv[1])]' "$1"; }
