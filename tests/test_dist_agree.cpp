// dist::agree: a failure on one rank stops every rank with a named error (its own message on
// the failed rank, "failed on another rank (rank K: ...)" on the others), never a hang; the
// ranks stay in step for the collectives that follow. Also dist::local_device.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "dist/agree.h"
#include "dist/config_check.h"
#include "dist/device_mesh.h"
#include "dist/dist.h"

using namespace weft;
using namespace weft::dist;
using Catch::Contains;
using Catch::StartsWith;

namespace {

// The message `work` makes every rank throw, or "" when it returns.
template <class Work>
std::string agreed_message(const std::vector<ProcessGroupPtr>& groups, Work&& work, int* failed_rank = nullptr) {
  try {
    agree(groups, "testing", work);
  } catch (const AgreedError& e) {
    if (failed_rank) *failed_rank = e.failed_rank;
    return e.what();
  }
  return "";
}

// The ranks are still in step: every rank gets the sum of 1..world.
void check_in_step() {
  Tensor x = from_vector({double(rank() + 1)}, {1}, {.dtype = kFloat64});
  world()->all_reduce(x)->wait();
  CHECK(x.item() == world_size() * (world_size() + 1) / 2);
}

}  // namespace

TEST_CASE("agree: no failure returns on every rank") {
  int ran = 0;
  CHECK(agreed_message({world()}, [&] { ++ran; }) == "");
  CHECK(ran == 1);
  check_in_step();
}

TEST_CASE("agree: one rank throws, every rank throws a named error") {
  const int bad = world_size() - 1;
  int failed = -2;
  std::string message = agreed_message({world()}, [&] {
    if (rank() == bad) throw std::runtime_error("cannot open data.bin on rank " + std::to_string(bad));
  }, &failed);
  CHECK(failed == bad);
  if (rank() == bad) {
    CHECK(message == "cannot open data.bin on rank " + std::to_string(bad));  // its own, unchanged
  } else {
    CHECK(message == "testing failed on another rank (rank " + std::to_string(bad) + ": cannot open data.bin on rank " +
                         std::to_string(bad) + ")");
  }
  check_in_step();
}

TEST_CASE("agree: several ranks fail; the others name the lowest, each failed rank keeps its own") {
  int failed = -2;
  std::string message = agreed_message({world()}, [&] {
    if (rank() == 0 || rank() == world_size() - 1) WEFT_ERROR("bad flag on rank {}", rank());
  }, &failed);
  CHECK(failed == 0);
  // (WEFT_ERROR adds " (at file:line)" to a message.)
  if (rank() == 0 || rank() == world_size() - 1) CHECK_THAT(message, StartsWith("bad flag on rank " + std::to_string(rank()) + " (at"));
  else CHECK_THAT(message, StartsWith("testing failed on another rank (rank 0: bad flag on rank 0 (at"));
  check_in_step();
}

TEST_CASE("agree: over a 2-D mesh's groups, every rank of the mesh learns of the failure") {
  const int n = world_size(), replicas = n % 2 == 0 ? 2 : n, shards = n / replicas;
  DeviceMesh mesh(DeviceType::cpu, {replicas, shards}, {"replicate", "shard"});
  const int bad = n - 1;
  std::string message = agreed_message({mesh.group("shard"), mesh.group("replicate")}, [&] {
    if (rank() == bad) WEFT_ERROR("disk full");
  });
  if (rank() == bad) CHECK_THAT(message, StartsWith("disk full (at"));
  else CHECK_THAT(message, StartsWith("testing failed on another rank (rank " + std::to_string(bad) + ": disk full (at"));
  check_in_step();
}

TEST_CASE("agree: an AgreedError from a nested agreement passes through unchanged") {
  const int bad = world_size() - 1;
  std::string inner_message = agreed_message({world()}, [&] { if (rank() == bad) WEFT_ERROR("inner"); });
  std::string outer = agreed_message({world()}, [&] {
    agree({world()}, "inner step", [&] { if (rank() == bad) WEFT_ERROR("inner"); });
  });
  CHECK_THAT(outer, StartsWith(rank() == bad ? "inner (at" : "inner step failed on another rank (rank " + std::to_string(bad) + ": inner (at"));
  CHECK(!inner_message.empty());
  check_in_step();
}

