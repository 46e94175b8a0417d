#!/usr/bin/env bash
# Partitions that heal, across test hosts (network namespaces:
# tests/hosts_lib.sh): one `slicetrain controller` on a host of its own and
# one `slicetrain agent` on each of 2 slices x 1 host (x 1 device, 1
# thread), steps paced to PACE s (llama3-test), async saves every PERIOD
# steps made slow (SLICETRAIN_TEST_SAVE_SECONDS=SAVE_S: each save's writer
# waits that long first, so that cuts often fall while a save is in
# flight), --repair-delay 1, --max-failures -1, --backoff-window 0.
#
# CYCLES times, once the group is on 2 slices: a slice drawn at random (the
# one of rank 0 too: its old worker is then the one that would commit) has
# its link cut for a time drawn uniformly from MIN_CUT to MAX_CUT seconds
# (across the controller's 1 s detection), then mended. A cut that heals
# before detection must cost nothing (no failure declared); whether it was
# detected is read from the controller's output 1.6 s after the mend (a
# mended link can stay silent up to 1 s more: ARP). One that lasts
# longer gets the slice replaced and the group re-formed in place on the
# other; when the link heals, the host's agent (which kept its worker:
# --controller-grace) reconnects and is told to stop that worker of the
# old generation (whatever it still writes is fenced), and the group grows
# back onto the host, fed by a peer.
#
# Then: the run finishes; `slicetrain ckpt verify` passes on every kept
# checkpoint; every committed checkpoint's files are of the generation its
# manifest names; the final weights equal those of the same run with
# `slicetrain launch` on one machine without faults (cmp of the exported
# safetensors); 0 steps lost. Prints each cycle, the counts (declared or
# not, in flight or not) and the fenced writes the logs name. Needs root.
# Nothing is left behind.
#
# Usage: bench/hosts_partitions.sh [> bench/results/hosts-partitions-CPU-DATE.txt]
#   CYCLES (default 100), PACE (0.3), PERIOD (6), SAVE_S (1.0), MIN_CUT
#   (0.2), MAX_CUT (2.4), GAP (1: seconds between cycles), SEED (1),
#   STEPS (default: enough for the cycles), SLICETRAIN (default
#   build/slicetrain; copy it elsewhere for a long run: a rebuild changes
#   the build id the controller requires)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLICETRAIN=${SLICETRAIN:-$ROOT/build/slicetrain}
CYCLES=${CYCLES:-100} PACE=${PACE:-0.3} PERIOD=${PERIOD:-6} SAVE_S=${SAVE_S:-1.0} MIN_CUT=${MIN_CUT:-0.2}
MAX_CUT=${MAX_CUT:-2.4} GAP=${GAP:-1} SEED=${SEED:-1}
STEPS=${STEPS:-$(awk -v c="$CYCLES" -v g="$GAP" -v p="$PACE" 'BEGIN {printf "%d", (c * (g + 9) + 30) / p}')}
[ -x "$SLICETRAIN" ] || { echo "no slicetrain at $SLICETRAIN (make first)" >&2; exit 2; }
. "$ROOT/tests/hosts_lib.sh"
. "$ROOT/tests/hosts_run_lib.sh"
hr_standalone hosts-partitions
RANDOM=$SEED

echo "bench/hosts_partitions.sh: CYCLES=$CYCLES STEPS=$STEPS PACE=$PACE PERIOD=$PERIOD SAVE_S=$SAVE_S" \
	"cuts $MIN_CUT..$MAX_CUT s GAP=$GAP SEED=$SEED"
"$ROOT/bench/cpu.sh"
echo "date: $(date -u +%F' '%T) UTC, commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"

declared() { grep -c 'RUNNING -> RESTARTING' "$TMP/run.out"; }
grown() { grep -c 're-formed in place on 2 slices' "$TMP/run.out"; }
# a save in flight: the newest save begun (its log line) has no manifest
# yet and has not failed
in_flight() {
	local last
	last=$(sed -n 's/.*checkpoint step \([0-9]*\): training stalled.*/\1/p' "$TMP/run.out" | tail -1)
	[ -n "$last" ] && [ ! -e "$TMP/o/hosts/checkpoints/$last/manifest.json" ] &&
		! grep -q "checkpoint step $last FAILED" "$TMP/run.out"
}
wait_for() { # COMMAND... for up to 60 s
	local i
	for i in $(seq 600); do "$@" && return 0; sleep 0.1; done
	return 1
}

hr_scenario "$STEPS" "$PACE" checkpoint_period=$PERIOD max_num_checkpoints_to_keep=4 && [ "$failures" = 0 ] ||
	{ echo "cannot set up the run: $(tail -3 "$TMP/ref.out")"; exit 1; }
