// tp: how a module takes part in tensor parallelism over a group of P ranks, and a plan of such
// styles applied by module path (PyTorch's ColwiseParallel / RowwiseParallel /
// PrepareModuleInput / SequenceParallel and parallelize_module). A style says
//   weights: which part of its parameters this rank keeps, in place —
//     colwise     a Linear's rows rank * out/P ... (and its bias's entries): its output is this
//                 rank's columns of y;
//     rowwise     a Linear's columns rank * in/P ...: its input is this rank's columns of x, its
//                 output a partial sum (a bias is added by rank 0's, its gradient summed);
//     vocab_rows  an Embedding's rows rank * V/P ...: ids outside them look up zeros, so the
//                 output is a partial sum (Megatron's vocab-parallel embedding);
//   input, output: the collective of tp/collectives.h its first input or its output passes
//     (the sequence ones on dim 1, [batch, sequence, ...]);
//   sum_gradients: its parameters are whole on every rank but applied to this rank's part of a
//     split activation (a norm on a sequence block, Qwen3's head norms), so their gradients are
//     partial sums: while it runs they pass copy_to_parallel, and are all-reduced on their way
//     into whatever tensors the slots hold (fsdp's unsharded parameters under fully_shard; the
//     recompute of activation checkpointing, of the module itself or one above it, uses them too).
// The collectives run from forward hooks. Parameters must be materialised and equal on every rank of the
// group (checked: a hash of each) when a module is split, once, before fully_shard.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "../dist/process_group.h"
#include "../nn/module.h"

namespace weft::tp {

enum class Weights { whole, colwise, rowwise, vocab_rows };
enum class Comm {
  none,
  copy,             // copy_to_parallel
  reduce,           // reduce_from_parallel
  gather,           // gather_from_parallel on the sequence dim (a whole consumer: its gradient equal everywhere)
  scatter,          // scatter_to_parallel on the sequence dim
  gather_sequence,  // gather_sequence_parallel (split consumers: their gradients partial)
  reduce_scatter,   // reduce_scatter_parallel on the sequence dim
};

struct Style {
  Weights weights = Weights::whole;
  Comm input = Comm::none, output = Comm::none;
  bool sum_gradients = false;
  int64_t chunks = 1;  // colwise: W's rows are this many equal blocks, each split (GPT-2's fused q | k | v)
};
// A Linear standing alone: colwise takes a whole input, rowwise gives a whole output.
inline Style colwise() { return {Weights::colwise, Comm::copy}; }
inline Style rowwise() { return {Weights::rowwise, Comm::none, Comm::reduce}; }

// Gives `module` its style over `group` (`path` names it in errors). Throws, before changing anything, when the split
// dimension does not divide by the group's size, the module is not the split's kind (a Linear, an Embedding) or is on
// the meta device (outside a MetaComputeGuard). A Linear's LoRA adapter (nn/lora.h) splits with it: B's rows colwise,
// A's columns rowwise, the other whole with its gradient summed over the group.
void parallelize(nn::Module& module, const Style& style, const dist::ProcessGroupPtr& group,
                 const std::string& path = "module");

// Whether a style made `module` swap parameter slots while it runs (a rowwise bias, sum_gradients): another wrapper's
// hooks on it (fully_shard's) would put their own tensors over the swapped ones, so fully_shard refuses such a module.
bool swaps_parameters(const nn::Module& module);

// Module paths (dotted; a "*" segment matches any one name) to styles. Every entry must match at least one module, and
// no module two entries (one registered twice matches at either path, and is split once); all are checked first.
using ParallelPlan = std::vector<std::pair<std::string, Style>>;
void parallelize_module(nn::Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan);

}  // namespace weft::tp
