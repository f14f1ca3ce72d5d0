// kernels/cpu: concatenation. When every input is contiguous and already of the output's
// dtype, each input is one block per outer index and the copy is a row of memcpys; other
// inputs go through the strided, converting element copy into their slice of the output.
#include <cstring>

#include "core/copy.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {

void cat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out) {
  bool fast = true;
  for (const Tensor& x : xs) fast &= x.is_contiguous() && x.dtype() == out.dtype();
  if (!fast) {
    int64_t at = 0;
    for (const Tensor& x : xs) {
      copy_elements(out.narrow(dim, at, x.size(dim)), x);
      at += x.size(dim);
    }
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < out.dim(); ++d) {
    if (d < dim) outer *= out.size(d);
    if (d > dim) inner *= out.size(d);
  }
  size_t es = out.element_size();
  int64_t out_row = out.size(dim) * inner * int64_t(es);  // bytes of one outer index
  char* po = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (outer > 1 && out.numel() > kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t at = 0;
    for (const Tensor& x : xs) {
      int64_t bytes = x.size(dim) * inner * int64_t(es);
      std::memcpy(po + o * out_row + at, static_cast<const char*>(x.data_ptr()) + o * bytes, size_t(bytes));
      at += bytes;
    }
  }
}

}  // namespace weft::kernels::cpu
