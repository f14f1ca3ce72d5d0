// dist: the communication layer FSDP schedules. Processes are started by `mpirun` (one per CPU slot or GPU, across
// hosts too) or run alone as a world of one. Collectives go through existing engines: OpenMPI for CPU tensors
// (nonblocking MPI collectives driven by one communication thread per process) and NCCL for CUDA tensors (unique id
// sent over MPI). See docs/DIST.md.
//
//   dist::init();
//   auto world = dist::world();                       // ProcessGroup over all ranks (MPI)
//   auto work = world->all_gather_into_tensor(out, in);
//   ... compute while the collective runs ...
//   work->wait();
//   dist::finalize();
#pragma once
#include <string>

#include "../core/device.h"
#include "process_group.h"

namespace weft::dist {

// Starts MPI (MPI_THREAD_MULTIPLE) unless already running, reads WEFT_COLLECTIVE_TIMEOUT and
// WEFT_DIST_DEBUG, and starts the communication thread. Idempotent.
void init();
// Waits for pending collectives (each within the timeout), frees every group's communicator,
// stops the communication thread and finalizes MPI (if weft started it). Idempotent.
void finalize();
bool is_initialized();

int rank();        // in the world
int world_size();
int local_rank();  // among the processes on this host: picks this rank's GPU
int local_size();  // the processes on this host

// This rank's device of `type`: the CPU, or for a GPU type local_rank() modulo the visible devices (one rank per GPU on
// each host; the GPU its NCCL groups use). Device 0 before init() (a process alone). Throws weft::Error saying why when
// no device of `type` is visible (e.g. "weft was built without CUDA ...").
Device local_device(DeviceType type);

// The group of all ranks: MPI for DeviceType::cpu, NCCL for DeviceType::cuda (created on first
// use; a collective call on every rank).
ProcessGroupPtr world(DeviceType device = DeviceType::cpu);

// Seconds a collective may take before the job is aborted (default 300, or
// WEFT_COLLECTIVE_TIMEOUT; fractions allowed). Read when a wait starts.
double collective_timeout();
void set_collective_timeout(double seconds);
// Debug mode (WEFT_DIST_DEBUG=1): before each collective, the ranks of its group exchange a description of the call
// (sequence number, kind, dtype, sizes, op, root) and every rank throws the same error naming the ranks that differ.
bool debug_mode();
void set_debug_mode(bool on);
// The always-on fingerprint check of MPI collectives (docs/DIST.md); WEFT_COLLECTIVE_CHECK=0 turns it off (to measure
// its cost, or for the last microseconds of small collectives). Every rank must have the same setting (dist::init
// checks the environment's agrees); a rank that changes it must do so at the same point as all the others.
bool collective_check();
void set_collective_check(bool on);

bool nccl_available();    // weft was built with the NCCL backend
int cuda_device_count();  // 0 without CUDA support or without a usable GPU

// Prints "[weft.dist rank R] <message>" to stderr and ends every process of the job
// (MPI_Abort). For failures after which the ranks could not agree on what comes next.
[[noreturn]] void abort_job(const std::string& message, int exit_code = 1);

}  // namespace weft::dist
