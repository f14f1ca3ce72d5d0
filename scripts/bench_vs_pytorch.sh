#!/usr/bin/env bash
# weft beside PyTorch on this CPU: one ratio table over models x threads x precisions.
#   bash scripts/bench_vs_pytorch.sh [--build DIR] [--models LIST] [--threads LIST] [--fsdp]
#        [--rounds N] [--runs LIST] [--lora-rank R]
# Models (weft-transformer train's flags; scripts/transformer_pytorch.py takes the same):
#   gpt-medium    gpt2 L6 H6 d384, ctx 256, batch 8, bytes of the corpus
#   llama-medium  llama L6 H6 (2 kv heads) d384 ffn 1024, ctx 256, batch 8, bytes
#   gpt2-124m     GPT-2 small: gpt2 L12 H12 d768, ctx 1024, batch 2, GPT-2's 50,257-token BPE
#   llama-350m    llama L24 H16 (8 kv heads) d1024 ffn 2816, ctx 1024, batch 2, the same tokens
# The corpus is Debian's fortunes, as text for the byte models and through `weft-transformer
# prepare` with tests/data/gpt2/tokenizer.json for the others. Runs, each a whole training command:
#   weft-f32 weft-bf16 (--mixed-precision bf16)   torch-f32 torch-bf16 (autocast)
#   torch-compile-bf16 (torch.compile + autocast)
# at each --threads count, and with --fsdp also at 2 ranks x 1 thread (weft --fsdp under mpirun;
# PyTorch FSDP2 under torchrun over gloo, bf16 as MixedPrecisionPolicy). Rounds alternate the order
# of the runs. Each run's figure: the global tokens per second of its median step after the
# warm-up steps (weft: the per-step rates of --metrics; PyTorch: its summary line). The table
# gives each run's figure per round and weft / PyTorch per round: f32 against eager f32, bf16
# against autocast and against compile + autocast. --lora-rank R: LoRA fine-tuning instead of full
# training (weft --lora-rank R --lora-alpha 2R; PyTorch + peft with the same rank, alpha and targets).
# Environment: PYTHON (default /tmp/torchenv/bin/python: a venv with torch and numpy), OUT (logs,
#   default BUILD/bench-vs-pytorch), STEPS_<MODEL>/WARMUP_<MODEL> (e.g. STEPS_gpt2_124m=8).
# A developer tool for docs/PERFORMANCE.md: never part of meson test or CI.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build models="gpt-medium llama-medium gpt2-124m llama-350m" threads="1 2" fsdp=0 rounds=2 lora=0
runs="weft-f32 weft-bf16 torch-f32 torch-bf16 torch-compile-bf16"
while [ $# -gt 0 ]; do
  case $1 in --fsdp) ;; *) [ $# -ge 2 ] || { echo "bench_vs_pytorch.sh: $1 needs a value" >&2; exit 2; } ;; esac
  case $1 in
    --build) build=$2; shift 2 ;;
    --models) models=${2//,/ }; shift 2 ;;
    --threads) threads=${2//,/ }; shift 2 ;;
    --fsdp) fsdp=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --runs) runs=${2//,/ }; shift 2 ;;
    --lora-rank) lora=$2; shift 2 ;;
    *) echo "bench_vs_pytorch.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
for r in $runs; do
  case $r in weft-f32|weft-bf16|torch-f32|torch-bf16|torch-compile-bf16) ;;
    *) echo "bench_vs_pytorch.sh: unknown run '$r' (weft-f32 weft-bf16 torch-f32 torch-bf16 torch-compile-bf16)" >&2; exit 2 ;;
  esac
done
for n in "$rounds" "$lora" $threads; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench_vs_pytorch.sh: '$n' is not a count (--rounds, --lora-rank, --threads)" >&2; exit 2; }
done
[ "$rounds" -ge 1 ] || { echo "bench_vs_pytorch.sh: --rounds must be at least 1" >&2; exit 2; }
weft="$build/apps/transformer/weft-transformer"
[ -x "$weft" ] || { echo "bench_vs_pytorch.sh: no $weft: build it first (meson setup $build && ninja -C $build)" >&2; exit 1; }
python=${PYTHON:-/tmp/torchenv/bin/python}
"$python" -c 'import torch, numpy' 2>/dev/null || {
  echo "bench_vs_pytorch.sh: $python has no torch/numpy: python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy" >&2
  exit 1
}
out=${OUT:-$build/bench-vs-pytorch}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

