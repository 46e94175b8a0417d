# The default job before `make data` (a fresh clone): `slicetrain train`
# with no arguments, `slicetrain launch ... --` with the default job (static
# and elastic, as `make run` starts it) each exit 2 with one error line that
# names the missing file and the command that makes it (`make data`), and
# nothing is written in the clone (no slicetrain_output/, no checkpoints
# directory). Started outside the repository, the line says to run it from
# there. Data other than the default job's (a missing grain_eval_files)
# gets no such hint, and is also found missing before anything is written.
# timeout: 60
. "$(dirname "$0")/../cli_lib.sh"

# a copy of the repository's tracked files (what a clone holds: no data/, no build/)
clone=$TMP/clone
mkdir -p "$clone"
if ! git -C "$ST_ROOT" ls-files -z 2>/dev/null | (cd "$ST_ROOT" && tar --null -T - -cf -) | tar -C "$clone" -xf - 2>/dev/null ||
	[ ! -f "$clone/Makefile" ]; then
	cp -r "$ST_ROOT/configs" "$ST_ROOT/scripts" "$ST_ROOT/Makefile" "$clone"/ || fail "cannot copy the repository"
fi
[ -e "$clone/data" ] && fail "the copy has a data/ directory"
(cd "$clone" && find . | sort) >"$TMP/before"

# expect_no_data NAME PATTERN ARGS...: in the clone, slicetrain ARGS exits 2
# with one error line matching PATTERN, and the clone is unchanged
expect_no_data() {
	local name=$1 pattern=$2; shift 2
	cd "$clone" && expect_error "$name" "$pattern" -- "$@"
	cd "$TMP" || exit 1
	(cd "$clone" && find . | sort) >"$TMP/after"
	diff "$TMP/before" "$TMP/after" >"$TMP/diff" || fail "$name: wrote into the clone: $(grep '^>' "$TMP/diff" | head -5)"
}
hint="dataset_path 'data/default/train\.bin' matches no file: the default job's data is not made yet: run \`make data\` here first"
export OMP_NUM_THREADS=1
expect_no_data "train, no arguments" "$hint" train
expect_no_data "train, default job with overrides" "$hint" train steps=3
expect_no_data "launch, static" "$hint" launch --num-slices 1 --devices-per-slice 2 --
expect_no_data "launch, elastic (make run's)" "$hint" launch --num-slices 2 --min-slices 1 --devices-per-slice 1 \
	--preempt 1@30:5 --

# outside the repository: run it from there
mkdir "$TMP/elsewhere"
cd "$TMP/elsewhere" && expect_error "train elsewhere" \
	"matches no file: the default job's data is not made yet: run \`make data\` in the slicetrain repository, and start the job from there" \
	-- train
[ -z "$(ls -A "$TMP/elsewhere")" ] || fail "train elsewhere: wrote $(ls -A "$TMP/elsewhere")"

# other data: the key at fault, no make hint, nothing written
mkdir "$TMP/other"
/usr/bin/python3 - "$TMP/other/train.bin" <<'PY'
import struct, sys
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = 20240520, 1, 4000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr)); f.write(struct.pack("<4000H", *[i % 200 for i in range(4000)]))
PY
cd "$TMP/other" && expect_error "eval files missing" "^slicetrain: error: grain_eval_files '.*none\.bin' matches no file$" -- \
	train "$ST_ROOT/configs/base.yml" model_name=llama3-test steps=2 per_device_batch_size=2 max_target_length=16 \
	dataset_type=tokens dataset_path="$TMP/other/train.bin" grain_eval_files="$TMP/other/none.bin" eval_interval=1
[ "$(ls -A "$TMP/other")" = train.bin ] || fail "eval files missing: wrote $(ls -A "$TMP/other")"
finish
