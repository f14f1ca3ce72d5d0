// kernels/cpu: embedding, index_select/index_add and gather/scatter_add. Pure copies move elements as same-sized words
// (no per-dtype code); accumulations dispatch on the dtype. Writes that could collide (repeated indices) are split so
// that each thread owns a disjoint part of the output, which keeps results deterministic.
#include <cstring>

#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

template <class F>
void dispatch_index(DType t, const char* op, F&& fn) {
  if (t == DType::i64) return fn.template operator()<int64_t>();
  if (t == DType::i32) return fn.template operator()<int32_t>();
  WEFT_ERROR("{}: index tensors must be i64 or i32, got {}", op, dtype_name(t));
}

// Calls fn<W>() with W an unsigned word as wide as one element.
template <class F>
void dispatch_word(size_t size, F&& fn) {
  switch (size) {
    case 1:
      return fn.template operator()<uint8_t>();
    case 2:
      return fn.template operator()<uint16_t>();
    case 4:
      return fn.template operator()<uint32_t>();
    default:
      return fn.template operator()<uint64_t>();
  }
}

// Row-major [outer, size(dim), inner] split of a shape around dim.
struct Split3 {
  int64_t outer = 1, mid = 1, inner = 1;
};
Split3 split3(const Shape& shape, int64_t dim) {
  Split3 s;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < dim) s.outer *= shape[d];
    else if (d == dim) s.mid = shape[d];
    else s.inner *= shape[d];
  }
  return s;
}

// Element offset in a tensor with `strides` of the start of row r of `shape` (all dims but
// the last), with the coordinate along `skip` left out.
int64_t row_offset(int64_t r, const Shape& shape, const Shape& strides, int64_t skip) {
  int64_t off = 0;
  for (int64_t d = int64_t(shape.size()) - 2; d >= 0; --d) {
    int64_t c = r % shape[d];
    r /= shape[d];
    if (d != skip) off += c * strides[d];
  }
  return off;
}

// a += b for any element type, through float for 16-bit ones.
template <typename T>
inline void add_to(T& a, T b) {
  if constexpr (std::is_same_v<T, bool>) a = a || b;
  else a = T(acc_t<T>(a) + acc_t<T>(b));
}

}  // namespace

void check_index_range(const Tensor& index, int64_t size, const char* op, const std::string& what) {
  dispatch_index(index.dtype(), op, [&]<typename I>() {
    Tensor idx = index.contiguous();
    const I* p = idx.data<I>();
    int64_t n = idx.numel(), bad = -1;
    for (int64_t i = 0; i < n && bad < 0; ++i)
      if (p[i] < 0 || int64_t(p[i]) >= size) bad = i;
    WEFT_CHECK(bad < 0, "{}: index {} is out of range for {} {}", op, int64_t(p[bad]), size, what);
  });
}

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  int64_t n = indices.numel(), d = weight.size(1);
  size_t row_bytes = size_t(d) * weight.element_size();
  const char* w = static_cast<const char*>(weight.data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  dispatch_index(indices.dtype(), "embedding", [&]<typename I>() {
    const I* idx = indices.data<I>();
#pragma omp parallel for schedule(static) if (n * d > kParallelGrain)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(o + i * row_bytes, w + int64_t(idx[i]) * row_bytes, row_bytes);
  });
}

void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& out) {
  int64_t n = indices.numel(), v = out.size(0), d = out.size(1);
  dispatch_float(out.dtype(), "embedding_backward", [&]<typename T>() {
    const T* g = grad.data<T>();
    T* o = out.data<T>();
    dispatch_index(indices.dtype(), "embedding_backward", [&]<typename I>() {
      const I* idx = indices.data<I>();
      // Each thread owns a range of vocabulary rows and scans all indices for it.
#pragma omp parallel if (n * d > kParallelGrain)
      {
        int nt = 1, tid = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        int64_t v0 = v * tid / nt, v1 = v * (tid + 1) / nt;
        for (int64_t i = 0; i < n; ++i) {
          int64_t row = idx[i];
          if (row < v0 || row >= v1) continue;
          T* orow = o + row * d;
          const T* grow = g + i * d;
          for (int64_t j = 0; j < d; ++j) add_to(orow[j], grow[j]);
        }
      }
    });
  });
}

