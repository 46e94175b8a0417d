# slicetrain plan's command line: every bad input exits 2 with one clear
# "slicetrain: error:" line; --help, --json and the options work.
. "$(dirname "$0")/../cli_lib.sh"
base="$ST_ROOT/configs/base.yml"
m=model_name=llama3-test

expect_error "no CONFIG.yml" "plan needs a CONFIG.yml" -- plan "$m"
expect_error "zero slices" "--num-slices needs a whole number >= 1, got '0'" -- plan "$base" "$m" --num-slices 0
expect_error "slices without value" "--devices-per-slice needs a whole number >= 1, got ''" -- plan "$base" "$m" --devices-per-slice
expect_error "slices overflow" "--num-slices is at most 1048576, got '99999999999999999999'" -- plan "$base" "$m" --num-slices 99999999999999999999
expect_error "devices too many" "--devices-per-slice is at most 1048576, got '2000000'" -- plan "$base" "$m" --devices-per-slice 2000000
expect_error "memory not a number" "--memory needs a size in GiB > 0, got 'lots'" -- plan "$base" "$m" --memory lots
expect_error "unknown option" "unknown option '--frobnicate' \(see slicetrain plan --help\)" -- plan "$base" "$m" --frobnicate
expect_error "config errors come through" "model_nmae" -- plan "$base" model_nmae=llama3-test
expect_error "stray argument" "'stray' is neither a CONFIG.yml nor a key=value override" -- plan "$base" "$m" stray
expect_error "mesh does not resolve" "tensor parallelism" -- plan "$base" model_name=llama3-8b ici_tensor_parallelism=3 ici_fsdp_parallelism=1 --devices-per-slice 3

"$SLICETRAIN" plan "$base" "$m" --num-slices 1 --memory 0.5 --json >"$TMP/plan.json" 2>"$TMP/err" ||
	fail "--json: exit $?: $(cat "$TMP/err")"
/usr/bin/python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p["memory_bytes"] == 0.5 * 2**30 and p["devices"] == 1, p' "$TMP/plan.json" ||
	fail "--json: $(cat "$TMP/plan.json")"
for h in --help -h; do
	"$SLICETRAIN" plan $h >"$TMP/out.txt" 2>&1 || fail "plan $h: exit $?"
	grep -q "^usage: slicetrain plan" "$TMP/out.txt" || fail "plan $h: no usage"
done
finish
