# A mistyped command line gets one error line that says what was probably
# meant, never a page of help: every subcommand that takes options offers
# the nearest option for a misspelt one (as config keys get the nearest
# key), a launch without its "--" says where the config part goes, a
# config key written as an option ("--steps=5") is shown as key=value, and
# a mistyped command gets the nearest command. Nothing starts: exit 2.
# timeout: 30
. "$(dirname "$0")/../cli_lib.sh"
base="$ST_ROOT/configs/base.yml"
m=model_name=llama3-test
mean() { echo "unknown option '$1'; did you mean '$2'\? \(see slicetrain $3 --help\)"; }

# did you mean, in every command that parses options
expect_error "launch --num-slice" "$(mean --num-slice --num-slices launch)" -- launch --num-slice 2 --devices-per-slice 1 -- "$base" $m
expect_error "launch --devices-per-slices" "$(mean --devices-per-slices --devices-per-slice launch)" -- launch --num-slices 1 --devices-per-slices 1 --
expect_error "launch --premept" "$(mean --premept --preempt launch)" -- launch --num-slices 2 --premept 1@5 --devices-per-slice 1 --
expect_error "launch --min-slice=1" "$(mean --min-slice=1 --min-slices launch)" -- launch --num-slices 2 --min-slice=1 --devices-per-slice 1 --
expect_error "plan --num-slice" "$(mean --num-slice --num-slices plan)" -- plan "$base" $m --num-slice 2
expect_error "plan --jsn" "$(mean --jsn --json plan)" -- plan "$base" $m --jsn
expect_error "export --shard-sise" "unknown option '--shard-sise'; did you mean '--shard-size'\?" -- export --shard-sise 5GB "$TMP/a" "$TMP/b"
expect_error "generate --temprature" "unknown option '--temprature'; did you mean '--temperature'\?" -- generate "$TMP" --temprature 1
expect_error "generate --max-token" "unknown option '--max-token'; did you mean '--max-tokens'\?" -- generate "$TMP" --max-token 5
expect_error "tokenize --ouput" "unknown option '--ouput'; did you mean '--output'\?" -- tokenize --ouput x.bin "$TMP/in.txt"
expect_error "tokenize --text-feild" "unknown option '--text-feild'; did you mean '--text-field'\?" -- tokenize -o x.bin --text-feild t "$TMP/in.txt"
expect_error "nodes --token_file" "$(mean --token_file --token-file nodes)" -- nodes --controller 127.0.0.1:1 --token_file x
expect_error "agent --slices" "$(mean --slices --slice agent)" -- agent --controller 127.0.0.1:1 --slices 0
# nothing near: no suggestion, the same one line
expect_error "launch --frobnicate" "^slicetrain: error: unknown option '--frobnicate' \(see slicetrain launch --help\)$" -- launch --frobnicate --
expect_error "plan --frobnicate" "^slicetrain: error: unknown option '--frobnicate' \(see slicetrain plan --help\)$" -- plan "$base" $m --frobnicate

# launch without "--": where the config part goes, in one line (no help page)
for args in "$base $m steps=2" "$m steps=2"; do
	# shellcheck disable=SC2086
	expect_error "launch without --: $args" \
		"is not an option of slicetrain launch: the workers' CONFIG.yml and key=value overrides come after '--'" -- \
		launch --num-slices 1 --devices-per-slice 1 $args
	[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "launch without --: $(wc -l <"$TMP/err") lines on stderr, want 1"
done
expect_error "launch without sizes" "launch needs --num-slices S and --devices-per-slice D" -- launch -- "$base" $m
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "launch without sizes: $(wc -l <"$TMP/err") lines on stderr, want 1"

# a config key written as an option
expect_error "train --steps=5" "'--steps=5' is neither a CONFIG\.yml nor a key=value override; did you mean 'steps=5'\?" -- train "$base" $m --steps=5
expect_error "train --steps=5 first" "did you mean 'steps=5'\?" -- train --steps=5
expect_error "train --num-slices" "'--num-slices' is neither a CONFIG\.yml nor a key=value override \(the config part takes no options" -- train "$base" --num-slices 2
expect_error "launch ... -- --steps=5" "did you mean 'steps=5'\?" -- launch --num-slices 1 --devices-per-slice 1 -- "$base" $m --steps=5

# commands
expect_error "lauch" "^slicetrain: error: unknown command 'lauch'; did you mean 'launch'\? \(see slicetrain --help\)$" -- lauch
expect_error "generat" "did you mean 'generate'\?" -- generat
expect_error "frobnicate" "^slicetrain: error: unknown command 'frobnicate' \(see slicetrain --help\)$" -- frobnicate
finish
