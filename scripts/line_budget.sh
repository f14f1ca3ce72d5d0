#!/usr/bin/env bash
# Counts the lines of weft's library code (every .h, .cpp, .cu and .cuh outside apps/ and
# tests/) and fails when they exceed the budget: the library is meant to stay small enough to
# read. Raise the budget only with a reason in the commit. Usage: line_budget.sh [SOURCE_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
budget=27643
lines=$(find core kernels autograd nn dist fsdp weft.h -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) \
          -print0 | xargs -0 cat | wc -l)
echo "line budget: ${lines} of ${budget} lines of library code (core kernels autograd nn dist fsdp)"
[ "$lines" -le "$budget" ] || { echo "line budget exceeded by $((lines - budget)) lines"; exit 1; }
