#!/usr/bin/env bash
# WEFT_TRACE writes one Chrome-trace file per rank with the FSDP spans: forward and backward
# per sharded module, all-gathers and reduce-scatters, their waits, and optimizer steps.
set -euo pipefail
simple=$1  # usage: trace.sh WEFT_SIMPLE MPIRUN [MPIRUN_ARGS...]
mpirun=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
# OpenMPI refuses -x beside an mca_base_env_list (scripts/sanitize.sh sets one): join that list then.
pass=(-x WEFT_TRACE)
if [ -n "${OMPI_MCA_mca_base_env_list:-}" ]; then
  export OMPI_MCA_mca_base_env_list="$OMPI_MCA_mca_base_env_list;WEFT_TRACE"
  pass=()
fi
WEFT_TRACE="$tmp/t" "$mpirun" -np 2 --oversubscribe --bind-to none "${pass[@]}" "$simple" >/dev/null
for r in 0 1; do
  f="$tmp/t.rank$r.json"
  [ -s "$f" ] || fail "no trace $f"
  head -c 16 "$f" | grep '{"traceEvents":' >/dev/null || fail "$f is not a Chrome trace"
  for span in '"forward ' '"backward ' '"all_gather ' '"reduce_scatter ' '"wait all_gather"' '"optimizer step"'; do
    grep -q "$span" "$f" || fail "$f has no $span span"
  done
  grep -q "\"pid\":$r," "$f" || fail "$f is not labelled rank $r"
done
echo "traces ok: $(grep -c '"ph":"X"' "$tmp/t.rank0.json") spans on rank 0"
