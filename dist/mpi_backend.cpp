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
#include "dist/flight_recorder.h"

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

// A work goes through two MPI requests: first its fingerprint check, an all-reduce over the
// group's check communicator, then the collective itself on the group's communicator, posted
// only when every rank's fingerprint matched. A group has one check in flight at a time, so the
// checks and the collectives are posted in issue order on their communicators, and a failed
// check can exchange the full descriptions on the check communicator at once.
class MpiWork final : public Work {
 public:
  MpiWork(Collective c, std::shared_ptr<MpiProcessGroup> group)
      : Work(c.info), c_(std::move(c)), group_(std::move(group)) {}

  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  void wait(double timeout_seconds) override;

  // Communication thread only.
  MpiProcessGroup& group() const { return *group_; }
  bool begin();    // posts the check (debug mode: compares and posts the collective); false if it ended
  bool advance();  // its request completed; true if it posted the collective after its check
  void fail(const std::string& message);
  MPI_Request request = MPI_REQUEST_NULL;
  Clock::time_point posted_at;
  std::atomic<bool> checking{false};  // `request` is the fingerprint check (read by waiters' timeout messages)

 private:
  void post();
  void finish();
  void fail_with(std::exception_ptr error);
  void mark_done();
  int count(int64_t n) const {
    WEFT_CHECK(n <= INT_MAX, "{}: {} elements per call exceed MPI's int counts; split the tensor", info_.str(), n);
    return int(n);
  }

  Collective c_;
  std::shared_ptr<MpiProcessGroup> group_;  // keeps the communicators alive
  int64_t fingerprint_[2] = {0, 0};          // {h, -h}, then their minimum over the group
  std::vector<float> stage_in_, stage_out_;  // f32 copies for bf16/f16 reductions
  std::atomic<bool> done_{false}, posted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::exception_ptr error_;
};

class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  MpiProcessGroup(MPI_Comm comm, MPI_Comm check_comm, std::string name, int rank, int size)
      : ProcessGroup(std::move(name), rank, size, world_ranks_of(comm)), comm_(comm), check_comm_(check_comm) {}
  ~MpiProcessGroup() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!closed_ && !finalized) {
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&check_comm_);
    }
  }
  std::string_view backend() const override { return "mpi"; }
  Device device() const override { return Device::cpu(); }
  void close() override {
    if (closed_) return;
    drain_comm_thread();  // its queued collectives still need the communicator
    closed_ = true;
    MPI_CHECK(MPI_Comm_free(&comm_));
    MPI_CHECK(MPI_Comm_free(&check_comm_));
  }

  // Communication thread only.
  MPI_Comm comm_, check_comm_;
  bool check_in_flight = false;

 protected:
  WorkPtr launch(Collective c) override;
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
  std::vector<std::shared_ptr<MpiWork>> queue_;    // issued, not yet seen by the thread
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

// Begins the waiting works whose group has no check in flight, in issue order; returns how many
// ended at once (failed).
size_t begin_waiting(std::vector<std::shared_ptr<MpiWork>>& waiting, std::vector<std::shared_ptr<MpiWork>>& active,
                     std::vector<MPI_Request>& requests) {
  size_t ended = 0, kept = 0;
  for (auto& w : waiting) {
    if (w->group().check_in_flight) {
      waiting[kept++] = std::move(w);
    } else if (w->begin()) {
      active.push_back(w);
      requests.push_back(w->request);
    } else {
      ++ended;
    }
  }
  waiting.resize(kept);
  return ended;
}

void CommThread::run() {
  std::vector<std::shared_ptr<MpiWork>> active, waiting;
  std::vector<MPI_Request> requests;
  std::vector<int> indices;
  int idle_polls = 0;
  auto last_serve = Clock::now();
  for (uint64_t spins = 0;; ++spins) {
    if (active.empty()) spin_until([&] { return has_queued_.load(std::memory_order_acquire); }, kIdleSpin);
    if (active.empty() || has_queued_.load(std::memory_order_acquire)) {
      std::unique_lock lock(mu_);
      // Idle: wake now and then to answer other ranks' status requests (flight_recorder.h).
      while (active.empty() && !wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || !queue_.empty(); })) {
        lock.unlock();
        flight_serve();
        lock.lock();
      }
      if (stop_ && queue_.empty() && active.empty()) return;
      waiting.insert(waiting.end(), std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      has_queued_.store(false, std::memory_order_relaxed);
    }
    size_t ended = begin_waiting(waiting, active, requests);
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
          size_t i = size_t(indices[size_t(k)]);
          if (active[i]->advance()) {
            requests[i] = active[i]->request;  // its check passed: the collective is posted
          } else {
            active[i] = nullptr;
            ++ended;
          }
        }
        size_t j = 0;
        for (size_t i = 0; i < active.size(); ++i) {
          if (!active[i]) continue;
          active[j] = std::move(active[i]);
          requests[j++] = requests[i];
        }
        active.resize(j);
        requests.resize(j);
        ended += begin_waiting(waiting, active, requests);  // the next checks of those groups
        idle_polls = 0;
      } else {
        // Nothing finished: check the oldest against the timeout now and then.
        if ((spins & 255) == 0) {
          MpiWork& oldest = *active.front();
          double timeout = collective_timeout();
          if (std::chrono::duration<double>(Clock::now() - oldest.posted_at).count() > timeout)
            fail_timeout(oldest.info(), timeout,
                         oldest.checking ? "its fingerprint check is posted; the other ranks have not issued a "
                                           "collective to match it; seen by the communication thread"
                                         : "posted to MPI, not completed; seen by the communication thread");
          if (Clock::now() - last_serve > std::chrono::milliseconds(50)) {
            flight_serve();
            last_serve = Clock::now();
          }
        }
        // With more threads than cores, a long wait sleeps between polls so the compute
        // threads (this rank's and the others') get the cores.
        if (++idle_polls > 64 && g_yield_when_idle.load(std::memory_order_relaxed))
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        else
          relax();
      }
    }
    if (ended) retire();
  }
}

