#!/usr/bin/env bash
# A Ray 2.60 cluster on this machine for slicetrain's Ray path (docs/ray.md):
# a head with 0 CPUs (it runs the job's driver, like the tutorial's head pod)
# and N worker nodes of C CPUs, each one host ("slicetrain_host": 1) of its
# own slice. Token authentication on (RAY_AUTH_MODE=token), and nothing on
# any network but loopback: the cluster lives in a network namespace of its
# own that has only a loopback interface (Ray's GCS and raylets listen on
# every address of their namespace whatever --node-ip-address says), and
# its dashboard is forwarded to 127.0.0.1:PORT here (PORT 8265 by default),
# as `kubectl port-forward` does in the tutorial.
#
#   local-cluster.sh up [--nodes N] [--cpus C]   start (default 2 nodes of 1 CPU)
#   local-cluster.sh down                        stop every process of the cluster, by pid
#   local-cluster.sh kill-node I [--all]         kill -9 node I's raylet: a hard node loss (--all:
#                                                every process of the node at once: the machine is gone)
#   local-cluster.sh add-node I [--token-file F | --no-token]
#                                                start node I (again): capacity returns (a
#                                                node with another run token, or none: tests)
#   local-cluster.sh drain-node I [SECONDS]      drain node I as a preemption notice, then
#                                                stop it after SECONDS (default 10)
#   local-cluster.sh status                      `ray list nodes`
#   local-cluster.sh env                         exports for the ray CLI: eval "$(... env)"
#   local-cluster.sh exec CMD...                 run CMD in the cluster's network namespace
#   local-cluster.sh pids [I]                    the cluster's processes (node I's raylet)
#
# Environment: ST_RAY_DIR (the cluster's directory, default
# /tmp/slicetrain-ray-$UID: tokens, data/ for base_output_directory, Ray's
# temp dir), ST_RAY_PORT (the dashboard here, default 8265), SLICETRAIN_BIN
# (default build/slicetrain of this checkout), ST_RAY_VENV (default .venv-ray,
# made by scripts/install-deps.sh --ray). Tunables passed to the cluster
# (docs/ray.md, "Recovery times"): ST_RAY_HEALTH_CHECK_PERIOD_MS (default
# 1000; Ray's 3000) and ST_RAY_HEALTH_CHECK_FAILURES (default 3; Ray's 5):
# how fast the GCS declares a lost node dead.
#
# Each node's environment carries slicetrain's settings to the Ray workers
# on it: SLICETRAIN_BIN, SLICETRAIN_TOKEN_FILE (the run token, a 0600 file in
# ST_RAY_DIR: never in a job's runtime_env or arguments), SLICETRAIN_SLICE_NAME.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DIR=${ST_RAY_DIR:-/tmp/slicetrain-ray-$(id -u)}
VENV=${ST_RAY_VENV:-$root/.venv-ray}
BIN=${SLICETRAIN_BIN:-$root/build/slicetrain}
PORT=${ST_RAY_PORT:-8265}
HC_PERIOD=${ST_RAY_HEALTH_CHECK_PERIOD_MS:-1000}
HC_FAILURES=${ST_RAY_HEALTH_CHECK_FAILURES:-3}
STATE=$DIR/cluster.env
# inside the namespace (nothing else listens there; the GCS port is not Ray's
# default 6379 because `ray start --head` refuses a port that any gcs_server
# of the machine, in any namespace, was started with)
GCS_PORT=36379 DASH_PORT=8265

UNDO_UP=0 # while `up` runs: a failure stops what it started
die() {
	echo "local-cluster: $*" >&2
	[ "$UNDO_UP" = 1 ] && { UNDO_UP=0; cmd_down >&2 || true; }
	exit 1
}
say() { echo "local-cluster: $*"; }

# Node I's ports inside the namespace (head: I = 0).
node_port() { # I OFFSET
	echo $((6400 + 20 * $1 + $2))
}
worker_ports() { echo "--min-worker-port=$((11000 + 200 * $1)) --max-worker-port=$((11000 + 200 * $1 + 199))"; }

load_state() {
	[ -f "$STATE" ] || die "no cluster in $DIR (local-cluster.sh up)"
	# shellcheck disable=SC1090
	. "$STATE"
	[ -e "/proc/$NETNS_PID/ns/net" ] || die "the cluster's namespace holder (pid $NETNS_PID) is gone; local-cluster.sh down"
	NETNS=$(readlink "/proc/$NETNS_PID/ns/net")
}

# Every process in the cluster's network namespace (Ray's daemons, workers,
# slicetrain processes, the forwarder): what we started, found by pid.
ns_pids() {
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/ns/net" 2>/dev/null)" = "$NETNS" ] && echo "${p#/proc/}"
	done
	return 0
}

