// apps: where an app's process sits among the ranks. Keeping ranks in step when one fails is
// dist's (dist/agree.h): an app runs rank-local work through dist::agree(ranks.groups(), ...).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dist/agree.h"
#include "dist/config_check.h"
#include "dist/dist.h"

namespace CLI {
class App;
}

namespace weft::apps {

// Without --fsdp: a world of one that never communicates.
struct Ranks {
  bool fsdp = false;
  int rank = 0, world = 1;
  int tp = 1;  // ranks per tensor-parallel group (consecutive ranks): they train on the same rows
  bool lead() const { return rank == 0; }  // prints, writes metrics and checkpoints
  // Where the rank's rows of a batch are: its data-parallel group among world / tp.
  int data_rank() const { return rank / tp; }
  int data_world() const { return world / tp; }
  // The groups an agreement spans: the world under --fsdp, none (this process alone) otherwise.
  std::vector<dist::ProcessGroupPtr> groups() const;
};

// Where this process sits, checked with the other processes of the launch. Under --fsdp: dist::init, then every rank
// must pass the same `shared` settings (dist::check_same_config). Started by mpirun with several processes but without
// --fsdp, a process still joins MPI to compare --fsdp and `launch` (a subcommand, say) with the others, so that a
// launch giving --fsdp to some ranks only fails on every rank naming --fsdp instead of hanging in MPI_Init; then each
// trains alone (rank 0 says so).
Ranks start_ranks(const std::string& program, bool fsdp, dist::ConfigSettings launch, const dist::ConfigSettings& shared);

// CLI11's parse for a program mpirun may start (in place of CLI11_PARSE): a process asked for --help in a launch of
// several first joins the others (as start_ranks does) and compares --help, so that a launch giving it to some ranks
// only stops every rank naming it (those ranks had exited unjoined, leaving the rest in MPI_Init for ever); given to
// all, rank 0 prints the help. The exit status when the program ends here, else nothing.
std::optional<int> parse_launched(CLI::App& app, int argc, char** argv, const std::string& program);

// A command that runs in one process (export, eval, prepare): refused on every process mpirun
// started when it started several (each had written or printed the same thing again).
void start_alone(const std::string& program, const std::string& command);

// Under --fsdp, that every rank read the same data (names its parts' sizes and sha256s): one path
// can hold other files on another host (node-local disks). Each rank's error names the part.
void check_same_data(const std::map<std::string, std::string>& read, const Ranks& ranks, const std::string& program);

// Under --fsdp, that every rank sees the checkpoint directory `dir` (given by `flag`) rank 0 made: rank 0 writes a file
// in it naming its host and pid, every rank reads it, rank 0 removes it. A directory local to each host had left every
// checkpoint with some ranks' files only, found at the first save, after the training.
void check_shared_dir(const std::string& dir, const std::string& flag, const Ranks& ranks, const std::string& program);

double mean_over_ranks(double local, const Ranks& ranks);
// The name an app's error messages begin with: "weft-mnist" -> "mnist".
inline std::string error_prefix(const std::string& program) { return program.substr(program.rfind('-') + 1); }

}  // namespace weft::apps
