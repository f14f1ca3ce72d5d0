#!/usr/bin/env bash
# Checkpoint directories end to end with weft-transformer, weft-mnist and weft-checkpoint:
# - exact resume across processes: 10 steps vs 5, stop, resume 5 (with dropout, so the RNG state
#   matters) log bitwise the same losses, alone and at 2 ranks;
# - another world size: 1 -> 4 and 4 -> 1 (and mnist 2 -> 1 -> 4) continue with the
#   uninterrupted run's losses (rel 1e-5: the ranks' sums round differently);
# - weft-checkpoint inspect / verify / consolidate (nanoGPT names, lm_head.weight for the tied
#   head; `sample` from the file prints what it prints from the directory);
# - a run resumed at its last step says that nothing is left to train (also with GPT-2's default
#   --ffn-dim spelled out);
# - a flipped byte, a truncated or deleted shard and another model's flags are clear errors on
#   every rank and write nothing; keep_last keeps the newest.
# Usage: checkpoint_cli.sh WEFT_TRANSFORMER WEFT_MNIST WEFT_CHECKPOINT [MPIRUN MPIRUN_ARGS...]
set -euo pipefail
gpt=$1
mnist=$2
tool=$3
shift 3
launch=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
export OMP_NUM_THREADS=1
run() { timeout 120 "$@"; }
mp() { [ ${#launch[@]} -gt 0 ] || fail "no mpirun given"; run "${launch[@]}" -np "$@"; }
same() { [ -n "$2" ] && [ "$1" = "$2" ] || fail "$3: $2, uninterrupted $1"; }

cfg=(--n-layer 2 --n-head 2 --d-model 32 --ctx 32 --batch-size 8 --steps 10 --warmup 3 --lr 3e-3 --seed 0 --threads 1
     --eval-every 0 --eval-iters 2 --log-every 1)

# Exact resume in one process, with dropout: the resumed run must restore the RNG too.
run "$gpt" train "${cfg[@]}" --dropout 0.1 --metrics "$tmp/d.jsonl" >/dev/null 2>"$tmp/err" || fail "$(cat "$tmp/err")"
run "$gpt" train "${cfg[@]}" --dropout 0.1 --metrics "$tmp/dr.jsonl" --stop-after 5 --checkpoint-dir "$tmp/ckd" \
  --checkpoint-every 2 --keep-last 2 >/dev/null 2>&1
ls "$tmp/ckd" | tr '\n' ' ' | grep -qx "step_00000004 step_00000005 " || fail "keep-last 2 left: $(ls "$tmp/ckd")"
run "$gpt" train "${cfg[@]}" --dropout 0.1 --metrics "$tmp/dr.jsonl" --resume "$tmp/ckd" >/dev/null 2>"$tmp/err" ||
  fail "resume: $(cat "$tmp/err")"
grep -q "resumed from .*step_00000005 at step 5" "$tmp/err" || fail "did not resume from the latest: $(cat "$tmp/err")"
for s in 6 8 10; do same "$(loss_at "$tmp/d.jsonl" $s)" "$(loss_at "$tmp/dr.jsonl" $s)" "resumed step-$s loss (dropout)"; done
# A refused output makes nothing: no directory, no lock file inside the checkpoint it would damage.
! run "$gpt" train "${cfg[@]}" --resume "$tmp/ckd" --checkpoint-dir "$tmp/ckd/step_00000005/sub" >/dev/null 2>&1 ||
  fail "a --checkpoint-dir inside the checkpoint --resume reads was taken"
[ ! -e "$tmp/ckd/step_00000005/sub" ] && [ ! -e "$tmp/ckd/step_00000005/.lock" ] ||
  fail "a refused --checkpoint-dir was made: $(ls -a "$tmp/ckd/step_00000005")"
# A run resumed at its last step says that nothing is left to train.
run "$gpt" train "${cfg[@]}" --checkpoint-dir "$tmp/ckend" >/dev/null 2>&1
run "$gpt" train "${cfg[@]}" --resume "$tmp/ckend" >/dev/null 2>"$tmp/err" || fail "resume at the end: $(cat "$tmp/err")"
grep -q "nothing to train: step 10 is the run's last" "$tmp/err" || fail "resumed at its end silently: $(cat "$tmp/err")"
# GPT-2's default MLP width spelled out (4 x --d-model) is the model the checkpoint holds.
run "$gpt" train "${cfg[@]}" --resume "$tmp/ckend" --ffn-dim 128 >/dev/null 2>"$tmp/err" ||
  fail "resume with --ffn-dim 128 (the default) refused: $(cat "$tmp/err")"

# The same at 2 ranks, in new processes.
mp 2 "$gpt" train --fsdp "${cfg[@]}" --dropout 0.1 --metrics "$tmp/d2.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "2 ranks: $(cat "$tmp/err")"
mp 2 "$gpt" train --fsdp "${cfg[@]}" --dropout 0.1 --metrics "$tmp/d2r.jsonl" --stop-after 5 \
  --checkpoint-dir "$tmp/ck2" >/dev/null 2>&1
mp 2 "$gpt" train --fsdp "${cfg[@]}" --dropout 0.1 --metrics "$tmp/d2r.jsonl" --resume "$tmp/ck2" >/dev/null 2>&1
for s in 6 10; do same "$(loss_at "$tmp/d2.jsonl" $s)" "$(loss_at "$tmp/d2r.jsonl" $s)" "2-rank resumed step-$s loss"; done

# Another world size (no dropout: its masks depend on the ranks): 1 -> 4 and 4 -> 1.
run "$gpt" train "${cfg[@]}" --metrics "$tmp/a.jsonl" >/dev/null 2>&1
run "$gpt" train "${cfg[@]}" --metrics "$tmp/x.jsonl" --stop-after 5 --checkpoint-dir "$tmp/ck1" >/dev/null 2>&1
mp 4 "$gpt" train --fsdp "${cfg[@]}" --metrics "$tmp/x14.jsonl" --resume "$tmp/ck1" >/dev/null 2>"$tmp/err" ||
  fail "1 -> 4: $(cat "$tmp/err")"
mp 4 "$gpt" train --fsdp "${cfg[@]}" --metrics "$tmp/x4.jsonl" --stop-after 5 --checkpoint-dir "$tmp/ck4" \
  >/dev/null 2>&1
run "$gpt" train "${cfg[@]}" --metrics "$tmp/x41.jsonl" --resume "$tmp/ck4" >/dev/null 2>"$tmp/err" ||
  fail "4 -> 1: $(cat "$tmp/err")"
a10=$(loss_at "$tmp/a.jsonl" 10)
within "$(loss_at "$tmp/x14.jsonl" 10)" "$a10" 1e-5 0 "step-10 loss resumed 1 -> 4"
within "$(loss_at "$tmp/x41.jsonl" 10)" "$a10" 1e-5 0 "step-10 loss resumed 4 -> 1"

# mnist: 2 -> 1 -> 4 ranks through --save/--load directories.
m=(--seed 3 --batch-size 64 --threads 1 --log-every 10 --data "$(mnist_small 1000)")
run "$mnist" "${m[@]}" --steps 30 --metrics "$tmp/m.jsonl" >/dev/null 2>&1
mp 2 "$mnist" --fsdp "${m[@]}" --steps 10 --save "$tmp/mck" >/dev/null 2>"$tmp/err" || fail "mnist save: $(cat "$tmp/err")"
run "$mnist" "${m[@]}" --steps 20 --load "$tmp/mck" --save "$tmp/mck" --metrics "$tmp/m1.jsonl" >/dev/null 2>&1
mp 4 "$mnist" --fsdp "${m[@]}" --steps 30 --resume "$tmp/mck" --metrics "$tmp/m4.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "mnist 1 -> 4: $(cat "$tmp/err")"
within "$(loss_at "$tmp/m1.jsonl" 20)" "$(loss_at "$tmp/m.jsonl" 20)" 1e-5 0 "mnist step-20 loss resumed 2 -> 1"
within "$(loss_at "$tmp/m4.jsonl" 30)" "$(loss_at "$tmp/m.jsonl" 30)" 1e-5 0 "mnist step-30 loss resumed 1 -> 4"

# weft-checkpoint on the 4-rank checkpoint.
"$tool" inspect "$tmp/ck4" >"$tmp/inspect.txt" || fail "inspect failed"
for want in "step        5" "world size  4" "rank_00003.safetensors" "model.transformer.h.1.mlp.c_fc.weight" \
            "Shard(0)" "lm_head.weight = transformer.wte.weight"; do
  grep -qF "$want" "$tmp/inspect.txt" || fail "inspect does not show '$want': $(head -30 "$tmp/inspect.txt")"
done
"$tool" verify "$tmp/ck4" >"$tmp/verify.txt" || fail "verify of a good checkpoint failed: $(cat "$tmp/verify.txt")"
"$tool" consolidate "$tmp/ck4" "$tmp/gpt.safetensors" 2>/dev/null || fail "consolidate failed"
head -c 4000 "$tmp/gpt.safetensors" | tr -d ' ' >"$tmp/header"
for key in '"transformer.wte.weight":{"dtype":"F32","shape":[256,32]' '"lm_head.weight":{"dtype":"F32","shape":[256,32]' \
           '"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":[96,32]' '"format":"weft-transformer"'; do
  grep -aF "$key" "$tmp/header" >/dev/null || fail "consolidated file lacks $key"
done
if grep -aF '"model.' "$tmp/header" >/dev/null; then fail "consolidated names keep the model. prefix"; fi
"$gpt" sample --checkpoint "$tmp/ck4" --prompt "Q: " --tokens 30 --seed 1 >"$tmp/s_dir.txt"
"$gpt" sample --checkpoint "$tmp/gpt.safetensors" --prompt "Q: " --tokens 30 --seed 1 >"$tmp/s_file.txt"
cmp -s "$tmp/s_dir.txt" "$tmp/s_file.txt" || fail "sampling the consolidated file differs from the directory"
"$tool" consolidate --with-optimizer "$tmp/ck4" "$tmp/gpt_opt.safetensors" 2>/dev/null || fail "consolidate --with-optimizer"
"$gpt" sample --checkpoint "$tmp/gpt_opt.safetensors" --prompt "Q: " --tokens 30 --seed 1 >"$tmp/s_opt.txt" 2>"$tmp/err" ||
  fail "sampling a file with the optimizer state: $(cat "$tmp/err")"
cmp -s "$tmp/s_dir.txt" "$tmp/s_opt.txt" || fail "sampling the file with the optimizer state differs from the directory"

# Damaged copies: verify names the file; resuming fails on every rank and writes nothing.
last=rank_00003.safetensors
damage() {  # damage NAME HOW
  cp -r "$tmp/ck4" "$tmp/$1"
  local f
  f=$(ls -d "$tmp/$1"/step_*)/$last
  case $2 in
    flip) printf '\x5a' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none ;;
    truncate) truncate -s -5 "$f" ;;
    delete) rm "$f" ;;
  esac
}
for how in flip truncate delete; do
  damage "bad_$how" "$how"
  if "$tool" verify "$tmp/bad_$how" >"$tmp/out" 2>&1; then fail "verify accepted a $how shard"; fi
  grep -q "$last" "$tmp/out" || fail "verify of a $how shard does not name the file: $(cat "$tmp/out")"
  before=$(ls -R "$tmp/bad_$how" | md5sum)
  if mp 4 "$gpt" train --fsdp "${cfg[@]}" --resume "$tmp/bad_$how" --checkpoint-dir "$tmp/bad_$how" >/dev/null \
       2>"$tmp/err"; then fail "resumed from a $how shard"; fi
  grep -q "$last" "$tmp/err" || fail "resuming from a $how shard does not name the file: $(cat "$tmp/err")"
  [ "$(grep -c "error on rank" "$tmp/err")" = 4 ] || fail "not every rank stopped ($how): $(cat "$tmp/err")"
  [ "$(ls -R "$tmp/bad_$how" | md5sum)" = "$before" ] || fail "a failed resume ($how) changed the directory"
