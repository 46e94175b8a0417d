# Every bad input ends with exit status 2 and one clear "slicetrain: error:"
# line naming the problem, and nothing is trained.
. "$(dirname "$0")/../cli_lib.sh"
PY=/usr/bin/python3
base="$ST_ROOT/configs/base.yml"
ok=(model_name=llama3-test steps=2 per_device_batch_size=2 max_target_length=16 base_output_directory="$TMP/o" run_name=t)

# config files
expect_error "missing config" "no-such\.yml" -- train "$TMP/no-such.yml"
mkdir "$TMP/unreadable.yml"
expect_error "unreadable config" "unreadable\.yml" -- train "$TMP/unreadable.yml"
printf 'steps: 10\nlearning_rate: [1, 2\n' >"$TMP/bad.yml"
expect_error "malformed YAML" "bad\.yml:[0-9]+" -- train "$TMP/bad.yml"
printf 'steps: 10\nsteps: 20\n' >"$TMP/dup.yml"
expect_error "duplicate key" "dup\.yml:2.*steps" -- train "$TMP/dup.yml"
printf 'steps: abc\n' >"$TMP/type.yml"
expect_error "wrong type in YAML" "type\.yml:1.*steps" -- train "$TMP/type.yml"

# command line
expect_error "unknown key" "lerning_rate.*learning_rate" -- train "$base" "${ok[@]}" lerning_rate=1e-3
expect_error "wrong type" "steps.*abc" -- train "$base" "${ok[@]}" steps=abc
expect_error "fractional int" "steps" -- train "$base" "${ok[@]}" steps=1.5
expect_error "zero steps" "steps" -- train "$base" "${ok[@]}" steps=0
expect_error "negative batch" "per_device_batch_size" -- train "$base" "${ok[@]}" per_device_batch_size=-1
expect_error "zero length" "max_target_length" -- train "$base" "${ok[@]}" max_target_length=0
expect_error "negative emb" "base_emb_dim" -- train "$base" "${ok[@]}" override_model_config=true base_emb_dim=-64
expect_error "heads not dividing emb" "base_num_query_heads|heads" -- train "$base" "${ok[@]}" override_model_config=true base_num_query_heads=3
expect_error "kv heads not dividing heads" "kv" -- train "$base" "${ok[@]}" override_model_config=true base_num_kv_heads=3
expect_error "model key without override" "override_model_config" -- train "$base" "${ok[@]}" base_emb_dim=128
expect_error "unsupported remat" "remat_policy.*full" -- train "$base" "${ok[@]}" remat_policy=offload_everything
expect_error "unsupported dataset" "dataset_type.*synthetic" -- train "$base" "${ok[@]}" dataset_type=tfds
expect_error "unknown model" "llama9" -- train "$base" "${ok[@]}" model_name=llama9
expect_error "not a key=value" "nonsense" -- train "$base" nonsense

# token files
expect_error "token file missing" "none\.bin" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/none.bin"
expect_error "tokens without path" "dataset_path" -- train "$base" "${ok[@]}" dataset_type=tokens
head -c 4096 /dev/urandom >"$TMP/garbage.bin"
expect_error "bad magic" "garbage\.bin.*magic" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/garbage.bin"
$PY - "$TMP" <<'PY'
import struct, sys
d = sys.argv[1]
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, 1000
with open(d + "/short.bin", "wb") as f:     # header promises 1000 tokens, holds 10
    f.write(struct.pack("<256i", *hdr)); f.write(struct.pack("<10H", *range(10)))
hdr[2] = 100
with open(d + "/big.bin", "wb") as f:       # token id 300 >= vocab 256
    f.write(struct.pack("<256i", *hdr)); f.write(struct.pack("<100H", *([5] * 99 + [300])))
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (100,), }"
h += " " * (63 - (10 + len(h)) % 64) + "\n"
with open(d + "/big.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<100i", *([1] * 50 + [256] + [1] * 49)))
with open(d + "/trunc.npy", "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
    f.write(struct.pack("<10i", *range(10)))
PY
expect_error "truncated .bin" "short\.bin.*(truncat|size|expect)" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/short.bin"
expect_error "truncated .npy" "trunc\.npy" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/trunc.npy"
expect_error "token id >= vocab (.bin)" "big\.bin.*300.*256" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/big.bin"
expect_error "token id >= vocab (.npy)" "big\.npy.*256" -- train "$base" "${ok[@]}" dataset_type=tokens dataset_path="$TMP/big.npy"

# bad subcommands
"$SLICETRAIN" frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command must exit 2"
"$SLICETRAIN" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command must exit 2"
"$SLICETRAIN" --help | grep -q 'usage: slicetrain' || fail "--help prints usage"
for c in train launch export ckpt plan; do # every command's own page, both ways
	"$SLICETRAIN" help $c | head -1 | grep -q "^usage: slicetrain $c" || fail "help $c: not $c's usage"
	"$SLICETRAIN" $c --help | head -1 | grep -q "^usage: slicetrain $c" || fail "$c --help: not $c's usage"
done
finish
