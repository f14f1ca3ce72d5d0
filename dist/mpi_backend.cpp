// dist: the MPI backend (CPU tensors). A collective call queues an MpiWork; queued works are posted as nonblocking MPI
// collectives in issue order and driven to completion with MPI_Testsome by whichever thread holds the process's
// progress engine: the caller's own thread when it issues a call or waits for one (so a call and its wait cost about
// what MPI's own nonblocking call and MPI_Wait do), else the communication thread, which drives works while the caller
// computes. bf16/f16 reductions go through f32 buffers: MPI has no 16-bit float type, and summing in f32 then rounding
// once is how weft does all 16-bit math.
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

// Polling loops pause between polls. When this host runs more threads that poll than it has cores (callers' waits count
// one thread per rank, the communication threads two), the communication thread yields the core after each poll, the
// way OpenMPI's own blocking calls behave when oversubscribed, and a caller's wait sleeps 20 us between polls once it
// has polled 1024 times without progress: a short wait spins, a long one leaves the core to the ranks that share it
// (yielding at every poll made 64 KB all-gathers at 4 ranks on 2 cores 10-20 % slower, docs/PERFORMANCE.md).
std::atomic<bool> g_wait_yields{false}, g_thread_yields{true};

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
void relax(const std::atomic<bool>& yields) {
  if (yields.load(std::memory_order_relaxed)) std::this_thread::yield();
  else pause();
}

// The communication thread naps this long when a caller drives the engine or nothing is in flight, and sleeps until
// woken after kDeepSleepAfter without work (and then answers other ranks' status requests every 50 ms,
// flight_recorder.h). A caller that posts a call and then computes is thus served within a nap without waking the
// thread on every call: on the 2-core VM, naps of 100 us cost FSDP steps 8-10 % against 1 ms (docs/PERFORMANCE.md). A
// caller that ends its wait with other works still in flight wakes the thread at once.
constexpr auto kNap = std::chrono::milliseconds(1);
constexpr auto kDeepSleepAfter = std::chrono::milliseconds(50);
constexpr auto kServeEvery = std::chrono::milliseconds(50);

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

// A work goes through two MPI requests: first its fingerprint check, an all-reduce over the group's check communicator,
// then the collective itself on the group's communicator, posted only when every rank's fingerprint matched. A group
// has one check in flight at a time, so the checks and the collectives are posted in issue order on their
// communicators, and a failed check can exchange the full descriptions on the check communicator at once.
class MpiWork final : public Work {
 public:
  MpiWork(Collective c, std::shared_ptr<MpiProcessGroup> group)
      : Work(c.info), c_(std::move(c)), group_(std::move(group)) {}

  bool is_completed() override { return done_.load(std::memory_order_acquire); }
  void wait(double timeout_seconds) override;

  // Only the thread that holds the progress engine.
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
  std::exception_ptr error_;  // set before done_
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
    QuietEngine quiet;  // its queued collectives still need the communicator
    closed_ = true;
    MPI_CHECK(MPI_Comm_free(&comm_));
    MPI_CHECK(MPI_Comm_free(&check_comm_));
  }

  // check_in_flight: only the thread that holds the progress engine.
  MPI_Comm comm_, check_comm_;
  bool check_in_flight = false;

 protected:
  WorkPtr launch(Collective c) override;
};

// One per process: the works in flight and the communication thread. Works are posted in the order they were queued,
// which is the order the ranks agreed to issue them; posting is nonblocking, so a work never waits for a later one.
//
// The engine's state: queued, waiting (a check of their group is in flight) and active works, and one poll() over them.
// A thread drives it only while holding engine_mu_. The caller's thread takes it when it issues a call (posting the
// call at once) and while it waits for one; the communication thread (run()) takes it whenever works are in flight and
// no caller drives, so works progress while the caller computes.
class ProgressEngine {
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
  void enqueue(std::shared_ptr<MpiWork> work);
  // QuietEngine's: hold the engine with nothing in flight, so no other thread calls MPI.
  void quiet() {
    drain();
    engine_mu_.lock();
  }
  void resume() { engine_mu_.unlock(); }
  void drive_until_done(MpiWork& work, double timeout_seconds);
  void drain() {
    std::unique_lock lock(mu_);
    double timeout = collective_timeout();
    if (!idle_.wait_for(lock, std::chrono::duration<double>(timeout), [&] { return pending_.empty(); }))
      fail_timeout(pending_.front()->info(), timeout, "still pending when the group was closed or dist::finalize() ran");
  }

 private:
  void run();
  // One pass of the engine (engine_mu_ held); true if a work advanced or ended. `who` names the
  // driving thread in timeout reports.
  bool poll(const char* who);
  void retire();   // drops completed works from pending_
  void wake_if_asleep() {
    if (asleep_.load(std::memory_order_acquire)) wake_.notify_one();
  }

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<std::shared_ptr<MpiWork>> queue_;    // issued, not yet taken by the engine
  std::vector<std::shared_ptr<MpiWork>> pending_;  // issued, not yet completed (oldest first)
  std::atomic<bool> has_queued_{false}, asleep_{false};
  std::atomic<int> drivers_{0};  // callers' threads driving the engine or waiting to
  std::atomic<size_t> n_pending_{0};  // pending_.size()
  bool stop_ = false;
  std::thread thread_;

