#include "apps/common/ranks.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "dist/agree.h"

namespace weft::apps {

namespace {

int launched_processes() {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  return n ? std::atoi(n) : 1;
}

// A process of a launch of several joins the others: MPI, then whether each was asked for --help.
void join_launch(const std::string& program, bool help) {
  dist::init();
  dist::check_same_config({{"--help", help ? "true" : "false"}}, program);
}

}  // namespace

std::vector<dist::ProcessGroupPtr> Ranks::groups() const {
  if (!fsdp) return {};
  return {dist::world()};
}

Ranks start_ranks(const std::string& program, bool fsdp, dist::ConfigSettings launch, const dist::ConfigSettings& shared) {
  const int launched = launched_processes();
  if (!fsdp && launched <= 1) {
    trace::check_writable();
    return {};
  }
  join_launch(program, false);
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

std::optional<int> parse_launched(CLI::App& app, int argc, char** argv, const std::string& program) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& help) {  // --help: only rank 0 prints it
    if (launched_processes() <= 1) return app.exit(help);
    return dist::run_program(program, [&] {
      join_launch(program, true);
      return dist::rank() == 0 ? app.exit(help) : 0;
    });
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
}

void start_alone(const std::string& program, const std::string& command) {
  if (const int n = launched_processes(); n > 1) {  // after the launch check, so that a rank given another command
    join_launch(program, false);                     // or --fsdp names it
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

void check_shared_dir(const std::string& dir, const std::string& flag, const Ranks& ranks, const std::string& program) {
  if (!ranks.fsdp || dir.empty()) return;
  std::string job = std::getenv("PMIX_NAMESPACE") ? std::getenv("PMIX_NAMESPACE") : "";  // a name of this job's (no
  std::erase_if(job, [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); });  // stale NFS entry of another)
  const std::string probe = (std::filesystem::path(dir) / (".ranks-probe" + job.substr(0, 40))).string();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  dist::agree(ranks.groups(), program, [&] {
    if (ranks.lead())
      write_file_atomic(probe, [&](std::FILE* f) { std::fputs(fmt::format("host {}, pid {}", host, ::getpid()).c_str(), f); });
  });
  std::string seen = "no file";
  dist::agree(ranks.groups(), program, [&] {  // every rank reads it before rank 0 removes it
    std::ifstream in(probe);
    if (in) seen = "rank 0's file, " + std::string(std::istreambuf_iterator<char>(in), {});
  });
  if (std::error_code ec; ranks.lead()) std::filesystem::remove(probe, ec);
  dist::check_same_config({{"what " + flag + " holds", seen}}, program, nullptr, "every rank must see the same "
                          "checkpoint directory: one local to each host would leave each checkpoint some ranks' files only");
}

double mean_over_ranks(double local, const Ranks& ranks) {
  if (!ranks.fsdp) return local;
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

}  // namespace weft::apps
