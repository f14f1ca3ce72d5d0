// autograd: selective activation checkpointing's kept outputs (the op-level policy of PyTorch's selective checkpoint
// contexts). nn::checkpoint with the selective policy runs its first forward recording: each op the policy keeps (the
// GEMMs of linear and matmul, and attention) appends its outputs to a KeptOutputs; the recompute in backward then
// replays: the same ops, in the same order, take those outputs back instead of computing them, and record their
// backward nodes as usual. Element-wise ops, norms, rotary embeddings and the rest run again. Outside a guard the kept
// ops just compute.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "node.h"

namespace weft::autograd {

class KeptOutputs {
 public:
  enum class Mode { record, replay };
  // The outputs of kept op `op`: compute() (appended when recording), or, replaying, the next
  // recorded ones (a different op there, or none left, is an error naming both).
  TensorList run(const char* op, const std::function<TensorList()>& compute);
  // Replaying: every recorded output was taken back (else an error); then all are released.
  void finish_replay();

 private:
  friend class KeptOutputsGuard;
  std::vector<std::pair<std::string, TensorList>> outputs_;
  size_t next_ = 0;
  Mode mode_ = Mode::record;
};

// While alive, the kept ops of this thread go through `kept` in `mode` (the previous guard's
// cache, if any, is restored after).
class KeptOutputsGuard {
 public:
  KeptOutputsGuard(KeptOutputs& kept, KeptOutputs::Mode mode);
  ~KeptOutputsGuard();
  KeptOutputsGuard(const KeptOutputsGuard&) = delete;
  KeptOutputsGuard& operator=(const KeptOutputsGuard&) = delete;

 private:
  KeptOutputs* previous_;
};

// A kept op's outputs: through this thread's KeptOutputs when a guard is alive, else compute().
TensorList kept_op(const char* op, const std::function<TensorList()>& compute);

}  // namespace weft::autograd
