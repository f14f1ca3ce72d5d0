// nn: activation checkpointing. A checkpointed computation keeps only its inputs for backward and runs its forward
// again, with gradients, when the backward reaches it (PyTorch's torch.utils.checkpoint): its intermediate activations
// are never held through the rest of the forward. The default generator's state is restored for the recompute, so
// dropout draws the same masks. Selective checkpointing keeps the outputs of GEMMs and attention as well
// (autograd/kept_outputs.h): the recompute takes them back and runs only the element-wise ops, norms and the like
// again: about a third of full checkpointing's saving on a transformer block for none of its GEMMs.
//
//   Tensor y = nn::checkpoint([&](const TensorList& x) { return TensorList{(*block)(x[0])}; }, {h})[0];
//   block->set_activation_checkpointing(true);   // the same for every call of block
//   block->set_checkpointing(nn::Checkpointing::selective);
//
// Composes with fsdp::fully_shard: a sharded module that is checkpointed runs its FSDP hooks
// once in forward, and its pre-backward hook gathers the parameters again before the recompute
// (shard the blocks after turning checkpointing on or before: the order does not matter). A module's hooks run once,
// outside its checkpointed forward: the recompute runs with the parameters its pre-hooks had set (tp's views).
#pragma once
#include <functional>
#include <string>

#include "../autograd/node.h"

namespace weft::nn {

using autograd::TensorList;

using CheckpointFn = std::function<TensorList(const TensorList&)>;

enum class Checkpointing { none, selective, full };
// "none", "selective", "full"; anything else throws naming `what` (a flag) and the choices.
Checkpointing parse_checkpointing(const std::string& name, const std::string& what);
const char* checkpointing_name(Checkpointing c);

// Runs fn(inputs) without recording a graph and returns its outputs, which require grad when any input or parameter
// does; their backward recomputes fn with the saved inputs and the generator state of this call, and backpropagates
// through the recomputation. Outside grad mode it is fn(inputs). `selective`: the GEMMs' and attention's outputs are
// kept too, and not recomputed. `reads`: the tensors fn reads besides its inputs (a module's parameters): the recompute
// refuses to run when one was written in place since the first run (an optimizer step between forward and backward).
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, bool selective = false,
                      const TensorList& reads = {});

}  // namespace weft::nn
