#!/usr/bin/env bash
# weft-bench-gpt2 on a tiny GPT on the CPU (the benchmark itself needs a GPU): 2 steps in bf16
# (FSDP mixed precision in a world of one) and in f32 print a well-formed table whose figures
# agree with each other (tokens/s = batch x ctx / ms, MFU from the printed FLOPs per token),
# a first loss near ln(vocab) that is the same in both precisions up to bf16 rounding (same
# weights, same tokens), and the
# summary line scripts/bench_gpt2.sh reads; autocast with --profile prints the per-op table;
# --device cuda without a GPU skips with its reason
# (exit 77); a bad config is a clear error.
# Usage: bench_gpt2.sh EXE
set -euo pipefail
exe=$1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
tiny=(--device cpu --n-layer 2 --n-head 4 --d-model 64 --ctx 64 --vocab 256 --batch-size 2 --steps 2 --threads 1
      --peak-tflops 0.1)  # a CPU-sized peak, so the MFU column is a checkable percentage

check_table() {  # FILE PRECISION
  local f=$1 p=$2
  grep -q '^# weft-bench-gpt2: GPT n_layer 2, n_head 4, d_model 64, ctx 64, vocab 256' "$f" || fail "$f: no header"
  grep -q '^| step | loss | ms | tokens/s | MFU % | peak MiB |$' "$f" || fail "$f: no column line"
  local rows
  rows=$(grep -cE '^\| [0-9]+ \| ' "$f" || true)
  [ "$rows" = 2 ] || fail "$f: $rows step rows, expected 2"
  local fpt
  fpt=$(sed -n 's/^# model FLOPs\/token 6N + 12\*L\*H\*hd\*T = \([0-9.e+]*\) .*/\1/p' "$f")
  [ -n "$fpt" ] || fail "$f: no FLOPs/token line"
  # Every row: step k, loss near ln(256) = 5.545, ms > 0, tokens/s = 2*64/(ms/1000) within the
  # printed rounding, MFU = fpt * tokens/s / 0.1e12 in %, peak > 0.
  awk -F'|' -v fpt="$fpt" '/^\| [0-9]+ \| / {
      n++; step = $2 + 0; loss = $3 + 0; ms = $4 + 0; tps = $5 + 0; mfu = $6 + 0; peak = $7 + 0
      if (step != n) { print "row " n " has step " step; bad = 1 }
      if (!(loss > 5.0 && loss < 6.2)) { print "step " step " loss " loss " not near ln(256)"; bad = 1 }
      if (!(ms > 0)) { print "step " step " ms " ms; bad = 1 }
      want = 2 * 64 / (ms / 1000); if (tps < want * 0.99 - 1 || tps > want * 1.01 + 1) { print "tokens/s " tps " vs " want; bad = 1 }
      wmfu = 100 * fpt * tps / 0.1e12; if (mfu < wmfu * 0.99 - 0.006 || mfu > wmfu * 1.01 + 0.006) { print "MFU " mfu " vs " wmfu; bad = 1 }
      if (!(mfu > 0)) { print "step " step " MFU " mfu; bad = 1 }
      if (!(peak > 0)) { print "step " step " peak MiB " peak; bad = 1 }
    } END { exit bad }' "$f" || fail "$f: a row is wrong"
  grep -qE "^summary impl=weft precision=$p steps=2-2 ms=[0-9.]+ tokens_per_s=[0-9]+ mfu=[0-9.]+ peak_mib=[0-9.]+ " "$f" \
    || fail "$f: no summary line"
}

"$exe" --help | grep -q -- "--peak-tflops" || fail "--help does not list --peak-tflops"

rc=0
"$exe" "${tiny[@]}" > "$tmp/bf16.txt" 2>&1 || rc=$?
cat "$tmp/bf16.txt"
[ $rc = 0 ] || fail "bf16 run exited $rc"
check_table "$tmp/bf16.txt" bf16
grep -q 'bf16 compute, f32 master weights' "$tmp/bf16.txt" || fail "bf16 run does not say how it computes"

"$exe" "${tiny[@]}" --precision f32 > "$tmp/f32.txt" 2>&1 || rc=$?
cat "$tmp/f32.txt"
[ $rc = 0 ] || fail "f32 run exited $rc"
check_table "$tmp/f32.txt" f32
# Same seed: the same weights and tokens, so the first losses differ only by bf16 rounding.
l16=$(awk -F'|' '/^\| 1 \| / { print $3 + 0 }' "$tmp/bf16.txt")
l32=$(awk -F'|' '/^\| 1 \| / { print $3 + 0 }' "$tmp/f32.txt")
awk -v a="$l16" -v b="$l32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05) }' \
  || fail "step-1 loss bf16 $l16 vs f32 $l32: expected equal within 0.05"

