// dist: what the backends share inside weft (not installed: it includes <mpi.h>, which a
// user of weft's headers should not need).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "process_group.h"

namespace weft::dist::detail {

void check_initialized(const char* what);

// Groups over `comm` (taken over: freed by close()). Every rank of comm calls these together.
ProcessGroupPtr new_mpi_group(MPI_Comm comm, std::string name);
// Device backends (NCCL, in libweft-cuda) register the group type for their device when their
// library is loaded; new_group loads it on first use (core/device_runtime.h).
using DeviceGroupFactory = ProcessGroupPtr (*)(MPI_Comm comm, std::string name);
// [Note: backend registration] in core/device_runtime.h.
void register_device_group(DeviceType device, DeviceGroupFactory factory);
// Picks the backend for the device and registers the group so finalize() can close it.
ProcessGroupPtr new_group(DeviceType device, MPI_Comm comm, std::string name);

// The MPI backend's communication thread (one per process).
void start_comm_thread(int ranks_on_host);  // weft processes on this host
void drain_comm_thread();  // returns once every queued collective has completed
void stop_comm_thread();
// While one lives, the progress engine makes no MPI call: for a thread's own blocking MPI calls (creating and freeing
// communicators), which would otherwise progress the engine's collectives from outside it or race its answers to status
// requests. It first waits for the collectives in flight to complete. Nested ones do nothing more.
class QuietEngine {
 public:
  QuietEngine();
  ~QuietEngine();
  QuietEngine(const QuietEngine&) = delete;
  QuietEngine& operator=(const QuietEngine&) = delete;
};

std::vector<int> world_ranks_of(MPI_Comm comm);
// "[0, 1, 2, 3]", cut short for large groups
std::string ranks_str(const std::vector<int>& ranks);

// Waits for `request` by polling MPI_Test, and aborts the job (naming `info`) if it takes
// longer than the collective timeout. For the few blocking exchanges weft makes itself.
void wait_request(MPI_Request& request, const CollectiveInfo& info, const char* stage);
[[noreturn]] void fail_timeout(const CollectiveInfo& info, double seconds, const std::string& state);

// The check that the ranks of a group issue the same collective (collective_check.cpp). fingerprint: a hash of the call
// (sequence number, kind, dtype, sizes, op, root, label) in [0, 2^62). compare_calls: every rank of comm exchanges the
// full description of its call; returns if all are the same, else throws the same AgreedError on every rank naming the
// calls. Checks pair up in issue order, so the k-th check of every rank describes its k-th call: a rank that skipped a
// collective shows as a different call (or, at the end, as a timeout).
int64_t fingerprint(const CollectiveInfo& info);
void compare_calls(MPI_Comm comm, const std::vector<int>& world_ranks, const CollectiveInfo& info);

}  // namespace weft::dist::detail