hr_agent_env="SLICETRAIN_TEST_SAVE_SECONDS=$SAVE_S"
hr_controller run --num-slices 2 --min-slices 1 --devices-per-slice 1 --repair-delay 1 --max-failures -1 \
	--backoff-window 0 -- "${keys[@]}" run_name=hosts
hr_agent 0 0
hr_agent 1 0
hr_wait_steps run 10 60 || { fail "the run did not start: $(tail -3 "$TMP/run.out")"; }

n_decl=0 n_short=0 n_flight=0 n_flight_decl=0
for k in $(seq 1 "$CYCLES"); do
	s=$((RANDOM % 2))
	d=$(awk -v r="$RANDOM" -v lo="$MIN_CUT" -v hi="$MAX_CUT" 'BEGIN {printf "%.2f", lo + (hi - lo) * r / 32767}')
	hr_wait_steps run $(($(hr_steps run) + 2)) 60 || { fail "cycle $k: no steps"; break; }
	before=$(declared) g0=$(grown) old=${hr_apid[$s.0]}
	fl=no
	in_flight && fl=yes
	th_cut "s${s}h0" || { fail "cycle $k: cannot cut"; break; }
	sleep "$d"
	th_mend "s${s}h0"
	# a link that comes up needs ARP again: a request lost while the far end
	# was still down is retried after 1 s (retrans_time_ms), so a short cut
	# can silence a host for over the controller's 1 s; whether it did shows
	# in the controller's output within its timeout after the mend
	sleep 1.6
	[ $fl = yes ] && n_flight=$((n_flight + 1))
	if [ "$(declared)" -gt "$before" ]; then
		n_decl=$((n_decl + 1))
		[ $fl = yes ] && n_flight_decl=$((n_flight_decl + 1))
		grep 'RUNNING -> RESTARTING' "$TMP/run.out" | tail -1 | grep -q "slice $s" ||
			fail "cycle $k: the failure was not blamed on slice $s"
		# the host's agent (--controller-grace) reconnects, is told to stop its
		# old worker, and the group grows back onto it
		wait_for eval '[ "$(grown)" -gt "$g0" ]' || { fail "cycle $k: no growth back to 2 slices"; break; }
		kill -0 "$old" 2>/dev/null || fail "cycle $k: the agent of slice $s stopped"
		echo "cycle $k: slice $s cut $d s (save in flight: $fl): replaced, grown back"
	else
		n_short=$((n_short + 1))
		echo "cycle $k: slice $s cut $d s (save in flight: $fl): nothing declared"
	fi
	sleep "$GAP"
done
echo "the cycles are done at step $(hr_steps run) of $STEPS"
hr_end_run run $(awk -v n="$STEPS" -v p="$PACE" 'BEGIN {printf "%d", n * p + 180}')
[ "$(hr_get failures)" = "$n_decl" ] || fail "the summary's failures $(hr_get failures), the cycles declared $n_decl"
echo "cycles: $CYCLES; declared and replaced $n_decl, healed before detection $n_short (nothing declared);" \
	"a save in flight at the cut: $n_flight ($n_flight_decl of them declared)"

ck=$TMP/o/hosts/checkpoints
"$SLICETRAIN" ckpt verify "$ck" >"$TMP/verify.out" 2>&1 || fail "ckpt verify: $(tail -3 "$TMP/verify.out")"
echo "kept checkpoints verified: $(grep -c ': ok (' "$TMP/verify.out") ($(ls "$ck" | tr '\n' ' '))"
/usr/bin/python3 - "$ck" <<'PY' || fail "a committed checkpoint holds a file of another generation"
import json, os, re, sys
ck, bad, n = sys.argv[1], 0, 0
for step in sorted(os.listdir(ck)):
    m = os.path.join(ck, step, "manifest.json")
    if not os.path.exists(m):
        continue
    man = json.load(open(m))
    gen = man.get("generation")
    for f in man.get("files", []):
        name = f["name"] if isinstance(f, dict) else f
        g = re.match(r"shard-g0*(\d+)-", name)
        n += 1
        if gen is None or not g or int(g.group(1)) != gen:
            print(f"step {step}: file {name} in a manifest of generation {gen}")
            bad += 1
print(f"committed checkpoints: {n} files, each of its manifest's generation" if not bad else f"{bad} files of another generation")
sys.exit(1 if bad else 0)
PY
echo "fenced (refused as stale) in the logs: $(cat "$TMP"/*.out | grep -ci 'stale') line(s)"
cat "$TMP"/*.out | grep -i 'stale' | sed 's/^.*slicetrain/slicetrain/' | cut -c1-160 | sort | uniq -c | sort -rn | head -5
hr_same_weights hosts "$STEPS"
hr_clean
echo "$failures failure(s)"
exit $((failures > 0))
