#!/usr/bin/env bash
# The all-reduce target of issue 14 as one command: REPS runs of
# build/bench/collectives against OpenMPI's MPI_Allreduce (bench/mpi_allreduce),
# alternating which side runs first (odd runs: ours first; even runs:
# --mpi-first), then, per size, the median busbw of each side and the median
# of the per-run ratios, every run's ratio in brackets, and whether ours is at
# least OpenMPI's.
#   bench/collectives.sh                       (2 ranks, shared memory, 1M..256M, 3 runs)
#   REPS=5 GAP=10 bench/collectives.sh         (5 runs, 10 s apart)
#   bench/collectives.sh -b 1M -e 16M -i 40    (arguments replace the sizes and counts)
#   bench/collectives.sh --shared -b 1M -e 256M (buffers shared with st_comm_share, as the trainer's gradients)
# Builds what it needs (make bench; OpenMPI from scripts/install-deps.sh
# --bench). The full output of every run is kept in LOG (default a temporary
# file, removed at exit unless LOG is set).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPS=${REPS:-3}
GAP=${GAP:-0}
case "$REPS" in '' | *[!0-9]* | 0) echo "collectives.sh: REPS must be a positive integer, not '$REPS'" >&2; exit 2 ;; esac
case "$GAP" in '' | *[!0-9]*) echo "collectives.sh: GAP must be whole seconds, not '$GAP'" >&2; exit 2 ;; esac
command -v mpirun >/dev/null || { echo "collectives.sh: mpirun not found (bash scripts/install-deps.sh --bench)" >&2; exit 2; }
make -s -j2 BUILD="$BUILD" "$BUILD/bench/collectives" "$BUILD/bench/mpi_allreduce"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 1M -e 256M)
log=${LOG:-$(mktemp /tmp/collectives.XXXXXX)}
[ -n "${LOG:-}" ] || trap 'rm -f "$log"' EXIT
: >"$log"
echo "$(bench/cpu.sh); $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime | sed 's/.*load/load/')"
echo "2 ranks, shared memory, allreduce, $REPS runs alternating the order: ${args[*]}"
for r in $(seq 1 "$REPS"); do
	[ "$r" = 1 ] || sleep "$GAP"
	order=()
	[ $((r % 2)) = 1 ] || order=(--mpi-first)
	echo "# run $r ${order[*]:-(ours first)}" >>"$log"
	"$BUILD/bench/collectives" -n 2 -m shm -c allreduce "${args[@]}" \
		--mpi "$BUILD/bench/mpi_allreduce" "${order[@]}" >>"$log" 2>&1 \
		|| { echo "collectives.sh: run $r failed:" >&2; tail -5 "$log" >&2; exit 1; }
	echo "run $r done ($([ "${#order[@]}" = 0 ] && echo ours first || echo OpenMPI first))"
done
# each run's summary table: "size ours theirs ratio" rows after the header
awk '
/^# run / { run++ }
/^# allreduce busbw, 2 ranks/ { table = 1; next }
table && /^#/ { next }
table && NF == 4 { ours[$1] = ours[$1] " " $2; mpi[$1] = mpi[$1] " " $3; ratio[$1] = ratio[$1] " " $4; if (!($1 in seen)) { seen[$1] = 1; sizes[++n] = $1 } next }
table { table = 0 }
function med(list,    a, k, i, j, t) {
	k = split(list, a, " ")
	for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
END {
	if (n == 0) { print "collectives.sh: no comparison table in any run" > "/dev/stderr"; exit 1 }
	printf "\nmedians of %d runs (busbw GB/s)\n%12s %10s %10s %8s  %s\n", run, "size", "slicetrain", "OpenMPI", "ratio", "per run"
	for (i = 1; i <= n; i++) {
		s = sizes[i]; m = med(ratio[s])
		printf "%12s %10.2f %10.2f %8.2f  [%s ] %s\n", s, med(ours[s]), med(mpi[s]), m, ratio[s], (m >= 1 ? "met" : "NOT met")
	}
}' "$log"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
