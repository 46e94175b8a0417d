# slicetrain plan's verdict: exit 0 when the run fits; exit 1 when it does
# not, the report printed all the same and ending with a variant that fits
# (the cheapest of remat full, the data axes as fsdp, a smaller per-device
# batch with more accumulation, bf16, more devices), which, planned as
# suggested, does fit; or saying that none of them does. --json carries the
# same suggestion.
# timeout: 60
. "$(dirname "$0")/../cli_lib.sh"
base="$ST_ROOT/configs/base.yml"

# plan_total ARGS...: the planned total bytes of slicetrain plan ARGS --json
plan_total() {
	"$SLICETRAIN" plan "$@" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])'
}
gib() { /usr/bin/python3 -c "print($1 / 2**30)"; }

# check_case NAME WANT_OVERRIDES MEMORY_GIB ARGS...: plan ARGS with --memory
# MEMORY_GIB does not fit (exit 1) and suggests WANT_OVERRIDES (a regex);
# the suggestion, planned, fits (exit 0)
check_case() {
	local name=$1 want=$2 mem=$3; shift 3
	"$SLICETRAIN" plan "$@" --memory "$mem" >"$TMP/plan.out" 2>"$TMP/plan.err"
	status_is "$name" $? 1 "$TMP/plan.err" || return
	grep -q 'DOES NOT FIT' "$TMP/plan.out" || fail "$name: no DOES NOT FIT"
	local line
	line=$(sed -n 's/^fits (.* GiB of .* GiB) with: //p' "$TMP/plan.out")
	echo "$name: $(grep 'total' "$TMP/plan.out" | sed 's/^ *//') -> $line"
	[[ "$line" =~ $want ]] || { fail "$name: suggestion '$line', want /$want/"; return; }
	local extra=() dps=()
	read -r -a extra <<<"${line%% --devices-per-slice*}"
	[[ "$line" == *--devices-per-slice* ]] && dps=(--devices-per-slice "${line##*--devices-per-slice }")
	[[ "$line" == --devices-per-slice* ]] && extra=()
	"$SLICETRAIN" plan "$@" "${extra[@]}" "${dps[@]}" --memory "$mem" >"$TMP/fit.out" 2>"$TMP/fit.err"
	status_is "$name: the suggestion" $? 0 "$TMP/fit.err" && grep -q ': fits$' "$TMP/fit.out" ||
		fail "$name: the suggested run does not fit: $(grep total "$TMP/fit.out")"
	# --json: the same suggestion
	"$SLICETRAIN" plan "$@" --memory "$mem" --json >"$TMP/plan.json" 2>/dev/null
	[ $? -eq 1 ] || fail "$name: --json: exit status, want 1"
	/usr/bin/python3 - "$TMP/plan.json" "$line" <<'PY' || fail "$name: --json suggestion differs: $(cat "$TMP/plan.json")"
import json, sys
p, line = json.load(open(sys.argv[1])), sys.argv[2]
s = p["suggestion"]
assert p["fits"] is False and s["overrides"] == line.split(" --devices-per-slice")[0].strip() or (line.startswith("--devices-per-slice") and s["overrides"] == ""), s
assert s["total_bytes"] <= p["memory_bytes"], s
PY
}

# fits: exit 0, no suggestion
"$SLICETRAIN" plan "$base" model_name=llama3-test --memory 64 >"$TMP/ok.out" 2>"$TMP/ok.err"
status_is "fits" $? 0 "$TMP/ok.err"
grep -q ': fits$' "$TMP/ok.out" && ! grep -q '^fits (' "$TMP/ok.out" || fail "fits: $(cat "$TMP/ok.out")"

# remat: the cheapest change, when it is enough
r=("$base" model_name=llama3-125m per_device_batch_size=8 max_target_length=512)
none=$(plan_total "${r[@]}" remat_policy=none) full=$(plan_total "${r[@]}" remat_policy=full)
mem=$(gib "($none + $full) / 2")
check_case "remat none" "^remat_policy=full$" "$mem" "${r[@]}" remat_policy=none
# a data-parallel mesh whose weights and AdamW state do not fit: fsdp instead (the same 4 devices)
d=("$base" model_name=llama3-125m per_device_batch_size=1 max_target_length=128 ici_data_parallelism=4
	ici_fsdp_parallelism=1 --devices-per-slice 4)
dp=$(plan_total "${d[@]}") fs=$(plan_total "${d[@]/ici_data_parallelism=4/ici_data_parallelism=1}" ici_fsdp_parallelism=4)
check_case "data parallel" "ici_data_parallelism=1 ici_fsdp_parallelism=4 .*dcn_fsdp_parallelism=1" \
	"$(gib "($dp + $fs) / 2")" "${d[@]}"
# a single device whose activations do not fit at any remat: half the batch, twice the accumulation
b=("$base" model_name=llama3-16m per_device_batch_size=16 max_target_length=1024 remat_policy=full)
b16=$(plan_total "${b[@]}") b8=$(plan_total "${b[@]/per_device_batch_size=16/per_device_batch_size=8}" gradient_accumulation_steps=2)
check_case "batch" "^per_device_batch_size=8 gradient_accumulation_steps=2$" "$(gib "($b16 + $b8) / 2")" "${b[@]}"
# nothing fits: said so
"$SLICETRAIN" plan "$base" model_name=llama3-8b --memory 0.01 >"$TMP/none.out" 2>"$TMP/none.err"
status_is "nothing fits" $? 1 "$TMP/none.err"
grep -q '^no variant tried fits: remat_policy=full, the data axes as fsdp, a smaller per_device_batch_size' "$TMP/none.out" ||
	fail "nothing fits: $(tail -2 "$TMP/none.out")"
"$SLICETRAIN" plan "$base" model_name=llama3-8b --memory 0.01 --json 2>/dev/null |
	/usr/bin/python3 -c 'import json,sys; p=json.load(sys.stdin); assert p["fits"] is False and p["suggestion"] is None, p' ||
	fail "nothing fits: --json has a suggestion"
finish