shape() {  # MODEL: the shape and batch flags, then `|` and the data kind (bytes or tokens)
  case $1 in
    gpt-medium) echo "--arch gpt2 --n-layer 6 --n-head 6 --d-model 384 --ctx 256 --batch-size 8|bytes" ;;
    llama-medium) echo "--arch llama --n-layer 6 --n-head 6 --n-kv-head 2 --d-model 384 --ffn-dim 1024 --ctx 256 --batch-size 8|bytes" ;;
    gpt2-124m) echo "--arch gpt2 --n-layer 12 --n-head 12 --d-model 768 --ctx 1024 --batch-size 2|tokens" ;;
    llama-350m) echo "--arch llama --n-layer 24 --n-head 16 --n-kv-head 8 --d-model 1024 --ffn-dim 2816 --ctx 1024 --batch-size 2|tokens" ;;
    *) echo "bench_vs_pytorch.sh: unknown model '$1' (gpt-medium llama-medium gpt2-124m llama-350m)" >&2; exit 2 ;;
  esac
}
steps_of() {  # MODEL: steps and warm-up steps (override with STEPS_<model>, WARMUP_<model>)
  local v=${1//-/_} s=20 w=5
  case $1 in gpt2-124m) s=8 w=2 ;; llama-350m) s=6 w=2 ;; esac
  local sv="STEPS_$v" wv="WARMUP_$v"
  echo "${!sv:-$s} ${!wv:-$w}"
}

for m in $models; do shape "$m" > /dev/null || exit 2; done  # an unknown model named before any work

# The data: the corpus as text, and as GPT-2 tokens.
corpus="$out/corpus.txt"
if [ ! -s "$corpus" ]; then
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat > "$corpus" ||
    { echo "bench_vs_pytorch.sh: no fortunes (apt-get install fortunes)" >&2; exit 1; }
fi
tokens="$out/gpt2-tokens"
if [ ! -f "$tokens/train.tokens" ]; then
  "$weft" prepare --tokenizer tests/data/gpt2/tokenizer.json --data "$corpus" --out "$tokens" > "$out/prepare.txt" 2>&1 ||
    { cat "$out/prepare.txt" >&2; exit 1; }
fi

median_rate() {  # METRICS_JSONL WARMUP: median per-step tokens/s after the warm-up steps
  sed -n 's/.*"step":\([0-9]*\).*"tokens_per_s":\([0-9.e+]*\).*/\1 \2/p' "$1" | awk -v w="$2" '$1 > w { print $2 }' |
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

run_one() {  # MODEL RUN THREADS(or "fsdp") ROUND: prints the run's tokens/s, or "-" when it failed
  local model=$1 run=$2 t=$3 round=$4 spec flags kind data steps warmup log
  spec=$(shape "$model"); flags=${spec%|*}; kind=${spec#*|}
  data=$corpus; [ "$kind" = tokens ] && data=$tokens
  read -r steps warmup <<< "$(steps_of "$model")"
  log="$out/$model.$t.$run.r$round"
  rm -f "$log.jsonl"  # --metrics appends
  local nthreads=$t launch_weft=() launch_torch=("$python") fsdp_flag=() lora_weft=() lora_torch=()
  [ "$lora" -gt 0 ] && lora_weft=(--lora-rank "$lora" --lora-alpha $((2 * lora))) lora_torch=(--lora-rank "$lora")
  if [ "$t" = fsdp ]; then
    nthreads=1 fsdp_flag=(--fsdp)
    launch_weft=(mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1)
    launch_torch=("$(dirname "$python")/torchrun" --standalone --nproc-per-node 2)
  fi
  case $run in
    weft-*)
      local mp=none; [ "$run" = weft-bf16 ] && mp=bf16
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$nthreads "${launch_weft[@]}" "$weft" train $flags "${fsdp_flag[@]}" --data "$data" --steps "$steps" \
        --warmup 0 --eval-every 0 --log-every 1 --threads "$nthreads" --mixed-precision $mp "${lora_weft[@]}" --metrics "$log.jsonl" \
        > "$log.txt" 2>&1 && median_rate "$log.jsonl" "$warmup" || echo -
      ;;
    torch-*)
      local extra=(--precision f32)
      case $run in torch-bf16) extra=(--precision bf16) ;; torch-compile-bf16) extra=(--precision bf16 --compile) ;; esac
      # shellcheck disable=SC2086
      OMP_NUM_THREADS=$nthreads "${launch_torch[@]}" scripts/transformer_pytorch.py $flags "${fsdp_flag[@]}" --data "$data" \
        --steps "$steps" --warmup "$warmup" --threads "$nthreads" "${extra[@]}" "${lora_torch[@]}" > "$log.txt" 2>&1 &&
        sed -n 's/^summary .*tokens_per_s=\([0-9.]*\).*/\1/p' "$log.txt" | tail -1 | grep . || echo -
      ;;
  esac
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores"
echo "# flags: $(grep -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $("$python" -c 'import torch; print("torch", torch.__version__, "cpu capability", torch.backends.cpu.get_cpu_capability())')"
[ "$lora" -gt 0 ] && echo "# LoRA rank $lora, alpha $((2 * lora)): weft --lora-rank, PyTorch + peft $("$python" -c 'import peft; print(peft.__version__)' 2>&1 | tail -1)"
echo "# weft $(git rev-parse --short HEAD 2>/dev/null); load $(cut -d' ' -f1-3 /proc/loadavg); logs in $out"
cells=()
for m in $models; do
  shape "$m" > /dev/null || exit 2
  for t in $threads; do cells+=("$m $t"); done
  [ "$fsdp" = 1 ] && cells+=("$m fsdp")
