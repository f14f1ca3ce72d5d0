#!/usr/bin/env bash
# Builds tests/fuzz/fuzz_safetensors.cpp with clang's libFuzzer and AddressSanitizer (the
# reader compiled from source with coverage; the rest of weft from the build's libweft.so) and
# runs it for a fixed number of inputs from a small seed corpus. Exits 77 (meson: SKIP) with
# the reason when clang++ or its fuzzer runtime is missing.
# Usage: run_fuzz.sh SOURCE_ROOT BUILD_ROOT LIBWEFT_SO [RUNS]
# By hand, for longer: run_fuzz.sh . build build/libweft.so 1000000 (or run the built
# build/tests/fuzz/fuzz_safetensors with libFuzzer's own flags).
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
lib=$(realpath "$3")
runs=${4:-2000}
clang=$(command -v clang++ || command -v clang++-14 || true)
[ -n "$clang" ] || { echo "SKIP: clang++ is not installed (Debian: clang, libclang-rt-dev)"; exit 77; }
out="$build/tests/fuzz"
mkdir -p "$out/corpus"
# Does this clang link a fuzzer at all (the runtime ships in libclang-rt-<v>-dev)?
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$out/probe.cpp"
if ! "$clang" -fsanitize=fuzzer "$out/probe.cpp" -o "$out/probe" 2>"$out/probe.err"; then
  echo "SKIP: $clang cannot link -fsanitize=fuzzer: $(head -c 300 "$out/probe.err")"
  exit 77
fi
mpi_flags=$(pkg-config --cflags ompi 2>/dev/null || echo "-I/usr/lib/x86_64-linux-gnu/openmpi/include")
"$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address -DOMPI_SKIP_MPICXX=1 -I"$src" -I"$build" $mpi_flags \
  "$src/tests/fuzz/fuzz_safetensors.cpp" "$src/core/safetensors.cpp" \
  "$lib" -Wl,-rpath,"$(dirname "$lib")" -lfmt -o "$out/fuzz_safetensors"
# Seeds: a valid two-tensor file, an empty one, and a metadata-only one.
seed() {  # seed NAME HEADER_JSON DATA_HEX
  local header=$2 n
  n=${#header}
  { printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))"
    printf '%s' "$header"
    printf "$3"; } >"$out/corpus/$1"
}
seed valid '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[1,2],"data_offsets":[8,10]}}' \
  '\x00\x00\x80\x3f\x00\x00\x00\x40\x01\x02'
seed empty '{}' ''
seed meta '{"__metadata__":{"format":"pt"},"x":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}}' '\x01'
cd "$out"
ASAN_OPTIONS=detect_leaks=0 ./fuzz_safetensors -runs="$runs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
  -seed=1 corpus 2>&1 | tail -5
rm -f fuzz_input.*.safetensors
echo "fuzz_safetensors: $runs inputs without a crash"