done
grep -q "sha256" <("$tool" verify "$tmp/bad_flip" 2>&1) || fail "a flipped byte is not reported as a hash mismatch"
# Another model's flags, and a directory without checkpoints.
other=("${cfg[@]}")
other[1]=3  # --n-layer 3
if run "$gpt" train "${other[@]}" --resume "$tmp/ck4" 2>"$tmp/err" >/dev/null; then fail "n_layer 3 resumed"; fi
grep -q "n_layer 2" "$tmp/err" || fail "model mismatch not explained: $(cat "$tmp/err")"
if run "$mnist" --model cnn --load "$tmp/mck" --steps 1 2>"$tmp/err" >/dev/null; then fail "cnn loaded an mlp"; fi
grep -q "mlp model" "$tmp/err" || fail "mnist model mismatch not explained: $(cat "$tmp/err")"
mkdir "$tmp/empty"
if "$tool" inspect "$tmp/empty" 2>"$tmp/err"; then fail "inspect of an empty directory succeeded"; fi
grep -q "no complete checkpoint" "$tmp/err" || fail "empty directory not explained: $(cat "$tmp/err")"
# One writer per directory: a second run on a directory a live run writes is refused, naming the
# first (its pid); leftovers of a killed save are removed when the next run starts.
long=("${cfg[@]}")
long[11]=100000  # --steps
timeout 120 "$gpt" train "${long[@]}" --checkpoint-dir "$tmp/shared" --checkpoint-every 100000 \
  >/dev/null 2>"$tmp/first.err" &
