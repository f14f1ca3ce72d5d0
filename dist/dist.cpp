// dist: process-wide state: MPI start-up and shutdown, the world groups and default meshes,
// settings from the environment, and the registry of live groups that finalize() closes.
#include "dist/dist.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/device_runtime.h"
#include "core/sanitizers.h"
#include "core/trace.h"
#include "dist/agree.h"
#include "dist/backend.h"
#include "dist/check.h"
#include "dist/device_mesh.h"
#include "dist/flight_recorder.h"
#if defined(WEFT_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

namespace weft::dist {
namespace {

// OpenMPI keeps what MPI_Init_thread and MPI_Finalize allocate until exit, from plugins it has
// unloaded by then, which no suppression file can name: LeakSanitizer ignores those two calls.
#if defined(WEFT_ASAN)
using MpiLeaksIgnored = __lsan::ScopedDisabler;
#else
struct MpiLeaksIgnored {};
#endif

struct State {
  std::recursive_mutex mu;
  bool initialized = false;
  bool started_mpi = false;  // weft called MPI_Init_thread, so weft calls MPI_Finalize
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::atomic<double> timeout{300.0};
  std::atomic<bool> debug{false};
  std::atomic<bool> check{true};
  ProcessGroupPtr world[kNumDeviceTypes];
  std::map<std::pair<DeviceType, std::vector<int>>, std::shared_ptr<DeviceMesh>> meshes;  // default_mesh()
  std::vector<std::weak_ptr<ProcessGroup>> groups;
};

State& state() {
  static State* s = new State;  // never destroyed: the comm thread may outlive static destructors
  return *s;
}

double parse_timeout(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  WEFT_CHECK(end != text && *end == '\0', "dist::init: WEFT_COLLECTIVE_TIMEOUT='{}' is not a number of seconds", text);
  return checked_timeout(v, "dist::init: WEFT_COLLECTIVE_TIMEOUT");
}

bool parse_flag(const char* name, const char* text) {
  std::string v(text);
  if (v == "" || v == "0" || v == "false" || v == "off" || v == "no") return false;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  WEFT_ERROR("dist::init: {}='{}' is not a flag (use 1 or 0)", name, text);
}

void start_mpi() {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.initialized) return;
  int inited = 0, finalized = 0, provided = 0;
  MPI_CHECK(MPI_Finalized(&finalized));
  WEFT_CHECK(!finalized, "dist::init: MPI was already finalized; it cannot be started again in this process");
  MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) {
    [[maybe_unused]] MpiLeaksIgnored ignored;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    s.started_mpi = true;
  } else {
    MPI_CHECK(MPI_Query_thread(&provided));
  }
  WEFT_CHECK(provided >= MPI_THREAD_MULTIPLE,
             "dist::init: MPI grants thread level {} but weft's communication thread needs "
             "MPI_THREAD_MULTIPLE ({}); use an MPI built with thread support",
             provided, int(MPI_THREAD_MULTIPLE));
  // Errors come back as codes that MPI_CHECK turns into exceptions, instead of MPI's default
  // of killing the job without saying which weft call failed.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &s.rank));
  trace::set_rank(s.rank);
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &s.size));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &s.local_rank));
  MPI_CHECK(MPI_Comm_size(node, &s.local_size));
  MPI_CHECK(MPI_Comm_free(&node));
  std::string bad;  // this rank's value that does not parse: every rank stops, as below
  try {
    if (const char* t = std::getenv("WEFT_COLLECTIVE_TIMEOUT")) s.timeout = parse_timeout(t);
    if (const char* d = std::getenv("WEFT_DIST_DEBUG")) s.debug = parse_flag("WEFT_DIST_DEBUG", d);
    if (const char* c = std::getenv("WEFT_COLLECTIVE_CHECK")) s.check = parse_flag("WEFT_COLLECTIVE_CHECK", c);
  } catch (const Error& e) {
    bad = e.what();
  }
  // Ranks that check differently would post their checks and collectives on different
  // communicators and wait on each other: every rank must have the same settings.
  int flags[5] = {int(s.debug), int(s.check), -int(s.debug), -int(s.check), bad.empty() ? s.size : s.rank};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 5, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  auto stop = [&](const std::string& why) {  // every rank sees the same result and stops here; MPI ends cleanly
    if (s.started_mpi) MPI_CHECK(MPI_Finalize());
    s.started_mpi = false;
    throw AgreedError(why, s.rank, true);
  };
  if (flags[4] < s.size) stop(!bad.empty() ? bad : fmt::format("dist::init: rank {}'s environment holds a value that "
                                                               "does not parse (its message names it)", flags[4]));
  for (auto [i, name] : {std::pair{0, "WEFT_DIST_DEBUG"}, {1, "WEFT_COLLECTIVE_CHECK"}})
    if (flags[i] != -flags[i + 2])
      stop(fmt::format("dist::init: {} differs between ranks (on for some, off for others; this rank: {}); give every "
                       "rank the same environment (mpirun -x {})",
                       name, (i == 0 ? bool(s.debug) : bool(s.check)) ? "on" : "off", name));
  detail::flight_start();
  detail::start_comm_thread(s.local_size);
  s.initialized = true;
}
}  // namespace

