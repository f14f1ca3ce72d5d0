#!/usr/bin/env bash
# weft-transformer train --lora-rank on the Hugging Face Llama fixture (tests/data/hf/llama):
# only the adapters train (their count printed; --plan counts their optimizer state), the loss
# falls, activation checkpointing keeps the losses, checkpoints hold the adapters and the base's
# digest (checked: a changed base is refused), a stopped run resumes exactly, a checkpoint
# samples as its export-hf --merge does and not as the base does; export-peft writes a peft
# adapter and --init-from a peft adapter directory (the export, the committed fixture) trains
# it; GPT-2's defaults adapt c_attn, c_proj and c_fc; bad flags and mismatched resumes are
# named; --base-dtype bf16 keeps the base in bf16 (a smaller peak; with --fsdp too); with mpirun,
# --fsdp at 2 ranks logs the single-process losses (bf16 within 2 %) and
# --deterministic gives the same bits at 1 and 2 ranks.
# Usage: lora_cli.sh EXE DATA_DIR [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
exe=$1
data=$2
mpirun=${3:-}
shift $(( $# > 2 ? 3 : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, expect_error, loss_at, within

common=(--ctx 32 --batch-size 8 --warmup 1 --lr 1e-2 --seed 0 --threads 1 --eval-every 0 --eval-iters 2 --log-every 1)
base=(--init-from "$data/llama" "${common[@]}")
run=("${base[@]}" --steps 6)
lora=(--lora-rank 4 --lora-alpha 8)
expect_error "--lora-alpha requires --lora-rank" train "${run[@]}" --lora-alpha 8
expect_error "need a --lora-rank above 0" train "${run[@]}" --lora-rank 0 --lora-targets q_proj
expect_error "target 'w_proj' names no module" train "${run[@]}" "${lora[@]}" --lora-targets q_proj,w_proj
expect_error "is a RMSNorm; only Linear modules" train "${run[@]}" "${lora[@]}" --lora-targets input_layernorm

"$exe" train "${run[@]}" "${lora[@]}" --metrics "$tmp/a.jsonl" >/dev/null 2>"$tmp/a.err" ||
  fail "train --lora-rank failed: $(cat "$tmp/a.err")"
# 2 layers x (q 4 x (64 + 64) + k and v 4 x (64 + 32) + o 4 x 128 + gate, up, down 3 x 4 x (64 + 64)).
grep -q "LoRA rank 4, alpha 8 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj: 6656 trainable parameters, the other 82240 frozen" \
  "$tmp/a.err" || fail "the trainable count is not 6656 of 88896: $(grep LoRA "$tmp/a.err")"
a1=$(loss_at "$tmp/a.jsonl" 1); a6=$(loss_at "$tmp/a.jsonl" 6)
awk -v a="$a1" -v b="$a6" 'BEGIN { exit !(b < a - 0.1) }' || fail "the loss did not fall: step 1 $a1, step 6 $a6"

# Activation checkpointing recomputes the adapters' hooks with their blocks: the same losses.
"$exe" train "${run[@]}" "${lora[@]}" --activation-checkpointing --metrics "$tmp/ac.jsonl" >/dev/null 2>&1 ||
  fail "--activation-checkpointing with --lora-rank failed"
for s in 1 6; do within "$(loss_at "$tmp/ac.jsonl" $s)" "$(loss_at "$tmp/a.jsonl" $s)" 1e-6 0 "--activation-checkpointing step-$s loss"; done
# The memory plan knows: AdamW's two f32 moments for the 6,656 adapter parameters only (53,248 bytes), and a
# step count of 4 bytes kept on the host for each of the 28 adapter tensors.
"$exe" train "${run[@]}" "${lora[@]}" --plan >"$tmp/plan.out" 2>&1 || fail "--plan with --lora-rank: $(cat "$tmp/plan.out")"
grep -Eq "optimizer state +0.1 MiB +53360$" "$tmp/plan.out" || fail "the plan's optimizer state: $(grep optimizer "$tmp/plan.out")"
"$exe" train "${run[@]}" "${lora[@]}" --metrics "$tmp/b.jsonl" --stop-after 3 --checkpoint-dir "$tmp/ck" >/dev/null 2>&1
# The same seven targets in another order (as a peft adapter's config may list them) resume it.
"$exe" train "${run[@]}" "${lora[@]}" --lora-targets down_proj,up_proj,gate_proj,o_proj,v_proj,k_proj,q_proj \
  --metrics "$tmp/b.jsonl" --resume "$tmp/ck" --checkpoint-dir "$tmp/ck" >/dev/null 2>"$tmp/b.err" ||
  fail "resumed with the targets in another order: $(cat "$tmp/b.err")"
[ "$(loss_at "$tmp/b.jsonl" 6)" = "$a6" ] || fail "the resumed run's step-6 loss $(loss_at "$tmp/b.jsonl" 6) differs from $a6"
# The checkpoint holds the adapters and their optimizer state, not the base: the base's weights'
# digest instead, checked whenever the checkpoint is read.
ck6=$(ls -d "$tmp"/ck/step_* | tail -1)
tr -d ' \n' <"$ck6/index.json" >"$tmp/index.min"
grep -qF '"model.model.layers.0.self_attn.q_proj.lora_A.weight"' "$tmp/index.min" || fail "the checkpoint lacks the adapters"
grep -qF '"optim.state.model.layers.0.mlp.down_proj.lora_B.weight.exp_avg"' "$tmp/index.min" || fail "the checkpoint lacks their optimizer state"
if grep -qF '"model.model.embed_tokens.weight"' "$tmp/index.min"; then fail "the checkpoint holds the frozen base"; fi
grep -qF '"lora_base_sha256"' "$tmp/index.min" || fail "the checkpoint does not record its base's digest"
[ "$(stat -c %s "$ck6/rank_00000.safetensors")" -lt 100000 ] || fail "the checkpoint file is $(stat -c %s "$ck6/rank_00000.safetensors") bytes"
expect_error "holds only LoRA adapters: resume it with --init-from $data/llama" train "${common[@]}" --steps 6 "${lora[@]}" --resume "$tmp/ck"
cp -r "$data/llama" "$tmp/base"
"$exe" train "${common[@]}" --init-from "$tmp/base" --steps 2 "${lora[@]}" --checkpoint-dir "$tmp/ckb" >/dev/null 2>&1 || fail "LoRA on a copy"
last=$(ls "$tmp/base"/model-*.safetensors | tail -1)
printf '\x11' | dd of="$last" bs=1 seek=$(( $(stat -c %s "$last") - 1 )) conv=notrunc status=none  # its last weight byte
expect_error "but that directory's weights have changed since" sample --from "$tmp/ckb" --tokens 1
expect_error "but that directory's weights have changed since" train "${common[@]}" --init-from "$tmp/base" --steps 3 \
  "${lora[@]}" --resume "$tmp/ckb"
cp -r "$tmp/base" "$tmp/other"  # another directory's other weights: the recorded base and the given one both named
expect_error "but the base given, $tmp/other, holds other weights" train "${common[@]}" --init-from "$tmp/other" \
  --steps 3 "${lora[@]}" --resume "$tmp/ckb"
grep -qF "trained on the weights of $tmp/base (sha256 " "$tmp/err" || fail "the recorded base is not named: $(cat "$tmp/err")"
expect_error "holds lora_alpha 8, lora_dropout 0, lora_rank 4" train "${run[@]}" --lora-rank 8 --resume "$tmp/ck"
expect_error "holds lora_alpha 8" train "${run[@]}" --resume "$tmp/ck"

# The checkpoint samples through its adapters: as the merged export does, not as the base does.
ids() { "$exe" sample --from "$1" --prompt "Hello" --tokens 12 --greedy --ids 2>/dev/null; }
expect_error "export-hf --merge folds them" export-hf --from "$tmp/ck" --out "$tmp/plain"
"$exe" export-hf --from "$tmp/ck" --out "$tmp/merged" --merge >/dev/null 2>"$tmp/m.err" || fail "export-hf --merge: $(cat "$tmp/m.err")"
grep -q "82240 parameters" "$tmp/m.err" || fail "the merged export is not the plain model: $(cat "$tmp/m.err")"
expect_error "has no LoRA adapters to --merge" export-hf --from "$tmp/merged" --out "$tmp/again" --merge
tuned=$(ids "$tmp/ck"); merged=$(ids "$tmp/merged"); untuned=$(ids "$data/llama")
[ -n "$tuned" ] && [ "$tuned" = "$merged" ] || fail "the checkpoint samples $tuned, its merged export $merged"
[ "$tuned" != "$untuned" ] || fail "the fine-tuned checkpoint samples as the base does ($untuned)"

# peft: the checkpoint's adapters out (export-peft), a peft adapter directory in (--init-from: its
# base, then its adapters; the committed fixture's base is "../../hf/llama").
"$exe" export-peft --from "$tmp/ck" --out "$tmp/adapter" >/dev/null 2>"$tmp/p.err" || fail "export-peft: $(cat "$tmp/p.err")"
[ -f "$tmp/adapter/adapter_config.json" ] && [ -f "$tmp/adapter/adapter_model.safetensors" ] || fail "export-peft wrote $(ls "$tmp/adapter")"
expect_error "holds no LoRA adapters" export-peft --from "$tmp/merged" --out "$tmp/adapter2"
for from in "$tmp/adapter" "$data/../peft/llama"; do
  "$exe" train "${common[@]}" --init-from "$from" --steps 2 --stop-after 1 >/dev/null 2>"$tmp/i.err" ||
    fail "--init-from the peft adapter $from: $(cat "$tmp/i.err")"
  grep -q "and the adapters of $from" "$tmp/i.err" || fail "--init-from $from did not load its adapters: $(cat "$tmp/i.err")"
done
# sample and export-hf --merge read an adapter directory as its base plus its adapters.
[ "$(ids "$tmp/adapter")" = "$tuned" ] || fail "the peft export samples $(ids "$tmp/adapter"), its checkpoint $tuned"
"$exe" export-hf --from "$tmp/adapter" --out "$tmp/merged2" --merge >/dev/null 2>&1 || fail "export-hf --merge of the adapter"
[ "$(ids "$tmp/merged2")" = "$tuned" ] || fail "the adapter's merged export samples $(ids "$tmp/merged2"), not $tuned"
grep -q "LoRA rank 4, alpha 8 on v_proj,q_proj,down_proj" "$tmp/i.err" || fail "the fixture's settings: $(grep LoRA "$tmp/i.err")"
expect_error "is a peft adapter, whose adapter_config.json sets the adapters" train "${common[@]}" --init-from "$tmp/adapter" \
  --steps 1 --lora-rank 2

# --base-dtype bf16: the frozen base held in bf16 (a smaller peak than the f32 base's, both under
# --mixed-precision bf16), the loss as the f32 base's within bf16's rounding; a stopped run resumes
# exactly; a resume with the other base dtype and the flag without LoRA or bf16 compute are refused.
bf=("${run[@]}" "${lora[@]}" --mixed-precision bf16)
peak() { grep -o "peak memory per rank [0-9.]* MiB ([0-9]* bytes)" "$1" | grep -o "([0-9]*" | tr -d '('; }
"$exe" train "${bf[@]}" --metrics "$tmp/b32.jsonl" >/dev/null 2>"$tmp/b32.err" || fail "bf16 compute: $(cat "$tmp/b32.err")"
"$exe" train "${bf[@]}" --base-dtype bf16 --metrics "$tmp/b16.jsonl" >/dev/null 2>"$tmp/b16.err" ||
  fail "--base-dtype bf16: $(cat "$tmp/b16.err")"
[ "$(peak "$tmp/b16.err")" -lt $(( $(peak "$tmp/b32.err") * 3 / 4 )) ] ||
  fail "--base-dtype bf16 peaked at $(peak "$tmp/b16.err") bytes, the f32 base at $(peak "$tmp/b32.err")"
within "$(loss_at "$tmp/b16.jsonl" 6)" "$(loss_at "$tmp/b32.jsonl" 6)" 0.01 0 "--base-dtype bf16 step-6 loss"
# The plan counts the base at 2 bytes: 6,656 adapter parameters x 4 + 82,240 base parameters x 2.
"$exe" train "${bf[@]}" --base-dtype bf16 --plan >"$tmp/plan.out" 2>&1 || fail "--base-dtype bf16 --plan: $(cat "$tmp/plan.out")"
grep -qE "parameters \(this rank's shards\) +[0-9.]+ MiB +191104$" "$tmp/plan.out" ||
  fail "the plan's parameters are not 191104 bytes: $(grep parameters "$tmp/plan.out")"
"$exe" train "${bf[@]}" --base-dtype bf16 --stop-after 3 --checkpoint-dir "$tmp/ck16" >/dev/null 2>&1 || fail "bf16 base, stopped"
"$exe" train "${bf[@]}" --base-dtype bf16 --resume "$tmp/ck16" --metrics "$tmp/b16r.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "bf16 base, resumed: $(cat "$tmp/err")"
[ "$(loss_at "$tmp/b16r.jsonl" 6)" = "$(loss_at "$tmp/b16.jsonl" 6)" ] || fail "bf16 base: the resumed step-6 loss differs"
expect_error "was written with --base-dtype bf16, and this run asks for f32" train "${bf[@]}" --resume "$tmp/ck16"
expect_error "--base-dtype bf16 needs --mixed-precision bf16" train "${run[@]}" "${lora[@]}" --base-dtype bf16
expect_error "it needs --lora-rank and --init-from" train "${run[@]}" --mixed-precision bf16 --base-dtype bf16

# GPT-2 from scratch: the default targets. 2 layers x 4 x ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32)).
"$exe" train --n-layer 2 --n-head 2 --d-model 32 --ctx 16 --batch-size 4 --steps 2 --threads 1 --eval-every 0 \
  --eval-iters 1 --lora-rank 4 --checkpoint-dir "$tmp/gck" >/dev/null 2>"$tmp/g.err" || fail "gpt2 --lora-rank failed: $(cat "$tmp/g.err")"
grep -q "LoRA rank 4, alpha 4 on c_attn,c_proj,c_fc: 4096 trainable" "$tmp/g.err" ||
  fail "gpt2's LoRA defaults: $(grep LoRA "$tmp/g.err")"
# Its adapters have no Hugging Face base for peft to put them on: export-peft points at export-hf --merge.
expect_error "model trained from scratch (no --init-from): peft puts adapters on a Hugging Face base" \
  export-peft --from "$tmp/gck" --out "$tmp/gpeft"
[ ! -e "$tmp/gpeft" ] || fail "export-peft of a run from scratch wrote $tmp/gpeft"

[ -n "$mpirun" ] || { echo "lora_cli: no mpirun given: the 2-rank runs are not run"; exit 0; }
"$mpirun" "${mpirun_args[@]}" -np 2 "$exe" train "${run[@]}" "${lora[@]}" --fsdp --metrics "$tmp/f.jsonl" >/dev/null 2>"$tmp/f.err" ||
  fail "--fsdp --lora-rank at 2 ranks failed: $(cat "$tmp/f.err")"
for s in 1 3 6; do within "$(loss_at "$tmp/f.jsonl" $s)" "$(loss_at "$tmp/a.jsonl" $s)" 1e-5 0 "2-rank step-$s loss"; done
# A 2-rank checkpoint of adapters only (each rank its shards), resumed in one process.
"$mpirun" "${mpirun_args[@]}" -np 2 "$exe" train "${run[@]}" "${lora[@]}" --fsdp --stop-after 3 --checkpoint-dir "$tmp/ckf" \
  >/dev/null 2>"$tmp/ckf.err" || fail "--fsdp --checkpoint-dir at 2 ranks: $(cat "$tmp/ckf.err")"
"$exe" train "${run[@]}" "${lora[@]}" --resume "$tmp/ckf" --metrics "$tmp/r.jsonl" >/dev/null 2>"$tmp/r.err" ||
  fail "resuming the 2-rank LoRA checkpoint in one process: $(cat "$tmp/r.err")"
within "$(loss_at "$tmp/r.jsonl" 6)" "$a6" 1e-5 0 "step-6 loss resumed at 1 rank from 2"
# bf16 mixed precision under FSDP: bf16 base and adapters gathered, f32 adapter gradients and steps.
"$mpirun" "${mpirun_args[@]}" -np 2 "$exe" train "${run[@]}" "${lora[@]}" --fsdp --mixed-precision bf16 \
  --metrics "$tmp/bf.jsonl" >/dev/null 2>"$tmp/bf.err" || fail "--fsdp --mixed-precision bf16 --lora-rank: $(cat "$tmp/bf.err")"
within "$(loss_at "$tmp/bf.jsonl" 6)" "$a6" 0.02 0 "bf16 step-6 loss"
differs "$(loss_at "$tmp/bf.jsonl" 6)" "$a6" 1e-6 "bf16 step-6 loss"
# The bf16 base under FSDP: each block's adapters a group of their own (f32), apart from its base.
"$mpirun" "${mpirun_args[@]}" -np 2 "$exe" train "${bf[@]}" --base-dtype bf16 --fsdp --metrics "$tmp/bf16f.jsonl" \
  >/dev/null 2>"$tmp/err" || fail "--fsdp --base-dtype bf16 at 2 ranks failed: $(cat "$tmp/err")"
within "$(loss_at "$tmp/bf16f.jsonl" 6)" "$(loss_at "$tmp/b16.jsonl" 6)" 0.01 0 "--fsdp --base-dtype bf16 step-6 loss"
det=("${base[@]}" "${lora[@]}" --deterministic --virtual-batches 4 --steps 3)
"$exe" train "${det[@]}" --metrics "$tmp/d1.jsonl" >/dev/null 2>"$tmp/d1.err" || fail "--deterministic at 1 rank failed: $(cat "$tmp/d1.err")"
"$mpirun" "${mpirun_args[@]}" -np 2 "$exe" train "${det[@]}" --fsdp --metrics "$tmp/d2.jsonl" \
  >/dev/null 2>"$tmp/d2.err" || fail "--deterministic --fsdp at 2 ranks failed: $(cat "$tmp/d2.err")"
[ "$(loss_at "$tmp/d1.jsonl" 3)" = "$(loss_at "$tmp/d2.jsonl" 3)" ] && [ -n "$(loss_at "$tmp/d1.jsonl" 3)" ] ||
  fail "--deterministic step-3 loss: $(loss_at "$tmp/d1.jsonl" 3) at 1 rank, $(loss_at "$tmp/d2.jsonl" 3) at 2"
echo "lora_cli: ok"
