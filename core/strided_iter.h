// core: walking N strided operands of one shape together. Dims of size 1 are dropped and adjacent dims that are
// contiguous for every operand are merged, so the innermost run is as long as possible; kernels then loop over "runs"
// (one per outer index), which is also the unit OpenMP splits.
#pragma once
#include <array>
#include <cstdint>

#include "shape.h"

namespace weft {

template <size_t N>
class StridedIter {
 public:
  StridedIter(const Shape& shape, const std::array<Shape, N>& strides) {
    // Collect non-trivial dims, innermost last.
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      sizes_.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) strides_[k].push_back(strides[k][d]);
    }
    // Merge dim i into i+1 when contiguous for all operands (walking from the inside out).
    for (int64_t i = int64_t(sizes_.size()) - 2; i >= 0; --i) {
      bool ok = true;
      for (size_t k = 0; k < N; ++k) ok &= strides_[k][i] == strides_[k][i + 1] * sizes_[i + 1];
      if (!ok) continue;
      sizes_[i] *= sizes_[i + 1];
      sizes_.erase(sizes_.begin() + i + 1);
      for (size_t k = 0; k < N; ++k) {
        strides_[k][i] = strides_[k][i + 1];
        strides_[k].erase(strides_[k].begin() + i + 1);
      }
    }
    empty_ = shape_numel(shape) == 0;
    if (sizes_.empty()) {  // scalar-like: one run of one element
      sizes_.push_back(1);
      for (size_t k = 0; k < N; ++k) strides_[k].push_back(0);
    }
    inner_ = sizes_.back();
    for (size_t k = 0; k < N; ++k) inner_strides_[k] = strides_[k].back();
    runs_ = empty_ ? 0 : shape_numel(sizes_) / inner_;
  }

  int64_t num_runs() const { return runs_; }
  int64_t inner_size() const { return inner_; }
  const std::array<int64_t, N>& inner_strides() const { return inner_strides_; }

  // Element offsets (relative to each operand's start) of run r's first element.
  std::array<int64_t, N> run_offsets(int64_t r) const {
    std::array<int64_t, N> off{};
    for (int64_t d = int64_t(sizes_.size()) - 2; d >= 0; --d) {
      int64_t i = r % sizes_[d];
      r /= sizes_[d];
      for (size_t k = 0; k < N; ++k) off[k] += i * strides_[k][d];
    }
    return off;
  }

  // fn(offsets, inner_size, inner_strides) for runs [begin, end).
  template <class F>
  void for_runs(int64_t begin, int64_t end, F&& fn) const {
    for (int64_t r = begin; r < end; ++r) fn(run_offsets(r), inner_, inner_strides_);
  }

 private:
  Shape sizes_;
  std::array<Shape, N> strides_;
  std::array<int64_t, N> inner_strides_{};
  int64_t inner_ = 1, runs_ = 0;
  bool empty_ = false;
};

}  // namespace weft