  std::mutex engine_mu_;
  std::vector<std::shared_ptr<MpiWork>> active_, waiting_;
  std::vector<MPI_Request> requests_;  // active_[i]'s request
  std::vector<int> indices_;
  uint64_t polls_ = 0;
  Clock::time_point last_serve_ = Clock::now();
};

ProgressEngine& progress_engine() {
  static ProgressEngine* t = new ProgressEngine;  // never destroyed: see dist.cpp's State
  return *t;
}

void ProgressEngine::retire() {
  std::lock_guard lock(mu_);
  std::erase_if(pending_, [](const auto& w) { return w->is_completed(); });
  n_pending_.store(pending_.size(), std::memory_order_release);
  if (pending_.empty()) idle_.notify_all();
}

// Begins the waiting works whose group has no check in flight, in issue order; returns how many ended at once (failed).
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

bool ProgressEngine::poll(const char* who) {
  if (has_queued_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    waiting_.insert(waiting_.end(), std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
    queue_.clear();
    has_queued_.store(false, std::memory_order_relaxed);
  }
  size_t ended = waiting_.empty() ? 0 : begin_waiting(waiting_, active_, requests_);
  bool completed = false;
  if (!active_.empty()) {
    int n_done = 0;
    indices_.resize(active_.size());
    int rc = MPI_Testsome(int(requests_.size()), requests_.data(), &n_done, indices_.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      for (auto& w : active_) w->fail(fmt::format("{}: MPI_Testsome failed: {}", w->info().str(), mpi_error_string(rc)));
      ended += active_.size();
      active_.clear();
      requests_.clear();
    } else if (n_done > 0 && n_done != MPI_UNDEFINED) {
      completed = true;
      for (int k = 0; k < n_done; ++k) {
        size_t i = size_t(indices_[size_t(k)]);
        if (active_[i]->advance()) {
          requests_[i] = active_[i]->request;  // its check passed: the collective is posted
        } else {
          active_[i] = nullptr;
          ++ended;
        }
      }
      size_t j = 0;
      for (size_t i = 0; i < active_.size(); ++i) {
        if (!active_[i]) continue;
        active_[j] = std::move(active_[i]);
        requests_[j++] = requests_[i];
      }
      active_.resize(j);
      requests_.resize(j);
      ended += begin_waiting(waiting_, active_, requests_);  // the next checks of those groups
    } else if ((++polls_ & 255) == 0) {
      // Nothing finished: check the oldest against the timeout now and then.
      MpiWork& oldest = *active_.front();
      double timeout = collective_timeout();
      if (std::chrono::duration<double>(Clock::now() - oldest.posted_at).count() > timeout)
        fail_timeout(oldest.info(), timeout,
                     fmt::format("{}; seen by {}",
                                 oldest.checking ? "its fingerprint check is posted; the other ranks have not "
                                                   "issued a collective to match it"
                                                 : "posted to MPI, not completed",
                                 who));
      if (Clock::now() - last_serve_ > kServeEvery) {
        flight_serve();
        last_serve_ = Clock::now();
      }
    }
  }
  if (ended) retire();
  return completed || ended;
}

void ProgressEngine::enqueue(std::shared_ptr<MpiWork> work) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(work);
    pending_.push_back(std::move(work));
    n_pending_.store(pending_.size(), std::memory_order_release);
    has_queued_.store(true, std::memory_order_release);
  }
  // Post it now on this thread unless another thread drives the engine (it takes the queue on its next poll).
  if (std::unique_lock engine(engine_mu_, std::try_to_lock); engine.owns_lock()) poll("the issuing thread");
  wake_if_asleep();
}