first=$!
for _ in $(seq 100); do grep -q "pid " "$tmp/shared/.lock" 2>/dev/null && break; sleep 0.1; done
holder=$(grep -o "pid [0-9]*" "$tmp/shared/.lock" | cut -d' ' -f2)
[ -n "$holder" ] && [ "$(cat /proc/"$holder"/comm 2>/dev/null)" = weft-transforme ] ||
  { kill $first; fail "the first run's lock does not name it: $(cat "$tmp/shared/.lock" 2>&1)"; }
if run "$gpt" train "${cfg[@]}" --checkpoint-dir "$tmp/shared" >/dev/null 2>"$tmp/err"; then
  kill $first; fail "a second run wrote a directory another run holds"; fi
kill $first; wait $first 2>/dev/null || true  # it stops on SIGTERM (status 143)
grep -q "$tmp/shared is in use by another run (host .*, pid $holder, since" "$tmp/err" ||
  fail "the second run does not name the first: $(cat "$tmp/err")"
mkdir -p "$tmp/shared/.tmp-step_00000099/x" "$tmp/shared/.old-step_00000042"
run "$gpt" train "${cfg[@]}" --stop-after 1 --checkpoint-dir "$tmp/shared" --overwrite-checkpoints >/dev/null \
  2>"$tmp/err" || fail "a run after the first ended: $(cat "$tmp/err")"
