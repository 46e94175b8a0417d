# Every example of README.md (the `build/slicetrain ...` commands of its sh
# blocks) and of every command's --help (the `slicetrain ...` lines after
# "example:" / "examples ...:") runs and finishes: README's in order, then
# the help pages' in the order of `slicetrain --help`, all in one scratch
# directory that holds the repository's configs/ and data/ (later examples
# read what earlier ones wrote: checkpoints, hf_model/). Each must exit 0
# (plan: 0, or 1 with "DOES NOT FIT" and the variant that fits) within
# EXAMPLE_LIMIT seconds (300: what "about a minute" must never exceed, on
# one thread per process and a machine loaded by other tests; the README's
# 150,001-step launch used to run for hours). An
# example with ADDR and PATH (nodes) runs against the elastic launch just
# before it, while that launch runs. Each example's seconds are printed.
# timeout: 1200
# builds: optimized
. "$(dirname "$0")/../cli_lib.sh"
for f in train.bin eval.bin tokenizer.json eval.jsonl; do
	[ -s "$ST_ROOT/data/default/$f" ] || skip_dep "the default job's data/default/$f is missing (make data)"
done
limit=${EXAMPLE_LIMIT:-300}
grep -qw avx512f /proc/cpuinfo || limit=$((limit * ${ST_CPU_TIMEOUT_SCALE:-2}))
# one thread per process, as the runner's other tests (the README's times
# are a user's, on all cores: 2 threads fight other tests' for 2 cores)
export OMP_NUM_THREADS=1
work=$TMP/work
mkdir -p "$work/build"
ln -s "$ST_ROOT/configs" "$work/configs"
ln -s "$ST_ROOT/data" "$work/data"
ln -s "$SLICETRAIN" "$work/build/slicetrain"

# the examples, one per line (continuations joined, comments dropped): README's, then the help pages'
/usr/bin/python3 - "$ST_ROOT/README.md" "$SLICETRAIN" >"$TMP/examples" <<'PY' || fail "cannot extract the examples"
import re, shlex, subprocess, sys

def strip_comment(line):
    """The line without a trailing '# ...' outside quotes."""
    q = None
    for i, ch in enumerate(line):
        if q:
            q = None if ch == q else q
        elif ch in "'\"":
            q = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()

def joined(lines):
    """Commands of lines: backslash continuations joined, comment lines skipped."""
    out, cur = [], ""
    for l in lines:
        l = strip_comment(l)
        if not l.strip() and not cur:
            continue
        if l.endswith("\\"):
            cur += l[:-1].strip() + " "
            continue
        out.append((cur + l.strip()).strip())
        cur = ""
    return [c for c in out if c]

readme = open(sys.argv[1]).read()
for block in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M):
    for c in joined(block.splitlines()):
        if c.startswith("build/slicetrain"):
            print("README\t" + c)

exe = sys.argv[2]
usage = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
cmds = []
for l in usage.split("commands:")[1].split("\n\n")[0].splitlines():
    m = re.match(r"  ([a-z]+) ", l)
    if m and m.group(1) not in cmds and m.group(1) not in ("help", "version"):
        cmds.append(m.group(1))
for cmd in cmds:
    page = subprocess.run([exe, cmd, "--help"], capture_output=True, text=True).stdout.splitlines()
    i = 0
    while i < len(page):
        if re.match(r"examples?\b.*:$", page[i]):
            block = []
            i += 1
            while i < len(page) and page[i].startswith("  "):
                block.append(page[i])
                i += 1
            for c in joined(block):
                if re.match(r"(echo .*\| *)?slicetrain ", c):
                    print(f"{cmd} --help\t" + re.sub(r"(^|\| *)slicetrain ", r"\1build/slicetrain ", c))
        else:
            i += 1
PY
n=$(wc -l <"$TMP/examples")
echo "$n examples (README: $(grep -c '^README' "$TMP/examples"), help pages: $(grep -vc '^README' "$TMP/examples"))"
[ "$(grep -c '^README' "$TMP/examples")" -ge 10 ] || fail "fewer than 10 README examples found"
for c in train launch nodes export plan tokenize generate; do
	grep -q "^$c --help" "$TMP/examples" || fail "no example in slicetrain $c --help"
done

# run NAME CMD: CMD in the scratch directory, within the limit; sets rc, secs
run() {
	local t0
	t0=$(date +%s.%N)
	(cd "$work" && timeout -s KILL "$limit" bash -c "$2") >"$TMP/ex.out" 2>&1 </dev/null
	rc=$?
	secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}
# check NAME: the last run's status is right for its command
check() {
	local name=$1 cmd=$2
	if [ "$rc" -eq 137 ]; then
		fail "$name: not finished within $limit s: $cmd"
	elif [[ "$cmd" == build/slicetrain\ plan* ]] && [ "$rc" -eq 1 ] && grep -q 'DOES NOT FIT' "$TMP/ex.out" &&
		grep -q '^fits (' "$TMP/ex.out"; then
		echo "ok   $name: ${secs} s (does not fit, exit 1: $(sed -n 's/^fits (\(.*\)) with: .*/fits (\1) with the variant shown/p' "$TMP/ex.out"))"
	elif status_is "$name" "$rc" 0 "$TMP/ex.out"; then
		echo "ok   $name: ${secs} s: $(echo "$cmd" | cut -c1-110)"
	else
		echo "    $cmd" >&2
	fi
}

mapfile -t examples <"$TMP/examples"
for ((k = 0; k < ${#examples[@]}; k++)); do
	where=${examples[k]%%$'\t'*} cmd=${examples[k]#*$'\t'}
	name="$where example $((k + 1))"
	next=${examples[k + 1]:-}
	next=${next#*$'\t'}
	if [[ "$next" == *ADDR* && "$cmd" == *" launch "* ]]; then
		# this launch in the background; the next example (nodes) against it
		(cd "$work" && exec timeout -s KILL "$limit" bash -c "$cmd") >"$TMP/bg.out" 2>&1 </dev/null &
		bg=$!
		t0=$(date +%s.%N)
		controller_of "$TMP/bg.out" "$TMP/bg.out" "$bg" 600
		ncmd=${next//ADDR/$addr}
		ncmd=${ncmd//PATH/$tokf}
		if [ -z "$addr" ] || [ -z "$tokf" ]; then
			fail "$name: the launch printed no controller address and token file: $(tail -3 "$TMP/bg.out")"
		else
			run "$where example $((k + 2))" "$ncmd"
			check "$where example $((k + 2))" "$ncmd"
			grep -q '^mesh: ' "$TMP/ex.out" || fail "$where example $((k + 2)): no picture of the run: $(cat "$TMP/ex.out")"
		fi
		wait "$bg"
		rc=$?
		secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
		cp "$TMP/bg.out" "$TMP/ex.out"
		check "$name" "$cmd"
		grep -q '"event":"summary"' "$TMP/ex.out" || fail "$name: no summary line"
		k=$((k + 1))
		continue
	fi
	if [[ "$cmd" == *ADDR* ]]; then
		fail "$name: an example with ADDR not after an elastic launch: $cmd"
		continue
	fi
	run "$name" "$cmd"
	check "$name" "$cmd"
done
finish
