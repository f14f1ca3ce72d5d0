#include "fsdp/device_sync.h"

#if WEFT_WITH_CUDA
#include <deque>
#include <map>
#include <mutex>

namespace weft::fsdp::detail {

namespace cu = kernels::cuda;

namespace {

struct Kept {
  cu::Event done;
  std::vector<Tensor> tensors;
  std::vector<dist::WorkPtr> works;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}
// Completed in the order they were recorded on one stream, so the front completes first.
std::deque<Kept>& kept() {
  static auto* k = new std::deque<Kept>();  // never destroyed: tensors may outlive main's statics
  return *k;
}

// Pops completed entries from the front; with mu() held. Returns what to drop outside the lock
// (freeing tensors re-enters the allocator).
std::vector<Kept> take_completed(bool wait) {
  std::vector<Kept> out;
  auto& k = kept();
  while (!k.empty()) {
    if (wait) k.front().done.synchronize();
    else if (!k.front().done.query()) break;
    out.push_back(std::move(k.front()));
    k.pop_front();
  }
  return out;
}

}  // namespace

CommStreams& comm_streams(int device) {
  static std::mutex m;
  static std::map<int, CommStreams> streams;
  std::lock_guard lock(m);
  auto it = streams.find(device);
  if (it == streams.end()) {
    cu::check_device(device, "fsdp");
    // Non-blocking: they must not serialise against the legacy default stream the model's
    // kernels run on, or nothing would overlap; every dependency is an explicit event.
    it = streams.emplace(device, CommStreams{cu::Stream::create(device, true), cu::Stream::create(device, true)}).first;
  }
  return it->second;
}

void release_after(cu::Event done, std::vector<Tensor> tensors, std::vector<dist::WorkPtr> works) {
  std::vector<Kept> drop;
  {
    std::lock_guard lock(mu());
    kept().push_back(Kept{std::move(done), std::move(tensors), std::move(works)});
    drop = take_completed(false);
  }
}

void release_completed() {
  std::vector<Kept> drop;
  std::lock_guard lock(mu());
  drop = take_completed(false);
}

void release_all() {
  std::vector<Kept> drop;
  std::lock_guard lock(mu());
  drop = take_completed(true);
}

}  // namespace weft::fsdp::detail
#endif
