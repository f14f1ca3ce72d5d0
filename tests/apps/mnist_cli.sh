#!/usr/bin/env bash
# End-to-end checks of weft-mnist on the Fashion-MNIST files: --help, bad flags and data,
# JSONL metrics, and that --save then --load continues training exactly where it stopped
# (the resumed run's losses equal the uninterrupted run's, bit for bit), and one epoch with
# the defaults reaching 83 % test accuracy.
set -euo pipefail
exe=$1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within

"$exe" --help | grep -- "--checkpoint\|--save" >/dev/null || fail "--help does not list --save"
if "$exe" --model rnn 2>"$tmp/err"; then fail "--model rnn accepted"; fi
grep -q "rnn" "$tmp/err" || fail "bad --model not named: $(cat "$tmp/err")"
if "$exe" --data "$tmp/nowhere" --steps 1 2>"$tmp/err"; then fail "missing data accepted"; fi
grep -q "dataset-fashion-mnist" "$tmp/err" || fail "missing data does not name the package: $(cat "$tmp/err")"
# A model past this machine's memory (64 images of 4 Mi pixels: a 48 GiB MLP) is refused with this program's advice.
mkdir "$tmp/huge"
{ printf '\x00\x00\x08\x03\x00\x00\x00\x40\x00\x00\x00\x01\x00\x40\x00\x00'; head -c $((64 << 22)) /dev/zero; } | gzip -1 \
  >"$tmp/huge/train-images-idx3-ubyte.gz"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x40'; head -c 64 /dev/zero; } >"$tmp/huge/train-labels-idx1-ubyte"
cp "$tmp/huge/train-images-idx3-ubyte.gz" "$tmp/huge/t10k-images-idx3-ubyte.gz"
cp "$tmp/huge/train-labels-idx1-ubyte" "$tmp/huge/t10k-labels-idx1-ubyte"
if [ "$(awk '/^MemAvailable/ {print $2}' /proc/meminfo)" -gt $((40 << 20)) ]; then
  echo "mnist_cli: the model past this machine's memory not tried: more than 40 GiB available"
else
  if "$exe" --data "$tmp/huge" --batch-size 32 --threads 1 2>"$tmp/err"; then fail "a 48 GiB model trained"; fi
  grep -q "this machine has available (MemAvailable): use a smaller --batch-size, more ranks, or --memory-budget" \
    "$tmp/err" || fail "a model past the memory: $(cat "$tmp/err")"
fi
# --device: an unknown name is refused; cuda trains where a GPU is visible and is otherwise a
# clear error naming why (this holds on machines without a GPU and on builds without CUDA).
if "$exe" --device tpu --steps 1 2>"$tmp/err"; then fail "--device tpu accepted"; fi
grep -q "expected cpu, cuda or cuda:N" "$tmp/err" || fail "bad --device not explained: $(cat "$tmp/err")"
for empty in "" 1; do  # an empty WEFT_CUDA_BACKEND is as if unset (it had loaded the program itself as the backend)
  if ! env ${empty:+WEFT_CUDA_BACKEND=} "$exe" --device cuda --steps 1 >/dev/null 2>"$tmp/err"; then
    grep -Eq -- "--device cuda: (no CUDA device is visible|weft was built without CUDA)" "$tmp/err" ||
      fail "--device cuda${empty:+ (WEFT_CUDA_BACKEND empty)} failed without naming the problem: $(cat "$tmp/err")"
  fi
done

common=(--seed 3 --batch-size 64 --threads 1 --data "$(mnist_small 1000)")
"$exe" "${common[@]}" --steps 30 --log-every 10 --metrics "$tmp/a.jsonl" >/dev/null 2>&1
"$exe" "${common[@]}" --steps 20 --log-every 10 --metrics "$tmp/b.jsonl" --save "$tmp/ck" >/dev/null 2>&1
"$exe" "${common[@]}" --steps 30 --log-every 10 --metrics "$tmp/b.jsonl" --load "$tmp/ck" >/dev/null 2>&1
# --steps is the step to stop at, also after --load (it had counted more steps: a restart with the same flags, as
# weft-elastic makes, trained past the uninterrupted run's end); a checkpoint past it is refused.
if "$exe" "${common[@]}" --steps 10 --load "$tmp/ck" >/dev/null 2>"$tmp/err"; then fail "--steps 10 from step 20 ran"; fi
grep -q "is at step 20, beyond --steps 10 (the step to stop at, counted from the run's start): raise --steps" \
  "$tmp/err" || fail "--steps below the checkpoint's step: $(cat "$tmp/err")"

