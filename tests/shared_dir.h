// tests: a directory every rank sees under the same name (rank 0's pid), emptied first: a
// collective call on every rank of the world.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fmt/format.h>
#include <string>

#include "core/tensor.h"
#include "dist/dist.h"

namespace weft::test {

inline std::filesystem::path shared_dir(const std::string& name) {
  Tensor pid = from_vector({dist::rank() == 0 ? double(::getpid()) : 0.0}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(pid, dist::ReduceOp::max)->wait();
  auto dir = std::filesystem::temp_directory_path() / fmt::format("weft_test_ckpt_{}_{}", int64_t(pid.item()), name);
  if (dist::rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  dist::world()->barrier()->wait();
  return dir;
}

}  // namespace weft::test
