// The precompiled header of unit_tests (tests/meson.build): what every test file includes and
// was half of its compile time. Only the core layer: the kernels' suites call weft::kernels
// functions that weft.h's autograd ops would make ambiguous. Each file still includes what it uses.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/threads.h"
