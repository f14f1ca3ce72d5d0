// dist: the MPI backend (CPU tensors). A collective call queues an MpiWork; the process's
// communication thread posts queued works as nonblocking MPI collectives, in issue order, and
// drives them to completion with MPI_Testsome, so the caller's thread is free to compute.
// bf16/f16 reductions go through f32 buffers: MPI has no 16-bit float type, and summing in f32
// then rounding once is what DESIGN.md asks of 16-bit math.
#include <chrono>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "dist/backend.h"
#include "dist/check.h"
#include "dist/dist.h"

namespace weft::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Handing a collective to the communication thread and back costs two thread wake-ups, each
// tens of microseconds on a VM: both sides spin for a while before they sleep, so
// back-to-back collectives pay neither. Like MPI's own blocking calls, spinning yields the
// core after each poll only when this host runs more weft threads than it has cores.
constexpr auto kWaitSpin = std::chrono::milliseconds(2);
constexpr auto kIdleSpin = std::chrono::milliseconds(1);
std::atomic<bool> g_yield_when_idle{true};

void relax() {
  if (g_yield_when_idle.load(std::memory_order_relaxed)) std::this_thread::yield();
#if defined(__x86_64__) || defined(__i386__)
  else __builtin_ia32_pause();
#endif
}

// Spins until ready() or `budget` has passed; true if ready.
template <class F> bool spin_until(F&& ready, Clock::duration budget) {
  auto end = Clock::now() + budget;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 15) == 0 && Clock::now() > end) return false;
    relax();
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;  // moved as bits; reduced through f32 buffers
    case DType::i64: return MPI_INT64_T;
    case DType::i32: return MPI_INT32_T;
    case DType::u8:
    case DType::bool_: return MPI_UINT8_T;
  }
  WEFT_ERROR("dist: no MPI type for dtype {}", int(t));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;  // avg divides after the sum
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

template <class T> void widen(const void* src, float* dst, int64_t n) {
  auto* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i]);
}
template <class T> void narrow(const float* src, void* dst, int64_t n, float scale) {
  auto* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = T(src[i] * scale);
}
void to_f32(DType t, const void* src, std::vector<float>& dst, int64_t n) {
  dst.resize(size_t(n));
  t == DType::bf16 ? widen<BFloat16>(src, dst.data(), n) : widen<Half>(src, dst.data(), n);
}
void from_f32(DType t, const std::vector<float>& src, void* dst, float scale) {
  int64_t n = int64_t(src.size());
  t == DType::bf16 ? narrow<BFloat16>(src.data(), dst, n, scale) : narrow<Half>(src.data(), dst, n, scale);
}

class MpiProcessGroup;

class MpiWork final : public Work {
 public:
  MpiWork(Collective c, std::shared_ptr<const MpiProcessGroup> group, MPI_Comm comm)
      : Work(c.info), c_(std::move(c)), group_(std::move(group)), comm_(comm) {}

  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  void wait(double timeout_seconds) override;

  // Communication thread only.
  bool start();   // false if the work already ended (it failed before reaching MPI)
  void finish();  // its request completed
  void fail(const std::string& message);
  MPI_Request request = MPI_REQUEST_NULL;
  Clock::time_point posted_at;

 private:
  void post();
  void mark_done();
  int count(int64_t n) const {
    WEFT_CHECK(n <= INT_MAX, "{}: {} elements per call exceed MPI's int counts; split the tensor", info_.str(), n);
    return int(n);
  }

  Collective c_;
  std::shared_ptr<const MpiProcessGroup> group_;  // keeps the communicator alive
  MPI_Comm comm_;
  std::vector<float> stage_in_, stage_out_;  // f32 copies for bf16/f16 reductions
  std::atomic<bool> done_{false}, posted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string error_;
};

class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  MpiProcessGroup(MPI_Comm comm, std::string name, int rank, int size)
      : ProcessGroup(std::move(name), rank, size, world_ranks_of(comm)), comm_(comm) {}
  ~MpiProcessGroup() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!closed_ && !finalized) MPI_Comm_free(&comm_);
  }
  std::string_view backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }
  void close() override {
    if (closed_) return;
    drain_comm_thread();  // its queued collectives still need the communicator
    closed_ = true;
    MPI_CHECK(MPI_Comm_free(&comm_));
  }

 protected:
  WorkPtr launch(Collective c) override;

 private:
  MPI_Comm comm_;
};

