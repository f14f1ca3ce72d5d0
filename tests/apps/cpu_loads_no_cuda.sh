#!/usr/bin/env bash
# A CPU program neither links nor loads a CUDA library: weft-mnist's dynamic dependencies name
# none, and a CPU training run loads none (the dynamic loader's own log, LD_DEBUG=files, lists
# every object it maps, dlopen()ed ones included). The control: --device cuda makes the same
# program load weft's CUDA backend (when it was built) and fail with the reason where no GPU is
# visible, so the check would see a CUDA library that was loaded.
# Usage: cpu_loads_no_cuda.sh WEFT_MNIST HAVE_CUDA(0|1)
set -euo pipefail
exe=$1
have_cuda=$2
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # $tmp (removed on exit), fail, loss_at, within
cuda_libs='libweft-cuda|libcudart|libcublas|libnccl|libcuda\.'

ldd "$exe" >"$tmp/ldd"
if grep -E "$cuda_libs" "$tmp/ldd"; then fail "$exe links a CUDA library (ldd above)"; fi

LD_DEBUG=files "$exe" --steps 2 --batch-size 16 --threads 1 >"$tmp/out" 2>"$tmp/loads" ||
  fail "CPU run failed: $(grep -v '^ *[0-9]*:' "$tmp/loads" | tail -5)"
grep -q 'file=.*libweft-core' "$tmp/loads" || fail "LD_DEBUG=files logged no loads; the check cannot see anything"
if grep -E "file=[^ ]*($cuda_libs)" "$tmp/loads"; then fail "a CPU run loaded a CUDA library (above)"; fi

status=0
LD_DEBUG=files "$exe" --device cuda --steps 1 --batch-size 16 --threads 1 >"$tmp/out" 2>"$tmp/loads" || status=$?
if [ "$have_cuda" = 1 ]; then
  grep -Eq 'file=[^ ]*libweft-cuda.*dynamically loaded' "$tmp/loads" ||
    fail "--device cuda did not load libweft-cuda: $(grep -v '^ *[0-9]*:' "$tmp/loads" | tail -3)"
  loaded="loads libweft-cuda on demand"
else
  loaded="(built without CUDA)"
fi
if [ "$status" -ne 0 ]; then
  grep -Eq -- "--device cuda: (no CUDA device is visible|weft was built without CUDA)" "$tmp/loads" ||
    fail "--device cuda failed without naming why: $(grep -v '^ *[0-9]*:' "$tmp/loads" | tail -3)"
fi
echo "cpu program links and loads no CUDA library; --device cuda $loaded (exit $status)"
