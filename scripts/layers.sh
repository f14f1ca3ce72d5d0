# The layer rule (docs/ARCHITECTURE.md), sourced by check_layers.sh and check_libraries.sh:
# the layers each layer may use besides itself. cuda is the CUDA backend library.
declare -A below=(
  [core]=""
  [kernels]="core"
  [autograd]="core kernels"
  [nn]="core kernels autograd"
  [dist]="core"
  [tp]="core kernels autograd nn dist"
  [fsdp]="core kernels autograd nn dist tp"
  [cuda]="core kernels dist"
)