// One per process. Works are posted in the order they were queued, which is the order the
// ranks agreed to issue them; posting is nonblocking, so a work never waits for a later one.
class CommThread {
 public:
  void start() {
    stop_ = false;
    thread_ = std::thread([this] { run(); });
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  void enqueue(std::shared_ptr<MpiWork> work) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(work);
      pending_.push_back(std::move(work));
      has_queued_.store(true, std::memory_order_release);
    }
    wake_.notify_one();
  }
  void drain() {
    std::unique_lock lock(mu_);
    double timeout = collective_timeout();
    if (!idle_.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return pending_.empty(); }))
      fail_timeout(pending_.front()->info(), timeout, "still pending when the group was closed or dist::finalize() ran");
  }

 private:
  void run();
  void retire();  // drops completed works from pending_

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<std::shared_ptr<MpiWork>> queue_;    // issued, not yet posted
  std::vector<std::shared_ptr<MpiWork>> pending_;  // issued, not yet completed (oldest first)
  std::atomic<bool> has_queued_{false};
  bool stop_ = false;
  std::thread thread_;
};

CommThread& comm_thread() {
  static CommThread* t = new CommThread;  // never destroyed: see dist.cpp's State
  return *t;
}

void CommThread::retire() {
  std::lock_guard lock(mu_);
  std::erase_if(pending_, [](const auto& w) { return w->is_completed(); });
  if (pending_.empty()) idle_.notify_all();
}

void CommThread::run() {
  std::vector<std::shared_ptr<MpiWork>> active, incoming;
  std::vector<MPI_Request> requests;
  std::vector<int> indices;
  int idle_polls = 0;
  for (uint64_t spins = 0;; ++spins) {
    if (active.empty()) spin_until([&] { return has_queued_.load(std::memory_order_acquire); }, kIdleSpin);
    if (active.empty() || has_queued_.load(std::memory_order_acquire)) {
      std::unique_lock lock(mu_);
      if (active.empty()) wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty() && active.empty()) return;
      incoming.swap(queue_);
      has_queued_.store(false, std::memory_order_relaxed);
    }
    size_t ended = 0;
    for (auto& w : incoming) {
      if (w->start()) {
        active.push_back(w);
        requests.push_back(w->request);
      } else {
        ++ended;
      }
    }
    incoming.clear();
    if (!active.empty()) {
      int n_done = 0;
      indices.resize(active.size());
      int rc = MPI_Testsome(int(requests.size()), requests.data(), &n_done, indices.data(), MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        for (auto& w : active) w->fail(fmt::format("{}: MPI_Testsome failed: {}", w->info().str(), mpi_error_string(rc)));
        ended += active.size();
        active.clear();
        requests.clear();
      } else if (n_done > 0 && n_done != MPI_UNDEFINED) {
        for (int k = 0; k < n_done; ++k) {
          active[size_t(indices[size_t(k)])]->finish();
          active[size_t(indices[size_t(k)])] = nullptr;
        }
        size_t j = 0;
        for (size_t i = 0; i < active.size(); ++i) {
          if (!active[i]) continue;
          active[j] = std::move(active[i]);
          requests[j++] = requests[i];
        }
        active.resize(j);
        requests.resize(j);
        ended += size_t(n_done);
      } else {
        // Nothing finished: check the oldest against the timeout now and then.
        if ((spins & 255) == 0) {
          MpiWork& oldest = *active.front();
          double timeout = collective_timeout();
          if (std::chrono::duration<double>(Clock::now() - oldest.posted_at).count() > timeout)
            fail_timeout(oldest.info(), timeout, "posted to MPI, not completed; seen by the communication thread");
        }
        // With more threads than cores, a long wait sleeps between polls so the compute
        // threads (this rank's and the others') get the cores.
        if (++idle_polls > 64 && g_yield_when_idle.load(std::memory_order_relaxed))
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else
          relax();
      }
    }
    if (ended) {
      idle_polls = 0;
      retire();
    }
  }
}

void MpiWork::wait(double timeout_seconds) {
  auto is_done = [&] { return done_.load(std::memory_order_acquire); };
  if (!spin_until(is_done, kWaitSpin)) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), is_done))
      fail_timeout(info_, timeout_seconds,
                   posted_ ? "posted to MPI, not completed" : "queued behind earlier collectives, not yet posted");
  }
  if (!error_.empty()) throw Error(error_);
}