[ ! -e "$tmp/shared/.tmp-step_00000099" ] && [ ! -e "$tmp/shared/.old-step_00000042" ] ||
  fail "leftovers of killed saves were kept: $(ls -a "$tmp/shared")"
# Run ownership: a new run into a directory that holds another run's checkpoints is refused and
# changes nothing there; --resume keeps the run's identity (its next step joins the directory);
# --overwrite-checkpoints replaces the other run's checkpoints at its first save.
run_of() { grep -o '"run": "[^"]*"' "$1/index.json"; }
run "$gpt" train "${cfg[@]}" --stop-after 2 --checkpoint-dir "$tmp/own" >/dev/null 2>"$tmp/err" ||
  fail "ownership: the first run: $(cat "$tmp/err")"
[ -n "$(run_of "$tmp/own/step_00000002")" ] || fail "the checkpoint records no run: $(cat "$tmp/own/step_00000002/index.json")"
before=$(cd "$tmp/own" && find . -type f ! -name .lock | sort | xargs sha256sum)
other=("${cfg[@]}")
other[17]=7  # --seed
if run "$gpt" train "${other[@]}" --stop-after 2 --checkpoint-dir "$tmp/own" >/dev/null 2>"$tmp/err"; then
  fail "a new run wrote over another run's checkpoints"; fi
grep -q "checkpoint-dir $tmp/own holds checkpoints of another run (run .*, step 2, .*seed 0): use --resume $tmp/own" \
  "$tmp/err" || fail "the refusal does not name the other run: $(cat "$tmp/err")"
