# Elastic runs on test hosts (sourced after tests/cli_lib.sh and
# tests/hosts_lib.sh; tests/cli/hosts_*.sh and bench/hosts_recovery.sh):
# one slicetrain controller on a host of its own and one agent per host,
# each in its network namespace, as `slicetrain controller` and
# `slicetrain agent` run on separate machines (docs/hosts.md). The
# filesystem is shared, as the run directory must be (docs/hosts.md).
#
# hr_up SLICES HOSTS_PER_SLICE [RATE]: the hosts: a switch per slice
#   (s0, s1, ...) joined in a chain by trunks (shaped to RATE when given:
#   the slower links between slices), the controller's host "ctl"
#   (10.213.0.1) on s0, slice S's host H "sShH" at 10.213.(S+1).(H+10);
#   a run token in $TMP/token (SLICETRAIN_TOKEN_FILE, exported).
# hr_controller NAME OPTIONS... -- KEYS...: `slicetrain controller
#   --listen 10.213.0.1:$hr_port OPTIONS -- KEYS` in the background on ctl,
#   its output (stdout and stderr) in $TMP/NAME.out, its pid in $hr_ctl.
# hr_agent S H [OPTIONS...]: slice S's host H's agent (--devices
#   $hr_devices), output appended to $TMP/agent-S-H.out, pid in
#   hr_apid[S.H]. Workers run $hr_worker_exe when set (SLICETRAIN_WORKER_EXE);
#   $hr_agent_env (NAME=VALUE words) is added to the agent's environment.
# hr_worker S H: the pid of a worker of that agent (empty when none).
# hr_steps NAME: the number of step lines of the controller's output so far.
# hr_wait_steps NAME N [SECONDS]: until N step lines (1 when not in time).
# hr_wait_line NAME PATTERN [SECONDS]: until a line matches (grep -E).
# hr_wait NAME SECONDS: until the controller exits (SIGKILL after SECONDS,
#   a failure); its status in $hr_rc.
# hr_summary NAME: read the run's summary line into $hr_sum (KEY=VALUE
#   lines) and print it on one line; hr_get KEY: a value of it.
# hr_standalone NAME: for a script that does not source tests/cli_lib.sh (a
#   benchmark): $TMP (removed on exit), fail (counted in $failures), $ST_ROOT.
# hr_keys STEPS [KEY=VALUE...]: the scenarios' run into the array $keys:
#   llama3-test, 4 x 128 tokens a device, data parallel across slices, a save
#   every 40 steps (checkpoint_period=N after it overrides), output in $TMP/o.
# hr_scenario STEPS PACE [KEY=VALUE...]: the usual test: hr_keys, the
#   fault-free reference (hr_reference 1), the hosts of 2 slices x 1 host
#   (hr_up 2 1), steps paced to PACE s (SLICETRAIN_MIN_STEP_SECONDS,
#   exported). 1 when the hosts cannot be made.
# hr_end_run NAME SECONDS: the controller's end (hr_wait), its exit status
#   0, its summary printed on one line, 0 steps lost (else fail).
# hr_stats NAME VALUES...: "NAME median M, max X (N)".
# hr_reference, hr_same_weights, hr_clean: below.
hr_port=7400 hr_devices=1 hr_hps=1 hr_ctl= hr_rc= hr_worker_exe= hr_sum=
declare -gA hr_apid=()

hr_keys() {
	local steps=$1; shift
	keys=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128
		checkpoint_period=40 dcn_data_parallelism=-1 learning_rate=1e-3 base_output_directory="$TMP/o"
		steps="$steps" "$@")
}

hr_scenario() {
	local steps=$1 pace=$2; shift 2
	hr_keys "$steps" "$@"
	hr_reference 1 "${keys[@]}"
	hr_up 2 1 || return 1
	export SLICETRAIN_MIN_STEP_SECONDS=$pace
}

hr_end_run() {
	hr_wait "$1" "$2"
	[ "$hr_rc" = 0 ] || fail "$1: the controller's exit status $hr_rc"
	hr_summary "$1" >/dev/null
	echo "summary: failures $(hr_get failures), resizes $(hr_get resizes), steps lost $(hr_get steps_lost)," \
		"goodput $(hr_get goodput)"
	[ "$(hr_get steps_lost)" = 0 ] || fail "steps lost: $(hr_get steps_lost)"
}

hr_stats() {
	local name=$1; shift
	[ $# -gt 0 ] || { echo "$name: none"; return; }
	printf '%s\n' "$@" | sort -g | awk -v n="$name" '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
		printf "%-45s median %.3f, max %.3f (%d)\n", n, m, v[NR], NR}'
}