void ProgressEngine::drive_until_done(MpiWork& work, double timeout_seconds) {
  drivers_.fetch_add(1, std::memory_order_acq_rel);
  Clock::time_point deadline{};  // set at the first look at the clock (most waits end before)
  int idle_polls = 0;
  for (uint64_t i = 1; !work.is_completed(); ++i) {
    bool progressed;
    {
      std::lock_guard engine(engine_mu_);
      progressed = poll("the waiting thread");
    }
    if (work.is_completed()) break;
    if ((i & 63) == 0 && deadline == Clock::time_point{})
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
    else if ((i & 63) == 0 && Clock::now() > deadline) {
      const char* where = work.checking ? "its fingerprint check is posted; the other ranks have not issued a "
                                          "collective to match it"
                                        : "posted to MPI, not completed, or queued behind such collectives";
      fail_timeout(work.info(), timeout_seconds, where);
    }
    // A long wait sleeps between polls when cores are short, so other ranks get them.
    if (progressed) idle_polls = 0;
    else if (++idle_polls > 1024 && g_wait_yields.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else pause();
  }
  // Works still in flight (a prefetch issued before this wait) go back to the communication thread.
  if (drivers_.fetch_sub(1, std::memory_order_acq_rel) == 1 && n_pending_.load(std::memory_order_acquire) > 0) {
    { std::lock_guard lock(mu_); }  // the thread is either before its check of drivers_ or asleep
    wake_.notify_one();
  }
}

void ProgressEngine::run() {
  auto last_work = Clock::now();
  auto last_serve = Clock::now();
  int idle_polls = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto has_work = [&] { return stop_ || (drivers_.load(std::memory_order_acquire) == 0 && !pending_.empty()); };
      while (!has_work()) {
        // Nap while a caller drives or work ended recently; sleep until woken after that.
        const bool deep = Clock::now() - last_work > kDeepSleepAfter;
        asleep_.store(deep, std::memory_order_release);
        if (deep) wake_.wait_for(lock, kServeEvery, has_work);
        else wake_.wait_for(lock, kNap, has_work);
        asleep_.store(false, std::memory_order_relaxed);
        if (!has_work() && Clock::now() - last_serve > kServeEvery) {
          lock.unlock();
          // Answer other ranks' status requests (flight_recorder.h). Its MPI_Test progresses
          // every request, writing into collectives' buffers, so it too runs only while holding
          // the engine; a caller that holds it serves from poll() instead.
          if (std::unique_lock engine(engine_mu_, std::try_to_lock); engine.owns_lock()) flight_serve();
          last_serve = Clock::now();
          lock.lock();
        }
      }
      if (stop_ && pending_.empty()) return;
    }
    last_work = Clock::now();
    bool progressed = false;
    if (std::unique_lock engine(engine_mu_, std::try_to_lock); engine.owns_lock()) progressed = poll("the communication thread");
    // With more threads than cores, a long wait sleeps between polls so the compute threads
    // (this rank's and the others') get the cores.
    if (progressed) idle_polls = 0;
    else if (++idle_polls > 64 && g_thread_yields.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else relax(g_thread_yields);
  }
}

void MpiWork::wait(double timeout_seconds) {
  checked_timeout(timeout_seconds, "Work::wait");
  if (!is_completed()) progress_engine().drive_until_done(*this, timeout_seconds);
  if (error_) std::rethrow_exception(error_);
}

void MpiWork::mark_done() {
  // MPI is done with the buffers: let their memory go now rather than when the last handle to
  // this Work dies (the communication thread keeps one a while), so callers' memory bounds hold.
  c_.in = Tensor();
  c_.out = Tensor();
  done_.store(true, std::memory_order_release);
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
      posted_at = Clock::now();
      posted_.store(true, std::memory_order_relaxed);
      flight_stage(info_, CollectiveStage::posted, posted_at);
    } else {
      fingerprint_[0] = fingerprint(info_);
      fingerprint_[1] = -fingerprint_[0];
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, fingerprint_, 2, MPI_INT64_T, MPI_MIN, g.check_comm_, &request));
      g.check_in_flight = true;
      checking = true;
      posted_at = Clock::now();
      flight_stage(info_, CollectiveStage::checking, posted_at);
    }
  } catch (...) {
    fail_with(std::current_exception());
    return false;
  }
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
  flight_stage(info_, CollectiveStage::posted, posted_at);
  return true;
}

void MpiWork::post() {
  const CollectiveInfo& i = info_;
  MPI_Datatype type = mpi_type(i.dtype);
  void* in = c_.in.defined() ? c_.in.data_ptr() : nullptr;
  void* out = c_.out.defined() ? c_.out.data_ptr() : nullptr;
  bool staged = is_16bit(i.dtype) && (i.kind == CollectiveKind::reduce_scatter || i.kind == CollectiveKind::all_reduce);
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
  if (reduces && is_16bit(i.dtype)) {
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
  progress_engine().enqueue(work);
  return work;
}

}  // namespace

ProcessGroupPtr new_mpi_group(MPI_Comm comm, std::string name) {
  QuietEngine quiet;
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Comm check_comm;  // for the fingerprint checks, apart from the collectives' order
  MPI_CHECK(MPI_Comm_dup(comm, &check_comm));
  return std::make_shared<MpiProcessGroup>(comm, check_comm, std::move(name), rank, size);
}

void start_comm_thread(int ranks_on_host) {
  const int cores = int(std::thread::hardware_concurrency());
  g_wait_yields = ranks_on_host > cores;
  g_thread_yields = 2 * ranks_on_host > cores;
  progress_engine().start();
}
void drain_comm_thread() { progress_engine().drain(); }

namespace {
thread_local int g_quiet_depth = 0;  // QuietEngines alive on this thread
}  // namespace

QuietEngine::QuietEngine() {
  if (g_quiet_depth++ == 0) progress_engine().quiet();
}
QuietEngine::~QuietEngine() {
  if (--g_quiet_depth == 0) progress_engine().resume();
}
void stop_comm_thread() { progress_engine().stop(); }

}  // namespace weft::dist::detail
