// core: checkpoints in the safetensors format (Hugging Face's): an 8-byte little-endian
// header length N, N bytes of JSON naming each tensor's dtype, shape and byte range, then the
// raw little-endian data. Files written here load with Python's `safetensors` and PyTorch,
// and theirs load here (for the dtypes weft has).
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace weft {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;  // ordered
using Metadata = std::map<std::string, std::string>;              // the file's "__metadata__"

// Writes `tensors` (any dtype, strides and device; copied to CPU one at a time, so a model on
// a GPU needs host memory for its largest tensor only) in the given order, atomically: a
// failure midway leaves any old file at `path` intact. Names must be non-empty and unique.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata = {});

struct SafetensorsContents {
  NamedTensors tensors;  // CPU, contiguous, in the order of their data in the file
  Metadata metadata;
};
// Reads and validates the whole file; any malformed input is a weft::Error naming the file.
SafetensorsContents load_safetensors(const std::string& path);

// Header only (the data is not read, but its extent is still validated).
Metadata read_safetensors_metadata(const std::string& path);
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
};
std::vector<SafetensorsEntry> read_safetensors_index(const std::string& path);  // file order

}  // namespace weft
