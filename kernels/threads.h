// kernels: the number of threads CPU kernels use (OpenMP; kernels/cpu/gemm.cpp splits Eigen's
// products over them, Eigen never threads by itself).
#pragma once

namespace weft {

void set_num_threads(int n);  // n >= 1
int get_num_threads();

}  // namespace weft