void init() {
  start_mpi();
  world();  // made on every rank at once: later agreement checks (a DeviceMesh's) run on it, with a timeout
}

void finalize() {
  State& s = state();
  detail::QuietEngine quiet;  // the groups' close() below; taken before s.mu, as by world()
  std::lock_guard lock(s.mu);
  if (!s.initialized) return;
  detail::drain_comm_thread();
  for (auto& w : s.world) w.reset();
  s.meshes.clear();
  for (auto& weak : s.groups)
    if (auto g = weak.lock(); g && !g->closed()) g->close();
  s.groups.clear();
  detail::stop_comm_thread();
  detail::flight_stop();
  s.initialized = false;
  if (s.started_mpi) {
    [[maybe_unused]] MpiLeaksIgnored ignored;
    MPI_CHECK(MPI_Finalize());
  }
}

bool is_initialized() { return state().initialized; }
int rank() { detail::check_initialized("dist::rank"); return state().rank; }
int world_size() { detail::check_initialized("dist::world_size"); return state().size; }
int local_rank() { detail::check_initialized("dist::local_rank"); return state().local_rank; }
int local_size() { detail::check_initialized("dist::local_size"); return state().local_size; }

Device local_device(DeviceType type) {
  if (type == DeviceType::cpu) return Device::cpu();
  const int count = device_count(type);
  WEFT_CHECK(count > 0, "dist::local_device: no {} device is usable: {}", device_type_name(type),
             device_unavailable_reason(type));
  return Device{type, (is_initialized() ? local_rank() : 0) % count};
}

ProcessGroupPtr world(DeviceType device) {
  detail::check_initialized("dist::world");
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    if (ProcessGroupPtr g = s.world[int(device)]) return g;
  }
  // MPI_Comm_dup must not progress collectives outside the engine; the engine is taken before
  // s.mu (new_group takes s.mu while the engine is quiet).
  detail::QuietEngine quiet;
  std::lock_guard lock(s.mu);
  ProcessGroupPtr& g = s.world[int(device)];
  if (!g) {
    MPI_Comm comm;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    g = detail::new_group(device, comm, "world");
  }
  return g;
}

std::shared_ptr<DeviceMesh> default_mesh(DeviceType device, const std::vector<int>& shape) {
  detail::check_initialized("dist::default_mesh");
  State& s = state();
  const std::vector<int> dims = shape.empty() ? std::vector<int>{s.size} : shape;
  {
    std::lock_guard lock(s.mu);
    if (auto& mesh = s.meshes[{device, dims}]; mesh && !mesh->group(0)->closed()) return mesh;
  }
  // Built holding neither s.mu nor a quiet engine: it agrees on its shape with collectives first.
  auto made = std::make_shared<DeviceMesh>(device, dims);
  std::lock_guard lock(s.mu);
  auto& mesh = s.meshes[{device, dims}];
  if (!mesh || mesh->group(0)->closed()) mesh = made;
  return mesh;
}

