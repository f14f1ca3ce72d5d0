#!/usr/bin/env bash
# WEFT_TRACE writes one Chrome-trace file per rank with the FSDP spans: forward and backward
# per sharded module, all-gathers and reduce-scatters, their waits, and optimizer steps; each on
# its lane (compute tid 0, collectives tid 1), labelled with its rank, and prefetched
# all-gathers overlapping the compute of the module before them. Reads the JSON with jq.
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
command -v jq >/dev/null || fail "jq is needed to read the traces (scripts/deps.sh installs it)"
# jq over the complete ("X") events of trace $1: exits 0 when the filter $2 is true.
spans() { jq -e "[.traceEvents[] | select(.ph == \"X\")] | $2" "$1" >/dev/null; }
for r in 0 1; do
  f="$tmp/t.rank$r.json"
  [ -s "$f" ] || fail "no trace $f"
  head -c 16 "$f" | grep '{"traceEvents":' >/dev/null || fail "$f is not a Chrome trace"
  jq -e . "$f" >/dev/null || fail "$f is not valid JSON"
  for span in '"forward ' '"backward ' '"all_gather ' '"reduce_scatter ' '"wait all_gather"' '"optimizer step"'; do
    grep -q "$span" "$f" || fail "$f has no $span span"
  done
  spans "$f" "all(.pid == $r)" || fail "$f: not every span is labelled rank $r (pid)"
  # Lanes: compute (forward, backward, the waits) on tid 0, collectives in flight on tid 1.
  spans "$f" 'map(select(.name | test("^(forward|backward|wait) "))) | length > 0 and all(.tid == 0)' ||
    fail "$f: forward/backward/wait spans are not all on the compute lane (tid 0)"
  spans "$f" 'map(select(.name | test("^(all_gather|reduce_scatter) "))) | length > 0 and all(.tid == 1)' ||
    fail "$f: all_gather/reduce_scatter spans are not all on the collectives lane (tid 1)"
  # Prefetching: some module's all-gather starts while another module (not the root, whose
  # spans hold everything) computes, in forward and in backward. Without prefetching each
  # all-gather starts in its own module's hooks, after the previous module's span ended.
  overlap='
    (map(select(.name | startswith("forward "))) | min_by(.ts) | .name | ltrimstr("forward ")) as $root
    | [.[] | select(.tid == 1 and (.name | startswith("all_gather ")))
           | {m: (.name | ltrimstr("all_gather ")), ts}] as $gathers
    | [.[] | select(.tid == 0 and (.name | test("^(forward|backward) ")))
           | {phase: (.name | split(" ")[0]), m: (.name | sub("^(forward|backward) "; "")), ts, end: (.ts + .dur)}
           | select(.m != $root)] as $compute
    | [$gathers[] as $g | $compute[] | select(.m != $g.m and $g.ts >= .ts and $g.ts < .end) | .phase] | unique'
  spans "$f" "$overlap | index(\"forward\") != null" ||
    fail "$f: no all-gather overlaps another module's forward (forward prefetching)"
  spans "$f" "$overlap | index(\"backward\") != null" ||
    fail "$f: no all-gather overlaps another module's backward (backward prefetching)"
done
echo "traces ok: $(grep -c '"ph":"X"' "$tmp/t.rank0.json") spans on rank 0, lanes and prefetch overlap checked"
