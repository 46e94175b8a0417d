# slicetrain nodes and the run's token, as a user meets them: without a
# token the refusal names --token-file (exit 1); a token file of another run
# is refused naming the flag and the file (exit 1); a file that grants
# others access, and after the run the launcher's removed file, are errors
# that name --token-file, not SLICETRAIN_TOKEN_FILE (exit 2), while the
# variable, when that is what was given, is named as such; with the file
# the launcher printed it shows the run (exit 0). Bad arguments: one error
# line each, with a did-you-mean for a misspelt option (exit 2).
# timeout: 90
# load: light
. "$(dirname "$0")/../cli_lib.sh"
. "$(dirname "$0")/elastic_lib.sh"

expect_error "no --controller" "nodes needs --controller HOST:PORT" -- nodes
expect_error "misspelt option" "unknown option '--controler'; did you mean '--controller'\?" -- nodes --controler 127.0.0.1:1
expect_error "address without the flag" "'127\.0\.0\.1:1' is not an option of slicetrain nodes.*--controller" -- nodes 127.0.0.1:1
expect_error "--token-file without a value" "--token-file needs a value" -- nodes --controller 127.0.0.1:1 --token-file

el_start run --num-slices 1 --min-slices 1 --devices-per-slice 1 -- "${el_keys[@]}" steps=$el_steps run_name=nodes
controller_of "$TMP/run.err" "$TMP/run.out" "$el_pid" $((300 * el_scale))
[ -n "$addr" ] && [ -n "$tokf" ] || fail "the launcher printed no controller address and token file"

# nodes_run NAME WANT PATTERN ARGS...: slicetrain nodes ARGS (no token in the
# environment unless the caller sets one) exits WANT; its output matches PATTERN
nodes_run() {
	local name=$1 want=$2 pattern=$3; shift 3
	timeout 20 "$SLICETRAIN" nodes "$@" >"$TMP/nodes.out" 2>&1
	local rc=$?
	if status_is "$name" $rc "$want" "$TMP/nodes.out"; then
		if grep -qE -- "$pattern" "$TMP/nodes.out"; then
			echo "ok   $name: $(grep -E -- "$pattern" "$TMP/nodes.out" | head -1)"
		else
			fail "$name: no /$pattern/ in: $(cat "$TMP/nodes.out")"
		fi
	fi
}
unset SLICETRAIN_TOKEN_FILE SLICETRAIN_TOKEN
if [ -n "$addr" ]; then
	nodes_run "without a token" 1 \
		"^slicetrain: error: .*refused this process's proof of the run token.*this process has no token: give the run's with --token-file PATH" \
		--controller "$addr"
	head -c 48 /dev/urandom | base64 >"$TMP/other.token"
	chmod 600 "$TMP/other.token"
	nodes_run "another run's token file" 1 \
		"^slicetrain: error: .*refused.*the token of --token-file $TMP/other\.token is not this run's" \
		--controller "$addr" --token-file "$TMP/other.token"
	cp "$TMP/other.token" "$TMP/open.token" && chmod 644 "$TMP/open.token"
	nodes_run "a token file others can read" 2 \
		"^slicetrain: error: --token-file $TMP/open\.token: the token file has mode 0644" \
		--controller "$addr" --token-file "$TMP/open.token"
	SLICETRAIN_TOKEN_FILE=$TMP/other.token nodes_run "another run's token in the environment" 1 \
		"the token of SLICETRAIN_TOKEN_FILE is not this run's: give the run's with --token-file PATH" --controller "$addr"
	nodes_run "the launcher's token file" 0 "^state RUNNING" --controller "$addr" --token-file "$tokf"
	nodes_run "the launcher's token file, --flag=value" 0 "^mesh: 1 slice" --controller="$addr" --token-file="$tokf"
fi
el_wait run 90
status_is "the elastic run" "$el_rc" 0 "$TMP/run.err"
# after the run: the launcher removed its file; the error names the flag
if [ -n "$tokf" ]; then
	nodes_run "after the run" 2 \
		"^slicetrain: error: --token-file $tokf: cannot open the token file: No such file or directory \(the token file slicetrain launch makes is removed when its run ends\)" \
		--controller "$addr" --token-file "$tokf"
	grep -q SLICETRAIN_TOKEN_FILE "$TMP/nodes.out" && fail "after the run: the error names the variable: $(cat "$TMP/nodes.out")"
	SLICETRAIN_TOKEN_FILE=$tokf nodes_run "after the run, the variable" 2 \
		"^slicetrain: error: SLICETRAIN_TOKEN_FILE=$tokf: cannot open the token file" --controller "$addr"
fi
finish
