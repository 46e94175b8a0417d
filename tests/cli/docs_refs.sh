# The docs stay references (issue 46): (a) every .c and .h under src/ is
# named in docs/architecture.md by its path below src/ (base/pages.c,
# kernels/cpu/amx.c); (b) no tracked file carries a numbered work-period
# label (the project names a date or a commit instead); (c) every docs/*.md
# is at most 420 lines and bench/README.md at most 320 (split a longer page
# by topic); (d) every docs/*.md opens, under its title, with a paragraph of
# text that says what it is for, not a table, a list or code. Each failure
# names the file (and line) at fault. The file list comes from git when the
# tree is a git checkout, else from the files on disk. It does not use the
# build under test: tests/run.sh runs it on the first build only.
# timeout: 60
# builds: first
. "$(dirname "$0")/../cli_lib.sh"
cd "$ST_ROOT" || exit 1

# tracked files (NUL-separated), or every file outside .git and build trees
list_files() {
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -z -- "$@"
	else
		local d
		for d in "${@:-.}"; do
			find "$d" -path '*/.git' -prune -o -path './build*' -prune -o -path './.venv*' -prune \
				-o -type f -print0
		done
	fi
}

# (a) every source file under src/ named in docs/architecture.md
arch=docs/architecture.md
if [ ! -f "$arch" ]; then
	fail "$arch is missing"
else
	n=0 missing=0
	while IFS= read -r -d '' f; do
		case "$f" in *.c | *.h) ;; *) continue ;; esac
		n=$((n + 1))
		rel=${f#./}
		rel=${rel#src/}
		if ! grep -qF -- "$rel" "$arch"; then
			fail "$arch does not name $rel (src/$rel)"
			missing=$((missing + 1))
		fi
	done < <(list_files src)
	[ "$n" -gt 0 ] || fail "no .c or .h file found under src/"
	[ "$missing" -eq 0 ] && echo "ok   (a) $arch names all $n .c and .h files under src/"
fi

# (b) no numbered work-period label in any tracked file; the pattern is
# built from pieces so that this file does not match it
word="sess""ion"
label="\\b${word}s?[- ]?[0-9]+"
hits=0
while IFS= read -r line; do
	f=${line%%:*} rest=${line#*:}
	fail "work-period label in $f:${rest%%:*}: $(printf '%s' "${rest#*:}" | cut -c1-120)"
	hits=$((hits + 1))
done < <(list_files | xargs -0 -r grep -I -H -n -i -E -- "$label" 2>/dev/null)
[ "$hits" -eq 0 ] && echo "ok   (b) no numbered work-period label in the tracked files"

# (c) page lengths
check_len() { # FILE MAX
	local lines
	lines=$(wc -l <"$1")
	if [ "$lines" -gt "$2" ]; then
		fail "$1 has $lines lines, more than $2: split it by topic"
	fi
}
f0=$failures ndocs=0
for f in docs/*.md; do
	[ -f "$f" ] || continue
	ndocs=$((ndocs + 1))
	check_len "$f" 420
done
[ "$ndocs" -gt 0 ] || fail "no docs/*.md found"
if [ -f bench/README.md ]; then check_len bench/README.md 320; else fail "bench/README.md is missing"; fi
[ "$failures" -eq "$f0" ] && echo "ok   (c) $ndocs docs/*.md within 420 lines, bench/README.md within 320"

# (d) each docs page opens with text: the first line that is neither blank
# nor a heading must not start a table, a code block, a list or a quote
f0=$failures
for f in docs/*.md; do
	[ -f "$f" ] || continue
	first=$(awk 'NF && !/^#/ { printf "%d:%s", NR, $0; exit }' "$f")
	if [ -z "$first" ]; then
		fail "$f has no text under its title"
		continue
	fi
	no=${first%%:*} text=${first#*:}
	case "$text" in
	'|'* | '```'* | '~~~'* | '    '* | $'\t'* | '- '* | '* '* | '+ '* | '>'* | [0-9]'. '* | '<'*)
		fail "$f:$no opens with a table, code, a list or markup, not with what the page is for: $(printf '%s' "$text" | cut -c1-80)"
		;;
	esac
done
[ "$failures" -eq "$f0" ] && echo "ok   (d) the $ndocs docs/*.md pages open with text"
finish
