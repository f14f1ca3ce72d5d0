// tp: how a Linear is split over a tensor-parallel group, and a plan of such splits applied by
// module path (PyTorch's ColwiseParallel / RowwiseParallel / PrepareModuleInput and
// parallelize_module). A split layer keeps this rank's part of its parameters, in place, and its
// calls pass the collectives of tp/collectives.h through forward hooks:
//   colwise         W [out, in] keeps rows (and the bias's entries) rank * out/P ... ; the input
//                   passes copy_to_parallel; the output is this rank's columns of y.
//   colwise_shared  the same rows, the input taken as it comes: a shared_input module around
//                   the layer passed it through copy_to_parallel once for every such layer
//                   (q, k and v: one all-reduce of the input's gradient, not three).
//   rowwise         W keeps columns rank * in/P ... ; the input is this rank's columns of x (a
//                   colwise layer's output); the output, a partial sum, passes reduce_from_parallel.
//   shared_input    any module: its first input passes copy_to_parallel.
//   shared_output   any module: its output passes copy_to_parallel (the input of a head whose
//                   weight is split by vocabulary rows, tied or colwise_shared).
//   vocab_rows      an nn::Embedding: keeps rows rank * V/P ...; ids outside them look up zeros,
//                   and the output passes reduce_from_parallel (Megatron's vocab-parallel
//                   embedding).
// Megatron's pairing: colwise then rowwise, one all-reduce per pair in forward and one in
// backward. Parameters must be materialised and equal on every rank of the group (the same
// seed or the same checkpoint) when a layer is split: each rank keeps its slice of them.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "dist/process_group.h"
#include "nn/layers.h"

namespace weft::tp {

enum class Split { colwise, colwise_shared, rowwise, shared_input, shared_output, vocab_rows };

// Splits `linear` over `group` (`path` names it in errors). Throws, before changing anything,
// when the split dimension does not divide by the group's size, the layer is on the meta
// device, carries a low-rank adapter, or is rowwise with a bias; the other splits are for
// parallelize_module.
void parallelize_linear(nn::Linear& linear, Split split, const dist::ProcessGroupPtr& group,
                        const std::string& path = "Linear");

// Module paths (dotted; a "*" segment matches any one name) to splits. Every entry must match
// at least one module; each match must be an nn::Linear (an nn::Embedding for vocab_rows, any
// module for shared_input and shared_output).
using ParallelPlan = std::vector<std::pair<std::string, Split>>;
void parallelize_module(nn::Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan);

}  // namespace weft::tp