# The pid of node I's raylet (its --node_manager_port), in our namespace.
raylet_pid() {
	local want="--node_manager_port=$(node_port "$1" 0)" p cmd
	for p in $(ns_pids); do
		cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
		[[ "$cmd" == */raylet/raylet\ * && " $cmd " == *" $want "* ]] && { echo "$p"; return 0; }
	done
	return 1
}

# The pids of $@ that are still running (not zombies).
alive() {
	local p st
	for p in "$@"; do
		st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
		[ "$st" != Z ] && echo "$p"
	done | paste -sd ' '
	return 0
}

in_ns() { nsenter --net="/proc/$NETNS_PID/ns/net" -- "$@"; }

# The environment every Ray process of the cluster starts with.
cluster_env() {
	export PATH="$VENV/bin:$PATH" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$DIR/ray_token"
	export RAY_health_check_period_ms=$HC_PERIOD RAY_health_check_failure_threshold=$HC_FAILURES
	export RAY_health_check_initial_delay_ms=1000 RAY_USAGE_STATS_ENABLED=0
	# `ray job stop`: time for the driver to stop the run and slicetrain to save (Ray's default: 3 s)
	export RAY_JOB_STOP_WAIT_TIME_S=${RAY_JOB_STOP_WAIT_TIME_S:-30}
	export SLICETRAIN_BIN="$BIN"
	unset RAY_ADDRESS
}

start_head() {
	(
		cluster_env
		# the job driver's defaults (slicetrain_elastic_trainer.py): each node is one host
		# of its own slice, with one device (a flag of the trainer overrides them)
		export SLICETRAIN_RAY_HOSTS_PER_SLICE=1 SLICETRAIN_RAY_DEVICES_PER_HOST=1
		in_ns ray start --head --node-ip-address=127.0.0.1 --port=$GCS_PORT --num-cpus=0 \
			--dashboard-host=127.0.0.1 --dashboard-port=$DASH_PORT --ray-client-server-port=10001 \
			--node-manager-port="$(node_port 0 0)" --object-manager-port="$(node_port 0 1)" \
			--dashboard-agent-listen-port="$(node_port 0 2)" --dashboard-agent-grpc-port="$(node_port 0 3)" \
			--metrics-export-port="$(node_port 0 4)" --runtime-env-agent-port="$(node_port 0 5)" \
			$(worker_ports 0) --object-store-memory=$((200 << 20)) --temp-dir="$DIR/r" --disable-usage-stats
	) >"$DIR/logs/head.log" 2>&1 || { tail -20 "$DIR/logs/head.log" >&2; die "the head did not start"; }
}

# Node I's processes other than its workers name its temp dir (a new one at
# each start, as a new machine has: a restarted node's log monitor must not
# publish an earlier start's worker logs again); R<I> in the state file.
node_dir() { sed -n "s/^R$1=//p" "$STATE" | tail -1; }

start_node() { # I [TOKEN_FILE|""]
	local i=$1 token=${2-$DIR/slicetrain_token} n=1 tmp
	while [ -e "$DIR/r$i.$n" ]; do n=$((n + 1)); done
	tmp=$DIR/r$i.$n
	echo "R$i=$tmp" >>"$STATE"
	(
		cluster_env
		export SLICETRAIN_SLICE_NAME="slice-$i"
		if [ -n "$token" ]; then export SLICETRAIN_TOKEN_FILE="$token"; else unset SLICETRAIN_TOKEN_FILE; fi
		in_ns ray start --address=127.0.0.1:$GCS_PORT --node-ip-address=127.0.0.1 --num-cpus="$CPUS" \
			--resources='{"slicetrain_host": 1}' \
			--node-manager-port="$(node_port "$i" 0)" --object-manager-port="$(node_port "$i" 1)" \
			--dashboard-agent-listen-port="$(node_port "$i" 2)" --dashboard-agent-grpc-port="$(node_port "$i" 3)" \
			--metrics-export-port="$(node_port "$i" 4)" --runtime-env-agent-port="$(node_port "$i" 5)" \
			$(worker_ports "$i") --object-store-memory=$((200 << 20)) --temp-dir="$tmp" --disable-usage-stats
	) >>"$DIR/logs/node$i.log" 2>&1 || { tail -20 "$DIR/logs/node$i.log" >&2; die "node $i did not start"; }
}

