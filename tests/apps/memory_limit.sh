#!/usr/bin/env bash
# WEFT_MEMORY_LIMIT caps the allocator: weft-transformer under a limit smaller than its need
# stops with an out-of-memory error naming the request, the live bytes, the limit and the
# largest owners; a bad value is named; under a limit it fits in, it trains exactly as without.
# With an mpirun: --fsdp at 2 ranks under too small a limit ends the whole job with that error,
# within seconds (no rank left waiting in a collective). A budget of exactly the plan's peak holds
# under a limit of it when training, resuming (one process and 2 ranks) and starting from a Hugging
# Face model read into a bf16 base.
# Usage: memory_limit.sh TRANSFORMER [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
tf=$1
mpirun=${2:-}
shift $(( $# > 1 ? 2 : 1 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within

cfg=(--n-layer 2 --n-head 2 --d-model 32 --ctx 32 --batch-size 8 --warmup 0 --seed 0 --threads 1 --eval-every 0
     --eval-iters 1 --steps 3)
"$tf" train "${cfg[@]}" >"$tmp/free" 2>/dev/null || fail "training without a limit failed"
WEFT_MEMORY_LIMIT=64M "$tf" train "${cfg[@]}" >"$tmp/capped" 2>"$tmp/err" || fail "64M is enough: $(cat "$tmp/err")"
cmp -s <(grep train_loss "$tmp/free") <(grep train_loss "$tmp/capped") || fail "a limit changed the losses"
if WEFT_MEMORY_LIMIT=1M "$tf" train "${cfg[@]}" >/dev/null 2>"$tmp/err"; then fail "1M of memory was enough"; fi
grep -Eq "out of memory on cpu: allocating [0-9.]+ MiB \([0-9]+ bytes\)( for [^)]*)? with [0-9.]+ MiB live would pass the memory limit of 1.0 MiB \(1048576 bytes" "$tmp/err" ||
  fail "no out-of-memory error naming request, live bytes and limit: $(cat "$tmp/err")"
grep -Eq "Largest live allocations: [0-9.]+ MiB (forward of|parameter|backward of)" "$tmp/err" ||
  fail "the error names no owner: $(cat "$tmp/err")"
if WEFT_MEMORY_LIMIT=12X "$tf" train "${cfg[@]}" >/dev/null 2>"$tmp/err"; then fail "WEFT_MEMORY_LIMIT=12X accepted"; fi
grep -q 'WEFT_MEMORY_LIMIT: "12X" is not a byte count' "$tmp/err" || fail "bad limit not named: $(cat "$tmp/err")"

# --step-time's calibration (its products' and element-wise chain's operands) stays within the
# plan's peak: with a budget 5 % above the plan as the limit too, it trains (the calibration had
# used three times the peak), and the peak reported beside the plan's is the training's.
peak=$("$tf" train "${cfg[@]}" --plan | awk '/predicted peak/ { print $5 }')
limit=$((peak * 105 / 100))
WEFT_MEMORY_LIMIT=$limit "$tf" train "${cfg[@]}" --memory-budget $limit --step-time >/dev/null 2>"$tmp/err" ||
  fail "--step-time under a limit 5 % above the plan's peak $peak: $(cat "$tmp/err")"
grep -Eq "the plan predicted $peak bytes \([+-]0\.0[0-9] %\)" "$tmp/err" ||
  fail "--step-time: the reported peak is not the plan's $peak: $(grep 'peak memory' "$tmp/err")"

# A budget of exactly the plan's peak holds under a limit of it, and the run's peak is the plan's: training (the
# optimizer's step counts on the host included), resuming from a checkpoint (the optimizer state and the model's
# values read without a second copy), and starting from a Hugging Face model read into a bf16 base (the
# conversion's buffer beside the model).
fit=(--n-layer 2 --n-head 4 --d-model 256 --ctx 8 --batch-size 2 --threads 1 --eval-iters 1)
at_peak "${fit[@]}" --steps 2 --checkpoint-dir "$tmp/ck"
at_peak "${fit[@]}" --steps 4 --resume "$tmp/ck"
at_peak --threads 1 --steps 2 --eval-iters 1 --batch-size 1 --ctx 8 --lora-rank 2 --base-dtype bf16 \
  --mixed-precision bf16 --init-from "$(dirname "${BASH_SOURCE[0]}")/../data/hf/llama"

if [ -n "$mpirun" ]; then
  start=$SECONDS
  # env, not mpirun -x (which OpenMPI refuses beside the sanitizer runs' mca_base_env_list).
  if timeout 120 "$mpirun" "${mpirun_args[@]}" -np 2 env WEFT_MEMORY_LIMIT=1M "$tf" train "${cfg[@]}" \
      --fsdp >/dev/null 2>"$tmp/err"; then fail "2 ranks under 1M trained"; fi
  [ $((SECONDS - start)) -lt 60 ] || fail "the job took $((SECONDS - start)) s to stop"
  grep -q "out of memory on cpu" "$tmp/err" || fail "2 ranks: no out-of-memory error: $(cat "$tmp/err")"
  ! grep -q "did not complete within" "$tmp/err" || fail "2 ranks: stopped by a timeout: $(cat "$tmp/err")"
  p=$(peak_of "${fit[@]}" --fsdp --plan-ranks 2 --steps 4 --resume "$tmp/ck")
  [ -n "$p" ] || fail "no plan for 2 ranks"
  "$mpirun" "${mpirun_args[@]}" -np 2 env WEFT_MEMORY_LIMIT="$p" "$tf" train "${fit[@]}" --fsdp --steps 4 \
    --resume "$tmp/ck" --memory-budget "$p" >/dev/null 2>"$tmp/err" || fail "2 ranks resumed over the plan: $(cat "$tmp/err")"
  grep -q "the plan predicted [0-9]* bytes (+0.00 %)" "$tmp/err" || fail "2 ranks: $(grep 'peak memory' "$tmp/err")"
fi
echo "memory_limit: ok"
