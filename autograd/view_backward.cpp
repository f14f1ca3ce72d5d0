// autograd: gradients of core's view and copy methods. A view's gradient is written back through the same view
// (re-applied by `replay`) into zeros shaped like the base; expanded dims are summed first. as_strided has no replay:
// its gradient is summed at each element's offset in a contiguous base (index_add), so overlapping windows add up.
#include "autograd/engine.h"
#include "core/autograd_meta.h"
#include "core/copy.h"
#include "kernels/elementwise.h"
#include "kernels/nn.h"
#include "kernels/reduce.h"

namespace weft::autograd::detail {
namespace {

// Copies `grad` into `window` (a view of fresh zeros), summing over the window's expanded
// (stride-0) dims first so each element is written once.
void write_through(const Tensor& window, const Tensor& grad) {
  Shape expanded;
  for (int64_t i = 0; i < window.dim(); ++i)
    if (window.stride(i) == 0 && window.size(i) > 1) expanded.push_back(i);
  if (expanded.empty()) {
    copy_elements(window, grad);
    return;
  }
  Tensor summed = kernels::reduce(kernels::ReduceOp::sum, grad, expanded, true);
  Tensor target = window;
  for (int64_t d : expanded) target = target.narrow(d, 0, 1);
  copy_elements(target, summed);
}

// For a view that only reorders its base's dims (transpose, permute): for each base dim, the
// view dim it became. Empty for any other view.
Shape permuted_dims(const Tensor& base, const Tensor& out) {
  if (out.offset() != base.offset() || out.dim() != base.dim() || out.dim() < 2) return {};
  Shape from(base.dim(), -1);
  for (int64_t i = 0; i < out.dim(); ++i) {
    int64_t j = 0;
    while (j < base.dim() && (from[j] >= 0 || base.stride(j) != out.stride(i) || base.size(j) != out.size(i))) ++j;
    if (j == base.dim()) return {};
    from[j] = i;
  }
  return from;
}

void record_view(const Tensor& base, Tensor& out, const weft::detail::ViewReplay& replay) {
  if (!needs_grad({&base})) return;
  if (Shape from = permuted_dims(base, out); !from.empty()) {
    // The gradient with its dims put back: a view, not a copy into zeros (and no strided copy
    // when it arrives laid out as the base, as a tied head's weight gradient does).
    record("PermuteBackward", {base}, {out}, [from](const TensorList& g) -> TensorList { return {g[0].permute(from)}; });
    return;
  }
  Shape base_shape = base.shape();
  DType dtype = base.dtype();
  bool reshape_only = base.is_contiguous() && out.is_contiguous() && out.offset() == base.offset() &&
                      out.numel() == base.numel();
  if (reshape_only) {
    record("ViewBackward", {base}, {out}, [base_shape](const TensorList& g) -> TensorList {
      return {g[0].reshape(base_shape)};
    });
    return;
  }
  if (replay) {
    record("ViewBackward", {base}, {out}, [base_shape, dtype, replay](const TensorList& g) -> TensorList {
      Tensor grad_base = zeros(base_shape, {.dtype = dtype, .device = g[0].device()});
      write_through(replay(grad_base), g[0]);
      return {grad_base};
    });
    return;
  }
  WEFT_CHECK(base.is_contiguous(), "as_strided: gradients need a contiguous base, got {}", tensor_desc(base));
  Shape shape = out.shape(), strides = out.strides();
  int64_t rel = out.offset() - base.offset(), last = rel;  // the first and last elements' offsets in the base
  for (size_t i = 0; i < shape.size(); ++i) last += shape[i] > 0 ? (shape[i] - 1) * strides[i] : 0;
  WEFT_CHECK(out.numel() == 0 || (rel >= 0 && last < base.numel()), "as_strided: the view reaches offsets {} to {} of "
             "its base {}, outside its {} elements: their gradients would have no place (view the whole tensor)", rel,
             last, tensor_desc(base), base.numel());
  record("AsStridedBackward", {base}, {out}, [=](const TensorList& g) -> TensorList {
    // Each element's offset in the base, its gradient summed there: windows may overlap (a sliding window's).
    const TensorOptions i64{.dtype = kInt64, .device = g[0].device()};
    Tensor at = full({}, double(rel), i64);
    for (size_t i = 0; i < shape.size(); ++i) {
      Shape along(i + 1, 1), grown = at.shape();
      along[i] = shape[i], grown.push_back(1);
      const Tensor step = strides[i] == 0 ? zeros({shape[i]}, i64)
                                          : arange(0, double(shape[i]) * double(strides[i]), double(strides[i]), i64);
      at = kernels::binary(kernels::BinaryOp::add, at.view(grown), step.view(along));
    }
    return {kernels::index_add({shape_numel(base_shape)}, 0, at.reshape({-1}), g[0].contiguous().reshape({-1}))
                .view(base_shape)};
  });
}

void record_copy(const Tensor& src, Tensor& out) {
  if (!needs_grad({&src})) return;
  DType dtype = src.dtype();
  Device device = src.device();
  record("CopyBackward", {src}, {out}, [dtype, device](const TensorList& g) -> TensorList {
    return {g[0].to(device, dtype)};
  });
}

}  // namespace

void install_view_hooks(weft::detail::AutogradHooks& hooks) {
  hooks.record_view = &record_view;
  hooks.record_copy = &record_copy;
}

}  // namespace weft::autograd::detail