void MpiWork::mark_done() {
  // MPI is done with the buffers: let their memory go now rather than when the last handle to
  // this Work dies (the communication thread keeps one a while), so callers' memory bounds hold.
  c_.in = Tensor();
  c_.out = Tensor();
  {
    std::lock_guard lock(mu_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void MpiWork::fail(const std::string& message) {
  error_ = message;
  mark_done();
}

bool MpiWork::start() {
  try {
    if (debug_mode()) debug_check(comm_, group_->world_ranks(), info_);
    post();
  } catch (const std::exception& e) {
    fail(e.what());
    return false;
  }
  posted_at = Clock::now();
  posted_.store(true, std::memory_order_relaxed);
  return true;
}

void MpiWork::post() {
  const CollectiveInfo& i = info_;
  MPI_Datatype type = mpi_type(i.dtype);
  void* in = c_.in.defined() ? c_.in.data_ptr() : nullptr;
  void* out = c_.out.defined() ? c_.out.data_ptr() : nullptr;
  bool staged = is_half(i.dtype) && (i.kind == CollectiveKind::reduce_scatter || i.kind == CollectiveKind::all_reduce);
  switch (i.kind) {
    case CollectiveKind::all_gather: {
      int n = count(i.in_numel);
      MPI_CHECK(MPI_Iallgather(c_.in_place_gather ? MPI_IN_PLACE : in, n, type, out, n, type, comm_, &request));
      break;
    }
    case CollectiveKind::reduce_scatter: {
      int m = count(i.out_numel);
      count(i.in_numel);
      if (staged) {
        to_f32(i.dtype, in, stage_in_, i.in_numel);
        stage_out_.resize(size_t(m));
        MPI_CHECK(MPI_Ireduce_scatter_block(stage_in_.data(), stage_out_.data(), m, MPI_FLOAT, mpi_op(i.op), comm_, &request));
      } else {
        MPI_CHECK(MPI_Ireduce_scatter_block(in, out, m, type, mpi_op(i.op), comm_, &request));
      }
      break;
    }
    case CollectiveKind::all_reduce: {
      int n = count(i.in_numel);
      if (staged) {
        to_f32(i.dtype, in, stage_out_, i.in_numel);
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, stage_out_.data(), n, MPI_FLOAT, mpi_op(i.op), comm_, &request));
      } else {
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, out, n, type, mpi_op(i.op), comm_, &request));
      }
      break;
    }
    case CollectiveKind::broadcast:
      MPI_CHECK(MPI_Ibcast(out, count(i.in_numel), type, i.root, comm_, &request));
      break;
    case CollectiveKind::barrier:
      MPI_CHECK(MPI_Ibarrier(comm_, &request));
      break;
    case CollectiveKind::all_to_all: {
      int block = count(i.in_numel / i.group_size);
      MPI_CHECK(MPI_Ialltoall(in, block, type, out, block, type, comm_, &request));
      break;
    }
  }
}

void MpiWork::finish() try {
  const CollectiveInfo& i = info_;
  bool reduces = i.kind == CollectiveKind::reduce_scatter || i.kind == CollectiveKind::all_reduce;
  if (reduces && is_half(i.dtype)) {
    from_f32(i.dtype, stage_out_, c_.out.data_ptr(), i.op == ReduceOp::avg ? 1.0f / float(i.group_size) : 1.0f);
    stage_in_ = {};
    stage_out_ = {};
  } else if (reduces && i.op == ReduceOp::avg) {
    // Divide rather than multiply by 1/size, so results match a sum divided by the count.
    int64_t n = c_.out.numel();
    if (i.dtype == DType::f32) {
      auto* p = static_cast<float*>(c_.out.data_ptr());
      for (int64_t k = 0; k < n; ++k) p[k] /= float(i.group_size);
    } else {
      auto* p = static_cast<double*>(c_.out.data_ptr());
      for (int64_t k = 0; k < n; ++k) p[k] /= double(i.group_size);
    }
  }
  mark_done();
} catch (const std::exception& e) {
  fail(e.what());
}

WorkPtr MpiProcessGroup::launch(Collective c) {
  auto work = std::make_shared<MpiWork>(std::move(c), shared_from_this(), comm_);
  comm_thread().enqueue(work);
  return work;
}

}  // namespace

ProcessGroupPtr new_mpi_group(MPI_Comm comm, std::string name) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::make_shared<MpiProcessGroup>(comm, std::move(name), rank, size);
}

void start_comm_thread(int threads_on_host) {
  g_yield_when_idle = threads_on_host > int(std::thread::hardware_concurrency());
  comm_thread().start();
}
void drain_comm_thread() { comm_thread().drain(); }
void stop_comm_thread() { comm_thread().stop(); }

}  // namespace weft::dist::detail