void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  Split3 s = split3(x.shape(), dim);
  int64_t len = index.numel();
  dispatch_word(x.element_size(), [&]<typename W>() {
    const W* px = static_cast<const W*>(x.data_ptr());
    W* po = static_cast<W*>(out.data_ptr());
    dispatch_index(index.dtype(), "index_select", [&]<typename I>() {
      const I* idx = index.data<I>();
#pragma omp parallel for collapse(2) schedule(static) if (out.numel() > kParallelGrain)
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t j = 0; j < len; ++j) {
          const W* src = px + (o * s.mid + int64_t(idx[j])) * s.inner;
          W* dst = po + (o * len + j) * s.inner;
          for (int64_t k = 0; k < s.inner; ++k) dst[k] = src[k];
        }
    });
  });
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  Split3 s = split3(out.shape(), dim);
  int64_t len = index.numel();
  constexpr int64_t kBlock = 1024;
  int64_t blocks = (s.inner + kBlock - 1) / kBlock;
  dispatch_dtype(out.dtype(), "index_add", [&]<typename T>() {
    T* po = out.data<T>();
    const T* ps = src.data<T>();
    dispatch_index(index.dtype(), "index_add", [&]<typename I>() {
      const I* idx = index.data<I>();
      // A task owns one outer slice and one block of inner columns: no two tasks collide.
#pragma omp parallel for schedule(static) if (src.numel() > kParallelGrain)
      for (int64_t t = 0; t < s.outer * blocks; ++t) {
        int64_t o = t / blocks, k0 = (t % blocks) * kBlock, k1 = std::min(s.inner, k0 + kBlock);
        for (int64_t j = 0; j < len; ++j) {
          T* dst = po + (o * s.mid + int64_t(idx[j])) * s.inner;
          const T* sp = ps + (o * len + j) * s.inner;
          for (int64_t k = k0; k < k1; ++k) add_to(dst[k], sp[k]);
        }
      }
    });
  });
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  int64_t nd = index.dim(), last = index.size(-1), rows = last ? index.numel() / last : 0;
  const Shape& xs = x.strides();
  int64_t step = dim == nd - 1 ? 0 : xs[nd - 1];
  dispatch_word(x.element_size(), [&]<typename W>() {
    const W* px = static_cast<const W*>(x.data_ptr());
    W* po = static_cast<W*>(out.data_ptr());
    dispatch_index(index.dtype(), "gather", [&]<typename I>() {
      const I* idx = index.data<I>();
#pragma omp parallel for schedule(static) if (index.numel() > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        int64_t base = row_offset(r, index.shape(), xs, dim);
        for (int64_t k = 0; k < last; ++k)
          po[r * last + k] = px[base + k * step + int64_t(idx[r * last + k]) * xs[dim]];
      }
    });
  });
}

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t nd = index.dim(), last = index.size(-1), rows = last ? index.numel() / last : 0;
  const Shape& os = out.strides();
  const Shape& ss = src.strides();
  int64_t ostep = dim == nd - 1 ? 0 : os[nd - 1];
  dispatch_dtype(out.dtype(), "scatter_add", [&]<typename T>() {
    T* po = out.data<T>();
    const T* ps = src.data<T>();
    dispatch_index(index.dtype(), "scatter_add", [&]<typename I>() {
      const I* idx = index.data<I>();
      auto do_rows = [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          int64_t obase = row_offset(r, index.shape(), os, dim);
          int64_t sbase = row_offset(r, index.shape(), ss, -1);
          for (int64_t k = 0; k < last; ++k)
            add_to(po[obase + k * ostep + int64_t(idx[r * last + k]) * os[dim]], ps[sbase + k * ss[nd - 1]]);
        }
      };
      // Rows with different dim-0 coordinates write disjoint slices unless dim is 0.
      if (dim == 0 || nd == 1) {
        do_rows(0, rows);
        return;
      }
      int64_t per = rows / index.size(0);
#pragma omp parallel for schedule(static) if (index.numel() > kParallelGrain)
      for (int64_t c = 0; c < index.size(0); ++c) do_rows(c * per, (c + 1) * per);
    });
  });
}

}  // namespace weft::kernels::cpu
