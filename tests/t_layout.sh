#!/usr/bin/env bash
# The tree's layering (README, "Layout"): every #include "../FOLDER/..." in src/X/ names a folder that the
# README's table lets X include, and the table lists every folder. So dependencies point one way and no two
# folders include each other; a change that breaks the rule fails here, naming the file and the include.
# Each folder's own header comment says the same (checked last).
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
declare -A allow
while IFS='|' read -r _ folder _ deps _; do
    f=$(echo "$folder" | sed -n 's/.*`src\/\([a-z_]*\)\/`.*/\1/p')
    [ -n "$f" ] && allow[$f]=$(echo "$deps" | tr -d ' ')
done < <(grep '^| `src/' README.md)
for d in src/*/; do
    f=$(basename "$d")
    check "README's layout table lists src/$f/" test -n "${allow[$f]+x}"
done
bad=0
for d in src/*/; do
    f=$(basename "$d")
    [ "${allow[$f]:-}" = any ] && continue
    while IFS=: read -r file _ inc; do
        dep=$(echo "$inc" | sed -n 's/.*"\.\.\/\([a-z_]*\)\/.*/\1/p')
        [ -z "$dep" ] && continue
        case ",${allow[$f]:-}," in *",$dep,"*) ;; *) echo "  $file includes ../$dep/, which src/$f/ may not"; bad=$((bad + 1)) ;; esac
    done < <(grep -n '#include "\.\./' "$d"*.[ch] 2>/dev/null)
done
check "every include points down the layers ($bad against the table)" test $bad = 0
# And the table itself has no cycle: A may include B and B A.
cyc=0
for a in "${!allow[@]}"; do
    for b in $(echo "${allow[$a]}" | tr ',' ' '); do
        case ",${allow[$b]:-}," in *",$a,"*) echo "  $a and $b may include each other"; cyc=$((cyc + 1)) ;; esac
    done
done
check "no two folders may include each other" test $cyc = 0
# Each folder says the same of itself in one header's opening comment ("Folder src/X/: ... May include: ...").
for d in src/*/; do
    f=$(basename "$d")
    said=$(cat "$d"*.h 2>/dev/null | tr '\n' ' ' | sed 's/ \* / /g; s/  */ /g' |
           sed -n "s|.*Folder src/$f/: .*May include: \([^.]*\)\..*|\1|p" | head -1 | tr -d ' ')
    case $said in nothing*) said=- ;; anyfolder) said=any ;; esac
    check "src/$f/ says in a header what it may include, as README does ($said)" test "$said" = "${allow[$f]:-?}"
done
finish
