#include "core/fill_rule.h"

#include <fmt/format.h>

#include "core/copy.h"
#include "core/dispatch.h"
#include "core/generator.h"

namespace weft {

double FillRule::value(int64_t index) const {
  switch (kind) {
    case Kind::constant: return a;
    case Kind::uniform: return a + (b - a) * counter_uniform(seed, offset + uint64_t(index));
    case Kind::normal: return a + b * counter_normal(seed, offset + uint64_t(index));
    case Kind::none: break;
  }
  return 0;
}

std::string FillRule::str() const {
  switch (kind) {
    case Kind::constant: return fmt::format("constant({})", a);
    case Kind::uniform: return fmt::format("uniform({}, {}; seed {}, counter {})", a, b, seed, offset);
    case Kind::normal: return fmt::format("normal(mean {}, std {}; seed {}, counter {})", a, b, seed, offset);
    case Kind::none: return "none (written by a load)";
  }
  return "?";
}

namespace {
// Element (o, r, i) of a slice of `rows` rows on its dim (outer dims, that dim, inner dims) is
// element (o, start + r, i) of the full tensor, whose dim has `extent` rows.
template <typename T>
void fill_rows(T* p, int64_t n, const FillRule& rule, int64_t outer, int64_t rows, int64_t inner, int64_t extent,
               int64_t start) {
  if (rule.kind == FillRule::Kind::constant) {
    const T v = convert_scalar<T>(rule.a);
#pragma omp parallel for if (n > 32768)
    for (int64_t k = 0; k < n; ++k) p[k] = v;
    return;
  }
  // Every element draws from its own counter, so rows are split over threads freely: the
  // values do not depend on the thread count.
#pragma omp parallel for collapse(2) if (n > 4096)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < rows; ++r) {
      T* q = p + (o * rows + r) * inner;
      const int64_t base = (o * extent + start + r) * inner;
      for (int64_t i = 0; i < inner; ++i) q[i] = convert_scalar<T>(rule.value(base + i));
    }
}
}  // namespace

void fill_slice(const Tensor& dst, const FillRule& rule, const Shape& full_shape, int64_t dim, int64_t start) {
  WEFT_CHECK(dst.defined(), "fill_slice: destination is undefined");
  WEFT_CHECK(!dst.device().is_meta(), "fill_slice: destination {} is on the meta device", tensor_desc(dst));
  const Shape full = full_shape.empty() ? Shape{1} : full_shape;
  const Shape local = dst.dim() == 0 ? Shape{1} : dst.shape();
  WEFT_CHECK(dim >= 0 && dim < int64_t(full.size()) && local.size() == full.size(),
             "fill_slice: destination {} is not a slice on dim {} of shape {}", tensor_desc(dst), dim,
             shape_str(full_shape));
  for (size_t d = 0; d < full.size(); ++d)
    WEFT_CHECK(int64_t(d) == dim ? start >= 0 && start + local[d] <= full[d] : local[d] == full[d],
               "fill_slice: destination {} at {} on dim {} does not fit in shape {}", tensor_desc(dst), start, dim,
               shape_str(full_shape));
  if (dst.numel() == 0 || rule.kind == FillRule::Kind::none) return;
  if (!dst.device().is_cpu() || !dst.is_contiguous()) {
    // Computed on the host in a contiguous slice-sized buffer, then copied in.
    Tensor host = empty(dst.shape(), {.dtype = dst.dtype(), .device = kCPU});
    fill_slice(host, rule, full_shape, dim, start);
    copy_elements(dst, host);
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < full.size(); ++d) inner *= full[d];
  const int64_t rows = local[size_t(dim)], extent = full[size_t(dim)];
  WEFT_DISPATCH(dst.dtype(), "fill", [&]<typename T>() {
    fill_rows(static_cast<T*>(dst.data_ptr()), dst.numel(), rule, outer, rows, inner, extent, start);
  });
}

namespace {
void check_meta(const Tensor& t, const char* op) {
  WEFT_CHECK(t.defined(), "{}: tensor is undefined", op);
  WEFT_CHECK(t.device().is_meta(), "{}: tensor {} is not on the meta device", op, tensor_desc(t));
}
// A meta tensor's values are those of its storage: only a tensor that is its whole storage
// (contiguous, from element 0) can record or materialise them.
bool is_whole(const Tensor& t) { return t.is_contiguous() && t.offset() == 0 && t.nbytes() == t.storage()->nbytes(); }
void check_whole(const Tensor& t, const char* op) {
  WEFT_CHECK(is_whole(t),
             "{}: meta tensor {} is a view of part of its storage; a deferred fill or materialisation covers a whole "
             "tensor (fill the base tensor instead)", op, tensor_desc(t));
}
}  // namespace

std::shared_ptr<const FillRule> recorded_fill(const Tensor& t) {
  check_meta(t, "recorded_fill");
  return t.storage()->deferred_fill();
}

void record_fill(const Tensor& t, const FillRule& rule, const char* op) {
  check_meta(t, op);
  // Shape propagation (MetaComputeGuard) writes parts of meta storages, e.g. a shard's padding:
  // values are not followed there, so nothing is recorded.
  if (MetaComputeGuard::enabled() && !is_whole(t)) return;
  check_whole(t, op);
  t.storage()->set_deferred_fill(std::make_shared<const FillRule>(rule));
}

Tensor materialize_tensor(const Tensor& t, Device device) {
  check_meta(t, "materialize");
  check_whole(t, "materialize");
  WEFT_CHECK(!device.is_meta(), "materialize: the target device must hold data, got {}", device.str());
  Tensor out = empty(t.shape(), {.dtype = t.dtype(), .device = device});
  auto rule = t.storage()->deferred_fill();
  fill_slice(out, rule ? *rule : FillRule{}, t.shape());
  return out;
}

void materialize_in_place(const Tensor& t, Device device) {
  Tensor m = materialize_tensor(t, device);
  TensorImpl* impl = t.impl();
  impl->storage = m.storage();
  impl->strides = m.strides();
  impl->offset = 0;
}

}  // namespace weft
