#!/usr/bin/env bash
# Installs weft into a temporary prefix, then builds and runs the README example against
# the installed headers and weft.pc: `meson install` must give a usable library.
set -euo pipefail
build_dir=$1
src_dir=$2
prefix=$3
libdir=$4
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
c++ -std=c++20 -O1 "$src_dir/tests/install/readme_example.cpp" -o "$dest/readme_example" $flags
LD_LIBRARY_PATH="$root/$libdir" "$dest/readme_example"
echo "installed headers, weft.pc and the README example work"
