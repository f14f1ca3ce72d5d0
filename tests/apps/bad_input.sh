#!/bin/bash
# Bad input, table-driven: every row of bad_input.tsv runs one program with bad flags or files
# and must end (within `timeout 30`, 60 for mpirun: no hang) with the expected non-zero exit
# code (no crash: not a signal, not 124) and print the expected message fragment. Every failing
# row is printed with what it got. Rows "api CASE" run bad_api (tests/apps/bad_api.cpp); rows
# "mpirun ARGS" run mpirun with the given arguments (@MNIST@ and @TRANSFORMER@ name the apps;
# skipped without mpirun).
# Leading NAME=VALUE words of a row's arguments are set in the program's environment.
# Usage: bad_input.sh TABLE weft-mnist weft-transformer weft-checkpoint bad_api weft-plan weft-simple
#        [MPIRUN ARGS...]
set -u
table=$1
declare -A prog=([mnist]=$2 [transformer]=$3 [checkpoint]=$4 [api]=$5 [plan]=$6 [simple]=$7)
for p in "${!prog[@]}"; do prog[$p]=$(readlink -f "${prog[$p]}"); done  # rows may start in other directories
shift 7
mpirun=("$@")
export OMP_NUM_THREADS=1
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within

# Fixtures the rows name as @TMP@/...
mkfifo "$tmp/fifo"
mkdir "$tmp/fifo_dir" "$tmp/zero_dir" "$tmp/huge_dir" "$tmp/ck_fifo"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  mkfifo "$tmp/fifo_dir/$f"
  ln -s /dev/zero "$tmp/zero_dir/$f"
  # An IDX header declaring 65536 x 65536 x 2 bytes (8 GiB), with no data.
  printf '\x00\x00\x08\x03\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x02' > "$tmp/huge_dir/$f"
done
mkfifo "$tmp/ck_fifo/index.json"
head -c 4000 /dev/urandom | base64 > "$tmp/text.txt"
mkdir "$tmp/splits" && cp "$tmp/text.txt" "$tmp/splits/train.txt" && cp "$tmp/text.txt" "$tmp/splits/test.txt"
cp -r "$(dirname "${BASH_SOURCE[0]}")/../data/hf/llama" "$tmp/hf_llama"
mkdir "$tmp/text_dir" && cp "$tmp/text.txt" "$tmp/text_dir/a.txt"
# A real checkpoint, then copies whose model fields are text and absurd.
if ! "${prog[transformer]}" train --data "$tmp/text.txt" --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 2 \
     --steps 1 --eval-iters 1 --checkpoint-dir "$tmp/ck" >"$tmp/setup.log" 2>&1; then
  echo "FAIL: could not write the fixture checkpoint:"; cat "$tmp/setup.log"; exit 1
fi
for v in abc 100000000 -3; do
  cp -r "$tmp/ck" "$tmp/ck_$v"
  idx=$(ls "$tmp/ck_$v"/*/index.json "$tmp/ck_$v"/index.json 2>/dev/null | head -1)
  sed -i -E "s/(\"n_layer\" *: *)\"[0-9]+\"/\1\"$v\"/" "$idx"
  grep -q "\"n_layer\": *\"$v\"" "$idx" || fail "could not edit n_layer in $idx"
done

# Damaged and edited copies: a truncated shard, a flipped byte, an index cut short, and index
# fields out of range (step, data position).
shard() { ls "$1"/step_*/rank_00000.safetensors; }
index() { ls "$1"/step_*/index.json; }
cp -r "$tmp/ck" "$tmp/ck_trunc" && truncate -s -7 "$(shard "$tmp/ck_trunc")"
cp -r "$tmp/ck" "$tmp/ck_flip" && printf '\x5a' | dd of="$(shard "$tmp/ck_flip")" bs=1 seek=200 conv=notrunc status=none
cp -r "$tmp/ck" "$tmp/ck_cut" && truncate -s 100 "$(index "$tmp/ck_cut")"
edit() {  # edit NAME SED: a copy of the checkpoint with its index edited
  cp -r "$tmp/ck" "$tmp/$1" && sed -i -E "$2" "$(index "$tmp/$1")"
}
edit ck_step99 's/"step": *[0-9]+/"step": 99/' && mv "$tmp/ck_step99/step_00000001" "$tmp/ck_step99/step_00000099"
edit ck_stepneg 's/"step": *[0-9]+/"step": -1/'
edit ck_stephuge 's/"step": *[0-9]+/"step": 99999999999999999999/'
edit ck_batchneg 's/"batch": *[0-9]+/"batch": -4/'
edit ck_batchbig 's/"batch": *[0-9]+/"batch": 9223372036854775807/'
edit ck_stepstr 's/"step": *[0-9]+/"step": "one"/'
edit ck_tiedyes 's/"tied": *"1"/"tied": "yes"/'
edit ck_family 's/"family": *""/"family": "mistral"/'
edit ck_ropelist 's/"rope_scaling": *"null"/"rope_scaling": "[1]"/'
# A weft-mnist checkpoint (batch 32, one step) and edited copies.
if ! "${prog[mnist]}" --steps 1 --batch-size 32 --threads 1 --save "$tmp/mck" >"$tmp/setup.log" 2>&1; then
  echo "FAIL: could not write the mnist fixture checkpoint:"; cat "$tmp/setup.log"; exit 1
