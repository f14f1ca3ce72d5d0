#!/usr/bin/env bash
# weft-transformer on a token dataset end to end: `prepare` with the GPT-2-style fixture
# tokenizer (tests/data/tokenizers) on a few fortunes files, then `train --data DIR`: the loss
# falls from ln(2000), a run stopped at step 20 and resumed logs the uninterrupted step-30 loss
# bit for bit, `sample --tokenizer` prints text (and without it, or with another tokenizer, the
# error names --tokenizer),
# a training file larger than WEFT_MEMORY_LIMIT trains (it is memory-mapped, never read into
# weft's memory) with a peak RSS far below the file's size, and (given mpirun) --fsdp at 2
# ranks logs the single-process step-10 loss and, its token file truncated under it, stops naming
# the file and the rank.
# Usage: tokens_cli.sh EXE TOKENIZER_DIR [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
exe=$1
tokenizer_dir=$2
tokenizer=$2/gpt2/tokenizer.json
mpirun=${3:-}
shift $(( $# > 2 ? 3 : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within

mkdir "$tmp/texts"
for f in computers linux science; do cp "/usr/share/games/fortunes/$f" "$tmp/texts/"; done
"$exe" prepare --tokenizer "$tokenizer" --data "$tmp/texts" --out "$tmp/ds" >"$tmp/prep.out" 2>"$tmp/prep.err" ||
  fail "prepare failed: $(cat "$tmp/prep.err")"
grep -q "train and .* val tokens from .* bytes in 3 file(s)" "$tmp/prep.out" || fail "prepare's summary: $(cat "$tmp/prep.out")"
grep -q "prepare 3/3" "$tmp/prep.err" || fail "no progress line from prepare: $(cat "$tmp/prep.err")"
cmp -s "$tokenizer" "$tmp/ds/tokenizer.json" || fail "the dataset's tokenizer.json is not a copy of the tokenizer"

model=(--n-layer 2 --n-head 2 --d-model 32 --ctx 32 --batch-size 8 --warmup 3 --lr 3e-3 --seed 0 --threads 1
       --eval-every 0 --eval-iters 4)
cfg=(--data "$tmp/ds" "${model[@]}" --steps 30)
"$exe" train "${cfg[@]}" --metrics "$tmp/a.jsonl" >/dev/null 2>"$tmp/a.err" || fail "train failed: $(cat "$tmp/a.err")"
grep -q "train / .* val tokens from 2 file(s)" "$tmp/a.err" || fail "train does not report tokens: $(head -1 "$tmp/a.err")"
# A tied GPT-2 with a 2,000-token vocabulary: wte 64000 + wpe 1024 + 2 x 12704 + ln_f 64.
grep -q " 90496 parameters" "$tmp/a.err" || fail "parameter count is not 90496: $(head -1 "$tmp/a.err")"
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --stop-after 20 --checkpoint-dir "$tmp/ck" >/dev/null 2>&1
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --resume "$tmp/ck" >/dev/null 2>&1
# A token file given as --data is not text (it had trained on its header and ids as bytes): its directory is named.
for cmd in "train --steps 1" "eval --from $tmp/ck"; do
  # shellcheck disable=SC2086
  if "$exe" $cmd --data "$tmp/ds/train.tokens" >/dev/null 2>"$tmp/err"; then fail "$cmd took a token file as text"; fi
  grep -qF "$tmp/ds/train.tokens is a token file of \`weft-transformer prepare\`, not text: pass its dataset's directory ($tmp/ds)" \
    "$tmp/err" || fail "$cmd: the token file as --data is not named: $(cat "$tmp/err")"
done
a1=$(loss_at "$tmp/a.jsonl" 1); a30=$(loss_at "$tmp/a.jsonl" 30); b30=$(loss_at "$tmp/b.jsonl" 30)
awk -v l="$a1" 'BEGIN { exit !(l > 7.3 && l < 7.9) }' || fail "step-1 loss $a1 is not near ln(2000) = 7.60"
awk -v l="$a30" 'BEGIN { exit !(l < 6.8) }' || fail "step-30 loss $a30 is not clearly below 7.6"
[ -n "$b30" ] && [ "$a30" = "$b30" ] || fail "resumed run's step-30 loss $b30 differs from $a30"

"$exe" sample --from "$tmp/ck" --tokenizer "$tmp/ds/tokenizer.json" --prompt "The computer " --tokens 12 \
  >"$tmp/s.out" 2>"$tmp/s.err" || fail "sample --tokenizer failed: $(cat "$tmp/s.err")"
head -c 13 "$tmp/s.out" | grep -q "^The computer " || fail "sample does not start with the prompt: $(cat "$tmp/s.out")"
[ "$(wc -c <"$tmp/s.out")" -gt 15 ] || fail "sample printed no text after the prompt: $(cat "$tmp/s.out")"
if "$exe" sample --from "$tmp/ck" --prompt "x" --tokens 2 2>"$tmp/err"; then fail "sampling tokens as bytes accepted"; fi
# Another tokenizer.json (here one byte longer) is not the one the checkpoint records.
{ cat "$tmp/ds/tokenizer.json"; echo; } >"$tmp/other.json"
if "$exe" sample --from "$tmp/ck" --tokenizer "$tmp/other.json" --prompt "x" --tokens 2 2>"$tmp/err"; then
  fail "sampling with another tokenizer accepted"
fi
grep -q "is not the tokenizer $tmp/ck was trained with" "$tmp/err" || fail "another tokenizer not named: $(cat "$tmp/err")"
grep -q -- "--tokenizer" "$tmp/err" || fail "sampling without --tokenizer not explained: $(cat "$tmp/err")"
# Without its tokenizer a prompt's bytes are not the model's ids (refused, --ids too); --prompt-ids gives them, and
# prints what --tokenizer's encoding of the same text prints (317,979: "The computer" in the fixture, by `tokenizers`).
if "$exe" sample --from "$tmp/ck" --prompt "x" --tokens 3 --ids 2>"$tmp/err"; then fail "a byte prompt for a token model"; fi
grep -q "was trained on the ids of a tokenizer (sha256 [0-9a-f]*), which a prompt's bytes are not" "$tmp/err" ||
  fail "a byte prompt for a token model: $(cat "$tmp/err")"
"$exe" sample --from "$tmp/ck" --tokenizer "$tmp/ds/tokenizer.json" --prompt "The computer" --tokens 0 --ids --logits-out \
  "$tmp/text.safetensors" >/dev/null 2>"$tmp/err" || fail "$(cat "$tmp/err")"
"$exe" sample --from "$tmp/ck" --prompt-ids 317,979 --tokens 3 --greedy --ids >"$tmp/ids.out" --logits-out \
  "$tmp/ids.safetensors" 2>"$tmp/err" || fail "sample --prompt-ids: $(cat "$tmp/err")"
cmp -s "$tmp/text.safetensors" "$tmp/ids.safetensors" || fail "--prompt-ids 317,979 is not \"The computer\"'s encoding"
"$exe" sample --from "$tmp/ck" --tokenizer "$tmp/ds/tokenizer.json" --prompt-ids 317,979 --tokens 3 --greedy \
  >"$tmp/pi.out" 2>"$tmp/err" && grep -q "^The computer" "$tmp/pi.out" || fail "--prompt-ids as text: $(cat "$tmp/pi.out" "$tmp/err")"
# eval reads data in the model's tokens only: the dataset it trained on, not text as bytes, nor
# (for a model trained on bytes) a token dataset.
"$exe" eval --from "$tmp/ck" --data "$tmp/ds" --threads 1 >/dev/null 2>"$tmp/err" || fail "eval failed: $(cat "$tmp/err")"
expect_error "texts/linux holds text (bytes), and $tmp/ck reads tokens of tokenizer sha256" eval --from "$tmp/ck" \
  --data "$tmp/texts/linux"
"$exe" train --data "$tmp/texts/linux" "${model[@]}" --steps 4 --checkpoint-dir "$tmp/ck_bytes" >/dev/null 2>&1 ||
  fail "training on bytes failed"
expect_error "ds holds tokens of tokenizer sha256" eval --from "$tmp/ck_bytes" --data "$tmp/ds"
grep -Eq '^[0-9]+,[0-9]+,[0-9]+$' "$tmp/ids.out" || fail "sample --ids printed: $(cat "$tmp/ids.out")"

# A SentencePiece-style tokenizer (Llama 2's published form, tests/data/tokenizers/llama2):
# prepare puts its template's <s> (id 1) before each file, and sample prints the text as it
# comes: "▁" back to spaces (a continuation keeps its first space), byte tokens to bytes.
sp=$tokenizer_dir/llama2/tokenizer.json
"$exe" prepare --tokenizer "$sp" --data "$tmp/texts" --out "$tmp/sp" --eos "</s>" >/dev/null 2>"$tmp/err" ||
  fail "prepare with a SentencePiece-style tokenizer: $(cat "$tmp/err")"
[ "$(od -An -tu2 -j128 -N2 "$tmp/sp/train.tokens" | tr -d ' ')" = 1 ] || fail "prepare did not put <s> first"
"$exe" train --data "$tmp/sp" "${model[@]}" --steps 30 --checkpoint-dir "$tmp/ck_sp" >/dev/null 2>"$tmp/err" ||
  fail "train on the SentencePiece-style dataset: $(cat "$tmp/err")"
"$exe" sample --from "$tmp/ck_sp" --tokenizer "$tmp/sp/tokenizer.json" --prompt "The computer" --tokens 40 \
  --temperature 1 --seed 1 >"$tmp/sp.out" 2>"$tmp/err" || fail "sample with a SentencePiece-style tokenizer: $(cat "$tmp/err")"
head -c 12 "$tmp/sp.out" | grep -q "^The computer" || fail "sample does not start with the prompt: $(cat "$tmp/sp.out")"
! grep -q $'\xe2\x96\x81' "$tmp/sp.out" || fail "sample printed the tokens' \"▁\": $(cat "$tmp/sp.out")"
tail -c +13 "$tmp/sp.out" | grep -q " " || fail "sample's continuation lost its spaces: $(cat "$tmp/sp.out")"
# Drawn almost uniformly, the tokens include byte tokens that make no character: printed as U+FFFD, as the
# tokenizer's decode (and `tokenizers`') gives them, so stdout stays UTF-8 (the raw bytes had been written).
"$exe" sample --from "$tmp/ck_sp" --tokenizer "$tmp/sp/tokenizer.json" --prompt "The computer" --tokens 400 \
  --temperature 50 --seed 3 --eos none >"$tmp/hot.out" 2>"$tmp/err" || fail "sample at temperature 50: $(cat "$tmp/err")"
expect_error "--prompt is not valid UTF-8 text" sample --from "$tmp/ck_sp" --tokenizer "$tmp/sp/tokenizer.json" --prompt $'ok\xff' --tokens 1
grep -q $'\xef\xbf\xbd' "$tmp/hot.out" || fail "no byte token that makes no character was drawn: choose another seed"
iconv -f UTF-8 -t UTF-8 "$tmp/hot.out" >/dev/null 2>&1 || fail "sample printed bytes that are not UTF-8"

# Damaged token files are refused at load, naming the file and what is wrong: an id past the
# vocabulary (token 5 set to 65535), and train and val files whose vocabularies differ.
cp -r "$tmp/ds" "$tmp/bad_id" && printf '\xff\xff' | dd of="$tmp/bad_id/train.tokens" bs=1 seek=138 conv=notrunc status=none
if "$exe" train --data "$tmp/bad_id" "${model[@]}" --steps 4 >/dev/null 2>"$tmp/err"; then
  fail "trained on an id past the vocabulary"; fi
grep -q "token file $tmp/bad_id/train.tokens: token 5 (of [0-9]*) is id 65535, outside its vocabulary of 2000" \
  "$tmp/err" || fail "an id past the vocabulary is not named: $(cat "$tmp/err")"
cp -r "$tmp/ds" "$tmp/bad_vocab" && printf '\xd1\x07' | dd of="$tmp/bad_vocab/val.tokens" bs=1 seek=24 conv=notrunc status=none
if "$exe" train --data "$tmp/bad_vocab" "${model[@]}" --steps 4 >/dev/null 2>"$tmp/err"; then
  fail "trained on files with different vocabularies"; fi
grep -q "train.tokens has a vocabulary of 2000 tokens but $tmp/bad_vocab/val.tokens of 2001" "$tmp/err" ||
  fail "the vocabulary mismatch is not named as such: $(cat "$tmp/err")"
# --tokenizer may name a directory holding tokenizer.json (a dataset or a model directory).
"$exe" prepare --tokenizer "$tmp/ds" --data "$tmp/texts" --out "$tmp/ds2" >/dev/null 2>"$tmp/err" ||
  fail "prepare --tokenizer DIR: $(cat "$tmp/err")"
cmp -s "$tmp/ds/train.tokens" "$tmp/ds2/train.tokens" || fail "prepare --tokenizer DIR made other tokens"
if "$exe" prepare --tokenizer "$tmp/texts" --data "$tmp/texts" --out "$tmp/ds3" >/dev/null 2>"$tmp/err"; then
  fail "prepare took a directory without tokenizer.json"; fi
grep -q "the tokenizer $tmp/texts is a directory without a tokenizer.json" "$tmp/err" ||
  fail "a tokenizer directory without tokenizer.json: $(cat "$tmp/err")"

# A 192 MB training file under a 64 MB WEFT_MEMORY_LIMIT: the header of prepare's file with a
# count of 96M tokens, then zeros (token 0), and the peak RSS stays far below the file's size.
mkdir "$tmp/big"
cp "$tmp/ds/val.tokens" "$tmp/ds/tokenizer.json" "$tmp/big/"
{ head -c 16 "$tmp/ds/train.tokens"; printf '\x00\x00\x00\x06\x00\x00\x00\x00'; head -c 128 "$tmp/ds/train.tokens" | tail -c 104
  head -c 201326592 /dev/zero; } >"$tmp/big/train.tokens"
WEFT_MEMORY_LIMIT=64M /usr/bin/time -f "%M" -o "$tmp/rss" "$exe" train --data "$tmp/big" "${model[@]}" --steps 3 \
  >/dev/null 2>"$tmp/big.err" || fail "training on a file larger than WEFT_MEMORY_LIMIT failed: $(tail -3 "$tmp/big.err")"
grep -q "100663296 train" "$tmp/big.err" || fail "the big file's tokens were not counted: $(head -1 "$tmp/big.err")"
rss_kb=$(tail -1 "$tmp/rss")
if [ -n "${WEFT_SANITIZER:-}" ]; then  # its shadow memory and quarantine are part of the RSS
  echo "not checked under $WEFT_SANITIZER: the peak RSS (${rss_kb} KB) of the 192 MB file's run"
else
  [ "$rss_kb" -lt 150000 ] || fail "peak RSS ${rss_kb} KB while training on a 192 MB file: it was read into memory"
  echo "a 192 MB token file trained under WEFT_MEMORY_LIMIT=64M with a peak RSS of ${rss_kb} KB"
fi

if [ -n "$mpirun" ]; then
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp "${cfg[@]}" --stop-after 10 --metrics "$tmp/f.jsonl" \
    >/dev/null 2>"$tmp/f.err" || fail "--fsdp at 2 ranks failed: $(tail -5 "$tmp/f.err")"
  within "$(loss_at "$tmp/f.jsonl" 10)" "$(loss_at "$tmp/a.jsonl" 10)" 1e-5 0 "--fsdp 2-rank step-10 loss"
  # The training file truncated in place while both ranks read it: the job ends (not a bus error, not
  # a hang), and a rank that reads past the new end names the file and itself.
  cp -r "$tmp/ds" "$tmp/cut"
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" train --fsdp --data "$tmp/cut" "${model[@]}" --steps 1000000 \
    --metrics "$tmp/cut.jsonl" >/dev/null 2>"$tmp/cut.err" &
  job=$!
  for _ in $(seq 600); do [ -s "$tmp/cut.jsonl" ] && break; sleep 0.1; done
  truncate -s 4096 "$tmp/cut/train.tokens"
  if wait "$job"; then fail "a 2-rank run whose token file was truncated under it ended well"; fi
  grep -qE "error on rank [01]: transformer: token file $tmp/cut/train.tokens became shorter while it was read" \
    "$tmp/cut.err" || fail "the truncated token file at 2 ranks: $(head -5 "$tmp/cut.err")"
fi
echo "tokens_cli: all checks passed"
