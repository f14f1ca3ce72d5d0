#!/usr/bin/env bash
# weft-mnist --fsdp and weft-simple under mpirun. The same 20 steps of the MLP (seed 3, global
# batch 64) single-process and sharded over 2 and 4 ranks must log the same losses (rel 1e-5)
# and test accuracy (on the first 1000 test images); a checkpoint saved at 2 ranks resumes at 4
# ranks and single-process exactly where the uninterrupted run goes; a global batch the ranks
# cannot split fails on every rank with a clear message; weft-simple at 2 ranks trains (its loss
# decreases).
# Usage: mnist_fsdp.sh WEFT_MNIST WEFT_SIMPLE MPIRUN [MPIRUN_ARGS...]
set -euo pipefail
mnist=$1
simple=$2
shift 2
launch=("$@")  # mpirun and its flags; "-np N exe ..." follows
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
export OMP_NUM_THREADS=1
run() { timeout 90 "$@"; }  # a hang fails the test instead of stalling it

# weft-simple: the smallest example trains and reports each rank's shard.
run "${launch[@]}" -np 2 "$simple" >"$tmp/simple.out" 2>&1 || fail "weft-simple at 2 ranks: $(cat "$tmp/simple.out")"
grep -q "loss decreased" "$tmp/simple.out" || fail "weft-simple loss did not decrease: $(cat "$tmp/simple.out")"
grep -q "rank 1 holds" "$tmp/simple.out" || fail "weft-simple does not report rank 1's shard: $(cat "$tmp/simple.out")"

small=$(mnist_small 1000)
common=(--steps 20 --log-every 10 --seed 3 --batch-size 64 --threads 1 --data "$small")
run "$mnist" "${common[@]}" --metrics "$tmp/np1.jsonl" >/dev/null 2>"$tmp/err" || fail "single process: $(cat "$tmp/err")"
for np in 2 4; do
  run "${launch[@]}" -np "$np" "$mnist" --fsdp "${common[@]}" --metrics "$tmp/np$np.jsonl" >"$tmp/out" 2>"$tmp/err" ||
    fail "--fsdp at $np ranks: $(cat "$tmp/err")"
  [ "$(grep -c test_accuracy "$tmp/out")" = 1 ] || fail "--fsdp at $np ranks: not exactly one rank printed: $(cat "$tmp/out")"
done

# Resume: 10 steps at 2 ranks with --save, then on to step 20 from the checkpoint at 4 ranks and alone.
half=(--log-every 10 --seed 3 --batch-size 64 --threads 1 --data "$small")
run "${launch[@]}" -np 2 "$mnist" --fsdp "${half[@]}" --steps 10 --save "$tmp/ck" >/dev/null 2>"$tmp/err" ||
  fail "--save at 2 ranks: $(cat "$tmp/err")"
run "${launch[@]}" -np 4 "$mnist" --fsdp "${half[@]}" --steps 20 --load "$tmp/ck" --metrics "$tmp/resumed4.jsonl" \
  >/dev/null 2>"$tmp/err" || fail "--load at 4 ranks: $(cat "$tmp/err")"
run "$mnist" "${half[@]}" --steps 20 --load "$tmp/ck" --metrics "$tmp/resumed1.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "--load of an FSDP checkpoint in one process: $(cat "$tmp/err")"

accuracy_of() { grep '"split":"test"' "$1" | grep -o '"accuracy":[^,}]*' | cut -d: -f2 || true; }
for step in 10 20; do
  want=$(loss_at "$tmp/np1.jsonl" $step)
  [ -n "$want" ] || fail "no single-process loss at step $step"
  for f in np2 np4 $([ $step = 20 ] && echo resumed4 resumed1); do
    within "$(loss_at "$tmp/$f.jsonl" $step)" "$want" 1e-5 1e-7 "loss at step $step ($f)"
  done
done
acc1=$(accuracy_of "$tmp/np1.jsonl")
for f in np2 np4 resumed4 resumed1; do
  # Float rounding may flip a near-tie: allow one of the 1000 test samples.
  within "$(accuracy_of "$tmp/$f.jsonl")" "$acc1" 0 1.00001e-3 "test accuracy ($f)"
done

# --mixed-precision bf16 under --fsdp (bf16 parameters gathered, f32 gradients reduced): close
# to f32, and measurably not f32.
run "${launch[@]}" -np 2 "$mnist" --fsdp "${common[@]}" --mixed-precision bf16 --metrics "$tmp/bf.jsonl" >/dev/null \
  2>"$tmp/err" || fail "--fsdp --mixed-precision bf16: $(cat "$tmp/err")"
within "$(loss_at "$tmp/bf.jsonl" 20)" "$(loss_at "$tmp/np1.jsonl" 20)" 0.02 0 "--fsdp bf16 step-20 loss"
differs "$(loss_at "$tmp/bf.jsonl" 20)" "$(loss_at "$tmp/np1.jsonl" 20)" 1e-6 "--fsdp bf16 step-20 loss"

# A global batch that 2 ranks cannot split: every rank says why, and the job fails.
if run "${launch[@]}" -np 2 "$mnist" --fsdp --batch-size 63 --steps 1 >/dev/null 2>"$tmp/err"; then
  fail "--batch-size 63 at 2 ranks accepted"
fi
for r in 0 1; do
  grep "error on rank $r" "$tmp/err" | grep "does not split evenly over 2 ranks" >/dev/null ||
    fail "rank $r does not explain the bad batch size: $(cat "$tmp/err")"
done
echo "mnist --fsdp ok: losses at steps 10 and 20 match single-process at 2 and 4 ranks and after resuming" \
     "(accuracy $acc1); weft-simple: $(grep 'loss decreased' "$tmp/simple.out")"
