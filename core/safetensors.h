// core: checkpoints in the safetensors format (Hugging Face's): an 8-byte little-endian header length N, N bytes of
// JSON naming each tensor's dtype, shape and byte range, then the raw little-endian data. Files written here load with
// Python's `safetensors` and PyTorch, and theirs load here (for the dtypes weft has).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor.h"

namespace weft {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;  // ordered
using Metadata = std::map<std::string, std::string>;              // the file's "__metadata__"

// Writes `tensors` (any dtype, strides and device; copied to CPU one at a time, so a model on
// a GPU needs host memory for its largest tensor only) in the given order, atomically: a
// failure midway leaves any old file at `path` intact. Names must be non-empty and unique.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

struct SafetensorsContents {
  NamedTensors tensors;  // CPU, contiguous, in the order of their data in the file
  Metadata metadata;
};
// Reads and validates the whole file (BOOL bytes must be 0 or 1); bad input is a weft::Error naming the file.
SafetensorsContents load_safetensors(const std::string& path);

// Header only (the data is not read, but its extent is still validated).
Metadata read_safetensors_metadata(const std::string& path);
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
};
std::vector<SafetensorsEntry> read_safetensors_index(const std::string& path);  // file order

// The format's dtype names ("F32", "BF16", ...) and back (nullopt for a name weft lacks).
const char* safetensors_dtype_name(DType dtype);
std::optional<DType> parse_safetensors_dtype(const std::string& name);

// Streaming write: the header comes from `entries` and `produce(i)` is called once per entry,
// in order, for a tensor of that dtype and shape, so only one tensor need exist at a time
// (e.g. gathered or assembled just before it is written). Atomic like save_safetensors; not `replace`: fails, leaving
// it, when a file is at `path` by the time the file is complete (write_file_atomic).
void save_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                      const std::function<Tensor(size_t index)>& produce, const Metadata& metadata = {},
                      bool replace = true);

// Random access: opens the file and validates its header once; read() loads one tensor, so
// a reader that needs a few tensors of a large file holds only those in memory.
class SafetensorsReader {
 public:
  // With `refuse_nonfinite`, every value read is scanned as it is read (a piece at a time, while
  // in cache): a NaN or infinity throws naming the file, the tensor and the element.
  explicit SafetensorsReader(const std::string& path, bool refuse_nonfinite = false);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  const std::string& path() const;
  const Metadata& metadata() const;
  const std::vector<SafetensorsEntry>& entries() const;  // in the order of their data
  const SafetensorsEntry* find(const std::string& name) const;  // null if absent
  // Throws a weft::Error naming the file and the tensor if it is absent or cannot be read.
  Tensor read(const std::string& name);
  // The tensor's narrow(dim, offset, length), contiguous, reading only its bytes: one range for
  // dim 0, one per index of the dims before `dim` otherwise.
  Tensor read_slice(const std::string& name, int64_t dim, int64_t offset, int64_t length);
  // Rows [offset, offset + length) of dim 0 (all of a 0-d tensor) into `dst`, a contiguous CPU
  // tensor of as many elements: the bytes go straight into it when it has the tensor's dtype; a
  // float tensor goes into any float dtype through a buffer of at most `buffer_bytes` (a row at least), each piece
  // converted in cache, each thread into whole 2 MiB pages (threads sharing a fresh page wait on its fault).
  void read_rows_into(const std::string& name, int64_t offset, int64_t length, Tensor& dst,
                      int64_t buffer_bytes = int64_t(4) << 20);
  // The bytes of that buffer for `length` rows of `name` into `dtype` (0: read straight in), e.g. for a memory plan.
  int64_t rows_buffer_bytes(const std::string& name, int64_t length, DType dtype,
                            int64_t buffer_bytes = int64_t(4) << 20) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft
