// apps/transformer: LoRA adapters as Hugging Face peft saves them, a directory of
// adapter_config.json and adapter_model.safetensors whose tensors are named
// "base_model.model." + the adapted model's own names ("...q_proj.lora_A.weight"): written from
// a weft LoRA run (export-peft), read to start one (train --init-from an adapter directory).
#pragma once
#include <string>

#include "apps/transformer/model.h"
#include "fsdp/fsdp.h"

namespace weft::apps {

struct PeftAdapter {
  std::string dir;
  std::string base;  // base_model_name_or_path: absolute as written, a relative one from the adapter's directory
  nn::LoRAOptions lora;
};

// Whether `dir` holds an adapter_config.json.
bool is_peft_dir(const std::string& dir);

// Reads adapter_config.json: peft_type LORA, r, lora_alpha, lora_dropout and target_modules (a list; "all-linear",
// every linear layer of the blocks, leaves the targets empty for lora_targets("", config) to fill). What weft cannot
// reproduce is an error naming the file and the field: DoRA, rsLoRA, trained biases, modules_to_save, per-module ranks
// or alphas, layers_to_transform, a regular expression as target_modules; so is a base_model_name_or_path that is not a
// Hugging Face model directory here.
PeftAdapter read_peft_adapter(const std::string& dir);

// Loads the adapter's tensors into `model`'s adapters (added with read_peft_adapter's settings),
// this rank's shards only when `root` shards it; the other parameters are left as they are.
void load_peft_weights(const PeftAdapter& adapter, const LanguageModel& model, const fsdp::FSDPModule* root);

// Writes `model`'s adapters (whole, on one process; f32) as a new peft directory `out` whose
// base_model_name_or_path is `base` (null when empty).
void export_peft_adapter(const LanguageModel& model, const nn::LoRAOptions& lora, const std::string& out,
                         const std::string& base);

}  // namespace weft::apps