[ "$(cd "$tmp/own" && find . -type f ! -name .lock | sort | xargs sha256sum)" = "$before" ] ||
  fail "a refused run changed the directory"
run "$gpt" train "${cfg[@]}" --stop-after 1 --resume "$tmp/own" --checkpoint-dir "$tmp/own" --keep-last 1 >/dev/null \
  2>"$tmp/err" || fail "ownership: resuming: $(cat "$tmp/err")"
[ "$(run_of "$tmp/own/step_00000003")" = "$(run_of "$tmp/own/step_00000002")" ] ||
  fail "a resumed run records another identity: $(run_of "$tmp/own/step_00000003") vs $(run_of "$tmp/own/step_00000002")"
run "$gpt" train "${other[@]}" --stop-after 1 --checkpoint-dir "$tmp/own" --overwrite-checkpoints >/dev/null \
  2>"$tmp/err" || fail "--overwrite-checkpoints: $(cat "$tmp/err")"
grep -q "holds 2 checkpoints of another run .*--overwrite-checkpoints replaces them" "$tmp/err" ||
  fail "--overwrite-checkpoints does not say what it replaces: $(cat "$tmp/err")"
[ "$(ls "$tmp/own")" = step_00000001 ] || fail "--overwrite-checkpoints left: $(ls "$tmp/own")"
# A run resumed from an earlier step of its own: the directory's later steps, which --resume DIR would take, are
# refused; --overwrite-checkpoints removes them at the run's first save.
run "$gpt" train "${cfg[@]}" --stop-after 6 --checkpoint-dir "$tmp/br" --checkpoint-every 2 >/dev/null 2>&1
if run "$gpt" train "${cfg[@]}" --resume "$tmp/br/step_00000002" --checkpoint-dir "$tmp/br" >/dev/null 2>"$tmp/err"
then fail "a run resumed at step 2 wrote beside its own steps 4 and 6"; fi
grep -q "holds checkpoints of this run past step 2, which it resumes from (run .*, steps 4 to 6, .*: --resume $tmp/br" \
  "$tmp/err" || fail "the refusal of the later steps: $(cat "$tmp/err")"
run "$gpt" train "${cfg[@]}" --resume "$tmp/br/step_00000002" --checkpoint-dir "$tmp/br" --checkpoint-every 1 \
  --stop-after 1 --overwrite-checkpoints >/dev/null 2>"$tmp/err" || fail "resumed over later steps: $(cat "$tmp/err")"
[ "$(ls "$tmp/br" | tr '\n' ' ')" = "step_00000002 step_00000003 " ] || fail "the resumed run left: $(ls "$tmp/br")"
# A directory whose newest step cannot be read: --resume falls back to the newest step that reads, naming both;
# verify checks that one and fails, naming the newer ones (it had passed: `verify ck && rm -rf ck` lost them).
cp -r "$tmp/own" "$tmp/fb"
mkdir "$tmp/fb/step_00000009" && echo '{"format": ' >"$tmp/fb/step_00000009/index.json"
mkdir "$tmp/fb/step_00000010" && ln -s index.json "$tmp/fb/step_00000010/index.json"  # a loop of links: passed over too
if "$tool" verify "$tmp/fb" >"$tmp/out" 2>&1; then fail "verify passed a directory whose newest steps do not read"; fi
grep -q "error: a checkpoint in the directory cannot be read: checkpoint: $tmp/fb/step_00000009/index.json" "$tmp/out" &&
  grep -q "error: a checkpoint in the directory cannot be read: .*Too many levels of symbolic links" "$tmp/out" &&
  grep -q "ok, but it is not the newest: $tmp/fb/step_00000001" "$tmp/out" || fail "verify's fallback: $(cat "$tmp/out")"
run "$gpt" train "${other[@]}" --stop-after 1 --resume "$tmp/fb" --checkpoint-dir "$tmp/fb" >/dev/null 2>"$tmp/err" ||
  fail "--resume did not fall back: $(cat "$tmp/err")"
grep -q "using $tmp/fb/step_00000001, the newest checkpoint in $tmp/fb that reads" "$tmp/err" &&
  [ -e "$tmp/fb/step_00000002/index.json" ] || fail "--resume's fallback: $(cat "$tmp/err"; ls "$tmp/fb")"
