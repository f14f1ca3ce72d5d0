#!/usr/bin/env bash
# FSDP memory scaling: weft-bench-memory at 1, 2 and 4 ranks, the table over world sizes, and
# the memory-over-time plot (docs/MEMORY_SCALING.md shows the result).
#   scripts/bench_memory.sh [BUILD_DIR] [weft-bench-memory flags...]
#   e.g. scripts/bench_memory.sh build --n-layer 8 --d-model 256      (a quick run)
# Environment: OUT (folder for the JSON files and logs, default bench-memory-out), PNG (the
# plot, default $OUT/memory_scaling.png), RANKS (default "1 2 4").
# The plot needs python3-matplotlib (apt-get install -y python3-matplotlib); without it the
# script still prints the table and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
bench="$build/apps/bench/weft-bench-memory"
[ -x "$bench" ] || { echo "no $bench: build it first (meson setup $build && ninja -C $build)" >&2; exit 1; }
out=${OUT:-bench-memory-out}
png=${PNG:-$out/memory_scaling.png}
ranks=${RANKS:-"1 2 4"}
mkdir -p "$out"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc --all) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo); load: $(cut -d' ' -f1-3 /proc/loadavg)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 WEFT_COLLECTIVE_TIMEOUT=120
files=()
for np in $ranks; do
  start=$(date +%s)
  mpirun -np "$np" --oversubscribe --bind-to none "$bench" --json "$out/np$np.json" "$@" | tee "$out/np$np.txt"
  echo "# $np rank(s): $(( $(date +%s) - start )) s"
  files+=("$out/np$np.json")
done
echo
"$bench" --summary "${files[@]}" | tee "$out/summary.md"
# The first python3 that has matplotlib (Debian's /usr/bin/python3 when another one is on PATH).
py=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
if [ -n "$py" ]; then
  "$py" scripts/plot_memory.py "$png" "${files[@]}"
else
  echo "no python3 with matplotlib: skipped the plot (apt-get install -y python3-matplotlib)" >&2
fi
