#include "autograd/kept_outputs.h"

#include "core/error.h"

namespace weft::autograd {
namespace {
thread_local KeptOutputs* current = nullptr;
}  // namespace

TensorList KeptOutputs::run(const char* op, const std::function<TensorList()>& compute) {
  if (mode_ == Mode::record) {
    TensorList out = compute();
    outputs_.emplace_back(op, out);
    return out;
  }
  WEFT_CHECK(next_ < outputs_.size(), "selective activation checkpointing: the recompute ran {} after the {} ops the "
             "first forward kept: a checkpointed function must run the same ops each time", op, outputs_.size());
  auto& [name, kept] = outputs_[next_++];
  WEFT_CHECK(name == op, "selective activation checkpointing: the recompute ran {} where the first forward ran {} "
             "(kept op {}): a checkpointed function must run the same ops each time", op, name, next_);
  TensorList out;
  for (const Tensor& t : kept) out.push_back(t.defined() ? t.detach() : t);  // new handles: the graph's own
  return out;
}

void KeptOutputs::finish_replay() {
  const size_t kept = outputs_.size(), taken = next_;
  outputs_.clear();
  next_ = 0;
  WEFT_CHECK(taken == kept, "selective activation checkpointing: the recompute ran {} of the {} ops the first "
             "forward kept: a checkpointed function must run the same ops each time", taken, kept);
}

KeptOutputsGuard::KeptOutputsGuard(KeptOutputs& kept, KeptOutputs::Mode mode) : previous_(current) {
  kept.mode_ = mode;
  kept.next_ = 0;
  current = &kept;
}

KeptOutputsGuard::~KeptOutputsGuard() { current = previous_; }

TensorList kept_op(const char* op, const std::function<TensorList()>& compute) {
  return current ? current->run(op, compute) : compute();
}

}  // namespace weft::autograd
