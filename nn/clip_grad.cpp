#include "nn/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/deterministic.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/partial_reduction.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft::nn {
namespace {

// The larger of two partial norms, NaN if either is (std::max(0, NaN) is 0: NaN gradients read as a zero norm).
double max_nan(double a, double b) { return a > b || std::isnan(a) ? a : b; }

// This process's share of a gradient's norm: max |g| (inf), or sum |g|^p in f64, which keeps
// the result independent of how the elements are split over ranks up to rounding. Meta
// gradients (a memory plan: shapes only) allocate what the real ones would and count 0.
double local_part(const Tensor& g, double p) {
  using kernels::BinaryOp, kernels::ReduceOp, kernels::UnaryOp;
  auto value = [](const Tensor& t) { return t.device().is_meta() ? 0.0 : t.item(); };
  if (std::isinf(p)) return value(kernels::reduce(ReduceOp::max, kernels::unary(UnaryOp::abs, g), {}, false));
  if (p == 2.0) return value(kernels::reduce(ReduceOp::sum_squares, g, {}, false));  // no f64 copy of g
  Tensor g64 = g.to(DType::f64);
  Tensor powered = p == 1.0 ? kernels::unary(UnaryOp::abs, g64)
                            : kernels::binary_scalar(BinaryOp::pow, kernels::unary(UnaryOp::abs, g64), p);
  return value(kernels::reduce(ReduceOp::sum, powered, {}, false));
}

// Deterministic mode: |g|^p (or |g|) per row of dim 0, in f64. A row is never split between
// ranks (fully_shard splits dim 0), so the same rows come out at any world size.
std::vector<double> row_parts(const Tensor& g, double p) {
  using kernels::BinaryOp, kernels::ReduceOp, kernels::UnaryOp;
  if (g.device().is_meta() || g.numel() == 0) return {};  // a rank past a short parameter's end: no rows
  Tensor a = kernels::unary(UnaryOp::abs, g.to(DType::f64));
  if (std::isinf(p)) return to_vector(g.dim() < 2 ? a : kernels::reduce(ReduceOp::max, a.reshape({g.size(0), -1}), {1}, false));
  Tensor powered = p == 2.0 ? kernels::binary(BinaryOp::mul, a, a) : p == 1.0 ? a : kernels::binary_scalar(BinaryOp::pow, a, p);
  return to_vector(g.dim() < 2 ? powered : kernels::reduce(ReduceOp::sum, powered.reshape({g.size(0), -1}), {1}, false));
}

// The deterministic total: parameter by parameter in order, each one's rows in order (a
// sharded parameter's from every rank of its group, in rank order): one sequence of additions
// at any world size. Each set of ranks gathers once: its parameters' row counts, then rows.
double ordered_total(const std::vector<Tensor>& params, double p) {
  const bool inf = std::isinf(p);
  struct Part {
    std::shared_ptr<const PartialReduction> reduction;
    std::vector<size_t> members;  // indices into params
    std::vector<double> local, gathered;
  };
  std::vector<Part> parts;
  std::vector<std::vector<double>> rows_of(params.size());  // per parameter, every rank's rows in order
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor g = params[k].grad();
    std::vector<double> rows = g.defined() ? row_parts(g, p) : std::vector<double>{};
    auto reduction = partial_reduction(params[k]);  // [Note: partial reductions] in core/partial_reduction.h
    if (!reduction) {
      rows_of[k] = std::move(rows);
      continue;
    }
    size_t i = 0;
    while (i < parts.size() && !parts[i].reduction->same_processes(*reduction)) ++i;
    if (i == parts.size()) parts.push_back({reduction, {}, {}, {}});
    parts[i].members.push_back(k);
    parts[i].local.push_back(double(rows.size()));
    parts[i].local.insert(parts[i].local.end(), rows.begin(), rows.end());
  }
  for (Part& part : parts) part.gathered = part.reduction->gather(part.local);
  // Each rank's message is its members' rows, one count before each, ranks in order.
  for (Part& part : parts)
    for (size_t at = 0; at < part.gathered.size();)
      for (size_t member : part.members) {
        const size_t count = size_t(part.gathered[at]);
        std::vector<double>& rows = rows_of[member];
        rows.insert(rows.end(), part.gathered.begin() + ptrdiff_t(at + 1), part.gathered.begin() + ptrdiff_t(at + 1 + count));
        at += 1 + count;
      }
  double total = 0;
  for (const std::vector<double>& rows : rows_of)
    for (double v : rows) total = inf ? max_nan(total, v) : total + v;
  return total;
}

// The norm from the combined total, and the factor that clips to max_norm (1 when below; NaN for a NaN norm, which
// then turns every gradient to NaN, as torch's clamp(coef, max=1) does).
GradClip clip_of(double max_norm, double norm_type, double total) {
  const double norm = std::isinf(norm_type) ? total : norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  return {norm, coef >= 1.0 ? 1.0 : coef};
}

// max_norm and norm_type of every process holding part of a parameter (a gather per set of them), so that a refused
// value or processes that disagree fail on all of them alike (not one left in a collective, or each its own factor).
void check_arguments(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  std::vector<double> seen = {max_norm, norm_type};
  std::vector<std::shared_ptr<const PartialReduction>> sets;
  for (const Tensor& p : params)
    if (auto r = partial_reduction(p); r && std::none_of(sets.begin(), sets.end(), [&](auto& s) { return s->same_processes(*r); })) {
      sets.push_back(r);
      for (double v : r->gather({max_norm, norm_type})) seen.push_back(v);
    }
  for (size_t i = 0; i < seen.size(); i += 2) {
    WEFT_CHECK(seen[i + 1] > 0, "clip_grad_norm_: norm_type must be > 0 or inf, got {}", seen[i + 1]);
    WEFT_CHECK(seen[i] >= 0, "clip_grad_norm_: max_norm must be >= 0, got {}", seen[i]);
    WEFT_CHECK(seen[i] == max_norm && seen[i + 1] == norm_type, "clip_grad_norm_: the processes disagree: max_norm {} "
               "and norm_type {} here, {} and {} on another", max_norm, norm_type, seen[i], seen[i + 1]);
  }
}

}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  const GradClip c = clip_grad_coefficient(params, max_norm, norm_type);
  NoGradGuard no_grad;
  if (!(c.coef >= 1.0))  // NaN too
    for (const Tensor& p : params)
      if (p.grad().defined() && p.grad().numel() > 0) kernels::mul_scalar_(p.grad(), c.coef);
  return c.norm;
}

GradClip clip_grad_coefficient(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  check_arguments(params, max_norm, norm_type);
  const bool inf = std::isinf(norm_type);
  NoGradGuard no_grad;
  if (deterministic()) return clip_of(max_norm, norm_type, ordered_total(params, norm_type));
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
    parts[i].value = inf ? max_nan(parts[i].value, v) : parts[i].value + v;
  }
  double total = 0;
  for (Part& part : parts) {
    const double v = part.reduction ? part.reduction->reduce(part.value, inf ? PartialOp::max : PartialOp::sum)
                                    : part.value;
    total = inf ? max_nan(total, v) : total + v;
  }
  return clip_of(max_norm, norm_type, total);
}

}  // namespace weft::nn