fi
cp -r "$tmp/mck" "$tmp/mck_epoch" && sed -i -E 's/"epoch": *[0-9]+/"epoch": -1/' "$(index "$tmp/mck_epoch")"
cp -r "$tmp/mck" "$tmp/mck_step" && sed -i -E 's/"step": *[0-9]+/"step": 999999/' "$(index "$tmp/mck_step")" &&
  mv "$tmp/mck_step/step_00000001" "$tmp/mck_step/step_00999999"  # the name says the step the index records
# IDX data sets: each a copy of a tiny valid set (10 images of 2x2) with one file damaged.
idx_set() {  # idx_set DIR: 40 train and 40 test images of 2x2 pixels, labels 0..9 four times
  mkdir -p "$1"
  for s in train t10k; do
    { printf '\x00\x00\x08\x03\x00\x00\x00\x28\x00\x00\x00\x02\x00\x00\x00\x02'; head -c 160 /dev/zero; } >"$1/$s-images-idx3-ubyte"
    { printf '\x00\x00\x08\x01\x00\x00\x00\x28'; for _ in 1 2 3 4; do printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09'; done; } \
      >"$1/$s-labels-idx1-ubyte"
  done
}
idx_set "$tmp/idx_ok"
idx_set "$tmp/idx_trunc" && truncate -s 30 "$tmp/idx_trunc/train-images-idx3-ubyte"
idx_set "$tmp/idx_magic" && printf '\x01' | dd of="$tmp/idx_magic/train-images-idx3-ubyte" bs=1 seek=0 conv=notrunc status=none
idx_set "$tmp/idx_type" && printf '\x0d' | dd of="$tmp/idx_type/train-images-idx3-ubyte" bs=1 seek=2 conv=notrunc status=none
idx_set "$tmp/idx_label" && printf '\x0c' | dd of="$tmp/idx_label/train-labels-idx1-ubyte" bs=1 seek=8 conv=notrunc status=none
idx_set "$tmp/idx_count" && printf '\x27' | dd of="$tmp/idx_count/train-labels-idx1-ubyte" bs=1 seek=7 conv=notrunc status=none
idx_set "$tmp/idx_gz" && rm "$tmp/idx_gz/train-images-idx3-ubyte" &&
  head -c 100 /dev/urandom | { printf '\x1f\x8b\x08\x00'; cat; } >"$tmp/idx_gz/train-images-idx3-ubyte.gz"
# No test images, and images of no pixels.
idx_set "$tmp/idx_notest" && printf '\x00\x00\x08\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x02' \
  >"$tmp/idx_notest/t10k-images-idx3-ubyte" && printf '\x00\x00\x08\x01\x00\x00\x00\x00' >"$tmp/idx_notest/t10k-labels-idx1-ubyte"
idx_set "$tmp/idx_nopx"
for s in train t10k; do printf '\x00\x00\x08\x03\x00\x00\x00\x28\x00\x00\x00\x00\x00\x00\x00\x00' >"$tmp/idx_nopx/$s-images-idx3-ubyte"; done
# An IDX header claiming 3 GiB (over 2 GiB, under the 4 GiB limit) with no data behind it.
idx_set "$tmp/idx_3g" && printf '\x00\x00\x08\x03\x00\x00\xc0\x00\x00\x00\x01\x00\x00\x00\x01\x00' \
  >"$tmp/idx_3g/train-images-idx3-ubyte"
: >"$tmp/empty.txt"
mkdir "$tmp/no_text"
head -c 4000 /dev/urandom | base64 >"$tmp/other.txt"
head -c 1000 /dev/urandom | base64 >>"$tmp/other.txt"

# The training text with one byte changed: the same length, other content. '#' is never a
# base64 character, so the first byte differs whatever the random text begins with ('Q' did
# not when the text began with one: 1 run in 64 resumed as the test said it must not).
{ printf '#'; tail -c +2 "$tmp/text.txt"; } >"$tmp/same_len.txt"
# A checkpoint whose first tensor holds a NaN, with the index's sha256 and size brought up to
# date (so only the value is wrong).
cp -r "$tmp/ck" "$tmp/ck_nan"
nan_shard=$(shard "$tmp/ck_nan")
old_sha=$(sha256sum <"$nan_shard" | cut -c1-64)
hlen=$(od -An -t u8 -N 8 "$nan_shard" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$nan_shard" bs=1 seek=$((8 + hlen)) conv=notrunc status=none
sed -i "s/$old_sha/$(sha256sum <"$nan_shard" | cut -c1-64)/" "$(index "$tmp/ck_nan")"
# A checkpoint directory another process holds (its lock file, as a running training run's).
mkdir "$tmp/locked"
flock "$tmp/locked/.lock" sleep 300 >/dev/null 2>&1 &
lock_holder=$!
trap 'kill $lock_holder 2>/dev/null; rm -rf "$tmp"' EXIT  # and lib.sh's clean-up
for _ in $(seq 50); do flock -n "$tmp/locked/.lock" true || break; sleep 0.1; done

mkdir -p "$tmp/ck_bigstep/step_99999999999999999999"
echo '{}' > "$tmp/ck_bigstep/step_99999999999999999999/index.json"

cp -r "$(dirname "${BASH_SOURCE[0]}")/../data/hf/gpt2" "$tmp/hf_copy"  # a model directory, as downloaded
ln -s "$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/hf/mistral" && pwd)" "$tmp/hf_mistral"  # sliding_window 48
printf '\n\x05<unk>\x15\x00\x00\x00\x00' >"$tmp/tokenizer.model"  # a SentencePiece model's first bytes (protobuf)
# A Hugging Face directory whose config.json is a directory.
cp -r "$(dirname "${BASH_SOURCE[0]}")/../data/hf/gpt2" "$tmp/hf_cfgdir" && rm "$tmp/hf_cfgdir/config.json" &&
  mkdir "$tmp/hf_cfgdir/config.json"

# Per-rank working directories (mpirun -wdir) whose same relative paths hold other files, as
# node-local disks can: a text of the same length, an IDX set with one pixel changed, and a
# checkpoint of a later step.
ln -s "$tmp/loop" "$tmp/loop" && ln -s /nonexistent/x "$tmp/dang"  # a loop of links, a link to nothing
mkdir -p "$tmp/r0" "$tmp/r1"
cp "$tmp/text.txt" "$tmp/r0/text.txt" && cp "$tmp/same_len.txt" "$tmp/r1/text.txt"
# Finite weights whose products are not: the first 64 floats (attention biases) at f32's largest value.
cp -r "$tmp/hf_copy" "$tmp/hf_huge" && w="$tmp/hf_huge/model.safetensors"
at=$(( 8 + $(od -An -tu8 -N8 "$w" | tr -d ' ') )) && for i in $(seq 0 63); do
  printf '\xff\xff\x7f\x7f' | dd of="$w" bs=1 seek=$((at + 4 * i)) conv=notrunc status=none; done
# One path, other weights on another "host": rank 1's copy has one value's lowest bit flipped (still finite).
cp -r "$tmp/hf_copy" "$tmp/r0/hf" && cp -r "$tmp/hf_copy" "$tmp/r1/hf"
w="$tmp/r1/hf/model.safetensors" && at=$(( $(stat -c %s "$w") - 4 ))
printf "\\x$(printf %02x $(( $(od -An -tu1 -j "$at" -N1 "$w") ^ 1 )))" | dd of="$w" bs=1 seek="$at" conv=notrunc status=none
cmp -s "$tmp/r0/hf/model.safetensors" "$w" && fail "could not change rank 1's weights"
idx_set "$tmp/r0/mi" && idx_set "$tmp/r1/mi"
printf '\x01' | dd of="$tmp/r1/mi/train-images-idx3-ubyte" bs=1 seek=20 conv=notrunc status=none
cp -r "$tmp/ck" "$tmp/r0/ck"
"${prog[transformer]}" train --data "$tmp/text.txt" --n-layer 1 --n-head 2 --d-model 16 --ctx 16 --batch-size 2 \
  --steps 2 --eval-iters 1 --checkpoint-dir "$tmp/r1/ck" >"$tmp/setup.log" 2>&1 || fail "the step-2 checkpoint: $(cat "$tmp/setup.log")"

# The rows, read first, then run in two lanes at once (each row's output in its own file; no row
# writes what another reads), and judged in table order.
names=() argss=() rcs=() msgs=()
while IFS=$'\t' read -r name args want_rc want_msg; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  names+=("$name") argss+=("$args") rcs+=("$want_rc") msgs+=("$want_msg")
done < "$table"
rows=${#names[@]}
run_row() {  # run_row I: runs row I, writing its output to $tmp/out.I and its exit code to $tmp/rc.I
  local i=$1 name=${names[$1]} args=${argss[$1]} envs=()
  args=${args//@TMP@/$tmp}
  args=${args//@MNIST@/${prog[mnist]}}
  args=${args//@TRANSFORMER@/${prog[transformer]}}
  eval "set -- $args"
  while [[ $# -gt 0 && "$1" =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("$1"); shift; done
  [ "$name" = api ] && envs+=("TMPDIR=$tmp")  # the cases' scratch directories go with $tmp
  if [ "$name" = mpirun ]; then
    if [ ${#mpirun[@]} = 0 ]; then echo skip >"$tmp/rc.$i"; return; fi
    timeout -k 5 60 env "${envs[@]}" "${mpirun[@]}" "$@" </dev/null >"$tmp/out.$i" 2>&1
  else
    timeout -k 5 30 env "${envs[@]}" "${prog[$name]}" "$@" </dev/null >"$tmp/out.$i" 2>&1
  fi
  echo $? >"$tmp/rc.$i"
}
lane() { local i; for ((i = $1; i < rows; i += 2)); do run_row "$i"; done; }
lane 0 & l0=$!
lane 1 & l1=$!
wait $l0 $l1  # not the lock holder

failed=0 skipped=0
for ((i = 0; i < rows; i++)); do
  rc=$(cat "$tmp/rc.$i" 2>/dev/null || echo none)
  [ "$rc" = skip ] && { skipped=$((skipped + 1)); continue; }
  want_rc=${rcs[$i]} want_msg=${msgs[$i]//@TMP@/$tmp}
  got=$(head -c 600 "$tmp/out.$i" 2>/dev/null)
  why=""
  if [ "$rc" = none ]; then why="did not run"
  elif [ "$rc" = 124 ]; then why="hung (killed by timeout)"
  elif [ "$rc" -ge 128 ]; then why="crashed (signal $((rc - 128)))"
  elif [ "$rc" != "$want_rc" ]; then why="exit $rc, want $want_rc"
  elif ! grep -qF -- "$want_msg" "$tmp/out.$i"; then why="message lacks '$want_msg'"
  fi
  if [ -n "$why" ]; then
    failed=$((failed + 1))
    printf 'FAIL row %d: %s %s: %s; got exit %s:\n%s\n\n' "$((i + 1))" "${names[$i]}" "${argss[$i]}" "$why" "$rc" "$got"
  fi
done
echo "bad_input: $((rows - failed - skipped)) of $rows rows passed ($skipped mpirun rows skipped: no mpirun given)"
[ "$rows" -ge 100 ] || fail "only $rows rows"
[ "$failed" = 0 ]
