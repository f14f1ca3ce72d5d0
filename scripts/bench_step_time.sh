#!/usr/bin/env bash
# The step-time model (weft-transformer --step-time, docs/PARALLEL.md "Step-time model") beside
# measured steps: for each (ranks, tp) layout, the predicted step (calibrated on this machine,
# the network measured on the run's ranks) and the measured one (the median step of steps 5-20 of
# a real run: tokens per step / the metrics' tokens/s), as a Markdown table.
#   bash scripts/bench_step_time.sh [build] [layouts, e.g. "1:1 2:1 4:1 2:2 4:2 4:4"] [-- model flags]
set -euo pipefail
build=build layouts="1:1 2:1 4:1 2:2 4:2 4:4"  # each positional argument may be left out before `--`
[ $# -gt 0 ] && [ "$1" != -- ] && { build=$1; shift; }
[ $# -gt 0 ] && [ "$1" != -- ] && { layouts=$1; shift; }
[ "${1:-}" = "--" ] && shift
model=("$@")
[ ${#model[@]} -gt 0 ] || model=(--arch llama --n-layer 4 --n-head 8 --n-kv-head 4 --d-model 256 --ctx 128 --batch-size 8)
exe=$build/apps/transformer/weft-transformer
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { mpirun -np "$1" --oversubscribe --bind-to none "$exe" train --fsdp --tp "$2" --threads 1 "${model[@]}" "${@:3}"; }
echo "| ranks | tp | predicted ms | of it: compute, not hidden comm | measured ms | prediction - measured |"
echo "|---:|---:|---:|---|---:|---:|"
for l in $layouts; do
  n=${l%:*} tp=${l#*:}
  run "$n" "$tp" --plan --step-time >"$tmp/plan" 2>&1 || { cat "$tmp/plan"; exit 1; }
  pred=$(grep -o 'predicted at [0-9]* ranks\?: [0-9.]* ms' "$tmp/plan" | grep -o '[0-9.]* ms' | cut -d' ' -f1)
  parts=$(sed -n 's/^  compute \([0-9.]*\) ms.*/\1/p' "$tmp/plan"),$(grep -o '[0-9.]* ms not hidden' "$tmp/plan" | cut -d' ' -f1)
  tokens=$(grep -o ': [0-9.]* ms, [0-9]* tokens/s' "$tmp/plan" | awk '{print $4 * $2 / 1000}')
  rm -f "$tmp/m_${n}_$tp.jsonl"
  run "$n" "$tp" --steps 20 --log-every 1 --eval-every 0 --metrics "$tmp/m_${n}_$tp.jsonl" >/dev/null 2>"$tmp/err" ||
    { cat "$tmp/err"; exit 1; }
  # The median of steps 5-20's tokens/s (each step its own window: a step the machine stalled
  # does not move it).
  tps=$(grep -o '"step":\([5-9]\|1[0-9]\|20\),"tokens_per_s":[0-9.e+]*' "$tmp/m_${n}_$tp.jsonl" | cut -d: -f3 | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
  awk -v n="$n" -v tp="$tp" -v p="$pred" -v parts="$parts" -v t="$tokens" -v s="$tps" 'BEGIN {
    m = t / s * 1000; split(parts, q, ",");
    printf "| %d | %d | %.1f | %.1f, %.1f | %.1f | %+.1f %% |\n", n, tp, p, q[1], q[2], m, 100 * (p - m) / m }'
done
