#!/usr/bin/env bash
# Checks the built libraries keep the layering (docs/ARCHITECTURE.md): each libweft-<layer>
# needs only the weft libraries below it, and every weft symbol it uses is defined in itself or
# in those (an upward call would be an undefined symbol resolved by a higher layer). The build
# already refuses that link (--no-undefined); this checks the result. Usage: check_libraries.sh BUILD_DIR
set -euo pipefail
build=$1
source "$(dirname "${BASH_SOURCE[0]}")/layers.sh"  # below: what each layer may use
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
defined() { nm -D --defined-only "$build/libweft-$1.so" | awk '{print $NF}' | grep '^_ZN4weft' || true; }
bad=0
for layer in core kernels autograd nn dist tp fsdp cuda; do
  lib="$build/libweft-$layer.so"
  if [ ! -f "$lib" ]; then
    [ "$layer" = cuda ] && continue  # built only with CUDA
    echo "missing $lib"; exit 1
  fi
  needed=$(readelf -d "$lib" | grep NEEDED | grep -o 'libweft-[a-z]*' | sed 's/libweft-//' | sort -u || true)
  for n in $needed; do
    [[ " ${below[$layer]} " == *" $n "* ]] || { echo "libweft-$layer needs libweft-$n, which is not below it"; bad=1; }
  done
  : >"$tmp/ok"
  for l in $layer ${below[$layer]}; do defined "$l" >>"$tmp/ok"; done
  sort -u "$tmp/ok" -o "$tmp/ok"
  nm -D --undefined-only "$lib" | awk '{print $NF}' | grep '^_ZN4weft' | sort -u >"$tmp/used" || true
  missing=$(comm -23 "$tmp/used" "$tmp/ok")
  if [ -n "$missing" ]; then
    echo "libweft-$layer uses weft symbols defined in no layer below it:"
    c++filt <<<"$missing" | head -5
    bad=1
  fi
done
[ "$bad" -eq 0 ] || exit 1
echo "libraries: each libweft-<layer> needs and calls only the layers below it"
