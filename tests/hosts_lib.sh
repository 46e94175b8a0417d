# Test hosts (sourced by tests and benchmarks, after tests/cli_lib.sh when
# both are used): Linux network namespaces as machines, so that an elastic
# controller and its agents can run as if on separate hosts, on links that
# can be shaped, cut and made lossy, with CPUs that can be throttled.
#
# Layout: a switch is a namespace st-ID-SW holding a bridge br0; a host is a
# namespace st-ID-NAME with lo up and one interface eth0 (ADDR/16, ADDR in
# 10.213.0.0/16), whose veth peer is a port of its switch's bridge; a trunk
# is a veth pair between two switches' bridges. All hosts share one /16 (one
# Ethernet segment across trunks). ID is this run's id (th_init), so runs at
# the same time never collide. Nothing is created or changed in the root
# network namespace: no bridge, veth, address, route or iptables rule; the
# root namespace cannot reach 10.213.x.x. Every interface made here carries
# the alias st-ID, every process started by th_exec / th_bg the environment
# variable ST_TEST_HOSTS=ID, so that th_leftovers can find what is left.
#
# Needs root and iproute2 (ip, tc); th_drop needs iptables and th_throttle a
# cgroup v1 cpu hierarchy (scripts/install-deps.sh --test). A function that
# cannot do its work says why on stderr ("hosts_lib: th_NAME: ...") and
# returns 1; check it (`th_host a 10.213.1.1 s1 || ...`): a missing privilege
# or tool is a failure, never a skip.
#
# Functions (NAME: a host, SW: a switch; names are letters, digits, _ . -):
#   th_init [TAG]            new run: sets TH_ID (TAG, at most 4 of a-z 0-9,
#                            then 6 random hex digits) and the cleanup on exit
#   th_switch SW             a switch
#   th_host NAME ADDR SW     a host on switch SW, eth0 ADDR/16
#   th_trunk SW1 SW2         a link between two switches (no loops)
#   th_shape_host NAME RATE  limit the host's link to RATE (tc's units: 20mbit,
#                            1gbit), each direction, with tbf
#   th_shape_trunk SW1 SW2 RATE   the same for a trunk
#   th_unshape NAME | th_unshape SW1 SW2   remove the limit
#   th_cut NAME / th_mend NAME     the host's link down silently (both ends
#                            set down: no FIN or RST reaches a peer) / up again
#   th_drop NAME P / th_undrop NAME  drop a share P (0..1) of the host's
#                            incoming and outgoing packets (iptables in the
#                            host; a dropped local send of UDP or ICMP fails
#                            with EPERM, TCP just retransmits) / stop that
#   th_throttle NAME CPUS PID...  put processes in the cpu cgroup st-ID-NAME
#                            limited to CPUS of a CPU (0.1: 10 ms per 100 ms)
#   th_unthrottle NAME       move them back to the root cgroup, remove it
#   th_exec NAME CMD...      run CMD in the host (or switch) NAME; its status
#   th_bg NAME OUTFILE CMD...  start CMD in NAME in the background, stdout and
#                            stderr to OUTFILE; TH_PID is its pid, which
#                            th_down stops (call it in the test's shell, not
#                            in $(...), or the pid is not recorded)
#   th_addr NAME             print the host's address
#   th_ns NAME               print the namespace's name (for ip -n, tc -n)
#   th_down                  stop and remove everything of this run: every
#                            process in its namespaces, with its marker or
#                            started by th_bg (TERM, then KILL after 2 s),
#                            its cgroups (processes moved to the root cgroup
#                            first, not killed), its namespaces (which takes
#                            their interfaces, qdiscs and rules). Idempotent.
#   th_leftovers [ID]        print what of run ID (default: this one) is still
#                            there: namespaces, interfaces in any namespace,
#                            cgroups, processes. Empty output: clean.
#
# Cleanup: th_init chains an EXIT trap to the one already set (cli_lib.sh's,
# which removes $TMP: th_down runs first). Bash runs the EXIT trap also when
# killed by TERM, INT or HUP that it does not trap, so a failed or killed test
# cleans up; a test that sets its own EXIT trap after th_init must call
# th_down itself. In a ( ) subshell th_init does not chain (there bash shows
# the parent's trap as if it were the subshell's).

