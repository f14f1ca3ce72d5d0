#!/usr/bin/env bash
# The memory plan predicts the peak of the rows a run really trains on (docs/MEMORY_SCALING.md,
# "Rows of examples"): a dataset of examples pads each batch to its longest row, so the plan's rows
# are as long as the data's longest (not --ctx); packed rows attend document by document, which
# the plan counts. With mpirun, --tp 2: the plan is exact too, and names where its peak is reached.
# Each run trains under a --memory-budget and WEFT_MEMORY_LIMIT of exactly the plan's peak and must
# report that peak (+0.00 %): a plan too low runs out of memory, one too high reports a lower peak.
# Usage: plan_data.sh TRANSFORMER CHAT_DATA_DIR [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
tf=$1
chat=$2
mpirun=${3:-}
shift $(( $# > 2 ? 3 : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail

# A model far past any one host (a GPT of 3.2e11 parameters: 1.2 TiB of f32 weights) plans per rank at 1024 ranks,
# with weft-transformer --plan-ranks as with weft-plan (it was refused as more than this machine's memory: the whole
# model against one host, where no rank holds it whole).
"$tf" train --fsdp --plan-ranks 1024 --n-layer 100 --d-model 16384 --n-head 128 --ctx 2048 --batch-size 1024 --ac full \
  >"$tmp/big.out" 2>"$tmp/err" || fail "the plan of a model larger than this host: $(cat "$tmp/err")"
grep -q "predicted peak" "$tmp/big.out" || fail "no plan of the large model: $(cat "$tmp/big.out")"

# The chat fixture's records, eight times over: 108 train and 12 val examples of at most ~60 tokens.
for _ in 1 2 3 4 5 6 7 8; do cat "$chat/records.jsonl"; done >"$tmp/data.jsonl"
"$tf" prepare --tokenizer "$chat/chatml" --data "$tmp/data.jsonl" --out "$tmp/ds" >/dev/null 2>"$tmp/err" ||
  fail "prepare failed: $(cat "$tmp/err")"

# A batch of 216 rows draws every training example (two epochs of 108), so it holds the longest.
gpt=(--data "$tmp/ds" --n-layer 2 --n-head 2 --d-model 32 --steps 2 --eval-iters 1 --batch-size 216 --threads 1)
at_peak "${gpt[@]}" --ctx 512  # rows as long as the longest example, not 512
at_peak "${gpt[@]}" --ctx 64   # cut at the context
at_peak "${gpt[@]}" --ctx 128 --pack
# Rotary tables: one as long as the longest document (a table per length of the packed documents drawn had been kept,
# 19,456 bytes past the plan, which allocates the longest's).
at_peak "${gpt[@]}" --ctx 128 --pack --arch llama

if [ -n "$mpirun" ]; then
  tp=(--steps 3 --n-layer 2 --d-model 64 --eval-iters 1 --batch-size 8 --ctx 32 --arch llama --tp 2 --threads 1 --fsdp)
  p=$(peak_of "${tp[@]}" --plan-ranks 2)
  [ -n "$p" ] || fail "no plan for --tp 2"
  "$tf" train "${tp[@]}" --plan-ranks 2 --plan | grep -q "predicted peak .*(reached in " ||
    fail "--tp 2: the plan does not say where its peak is reached"
  "$mpirun" "${mpirun_args[@]}" -np 2 env WEFT_MEMORY_LIMIT="$p" "$tf" train "${tp[@]}" --memory-budget "$p" \
    >/dev/null 2>"$tmp/err" || fail "--tp 2 ran out under a budget and limit of the plan's peak $p: $(cat "$tmp/err")"
  grep -q "the plan predicted $p bytes (+0.00 %)" "$tmp/err" || fail "--tp 2: $(grep 'peak memory' "$tmp/err")"
  # LoRA under --tp: every rank holds the whole model before the split, more than it trains with (the plan had left it
  # out: a budget it said fitted ran out, the run's peak 23 % past the plan's).
  lt=(--steps 2 --eval-iters 1 --fsdp --arch llama --d-model 512 --n-layer 4 --ctx 8 --lora-rank 2 --tp 2 --batch-size 1
      --threads 1)
  p=$(peak_of "${lt[@]}" --plan-ranks 2)
  "$mpirun" "${mpirun_args[@]}" -np 2 env WEFT_MEMORY_LIMIT="$p" "$tf" train "${lt[@]}" --memory-budget "$p" \
    >/dev/null 2>"$tmp/err" || fail "--tp 2 with LoRA ran out under a budget and limit of the plan's peak $p: $(cat "$tmp/err")"
  # A budget the first plan fits: the plan printed is a later run than the first, whose rotary tables (cached on the
  # meta device) it had not counted (2,048 bytes low).
  "$mpirun" "${mpirun_args[@]}" -np 2 "$tf" train "${tp[@]}" --memory-budget 1G >/dev/null 2>"$tmp/err" ||
    fail "--tp 2 --memory-budget 1G: $(cat "$tmp/err")"
  grep -q "the plan predicted [0-9]* bytes (+0.00 %)" "$tmp/err" || fail "--tp 2, 1G: $(grep 'peak memory' "$tmp/err")"
fi
echo "plan_data: ok"
