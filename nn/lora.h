// nn: LoRA, low-rank adapters on Linear layers as Hugging Face peft makes them:
//   y = x W^T + b + lora_B((alpha / r) * lora_A(lora_dropout(x)))  (the scale on the rank-r side)
// lora_A (r x in) is Kaiming-uniform like any Linear's weight, lora_B (out x r) zero, so an adapted model computes what
// its base does until B moves. The adapters are children of the Linear they adapt ("...q_proj.lora_A.weight", the names
// peft saves), and its forward adds their term in one node with its own product (Linear::low_rank, autograd
// low_rank_linear). apply_lora freezes every other parameter (requires_grad false): autograd computes no gradient for
// it, and fsdp neither packs nor reduce-scatters one.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "../core/generator.h"
#include "module.h"

namespace weft::nn {

struct LoRAOptions {
  int64_t rank = 8;
  double alpha = 8;  // the adapter's term is scaled by alpha / rank
  double dropout = 0;
  // Modules to adapt, matched as peft matches them: a module whose dotted name is a target or
  // ends in "." + target ("q_proj" adapts every layer's q_proj).
  std::vector<std::string> targets;
  double scale() const { return alpha / double(rank); }
};

// rank >= 1, a finite alpha > 0 and dropout in [0, 1); else an error naming `where` and the field
// (with peft's name for it, as adapter_config.json spells it).
void check_lora_values(const LoRAOptions& o, const std::string& where);

// Adds adapters to every Linear the targets name and freezes every other parameter. Adapters take the dtype and device
// of the weight they adapt; on a meta (deferred) model they are meta too, with their init rules recorded. Returns the
// adapted modules' dotted names. Errors, each naming what is wrong: a rank below 1, alpha or dropout out of range, no
// targets, a target that matches no module or a module that is not a Linear, a module adapted already, a model
// fully_shard was applied to already (apply LoRA first, as peft is applied before FSDP2).
std::vector<std::string> apply_lora(Module& model, const LoRAOptions& opts, Generator* gen = nullptr);

// Whether a dotted parameter name is an adapter's ("...lora_A.weight" or "...lora_B.weight").
bool is_lora_parameter(std::string_view name);

// Casts every parameter that requires no gradient (the base apply_lora froze) to `dtype`, each tensor once (tied slots
// keep sharing it): the base kept in bf16 while the adapters train in f32. On a meta model the casts are meta.
void cast_frozen(Module& model, DType dtype);

// A full state dict with each adapter merged into the weight it adapts (W + scale * B A, in W's
// dtype) and the adapters' entries left out: the plain model's state, for export.
NamedTensorList merge_lora(const NamedTensorList& state, const LoRAOptions& opts);

}  // namespace weft::nn
