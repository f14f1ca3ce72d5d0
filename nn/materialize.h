// nn: deferred initialisation. A model built under `DefaultDeviceGuard g(Device::meta())` has meta parameters: shapes,
// dtypes and the init rule each one's initialiser recorded (the generator's seed and the counters it reserved;
// core/fill_rule.h), no memory. `materialize` gives every meta parameter and buffer of the tree real storage on a
// device, computing the values the same construction would have produced eagerly with the same seed, bit for bit.
// fsdp::fully_shard on such a model instead allocates and initialises only this rank's shards.
#pragma once
#include "module.h"

namespace weft::nn {

// Materialises the tree's meta parameters and buffers on `device`, in place (every handle to a
// parameter, tied slots included, sees the real tensor). Non-meta tensors are left as they are,
// so a partly deferred tree works; a tensor never filled materialises as zeros.
void materialize(Module& module, Device device = kCPU);

// The dotted names of the tree's meta parameters and buffers.
std::vector<std::string> meta_tensor_names(Module& module);

}  // namespace weft::nn
