#!/usr/bin/env bash
# Fails on an #include that points up the layer stack (docs/ARCHITECTURE.md), or from the
# device-neutral layers into a device backend. The build refuses upward calls (each layer is
# its own shared library linked with --no-undefined); this catches upward includes, which can
# compile while calling nothing (types, inline code). Usage: check_layers.sh [SOURCE_ROOT]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/layers.sh"  # below: what each layer may use
cd "${1:-$(dirname "$0")/..}"
bad=0
for layer in core kernels autograd nn dist tp fsdp cuda; do
  ok=" $layer ${below[$layer]} "
  while IFS=: read -r file line text; do
    # "core/x.h" from the source root, or "../core/x.h" from an installed header (docs/ARCHITECTURE.md)
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"(\.\.\/)*([a-z_]+)\/.*/\2/' <<<"$text")
    [[ "$text" =~ \"(\.\./)*[a-z_]+/ ]] || continue
    # cuda/ is the CUDA backend library: no other layer includes it (they reach it through
    # core's registries), and it may use the layers it links (layers.sh).
    if [[ "$layer" != cuda && "$target" == cuda ]]; then
      echo "$file:$line: includes the CUDA backend (${text}); only libweft-cuda (cuda/) may"
      bad=1
      continue
    fi
    if [[ "$ok" != *" $target "* ]]; then
      echo "$file:$line: $layer includes $target (${text}); $layer may include only: $layer ${below[$layer]}"
      bad=1
    fi
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$layer" --include='*.h' --include='*.cpp' \
             --include='*.cu' --include='*.cuh' || true)
done
# Programs reach CUDA through core/stream.h and core/device_runtime.h, never its internals.
if grep -rnE '#[[:space:]]*include[[:space:]]*"cuda/' apps; then
  echo "apps: the lines above include the CUDA backend's internal headers"
  bad=1
fi
if [ "$bad" -ne 0 ]; then
  echo "layering: upward includes found (see docs/ARCHITECTURE.md)"
  exit 1
fi
echo "layering: every include points down (core < kernels < autograd < nn; core < dist; tp on nn and dist; fsdp on top; cuda on core, kernels, dist)"