# Wait until N nodes are ALIVE (at most 60 s).
wait_alive() {
	local want=$1 n=0 t
	for t in $(seq 120); do
		n=$( (cluster_env; in_ns ray list nodes --address=127.0.0.1:$GCS_PORT --filter "state=ALIVE" \
			--format json 2>/dev/null) | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null || echo 0)
		[ "$n" -ge "$want" ] && return 0
		sleep 0.5
	done
	die "$n of $want nodes alive after 60 s"
}

cmd_up() {
	NODES=2 CPUS=1
	while [ $# -gt 0 ]; do
		case $1 in
		--nodes) NODES=$2; shift 2 ;;
		--cpus) CPUS=$2; shift 2 ;;
		*) die "up: unknown option $1" ;;
		esac
	done
	[ -x "$VENV/bin/ray" ] || die "no Ray in $VENV: bash scripts/install-deps.sh --ray"
	[ -x "$BIN" ] || die "no slicetrain binary $BIN (make, or set SLICETRAIN_BIN)"
	if [ -f "$STATE" ]; then
		# shellcheck disable=SC1090
		. "$STATE"
		[ -e "/proc/${NETNS_PID:-0}/ns/net" ] && die "a cluster is up in $DIR (local-cluster.sh down first)"
	fi
	umask 077
	mkdir -p "$DIR/logs" "$DIR/data"
	chmod 700 "$DIR"
	# the tokens: 32 random bytes each, hex, in 0600 files
	[ -s "$DIR/ray_token" ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DIR/ray_token"
	[ -s "$DIR/slicetrain_token" ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DIR/slicetrain_token"
	chmod 600 "$DIR/ray_token" "$DIR/slicetrain_token"
	# the namespace: held by a sleeping process of ours, loopback up
	setsid unshare --net sh -c 'ip link set lo up && exec sleep infinity' </dev/null >/dev/null 2>&1 &
	NETNS_PID=$!
	sleep 0.2
	[ -e "/proc/$NETNS_PID/ns/net" ] || die "cannot make a network namespace (unshare --net needs root)"
	NETNS=$(readlink "/proc/$NETNS_PID/ns/net")
	[ "$NETNS" != "$(readlink /proc/self/ns/net)" ] || die "unshare did not make a new namespace"
	# what later commands (add-node) must start nodes with, whatever their environment
	printf 'NETNS_PID=%s\nNODES=%s\nCPUS=%s\nBIN=%q\nVENV=%q\nPORT=%s\nHC_PERIOD=%s\nHC_FAILURES=%s\nFWD_PID=\n' \
		"$NETNS_PID" "$NODES" "$CPUS" "$BIN" "$VENV" "$PORT" "$HC_PERIOD" "$HC_FAILURES" >"$STATE"
	UNDO_UP=1
	say "network namespace $NETNS (holder pid $NETNS_PID; interfaces: $(in_ns ip -o link | awk -F": " '{print $2}' | paste -sd ' '))"
	start_head
	say "head: 0 CPUs, GCS 127.0.0.1:$GCS_PORT, dashboard 127.0.0.1:$DASH_PORT (in the namespace)"
	local i
	for i in $(seq "$NODES"); do
		start_node "$i"
		say "node $i: $CPUS CPU(s), slicetrain_host 1, slice-$i, raylet pid $(raylet_pid "$i")"
	done
	wait_alive $((NODES + 1))
	setsid "$VENV/bin/python" "$here/netns_forward.py" "$PORT" "/proc/$NETNS_PID/ns/net" $DASH_PORT \
		</dev/null >"$DIR/logs/forward.log" 2>&1 &
	local fwd=$!
	for i in $(seq 50); do grep -q forwarding "$DIR/logs/forward.log" 2>/dev/null && break; sleep 0.1; done
	sed -i "s/^FWD_PID=.*/FWD_PID=$fwd/" "$STATE"
	grep -q forwarding "$DIR/logs/forward.log" || die "cannot forward the dashboard: $(cat "$DIR/logs/forward.log")"
	UNDO_UP=0
	say "dashboard forwarded: http://localhost:$PORT (pid $fwd); token auth on"
	say "run: eval \"\$($0 env)\"   then   ray list nodes --address http://localhost:$PORT"
}

cmd_down() {
	[ -f "$STATE" ] || { say "no cluster in $DIR"; return 0; }
	# shellcheck disable=SC1090
	. "$STATE"
	local pids="" t
	if [ -e "/proc/$NETNS_PID/ns/net" ]; then
		NETNS=$(readlink "/proc/$NETNS_PID/ns/net")
		pids=$(ns_pids)
	fi
	[ -n "${FWD_PID:-}" ] && pids="$pids $FWD_PID"
	pids=$(echo $pids | tr ' ' '\n' | sort -un | paste -sd ' ')
	if [ -n "$pids" ]; then
		kill -TERM $pids 2>/dev/null || true
		for t in $(seq 50); do
			pids=$(alive $pids)
			[ -z "$pids" ] && break
			sleep 0.2
		done
		if [ -n "$pids" ]; then
			kill -KILL $pids 2>/dev/null || true
			sleep 0.5
		fi
	fi
	[ -n "$(alive $pids)" ] && die "still running after SIGKILL: $(alive $pids)"
	rm -f "$STATE"
	rm -rf "$DIR"/r "$DIR"/r[0-9]*.[0-9]*
	say "down (every process of the cluster's namespace stopped; $DIR/data kept)"
}

# The pids of node I: its raylet's descendants (workers, slicetrain) and
# every process that names its temp dir (agents, log monitor).
node_pids() {
	local dir raylet p cmd
	dir=$(node_dir "$1")
	raylet=$(raylet_pid "$1") || raylet=""
	for p in $(ns_pids); do
		cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
		if [[ -n "$dir" && "$cmd" == *"$dir/"* ]] || { [ -n "$raylet" ] && descends "$p" "$raylet"; }; then
			echo "$p"
		fi
	done
	return 0
}

# Is pid $1 pid $2 or one of its descendants?
descends() {
	local p=$1 n
	for n in $(seq 64); do
		[ "$p" = "$2" ] && return 0
		p=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $2}') || return 1 # after "(comm) ": state ppid
		[ -z "$p" ] || [ "$p" -le 1 ] && return 1
	done
	return 1
}

