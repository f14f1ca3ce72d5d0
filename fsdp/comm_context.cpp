#include "fsdp/comm_context.h"

#include "core/device_runtime.h"

namespace weft::fsdp {

CommContext::~CommContext() {
  try {
    release_all();
  } catch (...) {  // a device error cannot be reported from a destructor
  }
}

CommContext::Streams& CommContext::streams(Device device) {
  std::lock_guard lock(mu_);
  auto key = std::make_pair(device.type, device.index);
  auto it = streams_.find(key);
  if (it == streams_.end()) {
    check_device(device, "fsdp");
    // New streams do not order against the default stream the model's kernels run on, or
    // nothing would overlap; every dependency is an explicit event.
    it = streams_.emplace(key, Streams{Stream::create(device), Stream::create(device)}).first;
  }
  return it->second;
}

Stream CommContext::all_gather_stream(Device device) { return streams(device).all_gather; }
Stream CommContext::reduce_scatter_stream(Device device) { return streams(device).reduce_scatter; }

std::vector<CommContext::Kept> CommContext::take_completed(bool wait) {
  std::vector<Kept> out;
  while (!kept_.empty()) {
    if (wait) kept_.front().done.synchronize();
    else if (!kept_.front().done.query()) break;
    out.push_back(std::move(kept_.front()));
    kept_.pop_front();
  }
  return out;
}

// What is dropped is dropped outside the lock: freeing tensors re-enters the allocator.
void CommContext::release_after(Event done, std::vector<Tensor> tensors, std::vector<dist::WorkPtr> works) {
  if (!done.recorded()) return;  // complete already: `tensors` and `works` go now
  std::vector<Kept> drop;
  std::lock_guard lock(mu_);
  kept_.push_back(Kept{std::move(done), std::move(tensors), std::move(works)});
  drop = take_completed(false);
}

void CommContext::release_completed() {
  std::vector<Kept> drop;
  std::lock_guard lock(mu_);
  drop = take_completed(false);
}

void CommContext::release_all() {
  std::vector<Kept> drop;
  std::lock_guard lock(mu_);
  drop = take_completed(true);
}

}  // namespace weft::fsdp
