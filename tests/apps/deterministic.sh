#!/usr/bin/env bash
# --deterministic: the same bits at any world size and thread count. weft-transformer (GPT with
# dropout, 2 accumulated batches and a clip that always scales; Llama with grouped-query
# attention; GPT under FSDP bf16 mixed precision) and weft-mnist (the MLP) train alone at 1 and
# 2 threads and under --fsdp at 1, 2, 4 and 8 ranks (2 ranks also at 2 threads each; with
# activation checkpointing and reshard-after-forward false on some; the MLP in bf16 too): every logged training and validation loss and the
# final parameters and optimizer state (consolidated checkpoints) must be equal byte for byte.
# Without --deterministic the 1- and 2-rank runs must differ (so the test can see a difference).
# Usage: deterministic.sh WEFT_TRANSFORMER WEFT_MNIST WEFT_CHECKPOINT MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
transformer=$1
mnist=$2
checkpoint=$3
shift 3
launch=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail
export OMP_NUM_THREADS=1
run() { timeout 120 "$@"; }
# Eight ranks on two cores under a sanitizer take minutes and run the code the four-rank runs do
# (scripts/sanitize.sh sets WEFT_SANITIZER): there the 8-rank runs are left out, saying so.
eight=8
if [ -n "${WEFT_SANITIZER:-}" ]; then
  eight=""
  echo "deterministic: the 8-rank runs are not run under $WEFT_SANITIZER (the normal build runs them)"
fi

# train TAG PROGRAM-AND-FLAGS...: trains with metrics and a checkpoint directory, then
# consolidates the final checkpoint with its optimizer state.
train() {
  local tag=$1 ckflag=--checkpoint-dir
  shift
  [[ "$*" == *weft-mnist* ]] && ckflag=--save
  run "$@" --metrics "$tmp/$tag.jsonl" "$ckflag" "$tmp/$tag.ck" >"$tmp/$tag.out" 2>&1 ||
    fail "$tag: $* ended with status $?: $(tail -5 "$tmp/$tag.out")"
  run "$checkpoint" consolidate --with-optimizer "$tmp/$tag.ck" "$tmp/$tag.safetensors" >/dev/null 2>"$tmp/err" ||
    fail "$tag: consolidate: $(cat "$tmp/err")"
}
# The logged losses and gradient norms, one per line.
losses() { grep -oE '"(loss|grad_norm)":[^,}]*' "$1.jsonl" || true; }
# same REFERENCE TAG...: every TAG logged REFERENCE's losses and holds its bytes.
same() {
  local ref=$1
  shift
  [ "$(losses "$tmp/$ref" | wc -l)" -ge 4 ] || fail "$ref logged fewer than 4 losses: $(cat "$tmp/$ref.jsonl")"
  for tag in "$@"; do
    [ "$(losses "$tmp/$tag")" = "$(losses "$tmp/$ref")" ] ||
      fail "$tag and $ref logged different losses: $(paste <(losses "$tmp/$tag") <(losses "$tmp/$ref") | tr '\n' ' ')"
    cmp -s "$tmp/$tag.safetensors" "$tmp/$ref.safetensors" ||
      fail "$tag and $ref ended with different parameters or optimizer state: $(cmp "$tmp/$tag.safetensors" "$tmp/$ref.safetensors")"
  done
}

gpt=(train --steps 4 --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 2 --eval-iters 2 --log-every 1
     --seed 3 --dropout 0.1 --grad-accum 2 --clip 0.05 --deterministic)
