#!/usr/bin/env bash
# NaN is bad input: a non-finite loss stops weft-transformer and weft-mnist with a clear error
# naming the step (--on-nan skip drops those updates and goes on, --on-nan ignore trains on),
# a checkpoint is never written from non-finite state (the good ones stay byte-identical), and
# `sample` refuses a checkpoint whose weights are not finite, naming the parameter. With an
# mpirun: --fsdp --lr 1e30 at 2 ranks fails on both ranks within seconds.
# Usage: nonfinite_cli.sh TRANSFORMER MNIST CHECKPOINT [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
tf=$1 mnist=$2 ckpt=$3
mpirun=${4:-}
shift $(( $# > 3 ? 4 : 3 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
sums() { (cd "$1" && find . -type f ! -name .lock | sort | xargs sha256sum); }  # .lock: the writer's claim

cfg=(--n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 4 --warmup 0 --seed 0 --threads 1 --eval-every 0
     --eval-iters 1)
# A good checkpoint at step 2, then a run from it with a learning rate that blows the weights up.
"$tf" train "${cfg[@]}" --steps 2 --checkpoint-dir "$tmp/ck" >/dev/null 2>"$tmp/err" || fail "train: $(cat "$tmp/err")"
sums "$tmp/ck" >"$tmp/before"
if "$tf" train "${cfg[@]}" --steps 6 --lr 1e30 --resume "$tmp/ck" --checkpoint-dir "$tmp/ck" \
    >/dev/null 2>"$tmp/err"; then fail "transformer --lr 1e30 exited 0"; fi
grep -Eq "the loss is (nan|inf|-inf) at step [0-9]+" "$tmp/err" || fail "no loss error naming the step: $(cat "$tmp/err")"
grep -q "the newest checkpoint that resumes is $tmp/ck/step_00000002 (its weights gave the next step a finite loss" \
  "$tmp/err" || fail "no checkpoint that resumes named: $(cat "$tmp/err")"
sums "$tmp/ck" >"$tmp/after"
cmp -s "$tmp/before" "$tmp/after" || fail "checkpoints changed by the failed run: $(diff "$tmp/before" "$tmp/after")"
# Saving every step with --keep-last 1 while diverging: step 3's weights are finite but give step 4
# a non-finite loss. The message names step 2 (its weights gave step 3 a sane loss), not the
# newest, and rotation kept it; resuming from it works.
cp -r "$tmp/ck" "$tmp/ck_div"
if "$tf" train "${cfg[@]}" --steps 8 --lr 1e30 --resume "$tmp/ck_div" --checkpoint-dir "$tmp/ck_div" \
    --checkpoint-every 1 --keep-last 1 >/dev/null 2>"$tmp/err"; then fail "diverging run exited 0"; fi
grep -q "saved model and optimizer at step 3" "$tmp/err" || fail "step 3 was not saved: $(cat "$tmp/err")"
grep -q "the newest checkpoint that resumes is $tmp/ck_div/step_00000002 " "$tmp/err" ||
  fail "the diverging run does not name step 2: $(cat "$tmp/err")"
grep -q "keeping $tmp/ck_div/step_00000002 besides the 1 newest: the newest checkpoint known to resume" "$tmp/err" ||
  fail "keeping step 2 was not said: $(cat "$tmp/err")"
[ -f "$tmp/ck_div/step_00000002/index.json" ] || fail "rotation removed the checkpoint that resumes: $(ls "$tmp/ck_div")"
"$tf" train "${cfg[@]}" --steps 3 --resume "$tmp/ck_div/step_00000002" >/dev/null 2>"$tmp/err" ||
  fail "resuming from the named checkpoint failed: $(cat "$tmp/err")"
# Right after a resume the watch judges against the losses the run's checkpoints recorded: step 5's weights (after an
# update at --lr 10) give step 6 a finite loss about 5x the earlier ones, so the resumed run names step 4, not step 5
# (judged by finiteness alone, with no history, step 5 had been named and kept).
"$tf" train "${cfg[@]}" --steps 4 --checkpoint-dir "$tmp/ckh" --checkpoint-every 1 >/dev/null 2>"$tmp/err" || fail "$(cat "$tmp/err")"
"$tf" train "${cfg[@]}" --steps 5 --lr 10 --resume "$tmp/ckh" --checkpoint-dir "$tmp/ckh" >/dev/null 2>"$tmp/err" ||
  fail "$(cat "$tmp/err")"
if "$tf" train "${cfg[@]}" --steps 8 --lr 1e30 --resume "$tmp/ckh" --checkpoint-dir "$tmp/ckh" --checkpoint-every 1 \
    --keep-last 1 --metrics "$tmp/ckh.jsonl" --log-every 1 >/dev/null 2>"$tmp/err"; then fail "diverging run exited 0"; fi
differs "$(loss_at "$tmp/ckh.jsonl" 6)" 5.5 1.5 "step 6's loss after the update at --lr 10 (no spike to judge)"
grep -q "the newest checkpoint that resumes is $tmp/ckh/step_00000004 " "$tmp/err" && [ ! -e "$tmp/ckh/step_00000005" ] ||
  fail "the spike right after a resume was not judged: $(cat "$tmp/err"; ls "$tmp/ckh")"
# A run diverging from its first steps: step 1's weights give step 2 a loss far past step 1's, so no checkpoint is known
# to resume (the first 4 steps had been judged by finiteness alone: step 1, 2 or 3 was named and kept).
if "$tf" train "${cfg[@]}" --steps 30 --lr 1000 --checkpoint-dir "$tmp/ck4" --checkpoint-every 1 --metrics "$tmp/ck4.jsonl" \
    --log-every 1 >/dev/null 2>"$tmp/err"; then fail "--lr 1000 trained on"; fi
differs "$(loss_at "$tmp/ck4.jsonl" 2)" "$(loss_at "$tmp/ck4.jsonl" 1)" 2 "step 2's loss at --lr 1000 (no spike to judge)"
grep -q "no checkpoint on disk is known to resume" "$tmp/err" || fail "a run diverging from its start: $(cat "$tmp/err")"
# A diverging run's validation perplexity prints in e-notation past 1e9 (it had printed a number of 140 digits).
"$tf" train --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 4 --warmup 0 --seed 0 --threads 1 --eval-iters 1 \
  --steps 2 --lr 10 --eval-every 2 >"$tmp/out" 2>"$tmp/err" || fail "$(cat "$tmp/err")"
grep -Eq "val_loss [0-9]{2,}\.[0-9]{4} val_ppl [1-9]\.[0-9]{3}e\+[0-9]+$" "$tmp/out" || fail "val_ppl: $(cat "$tmp/out")"
# --on-nan skip gives up after --max-skipped-steps in a row, exit 1, naming a checkpoint.
if "$tf" train "${cfg[@]}" --steps 20 --lr 1e30 --on-nan skip --max-skipped-steps 3 --resume "$tmp/ck" \
    >/dev/null 2>"$tmp/err"; then fail "--on-nan skip never gave up"; fi
grep -q "the loss was not finite for 3 steps in a row (steps 4 to 6; --max-skipped-steps 3)" "$tmp/err" ||
  fail "--max-skipped-steps did not stop the run: $(cat "$tmp/err")"
grep -q "the newest checkpoint that resumes is $tmp/ck/step_00000002 " "$tmp/err" ||
  fail "giving up does not name the checkpoint: $(cat "$tmp/err")"

# Updates from a non-finite loss (--on-nan ignore) make the weights non-finite: saving is refused.
if "$tf" train "${cfg[@]}" --steps 3 --lr 1e30 --checkpoint-dir "$tmp/ck2" --on-nan ignore >/dev/null 2>"$tmp/err"; then
  fail "a checkpoint of non-finite weights was written"; fi
grep -Eq "refusing to write a checkpoint at step 3: parameter [a-z_.0-9]+ \((nan|inf|-inf) at element" "$tmp/err" ||
  fail "non-finite save not explained: $(cat "$tmp/err")"
[ -z "$(ls "$tmp/ck2" 2>/dev/null | grep step_ || true)" ] || fail "a step directory was written: $(ls "$tmp/ck2")"
# The refusal names the checkpoint to resume from, as a stop on a non-finite loss does.
cp -r "$tmp/ck" "$tmp/ck3"
if "$tf" train "${cfg[@]}" --steps 5 --lr 1e30 --resume "$tmp/ck3" --checkpoint-dir "$tmp/ck3" --checkpoint-every 1 \
    --on-nan ignore >/dev/null 2>"$tmp/err"; then fail "a checkpoint of non-finite weights was written"; fi
grep -Eq "refusing to write a checkpoint at step [345]: .* is not finite; the existing checkpoints are untouched; the \
newest checkpoint that resumes is $tmp/ck3/step_00000002 " "$tmp/err" || fail "the refusal's advice: $(cat "$tmp/err")"
# --on-nan skip counts the skipped steps, but a model whose validation loss is not finite is an
# error, not a finished run; --on-nan ignore exits 0 as before.
if "$tf" train "${cfg[@]}" --steps 4 --lr 1e30 --on-nan skip >/dev/null 2>"$tmp/err"; then
  fail "--on-nan skip exited 0 with a diverged model"; fi
grep -q "skipped its update (2 skipped)" "$tmp/err" ||
  fail "--on-nan skip does not report skipped steps: $(cat "$tmp/err")"
grep -Eq "the validation loss is (nan|inf) at step 4: the model has diverged" "$tmp/err" ||
  fail "--on-nan skip: no error for the non-finite validation loss: $(cat "$tmp/err")"
"$tf" train "${cfg[@]}" --steps 4 --lr 1e30 --on-nan ignore >"$tmp/out" 2>"$tmp/err" ||
  fail "--on-nan ignore failed: $(cat "$tmp/err")"
# A NaN prints as "nan" (x86's default NaN has its sign bit set: printf's "-nan").
grep -q "^step 4 train_loss nan val_loss nan" "$tmp/out" && ! grep -q -- "-nan" "$tmp/out" "$tmp/err" ||
  fail "--on-nan ignore: the losses are not printed as nan: $(cat "$tmp/out" "$tmp/err")"

# sample: weights holding a NaN (one element of ln_f.weight set in a consolidated file) are refused.
"$ckpt" consolidate "$tmp/ck" "$tmp/good.safetensors" >/dev/null 2>"$tmp/err" || fail "consolidate: $(cat "$tmp/err")"
"$tf" sample --checkpoint "$tmp/good.safetensors" --tokens 5 >/dev/null 2>"$tmp/err" || fail "sample: $(cat "$tmp/err")"
# Patch element 0 of ln_f.weight to a NaN (f32 0x7fc00000, little-endian) at its data offset:
# the file is an 8-byte header length, the JSON header, then the data.
cp "$tmp/good.safetensors" "$tmp/nan.safetensors"
hlen=$(od -An -t u8 -N 8 "$tmp/good.safetensors" | tr -d ' ')
entry=$(head -c $((8 + hlen)) "$tmp/good.safetensors" | tail -c "$hlen" | grep -o '"transformer.ln_f.weight":{[^}]*}')
grep -q '"dtype":"F32"' <<<"$entry" || fail "ln_f.weight is not F32 in the consolidated file: $entry"
off=$(grep -o '"data_offsets":\[[0-9]*' <<<"$entry" | grep -o '[0-9]*$')
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nan.safetensors" bs=1 seek=$((8 + hlen + off)) conv=notrunc 2>/dev/null
if "$tf" sample --checkpoint "$tmp/nan.safetensors" --tokens 5 >"$tmp/out" 2>"$tmp/err"; then
  fail "sample on NaN weights exited 0"; fi
grep -q '"transformer.ln_f.weight" holds nan at element 0' "$tmp/err" ||
  fail "sample on NaN weights does not name the parameter: $(cat "$tmp/err")"
[ "$(tr -d '\000' <"$tmp/out" | wc -c)" = "$(wc -c <"$tmp/out")" ] || fail "sample printed NUL bytes"

# weft-mnist: the same.
m=(--batch-size 32 --threads 1 --seed 1 --log-every 1 --data "$(mnist_small 1000)")
"$mnist" "${m[@]}" --steps 2 --save "$tmp/mk" >/dev/null 2>"$tmp/err" || fail "mnist: $(cat "$tmp/err")"
sums "$tmp/mk" >"$tmp/before"
if "$mnist" "${m[@]}" --steps 4 --lr 1e30 --load "$tmp/mk" --save "$tmp/mk" >/dev/null 2>"$tmp/err"; then
  fail "mnist --lr 1e30 exited 0"; fi
grep -Eq "the loss is (nan|inf|-inf) at step [0-9]+" "$tmp/err" || fail "mnist: no loss error: $(cat "$tmp/err")"
grep -q "the newest checkpoint that resumes is $tmp/mk/step_00000002" "$tmp/err" ||
  fail "mnist: the checkpoint to go back to is not named: $(cat "$tmp/err")"
sums "$tmp/mk" >"$tmp/after"
cmp -s "$tmp/before" "$tmp/after" || fail "mnist checkpoints changed: $(diff "$tmp/before" "$tmp/after")"
if "$mnist" "${m[@]}" --steps 3 --lr 1e30 --on-nan ignore --save "$tmp/mk2" >/dev/null 2>"$tmp/err"; then
  fail "mnist wrote a checkpoint of non-finite weights"; fi
grep -q "refusing to write a checkpoint at step 3: parameter" "$tmp/err" || fail "mnist save: $(cat "$tmp/err")"
[ -z "$(ls "$tmp/mk2" 2>/dev/null | grep step_ || true)" ] || fail "mnist wrote a step directory: $(ls "$tmp/mk2")"
# Adam's second moment overflowing while the loss and the weights stay finite (--lr 1e6): no checkpoint of that state
# (it had been written, and was then the newest, which no --load could resume).
if "$mnist" "${m[@]}" --steps 4 --lr 1e6 --save "$tmp/mk4" --checkpoint-every 1 >/dev/null 2>"$tmp/err"; then
  fail "mnist --lr 1e6 exited 0"; fi
grep -Eq "refusing to write a checkpoint at step [234]: optimizer state [a-z_.0-9]+ \((nan|inf|-inf) at element" \
  "$tmp/err" || fail "mnist: non-finite optimizer state saved: $(cat "$tmp/err")"
for s in "$tmp"/mk4/step_*; do "$ckpt" verify "$s" >/dev/null 2>&1 || fail "$s does not verify"; done
if "$mnist" "${m[@]}" --steps 3 --lr 1e30 --on-nan skip >/dev/null 2>"$tmp/err"; then
  fail "mnist --on-nan skip exited 0 with a diverged model"; fi
grep -q "skipped its update (2 skipped)" "$tmp/err" || fail "mnist --on-nan skip does not report: $(cat "$tmp/err")"
grep -Eq "the test loss is (nan|inf) after epoch 1: the model has diverged" "$tmp/err" ||
  fail "mnist --on-nan skip: no error for the non-finite test loss: $(cat "$tmp/err")"
"$mnist" "${m[@]}" --steps 3 --lr 1e30 --on-nan ignore >/dev/null 2>"$tmp/err" || fail "mnist ignore: $(cat "$tmp/err")"

# FSDP at 2 ranks: every rank stops with the message, none is left waiting.
if [ -n "$mpirun" ]; then
  if timeout 60 "$mpirun" -np 2 "${mpirun_args[@]}" "$tf" train --fsdp "${cfg[@]}" --steps 4 --lr 1e30 \
      >/dev/null 2>"$tmp/err"; then fail "--fsdp --lr 1e30 exited 0"; fi
  for r in 0 1; do
    grep -Eq "error on rank $r: .*the loss is (nan|inf|-inf) at step [0-9]+ \(the mean over 2 ranks\)" "$tmp/err" ||
      fail "rank $r did not stop with the message: $(cat "$tmp/err")"
  done
fi
echo "nonfinite_cli: all checks passed"
