#!/usr/bin/env bash
# weft-bench-tokenizer on GPT-2's tokenizer: a table row of the files, bytes and tokens it read;
# a device or a FIFO as --data is refused at once, as prepare and train refuse them (it had read
# /dev/zero until memory ran out, and waited on a FIFO for ever).
# Usage: bench_tokenizer.sh EXE TOKENIZER_JSON
set -euo pipefail
exe=$1
tokenizer=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail

mkdir "$tmp/texts"
printf 'Hello world, hello tokenizer.\n' > "$tmp/texts/a.txt"
printf 'Another file of text.\n' > "$tmp/texts/b.txt"
"$exe" --tokenizer "$tokenizer" --data "$tmp/texts" --rounds 1 > "$tmp/out" 2>&1 || fail "two files: $(cat "$tmp/out")"
# 15 + 9 tokens, as the tokenizers library encodes the two texts with this tokenizer.json.
grep -Eq "^\| .*tokenizer.json \| 2 \| 0.00 \| 24 \| " "$tmp/out" || fail "no row of 2 files and 24 tokens: $(cat "$tmp/out")"
mkfifo "$tmp/fifo"
for data in /dev/zero "$tmp/fifo"; do
  if timeout 5 "$exe" --tokenizer "$tokenizer" --data "$data" --rounds 1 > "$tmp/out" 2>&1; then fail "$data was read"; fi
  grep -q "$data is not a regular file" "$tmp/out" || fail "$data: not refused by name: $(head -c 300 "$tmp/out")"
done
echo "bench_tokenizer: ok"
