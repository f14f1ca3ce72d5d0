// The tensors + autograd example from README.md, compiled against the installed headers
// and weft.pc by tests/install/check_install.sh.
#include <weft/weft.h>

#include <cstdio>

int main() {
  using namespace weft;
  manual_seed(0);
  Tensor w = randn({3, 1}).set_requires_grad();           // parameters are leaves
  Tensor x = randn({8, 3});                               // a batch of inputs
  Tensor y = matmul(x, from_vector({1, -2, 0.5}, {3, 1}));  // targets from known weights
  for (int step = 0; step < 100; ++step) {
    Tensor loss = mean(square(matmul(x, w) - y));         // define-by-run graph
    w.set_grad({});
    loss.backward();                                      // fills w.grad()
    NoGradGuard no_grad;                                  // update without recording
    w.copy_(w - w.grad() * 0.1);
    if (step % 25 == 0) std::printf("step %d loss %.6f\n", step, loss.item());
  }
  std::printf("learned w = %s\n", w.str().c_str());
  auto v = to_vector(w);
  return (std::abs(v[0] - 1) < 1e-2 && std::abs(v[1] + 2) < 1e-2) ? 0 : 1;
}
