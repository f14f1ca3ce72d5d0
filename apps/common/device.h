// apps: the --device flag. "cpu", "cuda" (this rank's GPU: local rank modulo the visible GPUs,
// the one dist's NCCL groups use) or "cuda:N".
#pragma once
#include <string>

#include "core/device.h"

namespace weft::apps {

// Throws weft::Error naming `app` and the problem when the device cannot be used: an unknown
// name, a weft built without CUDA, no visible CUDA device, an index past the visible ones.
Device parse_device(const std::string& name, const char* app);

// Why no CUDA device can be used ("" when one can): "weft was built without CUDA ..." or "no
// CUDA device is visible (<the driver's reason>)".
std::string cuda_unavailable_reason();

}  // namespace weft::apps
