#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "core/copy.h"
#include "core/generator.h"
#include "core/grad_mode.h"

namespace weft::autograd {

namespace {
double weighted_sum(const Tensor& y, const std::vector<double>& v) {
  std::vector<double> yv = to_vector(y);
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * v[i];
  return s;
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts) {
  WEFT_CHECK(opts.eps > 0 && opts.eps < HUGE_VAL, "gradcheck: eps must be a finite number > 0, got {}", opts.eps);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    WEFT_CHECK(t.defined(), "gradcheck: input {} is an undefined tensor", i);
    WEFT_CHECK(t.dtype() == DType::f64, "gradcheck: inputs must be f64, got {}", tensor_desc(t));
    WEFT_CHECK(t.is_leaf(), "gradcheck: inputs must be leaves, got {}", tensor_desc(t));
  }
  for (const Tensor& t : inputs) if (t.requires_grad()) t.set_grad(Tensor());
  Tensor y = fn(inputs);
  WEFT_CHECK(y.defined(), "gradcheck: the function returned an undefined tensor");
  Generator gen(opts.seed);
  std::vector<double> v(size_t(y.numel()));
  for (double& x : v) x = gen.uniform() * 2 - 1;
  Tensor vt = from_vector(v, y.shape(), {.dtype = y.dtype(), .device = y.device()});
  y.backward(vt);

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    Tensor g = x.grad();
    std::vector<double> analytic = g.defined() ? to_vector(g) : std::vector<double>(size_t(x.numel()), 0.0);
    // Perturb each element through a contiguous CPU copy written back into x.
    Tensor host = x.detach().to(kCPU).contiguous().clone();
    double* p = host.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double orig = p[i];
      double f[2];
      for (int s = 0; s < 2; ++s) {
        p[i] = orig + (s == 0 ? opts.eps : -opts.eps);
        {
          NoGradGuard ng;
          copy_elements(x.detach(), host);
          f[s] = weighted_sum(fn(inputs), v);
        }
      }
      p[i] = orig;
      {
        NoGradGuard ng;
        copy_elements(x.detach(), host);
      }
      double numeric = (f[0] - f[1]) / (2 * opts.eps);
      double a = analytic[size_t(i)];
      if (!(std::abs(a - numeric) <= opts.atol + opts.rtol * std::abs(numeric))) {
        result.ok = false;
        result.message = fmt::format("gradcheck: input {} ({}), element {}: backward gives {:.10g}, "
                                     "finite differences give {:.10g}", k, tensor_desc(x), i, a, numeric);
        return result;
      }
    }
  }
  return result;
}

}  // namespace weft::autograd