# A step_N whose index records another step (a copy, renamed) is passed over the same way.
cp -r "$tmp/own" "$tmp/ren" && cp -r "$tmp/ren/step_00000001" "$tmp/ren/step_00000008"
if "$tool" verify "$tmp/ren" >"$tmp/out" 2>&1; then fail "verify passed a renamed copy"; fi
grep -q "$tmp/ren/step_00000008 holds step 1, not the step its name says" "$tmp/out" &&
  grep -q "ok, but it is not the newest: $tmp/ren/step_00000001" "$tmp/out" || fail "a renamed copy: $(cat "$tmp/out")"
# A step_N without its index: verify fails naming it (it had said ok), and a run that would save step N there is
# refused before training (it had trained up to step N and failed at its save).
cp -r "$tmp/own" "$tmp/noidx" && mkdir "$tmp/noidx/step_00000003"
if "$tool" verify "$tmp/noidx" >"$tmp/out" 2>&1; then fail "verify passed a step without its index"; fi
grep -q "$tmp/noidx/step_00000003 has no index.json: not a complete checkpoint" "$tmp/out" || fail "verify: $(cat "$tmp/out")"
if run "$gpt" train "${other[@]}" --resume "$tmp/noidx" --checkpoint-dir "$tmp/noidx" --checkpoint-every 1 \
  --metrics "$tmp/noidx.jsonl" >/dev/null 2>"$tmp/err"; then fail "a run saved over a step without its index"; fi
grep -q "$tmp/noidx/step_00000003 is not a checkpoint (it has no index.json) and this run would save step 3 there" \
  "$tmp/err" && [ ! -s "$tmp/noidx.jsonl" ] || fail "the refusal before training: $(cat "$tmp/err")"
# --keep-last 1 saving every step keeps the newest known to resume besides it, which moves on at each save: said once
# (it had been said at every save).
run "$gpt" train "${cfg[@]}" --checkpoint-dir "$tmp/k1" --checkpoint-every 1 --keep-last 1 >/dev/null 2>"$tmp/err" ||
  fail "$(cat "$tmp/err")"
[ "$(grep -c "besides the 1 newest: the newest checkpoint known to resume" "$tmp/err")" = 1 ] &&
  [ "$(ls "$tmp/k1" | grep -c step_)" = 2 ] || fail "--keep-last 1's notes: $(cat "$tmp/err"; ls "$tmp/k1")"
# An older checkpoint that rotation cannot remove (immutable here; read-only or stale elsewhere) stays, with a warning:
# the run goes on (it had ended at the next save, the checkpoint just published kept, its later steps not trained).
run "$gpt" train "${cfg[@]}" --checkpoint-dir "$tmp/imm" --stop-after 1 >/dev/null 2>&1 || fail "the run to rotate from"
if chattr +i "$tmp/imm/step_00000001" 2>/dev/null; then
  rc=0 && run "$gpt" train "${cfg[@]}" --resume "$tmp/imm" --checkpoint-dir "$tmp/imm" --checkpoint-every 1 \
    --keep-last 1 --stop-after 3 >/dev/null 2>"$tmp/err" || rc=$?
  chattr -i "$tmp/imm/step_00000001"
  [ "$rc" = 0 ] && [ -e "$tmp/imm/step_00000004/index.json" ] && [ -e "$tmp/imm/step_00000001/index.json" ] &&
    grep -q "checkpoint: warning: the older checkpoint $tmp/imm/step_00000001 was not removed" "$tmp/err" ||
    fail "an old step rotation cannot remove (rc $rc): $(cat "$tmp/err"; ls "$tmp/imm")"
else echo "checkpoint_cli: the immutable old step is not tested: chattr +i fails on $tmp (needs root on ext4 or xfs)"; fi
# A metrics file that cannot grow (a file-size limit here, a full disk elsewhere) costs its lines, never the run: it
# trains on to its last checkpoint, says what was dropped, and the file keeps whole lines only (a failed write had
# ended the run, its steps since the last checkpoint lost).
head -n 11752 < <(yes '{"filler":"earlier run"}') > "$tmp/full.jsonl"  # 293,800 bytes: 1,112 short of 288 KiB
( trap '' XFSZ; ulimit -f 288; run "$gpt" train --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 2 --steps 12 \
  --warmup 0 --threads 1 --eval-every 4 --log-every 1 --metrics "$tmp/full.jsonl" --checkpoint-dir "$tmp/full" \
  --checkpoint-every 4 ) >/dev/null 2>"$tmp/err" || fail "a metrics file that could not grow ended the run: $(cat "$tmp/err")"
