#!/usr/bin/env bash
# weft-bench-tp on a tiny Llama and GPT-2 at 1 and 2 ranks: the losses it prints at tp 2 (with
# sequence and loss parallel for Llama) equal the one-rank run's (1e-5 relative), so the steps it
# times are the model's; flags its models cannot run are named before any step.
# Usage: bench_tp.sh EXE MPIRUN MPIRUN_ARGS...
set -euo pipefail
exe=$1
mpirun=$2
shift 2
mpirun_args=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, within

tiny=(--n-layer 1 --d-model 32 --n-head 4 --n-kv-head 2 --ffn-dim 64 --ctx 16 --vocab 64 --steps 3 --batch-size 2)
losses() { sed -n 's/^losses: *//p' "$1" | tr ' ' '\n' | cut -d: -f2 | grep .; }
same_losses() {  # ONE_RANK TWO_RANKS WHAT
  local n=0
  [ "$(losses "$1" | wc -l)" = 3 ] && [ "$(losses "$2" | wc -l)" = 3 ] || fail "$3: not 3 losses: $(cat "$1" "$2")"
  while read -r x y; do n=$((n + 1)); within "$y" "$x" 1e-5 0 "$3: loss $n"; done < <(paste -d' ' <(losses "$1") <(losses "$2"))
}
for arch in llama gpt2; do
  extra=(); [ $arch = llama ] && extra=(--sequence-parallel --loss-parallel)
  "$mpirun" -np 1 "${mpirun_args[@]}" "$exe" --arch $arch "${tiny[@]}" --warmup 1 > "$tmp/$arch.1" 2>&1 || { cat "$tmp/$arch.1"; fail "$arch at 1 rank"; }
  "$mpirun" -np 2 "${mpirun_args[@]}" "$exe" --arch $arch "${tiny[@]}" --warmup 1 "${extra[@]}" > "$tmp/$arch.2" 2>&1 ||
    { cat "$tmp/$arch.2"; fail "$arch at tp 2"; }
  same_losses "$tmp/$arch.1" "$tmp/$arch.2" "$arch at tp 2 ${extra[*]}"
done
grep -q 'sequence_parallel=1 loss_parallel=1' "$tmp/llama.2" || fail "llama at tp 2 is not sequence and loss parallel"

# GPT-2's embedding and head stay whole: its loss over the split vocabulary was ln 2 too high.
expect_bad() {  # MESSAGE NP ARGS...
  local want=$1 np=$2; shift 2
  if "$mpirun" -np "$np" "${mpirun_args[@]}" "$exe" "$@" > "$tmp/bad" 2>&1; then fail "$* accepted"; fi
  grep -q -- "$want" "$tmp/bad" || fail "$* not explained: $(cat "$tmp/bad")"
  ! grep -q '^losses' "$tmp/bad" || fail "$*: steps ran"
}
expect_bad "--sequence-parallel and --loss-parallel are for --arch llama" 1 --arch gpt2 "${tiny[@]}" --loss-parallel
expect_bad "--tp 3 must divide the 2 ranks of mpirun" 2 "${tiny[@]}" --tp 3
expect_bad "--warmup 3 must be fewer than --steps 3" 1 "${tiny[@]}" --warmup 3
expect_bad "--ffn-dim: expected an integer from 1" 1 "${tiny[@]}" --ffn-dim -64
echo "bench_tp: OK"
