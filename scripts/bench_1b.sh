#!/usr/bin/env bash
# The 1B-scale benchmark (docs/TRANSFORMER.md, "At 1B scale"): a random-weight checkpoint of
# Llama 3.2 1B's shape (scripts/bench_1b.py make, bf16, ~2.5 GB, not committed) loaded by
# weft-transformer in f32 and bf16 (sample --dtype) at 1, 2 and 4 ranks (FSDP: each rank reads
# only its byte ranges) with the load time, wall time and peak RSS of every rank, then greedy
# decode tokens/s in weft beside transformers' generate with its cache (f32 and bf16, same
# threads; how many greedy ids agree), weft-bench's add_, one-read-stream and decode-product bandwidths for
# the bytes/token x tokens/s comparison, and the prefill of a 512-token prompt in both. Prints
# tables; a developer tool, never part of the tests.
#   bash scripts/bench_1b.sh BUILD_DIR [WORK_DIR]     (default WORK_DIR /tmp/weft-1b)
# Environment: HF_VENV (default /tmp/hfenv, made by scripts/hf_reference.sh), THREADS (2), ROUNDS (3),
# PREFILL (the long prompt's tokens, 512).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build=$(cd "$1" && pwd)
work=${2:-/tmp/weft-1b}
venv="${HF_VENV:-/tmp/hfenv}"
threads=${THREADS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the 2- and 4-rank loads, also as root
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

# Each load runs twice, back to back: on a guest whose host takes back memory left idle, the
# first large allocation after a pause faults in slower pages (the second is the machine's own rate).
load_once() {  # dtype ranks: rank 0's "loaded ... in S s"; the wall time and peak RSS of every rank in $work/time.*
  if [ "$2" = 1 ]; then
    /usr/bin/time -f "%e %M" -o "$work/time.1" "$exe" sample --from "$model" --prompt "$prompt" --tokens 0 --ids \
      --threads "$threads" --dtype "$1" >/dev/null 2>"$work/load.err"
  else
    OMP_NUM_THREADS=1 mpirun -np "$2" --oversubscribe --bind-to none bash -c \
      '/usr/bin/time -f "%e %M" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/time" "$exe" sample --fsdp --from "$model" \
      --prompt "$prompt" --tokens 0 --ids --threads 1 --dtype "$1" >/dev/null 2>"$work/load.err"
  fi
  sed -n 's/.*loaded .* in \([0-9.]*\) s$/\1/p' "$work/load.err"
}
rate() { awk -v b="$bytes" -v n="$1" -v s="$2" 'BEGIN { printf "%.2f", b / n / s / 1e9 }'; }
echo "| what | ranks | process wall s (again) | load s, first / again | peak RSS per rank (MiB) | file GB/s per rank, first / again |"
echo "|---|---:|---:|---:|---:|---:|"
for dtype in f32 bf16; do
  for np in 1 2 4; do  # load, no token generated (--tokens 0); the time is rank 0's, after all ranks
    first=$(load_once "$dtype" "$np"); rm -f "$work"/time.*
    again=$(load_once "$dtype" "$np")
    wall=$(cat "$work"/time.* | awk '{ if ($1 > w) w = $1 } END { print w }')
    rss=$(cat "$work"/time.* | awk '{ printf "%s%d", (NR > 1 ? " / " : ""), $2 / 1024 }')
    echo "| load $dtype | $np | $wall | $first / $again | $rss | $(rate "$np" "$first") / $(rate "$np" "$again") |"
    rm -f "$work"/time.*
  done
done

# Decode, weft and transformers alternated for $ROUNDS rounds (the guest's memory bandwidth moves
# from minute to minute): each round's tokens/s (transformers' the best of its two generations),
# then the medians and their ratio.
reads=""
bandwidth() {  # no GEMM rows (--rows none): the peaks, add_, the read stream and the decode products
  "$build/apps/bench/weft-bench" --quick --rows none --threads "$threads" 2>/dev/null | grep -E "add_|read stream|decode product" | tr '\n' ' '
}
bw_before=$(bandwidth)
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
echo "| decode, batch 1, $threads threads | rounds (tokens/s) | median | weft / transformers |"
echo "|---|---|---:|---:|"
for dtype in f32 bf16; do
  w=""; h=""
  for r in $(seq "${ROUNDS:-3}"); do
    weft=$("$exe" sample --from "$model" --prompt "$prompt" --tokens 32 --greedy --ids --threads "$threads" \
           --dtype "$dtype" 2>&1 >"$work/weft.$dtype.ids")
    w="$w $(echo "$weft" | sed -n 's/.*then \([0-9.]*\) tokens\/s.*/\1/p')"
    OMP_NUM_THREADS=$threads "$py" "$here/bench_1b.py" decode --from "$model" --threads "$threads" --dtype $dtype \
      --new 32 >"$work/hf.$dtype.json" 2>/dev/null
    h="$h $(jq -r .decode_tokens_per_s "$work/hf.$dtype.json")"
  done
  wm=$(echo "$w" | median); hm=$(echo "$h" | median)
  echo "| weft $dtype |$w | $wm | $(awk -v a="$wm" -v b="$hm" 'BEGIN { printf "%.2fx", a / b }') |"
  echo "| transformers $dtype |$h | $hm | |"
  per=$bytes; [ "$dtype" = f32 ] && per=$(( 2 * bytes ))
  reads="$reads weft $dtype reads its weights at $(awk -v t="$wm" -v b="$per" 'BEGIN { printf "%.1f", t * b / 1e9 }') GB/s;"
done
for dtype in f32 bf16; do  # how many of the 32 greedy ids agree with transformers' in the same dtype, from the first
  same=$(paste -d' ' <(jq -r '.ids[]' "$work/hf.$dtype.json") <(tr ',' '\n' <"$work/weft.$dtype.ids") |
         awk '$1 != $2 { exit } { n++ } END { print n + 0 }')
  echo "weft's greedy ids in $dtype: the first $same of 32 equal transformers' $dtype ids"
done
# The prefill of a long prompt (its bytes as ids): compute-bound, the head for its last position only.
long=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 12) | head -c "${PREFILL:-512}")
echo "| prefill of ${#long} tokens, $threads threads | rounds (ms) | median | transformers / weft |"
echo "|---|---|---:|---:|"
for dtype in f32 bf16; do
  w=""; h=""
  for r in $(seq "${ROUNDS:-3}"); do
    weft=$("$exe" sample --from "$model" --prompt "$long" --tokens 1 --ids --threads "$threads" --dtype "$dtype" 2>&1 >/dev/null)
    w="$w $(echo "$weft" | sed -n 's/.*prompt of [0-9]* tokens \([0-9.]*\) ms.*/\1/p')"
    h="$h $(OMP_NUM_THREADS=$threads "$py" "$here/bench_1b.py" decode --from "$model" --threads "$threads" --dtype $dtype \
            --prompt "$long" --new 2 2>/dev/null | jq -r .prefill_ms)"
  done
  wm=$(echo "$w" | median); hm=$(echo "$h" | median)
  echo "| weft $dtype |$w | $wm | $(awk -v a="$wm" -v b="$hm" 'BEGIN { printf "%.2fx", b / a }') |"
  echo "| transformers $dtype |$h | $hm | |"
done
echo "weft-bench's add_, read-stream and decode-product rows, before the decode rounds: $bw_before"
echo "and after them: $(bandwidth)"
echo "at the medians:$reads"
echo "bytes per token (tied head read once): f32 $(( bytes * 2 )), bf16 $bytes (the file)"
