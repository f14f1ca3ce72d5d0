#!/usr/bin/env bash
# Predicted steps of a model at many ranks (weft-plan --step-time with a stated network), as a
# Markdown table: for each rank count, network and tensor-parallel size, the step time, memory
# per rank and tokens/s at a global batch of ROWS sequences per rank; then, per rank count and
# network, the fastest layout that fits the memory budget (the planner picks activation
# checkpointing to fit; "no" where nothing does). TP_NETWORK=400,1 gives the tensor-parallel
# groups a link of their own (inside a node).
#   bash scripts/step_time_scan.sh [build] [budget, e.g. 2G] [-- model flags]
set -euo pipefail
build=build budget=2G  # each positional argument may be left out before `--`
[ $# -gt 0 ] && [ "$1" != -- ] && { build=$1; shift; }
[ $# -gt 0 ] && [ "$1" != -- ] && { budget=$1; shift; }
[ "${1:-}" = "--" ] && shift
model=("$@")
[ ${#model[@]} -gt 0 ] || model=(--arch llama --n-layer 8 --n-head 8 --n-kv-head 4 --d-model 512 --ctx 256)
rows=${ROWS:-4} ranks_list=${RANKS:-"8 64 1024"} nets=${NETWORKS:-"25 100 400"} tps=${TPS:-"1 2 4"}
tp_link=()  # TP_NETWORK=GBPS[,LATENCY_US]: the tensor-parallel groups' own link (inside a node)
[ -n "${TP_NETWORK:-}" ] && tp_link=(--tp-network "$TP_NETWORK")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| ranks | network Gb/s | tp | step ms | not hidden comm ms | peak per rank MiB | activation checkpointing | tokens/s |"
echo "|---:|---:|---:|---:|---:|---:|---|---:|"
for n in $ranks_list; do for net in $nets; do
  best=""
  for tp in $tps; do
    if "$build/apps/plan/weft-plan" transformer --fsdp --ranks "$n" --tp "$tp" --batch-size $((rows * n)) --threads 1 \
        "${model[@]}" --memory-budget "$budget" --step-time --network "$net" "${tp_link[@]}" >"$tmp/out" 2>&1; then
      ms=$(grep -o 'predicted at [0-9]* ranks\?: [0-9.]* ms' "$tmp/out" | grep -o '[0-9.]* ms' | cut -d' ' -f1)
      hid=$(grep -o '[0-9.]* ms not hidden' "$tmp/out" | cut -d' ' -f1)
      tps_=$(grep -o '[0-9]* tokens/s' "$tmp/out" | cut -d' ' -f1)
      peak=$(grep -o 'predicted peak *[0-9.]* MiB' "$tmp/out" | grep -o '[0-9.]* MiB' | cut -d' ' -f1)
      ac=$(grep -o 'activation checkpointing [a-z]*' "$tmp/out" | head -1 | cut -d' ' -f3)
      echo "| $n | $net | $tp | $ms | $hid | $peak | $ac | $tps_ |"
      if [ -z "$best" ] || awk -v a="$ms" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then best="$ms tp $tp"; fi
    elif grep -q "does not fit" "$tmp/out"; then echo "| $n | $net | $tp | - | - | over $budget | - | - |"
    else cat "$tmp/out" >&2; exit 1; fi
  done
  echo "$n $net ${best:-none}" >>"$tmp/best"
done; done
echo
echo "Fastest layout within $budget per rank:"
echo
echo "| ranks | network Gb/s | layout | step ms |"
echo "|---:|---:|---|---:|"
while read -r n net ms _ tp; do
  if [ "$ms" = none ]; then echo "| $n | $net | none fits | - |"; else echo "| $n | $net | dp $((n / tp)) x tp $tp | $ms |"; fi
done <"$tmp/best"
