// apps/transformer: text as raw bytes, split into train and validation parts, and batches
// drawn so that the global batch at a step does not depend on the number of ranks.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"

namespace weft::apps {

// The most text --data may hold, over all its files: 1 GiB.
constexpr uint64_t kMaxTextBytes = uint64_t(1) << 30;

inline constexpr const char* kDefaultTextDir = "/usr/share/games/fortunes";

// A sequence of token ids, each `width` bytes little-endian: text as bytes (width 1) or the ids
// of a token file (2 or 4, token_data.h). It does not own what it points at.
struct TokenView {
  const unsigned char* p = nullptr;
  int64_t n = 0;
  int width = 1;
  int64_t size() const { return n; }
  uint32_t operator[](int64_t i) const {
    const unsigned char* q = p + i * width;
    if (width == 1) return q[0];
    if (width == 2) return uint32_t(q[0] | q[1] << 8);
    return uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
  }
  static TokenView bytes(const std::vector<uint8_t>& v) { return {v.data(), int64_t(v.size()), 1}; }
};

struct TextData {
  std::vector<uint8_t> train, val;
  std::vector<std::string> files;  // what was read, in order
};

// The files of `path`: itself, or a folder's regular files in name order, skipping *.dat index
// files and symbolic links (the fortunes folder holds *.u8 links to its own texts) except links to
// regular *.jsonl files (a Hugging Face snapshot folder is all links); sub-folders are not read.
// Missing data, or a folder without such files (the error names what it passed over), is an error naming `path`.
std::vector<std::string> text_files(const std::string& path);

// Reads the text_files of `path`, each whole, concatenated. The last `val_fraction` of the concatenated bytes is the
// validation part, so the split depends on the data only. Missing data is an error naming where it was looked for.
TextData load_text(const std::string& path, double val_fraction = 0.1);

// The global batch number `index` of `split` (ids [batch, ctx] and targets shifted by one
// token): `batch` window starts drawn from Generator(seed, index) on every rank, of which this
// process takes rows [row_begin, row_end). Every world size sees the same global batch.
std::pair<Tensor, Tensor> text_batch(TokenView split, uint64_t seed, int64_t index, int64_t batch, int64_t ctx,
                                     int64_t row_begin, int64_t row_end);

}  // namespace weft::apps
