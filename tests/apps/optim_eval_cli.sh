#!/usr/bin/env bash
# weft-transformer's optimisation flags and evaluation: --lr-schedule (cosine, linear, constant,
# wsd with --decay-steps) and --min-lr give the learning rates the metrics log; AdamW's --beta1,
# --beta2 and --eps change the run and a resume with others is refused; validation lines carry
# the perplexity exp(loss); `eval` prints loss, perplexity and tokens of a checkpoint on a
# dataset's part (blocks of ctx + 1 tokens); bad values are named.
# Usage: optim_eval_cli.sh EXE
set -euo pipefail
exe=$1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, expect_error, loss_at, within

cfg=(--n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 4 --steps 6 --warmup 2 --lr 1e-2 --seed 0 --threads 1
     --eval-every 3 --eval-iters 1 --log-every 1)
lrs() { grep -v '"split"' "$1" | grep -o '"lr":[^,}]*' | cut -d: -f2 | tr '\n' ' '; }
# The lr each of the 6 steps used: warmup (step + 1) / 2 of 1e-2 over steps 1-2, then the decay
# from 1e-2 at step 3 towards --min-lr, which it reaches after the last step.
check_lrs() {  # check_lrs SCHEDULE WANT... [-- FLAGS...]
  local schedule=$1; shift
  local want=() got i
  while [ $# -gt 0 ] && [ "$1" != -- ]; do want+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  "$exe" train "${cfg[@]}" --lr-schedule "$schedule" "$@" --metrics "$tmp/$schedule.jsonl" >/dev/null 2>"$tmp/err" ||
    fail "--lr-schedule $schedule failed: $(cat "$tmp/err")"
  read -r -a got <<<"$(lrs "$tmp/$schedule.jsonl")"
  [ "${#got[@]}" = 6 ] || fail "--lr-schedule $schedule logged ${#got[@]} learning rates: ${got[*]}"
  for i in 0 1 2 3 4 5; do within "${got[$i]}" "${want[$i]}" 1e-8 1e-12 "--lr-schedule $schedule step $((i + 1)) lr"; done
}
check_lrs constant 0.005 0.01 0.01 0.01 0.01 0.01
# The gradient norm is logged when clipping measures it (default --clip 1), left out under --clip 0 (it had read 0).
[ "$(grep -v '"split"' "$tmp/constant.jsonl" | grep -c '"grad_norm":')" = 6 ] ||
  fail "grad_norm not logged at every step: $(cat "$tmp/constant.jsonl")"
"$exe" train "${cfg[@]}" --clip 0 --metrics "$tmp/noclip.jsonl" >/dev/null 2>"$tmp/err" || fail "--clip 0: $(cat "$tmp/err")"
! grep -q grad_norm "$tmp/noclip.jsonl" || fail "--clip 0 logged a gradient norm: $(head -2 "$tmp/noclip.jsonl")"
check_lrs linear 0.005 0.01 0.01 0.00775 0.0055 0.00325 -- --min-lr 1e-3
check_lrs cosine 0.005 0.01 0.01 0.0086819805 0.0055 0.0023180195 -- --min-lr 1e-3
check_lrs wsd 0.005 0.01 0.01 0.01 0.01 0.0055 -- --min-lr 1e-3 --decay-steps 2
# wsd's default decay (a fifth of the run, 1 step here) within what the warmup leaves; none after
# a warmup as long as the run (both had been refused, naming a --decay-steps never given).
rm "$tmp/wsd.jsonl"  # --metrics appends
check_lrs wsd 0.005 0.01 0.01 0.01 0.01 0.01 -- --min-lr 1e-3
saved=("${cfg[@]}") && cfg[13]=6 && rm "$tmp/wsd.jsonl"
check_lrs wsd 0.00166666666667 0.00333333333333 0.005 0.00666666666667 0.00833333333333 0.01
cfg=("${saved[@]}")
# A given warmup longer than the run ramps at its own rate to the end (it had been cut to 5 steps).
[ "${cfg[12]}" = --warmup ] || fail "cfg[12] is not --warmup"
saved=("${cfg[@]}") && cfg[13]=10 && rm "$tmp/linear.jsonl"  # --metrics appends
check_lrs linear 0.001 0.002 0.003 0.004 0.005 0.006
cfg=("${saved[@]}")
expect_error "--lr-schedule constant has none" train "${cfg[@]}" --lr-schedule constant --min-lr 1e-3
expect_error "--decay-steps is for --lr-schedule wsd" train "${cfg[@]}" --decay-steps 2
expect_error "--min-lr 0.5 is above --lr 0.01" train "${cfg[@]}" --min-lr 0.5
expect_error "--decay-steps 5 is more than the 4 steps after the warmup of 2" train "${cfg[@]}" --lr-schedule wsd --decay-steps 5
expect_error "--beta2: expected a number" train "${cfg[@]}" --beta2 1

# AdamW's betas and eps reach the optimizer, and a checkpoint keeps them.
"$exe" train "${cfg[@]}" --metrics "$tmp/a.jsonl" --checkpoint-dir "$tmp/ck" >/dev/null 2>&1 || fail "the plain run failed"
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --beta2 0.95 --eps 1e-6 >/dev/null 2>&1 || fail "--beta2 0.95 failed"
differs "$(loss_at "$tmp/b.jsonl" 6)" "$(loss_at "$tmp/a.jsonl" 6)" 1e-7 "--beta2 0.95 --eps 1e-6 step-6 loss"
expect_error "written with --beta2 0.999 but --beta2 is 0.95" train "${cfg[@]}" --beta2 0.95 --resume "$tmp/ck"
# Resuming with another --lr (here a longer run at 2e-2): the schedule of the flags decides the rate, and the run says
# so when it is not the checkpoint's (it had changed silently); the same flags say nothing.
[ "${cfg[10]} ${cfg[14]}" = "--steps --lr" ] || fail "cfg[10] is not --steps or cfg[14] not --lr"
longer=("${cfg[@]}") && longer[11]=8 && longer[15]=2e-2
"$exe" train "${longer[@]}" --resume "$tmp/ck" --checkpoint-dir "$tmp/ck2" >/dev/null 2>"$tmp/err" ||
  fail "resume with --lr 2e-2: $(cat "$tmp/err")"
grep -Eq "this run's schedule sets the learning rate of step 7, the next, to [0-9.e-]+; the checkpoint's was [0-9.e-]+" "$tmp/err" ||
  fail "resume with another --lr: no notice: $(cat "$tmp/err")"
"$exe" train "${cfg[@]}" --resume "$tmp/ck" >/dev/null 2>"$tmp/err" || fail "resume: $(cat "$tmp/err")"
! grep -q "sets the learning rate" "$tmp/err" || fail "resume with the same flags: a notice: $(cat "$tmp/err")"

# Validation lines: perplexity = exp(loss).
val=$(grep '"split":"val"' "$tmp/a.jsonl" | tail -1)
loss=$(echo "$val" | grep -o '"loss":[^,}]*' | cut -d: -f2); ppl=$(echo "$val" | grep -o '"perplexity":[^,}]*' | cut -d: -f2)
within "$ppl" "$(awk -v l="$loss" 'BEGIN { printf "%.12g", exp(l) }')" 1e-9 0 "validation perplexity"

# eval: blocks of 17 bytes of the validation part of the fortunes (257,667 bytes: 15,156 blocks).
"$exe" eval --from "$tmp/ck" --ctx 16 --batch-size 64 --threads 1 >"$tmp/eval.out" 2>"$tmp/eval.err" || fail "eval: $(cat "$tmp/eval.err")"
read -r _ eloss _ eppl _ etokens <"$tmp/eval.out"
[ "$etokens" = $((257667 / 17 * 16)) ] || fail "eval predicted $etokens tokens, not $((257667 / 17 * 16)): $(cat "$tmp/eval.out")"
within "$eppl" "$(awk -v l="$eloss" 'BEGIN { printf "%.12g", exp(l) }')" 1e-5 0 "eval perplexity"
within "$eloss" "$loss" 0.05 0 "eval loss against the run's last validation loss"
"$exe" eval --from "$tmp/ck" --ctx 8 --batch-size 7 --split train --threads 1 >"$tmp/eval2.out" 2>/dev/null || fail "eval --split train"
read -r _ tloss _ _ _ _ <"$tmp/eval2.out"
differs "$tloss" "$eloss" 1e-6 "eval --split train --ctx 8 loss"
expect_error "--ctx 17 is longer than" eval --from "$tmp/ck" --ctx 17
expect_error "no checkpoint at" eval --from "$tmp/nowhere"
printf 'short' >"$tmp/short.txt"
expect_error "shorter than one block of --ctx + 1 = 17" eval --from "$tmp/ck" --data "$tmp/short.txt" --split train
echo "optim_eval_cli: ok"
