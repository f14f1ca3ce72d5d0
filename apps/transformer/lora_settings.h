// apps/transformer: a run's LoRA settings (--lora-rank, --lora-alpha, --lora-dropout,
// --lora-targets; nn/lora.h): the modules each family adapts by default, how a checkpoint
// records the settings, and adding the adapters to a model built to train or to be loaded.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "apps/transformer/model.h"

namespace weft::apps {

// --lora-targets: a comma-separated list of module names; "" gives every Linear of the blocks
// (Llama's families: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; GPT-2:
// c_attn, c_proj, c_fc). Each must name modules of this model (checked when applied).
std::vector<std::string> lora_targets(const std::string& list, const ModelConfig& cfg);

// What a checkpoint's description holds (nothing without adapters: rank 0), and the settings it
// records ("rank 0" when none), a bad value an error naming `where` and the field.
std::map<std::string, std::string> lora_fields(const nn::LoRAOptions& o);
nn::LoRAOptions lora_of(const std::map<std::string, std::string>& recorded, const std::string& where);

// Adds the adapters (rank > 0) to a model from make_model (their init rules drawn from the
// default generator) or, with `to_load`, from make_model_to_load, whose values are loaded next
// (no rules: the meta model can then be converted to another dtype).
void add_lora(const LanguageModel& lm, const nn::LoRAOptions& o, bool to_load);

}  // namespace weft::apps
