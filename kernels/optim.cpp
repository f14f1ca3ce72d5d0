// kernels: entry points of the fused optimizer updates (kernels/optim.h): argument checks
// and the dispatch to the device's backend. The CPU loops are in kernels/cpu/optim.cpp.
#include "kernels/optim.h"

#include "kernels/backend.h"

namespace weft::kernels {
namespace {

// The parameter's backend, once every other tensor matches the parameter.
const KernelBackend& check_same(const char* op, const Tensor& param, std::initializer_list<const Tensor*> others) {
  const KernelBackend& backend = kernel_backend(param.device(), op);
  WEFT_CHECK(param.is_contiguous(), "{}: parameter {} must be contiguous", op, tensor_desc(param));
  for (const Tensor* t : others) {
    if (!t->defined()) continue;
    WEFT_CHECK(t->shape() == param.shape() && t->dtype() == param.dtype() && t->device() == param.device() &&
                   t->is_contiguous(),
               "{}: tensor {} does not match parameter {} (same shape, dtype, device, contiguous needed)", op,
               tensor_desc(*t), tensor_desc(param));
  }
  return backend;
}

}  // namespace

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s) {
  const KernelBackend& backend = check_same("adam_step", param, {&grad, &exp_avg, &exp_avg_sq});
  WEFT_CHECK(s.step >= 1, "adam_step: step must be >= 1, got {}", s.step);
  backend.adam_step_(param, grad, exp_avg, exp_avg_sq, s);
}

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  const KernelBackend& backend = check_same("sgd_step", param, {&grad, &buf});
  WEFT_CHECK(s.momentum == 0 || buf.defined(), "sgd_step: momentum {} needs a momentum buffer", s.momentum);
  backend.sgd_step_(param, grad, buf, s);
}

}  // namespace weft::kernels