void MpiWork::wait(double timeout_seconds) {
  auto is_done = [&] { return done_.load(std::memory_order_acquire); };
  if (!spin_until(is_done, kWaitSpin)) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), is_done))
      fail_timeout(info_, timeout_seconds,
                   posted_     ? "posted to MPI, not completed"
                   : checking  ? "its fingerprint check is posted; the other ranks have not issued a collective to match it"
                               : "queued behind earlier collectives, not yet posted");
  }
  if (error_) std::rethrow_exception(error_);
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

void MpiWork::fail(const std::string& message) { fail_with(std::make_exception_ptr(Error(message))); }

void MpiWork::fail_with(std::exception_ptr error) {
  error_ = std::move(error);
  flight_stage(info_, CollectiveStage::failed);
  mark_done();
}

bool MpiWork::begin() {
  MpiProcessGroup& g = *group_;
  try {
    if (debug_mode() || g.size() == 1 || !collective_check()) {
      if (g.size() > 1 && debug_mode()) compare_calls(g.check_comm_, g.world_ranks(), info_);
      post();
      posted_.store(true, std::memory_order_relaxed);
      flight_stage(info_, CollectiveStage::posted);
    } else {
      fingerprint_[0] = fingerprint(info_);
      fingerprint_[1] = -fingerprint_[0];
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, fingerprint_, 2, MPI_INT64_T, MPI_MIN, g.check_comm_, &request));
      g.check_in_flight = true;
      checking = true;
      flight_stage(info_, CollectiveStage::checking);
    }
  } catch (...) {
    fail_with(std::current_exception());
    return false;
  }
  posted_at = Clock::now();
  return true;
}

bool MpiWork::advance() {
  if (!checking) {
    finish();
    return false;
  }
  checking = false;
  group_->check_in_flight = false;
  try {
    // Every rank sees the same minimum of {h, -h}: all agree that all fingerprints are equal
    // (the minimum is h and the maximum is h), or all compare the full descriptions.
    int64_t mine = fingerprint(info_);
    if (fingerprint_[0] != mine || -fingerprint_[1] != mine) {
      compare_calls(group_->check_comm_, group_->world_ranks(), info_);
      WEFT_ERROR("{}: the ranks' fingerprints of this call differ, but their descriptions match", info_.str());
    }
    post();
  } catch (...) {
    fail_with(std::current_exception());
    return false;
  }
  posted_at = Clock::now();
  posted_.store(true, std::memory_order_relaxed);
  flight_stage(info_, CollectiveStage::posted);
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
      MPI_CHECK(MPI_Iallgather(c_.in_place_gather ? MPI_IN_PLACE : in, n, type, out, n, type, group_->comm_, &request));
      break;
    }
    case CollectiveKind::reduce_scatter: {
      int m = count(i.out_numel);
      count(i.in_numel);
      if (staged) {
        to_f32(i.dtype, in, stage_in_, i.in_numel);
        stage_out_.resize(size_t(m));
        MPI_CHECK(MPI_Ireduce_scatter_block(stage_in_.data(), stage_out_.data(), m, MPI_FLOAT, mpi_op(i.op), group_->comm_, &request));
      } else {
        MPI_CHECK(MPI_Ireduce_scatter_block(in, out, m, type, mpi_op(i.op), group_->comm_, &request));
      }
      break;
    }
    case CollectiveKind::all_reduce: {
      int n = count(i.in_numel);
      if (staged) {
        to_f32(i.dtype, in, stage_out_, i.in_numel);
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, stage_out_.data(), n, MPI_FLOAT, mpi_op(i.op), group_->comm_, &request));
      } else {
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, out, n, type, mpi_op(i.op), group_->comm_, &request));
      }
      break;
    }
    case CollectiveKind::broadcast:
      MPI_CHECK(MPI_Ibcast(out, count(i.in_numel), type, i.root, group_->comm_, &request));
      break;
    case CollectiveKind::barrier:
      MPI_CHECK(MPI_Ibarrier(group_->comm_, &request));
      break;
    case CollectiveKind::all_to_all: {
      int block = count(i.in_numel / i.group_size);
      MPI_CHECK(MPI_Ialltoall(in, block, type, out, block, type, group_->comm_, &request));
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
  flight_stage(info_, CollectiveStage::completed);
  mark_done();
} catch (...) {
  fail_with(std::current_exception());
}

WorkPtr MpiProcessGroup::launch(Collective c) {
  auto work = std::make_shared<MpiWork>(std::move(c), shared_from_this());
  comm_thread().enqueue(work);
  return work;
}

}  // namespace

ProcessGroupPtr new_mpi_group(MPI_Comm comm, std::string name) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Comm check_comm;  // for the fingerprint checks, apart from the collectives' order
  MPI_CHECK(MPI_Comm_dup(comm, &check_comm));
  return std::make_shared<MpiProcessGroup>(comm, check_comm, std::move(name), rank, size);
}

void start_comm_thread(int threads_on_host) {
  g_yield_when_idle = threads_on_host > int(std::thread::hardware_concurrency());
  comm_thread().start();
}
void drain_comm_thread() { comm_thread().drain(); }
void stop_comm_thread() { comm_thread().stop(); }

}  // namespace weft::dist::detail
