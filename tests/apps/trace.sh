#!/usr/bin/env bash
# WEFT_TRACE writes one Chrome-trace file per rank with the FSDP spans: forward and backward
# per sharded module, all-gathers and reduce-scatters, their waits, and optimizer steps.
set -euo pipefail
mpirun=$1
simple=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
WEFT_TRACE="$tmp/t" "$mpirun" -np 2 --oversubscribe --bind-to none -x WEFT_TRACE "$simple" >/dev/null
for r in 0 1; do
  f="$tmp/t.rank$r.json"
  [ -s "$f" ] || { echo "FAIL: no trace $f"; exit 1; }
  head -c 16 "$f" | grep '{"traceEvents":' >/dev/null || { echo "FAIL: $f is not a Chrome trace"; exit 1; }
  for span in '"forward ' '"backward ' '"all_gather ' '"reduce_scatter ' '"wait all_gather"' '"optimizer step"'; do
    grep -q "$span" "$f" || { echo "FAIL: $f has no $span span"; exit 1; }
  done
  grep -q "\"pid\":$r," "$f" || { echo "FAIL: $f is not labelled rank $r"; exit 1; }
done
echo "traces ok: $(grep -c '"ph":"X"' "$tmp/t.rank0.json") spans on rank 0"