train gpt_t1 "$transformer" "${gpt[@]}" --threads 1
train gpt_t2 "$transformer" "${gpt[@]}" --threads 2
[ ${#launch[@]} -gt 0 ] || { echo "SKIP multi-rank part: no mpirun given"; same gpt_t1 gpt_t2; exit 0; }
train gpt_n1 "${launch[@]}" -np 1 "$transformer" "${gpt[@]}" --fsdp --threads 2
train gpt_n2 "${launch[@]}" -np 2 "$transformer" "${gpt[@]}" --fsdp --threads 1 --activation-checkpointing
train gpt_n4 "${launch[@]}" -np 4 "$transformer" "${gpt[@]}" --fsdp --threads 1 --reshard-after-forward false
[ -z "$eight" ] || train gpt_n8 "${launch[@]}" -np 8 "$transformer" "${gpt[@]}" --fsdp --threads 1
train gpt_n2t2 "${launch[@]}" -np 2 "$transformer" "${gpt[@]}" --fsdp --threads 2
same gpt_t1 gpt_t2 gpt_n1 gpt_n2 gpt_n4 ${eight:+gpt_n8} gpt_n2t2

llama=(train --arch llama --n-head 4 --n-kv-head 2 --steps 4 --batch-size 8 --ctx 32 --n-layer 2 --d-model 32
       --eval-every 2 --eval-iters 2 --log-every 1 --seed 5 --clip 0.05 --deterministic --virtual-batches 4)
train llama_t2 "$transformer" "${llama[@]}" --threads 2
train llama_n2 "${launch[@]}" -np 2 "$transformer" "${llama[@]}" --fsdp --threads 1
train llama_n4 "${launch[@]}" -np 4 "$transformer" "${llama[@]}" --fsdp --threads 1 --activation-checkpointing
same llama_t2 llama_n2 llama_n4

bf16=(train --steps 4 --batch-size 8 --ctx 32 --n-layer 2 --d-model 32 --eval-every 2 --eval-iters 2 --log-every 1
      --seed 3 --dropout 0.1 --clip 0.05 --deterministic --fsdp --mixed-precision bf16)
train bf16_n1 "${launch[@]}" -np 1 "$transformer" "${bf16[@]}" --threads 2
train bf16_n2 "${launch[@]}" -np 2 "$transformer" "${bf16[@]}" --threads 1
train bf16_n4 "${launch[@]}" -np 4 "$transformer" "${bf16[@]}" --threads 1
same bf16_n1 bf16_n2 bf16_n4

# 1,003 test images: the last evaluation batch leaves some ranks' parts empty (their forward still gathers).
mlp=(--steps 12 --log-every 3 --seed 3 --batch-size 64 --deterministic --data "$(mnist_small 1003)")
train mlp_t1 "$mnist" "${mlp[@]}" --threads 1
train mlp_t2 "$mnist" "${mlp[@]}" --threads 2
train mlp_n2 "${launch[@]}" -np 2 "$mnist" "${mlp[@]}" --fsdp --threads 1
train mlp_n4 "${launch[@]}" -np 4 "$mnist" "${mlp[@]}" --fsdp --threads 1
[ -z "$eight" ] || train mlp_n8 "${launch[@]}" -np 8 "$mnist" "${mlp[@]}" --fsdp --threads 1
train mlp_n2t2 "${launch[@]}" -np 2 "$mnist" "${mlp[@]}" --fsdp --threads 2
same mlp_t1 mlp_t2 mlp_n2 mlp_n4 ${eight:+mlp_n8} mlp_n2t2
train mlp_bf16_n1 "${launch[@]}" -np 1 "$mnist" "${mlp[@]}" --fsdp --threads 2 --mixed-precision bf16
train mlp_bf16_n4 "${launch[@]}" -np 4 "$mnist" "${mlp[@]}" --fsdp --threads 1 --mixed-precision bf16
same mlp_bf16_n1 mlp_bf16_n4

# Without --deterministic the world size shows in the bits (the test above could see it).
plain=()
for a in "${gpt[@]}"; do [ "$a" = --deterministic ] || plain+=("$a"); done
train plain_n1 "${launch[@]}" -np 1 "$transformer" "${plain[@]}" --fsdp --threads 1
train plain_n2 "${launch[@]}" -np 2 "$transformer" "${plain[@]}" --fsdp --threads 1
[ "$(losses "$tmp/plain_n1")" != "$(losses "$tmp/plain_n2")" ] ||
  fail "without --deterministic 1 and 2 ranks logged the same losses: the comparison above could not fail"

# The memory plan runs the step's leaves as training does (one forward and backward per leaf; under
# FSDP every leaf's gradients kept until the last): its peak is the run's within 1 % (it had been
# 25 % low under FSDP and 187 % high in one process, planning one backward of the whole batch).
plan_within() {  # TAG COMMAND...
  local tag=$1 pct
  shift
  run "$@" --memory-budget 1G >"$tmp/$tag.out" 2>&1 || fail "$tag: $* ended with status $?: $(tail -5 "$tmp/$tag.out")"
  pct=$(grep -o 'the plan predicted [0-9]* bytes ([-+0-9.]* %)' "$tmp/$tag.out" | grep -o '([-+0-9.]*' | tr -d '(')
  [ -n "$pct" ] || fail "$tag: no plan beside the peak: $(tail -5 "$tmp/$tag.out")"
  awk -v p="$pct" 'BEGIN { exit !(p < 1 && p > -1) }' || fail "$tag: the plan is $pct % off the peak"
}
plan_small=(train --steps 2 --batch-size 16 --ctx 32 --n-layer 2 --d-model 64 --eval-every 2 --eval-iters 1 --deterministic)
plan_within plan_gpt_t1 "$transformer" "${plan_small[@]}" --grad-accum 2 --threads 1
plan_within plan_gpt_n2 "${launch[@]}" -np 2 "$transformer" "${plan_small[@]}" --fsdp --threads 1 --virtual-batches 4
plan_within plan_mlp_t1 "$mnist" --steps 2 --batch-size 64 --deterministic --data "$(mnist_small 1000)" --threads 1
plan_within plan_mlp_n2 "${launch[@]}" -np 2 "$mnist" --steps 2 --batch-size 64 --deterministic --data "$(mnist_small 1000)" --fsdp --threads 1
# --plan-ranks N checks the split at N ranks, not at this one process's.
run "$mnist" --fsdp --plan-ranks 3 --deterministic --virtual-batches 12 --batch-size 96 >"$tmp/plan4.out" 2>&1 ||
  fail "--plan-ranks 3 --virtual-batches 12 refused: $(cat "$tmp/plan4.out")"

# What does not fit is named.
expect() {  # expect WHAT-THE-ERROR-NAMES COMMAND...
  local want=$1
  shift
  if run "$@" >"$tmp/bad.out" 2>&1; then fail "$* succeeded"; fi
  grep -q -- "$want" "$tmp/bad.out" || fail "$*: no \"$want\" in: $(cat "$tmp/bad.out")"
}
small=(train --steps 1 --ctx 32 --n-layer 1 --d-model 32 --deterministic)
expect "2 ranks must divide --virtual-batches 6 into a power of two per rank" \
  "${launch[@]}" -np 2 "$transformer" "${small[@]}" --fsdp --threads 1 --batch-size 12 --virtual-batches 6
expect "--virtual-batches 3 must divide --batch-size 16" "$transformer" "${small[@]}" --virtual-batches 3
expect "--grad-accum 3 must be a power of two" "$transformer" "${small[@]}" --grad-accum 3
expect "NO_SHARD" "${launch[@]}" -np 2 "$transformer" "${small[@]}" --fsdp --sharding-strategy NO_SHARD
expect "requires --deterministic" "$mnist" --virtual-batches 4
expect "2 ranks must divide --virtual-batches 1" "$mnist" --fsdp --plan-ranks 2 --deterministic --virtual-batches 1
echo "deterministic: GPT, Llama, bf16 and the MLP bitwise equal at 1/2 threads and 1/2/4${eight:+/8} ranks"
