#!/usr/bin/env bash
# The kernels built for one instruction set (kernels/meson.build: libweft-kernels-<isa>.a)
# must define no weak or unique symbols: an inline function or template instantiated there
# (std::vector, std::fill, ...) is compiled with that set's flags, and the linker keeps one
# copy of each such symbol for the whole library, so code that runs on any CPU could end up
# calling the AVX-512 copy. Usage: check_isa_libs.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: check_isa_libs.sh BUILD_DIR}
shopt -s nullglob
libs=("$build"/kernels/libweft-kernels-*.a)
if [ ${#libs[@]} -eq 0 ]; then
  echo "skipping: no per-instruction-set kernel libraries in $build/kernels (built on x86-64 only)"
  exit 77
fi
status=0
for lib in "${libs[@]}"; do
  # DW.ref.__gxx_personality_v0 is data (a pointer to the C++ runtime's exception personality
  # routine, the same in every object file), not code; clang's __clang_call_terminate (the
  # sanitizer builds) is two calls, __cxa_begin_catch and std::terminate, with no vector code.
  weak=$(nm -C --defined-only "$lib" |
         awk '$2 ~ /^[WVu]$/ && $3 != "DW.ref.__gxx_personality_v0" && $3 != "__clang_call_terminate" { $1 = ""; print }')
  if [ -n "$weak" ]; then
    echo "$(basename "$lib") defines weak or unique symbols (inline code built for its instruction set):"
    echo "$weak" | sed 's/^/  /'
    status=1
  else
    echo "$(basename "$lib"): no weak or unique symbols"
  fi
done
exit $status
