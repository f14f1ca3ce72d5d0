#!/usr/bin/env bash
# End-to-end checks of weft-transformer on Debian's fortunes texts with a tiny model: the loss
# falls from ln(256) within 30 steps, metrics carry their fields, a run stopped at step 20 and
# resumed from its checkpoint logs the uninterrupted run's step-30 loss exactly, `sample`
# prints the asked number of bytes and the same tokens with its key/value cache as without, and
# stops at --eos, bad flags and data are clear errors, and (when an mpirun is
# given) --fsdp at 2 ranks logs the single-process losses and its checkpoint resumes and samples
# in one process, and samples sharded at 2 ranks as one process does.
# Usage: transformer_cli.sh EXE [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
exe=$1
mpirun=${2:-}
shift $(( $# > 1 ? 2 : 1 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within

"$exe" --help | grep "sample" >/dev/null || fail "--help does not list the sample subcommand"
"$exe" train --help | grep -- "--checkpoint-dir" >/dev/null || fail "train --help does not list --checkpoint-dir"
if "$exe" train --n-head 3 --d-model 32 --steps 1 2>"$tmp/err"; then fail "--n-head 3 --d-model 32 accepted"; fi
grep -q "does not divide --d-model" "$tmp/err" || fail "bad --n-head not explained: $(cat "$tmp/err")"
if "$exe" train --data "$tmp/nowhere" --steps 1 2>"$tmp/err"; then fail "missing data accepted"; fi
grep -q "nowhere" "$tmp/err" && grep -q "fortunes" "$tmp/err" || fail "missing data not explained: $(cat "$tmp/err")"
if "$exe" sample --checkpoint "$tmp/nowhere" 2>"$tmp/err"; then fail "missing checkpoint accepted"; fi
grep -q "no checkpoint" "$tmp/err" || fail "missing checkpoint not explained: $(cat "$tmp/err")"
# --device cuda without a usable GPU (no CUDA build, no visible device): a clear error naming
# why, for train and sample alike, before any data or checkpoint is read. Where a GPU is
# visible the checks do not apply (the device is accepted and the runs go on).
if "$exe" train --device cuda --data "$tmp/nowhere" --steps 1 2>"$tmp/err"; then fail "train on $tmp/nowhere passed"; fi
if ! grep -q "nowhere" "$tmp/err"; then
  grep -Eq -- "--device cuda: (no CUDA device is visible|weft was built without CUDA)" "$tmp/err" ||
    fail "train --device cuda failed without naming the problem: $(cat "$tmp/err")"
  if "$exe" sample --device cuda --checkpoint "$tmp/nowhere" 2>"$tmp/err"; then fail "sample --device cuda passed"; fi
  grep -Eq -- "--device cuda: (no CUDA device is visible|weft was built without CUDA)" "$tmp/err" ||
    fail "sample --device cuda failed without naming the problem: $(cat "$tmp/err")"
fi
if "$exe" train --device cuda:x --steps 1 2>"$tmp/err"; then fail "--device cuda:x accepted"; fi
grep -q "expected cpu, cuda or cuda:N" "$tmp/err" || fail "bad --device not explained: $(cat "$tmp/err")"

cfg=(--n-layer 2 --n-head 2 --d-model 32 --ctx 32 --batch-size 8 --steps 30 --warmup 3 --lr 3e-3 --seed 0
     --threads 1 --eval-every 0 --eval-iters 4)
"$exe" train "${cfg[@]}" --metrics "$tmp/a.jsonl" >/dev/null 2>"$tmp/a.err" || fail "train failed: $(cat "$tmp/a.err")"
# nanoGPT's count for L2 d32 ctx32 with a tied head: wte 8192 + wpe 1024 + 2 x 12704 + ln_f 64.
grep -q " 34688 parameters" "$tmp/a.err" || fail "parameter count is not 34688: $(head -1 "$tmp/a.err")"
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --stop-after 20 --checkpoint-dir "$tmp/ck" >/dev/null 2>&1
# The resumed run profiles from step 5: its first profiled step is the resumed one, 21.
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --resume "$tmp/ck" --profile 5 >"$tmp/b.txt" 2>&1
grep -qE '^# per-op profile of steps 21-30 ' "$tmp/b.txt" || fail "resumed profile not of steps 21-30: $(grep profile "$tmp/b.txt")"

for key in '"step":' '"loss":' '"lr":' '"tokens_per_s":' '"peak_bytes":'; do
  head -1 "$tmp/a.jsonl" | grep "$key" >/dev/null || fail "metrics line lacks $key: $(head -1 "$tmp/a.jsonl")"
done
grep -q '"split":"val"' "$tmp/a.jsonl" || fail "no validation line in the metrics"
a1=$(loss_at "$tmp/a.jsonl" 1); a10=$(loss_at "$tmp/a.jsonl" 10); a30=$(loss_at "$tmp/a.jsonl" 30)
b30=$(loss_at "$tmp/b.jsonl" 30)
awk -v l="$a1" 'BEGIN { exit !(l > 5.3 && l < 5.8) }' || fail "step-1 loss $a1 is not near ln(256) = 5.55"
# One batch's loss is noisy; the validation loss (4 fixed batches) is the steadier measure.
v30=$(grep '"split":"val"' "$tmp/a.jsonl" | grep -o '"loss":[^,}]*' | cut -d: -f2)
awk -v l="$a30" 'BEGIN { exit !(l < 4.7) }' || fail "step-30 loss $a30 is not clearly below 5.5"
awk -v l="$v30" 'BEGIN { exit !(l < 4.2) }' || fail "step-30 validation loss $v30 is not clearly below 5.5"
[ -n "$b30" ] && [ "$a30" = "$b30" ] || fail "resumed run's step-30 loss $b30 differs from $a30"

# --mixed-precision bf16 in one process (autocast): close to f32, and not f32 (bf16 products
# change the loss by more than f32 rounding does: 1e-6), also with the blocks recomputed in backward.
for extra in "" --activation-checkpointing; do
  "$exe" train "${cfg[@]}" --metrics "$tmp/bf.jsonl" --stop-after 10 --mixed-precision bf16 $extra >/dev/null \
      2>"$tmp/bf.err" || fail "--mixed-precision bf16 $extra failed: $(cat "$tmp/bf.err")"
  bf10=$(loss_at "$tmp/bf.jsonl" 10)
  within "$bf10" "$a10" 0.02 0 "bf16 $extra step-10 loss is not within 2% of f32's"
  differs "$bf10" "$a10" 1e-6 "bf16 $extra step-10 loss"
  rm "$tmp/bf.jsonl"
done

# --profile 9: one row per op of steps 9 and 10 (the evaluation after step 10 left out): the tied
# head's forward product (256 tokens x 256 classes x 32) once a step at a positive rate, and the
# time outside the ops a share of the step.
"$exe" train "${cfg[@]}" --stop-after 10 --profile 9 >"$tmp/prof.txt" 2>"$tmp/prof.err" ||
  fail "--profile 9 failed: $(cat "$tmp/prof.err")"
grep -qE '^# per-op profile of steps 9-10 \(.* a step [0-9.]+ ms on average\)$' "$tmp/prof.txt" ||
  fail "no profile header: $(cat "$tmp/prof.txt")"
awk -F'|' '$2 ~ /^ matmul 256x256x32 NT f32 $/ { found = 1; if ($3 + 0 != 1 || !($6 + 0 > 0)) bad = 1 }
  END { exit !(found && !bad) }' "$tmp/prof.txt" || fail "no well-formed row for the head's product: $(cat "$tmp/prof.txt")"
awk -F'|' '$2 ~ /framework/ { found = 1; if (!($5 + 0 >= 0 && $5 + 0 <= 100)) bad = 1 } END { exit !(found && !bad) }' \
  "$tmp/prof.txt" || fail "the time outside the ops is not a share of the step: $(cat "$tmp/prof.txt")"

# --activation-checkpointing: the same losses, less memory at the step's peak.
"$exe" train "${cfg[@]}" --metrics "$tmp/ac.jsonl" --stop-after 10 --activation-checkpointing >/dev/null 2>"$tmp/ac.err" ||
  fail "--activation-checkpointing run failed: $(cat "$tmp/ac.err")"
ac10=$(loss_at "$tmp/ac.jsonl" 10)
within "$ac10" "$a10" 1e-6 0 "--activation-checkpointing step-10 loss $ac10 differs from $a10"
peak_at() { grep "\"step\":$2[,}]" "$1" | grep -v '"split"' | grep -o '"peak_bytes":[^,}]*' | cut -d: -f2; }
pa=$(peak_at "$tmp/a.jsonl" 10); pc=$(peak_at "$tmp/ac.jsonl" 10)
awk -v a="$pa" -v c="$pc" 'BEGIN { exit !(c != "" && c + 0 < a + 0) }' ||
  fail "--activation-checkpointing peak $pc bytes is not below the plain run's $pa"

# nanoGPT's names and layouts in the checkpoint's index (tensors are "model.<name>"); a tied
# head is one parameter, repeated as lm_head.weight only by consolidation (an alias).
ck=$(ls -d "$tmp"/ck/step_* | tail -1)
[ "$(basename "$ck")" = step_00000020 ] || fail "latest checkpoint is $ck, expected step_00000020"
tr -d ' \n' <"$ck/index.json" >"$tmp/index.min"
for key in '"model.transformer.wte.weight":{"dtype":"F32","shape":[256,32]' \
           '"model.transformer.wpe.weight":{"dtype":"F32","shape":[32,32]' \
           '"model.transformer.h.1.attn.c_attn.weight":{"dtype":"F32","shape":[96,32]' \
           '"model.transformer.h.1.mlp.c_proj.weight":{"dtype":"F32","shape":[32,128]' \
           '"model.transformer.ln_f.bias":{"dtype":"F32","shape":[32]' \
           '"aliases":{"lm_head.weight":"transformer.wte.weight"}'; do
  grep -F "$key" "$tmp/index.min" >/dev/null || fail "checkpoint index lacks $key"
done
if grep -F '"model.lm_head' "$tmp/index.min" >/dev/null; then fail "tied head saved as its own tensor"; fi

# sample: the prompt, then exactly N bytes, then a newline.
"$exe" sample --checkpoint "$tmp/ck" --prompt "Q: " --tokens 40 --top-k 8 --temperature 0.8 --seed 2 >"$tmp/s.txt"
n=$(wc -c <"$tmp/s.txt")
[ "$n" -eq 44 ] || fail "sample printed $n bytes, expected 3 + 40 + 1"
[ "$(head -c 3 "$tmp/s.txt")" = "Q: " ] || fail "sample output does not start with the prompt"
# The key/value cache decodes what the whole-window path does, token for token, greedy and
# sampled, within the context (3 + 29 = 32 positions); it reports tokens/s.
for how in "--greedy" "--top-k 20 --top-p 0.9 --temperature 0.9 --seed 5"; do
  c=$("$exe" sample --checkpoint "$tmp/ck" --prompt "Q: " --tokens 29 $how --ids 2>"$tmp/c.err")
  n=$("$exe" sample --checkpoint "$tmp/ck" --prompt "Q: " --tokens 29 $how --ids --no-cache 2>/dev/null)
  [ "$c" = "$n" ] && [ "$(echo "$c" | tr ',' '\n' | wc -l)" -eq 29 ] ||
    fail "sample $how with the cache ($c) differs from --no-cache ($n)"
done
grep -q "tokens/s.*key/value cache" "$tmp/c.err" || fail "sample printed no tokens/s: $(cat "$tmp/c.err")"
# --eos stops after that token: the greedy ids up to its first occurrence.
eos=$(echo "$c" | cut -d, -f4)
e=$("$exe" sample --checkpoint "$tmp/ck" --prompt "Q: " --tokens 29 --top-k 20 --top-p 0.9 --temperature 0.9 --seed 5 \
      --ids --eos "$eos" 2>/dev/null)
want=$(echo "$c" | tr ',' '\n' | awk -v t="$eos" '{ print; if ($1 == t) exit }' | paste -sd,)
[ "$e" = "$want" ] || fail "--eos $eos printed $e, expected $want"

if [ -n "$mpirun" ]; then
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --metrics "$tmp/f.jsonl" --stop-after 20 \
      --checkpoint-dir "$tmp/ckf" >/dev/null 2>"$tmp/f.err" || fail "2-rank --fsdp run failed: $(cat "$tmp/f.err")"
  f10=$(loss_at "$tmp/f.jsonl" 10)
  within "$f10" "$a10" 1e-5 0 "2-rank --fsdp step-10 loss $f10 differs from single-process $a10"
  "$mpirun" -np 4 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --metrics "$tmp/f4.jsonl" --stop-after 10 \
      >/dev/null 2>"$tmp/f4.err" || fail "4-rank --fsdp run failed: $(cat "$tmp/f4.err")"
  f4=$(loss_at "$tmp/f4.jsonl" 10)
  within "$f4" "$a10" 1e-5 0 "4-rank --fsdp step-10 loss $f4 differs from single-process $a10"
  # bf16 mixed precision and keeping parameters after forward: same training, close losses.
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --metrics "$tmp/mp.jsonl" --stop-after 10 \
      --mixed-precision bf16 --reshard-after-forward false >/dev/null 2>"$tmp/mp.err" ||
    fail "--mixed-precision bf16 run failed: $(cat "$tmp/mp.err")"
  mp10=$(loss_at "$tmp/mp.jsonl" 10)
  within "$mp10" "$a10" 0.02 0 "bf16 step-10 loss $mp10 is not within 2% of f32's $a10"
  differs "$mp10" "$a10" 1e-6 "2-rank --fsdp bf16 step-10 loss"
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --metrics "$tmp/fac.jsonl" --stop-after 10 \
      --activation-checkpointing >/dev/null 2>"$tmp/fac.err" || fail "--fsdp --activation-checkpointing failed: $(cat "$tmp/fac.err")"
  fac10=$(loss_at "$tmp/fac.jsonl" 10)
  within "$fac10" "$a10" 1e-5 0 "2-rank --fsdp --activation-checkpointing step-10 loss $fac10 differs from single-process $a10"
  # NO_SHARD (every rank holds the model, gradients all-reduced) trains the same, and its
  # checkpoint resumes in one process.
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp --sharding-strategy NO_SHARD "${cfg[@]}" \
      --metrics "$tmp/ns.jsonl" --stop-after 10 --checkpoint-dir "$tmp/ckns" >/dev/null 2>"$tmp/ns.err" ||
    fail "--sharding-strategy NO_SHARD failed: $(cat "$tmp/ns.err")"
  ns10=$(loss_at "$tmp/ns.jsonl" 10)
  within "$ns10" "$a10" 1e-5 0 "2-rank NO_SHARD step-10 loss $ns10 differs from single-process $a10"
  "$exe" train "${cfg[@]}" --metrics "$tmp/ns.jsonl" --resume "$tmp/ckns" >/dev/null 2>&1
  ns30=$(loss_at "$tmp/ns.jsonl" 30)
  within "$ns30" "$a30" 1e-5 0 "single-process resume of the NO_SHARD checkpoint: step-30 loss $ns30, expected $a30"
  # The 2-rank checkpoint resumes in one process and samples there.
  "$exe" train "${cfg[@]}" --metrics "$tmp/f.jsonl" --resume "$tmp/ckf" >/dev/null 2>&1
  f30=$(loss_at "$tmp/f.jsonl" 30)
  within "$f30" "$a30" 1e-5 0 "single-process resume of the 2-rank checkpoint: step-30 loss $f30, expected $a30"
  "$exe" sample --checkpoint "$tmp/ckf" --prompt "A" --tokens 10 >"$tmp/sf.txt"
  [ "$(wc -c <"$tmp/sf.txt")" -eq 12 ] || fail "sampling the 2-rank checkpoint printed the wrong length"
  # Generation on the model sharded over 2 ranks: rank 0 prints what one process does.
  one=$("$exe" sample --checkpoint "$tmp/ckf" --prompt "Q: " --tokens 40 --top-k 20 --seed 3 --ids 2>/dev/null)
  two=$("$mpirun" -np 2 "${mpirun_args[@]}" "$exe" sample --fsdp --checkpoint "$tmp/ckf" --prompt "Q: " --tokens 40 \
          --top-k 20 --seed 3 --ids 2>"$tmp/sf.err") || fail "sample --fsdp at 2 ranks failed: $(cat "$tmp/sf.err")"
  [ "$one" = "$two" ] || fail "sample --fsdp at 2 ranks printed $two, one process $one"
  echo "fsdp: step-10 loss np2 $f10, np4 $f4, np2 bf16 $mp10, np2 checkpointed $fac10 (single $a10); resumed step-30 loss $f30 (single $a30)"
fi
echo "transformer cli ok: loss $a1 -> $a30 (val $v30) in 30 steps; resumed step-30 loss $b30; checkpointed step-10 loss $ac10, peak $pc vs $pa bytes"