# autocast (bf16 without FSDP) with --profile: the same table, the same first loss as f32 up to
# bf16 rounding, then one row per op of the measured step: the tied head's forward product (a
# matmul, 128 tokens x 256 classes x 64: the MLP's GEMMs of that shape are rows of their own)
# once, in bf16, at a positive rate, and the time outside the ops between 0 and 100 % of the
# step (negative would count an op twice).
"$exe" "${tiny[@]}" --precision autocast --profile > "$tmp/autocast.txt" 2>&1 || rc=$?
cat "$tmp/autocast.txt"
[ $rc = 0 ] || fail "autocast run exited $rc"
check_table "$tmp/autocast.txt" autocast
la=$(awk -F'|' '/^\| 1 \| / { print $3 + 0 }' "$tmp/autocast.txt")
awk -v a="$la" -v b="$l32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05) }' \
  || fail "step-1 loss autocast $la vs f32 $l32: expected equal within 0.05"
grep -qE '^# per-op profile of 1 steps, 1 thread; limits: GEMM peak f32 [0-9]+ GFLOP/s' "$tmp/autocast.txt" \
  || fail "no profile header"
awk -F'|' '$2 ~ /^ matmul 128x256x64 NT bf16 $/ { found = 1; if ($3 + 0 != 1 || !($6 + 0 > 0)) bad = 1 }
  END { exit !(found && !bad) }' "$tmp/autocast.txt" || fail "no well-formed row for the head's forward GEMM"
awk -F'|' '$2 ~ /framework/ { found = 1; if (!($5 + 0 >= 0 && $5 + 0 <= 100)) bad = 1 } END { exit !(found && !bad) }' \
  "$tmp/autocast.txt" || fail "the time outside the ops is not a share of the step"

# The default device: without a CUDA build or a visible GPU, skip with the reason; where a GPU
# is visible, the tiny model runs there and prints the same table.
"$exe" "${tiny[@]:2}" --device cuda > "$tmp/cuda.txt" 2>&1 || rc=$?
cat "$tmp/cuda.txt"
if [ $rc = 77 ]; then
  grep -qE '^weft-bench-gpt2: skipped: --device cuda: (weft was built without CUDA|no CUDA device is visible)' \
    "$tmp/cuda.txt" || fail "exit 77 without the reason"
else
  [ $rc = 0 ] || fail "--device cuda exited $rc"
  check_table "$tmp/cuda.txt" bf16
fi
rc=0

if "$exe" --device cpu --n-head 3 --d-model 64 --steps 1 2>"$tmp/err" >/dev/null; then fail "--n-head 3 accepted"; fi
grep -q "does not divide --d-model" "$tmp/err" || fail "bad --n-head not explained: $(cat "$tmp/err")"
if "$exe" --device cpu --peak-tflops nan --steps 1 2>"$tmp/err" >/dev/null; then fail "--peak-tflops nan accepted"; fi
grep -q -- "--peak-tflops: not a finite number: nan" "$tmp/err" || fail "--peak-tflops nan not explained: $(cat "$tmp/err")"
# The apps' validators: --threads held to 1024 (a larger OpenMP team crashed inside libgomp), no
# seed that wraps, no NaN clip that turned clipping off, no warmup that left no step measured.
bad_flag() {  # MESSAGE ARGS...
  local want=$1; shift
  if "$exe" --device cpu "$@" 2>"$tmp/err" >/dev/null; then fail "$* accepted"; fi
  grep -q -- "$want" "$tmp/err" || fail "$* not explained: $(cat "$tmp/err")"
}
bad_flag "--threads: expected an integer from 1 to 1024, got 100000" --threads 100000
bad_flag "--seed: expected an integer from 0 to 18446744073709551615, got -1" --seed -1
bad_flag "--clip: not a finite number: nan" --clip nan
bad_flag "--batch-size: expected an integer from 1 to" --batch-size 0
bad_flag "--warmup 5 must be fewer than --steps 2" "${tiny[@]:2}" --warmup 5
bad_flag "--warmup 2 must be fewer than --steps 2" "${tiny[@]:2}" --warmup 2
echo "bench_gpt2: OK"
