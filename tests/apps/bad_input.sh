#!/bin/bash
# Bad input, table-driven: every row of bad_input.tsv runs one program with bad flags or files
# and must end (within `timeout 30`: no hang) with the expected non-zero exit code (no crash:
# not a signal, not 124) and print the expected message fragment. Every failing row is printed
# with what it got. Usage: bad_input.sh TABLE weft-mnist weft-transformer weft-checkpoint
set -u
table=$1
declare -A prog=([mnist]=$2 [transformer]=$3 [checkpoint]=$4)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail

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

mkdir -p "$tmp/ck_bigstep/step_99999999999999999999"
echo '{}' > "$tmp/ck_bigstep/step_99999999999999999999/index.json"

rows=0 failed=0
while IFS=$'\t' read -r name args want_rc want_msg; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  rows=$((rows + 1))
  args=${args//@TMP@/$tmp}
  eval "set -- $args"
  timeout 30 "${prog[$name]}" "$@" </dev/null >"$tmp/out" 2>&1
  rc=$?
  got=$(head -c 600 "$tmp/out")
  why=""
  if [ "$rc" = 124 ]; then why="hung (killed by timeout 30)"
  elif [ "$rc" -ge 128 ]; then why="crashed (signal $((rc - 128)))"
  elif [ "$rc" != "$want_rc" ]; then why="exit $rc, want $want_rc"
  elif ! grep -qF -- "$want_msg" "$tmp/out"; then why="message lacks '$want_msg'"
  fi
  if [ -n "$why" ]; then
    failed=$((failed + 1))
    printf 'FAIL row %d: %s %s: %s; got exit %s:\n%s\n\n' "$rows" "$name" "$args" "$why" "$rc" "$got"
  fi
done < "$table"
echo "bad_input: $((rows - failed)) of $rows rows passed"
[ "$rows" -ge 40 ] || fail "only $rows rows"
[ "$failed" = 0 ]
