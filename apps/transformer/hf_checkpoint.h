// apps/transformer: Hugging Face checkpoints in and out, for the model_types of
// apps/transformer/hf_family.h (gpt2, llama, mistral, qwen2, qwen3). A directory holds config.json and
// model.safetensors, or the shards model-0000i-of-0000n.safetensors with model.safetensors.index.json.
//
// weft's parameter names are Hugging Face's (nanoGPT's for GPT-2, LlamaForCausalLM's for Llama), so the mapping is a
// table of differences per model_type (hf_family.cpp): GPT-2's Conv1D weights stored transposed, the "transformer."
// prefix that the original GPT-2 files omit, buffers weft does not keep, and the head tied to the token embedding. RoPE
// follows Hugging Face's rotate-half convention on both sides, so q_proj and k_proj need no permutation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "apps/transformer/model.h"
#include "fsdp/fsdp.h"

namespace weft::apps {

// A rope scaling as config.json's rope_scaling holds it, as JSON text ("null" for none), and back
// (an error naming `where` and the field for anything else).
std::string rope_scaling_text(const kernels::RopeScaling& s);
kernels::RopeScaling parse_rope_scaling(const std::string& text, const std::string& where);

// What the generation_config.json in a Hugging Face directory says about generating: its eos_token_id (one id or a
// list) and its sampling defaults, transformers' own where a field is absent (do_sample false: greedy).
struct HfGenerationConfig {
  bool found = false;  // a file was read
  std::string file;    // generation_config.json, or config.json where there is none (as transformers reads it)
  std::vector<int64_t> eos;
  bool do_sample = false;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  int64_t top_k = 50;
  std::vector<std::string> ignored;  // fields set away from their neutral value that weft does not apply, with it
};
// Reads `dir`/generation_config.json, or without one the generation fields of `dir`/config.json (its eos_token_id;
// greedy unless it says do_sample), as transformers' generate does (found false when neither exists); an error naming
// the file and the field for a value of the wrong kind (eos ids that are not integers, a negative
// temperature or top_k, top_p outside (0, 1]).
HfGenerationConfig read_hf_generation_config(const std::string& dir);

// Whether `path` is a directory with a config.json.
bool is_hf_dir(const std::string& path);
// Throws when `dir` ships SentencePiece's tokenizer.model without the tokenizer.json weft reads: `what` (a prompt, a
// text) would be read as bytes, ids the model was not made for.
void check_tokenizer_readable(const std::string& dir, const std::string& what);

// The model config.json describes; a field weft cannot represent (another model_type or activation, a rope type other
// than default, linear, dynamic and llama3, biases in Llama, ...) is an error naming the field and its value.
ModelConfig read_hf_config(const std::string& dir);

// The identity of `dir`'s weights: the sha256 of each weight file's name and sha256, in name
// order (a LoRA run's checkpoints record its base's, and loading them checks it).
std::string hf_weights_digest(const std::string& dir);

// Loads the weights of `dir` into `model` (built from read_hf_config(dir)), this rank's shards
// only when `root` shards it (each rank reads only their byte ranges).
void load_hf_checkpoint(const std::string& dir, const LanguageModel& model, const fsdp::FSDPModule* root);
// What that load holds at once beside the model on `device` (fsdp::external_load_bytes), for the memory plan.
int64_t hf_load_bytes(const std::string& dir, const LanguageModel& model, const fsdp::FSDPModule* root, Device device);

// Writes `model` (whole, on one process) as a Hugging Face directory: config.json and model.safetensors, or shards of
// at most `max_shard_bytes` each with the index when the weights are larger, in `dtype` (f32 or bf16, config.json's
// torch_dtype). The files of kHfSideFiles in `source` (the Hugging Face directory the model came from; none: "") are
// copied beside them, with its config's token ids, unless `source_tokens` is false (the model was trained on other
// tokens: they would decode wrong). The directory is written next to `out` and renamed into place.
void export_hf_checkpoint(const LanguageModel& model, const std::string& out, int64_t max_shard_bytes,
                          DType dtype = kFloat32, const std::string& source = "", bool source_tokens = true);
// Writes a new directory `out` (an existing one is an error naming `command`): `write` fills a
// directory beside it (.NAME.tmp-PID; leftovers of dead processes are removed), which is then
// renamed into place; on any failure it is removed and the error says nothing was written.
void write_new_directory(const std::string& out, const char* command,
                         const std::function<void(const std::filesystem::path&)>& write);
inline constexpr const char* kHfSideFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                "generation_config.json", "special_tokens_map.json",
                                                "chat_template.jinja", "chat_template.json"};

}  // namespace weft::apps
