#include "nn/clip_grad.h"

#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/partial_reduction.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft::nn {
namespace {

// This process's share of a gradient's norm: max |g| (inf), or sum |g|^p in f64, which keeps
// the result independent of how the elements are split over ranks up to rounding. Meta
// gradients (a memory plan: shapes only) allocate what the real ones would and count 0.
double local_part(const Tensor& g, double p) {
  using kernels::BinaryOp, kernels::ReduceOp, kernels::UnaryOp;
  auto value = [](const Tensor& t) { return t.device().is_meta() ? 0.0 : t.item(); };
  if (std::isinf(p)) return value(kernels::reduce(ReduceOp::max, kernels::unary(UnaryOp::abs, g), {}, false));
  Tensor g64 = g.to(DType::f64);
  Tensor powered = p == 2.0   ? kernels::binary(BinaryOp::mul, g64, g64)
                   : p == 1.0 ? kernels::unary(UnaryOp::abs, g64)
                              : kernels::binary_scalar(BinaryOp::pow, kernels::unary(UnaryOp::abs, g64), p);
  return value(kernels::reduce(ReduceOp::sum, powered, {}, false));
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  // Checks on arguments only, which every rank shares, so a bad call fails on all of them.
  WEFT_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 or inf, got {}", norm_type);
  WEFT_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  const bool inf = std::isinf(norm_type);
  NoGradGuard no_grad;
  // Partial results per set of ranks, in the order the parameters first name them: the same on
  // every rank, so the reductions below line up. Index 0: whole parameters, combined locally.
  struct Part {
    std::shared_ptr<const PartialReduction> reduction;
    double value = 0;
  };
  std::vector<Part> parts(1);
  for (const Tensor& p : params) {
    auto reduction = partial_reduction(p);
    size_t i = 0;
    if (reduction) {
      i = 1;
      while (i < parts.size() && !parts[i].reduction->same_processes(*reduction)) ++i;
      if (i == parts.size()) parts.push_back({reduction, 0});
    }
    // A rank past the end of a short parameter holds an empty shard: nothing to add, but it
    // still joins its group's reduction.
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const double v = local_part(g, norm_type);
    parts[i].value = inf ? std::max(parts[i].value, v) : parts[i].value + v;
  }
  double total = 0;
  for (Part& part : parts) {
    const double v = part.reduction ? part.reduction->reduce(part.value, inf ? PartialOp::max : PartialOp::sum)
                                    : part.value;
    total = inf ? std::max(total, v) : total + v;
  }
  const double norm = inf ? total : norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& p : params)
      if (p.grad().defined() && p.grad().numel() > 0) kernels::mul_scalar_(p.grad(), coef);
  return norm;
}

}  // namespace weft::nn
