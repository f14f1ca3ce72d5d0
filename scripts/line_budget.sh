#!/usr/bin/env bash
# weft's line budget: the lines of code (.h .cpp .cu .cuh) of each layer, against that layer's
# budget; fails when any layer is over. The budget is a decision, not a counter: a change that
# needs more lines first looks for lines to delete, and a raise is a commit of its own that names
# the feature paying for it (docs/ARCHITECTURE.md, "Line budget"). tests/ is not counted.
# Usage: line_budget.sh [SOURCE_ROOT]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
# layer | budget | the files and folders counted (kernels: the entry points and the meta device)
budgets=(
  "core           4431  core weft.h"
  "kernels        2654  kernels/*.h kernels/*.cpp kernels/meta"
  "kernels/cpu    5938  kernels/cpu"
  "cuda           4662  cuda"
  "autograd       2153  autograd"
  "nn             3332  nn"
  "dist           2598  dist"
  "tp              883  tp"
  "fsdp           5290  fsdp"
  "apps          12095  apps"
)
count() {  # PATH...: the lines of the code files among them
  find "$@" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | xargs -0 cat | wc -l
}
over=0 total=0 total_budget=0
printf '%-14s %8s %8s\n' layer lines budget
for entry in "${budgets[@]}"; do
  read -r layer budget paths <<<"$entry"
  # shellcheck disable=SC2086
  lines=$(count $paths)
  total=$((total + lines)); total_budget=$((total_budget + budget))
  flag=""
  [ "$lines" -le "$budget" ] || { flag="  over by $((lines - budget))"; over=1; }
  printf '%-14s %8d %8d%s\n' "$layer" "$lines" "$budget" "$flag"
done
printf '%-14s %8d %8d\n' total "$total" "$total_budget"
[ "$over" -eq 0 ] || { echo "line budget exceeded (above): delete lines first; a raise is its own commit naming the feature"; exit 1; }
echo "line budget: every layer within its budget"
