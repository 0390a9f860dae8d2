#!/bin/sh
# Regenerates the face's ABI facts from a system libibverbs.so.1 (docs/verbs-abi.md):
#   rdma-core-<N>.symbols  every exported (name, version) pair, the reference the symbol-set test
#                          and reviewers read;
#   libibverbs.map         the version script: every default (@@) symbol in its node, the nodes
#                          chained as the system library chains them, `local: *`.
# Compat (single @) symbols are not in the map: client/verbs/compat.c binds them with .symver.
# Usage: client/verbs/refresh-abi.sh [path/to/libibverbs.so.1] [rdma-core major version]
set -eu
lib=${1:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
major=${2:-$(dpkg-query -W -f='${Version}' libibverbs1 2>/dev/null | sed 's/\..*//')}
here=$(cd "$(dirname "$0")" && pwd)
symbols=$here/rdma-core-$major.symbols
map=$here/libibverbs.map

defined() { # name@version or name@@version of every symbol the library defines (no node markers)
    readelf --dyn-syms -W "$lib" | awk 'NR > 3 && $7 != "UND" && $7 != "ABS" && $8 ~ /@/ { print $8 }' | sort -u
}
nodes() { # "node parent" (parent "-" for a root node), in definition order, without the BASE entry
    readelf -V -W "$lib" | awk '
        /Version definition section/ { d = 1; next }
        /Version needs section/ { d = 0 }
        d && /Name:/ { if ($0 ~ /Flags: BASE/) { skip = 1; next } skip = 0; if (n != "") print n, p; n = $NF; p = "-" }
        d && /Parent 1:/ && !skip { p = $NF }
        END { if (n != "") print n, p }'
}

{
    echo "# Every symbol Debian's libibverbs.so.1 (rdma-core $major) exports, one name@version a line"
    echo "# (@@: the default version a new link binds; @: a compat version only old binaries bind)."
    echo "# Made by client/verbs/refresh-abi.sh from \`readelf --dyn-syms -W $lib\`;"
    echo "# its version nodes, each inheriting the previous as \`readelf -V\` shows:"
    nodes | while read -r n p; do echo "#   $n${p#-}" | sed "s/$n\(.\)/$n <- \1/"; done
    defined
} >"$symbols"

{
    echo "/* The face's version script, made by client/verbs/refresh-abi.sh from rdma-core $major's"
    echo " * libibverbs.so.1: the same nodes, chained the same way, each default (@@) symbol in its node."
    echo " * Compat (single @) versions are bound in compat.c. Released nodes never change. */"
    # `local: *` sits in the last node without compat symbols: ld applies it to every unversioned
    # name, but to a .symver'd name@NODE only when it is NODE's own pattern, where it would hide
    # the compat alias (rdma-core avoids this by binding every default version with .symver too).
    hide=$(nodes | while read -r n p; do defined | grep -q "[^@]@$n\$" || echo "$n"; done | tail -n 1)
    nodes | while read -r n p; do
        echo "$n {"
        echo "  global:"
        defined | awk -F'@@' -v n="$n" 'NF == 2 && $2 == n { print "    " $1 ";" }'
        if [ "$n" = "$hide" ]; then echo "  local: *;"; fi
        if [ "$p" = "-" ]; then echo "};"; else echo "} $p;"; fi
    done
} >"$map"
echo "wrote $symbols and $map"
