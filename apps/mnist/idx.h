// apps/mnist: reading IDX files (the MNIST family's format), gzip'd or plain.
#pragma once
#include <string>

#include "core/tensor.h"

namespace weft::apps {

// The largest IDX file (compressed or not) and the largest data it may declare: 4 GiB.
constexpr uint64_t kMaxIdxBytes = uint64_t(1) << 32;

// Reads an unsigned-byte IDX file (magic 0x0000_08_nd) as a u8 tensor of its dims. Errors name the file and what is
// wrong: missing, bad magic, unsupported type, truncated data, or bytes left over after the data.
Tensor read_idx(const std::string& path);

struct MnistSplit {
  Tensor images;  // u8 [N, rows * cols]
  Tensor labels;  // i64 [N]
};
struct MnistData {
  MnistSplit train, test;
  int64_t rows = 28, cols = 28;
};

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`; a missing directory or
// file names the path and the Debian package that provides Fashion-MNIST.
MnistData load_mnist(const std::string& dir);
inline const char* kDefaultMnistDir = "/usr/share/datasets/fashion-mnist";

// Images rows `indices[begin, begin + n)` as f32 pixels / 255 [n, rows*cols], labels i64 [n].
std::pair<Tensor, Tensor> mnist_batch(const MnistSplit& split, const std::vector<int64_t>& indices, int64_t begin,
                                      int64_t n);

}  // namespace weft::apps
