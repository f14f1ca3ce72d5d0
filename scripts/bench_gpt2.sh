#!/usr/bin/env bash
# GPT-2 124M training steps on one GPU: weft-bench-gpt2, then PyTorch eager, then torch.compile
# (scripts/bench_gpt2_pytorch.py, the same model and step), each printing its per-step table,
# then one summary table (medians over the steps after the warm-up) with weft's speed-up over
# each and the targets of docs/PERFORMANCE.md ("GPT-2 124M on one GPU").
#   scripts/bench_gpt2.sh [BUILD_DIR] [flags for all three...]
#   e.g. scripts/bench_gpt2.sh build --batch-size 8 --steps 30
# The flags go to all three programs, so use those they share: --device --precision
# --batch-size --steps --warmup --ctx --vocab --n-layer --n-head --d-model --lr --weight-decay
# --clip --peak-tflops --seed.
# Environment: PYTHON (default python3), OUT (folder for the logs, default BUILD_DIR/bench-gpt2-out).
# A run that skips (exit 77: no GPU, no PyTorch, no torch.compile) is listed with its reason;
# PyTorch is optional. Exits 1 if a run failed, 77 if weft itself skipped, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
bench="$build/apps/bench/weft-bench-gpt2"
[ -x "$bench" ] || { echo "no $bench: build it first (meson setup $build && ninja -C $build)" >&2; exit 1; }
python=${PYTHON:-python3}
out=${OUT:-$build/bench-gpt2-out}
mkdir -p "$out"
# fully_shard's world of one starts MPI as a singleton; these let it start as root too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

names=(weft pytorch-eager pytorch-compile)
declare -A rc
run() {  # NAME COMMAND...
  local name=$1
  shift
  echo
  echo "## $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
  rc[$name]=${PIPESTATUS[0]}
}
run weft "$bench" "$@"
if command -v "$python" >/dev/null; then
  run pytorch-eager "$python" scripts/bench_gpt2_pytorch.py --mode eager "$@"
  run pytorch-compile "$python" scripts/bench_gpt2_pytorch.py --mode compile "$@"
else
  for n in pytorch-eager pytorch-compile; do
    echo "bench_gpt2_pytorch: skipped: no $python" > "$out/$n.txt"
    rc[$n]=77
  done
fi

field() {  # NAME KEY: KEY's value on NAME's summary line
  sed -n "s/^summary impl=.* $2=\([^ ]*\).*/\1/p" "$out/$1.txt" | tail -1
}
weft_ms=$(field weft ms)
echo
echo "## summary (medians over the steps after --warmup; logs in $out/)"
echo
echo "| run | ms/step | tokens/s | MFU % | peak MiB | weft speed-up |"
echo "|---|---:|---:|---:|---:|---:|"
failed=0
for n in "${names[@]}"; do
  if [ "${rc[$n]}" = 0 ] && [ -n "$(field "$n" ms)" ]; then
    ms=$(field "$n" ms)
    speedup=$(awk -v a="$ms" -v b="${weft_ms:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
    [ "$n" = weft ] && speedup="1.00x"
    mfu=$(awk -v m="$(field "$n" mfu)" 'BEGIN { printf "%.1f", 100 * m }')
    echo "| $n | $ms | $(field "$n" tokens_per_s) | $mfu | $(field "$n" peak_mib) | $speedup |"
  elif [ "${rc[$n]}" = 77 ]; then
    echo "| $n | skipped: $(sed -n 's/.*skipped: //p' "$out/$n.txt" | tail -1) | | | | |"
  else
    echo "| $n | failed (exit ${rc[$n]}, see $out/$n.txt) | | | | |"
    failed=1
  fi
done

# The targets (docs/PERFORMANCE.md): >= 1.0x torch.compile, >= 1.5x eager, MFU >= 45 %.
if [ -n "$weft_ms" ]; then
  echo
  verdict() {  # LABEL VALUE TARGET
    awk -v l="$1" -v v="$2" -v t="$3" 'BEGIN { printf "- %s: %.2f (target >= %s): %s\n", l, v, t, (v >= t ? "met" : "NOT met") }'
  }
  verdict "weft MFU %" "$(awk -v m="$(field weft mfu)" 'BEGIN { print 100 * m }')" 45
  for n in pytorch-eager pytorch-compile; do
    [ "${rc[$n]}" = 0 ] || continue
    target=1.0
    [ "$n" = pytorch-eager ] && target=1.5
    verdict "weft speed-up over $n" "$(awk -v a="$(field "$n" ms)" -v b="$weft_ms" 'BEGIN { print a / b }')" "$target"
  done
fi
[ $failed = 0 ] || exit 1
[ "${rc[weft]}" = 77 ] && exit 77
exit 0
