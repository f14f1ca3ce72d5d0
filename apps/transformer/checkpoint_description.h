// apps/transformer: what a weft-transformer checkpoint's description (its training progress's `app` fields) says of the
// model: in the checkpoint directories of fsdp::save_checkpoint (every rank writes its own shards; docs/CHECKPOINTS.md)
// and in single consolidated files (weft-checkpoint consolidate). Resuming, sampling and exporting read them back.
#pragma once
#include <map>
#include <string>

#include "apps/transformer/model.h"

namespace weft::apps::transformer {

inline constexpr const char* kCheckpointFormat = "weft-transformer";

// The model's fields, normalised (0: the default, resolved), as a checkpoint's description holds
// them and as resuming compares them.
std::map<std::string, std::string> model_fields(const apps::ModelConfig& cfg);

// The model config in a checkpoint's (or a consolidated file's) description.
apps::ModelConfig config_of(const std::map<std::string, std::string>& app, const std::string& where);

// nanoGPT's and Hugging Face's state dicts have lm_head.weight even when it is tied to the
// embedding: consolidated files repeat it, and loading one checks that it equals the embedding.
std::map<std::string, std::string> head_alias(const apps::ModelConfig& cfg);

// A LoRA checkpoint that holds only its adapters names its base (hf_source) and the base's weights' digest: `base`, if
// given, must be that directory's weights unchanged (`digest`: theirs, if known); empty: the recorded one.
std::string lora_base(const std::map<std::string, std::string>& app, const std::string& where, std::string base = "",
                      const std::string& known = "");

}  // namespace weft::apps::transformer