hr_up() {
	local slices=$1 hps=$2 rate=${3:-} s h
	hr_hps=$hps
	th_init hr || return 1
	for s in $(seq 0 $((slices - 1))); do
		th_switch "s$s" || return 1
		if [ "$s" -gt 0 ]; then
			th_trunk "s$((s - 1))" "s$s" || return 1
			[ -z "$rate" ] || th_shape_trunk "s$((s - 1))" "s$s" "$rate" || return 1
		fi
		for h in $(seq 0 $((hps - 1))); do
			th_host "s${s}h$h" "10.213.$((s + 1)).$((h + 10))" "s$s" || return 1
		done
	done
	th_host ctl 10.213.0.1 s0 || return 1
	head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/token"
	chmod 600 "$TMP/token"
	export SLICETRAIN_TOKEN_FILE=$TMP/token
}

hr_controller() {
	local name=$1; shift
	th_bg ctl "$TMP/$name.out" env OMP_NUM_THREADS=1 "$SLICETRAIN" controller --listen "10.213.0.1:$hr_port" "$@"
	hr_ctl=$TH_PID
}

hr_agent() {
	local s=$1 h=$2; shift 2
	local out=$TMP/agent-$s-$h.out
	echo "== $(date +%T.%N | cut -c1-12) agent starts" >>"$out"
	ST_TEST_HOSTS=$TH_ID ip netns exec "$(th_ns "s${s}h$h")" env OMP_NUM_THREADS=1 ${hr_agent_env:-} \
		${hr_worker_exe:+SLICETRAIN_WORKER_EXE=$hr_worker_exe} "$SLICETRAIN" agent \
		--controller "10.213.0.1:$hr_port" --slice "$s" --host "$h" --hosts-per-slice "$hr_hps" \
		--devices "$hr_devices" --quiet "$@" >>"$out" 2>&1 </dev/null &
	hr_apid[$s.$h]=$!
	_th_pids+=("$!:$(_th_start "$!")")
}

hr_worker() {
	local a=${hr_apid[$1.$2]:-}
	[ -n "$a" ] && pgrep -P "$a" | head -1
}

hr_steps() { grep -c 'completed step' "$TMP/$1.out" 2>/dev/null || true; }

hr_wait_steps() {
	local i
	for i in $(seq 1 $((${3:-60} * 20))); do
		[ "$(hr_steps "$1")" -ge "$2" ] && return 0
		kill -0 "$hr_ctl" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

hr_wait_line() {
	local i
	for i in $(seq 1 $((${3:-60} * 20))); do
		grep -qE -- "$2" "$TMP/$1.out" 2>/dev/null && return 0
		sleep 0.05
	done
	return 1
}

hr_wait() {
	local name=$1 i
	for i in $(seq 1 $(($2 * 10))); do
		kill -0 "$hr_ctl" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$hr_ctl" 2>/dev/null; then
		fail "$name: the controller still runs after $2 s"
		kill -KILL "$hr_ctl"
	fi
	wait "$hr_ctl"
	hr_rc=$?
}

hr_summary() {
	hr_sum=$(grep '^{"event":"summary"' "$TMP/$1.out" | tail -1 | /usr/bin/python3 -c '
import json, sys
for k, v in json.loads(sys.stdin.read() or "{}").items():
    print(f"{k}={v}")')
	echo "summary: $(echo $hr_sum)"
}
hr_get() { echo "$hr_sum" | sed -n "s/^$1=//p"; }

hr_standalone() {
	ST_ROOT=${ST_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
	TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	trap 'rm -rf "$TMP"' EXIT
	failures=0
	fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
}

# hr_reference DEVICES_PER_SLICE KEYS...: the fault-free reference, run_name
#   ref: `slicetrain launch` of 2 slices on this machine (its output in
#   $TMP/ref.out).
hr_reference() {
	local dps=$1; shift
	OMP_NUM_THREADS=1 "$SLICETRAIN" launch --num-slices 2 --devices-per-slice "$dps" -- "$@" run_name=ref \
		>"$TMP/ref.out" 2>&1 || fail "reference run failed: $(tail -3 "$TMP/ref.out")"
}

# hr_same_weights RUN STEPS: the final checkpoint of run_name RUN (under
#   $TMP/o) exports to the same bytes as the reference's.
hr_same_weights() {
	local r
	for r in ref "$1"; do
		"$SLICETRAIN" export "$TMP/o/$r/checkpoints/$2" "$TMP/hf-$r" >/dev/null 2>"$TMP/$r.export.err" ||
			fail "$r: export failed: $(tail -1 "$TMP/$r.export.err")"
	done
	cmp -s "$TMP/hf-ref/model.safetensors" "$TMP/hf-$1/model.safetensors" &&
		echo "the final weights are bit-identical to launch's fault-free run on one machine" ||
		fail "the final weights differ from launch's fault-free run on one machine"
}

# hr_clean: stop everything of the test hosts; nothing may be left.
hr_clean() {
	th_down
	local left
	left=$(th_leftovers)
	[ -z "$left" ] || fail "left behind: $left"
}
