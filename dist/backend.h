// dist: what the backends share inside weft (not installed: it includes <mpi.h>, which a
// user of weft's headers should not need).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "dist/process_group.h"

namespace weft::dist::detail {

void check_initialized(const char* what);

// Groups over `comm` (taken over: freed by close()). Every rank of comm calls these together.
ProcessGroupPtr new_mpi_group(MPI_Comm comm, std::string name);
// Device backends (NCCL, in libweft-cuda) register the group type for their device when their
// library is loaded; new_group loads it on first use (core/device_runtime.h).
using DeviceGroupFactory = ProcessGroupPtr (*)(MPI_Comm comm, std::string name);
void register_device_group(DeviceType device, DeviceGroupFactory factory);
// Picks the backend for the device and registers the group so finalize() can close it.
ProcessGroupPtr new_group(DeviceType device, MPI_Comm comm, std::string name);

// The MPI backend's communication thread (one per process).
void start_comm_thread(int threads_on_host);  // 2 per rank on this host: caller + comm thread
void drain_comm_thread();  // returns once every queued collective has completed
void stop_comm_thread();

std::vector<int> world_ranks_of(MPI_Comm comm);
// "[0, 1, 2, 3]", cut short for large groups
std::string ranks_str(const std::vector<int>& ranks);

// Waits for `request` by polling MPI_Test, and aborts the job (naming `info`) if it takes
// longer than the collective timeout. For the few blocking exchanges weft makes itself.
void wait_request(MPI_Request& request, const CollectiveInfo& info, const char* stage);
[[noreturn]] void fail_timeout(const CollectiveInfo& info, double seconds, const std::string& state);

// Debug mode: exchanges a description of `info` over comm and throws the same weft::Error on
// every rank if the ranks' calls differ.
void debug_check(MPI_Comm comm, const std::vector<int>& world_ranks, const CollectiveInfo& info);

}  // namespace weft::dist::detail
