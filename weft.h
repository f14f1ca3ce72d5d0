// weft: the umbrella header. Include this to get tensors, autograd and the kernels' knobs.
#pragma once
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "kernels/threads.h"
#include "nn/nn.h"
