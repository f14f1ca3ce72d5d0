#!/usr/bin/env bash
# weft-transformer on a dataset of examples (JSONL records, apps/transformer/example_data.h):
# prepare writes .labels beside the token files (and a text dataset prepared into the same
# directory drops them); train --init-from the chat fixture's model learns (the loss falls) and
# resumes, with LoRA too (on its tied embedding), and --pack (with activation checkpointing alike); eval reports the mean
# over the trained targets only, as a run's validation of every val example does; bad records and flags are named;
# with mpirun, --fsdp at 2 ranks logs the single-process losses (the loss is the mean over the
# global batch's targets, however the ranks split its rows) and --deterministic the same bits.
# Usage: examples_cli.sh EXE CHAT_DATA_DIR [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
exe=$1
chat=$2
mpirun=${3:-}
shift $(( $# > 2 ? 3 : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, expect_error, loss_at, within

# Every record the chatml template renders, eight times over (120 examples; 12 for validation).
for _ in 1 2 3 4 5 6 7 8; do cat "$chat/records.jsonl"; done >"$tmp/data.jsonl"
"$exe" prepare --tokenizer "$chat/chatml" --data "$tmp/data.jsonl" --out "$tmp/ds" >"$tmp/prep.out" 2>"$tmp/err" ||
  fail "prepare failed: $(cat "$tmp/err")"
grep -q "108 train and 12 val examples" "$tmp/prep.out" || fail "prepare: $(cat "$tmp/prep.out")"
[ -f "$tmp/ds/train.labels" ] && [ -f "$tmp/ds/val.labels" ] || fail "prepare wrote no .labels files"
# Missing one of its .labels files, a dataset of examples is refused (not trained as text).
cp -r "$tmp/ds" "$tmp/ds_half" && rm "$tmp/ds_half/train.labels"
expect_error "ds_half has val.labels but not train.labels" train --data "$tmp/ds_half" --init-from "$chat/model" --steps 1
# Another part's labels: the message names what differs (the count), not the digests both share.
cp -r "$tmp/ds" "$tmp/ds_swap" && cp "$tmp/ds_swap/train.labels" "$tmp/ds_swap/val.labels"
expect_error "ds_swap/val.labels does not belong to $tmp/ds_swap/val.tokens (" train --data "$tmp/ds_swap" --init-from \
  "$chat/model" --steps 1
grep -Eq "\([0-9]+ labels for [0-9]+ tokens\): prepare the dataset again" "$tmp/err" || fail "another part's labels: $(cat "$tmp/err")"

base=(--init-from "$chat/model" --data "$tmp/ds" --batch-size 4 --grad-accum 2 --lr 3e-3 --warmup 1 --seed 0 --threads 1
      --eval-every 0 --eval-iters 3 --log-every 1)
cfg=("${base[@]}" --ctx 64)
"$exe" train "${cfg[@]}" --steps 8 --metrics "$tmp/a.jsonl" >"$tmp/a.out" 2>"$tmp/a.err" || fail "train on examples failed: $(cat "$tmp/a.err")"
grep -q "examples: 108 train / 12 val" "$tmp/a.err" || fail "no examples line: $(cat "$tmp/a.err")"
a1=$(loss_at "$tmp/a.jsonl" 1); a8=$(loss_at "$tmp/a.jsonl" 8)
awk -v a="$a1" -v b="$a8" 'BEGIN { exit !(b < a - 0.3) }' || fail "the loss did not fall: step 1 $a1, step 8 $a8"

# Stopped after step 4 and resumed, a run ends as the whole run did.
"$exe" train "${cfg[@]}" --steps 8 --stop-after 4 --checkpoint-dir "$tmp/ck" >/dev/null 2>"$tmp/err" ||
  fail "the stopped run failed: $(cat "$tmp/err")"
"$exe" train "${cfg[@]}" --steps 8 --metrics "$tmp/r.jsonl" --resume "$tmp/ck" --checkpoint-dir "$tmp/ck" \
  >/dev/null 2>"$tmp/err" || fail "resume failed: $(cat "$tmp/err")"
[ "$(loss_at "$tmp/r.jsonl" 8)" = "$a8" ] || fail "resumed step 8 loss $(loss_at "$tmp/r.jsonl" 8), not $a8"

# --pack: several examples per row; the loss falls; activation checkpointing recomputes the
# blocks with the same documents (the same losses); a resume without --pack is refused.
"$exe" train "${cfg[@]}" --steps 8 --pack --metrics "$tmp/p.jsonl" --checkpoint-dir "$tmp/ckp" >/dev/null 2>"$tmp/p.err" ||
  fail "--pack failed: $(cat "$tmp/p.err")"
grep -q "the train ones packed into [0-9]* rows" "$tmp/p.err" || fail "no packing line: $(cat "$tmp/p.err")"
p1=$(loss_at "$tmp/p.jsonl" 1); p8=$(loss_at "$tmp/p.jsonl" 8)
awk -v a="$p1" -v b="$p8" 'BEGIN { exit !(b < a - 0.3) }' || fail "--pack: the loss did not fall: step 1 $p1, step 8 $p8"
"$exe" train "${cfg[@]}" --steps 8 --pack --activation-checkpointing --metrics "$tmp/pa.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "--pack --activation-checkpointing: $(cat "$tmp/err")"
for s in 1 8; do within "$(loss_at "$tmp/pa.jsonl" $s)" "$(loss_at "$tmp/p.jsonl" $s)" 1e-6 0 "--pack with AC, step $s"; done
expect_error "was written with --pack, and this run is without it" train "${cfg[@]}" --steps 9 --resume "$tmp/ckp"

# LoRA on the fixture's tied model: checkpoints hold the adapters (not the tied embedding, nor its
# alias lm_head.weight); a stopped run resumes to the uninterrupted run's loss.
lora=("${cfg[@]}" --steps 4 --lora-rank 4)
"$exe" train "${lora[@]}" --metrics "$tmp/l.jsonl" >/dev/null 2>"$tmp/err" || fail "LoRA: $(cat "$tmp/err")"
"$exe" train "${lora[@]}" --stop-after 2 --checkpoint-dir "$tmp/ckl" >/dev/null 2>"$tmp/err" ||
  fail "LoRA with checkpoints on a tied model: $(cat "$tmp/err")"
"$exe" train "${lora[@]}" --resume "$tmp/ckl" --checkpoint-dir "$tmp/ckl" --metrics "$tmp/l2.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "LoRA resume: $(cat "$tmp/err")"
[ "$(loss_at "$tmp/l2.jsonl" 4)" = "$(loss_at "$tmp/l.jsonl" 4)" ] ||
  fail "the resumed LoRA run's step-4 loss $(loss_at "$tmp/l2.jsonl" 4) differs from $(loss_at "$tmp/l.jsonl" 4)"

# eval: the val split's trained targets only (fewer than its tokens).
"$exe" eval --from "$chat/model" --data "$tmp/ds" --threads 1 >"$tmp/eval.out" 2>"$tmp/eval.err" ||
  fail "eval failed: $(cat "$tmp/eval.err")"
read -r _ eloss _ eppl _ etokens <"$tmp/eval.out"
grep -q "12 examples" "$tmp/eval.err" || fail "eval: $(cat "$tmp/eval.err")"
[ "$etokens" -gt 0 ] && [ "$etokens" -lt "$(grep -o 'and [0-9]* tokens' "$tmp/prep.out" | grep -o '[0-9]*')" ] ||
  fail "eval counted $etokens targets: $(cat "$tmp/eval.out")"
within "$eppl" "$(awk -v l="$eloss" 'BEGIN { printf "%.12g", exp(l) }')" 1e-5 0 "eval perplexity"

# A run's validation scores each val example once when its batches hold them all: eval's loss (--lr 1e-12 leaves the
# model as it was); with fewer slots than examples it says how many it scores (it had drawn slots at random, some
# examples twice and others never).
"$exe" train --init-from "$chat/model" --data "$tmp/ds" --batch-size 2 --lr 1e-12 --steps 1 --threads 1 \
  --metrics "$tmp/v.jsonl" >/dev/null 2>"$tmp/err" || fail "validation run: $(cat "$tmp/err")"
within "$(grep '"split":"val"' "$tmp/v.jsonl" | grep -o '"loss":[^,}]*' | cut -d: -f2)" "$eloss" 1e-6 0 \
  "a run's validation of every val example, against eval"
"$exe" train --init-from "$chat/model" --data "$tmp/ds" --batch-size 2 --eval-iters 3 --steps 1 --threads 1 \
  >/dev/null 2>"$tmp/err" || fail "validation run: $(cat "$tmp/err")"
grep -q "a validation scores 6 of the 12 val examples" "$tmp/err" || fail "no note of a partial validation: $(cat "$tmp/err")"

# A text dataset prepared into the directory is text again.
printf 'plain text, no records\n%.0s' $(seq 200) >"$tmp/plain.txt"
expect_error "made from JSONL records, and $tmp/plain.txt is read as text: prepare it first" train --data "$tmp/plain.txt" --pack --steps 1
"$exe" prepare --tokenizer "$chat/chatml" --data "$tmp/plain.txt" --out "$tmp/ds2" >/dev/null 2>&1 || fail "prepare text"
cp "$tmp/ds/train.labels" "$tmp/ds/val.labels" "$tmp/ds2/"
"$exe" prepare --tokenizer "$chat/chatml" --data "$tmp/plain.txt" --out "$tmp/ds2" >/dev/null 2>&1 || fail "prepare text"
[ ! -e "$tmp/ds2/train.labels" ] || fail "prepare of text left the .labels files of examples"

echo '{"prompt": [{"role": "user", "content": "x"}], "completion": [{"role": "assistant", "content": "y"}]}' >"$tmp/bad.jsonl"
expect_error "bad.jsonl:1: \"prompt\" must be a string, got array (conversational prompt and completion: give it as {\"messages\": [...]})" \
  prepare --tokenizer "$chat/chatml" --data "$tmp/bad.jsonl" --out "$tmp/bad"
echo '{"prompt": "x"}' >"$tmp/bad.jsonl"
expect_error "bad.jsonl:1: a record with \"prompt\" needs \"completion\" too" prepare --tokenizer "$chat/chatml" \
  --data "$tmp/bad.jsonl" --out "$tmp/bad"
# Records in a .json file (as datasets often ship them) are refused, alone or in a directory (they had been read as
# text, braces and keys trained on); a .json file of text is text.
mkdir "$tmp/jsondir" && cp "$chat/records.jsonl" "$tmp/jsondir/train.json" && echo 'plain' >"$tmp/jsondir/notes.json"
expect_error "train.json is JSON, which prepare would read as text: records go in a .jsonl file" prepare --tokenizer \
  "$chat/chatml" --data "$tmp/jsondir/train.json" --out "$tmp/bad"
expect_error "train.json is JSON, which prepare would read as text" prepare --tokenizer "$chat/chatml" --data \
  "$tmp/jsondir" --out "$tmp/bad"
"$exe" prepare --tokenizer "$chat/chatml" --data "$tmp/jsondir/notes.json" --out "$tmp/notes" >/dev/null 2>"$tmp/err" ||
  fail "a .json file of text: $(cat "$tmp/err")"
printf '%s\n' '{"text": "a"}' '{"messages": [{"role": "user", "content": "hi"}]}' >"$tmp/no_answer.jsonl"
expect_error "no_answer.jsonl:2: no token of the record is trained: a chat needs an assistant message" prepare \
  --tokenizer "$chat/chatml" --data "$tmp/no_answer.jsonl" --out "$tmp/bad"
expect_error "--chat-format renders the \"messages\" of JSONL records" prepare --tokenizer "$chat/chatml" \
  --data "$tmp/plain.txt" --out "$tmp/bad" --chat-format chatml
expect_error "--chat-format vicuna: not a chat format" prepare --tokenizer "$chat/chatml" --data "$tmp/data.jsonl" \
  --out "$tmp/bad" --chat-format vicuna
grep -v '"messages"' "$tmp/data.jsonl" >"$tmp/no_chats.jsonl"  # named even where no record would use it
expect_error "--chat-format vicuna: not a chat format" prepare --tokenizer "$chat/chatml" --data "$tmp/no_chats.jsonl" \
  --out "$tmp/bad" --chat-format vicuna
# Chats whose first 5 tokens hold no assistant token: a context of 4 skips them all.
grep '"messages"' "$tmp/data.jsonl" >"$tmp/chats.jsonl"
"$exe" prepare --tokenizer "$chat/chatml" --data "$tmp/chats.jsonl" --out "$tmp/dsc" >/dev/null 2>&1 || fail "prepare chats"
expect_error "no example of $tmp/dsc/train.tokens has a target that carries loss within the context 4 (36 skipped)" \
  train --init-from "$chat/model" --data "$tmp/dsc" --ctx 4 --steps 1 --threads 1

if [ -n "$mpirun" ]; then
  # 4 rows over 2 ranks: the ranks' rows hold different numbers of targets, so averaging the
  # ranks' means would not give the single-process loss.
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --steps 8 --metrics "$tmp/f.jsonl" \
    >/dev/null 2>"$tmp/err" || fail "--fsdp at 2 ranks failed: $(cat "$tmp/err")"
  for s in 1 4 8; do within "$(loss_at "$tmp/f.jsonl" $s)" "$(loss_at "$tmp/a.jsonl" $s)" 1e-5 0 "--fsdp step $s loss"; done
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --steps 8 --pack --metrics "$tmp/fp.jsonl" \
    >/dev/null 2>"$tmp/err" || fail "--fsdp --pack at 2 ranks failed: $(cat "$tmp/err")"
  for s in 1 8; do within "$(loss_at "$tmp/fp.jsonl" $s)" "$(loss_at "$tmp/p.jsonl" $s)" 1e-5 0 "--fsdp --pack step $s"; done
  det=("${cfg[@]}" --steps 3 --deterministic --virtual-batches 4)
  "$exe" train "${det[@]}" --metrics "$tmp/d1.jsonl" >/dev/null 2>"$tmp/err" || fail "--deterministic: $(cat "$tmp/err")"
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${det[@]}" --metrics "$tmp/d2.jsonl" >/dev/null 2>"$tmp/err" ||
    fail "--deterministic at 2 ranks failed: $(cat "$tmp/err")"
  [ "$(loss_at "$tmp/d2.jsonl" 3)" = "$(loss_at "$tmp/d1.jsonl" 3)" ] ||
    fail "--deterministic step 3: $(loss_at "$tmp/d2.jsonl" 3) at 2 ranks, $(loss_at "$tmp/d1.jsonl" 3) at 1"
else
  echo "SKIP: the --fsdp part needs mpirun (meson test's dist environment)"
fi
echo "PASS"
