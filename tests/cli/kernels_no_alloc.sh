# The kernels take all their memory from their caller (issue 46, item 3):
# no file under src/kernels/ but the workspace code (src/kernels/cpu/
# workspace.c: st_ws_init, st_kctx_init) calls an allocator (malloc,
# calloc, realloc, aligned_alloc, posix_memalign, memalign, valloc,
# strdup, strndup, mmap, st_pages_alloc). Scratch comes in an st_ws
# (workspace.h), what products keep between calls in an st_kctx (kctx.h).
# A call is a name followed by "(" (comments that name an allocator
# without a parenthesis pass). Fails naming each file and line. First
# checks that the pattern finds the calls in workspace.c and in a sample
# file, so that a broken pattern cannot pass by finding nothing.
# timeout: 30
# builds: first
. "$(dirname "$0")/../cli_lib.sh"
cd "$ST_ROOT" || exit 1
re='(^|[^A-Za-z0-9_])(malloc|calloc|realloc|aligned_alloc|posix_memalign|memalign|valloc|strdup|strndup|mmap|st_pages_alloc)[[:space:]]*\('
allowed=src/kernels/cpu/workspace.c

# the pattern itself: it finds what it must, and not what it must not
printf 'p = malloc(n);\nq = realloc (p, m);\nif (!(r = st_pages_alloc(n)))\n' >"$TMP/sample.c"
printf '/* grown with realloc */\nmy_malloc(n);\nst_ws_init(&ws, n, 1);\n' >>"$TMP/sample.c"
hits=$(grep -cE "$re" "$TMP/sample.c")
[ "$hits" -eq 3 ] || fail "the pattern finds $hits of the sample's 3 allocator calls: $(grep -nE "$re" "$TMP/sample.c" | tr '\n' ' ')"
grep -qE "$re" "$allowed" || fail "the pattern finds no allocator call in $allowed: is the pattern broken?"

nfiles=$(find src/kernels -type f \( -name '*.c' -o -name '*.h' \) | wc -l)
[ "$nfiles" -ge 10 ] || fail "only $nfiles files under src/kernels"
found=$(find src/kernels -type f \( -name '*.c' -o -name '*.h' \) ! -path "$allowed" -print0 | sort -z |
	xargs -0 grep -nHE "$re")
if [ -n "$found" ]; then
	while IFS= read -r line; do
		fail "${line%%:*}, line $(echo "$line" | cut -d: -f2): an allocation outside $allowed: $(echo "$line" | cut -d: -f3- | sed 's/^[[:space:]]*//')"
	done <<<"$found"
	echo "kernels take their memory from their caller: scratch in an st_ws (workspace.h), what products keep between calls in an st_kctx (kctx.h)"
else
	echo "$nfiles files under src/kernels: no allocator call outside $allowed"
fi
finish
