# Hostile messages to every port of a running elastic run (issue 11;
# bench/hostile.py, docs/security.md). A 2-slice elastic run with a token
# file of the test's own (SLICETRAIN_TOKEN_FILE, which the launcher passes
# on); once it trains, bench/hostile.py finds every listening socket of the
# launcher and its descendants and sends each HOSTILE_MESSAGES (default
# 1000) random and mutated messages, each on a new connection: raw garbage
# and protocol samples without the handshake, samples behind a correct
# handshake with the run's token, proofs made with a wrong token, replayed
# proofs, cut proofs, silence; meanwhile 8 connections per port stay open
# without sending a byte. Before that, while the group forms, the store
# (which listens only then, for milliseconds) gets the same kinds of
# messages until it closes (best effort: often none reach it; fuzz_store
# and test_auth cover it). Then:
#  - no listener accepted a wrong, replayed, cut or missing proof; each
#    answered a correct one correctly, before and after the barrage;
#  - the servers dropped every silent connection within 15 s (their
#    handshake timeouts: 5 s controller, 10 s worker group);
#  - every TCP listener of the run was on loopback the whole time (a watcher
#    samples them every 50 ms until the launcher exits; the store, which
#    listens for milliseconds, only when caught: the formation phase checks
#    its address when it catches it), and no command line held the token;
#  - the run trains to its last step, exit 0, with 0 failures; the token's
#    text is in none of its output; no process is left behind.
# `make hostile` runs it with 10,000 messages per port and a flood of 200
# silent connections per port (HOSTILE_MESSAGES, HOSTILE_FLOOD; bench/README.md).
# On the sanitized build only when the suite has one (make check): the
# workers are the optimized build's there too, and the same checks on the
# optimized control plane would take 57 CPU seconds more; elastic_hostile
# sends hostile peers to the optimized build's controller.
# timeout: 240
# builds: sanitized
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"
messages=${HOSTILE_MESSAGES:-1000}
# HOSTILE_FLOOD=N (make hostile: 200): then N silent connections held on
# each port in turn must not lock a correct handshake out
flood=${HOSTILE_FLOOD:-150} # more than the controller's 128 connection slots
# long enough for the barrage at 1 ms a message or so, the silent connections' 15 s
# and the flood, with a wide margin on a loaded machine
steps=$((200 + messages / 20)) # at 0.2 s a step (el_floor): 50 s for 1000 messages
umask 077
token="hostile-ports-token-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$token" >"$TMP/token"
export SLICETRAIN_TOKEN_FILE="$TMP/token"
el_start host --num-slices 2 --min-slices 1 --devices-per-slice 1 -- "${el_keys[@]}" steps=$steps \
	run_name=host metrics_file="$TMP/host.jsonl"
/usr/bin/python3 "$ST_ROOT/bench/hostile.py" --pid "$el_pid" --watch >"$TMP/watch.out" 2>&1 &
watcher=$!
/usr/bin/python3 "$ST_ROOT/bench/hostile.py" --pid "$el_pid" --formation --messages "$messages" \
	--deadline $((60 * el_scale)) >"$TMP/formation.out" 2>&1 &
former=$!
el_wait_steps host 3 || fail "the run did not reach step 3"
kill -0 "$el_pid" 2>/dev/null || fail "the launcher ended before the barrage"
/usr/bin/python3 "$ST_ROOT/bench/hostile.py" --pid "$el_pid" --messages "$messages" --json "$TMP/hostile.json" \
	--idle-wait 15 --flood "$flood" --deadline $((120 * el_scale + messages / 20)) >"$TMP/hostile.out" 2>&1
rc=$?
wait "$former"
frc=$?
sed 's/^/    /' "$TMP/formation.out" "$TMP/hostile.out"
[ $frc -eq 0 ] || fail "bench/hostile.py --formation: exit status $frc"
[ $rc -eq 0 ] || fail "bench/hostile.py: exit status $rc"
n=$(grep -c 'completed step' "$TMP/host.out")
echo "the run had completed $n of $steps steps when the barrage ended"
el_wait host $((120 + steps))
wait "$watcher"
wrc=$?
sed 's/^/    /' "$TMP/watch.out"
[ $wrc -eq 0 ] || fail "a listener beyond loopback, or the token on a command line (exit status $wrc)"
status_is "the run under hostile messages" "$el_rc" 0 "$TMP/host.err"
n=$(grep -c 'completed step' "$TMP/host.out")
[ "$n" -eq "$steps" ] || fail "$n step lines, want $steps"
sum=$(el_summary host)
echo "summary: $(echo $sum)"
[ "$(echo "$sum" | el_get failures)" = 0 ] || fail "hostile messages caused failures"
echo "drops logged: $(grep -cE 'connection dropped|more connections dropped' "$TMP/host.err")" \
	"(rate-limited: the first of each peer and reason, then counts)"
if grep -qF "$token" "$TMP/host.out" "$TMP/host.err" "$TMP/hostile.out"; then
	fail "the token's text appears in the run's output"
fi
grep -qE "$ST_SAN_REPORT" "$TMP/host.err" "$TMP/host.out" && fail "a sanitizer report in the run's output"
finish