double collective_timeout() { return state().timeout; }
void set_collective_timeout(double seconds) {
  state().timeout = checked_timeout(seconds, "dist::set_collective_timeout");
}
bool debug_mode() { return state().debug; }
void set_debug_mode(bool on) { state().debug = on; }
bool collective_check() { return state().check; }
void set_collective_check(bool on) { state().check = on; }

namespace {
detail::DeviceGroupFactory g_group_factories[kNumDeviceTypes] = {};
// The factory for a device type, loading its backend library the first time.
detail::DeviceGroupFactory group_factory(DeviceType device) {
  if (g_group_factories[int(device)] == nullptr) load_backend(device);
  return g_group_factories[int(device)];
}
}  // namespace

void detail::register_device_group(DeviceType device, DeviceGroupFactory factory) {
  g_group_factories[int(device)] = factory;
}

bool nccl_available() { return group_factory(DeviceType::cuda) != nullptr; }
int cuda_device_count() { return device_count(DeviceType::cuda); }

void abort_job(const std::string& message, int exit_code) {
  // The waiting thread and the communication thread's watchdog may both see a timeout: the
  // first one reports and aborts, the second waits for the abort to end the process.
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  int r = -1;
  if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  std::fprintf(stderr, "[weft.dist rank %d] %s\n", r, message.c_str());
  std::fflush(stderr);
  // MPI_Abort asks the launcher to end every rank. A launcher that is gone or stuck (mpirun has
  // been seen to crash in its own PMIx shutdown) would leave this rank in MPI_Abort for ever, so
  // a watchdog ends the process itself; a rank that exits non-zero without MPI_Finalize makes
  // mpirun end the others, and the others' own timeouts end them when there is no mpirun left.
  static constexpr int kAbortGraceSeconds = 10;
  std::thread([r, exit_code] {
    std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
    std::fprintf(stderr, "[weft.dist rank %d] MPI_Abort did not end the job within %d s: exiting\n", r,
                 kAbortGraceSeconds);
    std::_Exit(exit_code);
  }).detach();
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

namespace detail {

void check_initialized(const char* what) {
  WEFT_CHECK(state().initialized, "{}: call dist::init() first", what);
}

ProcessGroupPtr new_group(DeviceType device, MPI_Comm comm, std::string name) {
  ProcessGroupPtr g;
  if (device == DeviceType::cpu) {
    g = new_mpi_group(comm, std::move(name));
  } else if (DeviceGroupFactory factory = group_factory(device)) {
    g = factory(comm, std::move(name));
  } else {
    MPI_Comm_free(&comm);
    WEFT_ERROR("dist: group '{}' on {}: {}", name, device_type_name(device), device == DeviceType::cuda ? "CUDA needs "
               "the NCCL backend, but " + backend_unavailable_reason(device) : "collectives run on CPU or CUDA tensors");
  }
  State& s = state();
  std::lock_guard lock(s.mu);
  std::erase_if(s.groups, [](auto& w) { return w.expired(); });
  s.groups.push_back(g);
  return g;
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group, world_group;
  int n = 0;
  MPI_CHECK(MPI_Comm_group(comm, &group));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  MPI_CHECK(MPI_Group_size(group, &n));
  std::vector<int> mine(static_cast<size_t>(n)), world(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) mine[size_t(i)] = i;
  MPI_CHECK(MPI_Group_translate_ranks(group, n, mine.data(), world_group, world.data()));
  MPI_CHECK(MPI_Group_free(&group));
  MPI_CHECK(MPI_Group_free(&world_group));
  return world;
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8 && ranks.size() > 10) {
      out += fmt::format(", ... {}", ranks.back());
      break;
    }
    out += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  }
  return out + "]";
}

}  // namespace detail
}  // namespace weft::dist
