#!/usr/bin/env bash
# The memory budget demonstration (docs/MEMORY_SCALING.md, "A budget that holds"). One process
# trains a GPT in NEED bytes (the allocator's peak). With every rank capped at NEED/3
# (WEFT_MEMORY_LIMIT): at 1 rank training stops with the out-of-memory error, and the planner
# says by how much no setting fits; at 4 ranks, --memory-budget NEED/3 lets the planner choose
# reshard-after-forward per block and activation checkpointing, the job trains under the cap,
# and its losses match the unlimited single-process run. Prints a table; exits 1 if any of
# that does not hold.
# Usage: scripts/bench_budget.sh BUILD [model flags of weft-transformer train, replacing the
#   default --n-layer 16 --n-head 4 --d-model 128 --ctx 64 --batch-size 8]
#   MPIRUN (default mpirun) and MPIRUN_ARGS (default --oversubscribe --bind-to none) launch the 4 ranks.
set -euo pipefail
build=${1:?usage: bench_budget.sh BUILD [flags]}
shift
tf=$build/apps/transformer/weft-transformer
plan=$build/apps/plan/weft-plan
read -r -a launch <<<"${MPIRUN:-mpirun} ${MPIRUN_ARGS:---oversubscribe --bind-to none}"
[ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
model=(--n-layer 16 --n-head 4 --d-model 128 --ctx 64 --batch-size 8)
[ $# -gt 0 ] && model=("$@")
cfg=("${model[@]}" --steps 6 --warmup 0 --eval-every 0 --eval-iters 1 --log-every 1 --threads 1 --seed 0)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
peak_of() { grep -o "peak memory per rank [0-9.]* MiB ([0-9]* bytes)" "$1" | grep -o "([0-9]*" | tr -d '(' || true; }
losses() { grep -v '"split"' "$1" | grep -o '"loss":[^,}]*' | cut -d: -f2; }

# 1. Unlimited, one process: what it needs.
"$tf" train "${cfg[@]}" --metrics "$out/free.jsonl" >/dev/null 2>"$out/free.err" || fail "unlimited run: $(tail -3 "$out/free.err")"
need=$(peak_of "$out/free.err")
[ -n "$need" ] || fail "the unlimited run printed no peak"
limit=$((need / 3))
# 2. One process under NEED/3: the out-of-memory error.
if env WEFT_MEMORY_LIMIT=$limit "$tf" train "${cfg[@]}" >/dev/null 2>"$out/one.err"; then fail "1 rank trained under $limit bytes"; fi
grep -q "out of memory on cpu" "$out/one.err" || fail "1 rank: no out-of-memory error: $(tail -3 "$out/one.err")"
# 3. The planner at 1 rank: no setting fits, and by how much.
if "$plan" transformer "${cfg[@]}" --memory-budget "$limit" >"$out/plan1" 2>&1; then fail "the 1-rank plan fits $limit bytes"; fi
grep -q "does NOT fit: over by" "$out/plan1" || fail "the 1-rank plan does not say by how much: $(cat "$out/plan1")"
# 4. Four ranks under the same cap, with the planner's settings.
"${launch[@]}" -np 4 env WEFT_MEMORY_LIMIT=$limit "$tf" train --fsdp "${cfg[@]}" --memory-budget "$limit" \
  --metrics "$out/four.jsonl" >/dev/null 2>"$out/four.err" || fail "4 ranks under $limit bytes: $(tail -5 "$out/four.err")"
four=$(peak_of "$out/four.err")
[ -n "$four" ] && [ "$four" -le "$limit" ] || fail "4 ranks peaked at '$four' bytes, over the cap $limit"
chosen=$(grep -o "memory plan per rank at 4 ranks: .*" "$out/four.err" | sed 's/memory plan per rank at 4 ranks: //')
predicted=$(grep -o "predicted peak *[0-9.]* MiB *[0-9]*" "$out/four.err" | awk '{print $NF}')
paste <(losses "$out/free.jsonl") <(losses "$out/four.jsonl") >"$out/pairs"
[ "$(wc -l <"$out/pairs")" -ge 2 ] || fail "too few logged steps"
awk '{ d = $1 - $2; if (d < 0) d = -d; if ($2 == "" || d > 1e-5 * ($1 < 0 ? -$1 : $1)) exit 1 }' "$out/pairs" ||
  fail "4-rank losses differ from the unlimited single process: $(cat "$out/pairs")"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "| run | cap per rank | result | peak per rank | final loss |"
echo "|---|---:|---|---:|---:|"
echo "| 1 process, no cap | - | trained | $(mib "$need") | $(losses "$out/free.jsonl" | tail -1) |"
echo "| 1 process, cap NEED/3 | $(mib "$limit") | out of memory | - | - |"
echo "| planner, 1 rank | $(mib "$limit") | $(grep -o "does NOT fit: over by [0-9.]* MiB" "$out/plan1") | - | - |"
echo "| 4 ranks, cap NEED/3, --memory-budget | $(mib "$limit") | trained ($chosen) | $(mib "$four") (predicted $(mib "$predicted")) | $(losses "$out/four.jsonl" | tail -1) |"
echo "losses of all $(wc -l <"$out/pairs") logged steps match the unlimited run to 1e-5"
grep -o "out of memory on cpu: .*" "$out/one.err" | head -1 | cut -c1-300
echo "bench_budget: ok"
