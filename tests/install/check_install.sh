#!/usr/bin/env bash
# Installs weft into a temporary prefix, then builds and runs every C++ example in README.md
# (each ```cpp block that includes <weft/weft.h>) against the installed headers and weft.pc:
# `meson install` must give a usable library, and the README's code must work.
set -euo pipefail
build_dir=$1
src_dir=$2
prefix=$3
libdir=$4
# A sanitized build's libraries (scripts/sanitize.sh) need the example built with the same
# sanitizers, so that their runtime is loaded first.
sanitize=${5:-none}
san_flags=()
[ "$sanitize" = none ] || san_flags=("-fsanitize=$sanitize")
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
meson install -C "$build_dir" --destdir "$dest" --no-rebuild --quiet
root="$dest$prefix"
pc=$(find "$root" -name weft.pc | head -1)
[ -n "$pc" ] || { echo "weft.pc not installed under $root"; exit 1; }
for h in weft/weft.h weft/core/tensor.h weft/autograd/ops.h weft/kernels/elementwise.h; do
  [ -f "$root/include/$h" ] || { echo "missing installed header include/$h"; exit 1; }
done
# Point a copy of weft.pc at the temporary prefix.
mkdir -p "$dest/pc"
sed "s|^prefix=.*|prefix=$root|" "$pc" > "$dest/pc/weft.pc"
export PKG_CONFIG_PATH="$dest/pc"
flags=$(pkg-config --cflags --libs weft)
# Consumers get weft's own include path and libraries only: no Eigen, MPI or CUDA paths.
if grep -Eq 'eigen|openmpi|cuda' <<<"$flags"; then echo "weft.pc leaks private paths: $flags"; exit 1; fi
for lib in core kernels autograd nn dist tp fsdp; do
  ls "$root/$libdir/libweft-$lib.so.0" >/dev/null || { echo "libweft-$lib.so.0 (versioned soname) not installed"; exit 1; }
done
awk -v dir="$dest" '
  /^```cpp/ { n++; file = dir "/readme_" n ".cpp"; inblock = 1; next }
  /^```/ { inblock = 0; next }
  inblock { print > file }' "$src_dir/README.md"
# A program's own headers at weft's paths (its core/tensor.h, nn/layers.h, ...), on an include
# path searched before weft's, must not stand in for weft's: each one here is an #error.
shadow="$dest/shadow"
(cd "$root/include/weft" && find . -name '*.h' ! -name weft.h) | while read -r h; do
  mkdir -p "$shadow/$(dirname "$h")"
  echo "#error \"a program's own ${h#./} was taken for weft's\"" > "$shadow/$h"
done
count=0
for src in "$dest"/readme_*.cpp; do
  grep -q '#include <weft/weft.h>' "$src" || continue
  exe="${src%.cpp}"
  # As the README says: pkg-config, plus an rpath to the prefix's libdir.
  c++ -std=c++20 -O1 "${san_flags[@]}" "$src" -o "$exe" -I"$shadow" $flags \
    -Wl,-rpath,"$(pkg-config --variable=libdir weft)"
  if ldd "$exe" | grep -E 'libweft-cuda|libcudart|libcublas|libnccl'; then
    echo "$exe (a CPU program) links a CUDA library (above)"; exit 1
  fi
  # Run it with the dynamic loader's log: it must load weft from the prefix and no CUDA library.
  (cd "$dest" && env -u LD_LIBRARY_PATH LD_DEBUG=files "$exe" >"$exe.out" 2>"$exe.loads") ||
    { echo "$exe failed; its stderr without the loader's log:"; grep -Ev '^ *[0-9]+:' "$exe.loads" | tail -n 30; exit 1; }
  grep -q "calling init: $root/$libdir/libweft-core.so.0" "$exe.loads" ||
    { echo "$exe did not load libweft-core from the prefix: $(grep -o "calling init: [^ ]*weft-core[^ ]*" "$exe.loads" | head -1)"; exit 1; }
  if grep -E 'file=[^ ]*(libweft-cuda|libcudart|libcublas|libnccl)' "$exe.loads"; then
    echo "$exe (a CPU program) loaded a CUDA library (above)"; exit 1
  fi
  cat "$exe.out"
  count=$((count + 1))
done
# The README's sharded first model prints the losses of the first model (the same model and
# batch unsharded): alone, and under mpirun at 2 and 4 ranks where mpirun is installed.
sharded=$(grep -l 'fsdp::fully_shard' "$dest"/readme_*.cpp | head -1)
[ -n "$sharded" ] || { echo "no README example shards a model with fsdp::fully_shard"; exit 1; }
plain="$dest/readme_1.out"
cmp -s "$plain" "${sharded%.cpp}.out" ||
  { echo "the sharded example's losses differ from the first model's:"; diff "$plain" "${sharded%.cpp}.out"; exit 1; }
if command -v mpirun >/dev/null && [ "$sanitize" = none ]; then
  for np in 2 4; do
    (cd "$dest" && env -u LD_LIBRARY_PATH OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       timeout 120 mpirun -np $np --oversubscribe --bind-to none "${sharded%.cpp}" >"$dest/sharded_np$np.out" \
       2>"$dest/np$np.err") || { echo "the sharded example under mpirun -np $np failed:"; tail -20 "$dest/np$np.err"; exit 1; }
    cmp -s "$plain" "$dest/sharded_np$np.out" || { echo "the sharded example's losses at $np ranks differ from the first"\
      "model's:"; diff "$plain" "$dest/sharded_np$np.out"; exit 1; }
  done
else
  echo "the sharded example is not run under mpirun here ($(command -v mpirun >/dev/null && echo "a $sanitize build" || echo "no mpirun"))"
fi
[ "$count" -ge 2 ] || { echo "expected at least 2 README examples, found $count"; exit 1; }
echo "installed headers, weft.pc and $count README examples work; the sharded one logs the first model's losses"
