# 2 slices x 2 hosts x 1 device on test hosts (tests/hosts_lib.sh), the
# trunk between the slices' switches shaped to 1 Gbit/s (the slower
# network between slices), FSDP inside a slice (ici_fsdp 2: the two hosts
# of a slice exchange shards over TCP), data parallelism across slices: 60
# steps with `slicetrain controller` and 4 agents; the final weights are
# bit-identical to the same run with `slicetrain launch` on one machine (2
# slices x 2 devices), the coordinator is on slice 0 host 0, and nothing is
# left behind. make test-hosts.
# builds: first
# timeout: 300
. "$(dirname "$0")/../cli_lib.sh"
. "$ST_ROOT/tests/hosts_lib.sh"
. "$ST_ROOT/tests/hosts_run_lib.sh"
steps=60
keys=("$ST_ROOT/configs/base.yml" model_name=llama3-test per_device_batch_size=4 max_target_length=128
	checkpoint_period=20 ici_fsdp_parallelism=2 dcn_data_parallelism=2 learning_rate=1e-3
	base_output_directory="$TMP/o" steps=$steps)

hr_reference 2 "${keys[@]}"

hr_up 2 2 1gbit || { fail "cannot make the test hosts"; finish; }
hr_controller run --num-slices 2 --devices-per-slice 2 --hosts-per-slice 2 -- "${keys[@]}" run_name=hosts
for s in 0 1; do for h in 0 1; do hr_agent $s $h; done; done
hr_wait run 240
status_is "2x2 hosts run" "$hr_rc" 0 "$TMP/run.out"
grep -E 'generation|State Transition' "$TMP/run.out" | sed 's/^/    /'
grep -qE 'coordinator 10\.213\.1\.10:' "$TMP/run.out" || fail "the coordinator is not on slice 0 host 0"
echo "step times (s), launch on one machine vs 2x2 hosts:" \
	"$(grep -o 'seconds: [0-9.]*' "$TMP/ref.out" | tail -20 | awk '{s+=$2} END {printf "%.4f", s/NR}')" \
	"$(grep -o 'seconds: [0-9.]*' "$TMP/run.out" | tail -20 | awk '{s+=$2} END {printf "%.4f", s/NR}')"
hr_same_weights hosts $steps
hr_clean
finish