TEST_CASE("agree: a collective only one rank's work issues stops every rank with the check's message, no hang") {
  // The others meet it in the agreement's own all-reduce: each rank throws the collective check's error, the last from
  // its work, which it had carried into an all-reduce no one else would join (till the collective timeout).
  if (world_size() == 1) return;  // no other rank to disagree with
  std::string message = agreed_message({world()}, [&] {
    if (rank() == world_size() - 1) world()->all_reduce(zeros({3}, {.dtype = kInt64}))->wait();
  });
  CHECK_THAT(message, Contains("dist collective check") && Contains("issue different collectives"));
  check_in_step();
}

TEST_CASE("agree: a long message is cut, not overrun") {
  const std::string huge(10000, 'x');
  std::string message = agreed_message({world()}, [&] { if (rank() == 0) throw std::runtime_error(huge); });
  if (rank() == 0) CHECK(message == huge);
  else CHECK(message.size() < 2100);
  check_in_step();
}

TEST_CASE("agree: without groups (a process alone) the error is this rank's own") {
  CHECK_THAT(agreed_message({}, [] { WEFT_ERROR("alone"); }), StartsWith("alone (at"));
  CHECK(agreed_message({nullptr}, [] {}) == "");
}

namespace {

// The message check_same_config throws on this rank, or "" when it returns.
std::string config_message(const ConfigSettings& settings, int* failed_rank = nullptr) {
  try {
    check_same_config(settings, "weft-test");
  } catch (const AgreedError& e) {
    if (failed_rank) *failed_rank = e.failed_rank;
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("check_same_config: equal settings pass on every rank") {
  CHECK(config_message({{"--lr", "0.1"}, {"--steps", "10"}, {"--data", std::string(200, 'x')}}) == "");
  CHECK(config_message({}) == "");
  check_in_step();
}

TEST_CASE("check_same_config: a value that differs by rank names the flag and every rank's value, on every rank") {
  int failed = -2;
  // --steps differs too, later: the first differing flag is named.
  std::string message = config_message({{"--model", "mlp"}, {"--lr", rank() == 0 ? "0.1" : "0.2"},
                                        {"--steps", std::to_string(rank())}}, &failed);
  if (world_size() == 1) {
    CHECK(message == "");
  } else {
    const std::string others = world_size() == 2 ? "rank 1" : "ranks 1-" + std::to_string(world_size() - 1);
    CHECK(message == "weft-test: the ranks differ: --lr is 0.1 on rank 0, 0.2 on " + others +
                         " (every rank must get the same flags)");
    CHECK(failed == 1);
  }
  check_in_step();
}

TEST_CASE("check_same_config: each rank its own value; long values are cut") {
  std::string message = config_message({{"--data", "/data/rank" + std::to_string(rank()) + std::string(100, 'z')}});
  if (world_size() > 1) {
    CHECK_THAT(message, StartsWith("weft-test: the ranks differ: --data is /data/rank0zz"));
    for (int r = 0; r < world_size(); ++r)
      CHECK_THAT(message, Contains("/data/rank" + std::to_string(r) + "zz") && Contains("... on rank " + std::to_string(r)));
  }
  check_in_step();
}

TEST_CASE("check_same_config: a different number of settings is named, not a hang") {
  ConfigSettings settings{{"--lr", "0.1"}};
  if (rank() == world_size() - 1) settings.push_back({"--extra", "1"});
  std::string message = config_message(settings);
  if (world_size() > 1) CHECK_THAT(message, Contains("the ranks passed between 1 and 2 settings"));
  check_in_step();
}

TEST_CASE("local_device: the CPU, or a clear error without a GPU") {
  CHECK(local_device(DeviceType::cpu) == Device::cpu());
  if (cuda_device_count() == 0)
    CHECK_THROWS_WITH(local_device(DeviceType::cuda), Contains("dist::local_device: no CUDA device is usable"));
  else
    CHECK(local_device(DeviceType::cuda).index == local_rank() % cuda_device_count());
}