grep -q "metrics: writing $tmp/full.jsonl failed: File too large; training goes on" "$tmp/err" &&
  grep -Eq "metrics: [0-9]+ line\(s\) could not be written to $tmp/full.jsonl" "$tmp/err" &&
  [ -e "$tmp/full/step_00000012/index.json" ] || fail "the dropped metrics lines: $(cat "$tmp/err"; ls "$tmp/full")"
[ "$(grep -vc '^{.*}$' "$tmp/full.jsonl")" = 0 ] && [ "$(tail -c 1 "$tmp/full.jsonl" | od -An -c | tr -d ' ')" = '\n' ] &&
  [ "$(grep -c '"step":' "$tmp/full.jsonl")" -ge 2 ] || fail "the metrics file holds a partial line: $(tail -c 300 "$tmp/full.jsonl")"
# export-hf: the leftovers of an export to the same --out whose process is gone are removed when
# the next one starts (a live process's are kept).
# A command writing a result does not fall back past a newer step that does not read, as --resume does (an export of
# an older step had exited 0): it names the newest that reads, which it then takes.
if run "$gpt" export-hf --from "$tmp/fb" --out "$tmp/hf" >/dev/null 2>"$tmp/err"; then fail "export-hf fell back"; fi
grep -q "a newer checkpoint in $tmp/fb cannot be read (.*); the newest that reads is $tmp/fb/step_00000002: name it" \
  "$tmp/err" || fail "export-hf past an unreadable step: $(cat "$tmp/err")"
if "$tool" consolidate "$tmp/fb" "$tmp/fb.safetensors" >/dev/null 2>"$tmp/err"; then fail "consolidate fell back"; fi
grep -q "the newest that reads is $tmp/fb/step_00000002" "$tmp/err" || fail "consolidate: $(cat "$tmp/err")"
mkdir -p "$tmp/.hf.tmp-999999999/x" "$tmp/.hf.tmp-$$"
run "$gpt" export-hf --from "$tmp/fb/step_00000002" --out "$tmp/hf" >/dev/null 2>"$tmp/err" || fail "export-hf: $(cat "$tmp/err")"
[ ! -e "$tmp/.hf.tmp-999999999" ] && [ -d "$tmp/.hf.tmp-$$" ] && [ -e "$tmp/hf/config.json" ] ||
  fail "export-hf's leftovers: $(ls -a "$tmp")"
# A command that runs in one process refuses an mpirun of several, on every rank (rank 1 had failed to publish what
# rank 0 had written, saying that nothing was written).
if mp 2 "$gpt" export-hf --from "$tmp/fb/step_00000002" --out "$tmp/hf_mp" >"$tmp/out" 2>&1; then fail "export-hf ran under mpirun -np 2"; fi
[ "$(grep -c "export-hf runs in one process, and mpirun started 2" "$tmp/out")" = 2 ] && [ ! -e "$tmp/hf_mp" ] ||
  fail "export-hf under mpirun -np 2: $(cat "$tmp/out")"
# A byte model's export names no bos/eos (transformers' GPT-2 default, 50256, is past its 256 tokens).
grep -q '"bos_token_id": null' "$tmp/hf/config.json" && grep -q '"eos_token_id": null' "$tmp/hf/config.json" ||
  fail "a byte model's export: $(cat "$tmp/hf/config.json")"
echo "checkpoint cli ok: exact resume (dropout) alone and at 2 ranks; step-10 loss $a10 after 1->4 and 4->1;" \
     "mnist 2->1->4; inspect, verify, consolidate; corrupt shards refused on every rank; one writer per directory;" \
     "run ownership, later steps of a resumed run; fallback past an unreadable step; export leftovers; a full metrics file"