cmd_kill_node() {
	load_state
	local i=${1:?node number} p
	if [ "${2:-}" = --all ]; then # the machine is gone: every process of the node at once
		p=$(node_pids "$i" | paste -sd ' ')
		[ -n "$p" ] || die "node $i has no process running"
		kill -KILL $p
		say "node $i: every process (pids $p) killed (SIGKILL) at $(date +%s.%N)"
		return 0
	fi
	p=$(raylet_pid "$i") || die "node $i has no raylet running"
	kill -KILL "$p"
	say "node $i: raylet pid $p killed (SIGKILL) at $(date +%s.%N)"
}

cmd_add_node() {
	load_state
	local i=${1:?node number} p token=$DIR/slicetrain_token
	case ${2:-} in
	"") ;;
	--token-file) token=${3:?--token-file PATH} ;;
	--no-token) token="" ;;
	*) die "add-node: unknown option $2" ;;
	esac
	raylet_pid "$i" >/dev/null && die "node $i is running"
	# what is left of node i's last start (its agents and log monitor): by pid
	p=$(node_pids "$i" | paste -sd ' ')
	[ -n "$p" ] && kill -KILL $p 2>/dev/null
	start_node "$i" "$token"
	say "node $i: started at $(date +%s.%N), raylet pid $(raylet_pid "$i"), run token ${token:-(none)}"
}

cmd_drain_node() {
	load_state
	local i=${1:?node number} grace=${2:-10} p id
	p=$(raylet_pid "$i") || die "node $i has no raylet running"
	id=$(tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | sed -n 's/^--node_id=//p')
	[ -n "$id" ] || die "node $i: no --node_id in its raylet's command line"
	(cluster_env; in_ns ray drain-node --address=127.0.0.1:$GCS_PORT --node-id "$id" \
		--reason DRAIN_NODE_REASON_PREEMPTION --reason-message "local-cluster.sh drain-node $i" \
		--deadline-remaining-seconds "$grace") >>"$DIR/logs/node$i.log" 2>&1 || die "ray drain-node failed (logs/node$i.log)"
	say "node $i ($id): drained (preemption notice) at $(date +%s.%N); stopping it in $grace s"
	sleep "$grace"
	if p=$(raylet_pid "$i"); then
		kill -TERM "$p" && say "node $i: raylet pid $p stopped (SIGTERM) at $(date +%s.%N)"
	else
		say "node $i: its raylet had already exited (Ray stops a drained node)"
	fi
	return 0
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
kill-node) shift; cmd_kill_node "$@" ;;
add-node) shift; cmd_add_node "$@" ;;
drain-node) shift; cmd_drain_node "$@" ;;
status) load_state; (cluster_env; in_ns ray list nodes --address=127.0.0.1:$GCS_PORT) ;;
env)
	load_state
	printf 'export PATH=%q:"$PATH" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=%q ST_RAY_DIR=%q\n' \
		"$VENV/bin" "$DIR/ray_token" "$DIR" ;;
exec) shift; load_state; (cluster_env; in_ns "$@") ;;
pids)
	load_state
	if [ -n "${2:-}" ]; then raylet_pid "$2"; else ns_pids; fi ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
