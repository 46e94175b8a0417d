# slicetrain export and ckpt list|verify: every bad input exits 2 with one
# clear "slicetrain: error:" line; --help works; a damaged manifest is
# reported by list and fails verify with exit 1.
. "$(dirname "$0")/../cli_lib.sh"

expect_error "export without arguments" "CHECKPOINT_DIR and OUT_DIR" -- export
expect_error "export with one argument" "CHECKPOINT_DIR and OUT_DIR" -- export "$TMP/a"
expect_error "export with three arguments" "unexpected argument" -- export "$TMP/a" "$TMP/b" "$TMP/c"
expect_error "export, unknown option" "unknown option '--fast'" -- export --fast "$TMP/a" "$TMP/b"
expect_error "export, bad shard size" "shard-size 'big'" -- export "$TMP/a" "$TMP/b" --shard-size big
expect_error "export, missing dir" "no-such: no such directory" -- export "$TMP/no-such" "$TMP/out"
mkdir -p "$TMP/empty"
expect_error "export, not a checkpoint" "empty: neither a committed checkpoint" -- export "$TMP/empty" "$TMP/out"
expect_error "ckpt without subcommand" "needs a subcommand" -- ckpt
expect_error "ckpt, unknown subcommand" "unknown ckpt subcommand 'show'" -- ckpt show "$TMP"
expect_error "ckpt list without dir" "exactly one DIR" -- ckpt list
expect_error "ckpt list, missing dir" "no-such: no such directory" -- ckpt list "$TMP/no-such"
expect_error "ckpt verify, missing dir" "no-such: no such directory" -- ckpt verify "$TMP/no-such"
expect_error "ckpt verify, no checkpoint" "no committed checkpoint here" -- ckpt verify "$TMP/empty"
[ -d "$TMP/out" ] && fail "export created its output despite the error"

for cmd in "export --help" "ckpt --help"; do
	$SLICETRAIN $cmd >"$TMP/out.txt" 2>&1 || fail "$cmd: exit $?"
	grep -q "^usage: slicetrain" "$TMP/out.txt" || fail "$cmd: no usage"
done

# an uncommitted step and a committed step with a damaged manifest
mkdir -p "$TMP/run/checkpoints/3" "$TMP/run/checkpoints/7"
echo '{}' >"$TMP/run/checkpoints/3/done-00000.json"
echo '{"format": "slicetrain.checkpoint", "version": 1' >"$TMP/run/checkpoints/7/manifest.json"
$SLICETRAIN ckpt list "$TMP/run" >"$TMP/list.txt" 2>&1 || fail "ckpt list: exit $?"
grep -Eq '^3 +uncommitted' "$TMP/list.txt" || fail "ckpt list: step 3 not uncommitted: $(cat "$TMP/list.txt")"
grep -Eq '^7 +damaged .*bad JSON' "$TMP/list.txt" || fail "ckpt list: step 7 not damaged: $(cat "$TMP/list.txt")"
$SLICETRAIN ckpt verify "$TMP/run/checkpoints/7" >"$TMP/v.txt" 2>&1
status_is "verify of a damaged manifest" $? 1 "$TMP/v.txt"
grep -q "manifest.json: bad JSON" "$TMP/v.txt" || fail "verify: $(cat "$TMP/v.txt")"
finish
