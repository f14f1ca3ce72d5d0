#include "autograd/autocast.h"

#include "core/error.h"

namespace weft {
namespace {
thread_local std::optional<DType> t_autocast;
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_(t_autocast) {
  WEFT_CHECK(!enabled || is_16bit(dtype),
             "AutocastGuard: products can compute in bf16 or f16, not {}", dtype_name(dtype));
  t_autocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}
AutocastGuard::~AutocastGuard() { t_autocast = prev_; }

std::optional<DType> autocast_dtype() { return t_autocast; }

Tensor autocast_input(const Tensor& x) {
  if (!t_autocast || !x.defined() || !is_floating(x.dtype())) return x;
  // A transposed matrix (a tied head reads the embedding as W^T) is cast as the W it views and
  // viewed again: no transposing copy, and the product and its gradient see W's own layout.
  if (x.dim() == 2 && !x.is_contiguous() && x.t().is_contiguous()) return x.t().to(*t_autocast).t();
  return x.to(*t_autocast);
}

}  // namespace weft
