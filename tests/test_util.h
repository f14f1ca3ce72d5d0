// Helpers shared by the test suites: value checks that print every mismatch.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "core/device_runtime.h"
#include "core/tensor.h"
#include "kernels/threads.h"

namespace weft::test {

// Checks t's values against want (NaN matches NaN), reporting mismatches with their index.
inline void check_values(const Tensor& t, const std::vector<double>& want, double rtol = 1e-6,
                         double atol = 1e-6) {
  std::vector<double> got = to_vector(t);
  REQUIRE(got.size() == want.size());
  int bad = 0;
  std::ostringstream msg;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    bool ok = (std::isnan(g) && std::isnan(w)) || g == w || std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok && bad++ < 8) msg << "  [" << i << "] got " << g << ", want " << w << "\n";
  }
  INFO(tensor_desc(t) << ": " << bad << " mismatches\n" << msg.str());
  CHECK(bad == 0);
}

// Whether CUDA kernels can run here (built with CUDA and a device visible). Tests that label
// host memory as cuda:0 to provoke errors may only run ops on it when they cannot.
inline bool cuda_usable() { return device_count(DeviceType::cuda) > 0; }

// Requires got to hold want's bits, reporting the first element that differs.
inline void check_same_bits(const Tensor& want, const Tensor& got, const std::string& what) {
  Tensor a = want.contiguous(), b = got.contiguous();
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  size_t size = a.element_size();
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  int64_t first = -1;
  for (int64_t i = 0; i < a.numel() && first < 0; ++i)
    if (std::memcmp(pa + i * size, pb + i * size, size) != 0) first = i;
  std::ostringstream msg;
  if (first >= 0)
    msg << std::setprecision(17) << ": element " << first << " is " << to_vector(b)[size_t(first)] << ", want "
        << to_vector(a)[size_t(first)];
  INFO(what << " (" << tensor_desc(a) << ")" << msg.str());
  CHECK(first < 0);
}

// Requires run() to give the same bits at 1, 2, 3 and 4 threads as at 1, reporting the first
// element of each result that differs. Restores the thread count.
inline void check_same_bits_on_any_thread_count(const std::function<std::vector<Tensor>()>& run) {
  struct Restore {
    int n = get_num_threads();
    ~Restore() { set_num_threads(n); }
  } restore;
  set_num_threads(1);
  std::vector<Tensor> want = run();
  for (int threads : {2, 3, 4}) {
    set_num_threads(threads);
    std::vector<Tensor> got = run();
    REQUIRE(got.size() == want.size());
    for (size_t r = 0; r < want.size(); ++r)
      check_same_bits(want[r], got[r], std::to_string(threads) + " threads (1 thread wanted), result " + std::to_string(r));
  }
}

// A 1-D tensor of the given values.
inline Tensor vec(const std::vector<double>& v, DType dt = DType::f32) {
  return from_vector(v, {int64_t(v.size())}, {.dtype = dt});
}

}  // namespace weft::test