for f in a b; do
  for key in '"step":' '"loss":' '"lr":' '"samples_per_s":'; do
    head -1 "$tmp/$f.jsonl" | grep "$key" >/dev/null || fail "metrics line lacks $key: $(head -1 "$tmp/$f.jsonl")"
  done
  grep -q '"split":"test"' "$tmp/$f.jsonl" || fail "no test evaluation line in $f.jsonl"
  grep '"split":"test"' "$tmp/$f.jsonl" | grep '"accuracy":' >/dev/null || fail "test line lacks accuracy"
done
a20=$(loss_at "$tmp/a.jsonl" 20); b20=$(loss_at "$tmp/b.jsonl" 20)
a30=$(loss_at "$tmp/a.jsonl" 30); b30=$(loss_at "$tmp/b.jsonl" 30)
[ -n "$a30" ] && [ "$a20" = "$b20" ] && [ "$a30" = "$b30" ] ||
  fail "resumed run differs: step 20 $a20 vs $b20, step 30 $a30 vs $b30"
# --mixed-precision bf16 (autocast: the linear and conv layers in bf16), MLP and CNN: close to
# f32, and measurably not f32.
# Under a sanitizer ten CNN steps take 15 s: its bf16 run is kept (the memory checks) and the
# f32 comparison skipped, which the normal build makes.
for model in mlp cnn; do
  "$exe" "${common[@]}" --model $model --steps 10 --log-every 10 --metrics "$tmp/bf_$model.jsonl" \
    --mixed-precision bf16 >/dev/null 2>"$tmp/err" || fail "--mixed-precision bf16 --model $model: $(cat "$tmp/err")"
  if [ -n "${WEFT_SANITIZER:-}" ] && [ $model = cnn ]; then
    echo "mnist_cli: the cnn bf16-vs-f32 comparison is skipped under $WEFT_SANITIZER (the normal build checks it)"
    continue
  fi
  "$exe" "${common[@]}" --model $model --steps 10 --log-every 10 --metrics "$tmp/f_$model.jsonl" >/dev/null 2>&1
  f10=$(loss_at "$tmp/f_$model.jsonl" 10); bf10=$(loss_at "$tmp/bf_$model.jsonl" 10)
  within "$bf10" "$f10" 0.02 0 "$model bf16 step-10 loss is not within 2% of f32's"
  differs "$bf10" "$f10" 1e-6 "$model bf16 step-10 loss"
done
# A checkpoint of another model is refused with a clear message.
if "$exe" --model cnn --load "$tmp/ck" --steps 1 2>"$tmp/err"; then fail "cnn loaded an mlp checkpoint"; fi
grep -q "mlp model" "$tmp/err" || fail "model mismatch not explained: $(cat "$tmp/err")"
# One epoch with the default settings learns: 84 % on an AVX2 machine, 83.95 % on an AVX-512
# one (the summation order of the vector width changes the rounding); untrained is ~10 %.
# Under a sanitizer (scripts/sanitize.sh sets WEFT_SANITIZER) the epoch takes minutes and checks
# learning, not memory: the steps above already ran every code path it would.
if [ -n "${WEFT_SANITIZER:-}" ]; then
  echo "mnist cli ok: resumed loss at step 30 $b30 equals uninterrupted $a30; the 1-epoch accuracy check is" \
       "skipped under $WEFT_SANITIZER (minutes of training that checks learning, not memory)"
  exit 0
fi
acc=$("$exe" --epochs 1 2>/dev/null | grep -o 'test_accuracy [0-9.]*' | cut -d' ' -f2)
[ -n "$acc" ] || fail "no test accuracy printed"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.83) }' || fail "test accuracy after one epoch $acc < 0.83"
echo "mnist cli ok: resumed loss at step 30 $b30 equals uninterrupted $a30; 1-epoch accuracy $acc"