done
declare -A rate
read -ra order <<< "$runs"
for ((r = 1; r <= rounds; r++)); do
  for cell in "${cells[@]}"; do
    read -r m t <<< "$cell"
    seq=("${order[@]}")
    if ((r % 2 == 0)); then for ((i = ${#order[@]} - 1, j = 0; i >= 0; i--, j++)); do seq[j]=${order[i]}; done; fi
    for run in "${seq[@]}"; do
      [ "$t" = fsdp ] && [ "$run" = torch-compile-bf16 ] && continue
      rate["$cell $run $r"]=$(run_one "$m" "$run" "$t" "$r")
      echo "# round $r: $m threads=$t $run ${rate["$cell $run $r"]} tokens/s" >&2
    done
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }
per_round() {  # CELL RUN: "r1 / r2 / ..." of tokens/s
  local s="" r
  for ((r = 1; r <= rounds; r++)); do
    s+="${s:+ / }$(awk -v v="${rate["$1 $2 $r"]:--}" 'BEGIN { if (v == "-") print "-"; else printf "%.0f", v }')"
  done
  echo "$s"
}
ratios() {  # CELL RUN_A RUN_B: A / B per round
  local s="" r
  for ((r = 1; r <= rounds; r++)); do s+="${s:+ / }$(ratio "${rate["$1 $2 $r"]:--}" "${rate["$1 $3 $r"]:--}")"; done
  echo "$s"
}
echo
echo "tokens/s per round (r1 / r2 ...):"
echo
header="| model | threads |"; rule="|---|---|"
for run in "${order[@]}"; do header+=" $run |"; rule+="---:|"; done
echo "$header"; echo "$rule"
for cell in "${cells[@]}"; do
  read -r m t <<< "$cell"
  line="| $m | ${t/fsdp/2 ranks x 1} |"
  for run in "${order[@]}"; do line+=" $(per_round "$cell" "$run") |"; done
  echo "$line"
done
echo
echo "weft / PyTorch per round:"
echo
echo "| model | threads | weft f32 / torch f32 | weft bf16 / autocast | weft bf16 / compile+autocast |"
echo "|---|---|---:|---:|---:|"
for cell in "${cells[@]}"; do
  read -r m t <<< "$cell"
  echo "| $m | ${t/fsdp/2 ranks x 1} | $(ratios "$cell" weft-f32 torch-f32) | $(ratios "$cell" weft-bf16 torch-bf16) |" \
       "$(ratios "$cell" weft-bf16 torch-compile-bf16) |"
done
