// apps/transformer: the commands of weft-transformer, each given its flags as options (main.cpp parses them): train
// (train_command.cpp), and sample, eval, export-hf and export-peft, which read a trained model (model_commands.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "apps/common/plan.h"
#include "apps/common/ranks.h"
#include "apps/transformer/model.h"
#include "apps/transformer/text_data.h"
#include "dist/config_check.h"
#include "nn/activation_checkpoint.h"
#include "nn/lora.h"

namespace weft::apps::transformer {

struct TrainOptions {
  apps::ModelConfig model;
  bool untie = false;
  bool tie = false;  // --tie (llama)
  std::string init_from;  // a Hugging Face directory whose config and weights start the run
  bool shape_given = false, ctx_given = false;  // given as flags
  std::string source;  // model_from_checkpoint(): the hf_source its checkpoint records
  int64_t batch_size = 16, steps = 200, grad_accum = 1, warmup = -1;  // warmup -1: 10, at most steps - 1
  double lr = 3e-4, weight_decay = 0.1, clip = 1.0;
  std::string lr_schedule = "cosine";  // after the warmup: cosine, linear, constant or wsd
  double min_lr = -1;                  // where the decay ends (-1: 0.1 x lr)
  int64_t decay_steps = 0;             // wsd: the final decay's steps (0: a fifth of --steps)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  uint64_t seed = 0;
  int threads = 0;
  std::string metrics, data = apps::kDefaultTextDir, checkpoint_dir, resume;
  int64_t checkpoint_every = 0, eval_every = 100, eval_iters = 10, log_every = 10;
  int64_t stop_after = 0;  // 0: run to --steps
  int64_t profile = 0;     // > 0: the op profile from this step on
  int keep_last = 0;
  bool overwrite_checkpoints = false;
  bool fsdp = false;
  int tp = 1;  // ranks per tensor-parallel group (tensor_parallel.h)
  nn::Checkpointing checkpointing = nn::Checkpointing::none;  // --ac (--activation-checkpointing: full)
  std::string ac;  // "": not given (none)
  bool ac_full = false;
  bool ac_given() const { return ac_full || !ac.empty(); }  // a memory budget then keeps it
  bool deterministic = false;
  bool pack = false;  // a dataset of examples: several per row (example_data.h)
  int64_t virtual_batches = 8;  // --deterministic's V
  std::string reshard_after_forward, mixed_precision = "none";  // reshard_after_forward "": true
  bool reshard_given = false;  // --reshard-after-forward: a memory budget keeps it
  bool autocast() const { return mixed_precision == "bf16" && !fsdp; }  // else FSDP's policy, if any
  std::string sharding_strategy = "FULL_SHARD";
  std::string device = "cpu";
  std::string on_nan = "error";
  int64_t max_skipped = 5;  // --on-nan skip: give up after this many skipped steps in a row
  apps::PlanFlags plan;
  nn::LoRAOptions lora{.rank = 0, .alpha = 0};  // rank 0: no adapters; alpha 0: the rank
  std::string lora_targets;                     // "": every Linear of the blocks
  std::string base_dtype = "f32";               // LoRA: the frozen base's dtype
  std::string base_digest;  // LoRA from --init-from: its weights' digest; checkpoints hold the adapters only
  bool base_elsewhere() const { return !base_digest.empty(); }
  // --resume without --init-from or a shape flag: the model is the one the checkpoint describes
  bool model_from_checkpoint() const { return !resume.empty() && init_from.empty() && !shape_given; }
};

struct SampleOptions {
  std::string checkpoint, prompt = "\n";
  std::string prompt_id_list;       // --prompt-ids as given
  std::vector<int64_t> prompt_ids;  // the prompt as token ids (instead of --prompt)
  int64_t tokens = 200, top_k = 0;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "cpu";
  bool greedy = false;     // --temperature 0
  bool temperature_set = false, top_k_set = false, top_p_set = false, repetition_penalty_set = false;  // as flags
  bool ids = false;         // print the generated token ids, comma-separated, on one line
  bool no_cache = false;    // run the whole window again for every token
  bool fsdp = false;        // shard the model over mpirun's ranks; rank 0 prints
  bool no_special = false;  // encode the prompt without the tokenizer's special tokens (BOS)
  std::string eos;          // stop after this token (an id, or a token of --tokenizer); empty: never
  std::string logits_out;   // write the prompt's logits [T, vocab] (f32) to this safetensors file
  std::string tokenizer;    // a tokenizer.json: the prompt is encoded and the output decoded with it
  std::string dtype = "f32";  // the weights' (and so the computation's) dtype: f32 or bf16
};

struct ExportOptions {
  bool merge = false;  // fold LoRA adapters into their weights
  std::string from, out;
  std::string max_shard_size = "5G";
  std::string dtype = "f32";
};

struct EvalOptions {
  std::string from, data = apps::kDefaultTextDir, split = "val";
  int64_t ctx = 0, batch_size = 8;  // ctx 0: the model's context
  int threads = 0;
};

struct PrepareOptions {
  std::string tokenizer, data = apps::kDefaultTextDir, out, eos = "<|endoftext|>", chat_format;
  bool no_special = false;  // no post-processor tokens (BOS) around each file
};

// The flags that change the model, the math, the data stream or the collective sequence: under
// mpirun every rank must get the same ones (not --threads, --metrics or --device, which are the
// rank's own). The checkpoint directory counts by presence only.
dist::ConfigSettings shared_settings(const TrainOptions& o);

int train(TrainOptions o, const Ranks& ranks);
int sample(const SampleOptions& o, const Ranks& ranks);
int eval(const EvalOptions& o);
int export_hf(const ExportOptions& o);
int export_peft(const ExportOptions& o);  // a LoRA run's adapters for peft

}  // namespace weft::apps::transformer
