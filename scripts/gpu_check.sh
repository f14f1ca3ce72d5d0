#!/usr/bin/env bash
# Everything weft checks on a machine with an NVIDIA GPU, in one run (docs/CUDA.md, "On a GPU"):
#   1. the GPU suites (cuda_runtime, cuda_conformance, dist_nccl and fsdp_cuda at one rank);
#   2. weft-transformer train (on docs/PERFORMANCE.md as text), GPT and --arch llama, 20 steps,
#      f32 and --mixed-precision bf16, on cuda and on cpu from the same seed (each step's loss
#      side by side), then sample from the cpu run's checkpoint, greedy and drawn (one seed),
#      with and without the KV cache, on both devices (the ids);
#   3. scripts/bench_gpt2.sh (GPT-2 124M bf16: weft, PyTorch eager, torch.compile) and weft's
#      step op by op (weft-bench-gpt2 --profile), unless BENCH=0;
#   4. the rest of the suite (meson test), if there is time, unless SUITE=0.
#   scripts/gpu_check.sh [BUILD_DIR] [OUT_DIR]     (build with -Dcuda=enabled first)
# Each part runs under a time limit (PART_SECONDS, default 120; the benchmark gets BENCH_SECONDS,
# default 200) and all of them within TOTAL_SECONDS (default 480: a part that would start later
# is listed as not run, the suite gets what is left), each writing its log to OUT_DIR (default
# BUILD_DIR/gpu-check); a summary of every part ends the output. MESON (default meson) runs the suite.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/gpu-check}
mkdir -p "$out"
part_s=${PART_SECONDS:-120}
deadline=$((SECONDS + ${TOTAL_SECONDS:-480}))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 WEFT_COLLECTIVE_TIMEOUT=60
declare -a summary
note() { summary+=("$1"); echo "== $1"; }
# part NAME COMMAND...: COMMAND under the time limit, its output in OUT_DIR/NAME.log.
part() {
  local name=$1
  shift
  echo
  echo "## $name: $*"
  local t0=$SECONDS left=$((deadline - SECONDS))
  if [ $left -lt 15 ]; then note "$name: not run (out of time)"; return 124; fi
  timeout -k 5 $((part_s < left ? part_s : left)) "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  note "$name: exit $rc, $((SECONDS - t0)) s"
  return $rc
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"

# 1. The GPU suites, as meson registers them (tests/meson.build).
t=$build/tests
part cuda_runtime env OMP_NUM_THREADS=2 "$t/test_cuda_runtime"
part cuda_conformance env OMP_NUM_THREADS=2 "$t/test_cuda_conformance"
part dist_nccl_np1 env OMP_NUM_THREADS=1 WEFT_TEST_GPUS=1 "$t/test_dist_nccl"
part fsdp_cuda_np1 env OMP_NUM_THREADS=1 WEFT_TEST_GPUS=1 "$t/test_fsdp_cuda"

# 2. The apps on cuda against cpu.
exe=$build/apps/transformer/weft-transformer
# "step loss" per training line of a metrics file (its keys in any order).
losses() { grep -v '"split"' "$1" | awk '{ match($0, /"step":[0-9]+/); st = substr($0, RSTART + 7, RLENGTH - 7)
  match($0, /"loss":[^,}]+/); print st, substr($0, RSTART + 7, RLENGTH - 7) }'; }
# compare_losses A B: each step's two losses and their relative difference; the largest last.
compare_losses() {
  awk 'NR == FNR { a[$1] = $2; next } ($1 in a) { d = a[$1] - $2; if (d < 0) d = -d; r = d / (a[$1] < 0 ? -a[$1] : a[$1]);
    if (r > m) m = r; n++; printf "step %s cpu %s cuda %s rel %.2e\n", $1, a[$1], $2, r }
    END { printf "%d steps, max rel %.2e\n", n, m }' <(losses "$1") <(losses "$2")
}
train_pair() {  # NAME FLAGS...: train on cpu (with a checkpoint) and on cuda, then compare
  local name=$1
  shift
  local cfg=(--n-layer 2 --n-head 4 --d-model 64 --ctx 64 --batch-size 8 --steps 20 --warmup 3 --lr 3e-3 --seed 0
             --eval-every 0 --eval-iters 2 --log-every 1 --threads 8 --data docs/PERFORMANCE.md "$@")
  rm -rf "$out/$name-ck" "$out/$name-cpu.jsonl" "$out/$name-cuda.jsonl"
  part "train-$name-cpu" "$exe" train "${cfg[@]}" --device cpu --metrics "$out/$name-cpu.jsonl" --checkpoint-dir "$out/$name-ck"
  part "train-$name-cuda" "$exe" train "${cfg[@]}" --device cuda --metrics "$out/$name-cuda.jsonl"
  compare_losses "$out/$name-cpu.jsonl" "$out/$name-cuda.jsonl" | tee "$out/$name-losses.txt"
  note "train $name: cuda vs cpu losses, $(tail -1 "$out/$name-losses.txt")"
}
sample_pair() {  # NAME MODE FLAGS...: ids from NAME's cpu checkpoint, cpu and cuda, with and without the cache
  local name=$1 mode=$2 ids=()
  shift 2
  for dev in cpu cuda; do
    for cache in "" --no-cache; do
      part "sample-$name-$mode-$dev$cache" "$exe" sample --checkpoint "$out/$name-ck" --prompt "Q: " --tokens 32 \
        --ids --device "$dev" $cache --threads 8 "$@"
      ids+=("$(grep -E '^[0-9]+(,[0-9]+)*$' "$out/sample-$name-$mode-$dev$cache.log" | tail -n 1)")
    done
  done
  local verdict="all four equal: ${ids[0]}"
  for i in 1 2 3; do [ "${ids[$i]}" = "${ids[0]}" ] || verdict="DIFFER (cpu, cpu --no-cache, cuda, cuda --no-cache: ${ids[*]})"; done
  note "sample $name $mode ids: $verdict"
}
train_pair gpt-f32
train_pair gpt-bf16 --mixed-precision bf16
train_pair llama-f32 --arch llama --n-kv-head 2
train_pair llama-bf16 --arch llama --n-kv-head 2 --mixed-precision bf16
for name in gpt-f32 llama-f32; do
  sample_pair $name greedy --greedy
  sample_pair $name drawn --temperature 1 --seed 3
done

# 3. GPT-2 124M bf16 beside PyTorch on this GPU (BENCH=0 leaves it out).
# Then weft's step op by op (each op timed alone on the device).
if [ "${BENCH:-1}" != 0 ]; then
  part_s=${BENCH_SECONDS:-200} part bench_gpt2 env OUT="$out/bench-gpt2" bash scripts/bench_gpt2.sh "$build" --steps 30
  part profile_gpt2 "$build/apps/bench/weft-bench-gpt2" --profile --steps 6 --warmup 2
fi

# 4. The rest of the suite (SUITE=0 leaves it out).
[ "${SUITE:-1}" = 0 ] || part_s=100000 part suite ${MESON:-meson} test -C "$build" --no-rebuild --print-errorlogs \
  --num-processes "$(nproc)"
if [ -f "$out/suite.log" ]; then
  grep -E "^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):" "$out/suite.log"
  grep -E "(FAIL|TIMEOUT) " "$out/suite.log" | head -40
fi

echo
echo "## summary"
printf '%s\n' "${summary[@]}"
