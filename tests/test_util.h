// Helpers shared by the test suites: value checks that print every mismatch.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <sstream>
#include <vector>

#include "core/device_runtime.h"
#include "core/tensor.h"

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

// A 1-D tensor of the given values.
inline Tensor vec(const std::vector<double>& v, DType dt = DType::f32) {
  return from_vector(v, {int64_t(v.size())}, {.dtype = dt});
}

}  // namespace weft::test
