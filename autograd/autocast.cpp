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
  return t_autocast && x.defined() && is_floating(x.dtype()) ? x.to(*t_autocast) : x;
}

}  // namespace weft
