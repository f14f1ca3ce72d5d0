#!/usr/bin/env bash
# The 1B-scale benchmark (docs/TRANSFORMER.md, "At 1B scale"): a random-weight checkpoint of
# Llama 3.2 1B's shape (scripts/bench_1b.py make, bf16, ~2.5 GB, not committed) loaded by
# weft-transformer at 1, 2 and 4 ranks (FSDP: each rank reads only its byte ranges) with the
# wall time and peak RSS of every rank, then greedy decode tokens/s in weft (f32) beside
# transformers' generate with its cache (f32 and bf16, same threads), and weft-bench's add_
# bandwidth for the bytes/token x tokens/s comparison. Prints a table; a developer tool, never
# part of the tests.
#   bash scripts/bench_1b.sh BUILD_DIR [WORK_DIR]     (default WORK_DIR /tmp/weft-1b)
# Environment: HF_VENV (default /tmp/hfenv, made by scripts/hf_reference.sh), THREADS (2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build=$(cd "$1" && pwd)
work=${2:-/tmp/weft-1b}
venv="${HF_VENV:-/tmp/hfenv}"
threads=${THREADS:-2}
exe="$build/apps/transformer/weft-transformer"
py="$venv/bin/python"
[ -x "$py" ] && "$py" -c 'import torch, transformers' 2>/dev/null ||
  { echo "bench_1b.sh: no torch/transformers venv at $venv (bash scripts/hf_reference.sh fixtures makes it)" >&2; exit 2; }
model="$work/llama-3.2-1b-shape"
mkdir -p "$work"
[ -f "$model/model.safetensors" ] || "$py" "$here/bench_1b.py" make --out "$model"
bytes=$(stat -c %s "$model/model.safetensors")
cat "$model/model.safetensors" >/dev/null  # a warm page cache
prompt="0123456789abcdef"  # 16 ids (its bytes)

echo "| what | ranks | wall s | peak RSS per rank (MiB) | file GB/s per rank |"
echo "|---|---:|---:|---:|---:|"
for np in 1 2 4; do  # load, then a one-token prompt forward: --tokens 0
  if [ "$np" = 1 ]; then
    /usr/bin/time -f "%e %M" -o "$work/time.1" "$exe" sample --from "$model" --prompt "$prompt" --tokens 0 --ids \
      --threads "$threads" >/dev/null 2>"$work/load.err"
  else
    OMP_NUM_THREADS=1 mpirun -np "$np" --oversubscribe --bind-to none bash -c \
      '/usr/bin/time -f "%e %M" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/time" "$exe" sample --fsdp --from "$model" \
      --prompt "$prompt" --tokens 0 --ids --threads 1 >/dev/null 2>"$work/load.err"
  fi
  wall=$(cat "$work"/time.* | awk '{ if ($1 > w) w = $1 } END { print w }')
  rss=$(cat "$work"/time.* | awk '{ printf "%s%d", (NR > 1 ? " / " : ""), $2 / 1024 }')
  rate=$(awk -v b="$bytes" -v n="$np" -v w="$wall" 'BEGIN { printf "%.2f", b / n / w / 1e9 }')
  echo "| load + prompt | $np | $wall | $rss | $rate |"
  rm -f "$work"/time.*
done

weft=$("$exe" sample --from "$model" --prompt "$prompt" --tokens 32 --greedy --ids --threads "$threads" 2>&1 >"$work/weft.ids")
tps=$(echo "$weft" | sed -n 's/.*then \([0-9.]*\) tokens\/s.*/\1/p')
echo "| weft decode f32 | 1 | | | $tps tokens/s |"
for dtype in f32 bf16; do
  OMP_NUM_THREADS=$threads "$py" "$here/bench_1b.py" decode --from "$model" --threads "$threads" --dtype $dtype \
    --new 32 >"$work/hf.$dtype.json"
  echo "| transformers decode $dtype | 1 | | | $(jq -r .decode_tokens_per_s "$work/hf.$dtype.json") tokens/s |"
done
[ "$(jq -c '.ids' "$work/hf.f32.json" | tr -d '[]')" = "$(cat "$work/weft.ids")" ] &&
  echo "weft's 32 greedy ids equal transformers' f32 ids" || echo "weft's greedy ids differ from transformers' f32 ids"
bw=$("$build/apps/bench/weft-bench" --quick --threads "$threads" 2>/dev/null | grep "add_" | tail -1)
echo "weft-bench add_ row: $bw"
echo "bytes per token (f32 weights, tied head read once): $(( bytes * 2 )) (file: $bytes bf16)"
