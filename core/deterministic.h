// core: deterministic mode, a process-wide switch (as torch.use_deterministic_algorithms). With it on, every sum over a
// batch adds its terms in one fixed order whatever the number of ranks, so a run gives the same bits at any world size:
// fsdp reduces each parameter group's gradients along a fixed tree (nn/tree_sum.h) instead of the collective's own
// order, and nn::clip_grad_norm_ sums the squares row by row in the parameters' order instead of per shard. The CPU
// kernels give the same bits at any thread count whether it is on or not. Every rank must set the same value before
// training (a rank that differs fails in its next gradient reduction, named by the collective check).
#pragma once

namespace weft {

void set_deterministic(bool on);
bool deterministic();

}  // namespace weft