TH_ID=${TH_ID:-} TH_PID=
_th_live=0 _th_n=0 _th_trap_owner= _th_prev_exit=
declare -gA _th_kind=() _th_addr=() _th_sw=() _th_port=() _th_trunk=() _th_group=() _th_dropp=()
_th_pids=() # "PID:STARTTIME" of th_bg's processes

_th_err() { echo "hosts_lib: $1: $2" >&2; return 1; }
_th_nsname() { echo "st-$TH_ID-$1"; }
_th_ok() { # _th_ok FN: th_init was called
	[ "$_th_live" = 1 ] || _th_err "$1" "call th_init first"
}
_th_is() { # _th_is FN KIND NAME: NAME is a host or switch of this run
	[ "${_th_kind[$3]:-}" = "$2" ] || _th_err "$1" "no $2 '$3' in run $TH_ID"
}
_th_newname() { # _th_newname FN NAME: NAME is valid and unused
	[[ "$2" =~ ^[A-Za-z0-9_.-]{1,32}$ ]] || { _th_err "$1" "bad name '$2' (1 to 32 of A-Z a-z 0-9 _ . -)"; return 1; }
	[ -z "${_th_kind[$2]:-}" ] || _th_err "$1" "'$2' exists already (a ${_th_kind[$2]})"
}
# the start time of process PID (field 22 of its stat: with the pid, its identity)
_th_start() {
	local line f
	{ read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
	read -ra f <<<"${line##*) }"
	echo "${f[19]}"
}
# PID runs (exists and is not a zombie)
_th_alive() {
	local line
	{ read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
	line=${line##*) }
	[ "${line:0:1}" != Z ] && [ "${line:0:1}" != X ]
}
# those of PID... that run
_th_running() {
	local p
	for p in "$@"; do _th_alive "$p" && echo "$p"; done
	return 0
}
# the mount point of the cgroup v1 hierarchy with the cpu controller
_th_cpu_root() {
	awk '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++) if (o[i] == "cpu") { print $2; exit } }' /proc/self/mounts | grep .
}
# the namespaces of run $1
_th_namespaces() { ip netns list 2>/dev/null | awk -v p="st-$1-" 'index($1, p) == 1 { print $1 }'; }
# the cgroups of run $1
_th_cgroups() {
	local root d
	root=$(_th_cpu_root) || return 0
	for d in "$root/st-$1-"*; do [ -d "$d" ] && echo "$d"; done
	return 0
}
# the processes of run $1: in its namespaces, with its marker, in its cgroups (with $2=cg)
_th_procs() {
	local ns cg
	while read -r ns; do ip netns pids "$ns" 2>/dev/null; done < <(_th_namespaces "$1")
	grep -lzxF "ST_TEST_HOSTS=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
	if [ "${2:-}" = cg ]; then
		while read -r cg; do cat "$cg/cgroup.procs" 2>/dev/null; done < <(_th_cgroups "$1")
	fi
	return 0
}
# move the processes of cgroup directory $1 to the root cgroup, remove it
_th_cg_remove() {
	local root i p
	root=$(_th_cpu_root) || return 1
	for i in $(seq 1 40); do
		while read -r p; do echo "$p" >"$root/cgroup.procs"; done <"$1/cgroup.procs" 2>/dev/null
		rmdir "$1" 2>/dev/null && return 0
		[ -d "$1" ] || return 0
		sleep 0.05
	done
	_th_err th_down "cannot remove cgroup $1: $(tr '\n' ' ' <"$1/cgroup.procs" 2>/dev/null)"
}
_th_on_exit() {
	th_down
	eval "$_th_prev_exit"
}

th_init() {
	local tag=${1:-} i ns
	[[ "$tag" =~ ^[a-z0-9]{0,4}$ ]] || { _th_err th_init "TAG '$tag': at most 4 of a-z 0-9"; return 1; }
	[ "$_th_live" = 1 ] && { _th_err th_init "run $TH_ID is up (th_down first)"; return 1; }
	[ "$(id -u)" = 0 ] || { _th_err th_init "needs root (network namespaces, tc, iptables, cgroups)"; return 1; }
	command -v ip >/dev/null || { _th_err th_init "no ip command (iproute2: scripts/install-deps.sh --test)"; return 1; }
	ip netns list >/dev/null || { _th_err th_init "ip netns does not work here"; return 1; }
	for i in 1 2 3 4 5 6 7 8; do
		TH_ID=$tag$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
		[ -z "$(_th_namespaces "$TH_ID")$(_th_cgroups "$TH_ID")" ] && break
	done
	_th_kind=() _th_addr=() _th_sw=() _th_port=() _th_trunk=() _th_group=() _th_dropp=() _th_pids=()
	_th_n=0 _th_live=1 TH_PID=
	if [ "$_th_trap_owner" != "$BASHPID" ]; then # once per shell
		_th_prev_exit=
		if [ "$BASHPID" = "$$" ]; then
			eval "local -a t=($(trap -p EXIT))"
			_th_prev_exit=${t[2]:-}
		fi
		trap _th_on_exit EXIT
		_th_trap_owner=$BASHPID
	fi
}

th_switch() {
	local sw=${1:-} ns
	_th_ok th_switch && _th_newname th_switch "$sw" || return 1
	ns=$(_th_nsname "$sw")
	ip netns add "$ns" || { _th_err th_switch "ip netns add $ns failed"; return 1; }
	_th_kind[$sw]=switch _th_group[$sw]=$sw
	ip -n "$ns" -batch - <<-EOF || { _th_err th_switch "cannot make the bridge in $ns"; return 1; }
		link add br0 type bridge
		link set br0 alias st-$TH_ID
		link set br0 up
	EOF
}

th_host() {
	local name=${1:-} addr=${2:-} sw=${3:-} ns swns port
	_th_ok th_host && _th_newname th_host "$name" && _th_is th_host switch "$sw" || return 1
	[[ "$addr" =~ ^10\.213\.([0-9]{1,3})\.([0-9]{1,3})$ ]] && [ "${BASH_REMATCH[1]}" -le 255 ] &&
		[ "${BASH_REMATCH[2]}" -le 255 ] || { _th_err th_host "address '$addr' is not in 10.213.0.0/16"; return 1; }
	ns=$(_th_nsname "$name") swns=$(_th_nsname "$sw")
	_th_n=$((_th_n + 1))
	port=$(echo "h$_th_n-$name" | cut -c1-15)
	ip netns add "$ns" || { _th_err th_host "ip netns add $ns failed"; return 1; }
	_th_kind[$name]=host _th_addr[$name]=$addr _th_sw[$name]=$sw _th_port[$name]=$port
	ip -n "$ns" -batch - <<-EOF || { _th_err th_host "cannot make $name's eth0"; return 1; }
		link set lo up
		link add eth0 type veth peer name $port netns $swns
		link set eth0 alias st-$TH_ID
		addr add $addr/16 dev eth0
		link set eth0 up
	EOF
	ip -n "$swns" -batch - <<-EOF || { _th_err th_host "cannot plug $name into $sw"; return 1; }
		link set $port alias st-$TH_ID
		link set $port master br0
		link set $port up
	EOF
}

th_trunk() {
	local a=${1:-} b=${2:-} k ga gb ea eb
	_th_ok th_trunk && _th_is th_trunk switch "$a" && _th_is th_trunk switch "$b" || return 1
	ga=${_th_group[$a]} gb=${_th_group[$b]}
	[ "$ga" != "$gb" ] || { _th_err th_trunk "$a and $b are joined already (a second path would loop)"; return 1; }
	_th_n=$((_th_n + 1))
	ea=$(echo "t$_th_n-$b" | cut -c1-15) eb=$(echo "t$_th_n-$a" | cut -c1-15)
	ip -n "$(_th_nsname "$a")" -batch - <<-EOF || { _th_err th_trunk "cannot make the trunk $a-$b"; return 1; }
		link add $ea type veth peer name $eb netns $(_th_nsname "$b")
		link set $ea alias st-$TH_ID
		link set $ea master br0
		link set $ea up
	EOF
	ip -n "$(_th_nsname "$b")" -batch - <<-EOF || { _th_err th_trunk "cannot plug the trunk into $b"; return 1; }
		link set $eb alias st-$TH_ID
		link set $eb master br0
		link set $eb up
	EOF
	_th_trunk["$a $b"]="$ea $eb" _th_trunk["$b $a"]="$eb $ea"
	for k in "${!_th_group[@]}"; do [ "${_th_group[$k]}" = "$gb" ] && _th_group[$k]=$ga; done
	return 0
}

# _th_ends FN NAME | FN SW1 SW2: "NS DEV NS DEV", the two ends of a host's link or a trunk
_th_ends() {
	local fn=$1 p q
	if [ $# -eq 2 ]; then
		_th_is "$fn" host "$2" || return 1
		echo "$(_th_nsname "$2") eth0 $(_th_nsname "${_th_sw[$2]}") ${_th_port[$2]}"
	else
		[ -n "${_th_trunk["$2 $3"]:-}" ] || { _th_err "$fn" "no trunk between '$2' and '$3'"; return 1; }
		read -r p q <<<"${_th_trunk["$2 $3"]}"
		echo "$(_th_nsname "$2") $p $(_th_nsname "$3") $q"
	fi
}
# _th_shape FN RATE NS DEV NS DEV: tbf at RATE on both devices (each one's
# egress: the two directions); burst 10 ms of RATE, at least 16 KiB
_th_shape() {
	local fn=$1 rate=$2 bps burst
	[[ "$rate" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || { _th_err "$fn" "rate '$rate': want N followed by bit, kbit, mbit or gbit"; return 1; }
	case ${BASH_REMATCH[2]} in bit) bps=1 ;; kbit) bps=1000 ;; mbit) bps=1000000 ;; gbit) bps=1000000000 ;; esac
	bps=$((BASH_REMATCH[1] * bps / 8))
	[ "$bps" -gt 0 ] || { _th_err "$fn" "rate '$rate' is zero"; return 1; }
	burst=$((bps / 100 > 16384 ? bps / 100 : 16384))
	tc -n "$3" qdisc replace dev "$4" root tbf rate "$rate" burst "$burst" latency 100ms &&
		tc -n "$5" qdisc replace dev "$6" root tbf rate "$rate" burst "$burst" latency 100ms ||
		_th_err "$fn" "tc cannot shape $4 ($3) or $6 ($5)"
}
th_shape_host() {
	local e
	_th_ok th_shape_host && e=$(_th_ends th_shape_host "${1:-}") || return 1
	_th_shape th_shape_host "${2:-}" $e
}
th_shape_trunk() {
	local e
	_th_ok th_shape_trunk && e=$(_th_ends th_shape_trunk "${1:-}" "${2:-}") || return 1
	_th_shape th_shape_trunk "${3:-}" $e
}
th_unshape() {
	local e n1 d1 n2 d2
	_th_ok th_unshape && e=$(_th_ends th_unshape "$@") || return 1
	read -r n1 d1 n2 d2 <<<"$e"
	# deleting the root qdisc where there is none only says so
	tc -n "$n1" qdisc del dev "$d1" root 2>/dev/null
	tc -n "$n2" qdisc del dev "$d2" root 2>/dev/null
	return 0
}

th_cut() {
	local n1 d1 n2 d2
	_th_ok th_cut && read -r n1 d1 n2 d2 <<<"$(_th_ends th_cut "${1:-}")" && [ -n "$n1" ] || return 1
	ip -n "$n2" link set "$d2" down && ip -n "$n1" link set "$d1" down || _th_err th_cut "cannot set $1's link down"
}
th_mend() {
	local n1 d1 n2 d2
	_th_ok th_mend && read -r n1 d1 n2 d2 <<<"$(_th_ends th_mend "${1:-}")" && [ -n "$n1" ] || return 1
	ip -n "$n1" link set "$d1" up && ip -n "$n2" link set "$d2" up || _th_err th_mend "cannot set $1's link up"
}

th_drop() {
	local name=${1:-} p=${2:-} ns c
	_th_ok th_drop && _th_is th_drop host "$name" || return 1
	[[ "$p" =~ ^(0(\.[0-9]+)?|1(\.0*)?|\.[0-9]+)$ ]] || { _th_err th_drop "share '$p' is not in 0..1"; return 1; }
	command -v iptables >/dev/null || { _th_err th_drop "no iptables (scripts/install-deps.sh --test)"; return 1; }
	th_undrop "$name" || return 1
	ns=$(_th_nsname "$name")
	for c in INPUT OUTPUT; do
		ip netns exec "$ns" iptables -w -I "$c" 1 -m statistic --mode random --probability "$p" -j DROP ||
			{ _th_err th_drop "iptables in $ns failed"; return 1; }
		_th_dropp[$name]=$p
	done
}
th_undrop() {
	local name=${1:-} ns c
	_th_ok th_undrop && _th_is th_undrop host "$name" || return 1
	[ -n "${_th_dropp[$name]:-}" ] || return 0
	ns=$(_th_nsname "$name")
	for c in INPUT OUTPUT; do
		ip netns exec "$ns" iptables -w -D "$c" -m statistic --mode random --probability "${_th_dropp[$name]}" -j DROP 2>/dev/null
	done
	unset "_th_dropp[$name]"
	return 0
}

th_throttle() {
	local name=${1:-} cpus=${2:-} root cg quota p
	shift 2 2>/dev/null
	_th_ok th_throttle || return 1
	[[ "$name" =~ ^[A-Za-z0-9_.-]{1,32}$ ]] || { _th_err th_throttle "bad name '$name'"; return 1; }
	quota=$(awk -v c="$cpus" 'BEGIN { if (c !~ /^[0-9]*\.?[0-9]+$/ || c * 100000 < 1000) exit 1; printf "%d", c * 100000 }') ||
		{ _th_err th_throttle "CPUS '$cpus': a share of a CPU, at least 0.01"; return 1; }
	[ $# -gt 0 ] || { _th_err th_throttle "no pid"; return 1; }
	root=$(_th_cpu_root) || { _th_err th_throttle "no cgroup v1 cpu hierarchy in /proc/self/mounts"; return 1; }
	cg=$root/st-$TH_ID-$name
	{ [ -d "$cg" ] || mkdir "$cg"; } && echo 100000 >"$cg/cpu.cfs_period_us" && echo "$quota" >"$cg/cpu.cfs_quota_us" ||
		{ _th_err th_throttle "cannot set up cgroup $cg"; return 1; }
	for p in "$@"; do
		echo "$p" >"$cg/cgroup.procs" || { _th_err th_throttle "cannot move pid $p into $cg"; return 1; }
	done
}
th_unthrottle() {
	local root
	_th_ok th_unthrottle && root=$(_th_cpu_root) || return 1
	[ -d "$root/st-$TH_ID-${1:-}" ] || return 0
	_th_cg_remove "$root/st-$TH_ID-$1"
}

th_exec() {
	local name=${1:-}
	_th_ok th_exec || return 1
	[ -n "${_th_kind[$name]:-}" ] || { _th_err th_exec "no host or switch '$name' in run $TH_ID"; return 1; }
	shift
	ST_TEST_HOSTS=$TH_ID ip netns exec "$(_th_nsname "$name")" "$@"
}
th_bg() {
	local name=${1:-} out=${2:-}
	_th_ok th_bg || return 1
	[ -n "${_th_kind[$name]:-}" ] || { _th_err th_bg "no host or switch '$name' in run $TH_ID"; return 1; }
	[ $# -ge 3 ] || { _th_err th_bg "usage: th_bg NAME OUTFILE CMD..."; return 1; }
	shift 2
	ST_TEST_HOSTS=$TH_ID ip netns exec "$(_th_nsname "$name")" "$@" >"$out" 2>&1 </dev/null &
	TH_PID=$!
	_th_pids+=("$TH_PID:$(_th_start "$TH_PID")")
}
th_addr() { _th_is th_addr host "${1:-}" && echo "${_th_addr[$1]}"; }
th_ns() {
	[ -n "${_th_kind[${1:-}]:-}" ] || { _th_err th_ns "no host or switch '${1:-}' in run $TH_ID"; return 1; }
	_th_nsname "$1"
}

th_down() {
	[ -n "$TH_ID" ] || return 0
	local p s i cg ns pids=() left=
	# processes: in our namespaces, with our marker, recorded by th_bg (the same start time)
	for p in $(_th_procs "$TH_ID"); do
		[ "$p" = $$ ] || [ "$p" = "$BASHPID" ] || pids+=("$p")
	done
	for p in "${_th_pids[@]}"; do
		s=$(_th_start "${p%%:*}") && [ "$s" = "${p#*:}" ] && pids+=("${p%%:*}")
	done
	if [ ${#pids[@]} -gt 0 ]; then
		kill -TERM "${pids[@]}" 2>/dev/null
		for i in $(seq 1 40); do
			left=$(_th_running "${pids[@]}")
			[ -z "$left" ] && break
			sleep 0.05
		done
		if [ -n "$left" ]; then
			kill -KILL $left 2>/dev/null
			for i in $(seq 1 20); do
				[ -z "$(_th_running $left)" ] && break
				sleep 0.05
			done
		fi
	fi
	while read -r cg; do _th_cg_remove "$cg"; done < <(_th_cgroups "$TH_ID")
	while read -r ns; do ip netns del "$ns" || _th_err th_down "cannot delete namespace $ns"; done < <(_th_namespaces "$TH_ID")
	_th_kind=() _th_addr=() _th_sw=() _th_port=() _th_trunk=() _th_group=() _th_dropp=() _th_pids=()
	_th_live=0
	return 0
}

th_leftovers() {
	local id=${1:-$TH_ID} ns p
	[ -n "$id" ] || return 0
	_th_namespaces "$id" | sed 's/^/namespace /'
	for ns in "" $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
		ip ${ns:+-n "$ns"} -o link show 2>/dev/null | grep -E "alias st-$id( |\$)" |
			awk -v ns="${ns:-the root namespace}" '{ sub(/:$/, "", $2); sub(/@.*/, "", $2); print "interface " $2 " in " ns }'
	done
	_th_cgroups "$id" | sed 's/^/cgroup /'
	{
		_th_procs "$id" cg
		if [ "$id" = "$TH_ID" ]; then
			for p in "${_th_pids[@]}"; do
				[ "$(_th_start "${p%%:*}")" = "${p#*:}" ] && echo "${p%%:*}"
			done
		fi
	} | sort -un | while read -r p; do
		[ "$p" = $$ ] || [ "$p" = "$BASHPID" ] || ! _th_alive "$p" ||
			echo "process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-80)"
	done
}
