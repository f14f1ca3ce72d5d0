#include "autograd/autocast.h"

#include <array>
#include <memory>

#include "core/error.h"
#include "core/storage.h"

namespace weft {
namespace {
thread_local std::optional<DType> t_autocast;

// The last few casts, by what they read: Llama's q, k and v projections (and gate and up) read the
// same normalised x, and each would otherwise cast it and keep its own 16-bit copy for the backward.
// An entry holds nothing alive (weak pointers), and matches only the same storage, unchanged since
// (its version), at the same offset, shape and strides; only a few calls back, so that a storage
// refilled in place without a version (FSDP's gathered parameters) is never matched a step later.
struct Cast {
  std::weak_ptr<StorageImpl> source;
  uint64_t version = 0;
  int64_t offset = 0;
  Shape shape, strides;
  DType to = DType::f32;
  std::weak_ptr<TensorImpl> result;
};
constexpr size_t kRecentCasts = 4;
thread_local std::array<Cast, kRecentCasts> t_recent;
thread_local size_t t_next = 0;

Tensor cast_once(const Tensor& x, DType to) {
  const Storage& st = x.storage();
  for (const Cast& c : t_recent)
    if (c.to == to && c.source.lock() == st && c.version == st->version && c.offset == x.offset() &&
        c.shape == x.shape() && c.strides == x.strides())
      if (auto r = c.result.lock()) return Tensor(r);
  Tensor y = x.to(to);
  t_recent[t_next++ % kRecentCasts] = {st, st->version, x.offset(), x.shape(), x.strides(), to, y.impl_ptr()};
  return y;
}
}  // namespace

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_(t_autocast) {
  WEFT_CHECK(!enabled || is_16bit(dtype),
             "AutocastGuard: products can compute in bf16 or f16, not {}", dtype_name(dtype));
  t_autocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}
AutocastGuard::~AutocastGuard() { t_autocast = prev_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

Tensor autocast_input(const Tensor& x) {
  if (!t_autocast || !x.defined() || !is_floating(x.dtype()) || x.dtype() == kFloat64) return x;  // f64: as torch
  // A transposed matrix (a tied head reads the embedding as W^T) is cast as the W it views and
  // viewed again: no transposing copy, and the product and its gradient see W's own layout.
  if (x.dim() == 2 && !x.is_contiguous() && x.t().is_contiguous()) return x.t().to(*t_autocast).t();
  if (x.dtype() == *t_autocast || x.requires_grad() || !x.storage()) return x.to(*t_autocast);  // a graph node: not shared
  return cast_once(x, *t_autocast);
}

}  // namespace weft
