// kernels: the number of threads CPU kernels use (OpenMP and Eigen).
#pragma once

namespace weft {

void set_num_threads(int n);  // n >= 1
int get_num_threads();

}  // namespace weft
