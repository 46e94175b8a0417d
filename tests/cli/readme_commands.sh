# README.md lists every subcommand: the commands of its "## Commands"
# table are those `slicetrain --help` lists (without help and version), and
# each of them has a help page of its own.
# timeout: 30
. "$(dirname "$0")/../cli_lib.sh"
"$SLICETRAIN" --help >"$TMP/usage" || fail "slicetrain --help: exit $?"
sed -n '/^commands:/,/^$/p' "$TMP/usage" | sed -n 's/^  \([a-z][a-z]*\) .*/\1/p; s/^  \([a-z][a-z]*\)$/\1/p' |
	grep -vxE 'help|version' | sort -u >"$TMP/help.cmds"
sed -n '/^## Commands/,/^## /p' "$ST_ROOT/README.md" | sed -n 's/^| `\([a-z][a-z]*\)` |.*/\1/p' | sort >"$TMP/readme.cmds"
echo "slicetrain --help: $(tr '\n' ' ' <"$TMP/help.cmds")"
echo "README.md:         $(tr '\n' ' ' <"$TMP/readme.cmds")"
[ "$(wc -l <"$TMP/help.cmds")" -ge 9 ] || fail "slicetrain --help lists $(wc -l <"$TMP/help.cmds") commands, want at least 9"
[ -z "$(uniq -d "$TMP/readme.cmds")" ] || fail "README lists twice: $(uniq -d "$TMP/readme.cmds")"
diff "$TMP/help.cmds" <(sort -u "$TMP/readme.cmds") >"$TMP/diff" ||
	fail "README's commands differ from slicetrain --help's (< help only, > README only): $(grep '^[<>]' "$TMP/diff" | tr '\n' ' ')"
while read -r c; do
	"$SLICETRAIN" "$c" --help | head -1 | grep -q "^usage: slicetrain $c" || fail "$c --help: not $c's usage"
done <"$TMP/help.cmds"
finish
