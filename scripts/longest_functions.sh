#!/usr/bin/env bash
# Lists the functions longer than the limits and fails if there is any: a function a reader must
# scroll through is split. Limits: 80 lines in apps/, 100 in the libraries (core kernels autograd
# nn dist tp fsdp), counted from the line that names the function to its closing brace (ctags);
# lambdas count as part of the function around them. Usage: longest_functions.sh [--all]
# (--all: every function over 40 lines, longest first, without failing).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v ctags >/dev/null || { echo "longest_functions.sh: ctags is missing (apt-get install universal-ctags)"; exit 1; }
all=0
[ "${1:-}" = --all ] && all=1
list() {  # DIR...: "LINES FILE:FUNCTION LINE" for every function in DIR
  find "$@" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
    xargs -0 ctags --languages=C++ --map-C++=+.cu --map-C++=+.cuh --kinds-C++=f --fields=+ne -o - 2>/dev/null |
    awk -F'\t' '$1 !~ /^__anon/ {
      line = 0; end = 0
      for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) line = substr($i, 6); if ($i ~ /^end:/) end = substr($i, 5) }
      if (end > 0) print end - line + 1, $2 ":" $1, line }'
}
over=0
check() {  # LIMIT DIR...
  local limit=$1; shift
  while read -r n where line; do
    [ "$all" = 1 ] && { [ "$n" -gt 40 ] && echo "$n $where:$line"; continue; }
    [ "$n" -le "$limit" ] && continue
    echo "longest_functions: $where (line $line) is $n lines, over the limit of $limit"
    over=$((over + 1))
  done < <(list "$@" | sort -rn)
}
check 80 apps
check 100 core kernels autograd nn dist tp fsdp
[ "$all" = 1 ] && exit 0
[ "$over" -eq 0 ] || { echo "longest_functions: $over function(s) over the limits"; exit 1; }
echo "longest_functions: no function over 80 lines in apps/, none over 100 in the libraries"
