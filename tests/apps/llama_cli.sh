#!/usr/bin/env bash
# weft-transformer --arch llama end to end on Debian's fortunes texts with a tiny model (grouped-
# query attention, untied head): the loss falls, the parameter count is the Llama family's,
# Hugging Face's names in the checkpoint, a stopped run resumes exactly, activation
# checkpointing keeps the losses; with mpirun, --fsdp at 2 and 4 ranks logs the single-process
# losses (bf16 within 2 %, --memory-budget the same), --init-from a Hugging Face model under
# --fsdp starts at the single-process loss, and export-hf of the 2-rank checkpoint samples the
# same greedy ids as the checkpoint itself; the Hugging Face fixtures sample the same ids with and
# without the key/value cache and sharded at 2 ranks (sample --fsdp); bad flags are named.
# Usage: llama_cli.sh EXE DATA_DIR [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
exe=$1
data=$2
mpirun=${3:-}
shift $(( $# > 2 ? 3 : 2 ))
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, expect_error, loss_at, within

expect_error "--n-kv-head is for --arch llama" train --n-kv-head 2 --steps 1
expect_error "--n-kv-head 3 must divide --n-head 4" train --arch llama --n-head 4 --n-kv-head 3 --d-model 32 --steps 1
expect_error "--init-from excludes --n-layer" train --init-from "$data/llama" --n-layer 3 --steps 1
expect_error "is not a Hugging Face model directory" train --init-from "$tmp" --steps 1
expect_error "--tie is for --arch llama" train --tie --steps 1
# A source path that is not UTF-8 cannot be recorded in a checkpoint's index.json: refused before the first step (it
# had trained, then failed at the save with a bare JSON error, keeping nothing).
bad_utf8="$tmp/$(printf 'not\xffutf8')" && cp -r "$data/llama" "$bad_utf8"
expect_error "the description's hf_source is not UTF-8 text" train --init-from "$bad_utf8" --ctx 16 --batch-size 2 \
  --steps 50 --threads 1 --eval-every 0 --checkpoint-dir "$tmp/ck_utf8"
grep -q "^train" "$tmp/err" && fail "the run trained before refusing a path index.json cannot hold: $(cat "$tmp/err")"
[ ! -e "$tmp/ck_utf8/step_00000050" ] || fail "a checkpoint was written from a non-UTF-8 source path"
# bf16 in one process (autocast) for every family, within 2 % of f32: Qwen3's head norms meet bf16 q and k there (they
# refused the dtypes: only --fsdp's bf16 parameters matched).
for m in llama llama3 mistral qwen2 qwen3; do
  fam=(--init-from "$data/$m" --ctx 16 --batch-size 2 --steps 3 --warmup 1 --seed 0 --threads 1 --eval-every 0 --eval-iters 1)
  "$exe" train "${fam[@]}" --metrics "$tmp/$m.f32.jsonl" >/dev/null 2>"$tmp/err" &&
    "$exe" train "${fam[@]}" --metrics "$tmp/$m.bf16.jsonl" --mixed-precision bf16 >/dev/null 2>"$tmp/err" ||
    fail "$m in one process, f32 then bf16: $(cat "$tmp/err")"
  within "$(loss_at "$tmp/$m.bf16.jsonl" 3)" "$(loss_at "$tmp/$m.f32.jsonl" 3)" 0.02 0 "$m's bf16 step-3 loss"
done

cfg=(--arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --d-model 32 --ctx 32 --batch-size 8 --steps 30 --warmup 3
     --lr 3e-3 --seed 0 --threads 1 --eval-every 0 --eval-iters 4)
"$exe" train "${cfg[@]}" --metrics "$tmp/a.jsonl" >/dev/null 2>"$tmp/a.err" || fail "train failed: $(cat "$tmp/a.err")"
# embed 8192 + lm_head 8192 + norm 32 + 2 x (q 1024 + k 512 + v 512 + o 1024 + SwiGLU 3 x 32 x 96 + norms 64).
grep -q "Llama n_layer 2.* 41120 parameters" "$tmp/a.err" || fail "parameter count is not 41120: $(head -1 "$tmp/a.err")"
a1=$(loss_at "$tmp/a.jsonl" 1); a10=$(loss_at "$tmp/a.jsonl" 10); a30=$(loss_at "$tmp/a.jsonl" 30)
awk -v l="$a1" 'BEGIN { exit !(l > 5.3 && l < 5.8) }' || fail "step-1 loss $a1 is not near ln(256) = 5.55"
awk -v l="$a30" 'BEGIN { exit !(l < 4.7) }' || fail "step-30 loss $a30 is not clearly below 5.5"
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --stop-after 20 --checkpoint-dir "$tmp/ck" >/dev/null 2>&1
"$exe" train "${cfg[@]}" --metrics "$tmp/b.jsonl" --resume "$tmp/ck" >/dev/null 2>&1
b30=$(loss_at "$tmp/b.jsonl" 30)
[ -n "$b30" ] && [ "$a30" = "$b30" ] || fail "resumed run's step-30 loss $b30 differs from $a30"
if "$exe" train "${cfg[@]/#2/4}" --resume "$tmp/ck" >/dev/null 2>"$tmp/err"; then fail "resume with other heads"; fi
grep -q "n_kv_head 2" "$tmp/err" || fail "resuming with another --n-kv-head not explained: $(cat "$tmp/err")"
ck=$(ls -d "$tmp"/ck/step_* | tail -1)
tr -d ' \n' <"$ck/index.json" >"$tmp/index.min"
for key in '"model.model.embed_tokens.weight":{"dtype":"F32","shape":[256,32]' \
           '"model.model.layers.1.self_attn.k_proj.weight":{"dtype":"F32","shape":[16,32]' \
           '"model.model.layers.0.mlp.gate_proj.weight":{"dtype":"F32","shape":[96,32]' \
           '"model.model.norm.weight":{"dtype":"F32","shape":[32]' \
           '"model.lm_head.weight":{"dtype":"F32","shape":[256,32]'; do
  grep -F "$key" "$tmp/index.min" >/dev/null || fail "checkpoint index lacks $key"
done
"$exe" train "${cfg[@]}" --metrics "$tmp/ac.jsonl" --stop-after 10 --activation-checkpointing >/dev/null 2>&1
within "$(loss_at "$tmp/ac.jsonl" 10)" "$a10" 1e-6 0 "--activation-checkpointing step-10 loss"
# Selective: the kept GEMM and attention outputs are the first forward's, so the losses are the same bits.
"$exe" train "${cfg[@]}" --metrics "$tmp/sac.jsonl" --stop-after 10 --ac selective >/dev/null 2>&1 || fail "--ac selective"
[ "$(loss_at "$tmp/sac.jsonl" 10)" = "$a10" ] || fail "--ac selective step-10 loss $(loss_at "$tmp/sac.jsonl" 10), not $a10"
expect_error "--ac: some not in {none,selective,full}" train "${cfg[@]}" --ac some
expect_error "--activation-checkpointing excludes --ac" train "${cfg[@]}" --ac selective --activation-checkpointing
# bf16 autocast in one process (RoPE, GQA and SwiGLU on bf16 projections): close to f32, not f32.
"$exe" train "${cfg[@]}" --metrics "$tmp/bf.jsonl" --stop-after 10 --mixed-precision bf16 >/dev/null 2>"$tmp/bf.err" ||
  fail "--mixed-precision bf16 failed: $(cat "$tmp/bf.err")"
within "$(loss_at "$tmp/bf.jsonl" 10)" "$a10" 0.02 0 "bf16 step-10 loss"
differs "$(loss_at "$tmp/bf.jsonl" 10)" "$a10" 1e-6 "bf16 step-10 loss"

# A Hugging Face Llama (the fixture: 4 heads, 2 key/value heads, untied) fine-tuned on bytes.
hf=(--init-from "$data/llama" --ctx 32 --batch-size 8 --steps 5 --warmup 1 --lr 1e-3 --seed 0 --threads 1
    --eval-every 0 --eval-iters 2)
"$exe" train "${hf[@]}" --metrics "$tmp/h.jsonl" >/dev/null 2>"$tmp/h.err" || fail "--init-from failed: $(cat "$tmp/h.err")"
grep -q "initialised from" "$tmp/h.err" || fail "--init-from did not say so: $(cat "$tmp/h.err")"
h1=$(loss_at "$tmp/h.jsonl" 1)
# The Llama 3.x-made fixture (rope_scaling llama3 past its original context of 64, a tied head,
# bf16 weights): fine-tuned at ctx 80 with a checkpoint, resumed, exported with its rope scaling
# and tied head, and sampled the same from the checkpoint and the export.
l3=(--init-from "$data/llama3" --ctx 80 --batch-size 4 --steps 4 --warmup 1 --lr 1e-3 --seed 0 --threads 1
    --eval-every 0 --eval-iters 2 --checkpoint-dir "$tmp/ck3" --checkpoint-every 2)
"$exe" train "${l3[@]}" --stop-after 2 >/dev/null 2>"$tmp/l3.err" || fail "--init-from llama3 failed: $(cat "$tmp/l3.err")"
cp -r "$tmp/ck3" "$tmp/ck3b"
"$exe" train "${l3[@]}" --resume "$tmp/ck3" --metrics "$tmp/l3.jsonl" >/dev/null 2>"$tmp/l3.err" ||
  fail "resuming the llama3 fine-tune failed: $(cat "$tmp/l3.err")"
# --resume alone (no --init-from, no shape flag): the model is the one the checkpoint describes, the same steps.
l3b=("${l3[@]:2}") && l3b[${#l3b[@]}-3]="$tmp/ck3b"  # its --checkpoint-dir
"$exe" train "${l3b[@]}" --resume "$tmp/ck3b" --metrics "$tmp/l3b.jsonl" >/dev/null \
  2>"$tmp/l3b.err" || fail "resuming the llama3 fine-tune without --init-from failed: $(cat "$tmp/l3b.err")"
[ "$(loss_at "$tmp/l3b.jsonl" 4)" = "$(loss_at "$tmp/l3.jsonl" 4)" ] ||
  fail "resumed without --init-from: step-4 loss $(loss_at "$tmp/l3b.jsonl" 4), with it $(loss_at "$tmp/l3.jsonl" 4)"
grep -q "\"hf_source\": *\"$(readlink -f "$data/llama3")\"" "$tmp/ck3b/step_00000004/index.json" ||
  fail "the checkpoint of a run resumed without --init-from lost its hf_source"
# A model that ships a tokenizer, fine-tuned on bytes: said at the start, and its export leaves out the tokenizer,
# generation files and token ids it was not trained on (they would decode its output wrong).
cp -r "$data/llama3" "$tmp/l3tok" && cp "$data/../tokenizers/llama3/tokenizer.json" "$tmp/l3tok/"
"$exe" train --init-from "$tmp/l3tok" --ctx 80 --batch-size 4 --steps 1 --threads 1 --eval-every 0 --eval-iters 2 \
  --checkpoint-dir "$tmp/cktok" >/dev/null 2>"$tmp/tok.err" ||
  fail "--init-from a model with a tokenizer: $(cat "$tmp/tok.err")"
grep -q "warning: .* holds text (bytes), not the tokens of $tmp/l3tok/tokenizer.json" "$tmp/tok.err" ||
  fail "training a model with a tokenizer on bytes is not said: $(cat "$tmp/tok.err")"
"$exe" export-hf --from "$tmp/cktok" --out "$tmp/tokhf" >/dev/null 2>"$tmp/tok.err" || fail "export-hf: $(cat "$tmp/tok.err")"
grep -q "was trained on text (bytes), not on the tokens of $tmp/l3tok/tokenizer.json" "$tmp/tok.err" &&
  [ ! -e "$tmp/tokhf/tokenizer.json" ] && [ ! -e "$tmp/tokhf/generation_config.json" ] &&
  grep -q '"eos_token_id": null' "$tmp/tokhf/config.json" || fail "export-hf shipped the source's tokenizer: $(cat "$tmp/tok.err"; ls "$tmp/tokhf")"
# Its eval reads text (bytes), as it trained, and refuses its source's tokens; sample reads the prompt as bytes (the
# source's tokenizer had been taken by both: another text scored, another prompt encoded, silently).
head -c 3000 /usr/share/common-licenses/GPL-3 >"$tmp/tokev.txt"
"$exe" eval --from "$tmp/cktok" --data "$tmp/tokev.txt" >/dev/null 2>"$tmp/tok.err" || fail "eval on bytes: $(cat "$tmp/tok.err")"
"$exe" prepare --tokenizer "$tmp/l3tok" --data "$tmp/tokev.txt" --out "$tmp/tokds" >/dev/null 2>"$tmp/tok.err" ||
  fail "prepare: $(cat "$tmp/tok.err")"
expect_error "and $tmp/cktok reads text (bytes)" eval --from "$tmp/cktok" --data "$tmp/tokds"
"$exe" sample --from "$tmp/cktok" --prompt "The" --tokens 3 --seed 1 >/dev/null 2>"$tmp/tok.err" || fail "$(cat "$tmp/tok.err")"
grep -q "$tmp/cktok was trained on text (bytes): the prompt is read as bytes" "$tmp/tok.err" &&
  grep -q "prompt of 3 tokens" "$tmp/tok.err" || fail "sample of a byte run: $(cat "$tmp/tok.err")"
expect_error "was trained on text (bytes), whose ids a --tokenizer's are not" sample --from "$tmp/cktok" --tokenizer \
  "$tmp/l3tok/tokenizer.json" --tokens 1
# A directory that ships SentencePiece's tokenizer.model without tokenizer.json: text for it (a prompt, eval's or train's
# data) is refused, not read as bytes (which had been scored, trained on and exported with that tokenizer); ids are not.
cp -r "$data/llama3" "$tmp/l3spm" && echo "not read" >"$tmp/l3spm/tokenizer.model"
spm="$tmp/l3spm holds tokenizer.model (SentencePiece's format) and no tokenizer.json"
expect_error "$spm, the one weft reads: the prompt would be read as bytes" sample --from "$tmp/l3spm" --prompt "The" --tokens 1
expect_error "$spm, the one weft reads: $tmp/tokev.txt's text would be read as bytes" eval --from "$tmp/l3spm" \
  --data "$tmp/tokev.txt"
expect_error "$spm" train --init-from "$tmp/l3spm" --data "$tmp/tokev.txt" --ctx 80 --steps 1
"$exe" sample --from "$tmp/l3spm" --prompt-ids 1,2 --tokens 1 --ids >/dev/null 2>"$tmp/err" || fail "--prompt-ids: $(cat "$tmp/err")"
# A run whose source no longer holds its tokenizer.json exports none of the tokenizer's other files
# (tokenizer_config.json had gone along without the tokenizer: AutoTokenizer failed on the export).
cp -r "$tmp/l3tok" "$tmp/l3notok" && echo '{}' >"$tmp/l3notok/tokenizer_config.json"
"$exe" train --init-from "$tmp/l3notok" --ctx 80 --batch-size 4 --steps 1 --threads 1 --eval-every 0 --eval-iters 2 \
  --checkpoint-dir "$tmp/cknotok" >/dev/null 2>"$tmp/tok.err" || fail "$(cat "$tmp/tok.err")"
rm "$tmp/l3notok/tokenizer.json"
"$exe" export-hf --from "$tmp/cknotok" --out "$tmp/notokhf" >/dev/null 2>"$tmp/tok.err" || fail "$(cat "$tmp/tok.err")"
grep -q "$tmp/l3notok has tokenizer_config.json but no tokenizer.json (or tokenizer.model): not copied" "$tmp/tok.err" &&
  [ ! -e "$tmp/notokhf/tokenizer_config.json" ] || fail "export without the source's tokenizer: $(cat "$tmp/tok.err"; ls "$tmp/notokhf")"
# generation_config.json's eos ids stop sampling (any of them; --eos none: never), from the
# directory and from a checkpoint of a run that started from it.
all=$("$exe" sample --from "$data/llama3" --prompt "The " --greedy --tokens 20 --ids 2>/dev/null)
e=$(echo "$all" | cut -d, -f5)
mkdir "$tmp/l3eos" && cp "$data/llama3/config.json" "$data/llama3/model.safetensors" "$tmp/l3eos/"
echo "{\"eos_token_id\": [255, $e]}" >"$tmp/l3eos/generation_config.json"
[ "$e" != 255 ] || fail "the fixture's greedy ids hold 255, the other eos id of this test"
want=$(echo "$all" | tr ',' '\n' | awk -v e="$e" '{print} $1 == e {exit}' | paste -sd,)
got=$("$exe" sample --from "$tmp/l3eos" --prompt "The " --greedy --tokens 20 --ids 2>"$tmp/eos.err")
[ "$got" = "$want" ] || fail "generation_config.json's eos ids [255, $e]: got $got, want $want"
grep -q "stopping after eos id(s) 255,$e" "$tmp/eos.err" || fail "no eos message: $(cat "$tmp/eos.err")"
[ "$("$exe" sample --from "$tmp/l3eos" --prompt "The " --greedy --tokens 20 --ids --eos none 2>/dev/null)" = "$all" ] ||
  fail "--eos none still stopped"
# Ids outside the vocabulary (a config's default of another vocabulary, -1) never match, as in transformers: said and
# dropped (they had been refused).
echo "{\"eos_token_id\": [-1, 999999, $e]}" >"$tmp/l3eos/generation_config.json"
got=$("$exe" sample --from "$tmp/l3eos" --prompt "The " --greedy --tokens 20 --ids 2>"$tmp/eos.err") || fail "$(cat "$tmp/eos.err")"
[ "$got" = "$want" ] && grep -q "eos id(s) -1,999999 lie outside the vocabulary of 256" "$tmp/eos.err" ||
  fail "eos ids outside the vocabulary: got $got, want $want: $(cat "$tmp/eos.err")"
# Without generation_config.json, config.json's generation fields hold, as transformers reads them: greedy (no
# do_sample) and its eos_token_id (weft had drawn at temperature 1, never stopping).
mkdir "$tmp/l3nogen" && cp "$data/llama3/model.safetensors" "$tmp/l3nogen/"
sed "s/\"eos_token_id\": *\(null\|[0-9][0-9]*\)/\"eos_token_id\": $e/" "$data/llama3/config.json" >"$tmp/l3nogen/config.json"
grep -q "\"eos_token_id\": $e" "$tmp/l3nogen/config.json" || fail "could not set config.json's eos_token_id"
got=$("$exe" sample --from "$tmp/l3nogen" --prompt "The " --tokens 20 --ids 2>"$tmp/eos.err") || fail "$(cat "$tmp/eos.err")"
[ "$got" = "$want" ] || fail "no generation_config.json: got $got, want greedy ids up to eos $e: $want"
grep -q "stopping after eos id(s) $e ($tmp/l3nogen/config.json" "$tmp/eos.err" &&
  grep -q "sampling greedy (do_sample false), as $tmp/l3nogen/config.json says" "$tmp/eos.err" ||
  fail "no generation_config.json: the messages do not name config.json: $(cat "$tmp/eos.err")"
# Its sampling defaults apply where no flag is given: do_sample with temperature/top_k/top_p
# draws as those flags do; do_sample false or absent is greedy; a flag overrides its field.
echo '{"do_sample": true, "temperature": 0.7, "top_k": 5, "top_p": 0.9}' >"$tmp/l3eos/generation_config.json"
drawn=$("$exe" sample --from "$tmp/l3eos" --prompt "The " --tokens 20 --seed 9 --ids 2>"$tmp/gen.err")
grep -q "sampling temperature 0.7, top_k 5, top_p 0.9, as $tmp/l3eos/generation_config.json says" "$tmp/gen.err" ||
  fail "no message naming generation_config.json's sampling: $(cat "$tmp/gen.err")"
[ "$drawn" = "$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 20 --seed 9 --ids --temperature 0.7 \
  --top-k 5 --top-p 0.9 2>/dev/null)" ] || fail "generation_config.json's sampling is not its flags' ($drawn)"
[ "$drawn" != "$("$exe" sample --from "$tmp/l3eos" --prompt "The " --tokens 20 --seed 9 --ids --top-k 0 --top-p 1 \
  2>/dev/null)" ] || fail "--top-k 0 --top-p 1 did not override generation_config.json's"
# A --temperature without do_sample samples as generate(do_sample=True, temperature=T): the file's top_k (50 where
# absent) and top_p (it had sampled from the whole vocabulary).
drawn=$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 20 --seed 9 --ids --temperature 0.9 2>"$tmp/gen.err")
grep -q "sampling top_k 50, top_p 1, as $data/llama3/generation_config.json says" "$tmp/gen.err" ||
  fail "--temperature alone: $(cat "$tmp/gen.err")"
[ "$drawn" = "$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 20 --seed 9 --ids --temperature 0.9 \
  --top-k 50 --top-p 1 2>/dev/null)" ] || fail "--temperature alone did not sample with top_k 50"
[ "$("$exe" sample --from "$tmp/l3eos" --prompt "The " --tokens 20 --seed 9 --ids --temperature 0 2>/dev/null)" = "$all" ] ||
  fail "--temperature 0 did not override generation_config.json's do_sample"
[ "$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 20 --seed 9 --ids 2>/dev/null)" = "$all" ] ||
  fail "a generation_config.json without do_sample does not sample greedily"
# Fields that change generation and that weft does not apply are named (their neutral values are not).
echo '{"repetition_penalty": 1.3, "no_repeat_ngram_size": 0, "num_beams": 1, "min_new_tokens": 4, "stop_strings": ["x"]}' \
  >"$tmp/l3eos/generation_config.json"
pen=$("$exe" sample --from "$tmp/l3eos" --prompt "The " --tokens 20 --ids 2>"$tmp/gen.err") || fail "$(cat "$tmp/gen.err")"
grep -q "generation_config.json sets min_new_tokens 4, stop_strings \[\"x\"\], which weft does not apply" "$tmp/gen.err" ||
  fail "ignored generation fields not named: $(cat "$tmp/gen.err")"
# Its repetition_penalty applies (to greedy too), named; --repetition-penalty 1 turns it off.
grep -q "sampling repetition_penalty 1.3, greedy (do_sample false), as $tmp/l3eos/generation_config.json" "$tmp/gen.err" ||
  fail "repetition_penalty not taken: $(cat "$tmp/gen.err")"
off=$("$exe" sample --from "$tmp/l3eos" --prompt "The " --tokens 20 --ids --repetition-penalty 1 2>/dev/null)
[ -n "$pen" ] && [ "$pen" != "$off" ] || fail "repetition_penalty 1.3 changed nothing: $pen"
# A prompt past the context is said (the model sees its last ctx tokens).
"$exe" sample --from "$data/llama" --prompt "$(printf 'x%.0s' $(seq 100))" --tokens 1 --ids >/dev/null 2>"$tmp/gen.err" ||
  fail "$(cat "$tmp/gen.err")"
grep -q "the prompt's 100 tokens are past the context of 64: the model sees its last 64" "$tmp/gen.err" ||
  fail "a prompt past the context: $(cat "$tmp/gen.err")"
# Mistral (sliding_window 48): generating past the window is said (weft starts again where transformers slides).
"$exe" sample --from "$data/mistral" --prompt "ab" --tokens 60 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "2 prompt and 60 new tokens pass the sliding_window of 48" "$tmp/gen.err" || fail "past the window: $(cat "$tmp/gen.err")"
"$exe" sample --from "$data/mistral" --prompt "ab" --tokens 8 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
if grep -q "sliding_window" "$tmp/gen.err"; then fail "within the window: $(cat "$tmp/gen.err")"; fi
echo '{"do_sample": true,' >"$tmp/l3eos/generation_config.json"
expect_error "generation_config.json is not valid JSON: [json.exception.parse_error" sample --from "$tmp/l3eos" --prompt "The " --tokens 2
echo '{"do_sample": true, "top_p": 1.5}' >"$tmp/l3eos/generation_config.json"
expect_error '"top_p" is 1.5, which weft cannot sample with' sample --from "$tmp/l3eos" --prompt "The " --tokens 2
# The same model with another rope scaling is not the checkpoint's model.
mkdir "$tmp/l3lin" && cp "$data/llama3/model.safetensors" "$tmp/l3lin/"
sed -e '/high_freq_factor\|low_freq_factor\|original_max_position_embeddings/d' -e 's/"llama3"/"linear"/' \
  "$data/llama3/config.json" >"$tmp/l3lin/config.json"
expect_error 'rope_scaling {"factor":8.0,"high_freq_factor":8.0' train --init-from "$tmp/l3lin" --ctx 80 --batch-size 4 \
  --steps 4 --seed 0 --resume "$tmp/ck3"
"$exe" export-hf --from "$tmp/ck3" --out "$tmp/l3out" 2>"$tmp/x.err" || fail "export-hf of llama3 failed: $(cat "$tmp/x.err")"
grep -q '"rope_type": "llama3"' "$tmp/l3out/config.json" && grep -q '"tie_word_embeddings": true' "$tmp/l3out/config.json" ||
  fail "the llama3 export lost its rope scaling or tied head: $(cat "$tmp/l3out/config.json")"
grep -q '"max_position_embeddings": 128' "$tmp/l3out/config.json" ||  # trained at --ctx 80
  fail "the llama3 export lost its source's max_position_embeddings (128): $(cat "$tmp/l3out/config.json")"
cmp -s "$data/llama3/generation_config.json" "$tmp/l3out/generation_config.json" ||
  fail "export-hf of a run from --init-from did not copy its generation_config.json"
"$exe" export-hf --from "$data/qwen2" --out "$tmp/q2bf" --dtype bf16 2>"$tmp/x.err" || fail "export-hf --dtype bf16: $(cat "$tmp/x.err")"
grep -q '"torch_dtype": "bfloat16"' "$tmp/q2bf/config.json" && grep -q '"model_type": "qwen2"' "$tmp/q2bf/config.json" ||
  fail "export-hf --dtype bf16 of qwen2: $(cat "$tmp/q2bf/config.json")"
expect_error "--dtype: f16 not in {f32,bf16}" export-hf --from "$data/qwen2" --out "$tmp/q2f16" --dtype f16
# Past the run's --ctx 80 and within the source's 128, the checkpoint reads on as its export does (it had started
# again at 80: other tokens from there).
s3=$("$exe" sample --from "$tmp/ck3" --prompt "The " --greedy --max-new-tokens 110 --ids 2>"$tmp/x.err")
[ "$s3" = "$("$exe" sample --from "$tmp/l3out" --prompt "The " --greedy --max-new-tokens 110 --ids 2>/dev/null)" ] ||
  fail "greedy ids from the llama3 checkpoint and its export differ"
if grep -q "context" "$tmp/x.err"; then fail "the checkpoint's context is not its source's: $(cat "$tmp/x.err")"; fi
head -c 4000 /usr/share/common-licenses/GPL-3 >"$tmp/ev.txt"  # eval's blocks: the run's --ctx 80 by default
"$exe" eval --from "$tmp/ck3" --data "$tmp/ev.txt" >/dev/null 2>"$tmp/x.err" || fail "eval: $(cat "$tmp/x.err")"
grep -q "blocks of 80 + 1 tokens" "$tmp/x.err" || fail "eval of the checkpoint: $(cat "$tmp/x.err")"
"$exe" sample --from "$data/llama" --prompt "ab" --tokens 70 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "2 prompt and 70 new tokens pass the model's context of 64: weft starts again from the last half" \
  "$tmp/gen.err" || fail "past the context: $(cat "$tmp/gen.err")"
# 2 + 63: the last new token is never fed back, so 64 positions enter the model: no restart, no warning.
"$exe" sample --from "$data/llama" --prompt "ab" --tokens 63 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
if grep -q "pass the" "$tmp/gen.err"; then fail "2 + 63 tokens in a context of 64 warned: $(cat "$tmp/gen.err")"; fi
# --top-k / --top-p on a greedy run (--greedy, or do_sample false in the model's files) change nothing: said so.
"$exe" sample --from "$data/llama" --greedy --top-k 7 --tokens 2 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "this run is greedy (--greedy): give --temperature" "$tmp/gen.err" || fail "--greedy --top-k: $(cat "$tmp/gen.err")"
"$exe" sample --from "$tmp/l3nogen" --top-p 0.5 --tokens 2 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "greedy (do_sample false in $tmp/l3nogen/config.json)" "$tmp/gen.err" || fail "--top-p, greedy: $(cat "$tmp/gen.err")"
# A checkpoint whose --init-from directory is gone samples (and exports) without its generation files: said so.
cp -r "$data/llama3" "$tmp/l3gone"
"$exe" train --init-from "$tmp/l3gone" --ctx 32 --batch-size 2 --steps 1 --threads 1 --eval-every 0 --eval-iters 1 \
  --checkpoint-dir "$tmp/ckgone" >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
rm -r "$tmp/l3gone"
"$exe" sample --from "$tmp/ckgone" --tokens 2 --ids >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "$tmp/l3gone, the run's --init-from, is gone: its generation_config.json" "$tmp/gen.err" ||
  fail "sample from a checkpoint whose source is gone: $(cat "$tmp/gen.err")"
"$exe" export-hf --from "$tmp/ckgone" --out "$tmp/gone_out" >/dev/null 2>"$tmp/gen.err" || fail "$(cat "$tmp/gen.err")"
grep -q "$tmp/l3gone, the run's --init-from, is gone: its tokenizer and generation files are not copied" \
  "$tmp/gen.err" && [ ! -e "$tmp/gone_out/tokenizer.json" ] || fail "export-hf, source gone: $(cat "$tmp/gen.err")"
# An export keeps its source's other config.json fields (initializer_range, summary_*), and GPT-2's dropouts are the
# run's (written 0.0 whatever the source or the run had).
cp -r "$data/gpt2" "$tmp/g2drop" && sed -i 's/"resid_pdrop": 0.0/"resid_pdrop": 0.1/' "$tmp/g2drop/config.json"
"$exe" export-hf --from "$tmp/g2drop" --out "$tmp/g2drop_out" >/dev/null 2>"$tmp/x.err" || fail "export-hf: $(cat "$tmp/x.err")"
grep -q '"resid_pdrop": 0.1' "$tmp/g2drop_out/config.json" && grep -q '"initializer_range": 0.02' \
  "$tmp/g2drop_out/config.json" && grep -q '"summary_type": "cls_index"' "$tmp/g2drop_out/config.json" ||
  fail "the source's config fields: $(cat "$tmp/g2drop_out/config.json")"
"$exe" train --init-from "$tmp/g2drop" --dropout 0.05 --ctx 64 --batch-size 2 --steps 1 --threads 1 --eval-every 0 \
  --eval-iters 1 --checkpoint-dir "$tmp/ckg2" >/dev/null 2>"$tmp/x.err" || fail "$(cat "$tmp/x.err")"
"$exe" export-hf --from "$tmp/ckg2" --out "$tmp/ckg2_out" >/dev/null 2>"$tmp/x.err" || fail "export-hf: $(cat "$tmp/x.err")"
grep -q '"attn_pdrop": 0.05' "$tmp/ckg2_out/config.json" && grep -q '"initializer_range": 0.02' "$tmp/ckg2_out/config.json" ||
  fail "the run's dropout and the source's fields: $(cat "$tmp/ckg2_out/config.json")"
# Llama's too: the source's initializer_range (0.1 in the llama3 fixture) and the run's --dropout as attention_dropout
# (they were written 0.02 and 0.0 whatever the source or the run had).
"$exe" train --init-from "$data/llama3" --dropout 0.05 --ctx 16 --batch-size 2 --steps 1 --threads 1 --eval-every 0 \
  --eval-iters 1 --checkpoint-dir "$tmp/ckl3" >/dev/null 2>"$tmp/x.err" || fail "$(cat "$tmp/x.err")"
"$exe" export-hf --from "$tmp/ckl3" --out "$tmp/ckl3_out" >/dev/null 2>"$tmp/x.err" || fail "export-hf: $(cat "$tmp/x.err")"
grep -q '"attention_dropout": 0.05' "$tmp/ckl3_out/config.json" && grep -q '"initializer_range": 0.1' "$tmp/ckl3_out/config.json" ||
  fail "Llama's dropout and initializer_range: $(cat "$tmp/ckl3_out/config.json")"
# A chat template saved as transformers 5 saves it goes with the export.
cp -r "$data/qwen2" "$tmp/q2chat" && echo '{{ messages[0].content }}' >"$tmp/q2chat/chat_template.jinja" &&
  cp "$data/../tokenizers/qwen2/tokenizer.json" "$tmp/q2chat/"
"$exe" export-hf --from "$tmp/q2chat" --out "$tmp/q2chat_out" 2>"$tmp/x.err" || fail "export-hf: $(cat "$tmp/x.err")"
cmp -s "$tmp/q2chat/chat_template.jinja" "$tmp/q2chat_out/chat_template.jinja" || fail "chat_template.jinja not exported"

if [ -n "$mpirun" ]; then
  run() { "$mpirun" -np "$1" "${mpirun_args[@]}" "$exe" train --fsdp "${@:2}"; }
  run 2 "${cfg[@]}" --metrics "$tmp/f.jsonl" --stop-after 10 --checkpoint-dir "$tmp/ckf" >/dev/null 2>"$tmp/f.err" ||
    fail "2-rank --fsdp failed: $(cat "$tmp/f.err")"
  within "$(loss_at "$tmp/f.jsonl" 10)" "$a10" 1e-5 0 "2-rank --fsdp step-10 loss"
  run 4 "${cfg[@]}" --metrics "$tmp/f4.jsonl" --stop-after 10 --activation-checkpointing >/dev/null 2>&1 ||
    fail "4-rank --fsdp --activation-checkpointing failed"
  within "$(loss_at "$tmp/f4.jsonl" 10)" "$a10" 1e-5 0 "4-rank --fsdp step-10 loss"
  run 2 "${cfg[@]}" --metrics "$tmp/mp.jsonl" --stop-after 10 --mixed-precision bf16 >/dev/null 2>&1 ||
    fail "--mixed-precision bf16 failed"
  within "$(loss_at "$tmp/mp.jsonl" 10)" "$a10" 0.02 0 "bf16 step-10 loss"
  run 2 "${cfg[@]}" --metrics "$tmp/mb.jsonl" --stop-after 10 --memory-budget 2M >/dev/null 2>"$tmp/mb.err" ||
    fail "--memory-budget failed: $(cat "$tmp/mb.err")"
  within "$(loss_at "$tmp/mb.jsonl" 10)" "$a10" 1e-5 0 "--memory-budget step-10 loss"
  run 2 "${hf[@]}" --metrics "$tmp/hf.jsonl" >/dev/null 2>"$tmp/hf.err" || fail "--init-from --fsdp failed: $(cat "$tmp/hf.err")"
  within "$(loss_at "$tmp/hf.jsonl" 1)" "$h1" 1e-5 0 "--init-from at 2 ranks: step-1 loss"
  within "$(loss_at "$tmp/hf.jsonl" 5)" "$(loss_at "$tmp/h.jsonl" 5)" 1e-5 0 "--init-from at 2 ranks: step-5 loss"
  # Every family through the whole training stack: FSDP at 2 ranks with activation
  # checkpointing, bf16 mixed precision and the memory planner's budget from --init-from, stopped
  # and resumed (the step-4 loss bitwise that of the run without a stop), then exported.
  for m in mistral qwen2 qwen3; do
    fam=(--init-from "$data/$m" --ctx 32 --batch-size 2 --steps 4 --warmup 1 --lr 1e-3 --seed 0 --threads 1
         --eval-every 0 --eval-iters 2 --activation-checkpointing --mixed-precision bf16 --memory-budget 64M)
    run 2 "${fam[@]}" --metrics "$tmp/$m.a.jsonl" >/dev/null 2>"$tmp/$m.err" || fail "$m at 2 ranks: $(cat "$tmp/$m.err")"
    run 2 "${fam[@]}" --metrics "$tmp/$m.b.jsonl" --stop-after 2 --checkpoint-dir "$tmp/ck_$m" >/dev/null 2>&1 &&
      run 2 "${fam[@]}" --metrics "$tmp/$m.b.jsonl" --resume "$tmp/ck_$m" >/dev/null 2>"$tmp/$m.err" ||
      fail "$m stopped and resumed at 2 ranks: $(cat "$tmp/$m.err")"
    l4=$(loss_at "$tmp/$m.a.jsonl" 4)
    [ -n "$l4" ] && [ "$l4" = "$(loss_at "$tmp/$m.b.jsonl" 4)" ] || fail "$m: resumed step-4 loss differs from $l4"
    "$exe" export-hf --from "$tmp/ck_$m" --out "$tmp/x_$m" 2>"$tmp/$m.err" || fail "$m export: $(cat "$tmp/$m.err")"
    grep -q "\"model_type\": \"$m\"" "$tmp/x_$m/config.json" || fail "$m export's model_type: $(cat "$tmp/x_$m/config.json")"
  done
  # The 2-rank checkpoint as a Hugging Face model: the same greedy ids from either.
  "$exe" export-hf --from "$tmp/ckf" --out "$tmp/hfout" --max-shard-size 40K 2>"$tmp/x.err" ||
    fail "export-hf failed: $(cat "$tmp/x.err")"
  ls "$tmp/hfout"/model-0000*-of-0000*.safetensors >/dev/null || fail "export-hf --max-shard-size 40K wrote one file"
  expect_error "already exists" export-hf --from "$tmp/ckf" --out "$tmp/hfout"
  s1=$("$exe" sample --from "$tmp/ckf" --prompt "The " --greedy --max-new-tokens 16 --ids)
  s2=$("$exe" sample --from "$tmp/hfout" --prompt "The " --greedy --max-new-tokens 16 --ids)
  [ "$s1" = "$s2" ] && [ "$(echo "$s1" | tr ',' '\n' | wc -l)" -eq 16 ] ||
    fail "greedy ids from the checkpoint ($s1) and its export ($s2) differ"
  # The Hugging Face fixtures (random weights: every position and head matters) sample the same
  # ids with the key/value cache, without it, and sharded at 2 ranks, greedy and drawn, within
  # their context (4 + 56 of 64 positions).
  # llama3's (context 128): 4 + 76, past its rope scaling's original context of 64.
  for m in gpt2 llama llama3; do
    t=56 && [ $m = llama3 ] && t=76
    for how in "--greedy" "--top-k 50 --top-p 0.95 --temperature 0.7 --seed 9"; do
      c=$("$exe" sample --from "$data/$m" --prompt "The " --tokens $t $how --ids 2>/dev/null)
      n=$("$exe" sample --from "$data/$m" --prompt "The " --tokens $t $how --ids --no-cache 2>/dev/null)
      f=$("$mpirun" -np 2 "${mpirun_args[@]}" "$exe" sample --fsdp --from "$data/$m" --prompt "The " --tokens $t $how \
            --ids 2>"$tmp/sf.err") || fail "sample --fsdp from $m failed: $(cat "$tmp/sf.err")"
      [ "$c" = "$n" ] && [ "$c" = "$f" ] && [ "$(echo "$c" | tr ',' '\n' | wc -l)" -eq $t ] ||
        fail "$m $how: the cache gave $c, --no-cache $n, --fsdp at 2 ranks $f"
    done
  done
  # --dtype bf16 builds the model in bf16 and reads the weights straight into it (the C++ test
  # apps_hf holds its logits within 2 % of transformers' f32 ones, for every family): its prompt
  # logits are not the f32 ones, and it samples alike with the cache, without it and sharded.
  "$exe" sample --from "$data/llama3" --prompt "The " --tokens 0 --logits-out "$tmp/f32.st" 2>/dev/null
  "$exe" sample --from "$data/llama3" --prompt "The " --tokens 0 --dtype bf16 --logits-out "$tmp/bf16.st" 2>/dev/null
  [ -s "$tmp/bf16.st" ] && ! cmp -s "$tmp/f32.st" "$tmp/bf16.st" || fail "sample --dtype bf16 wrote the f32 logits"
  # An earlier --logits-out's file is replaced (any other existing file is refused: bad_input.tsv).
  "$exe" sample --from "$data/llama3" --prompt "The " --tokens 0 --logits-out "$tmp/bf16.st" 2>/dev/null &&
    cmp -s "$tmp/f32.st" "$tmp/bf16.st" || fail "sample --logits-out did not replace its own earlier logits file"
  c=$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 40 --greedy --ids --dtype bf16 2>/dev/null)
  n=$("$exe" sample --from "$data/llama3" --prompt "The " --tokens 40 --greedy --ids --dtype bf16 --no-cache 2>/dev/null)
  f=$("$mpirun" -np 2 "${mpirun_args[@]}" "$exe" sample --fsdp --from "$data/llama3" --prompt "The " --tokens 40 \
        --greedy --ids --dtype bf16 2>"$tmp/sf.err") || fail "sample --fsdp --dtype bf16 failed: $(cat "$tmp/sf.err")"
  [ "$c" = "$n" ] && [ "$c" = "$f" ] && [ "$(echo "$c" | tr ',' '\n' | wc -l)" -eq 40 ] ||
    fail "--dtype bf16: the cache gave $c, --no-cache $n, --fsdp at 2 ranks $f"
  expect_error "--dtype: f16 not in {f32,bf16}" sample --from "$data/llama3" --dtype f16
  echo "fsdp: step-10 loss $a10 at 1, 2 and 4 ranks; --init-from step-1 loss $h1 at 1 and 2 ranks; export samples $s1"
fi
echo "llama cli ok: loss $a1 -> $a30 in 30 steps; resumed step-30 loss $b30"
