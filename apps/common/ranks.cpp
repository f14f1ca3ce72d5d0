#include "apps/common/ranks.h"

#include <cstdio>
#include <cstdlib>

#include "core/tensor.h"
#include "core/trace.h"
#include "dist/agree.h"

namespace weft::apps {

std::vector<dist::ProcessGroupPtr> Ranks::groups() const {
  if (!fsdp) return {};
  return {dist::world()};
}

Ranks start_ranks(const std::string& program, bool fsdp, dist::ConfigSettings launch, const dist::ConfigSettings& shared) {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int launched = n ? std::atoi(n) : 1;
  if (!fsdp && launched <= 1) {
    trace::check_writable();
    return {};
  }
  dist::init();
  launch.insert(launch.begin(), {"--fsdp", fsdp ? "true" : "false"});
  dist::check_same_config(launch, program);  // before any other collective
  if (!fsdp) {
    trace::check_writable();
    if (dist::rank() == 0)
      std::fprintf(stderr, "%s: note: started by mpirun with %d processes but without --fsdp: each trains its own copy "
                   "of the model\n", program.c_str(), launched);
    return {};
  }
  Ranks ranks{.fsdp = true, .rank = dist::rank(), .world = dist::world_size()};
  dist::check_same_config(shared, program);
  dist::agree(ranks.groups(), program, [] { trace::check_writable(); });
  return ranks;
}

void start_alone(const std::string& program, const std::string& command) {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (n && std::atoi(n) > 1) {  // after the launch check, so that a rank given another command or --fsdp names it
    dist::init();
    dist::check_same_config({{"--fsdp", "false"}, {"command", command}}, program);
    WEFT_ERROR("{}: {}{} runs in one process, and mpirun started {}: run it without mpirun", error_prefix(program),
               command, command == "sample" ? " without --fsdp" : "", n);
  }
  trace::check_writable();
}

void check_same_data(const std::map<std::string, std::string>& read, const Ranks& ranks, const std::string& program) {
  dist::ConfigSettings named;
  for (const auto& [part, value] : read) named.emplace_back("the data's " + part, value);
  if (ranks.fsdp) dist::check_same_config(named, program, nullptr, "every rank must read the same data: the path "
                                          "holds other files on some rank's host");
}

double mean_over_ranks(double local, const Ranks& ranks) {
  if (!ranks.fsdp) return local;
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

}  // namespace weft::apps
