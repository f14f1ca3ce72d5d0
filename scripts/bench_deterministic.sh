#!/usr/bin/env bash
# The cost of --deterministic (docs/FSDP.md "Deterministic mode"; docs/PERFORMANCE.md). A GPT
# (default: GPT medium, L6 d384 ctx256, global batch 16) trains under --fsdp at RANKS ranks x 1
# thread: the default, --deterministic with V = 8 (each rank runs 8/RANKS micro-batches of 2
# rows) and with V = RANKS (one micro-batch per rank: the same shapes as the default, so only
# the ordered reduction differs), in turn for ROUNDS rounds. Each figure is the tokens/s of
# steps 6-10; the table gives each round and the medians with the default / deterministic ratio.
# Usage: scripts/bench_deterministic.sh BUILD [ROUNDS [RANKS [extra weft-transformer train flags]]]
#   MPIRUN (default mpirun) and MPIRUN_ARGS (default --bind-to none) launch the ranks.
set -euo pipefail
build=${1:?usage: bench_deterministic.sh BUILD [ROUNDS [RANKS [flags]]]}
rounds=${2:-3}
ranks=${3:-2}
shift $(($# < 3 ? $# : 3))
tf=$build/apps/transformer/weft-transformer
read -r -a launch <<<"${MPIRUN:-mpirun} ${MPIRUN_ARGS:---bind-to none}"
[ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
cfg=(train --n-layer 6 --n-head 6 --d-model 384 --ctx 256 --batch-size 16 --steps 10 --log-every 5 --eval-every 0
     --eval-iters 1 --fsdp --threads 1 "$@")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rate() {  # tokens/s of the last logged window
  rm -f "$out/m.jsonl"
  OMP_NUM_THREADS=1 "${launch[@]}" -np "$ranks" "$tf" "${cfg[@]}" "$@" --metrics "$out/m.jsonl" >/dev/null 2>"$out/err" ||
    { echo "FAIL: $*: $(tail -3 "$out/err")"; exit 1; }
  grep tokens_per_s "$out/m.jsonl" | tail -1 | grep -o '"tokens_per_s":[0-9.]*' | cut -d: -f2
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "| round | default tokens/s | deterministic V=8 | default / V=8 | deterministic V=$ranks | default / V=$ranks |"
echo "|---|---:|---:|---:|---:|---:|"
for r in $(seq "$rounds"); do
  d=$(rate); v8=$(rate --deterministic); vw=$(rate --deterministic --virtual-batches "$ranks")
  echo "$d $v8 $vw" >>"$out/all"
  printf "| %s | %.0f | %.0f | %s | %.0f | %s |\n" "$r" "$d" "$v8" "$(ratio "$d" "$v8")" "$vw" "$(ratio "$d" "$vw")"
done
md=$(cut -d' ' -f1 "$out/all" | median); m8=$(cut -d' ' -f2 "$out/all" | median); mw=$(cut -d' ' -f3 "$out/all" | median)
printf "| median | %.0f | %.0f | %s | %.0f | %s |\n" "$md" "$m8" "$(ratio "$md" "$m8")" "$mw" "$(ratio "$md" "$mw")"
