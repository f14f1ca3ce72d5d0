// weft-transformer: byte-level decoders of two families (GPT-2 and Llama, --arch) trained on any
// text (default: Debian's fortunes), in one process or, with --fsdp, sharded over the ranks
// mpirun starts (one FSDP group per block, then the root), from scratch or from a Hugging Face
// checkpoint (--init-from); sampling text from a checkpoint; and exporting one to Hugging Face.
//   weft-transformer train --steps 200 --checkpoint-dir ck
//   mpirun -np 2 --oversubscribe --bind-to none weft-transformer train --fsdp --threads 1
//   weft-transformer sample --from ck --prompt "Q: " --tokens 200
//   weft-transformer export-hf --from ck --out hf
//   weft-transformer prepare --tokenizer tokenizer.json --data texts/ --out tokens/
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "apps/common/checkpoint_owner.h"
#include "apps/common/cli.h"
#include "apps/common/deterministic.h"
#include "apps/common/device.h"
#include "apps/common/metrics.h"
#include "apps/common/nonfinite.h"
#include "apps/common/output_paths.h"
#include "apps/common/plan.h"
#include "apps/common/ranks.h"
#include "apps/common/resume.h"
#include "apps/common/trainer.h"
#include "apps/transformer/block_eval.h"
#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/lora_settings.h"
#include "apps/transformer/peft_adapter.h"
#include "apps/transformer/tensor_parallel.h"
#include "apps/transformer/model.h"
#include "apps/transformer/text_data.h"
#include "apps/transformer/token_data.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "dist/config_check.h"
#include "fsdp/fsdp.h"
#include "core/step_trace.h"
#include "core/trace.h"
#include "weft.h"

using namespace weft;

namespace {

constexpr uint64_t kValSeedOffset = 0x5eed0000ull;  // val batches: a stream apart from training's

struct TrainOptions {
  apps::ModelConfig model;
  bool untie = false;
  bool tie = false;  // --tie (llama)
  std::string init_from;  // a Hugging Face directory whose config and weights start the run
  int64_t batch_size = 16, steps = 200, grad_accum = 1, warmup = 10;
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
  std::string ac = "none";
  bool ac_full = false;
  bool deterministic = false;
  bool pack = false;  // a dataset of examples: several per row (example_data.h)
  int64_t virtual_batches = 8;  // --deterministic's V
  std::string reshard_after_forward = "true", mixed_precision = "none";
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
};

struct SampleOptions {
  std::string checkpoint, prompt = "\n";
  int64_t tokens = 200, top_k = 0;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "cpu";
  bool greedy = false;     // --temperature 0
  bool temperature_set = false, top_k_set = false, top_p_set = false;  // given as flags
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

using apps::Ranks;
using apps::mean_over_ranks;

// The flags that change the model, the math, the data stream or the collective sequence: under
// mpirun every rank must get the same ones (not --threads, --metrics or --device, which are the
// rank's own). The checkpoint directory counts by presence only.
dist::ConfigSettings shared_settings(const TrainOptions& o) {
  auto num = [](auto v) { return fmt::format("{}", v); };
  return {{"--arch", o.model.arch},
          {"--n-kv-head", num(o.model.n_kv_head)},
          {"--ffn-dim", num(o.model.ffn_dim)},
          {"--rope-theta", num(o.model.rope_theta)},
          {"--init-from", o.init_from},
          {"--n-layer", num(o.model.n_layer)},
          {"--n-head", num(o.model.n_head)},
          {"--d-model", num(o.model.d_model)},
          {"--ctx", num(o.model.ctx)},
          {"--dropout", num(o.model.dropout)},
          {"--untie", o.untie ? "true" : "false"},
          {"--batch-size", num(o.batch_size)},
          {"--grad-accum", num(o.grad_accum)},
          {"--deterministic", o.deterministic ? num(o.virtual_batches) : "off"},
          {"--pack", o.pack ? "true" : "false"},
          {"--base-dtype", o.base_dtype},
          {"--steps", num(o.steps)},
          {"--lr", num(o.lr)},
          {"--warmup", num(o.warmup)},
          {"--weight-decay", num(o.weight_decay)},
          {"--lr-schedule", o.lr_schedule},
          {"--min-lr", num(o.min_lr)},
          {"--decay-steps", num(o.decay_steps)},
          {"--beta1", num(o.beta1)},
          {"--beta2", num(o.beta2)},
          {"--eps", num(o.eps)},
          {"--clip", num(o.clip)},
          {"--seed", num(o.seed)},
          {"--data", o.data},
          {"--eval-every", num(o.eval_every)},
          {"--eval-iters", num(o.eval_iters)},
          {"--log-every", num(o.log_every)},
          {"--stop-after", num(o.stop_after)},
          {"--checkpoint-dir", o.checkpoint_dir.empty() ? "(none)" : "(given)"},
          {"--checkpoint-every", num(o.checkpoint_every)},
          {"--keep-last", num(o.keep_last)},
          {"--resume", o.resume},
          {"--fsdp", o.fsdp ? "true" : "false"},
          {"--tp", num(o.tp)},
          {"--ac", nn::checkpointing_name(o.checkpointing)},
          {"--reshard-after-forward", o.reshard_after_forward},
          {"--mixed-precision", o.mixed_precision},
          {"--on-nan", o.on_nan},
          {"--max-skipped-steps", num(o.max_skipped)},
          {"--plan", o.plan.wanted() ? "true" : "false"},
          {"--memory-budget", o.plan.budget},
          {"--lora-rank", num(o.lora.rank)},
          {"--lora-alpha", num(o.lora.alpha)},
          {"--lora-dropout", num(o.lora.dropout)},
          {"--lora-targets", o.lora_targets}};
}

// ---- checkpoints: fsdp::save_checkpoint directories (every rank writes its own shards; see
// docs/CHECKPOINTS.md) described by the model config, and single consolidated files
// (weft-checkpoint consolidate) for sampling.

constexpr const char* kFormat = "weft-transformer";

// The training text's length and sha256 (computed once per run): a resumed run must draw its
// batches from the same text.
std::map<std::string, std::string> training_text(const apps::TrainingData& data) {
  const std::string digest = sha256_hex(data.train.p, size_t(data.train.n * data.train.width));
  if (data.tokenizer_sha256.empty()) return {{"train_bytes", std::to_string(data.train.size())}, {"train_sha256", digest}};
  std::map<std::string, std::string> d = {{"train_tokens", std::to_string(data.train.size())},
                                          {"train_sha256", digest}, {"tokenizer_sha256", data.tokenizer_sha256}};
  const apps::TokenView& l = data.train_labels;
  if (data.examples()) d["train_labels_sha256"] = sha256_hex(l.p, size_t(l.n * l.width));
  return d;
}

// The model's fields, normalised (0: the default, resolved), as a checkpoint's description holds
// them and as resuming compares them.
std::map<std::string, std::string> model_fields(const apps::ModelConfig& cfg) {
  const nn::LlamaConfig lc = apps::llama_config(cfg);
  return {{"arch", cfg.arch}, {"n_layer", std::to_string(cfg.n_layer)}, {"n_head", std::to_string(cfg.n_head)},
          {"n_kv_head", std::to_string(lc.kv_heads())}, {"d_model", std::to_string(cfg.d_model)},
          {"ffn_dim", std::to_string(cfg.arch == "llama" ? lc.ffn() : cfg.ffn_dim)},
          {"head_dim", std::to_string(lc.head_size())}, {"ctx", std::to_string(cfg.ctx)},
          {"vocab_size", std::to_string(cfg.vocab_size)}, {"tied", cfg.tie_weights ? "1" : "0"},
          {"rope_theta", fmt::format("{}", cfg.rope_theta)}, {"norm_eps", fmt::format("{}", cfg.norm_eps)},
          {"rope_scaling", apps::rope_scaling_text(cfg.rope_scaling)}, {"qkv_bias", cfg.qkv_bias ? "1" : "0"},
          {"qk_norm", cfg.qk_norm ? "1" : "0"},
          {"sliding_window", std::to_string(cfg.sliding_window)}, {"family", cfg.family}};
}

// The model config, what decides the batches (seed, batch size, accumulation, the training
// text) and the weight decay (restored with the optimizer state): resuming checks these.
std::map<std::string, std::string> describe(const apps::ModelConfig& cfg, const TrainOptions& o,
                                            const std::map<std::string, std::string>& train_text) {
  std::map<std::string, std::string> d = model_fields(cfg);
  d.insert({{"format", kFormat}, {"seed", std::to_string(o.seed)}, {"batch_size", std::to_string(o.batch_size)},
            {"grad_accum", std::to_string(o.grad_accum)}, {"weight_decay", fmt::format("{}", o.weight_decay)},
            {"beta1", fmt::format("{}", o.beta1)}, {"beta2", fmt::format("{}", o.beta2)}, {"eps", fmt::format("{}", o.eps)},
            {"virtual_batches", o.deterministic ? std::to_string(o.virtual_batches) : "0"}});
  d.insert(train_text.begin(), train_text.end());
  for (auto& [k, v] : apps::lora_fields(o.lora)) d[k] = v;
  if (o.base_elsewhere()) d["lora_base_sha256"] = o.base_digest;
  if (o.pack) d["pack"] = "1";
  if (o.base_dtype != "f32") d["base_dtype"] = o.base_dtype;
  if (!o.init_from.empty()) d["hf_source"] = std::filesystem::absolute(o.init_from).string();  // export-hf's side files
  return d;
}

// The model config in a checkpoint's (or a consolidated file's) description.
apps::ModelConfig config_of(const std::map<std::string, std::string>& app, const std::string& where) {
  auto get = [&](const std::string& k) {
    auto it = app.find(k);
    WEFT_CHECK(it != app.end(), "transformer: {} is not a weft-transformer checkpoint (no \"{}\" in its description)",
               where, k);
    return it->second;
  };
  WEFT_CHECK(get("format") == kFormat, "transformer: {} was written by \"{}\", not weft-transformer", where,
             get("format"));
  apps::ModelConfig cfg;
  auto what = [&](const std::string& k) { return fmt::format("transformer: {}: model field \"{}\"", where, k); };
  auto field = [&](const std::string& k, int64_t lo, int64_t hi) {
    return apps::cli::parse_integer_field(get(k), lo, hi, what(k));
  };
  cfg.n_layer = field("n_layer", 1, apps::kMaxLayers);
  cfg.n_head = field("n_head", 1, apps::kMaxHeads);
  cfg.d_model = field("d_model", 1, apps::kMaxDModel);
  cfg.ctx = field("ctx", 1, apps::kMaxCtx);
  cfg.vocab_size = field("vocab_size", 1, apps::kMaxVocab);
  cfg.tie_weights = get("tied") == "1";
  // Written since the Llama family came; older checkpoints are GPT-2's.
  if (app.count("arch")) {
    cfg.arch = get("arch");
    cfg.n_kv_head = field("n_kv_head", 0, apps::kMaxHeads);
    cfg.ffn_dim = field("ffn_dim", 0, 16 * apps::kMaxDModel);
    cfg.head_dim = field("head_dim", 0, apps::kMaxDModel);
    cfg.rope_theta = apps::cli::parse_positive_field(get("rope_theta"), what("rope_theta"));
    cfg.norm_eps = apps::cli::parse_positive_field(get("norm_eps"), what("norm_eps"));
  }
  if (app.count("rope_scaling")) cfg.rope_scaling = apps::parse_rope_scaling(get("rope_scaling"), what("rope_scaling"));
  if (app.count("family")) {  // written since the Mistral and Qwen2 families came
    cfg.family = get("family");
    cfg.qkv_bias = get("qkv_bias") == "1";
    cfg.qk_norm = get("qk_norm") == "1";
    cfg.sliding_window = field("sliding_window", 0, apps::kMaxCtx);
  }
  apps::check_config(cfg);
  return cfg;
}

// nanoGPT's and Hugging Face's state dicts have lm_head.weight even when it is tied to the
// embedding: consolidated files repeat it, and loading one checks that it equals the embedding.
std::map<std::string, std::string> head_alias(const apps::ModelConfig& cfg) {
  if (!cfg.tie_weights) return {};
  return {{apps::kHeadName, apps::embedding_name(cfg)}};
}

// ---- FSDP: one group per block, then the root (embeddings, ln_f, head).

// A block's LoRA adapters (lora_A and lora_B of each adapted layer).
std::vector<nn::ModulePtr> lora_modules(nn::Module& block) {
  std::vector<nn::ModulePtr> out;
  for (auto& [name, m] : block.named_modules())
    if (name.ends_with("lora_A") || name.ends_with("lora_B")) out.push_back(m);
  return out;
}

// --reshard-after-forward applies to the blocks; the root keeps FSDP2's default (its
// parameters are needed again at once by backward). Under bf16 mixed precision parameters are
// gathered and used in bf16, gradients reduced in f32, and the logits come out in f32 for the loss.
// The model is on the meta device: its shards are allocated and initialised on `device`'s mesh,
// or on `mesh` when given (a memory plan's). `per_block`, when given, is each block's
// reshard_after_forward (a memory plan's choice) in place of --reshard-after-forward.
fsdp::FSDPModule shard_model(const apps::LanguageModel& model, const TrainOptions& o, Device device,
                             const std::shared_ptr<dist::DeviceMesh>& mesh = nullptr,
                             const std::vector<bool>& per_block = {}) {
  const auto strategy = fsdp::parse_sharding_strategy(o.sharding_strategy);
  // FULL_SHARD is the 1-D world mesh of the model's device; the others build their mesh.
  fsdp::FullyShardOptions block_opts{.mesh = mesh ? mesh : dist::default_mesh(device.type)};
  if (strategy != fsdp::ShardingStrategy::FULL_SHARD) block_opts = fsdp::strategy_options(strategy, 0, device.type);
  if (strategy != fsdp::ShardingStrategy::FULL_SHARD) {
    // The strategy decides resharding (--reshard-after-forward must be left at its default).
  } else if (o.reshard_after_forward == "true" || o.reshard_after_forward == "false")
    block_opts.reshard_after_forward = o.reshard_after_forward == "true";
  else  // N: keep 1/N per rank, gathered within groups of N ranks for backward
    block_opts.reshard_after_forward = std::stoi(o.reshard_after_forward);
  if (o.mixed_precision == "bf16") block_opts.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = kFloat32};
  fsdp::FullyShardOptions root_opts = block_opts;
  root_opts.reshard_after_forward.reset();  // the root keeps FSDP2's default
  if (o.mixed_precision == "bf16") root_opts.mp_policy.output_dtype = kFloat32;
  for (size_t i = 0; i < model.blocks.size(); ++i) {
    fsdp::FullyShardOptions opts = block_opts;
    if (!per_block.empty()) opts.reshard_after_forward = bool(per_block[i]);
    if (o.base_dtype == "bf16") fsdp::fully_shard(lora_modules(*model.blocks[i]), opts);  // f32, apart from the base
    fsdp::fully_shard(model.blocks[i], opts);
  }
  return fsdp::fully_shard(model.module, root_opts);
}

// AdamW with weight decay on the 2-D weights (matmuls and embeddings) only: `decay` names them,
// from the full shapes before sharding; the parameters are looked up by name after it.
std::unique_ptr<nn::AdamW> make_optimizer(nn::Module& model, const std::vector<std::string>& decay,
                                          const TrainOptions& o) {
  std::vector<Tensor> with, without;
  for (auto& [name, p] : model.named_parameters())
    if (p.requires_grad())  // not a base weight frozen under LoRA
      (std::find(decay.begin(), decay.end(), name) != decay.end() ? with : without).push_back(p);
  return std::make_unique<nn::AdamW>(
      std::vector<nn::ParamGroup>{nn::ParamGroup{with, {}}, nn::ParamGroup{without, {{"weight_decay", 0.0}}}},
      nn::AdamWOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay});
}

std::vector<std::string> decayed_names(const nn::Module& model) {
  std::vector<std::string> out;
  for (auto& [name, p] : model.named_parameters())
    if (p.dim() >= 2) out.push_back(name);
  return out;
}

fsdp::MemoryPlanRequest plan_request(const TrainOptions& o, bool fsdp, bool full_rows) {
  fsdp::MemoryPlanRequest r;
  r.sharded = fsdp;
  r.tunable_groups = fsdp ? int(o.model.n_layer) : 0;
  r.can_checkpoint = true;
  r.settings.activation_checkpointing = o.checkpointing;
  r.settings.reshard_after_forward.assign(size_t(r.tunable_groups), o.reshard_after_forward == "true");
  r.setup = [o, full_rows](const fsdp::PlanSettings& s, const std::shared_ptr<dist::DeviceMesh>& mesh) -> fsdp::TrainingStep {
    manual_seed(o.seed);
    const apps::LanguageModel lm = apps::make_model(o.model);
    apps::init_model(lm);
    apps::add_lora(lm, o.lora, false);
    const apps::TensorParallel tp = o.tp > 1 ? apps::planned_tensor_parallel(o.model, o.tp, full_rows) : apps::TensorParallel{};
    if (o.tp > 1) apps::parallelize(lm, tp);  // the shapes of this rank's parts (mesh: the data-parallel ranks)
    if (o.base_dtype == "bf16") nn::cast_frozen(*lm.module, kBFloat16);
    const std::shared_ptr<nn::Module> model = lm.module;
    const auto decay = decayed_names(*model);
    for (auto& block : lm.blocks) block->set_checkpointing(s.activation_checkpointing);
    if (mesh) shard_model(lm, o, Device::meta(), mesh, s.reshard_after_forward);
    std::shared_ptr<nn::AdamW> opt = make_optimizer(*model, decay, o);
    const int64_t rows = o.batch_size / (mesh ? mesh->size(0) : 1), ctx = o.model.ctx;
    return [model, opt, o, rows, ctx, loss = apps::tensor_parallel_loss(tp)] {
      auto tokens = [&] { return empty({rows, ctx}, {.dtype = kInt64}); };
      opt->zero_grad();
      for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
        Tensor x = tokens(), y = tokens();
        apps::forward_backward(*model, x, y, o.autocast(), o.grad_accum, 0, {}, loss);
      }
      if (o.clip > 0) nn::clip_grad_norm_(model->parameters(), o.clip);
      opt->step();
      NoGradGuard no_grad;  // an evaluation batch, as between the steps of train()
      step_trace::Pause not_timed;  // memory only: the step-time model times the training step
      AutocastGuard bf16(DType::bf16, o.autocast());
      model->eval();
      Tensor x = tokens(), y = tokens(), logits = (*model)(x);
      apps::loss_of(loss, logits.view({-1, logits.size(-1)}), y.view({-1}));
      model->train();
    };
  };
  return r;
}

// What train() sets up before the first step (prepare_run, rank-local: inside dist::agree).
struct Run {
  Device device = kCPU;
  std::optional<apps::LeafPlan> leaves;             // --deterministic
  std::optional<fsdp::CheckpointDirLock> dir_lock;  // rank 0's claim on --checkpoint-dir
  apps::TrainingData data;
  std::optional<apps::ExampleSet> train_examples, val_examples;  // a dataset of examples (example_data.h)
  std::map<std::string, std::string> train_text;    // its length and sha256, recorded in checkpoints
  std::string resume_from;                          // the checkpoint directory --resume resolves to
  std::string identity;                             // the run identity its checkpoints record
  int64_t start_bytes = 0;  // live before the model: the baseline of the peak reported at the end
  std::optional<fsdp::MemoryPlan> plan;
  std::vector<bool> per_block;  // reshard_after_forward per block, when a memory budget chose it
  apps::LanguageModel lm;
  std::optional<apps::MetricsWriter> metrics;
  std::optional<apps::PeftAdapter> adapter;  // --init-from a peft adapter directory
  apps::TensorParallel tp;                   // --tp (size 1: none)
};

// Mean validation loss over `iters` fixed batches (the same ones at every evaluation and any
// world size); each rank evaluates its rows and the means are averaged over ranks.
// With --deterministic each batch goes as the rank's virtual micro-batches, their losses
// averaged in one order at any world size. A dataset of examples: the mean over the targets
// that carry loss of all those batches.
double evaluate(nn::Module& model, const Run& run, const TrainOptions& o, const Ranks& ranks,
                const std::optional<apps::LeafPlan>& leaves) {
  NoGradGuard no_grad;
  AutocastGuard bf16(DType::bf16, o.autocast());
  model.eval();
  double total = 0;
  std::vector<double> ordered;
  const apps::ExampleSet* examples = run.val_examples ? &*run.val_examples : nullptr;
  double share = 0;  // examples: a part's loss sum times share is its part of the mean over all targets
  for (int64_t i = 0; examples && i < o.eval_iters; ++i)
    share += double(examples->targets(examples->draw(o.seed + kValSeedOffset, i, o.batch_size)));
  if (examples) share = double(o.eval_iters * (leaves ? leaves->per_rank : 1) * ranks.data_world()) / share;
  const apps::LossFn loss_fn = apps::tensor_parallel_loss(run.tp);
  for (int64_t i = 0; i < o.eval_iters; ++i) {
    auto loss = [&](int64_t lo, int64_t hi) {
      apps::ExampleRows r;  // validation examples are not packed
      if (examples) r = examples->rows(examples->draw(o.seed + kValSeedOffset, i, o.batch_size), lo, hi);
      else std::tie(r.x, r.y) = apps::text_batch(run.data.val, o.seed + kValSeedOffset, i, o.batch_size, o.model.ctx, lo, hi);
      Tensor logits = model(r.x.to(run.device));
      Tensor flat = logits.view({-1, logits.size(-1)}), y = r.y.to(run.device).view({-1});
      if (examples) return apps::loss_of(loss_fn, flat, y, {.reduction = "sum"}).item() * share;
      return apps::loss_of(loss_fn, flat, y).item();
    };
    if (!leaves) {
      const int64_t w = ranks.data_world(), r = ranks.data_rank();
      total += loss(o.batch_size * r / w, o.batch_size * (r + 1) / w);
      continue;
    }
    for (int64_t j = 0; j < leaves->per_rank; ++j) {
      auto [lo, hi] = leaves->rows(leaves->micro(j * leaves->accum), o.batch_size);
      ordered.push_back(loss(lo, hi));
    }
  }
  model.train();
  if (leaves) return apps::ordered_mean(ordered, o.eval_iters, ranks);
  return mean_over_ranks(total / double(o.eval_iters), ranks);
}

// --init-from: the model is the checkpoint's; --ctx may shorten its context.
void take_init_config(TrainOptions& o) {
  WEFT_CHECK(apps::is_hf_dir(o.init_from), "transformer: --init-from {} is not a Hugging Face model directory "
             "(no config.json there)", o.init_from);
  apps::ModelConfig hf = apps::read_hf_config(o.init_from);
  WEFT_CHECK(o.model.ctx <= hf.ctx, "transformer: --ctx {} is longer than {}'s context {}", o.model.ctx, o.init_from,
             hf.ctx);
  if (hf.arch == "llama") hf.ctx = o.model.ctx;  // no position table: any shorter context works
  WEFT_CHECK(hf.arch == "llama" || o.model.ctx == hf.ctx, "transformer: --ctx {} differs from {}'s n_positions "
             "{} (GPT-2's position table is that long: pass --ctx {})", o.model.ctx, o.init_from, hf.ctx, hf.ctx);
  hf.dropout = o.model.dropout;
  o.model = hf;
  o.untie = !hf.tie_weights;
}

nn::WarmupDecayLR::Decay decay_of(const std::string& schedule) {
  using D = nn::WarmupDecayLR::Decay;
  return schedule == "constant" ? D::constant : schedule == "linear" ? D::linear : schedule == "wsd" ? D::wsd : D::cosine;
}

// --lr-schedule, --min-lr and --decay-steps, their defaults resolved (after the warmup's).
void check_schedule(TrainOptions& o) {
  WEFT_CHECK(o.lr_schedule != "constant" || o.min_lr < 0, "transformer: --min-lr is where a decay ends: "
             "--lr-schedule constant has none");
  WEFT_CHECK(o.lr_schedule == "wsd" || o.decay_steps == 0, "transformer: --decay-steps is for --lr-schedule wsd");
  if (o.min_lr < 0) o.min_lr = o.lr_schedule == "constant" ? o.lr : 0.1 * o.lr;
  WEFT_CHECK(o.min_lr <= o.lr, "transformer: --min-lr {} is above --lr {}", o.min_lr, o.lr);
  if (o.lr_schedule == "wsd" && o.decay_steps == 0) o.decay_steps = std::max<int64_t>(1, o.steps / 5);
  WEFT_CHECK(o.lr_schedule != "wsd" || o.decay_steps <= o.steps - o.warmup, "transformer: --decay-steps {} is more "
             "than the {} steps after the warmup", o.decay_steps, o.steps - o.warmup);
}

// --base-dtype bf16: a LoRA run's frozen base, read from --init-from, kept in bf16; the model then
// computes in bf16 (--mixed-precision bf16), and under --fsdp each block's adapters are a group of
// their own (f32), apart from the block's base.
void check_base_dtype(const TrainOptions& o) {
  if (o.base_dtype == "f32") return;
  WEFT_CHECK(o.lora.rank > 0 && !o.init_from.empty(), "transformer: --base-dtype bf16 keeps the frozen base of a LoRA "
             "run in bf16: it needs --lora-rank and --init-from");
  WEFT_CHECK(o.mixed_precision == "bf16", "transformer: --base-dtype bf16 needs --mixed-precision bf16 (the bf16 base "
             "computes in bf16)");
  WEFT_CHECK(std::find(o.lora.targets.begin(), o.lora.targets.end(), "lm_head") == o.lora.targets.end(),
             "transformer: --base-dtype bf16 adapts the blocks' layers only, not lm_head");
}

// --tp: what runs split so far (docs/PARALLEL.md), checked first: the world must divide by it.
void check_tensor_parallel(const TrainOptions& o, const Ranks& ranks, const Run& run) {
  if (o.tp == 1) return;
  WEFT_CHECK(o.fsdp, "transformer: --tp {} splits the model among the ranks of an FSDP run: add --fsdp (fully_shard "
             "then shards it over the data-parallel groups, one included)", o.tp);
  const int world = o.plan.ranks > 0 ? o.plan.ranks : ranks.world;  // --plan-ranks: the run planned
  WEFT_CHECK(world % o.tp == 0, "transformer: --tp {} does not divide the {} ranks of {}", o.tp, world,
             o.plan.ranks > 0 ? "--plan-ranks" : "mpirun");
  WEFT_CHECK(run.device.is_cpu(), "transformer: --tp runs on the CPU for now, not {}", run.device.str());
  WEFT_CHECK(!o.deterministic, "transformer: --tp cannot run --deterministic: a row-parallel layer adds its ranks' "
             "partial products in another order than one rank's matmul, so the bits differ at any --tp above 1");
  auto refuse = [&](bool used, const char* what) { WEFT_CHECK(!used, "transformer: --tp does not run with {} yet", what); };
  refuse(o.sharding_strategy != "FULL_SHARD", "--sharding-strategy other than FULL_SHARD");
  refuse(o.reshard_after_forward != "true" && o.reshard_after_forward != "false", "--reshard-after-forward N");
}

// The flags, checked against each other and the world before anything is built.
void validate(TrainOptions& o, const Ranks& ranks, Run& run) {
  if (!o.init_from.empty() && apps::is_peft_dir(o.init_from)) {  // its base model, then its adapters
    WEFT_CHECK(o.lora.rank == 0, "transformer: --init-from {} is a peft adapter, whose adapter_config.json sets the "
               "adapters: leave out --lora-rank", o.init_from);
    run.adapter = apps::read_peft_adapter(o.init_from);
    o.lora = run.adapter->lora;
    o.init_from = run.adapter->base;
  }
  if (!o.init_from.empty()) take_init_config(o);
  apps::check_config(o.model);
  WEFT_CHECK(o.lora.rank > 0 || (o.lora.alpha == 0 && o.lora.dropout == 0 && o.lora_targets.empty()),
             "transformer: --lora-alpha, --lora-dropout and --lora-targets need a --lora-rank above 0");
  if (o.lora.rank > 0 && !o.init_from.empty()) o.base_digest = apps::hf_weights_digest(o.init_from);
  if (o.lora.rank > 0 && o.lora.targets.empty()) {  // flags, or a peft adapter's "all-linear"
    o.lora.targets = apps::lora_targets(o.lora_targets, o.model);
    if (o.lora.alpha == 0) o.lora.alpha = double(o.lora.rank);
  }
  check_base_dtype(o);
  check_tensor_parallel(o, ranks, run);
  WEFT_CHECK(o.lr > 0 && o.steps > 0 && o.batch_size > 0 && o.grad_accum > 0,
             "transformer: --lr, --steps, --batch-size and --grad-accum must be positive");
  if (o.deterministic) run.leaves = apps::make_leaf_plan("transformer", o.virtual_batches, o.batch_size, o.grad_accum, ranks);
  WEFT_CHECK(!o.deterministic || o.sharding_strategy != "NO_SHARD",
             "transformer: --deterministic reduces gradients over one sharded dimension: use --sharding-strategy "
             "FULL_SHARD or SHARD_GRAD_OP, not NO_SHARD");
  const int dp = (o.plan.ranks > 0 ? o.plan.ranks : ranks.world) / o.tp;  // the batch's slices
  WEFT_CHECK(o.batch_size % dp == 0, "transformer: --batch-size {} does not split evenly over {} {}{}: it is the global "
             "batch and each takes an equal slice, so use a multiple of {}", o.batch_size, dp,
             o.tp > 1 ? "data-parallel groups" : "ranks", o.plan.ranks > 0 ? " of --plan-ranks" : "", dp);
  WEFT_CHECK(ranks.fsdp || (o.reshard_after_forward == "true" && o.sharding_strategy == "FULL_SHARD"),
             "transformer: --reshard-after-forward and --sharding-strategy are FSDP options: add --fsdp");
  WEFT_CHECK(o.sharding_strategy == "FULL_SHARD" || o.reshard_after_forward == "true",
             "transformer: --reshard-after-forward applies to --sharding-strategy FULL_SHARD only ({} decides it)",
             o.sharding_strategy);
  WEFT_CHECK(o.warmup >= 0, "transformer: --warmup must be non-negative, got {}", o.warmup);
  // The schedule needs a step after the warmup; a short run keeps the default warmup usable.
  o.warmup = std::min(o.warmup, o.steps - 1);
  check_schedule(o);
  apps::check_checkpoint_dir(o.checkpoint_dir, "--checkpoint-dir", "transformer");
  if (o.plan.wanted())
    WEFT_CHECK(o.sharding_strategy == "FULL_SHARD" &&
                   (o.reshard_after_forward == "true" || o.reshard_after_forward == "false"),
               "transformer: --plan, --plan-ranks and --memory-budget plan FULL_SHARD with --reshard-after-forward "
               "true or false, not --sharding-strategy {} with --reshard-after-forward {}", o.sharding_strategy,
               o.reshard_after_forward);
}

// The text or token files; a token dataset sets the vocabulary.
void load_data(TrainOptions& o, Run& run) {
  apps::load_training_data(o.data, run.data);
  if (!run.data.tokenizer_sha256.empty()) {  // token ids: the model's vocabulary must hold them
    if (o.init_from.empty()) o.model.vocab_size = run.data.vocab_size;
    WEFT_CHECK(o.model.vocab_size >= run.data.vocab_size, "transformer: {}'s vocabulary of {} is smaller than the "
               "dataset's {} ({})", o.init_from, o.model.vocab_size, run.data.vocab_size, o.data);
  }
  if (!o.checkpoint_dir.empty() || !o.resume.empty()) run.train_text = training_text(run.data);
  if (run.data.examples()) {  // whole examples, cut at the context
    run.train_examples.emplace(run.data.train, run.data.train_labels, o.model.ctx, run.data.files[0], o.pack, o.seed);
    run.val_examples.emplace(run.data.val, run.data.val_labels, o.model.ctx, run.data.files[1]);
    for (const auto& [set, file] : {std::pair{&*run.train_examples, run.data.files[0]}, {&*run.val_examples, run.data.files[1]}})
      WEFT_CHECK(set->size() > 0, "transformer: no example of {} has a target that carries loss within the context "
                 "{} ({} skipped): use a longer --ctx", file, o.model.ctx, set->skipped());
    return;
  }
  WEFT_CHECK(!o.pack, "transformer: --pack packs the examples of a dataset of JSONL records, and {} is text", o.data);
  WEFT_CHECK(run.data.val.size() > o.model.ctx + 1,
             "transformer: the validation part of {} ({} tokens) is shorter than the context {}", o.data,
             run.data.val.size(), o.model.ctx);
}

// The model of the checkpoint --resume names must be the flags' (or --init-from's) model.
void check_resumed_model(const apps::ModelConfig& c, const apps::ModelConfig& m, const std::string& where) {
  const auto have = model_fields(c), want = model_fields(m);
  for (const auto& [key, value] : have)
    WEFT_CHECK(want.at(key) == value, "transformer: checkpoint {} holds a model with {} {}; the flags (and "
               "--init-from) ask for {} {}", where, key, value, key, want.at(key));
}

// A LoRA checkpoint that holds only its adapters names its base (hf_source) and the base's weights'
// digest: `base`, if given, must be that directory's weights unchanged (`digest`: theirs, if known);
// empty: the recorded one.
std::string lora_base(const std::map<std::string, std::string>& app, const std::string& where, std::string base = "",
                      const std::string& known = "") {
  auto digest = app.find("lora_base_sha256"), source = app.find("hf_source");
  if (digest == app.end()) return "";
  WEFT_CHECK(source != app.end(), "transformer: {} records lora_base_sha256 but no hf_source", where);
  if (base.empty()) base = source->second;
  WEFT_CHECK(apps::is_hf_dir(base), "transformer: {} holds the LoRA adapters of {} but not that base model, which is "
             "not a Hugging Face directory here", where, base);
  WEFT_CHECK((known.empty() ? apps::hf_weights_digest(base) : known) == digest->second, "transformer: {} holds LoRA "
             "adapters trained on the weights of {} (sha256 {}), but that directory's weights have changed since",
             where, base, digest->second);
  return base;
}
void check_lora_base(const std::map<std::string, std::string>& app, const TrainOptions& o, const std::string& where) {
  if (!app.count("lora_base_sha256")) return;
  WEFT_CHECK(!o.init_from.empty(), "transformer: {} holds only LoRA adapters: resume it with --init-from {}, its base",
             where, app.at("hf_source"));
  lora_base(app, where, o.init_from, o.base_digest);  // hashed once, by validate(), when the flags ask for LoRA
}

// --resume: the latest checkpoint in the directory, checked against the flags. The batches:
// another seed, batch size, accumulation or text would continue on another data stream than the
// checkpoint's position means. (--lr, --warmup and --steps take effect: the schedule is
// recomputed from them at the checkpoint's step; docs/CHECKPOINTS.md.)
void find_resume(const TrainOptions& o, Run& run, bool say) {
  const std::string& where = run.resume_from = apps::readable_checkpoint(o.resume, "transformer", say);
  WEFT_CHECK(!where.empty(), "transformer: no checkpoint to resume in {} (no index.json there and no complete "
             "step_* directory)", o.resume);
  const fsdp::CheckpointProgress ck = fsdp::read_checkpoint_index(where).training;
  check_lora_base(ck.app, o, where);  // first: without its base, the model flags cannot match either
  check_resumed_model(config_of(ck.app, where), o.model, where);
  auto same = [&](const char* key, const char* flag, const std::string& value, const char* why) {
    apps::check_resumed_setting(ck.app, key, flag, value, why, where, "transformer");
  };
  same("seed", "--seed", std::to_string(o.seed), "the seed decides the batches");
  same("batch_size", "--batch-size", std::to_string(o.batch_size), "the data position counts batches of that size");
  same("grad_accum", "--grad-accum", std::to_string(o.grad_accum), "the data position counts micro-batches");
  same("virtual_batches", o.deterministic ? "--virtual-batches" : "--deterministic",
       o.deterministic ? std::to_string(o.virtual_batches) : "0",
       "the summation order decides the bits of every later step (0: without --deterministic)");
  apps::check_resumed_data(ck.app, run.train_text, "training text", "--data " + o.data, where, "transformer");
  const std::string base_dtype = ck.app.count("base_dtype") ? ck.app.at("base_dtype") : "f32";
  WEFT_CHECK(base_dtype == o.base_dtype, "transformer: checkpoint {} was written with --base-dtype {}, and this run "
             "asks for {}", where, base_dtype, o.base_dtype);
  WEFT_CHECK(ck.app.count("pack") == size_t(o.pack), "transformer: checkpoint {} was written {} --pack, and this run is "
             "{} it: the rows of its batches differ", where, o.pack ? "without" : "with", o.pack ? "with" : "without");
  same("weight_decay", "--weight-decay", fmt::format("{}", o.weight_decay),
       "the optimizer state restores the weight decay, so another value would be ignored");
  for (auto [key, value] : {std::pair{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}})
    same(key, fmt::format("--{}", key).c_str(), fmt::format("{}", value),
         "the optimizer state restores AdamW's betas and eps, so another value would be ignored");
  auto text = [](const std::map<std::string, std::string>& f) {
    std::string t;
    for (auto& [k, v] : f) t += fmt::format("{}{} {}", t.empty() ? "" : ", ", k, v);
    return t.empty() ? std::string("no LoRA adapters") : t;
  };
  const auto recorded = apps::lora_fields(apps::lora_of(ck.app, where)), wanted = apps::lora_fields(o.lora);
  WEFT_CHECK(recorded == wanted, "transformer: checkpoint {} holds {}; the --lora-* flags ask for {}", where,
             text(recorded), text(wanted));
  WEFT_CHECK(ck.step <= o.steps, "transformer: {} is at step {}, beyond --steps {}: raise --steps to go on", where,
             ck.step, o.steps);
  if (ck.data.count("batch"))  // the run draws batch step * --grad-accum next
    apps::data_position(ck.data, "batch", ck.step * o.grad_accum, ck.step * o.grad_accum, where, "transformer");
}

// The memory plan (when asked), then the same full model on every rank: under --fsdp deferred,
// on the meta device (init_model records its rules there too; fully_shard then initialises only
// this rank's shards, bitwise the eager build's values). --init-from draws nothing: its weights
// replace every parameter (load_init_weights).
// --tp builds it whole (materialised), to be split over its group before sharding.
void build_model(TrainOptions& o, const Ranks& ranks, Run& run) {
  reset_peak_memory_stats(run.device);
  run.start_bytes = memory_stats(run.device).live_bytes;
  const apps::StepItems tokens{double(o.batch_size * o.grad_accum * o.model.ctx), "tokens"};
  run.plan = apps::plan_from_flags(o.plan, plan_request(o, ranks.fsdp, !run.data.examples()), ranks, run.device, tokens,
                                   "weft-transformer");
  if (o.plan.only()) return;  // printed; nothing to build or train
  if (run.plan && run.plan->budget) {  // train with the plan's choices
    o.checkpointing = run.plan->settings.activation_checkpointing;
    run.per_block = run.plan->settings.reshard_after_forward;
  }
  manual_seed(o.seed);
  if (!o.init_from.empty() && (run.resume_from.empty() || o.base_elsewhere())) {  // load_init_weights reads them
    run.lm = apps::make_model_to_load(o.model);
    apps::add_lora(run.lm, o.lora, false);  // drawn after nothing: the same adapters at any world size
    if (o.base_dtype == "bf16") nn::cast_frozen(*run.lm.module, kBFloat16);
    if (!ranks.fsdp || o.tp > 1) nn::materialize(*run.lm.module, run.device);  // --tp: whole, then split
  } else if (ranks.fsdp && o.tp == 1) {
    DefaultDeviceGuard meta(Device::meta());
    run.lm = apps::make_model(o.model);
    apps::init_model(run.lm);
    apps::add_lora(run.lm, o.lora, false);
  } else {
    run.lm = apps::make_model(o.model);
    run.lm.module->to(run.device);  // initialised on the host (the same values on every device), then moved
    apps::init_model(run.lm);
    apps::add_lora(run.lm, o.lora, false);
  }
}

// Everything before sharding, rank-local: run inside dist::agree, so that a failure on any rank
// (bad flags, missing files, a checkpoint that does not fit) stops every rank.
void prepare_run(TrainOptions& o, const Ranks& ranks, Run& run) {
  run.device = apps::parse_device(o.device, "transformer");  // first: a device that cannot work ends the run at once
  if (o.threads > 0) set_num_threads(o.threads);
  set_deterministic(o.deterministic);
  o.model.tie_weights = !o.untie;
  validate(o, ranks, run);
  if (!o.checkpoint_dir.empty() && ranks.lead() && !o.plan.only()) run.dir_lock.emplace(o.checkpoint_dir);
  load_data(o, run);
  if (!o.resume.empty()) find_resume(o, run, ranks.lead());
  std::vector<apps::PathFlag> inputs = {{"--resume", run.resume_from}, {"--init-from", o.init_from}};
  for (const std::string& file : run.data.files) inputs.push_back({"--data", file});
  apps::check_outputs_apart({{"--metrics", o.metrics}, {"--checkpoint-dir", o.checkpoint_dir},
                             {"WEFT_TRACE", trace::file()}}, inputs, "transformer");
  run.identity = apps::run_identity(run.resume_from);
  if (run.dir_lock)
    apps::check_checkpoint_owner(o.checkpoint_dir, "--checkpoint-dir", run.identity, o.overwrite_checkpoints,
                                 "--resume", "transformer");
  build_model(o, ranks, run);
  run.metrics.emplace(ranks.lead() && !o.plan.only() ? o.metrics : std::string());
}

// The loop's batches (global micro-batch step * --grad-accum + micro of the training text),
// its evaluation and what its checkpoints record.
class TextTask : public apps::TrainingTask {
 public:
  TextTask(const TrainOptions& o, const Run& run, const Ranks& ranks) : o_(o), run_(run), ranks_(ranks) {}
  apps::Batch batch(int64_t step, int64_t micro, int64_t lo, int64_t hi) override {
    const int64_t index = step * o_.grad_accum + micro;
    if (run_.train_examples) {
      auto [x, y, positions] = run_.train_examples->rows(run_.train_examples->draw(o_.seed, index, o_.batch_size), lo, hi);
      return {x, y, positions};
    }
    auto [x, y] = apps::text_batch(run_.data.train, o_.seed, index, o_.batch_size, o_.model.ctx, lo, hi);
    return {x, y};
  }
  int64_t step_targets(int64_t step) override {
    int64_t n = 0;
    for (int64_t micro = 0; run_.train_examples && micro < o_.grad_accum; ++micro)
      n += run_.train_examples->targets(run_.train_examples->draw(o_.seed, step * o_.grad_accum + micro, o_.batch_size));
    return n;
  }
  void evaluate(const Evaluation& at) override {
    const double val = ::evaluate(*run_.lm.module, run_, o_, ranks_, run_.leaves);
    at.metrics.write({{"split", std::string("val")}, {"step", at.step}, {"loss", val}, {"perplexity", std::exp(val)}});
    at.nan.check_evaluation(val, fmt::format("the validation loss is {} at step {}", apps::describe_value(val),
                                             at.step), at.watch);
    if (!ranks_.lead()) return;
    std::printf("step %lld train_loss %.4f val_loss %.4f val_ppl %.3f\n", (long long)at.step, at.train_loss, val,
                std::exp(val));
    std::fflush(stdout);
  }
  fsdp::CheckpointProgress checkpoint(int64_t step) override {
    return {.data = {{"batch", step * o_.grad_accum}}, .app = describe(o_.model, o_, run_.train_text),
            .aliases = head_alias(o_.model)};
  }

 private:
  const TrainOptions& o_;
  const Run& run_;
  const Ranks& ranks_;
};

apps::LoopOptions loop_options(const TrainOptions& o, const Run& run) {
  return {.program = "weft-transformer", .device = run.device, .batch_size = o.batch_size, .accumulation = o.grad_accum,
          .items_per_step = o.batch_size * o.grad_accum * o.model.ctx, .unit = "tokens", .eval_every = o.eval_every,
          .log_every = o.log_every, .log_first = true, .log_grad_norm = true, .log_peak_bytes = true, .clip = o.clip,
          .autocast = o.autocast(), .loss = apps::tensor_parallel_loss(run.tp), .on_nan = apps::parse_on_nan(o.on_nan), .max_skipped = o.max_skipped,
          .checkpoints = {o.checkpoint_dir, "--checkpoint-dir", o.checkpoint_every, o.keep_last, run.identity,
                          o.overwrite_checkpoints, o.base_elsewhere()},
          .profile_from = o.profile};
}

void print_run(const TrainOptions& o, const Run& run, const Ranks& ranks, int64_t n_params, bool sharded) {
  if (!ranks.lead()) return;
  std::fprintf(stderr, "weft-transformer: %s n_layer %lld, n_head %lld, d_model %lld, ctx %lld, %s head: %lld "
               "parameters; %zu train / %zu val %s from %zu file(s) of %s; batch %lld x %lld accumulation, "
               "%d threads\n", o.model.arch == "llama" ? "Llama" : "GPT-2", (long long)o.model.n_layer,
               (long long)o.model.n_head, (long long)o.model.d_model, (long long)o.model.ctx,
               o.model.tie_weights ? "tied" : "untied", (long long)n_params, (size_t)run.data.train.size(),
               (size_t)run.data.val.size(), run.data.tokenizer_sha256.empty() ? "bytes" : "tokens",
               run.data.files.size(), o.data.c_str(), (long long)o.batch_size, (long long)o.grad_accum,
               get_num_threads());
  if (sharded)
    std::fprintf(stderr, "weft-transformer: FSDP over %d ranks: one group per block and the root; %lld parameters "
                 "on rank 0, %lld sequences per %s per micro-step\n", ranks.world,
                 (long long)apps::count_parameters(*run.lm.module), (long long)(o.batch_size / ranks.data_world()),
                 run.tp.size > 1 ? "tensor-parallel group" : "rank");
  if (run.tp.size > 1) std::fprintf(stderr, "weft-transformer: %s\n", apps::describe(run.tp).c_str());
  if (run.train_examples)
    std::fprintf(stderr, "weft-transformer: examples: %lld train / %lld val, %s; %lld / %lld skipped (no target "
                 "within ctx %lld), %lld / %lld cut at ctx + 1 tokens\n", (long long)run.train_examples->examples(),
                 (long long)run.val_examples->size(), run.train_examples->packed() ? fmt::format("the train ones "
                 "packed into {} rows", run.train_examples->size()).c_str() : "each one row padded to the longest of "
                 "its batch",
                 (long long)run.train_examples->skipped(), (long long)run.val_examples->skipped(),
                 (long long)o.model.ctx, (long long)run.train_examples->truncated(),
                 (long long)run.val_examples->truncated());
}

// --init-from without --resume: the Hugging Face weights replace the initial ones (each rank
// reads its shards' bytes only; a NaN or infinity in them throws as it is read).
void load_init_weights(const TrainOptions& o, const Run& run, const Ranks& ranks, const fsdp::FSDPModule* root) {
  dist::agree(ranks.groups(), "transformer", [&] {
    apps::load_hf_checkpoint(o.init_from, run.lm, root);
    if (run.adapter) apps::load_peft_weights(*run.adapter, run.lm, root);
  });
  if (ranks.lead())
    std::fprintf(stderr, "weft-transformer: initialised from %s%s%s\n", o.init_from.c_str(),
                 run.adapter ? " and the adapters of " : "", run.adapter ? run.adapter->dir.c_str() : "");
}

int train(TrainOptions o, const Ranks& ranks) {
  Run run;
  dist::agree(ranks.groups(), "transformer", [&] { prepare_run(o, ranks, run); });
  if (o.plan.only()) return 0;  // the plan is printed; nothing to train
  nn::Module& model = *run.lm.module;
  const int64_t n_params = apps::count_parameters(model);
  int64_t n_trainable = 0;  // the adapters under LoRA (never tied)
  for (auto& [name, p] : model.named_parameters()) n_trainable += p.requires_grad() ? p.numel() : 0;
  const std::vector<std::string> decay = decayed_names(model);  // from the full shapes, before sharding
  // Each block keeps only its input for backward and runs again there (nn/activation_checkpoint.h).
  for (auto& block : run.lm.blocks) block->set_checkpointing(o.checkpointing);
  std::optional<fsdp::FSDPModule> root;
  // A LoRA checkpoint holds the adapters only: its base is read first, then the checkpoint.
  const bool init_weights = !o.init_from.empty() && (run.resume_from.empty() || o.base_elsewhere());
  if (o.tp > 1) {  // whole, then split over the tp group, then sharded over the dp groups
    run.tp = apps::make_tensor_parallel(o.model, o.tp, !run.data.examples());
    if (init_weights) load_init_weights(o, run, ranks, nullptr);
    dist::agree(ranks.groups(), "transformer", [&] { apps::parallelize(run.lm, run.tp); });
    root = shard_model(run.lm, o, run.device, run.tp.over_dp, run.per_block);
  } else {
    if (ranks.fsdp) root = shard_model(run.lm, o, run.device, nullptr, run.per_block);
    if (init_weights) load_init_weights(o, run, ranks, root ? &*root : nullptr);
  }
  const std::unique_ptr<nn::AdamW> opt = make_optimizer(model, decay, o);  // this rank's shards
  nn::WarmupDecayLR sched(*opt, o.warmup, o.steps, o.min_lr / o.lr, decay_of(o.lr_schedule), o.decay_steps);
  TextTask task(o, run, ranks);
  apps::Trainer trainer(loop_options(o, run), {&model, opt.get(), &sched, root ? &*root : nullptr}, ranks,
                        run.leaves, task, *run.metrics);
  if (!run.resume_from.empty()) trainer.resume(run.resume_from);
  print_run(o, run, ranks, n_params, root.has_value());
  if (o.lora.rank > 0 && ranks.lead())
    std::fprintf(stderr, "weft-transformer: LoRA rank %lld, alpha %g on %s: %lld trainable parameters, the other %lld "
                 "frozen\n", (long long)o.lora.rank, o.lora.alpha, apps::lora_fields(o.lora).at("lora_targets").c_str(),
                 (long long)n_trainable, (long long)(n_params - n_trainable));
  // --stop-after ends this run early but keeps the schedule of --steps, so a later --resume
  // continues exactly as an uninterrupted run would.
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, trainer.step() + o.stop_after) : o.steps;
  if (const int status = trainer.run(end); status != 0) return status;
  apps::report_peak_memory("weft-transformer", run.device, run.start_bytes, ranks, run.plan);
  return 0;
}

// The model a sample or an export reads: a Hugging Face directory, a checkpoint directory (the
// latest in it) or one file (weft-checkpoint consolidate's, or any with the same description
// and the family's names; a tied head's lm_head.weight must equal the embedding). Whole, on the
// CPU; or, with `shard`, built on the meta device and fully_shard per block and at the root over
// the world (default options), each rank reading its own shards. In `dtype`: built on the meta
// device in it, so that bf16 weights are read straight into bf16 parameters (others converted).
// A NaN or infinity in any parameter throws, naming it: Hugging Face and peft files are checked
// as they are read (fsdp/external_checkpoint.h), a weft checkpoint after its load.
struct LoadedModel {
  apps::LanguageModel lm;
  std::optional<fsdp::FSDPModule> root;  // with `shard`
  std::map<std::string, std::string> recorded;  // a checkpoint's training description (tokenizer_sha256, ...)
  nn::LoRAOptions lora{.rank = 0};              // a LoRA run's adapters (rank 0: none)
};
LoadedModel load_model(const std::string& from, bool say, bool shard = false, Device device = kCPU,
                       DType dtype = kFloat32) {
  LoadedModel m;
  auto build = [&](const apps::ModelConfig& cfg, const nn::LoRAOptions& lora) {
    m.lm = apps::make_model_to_load(cfg);
    apps::add_lora(m.lm, lora, true);  // a LoRA run's checkpoint holds its adapters too
    m.lora = lora;
    m.lm.module->to(dtype);
    if (!shard) return nn::materialize(*m.lm.module, kCPU);
    const fsdp::FullyShardOptions opts{.mesh = dist::default_mesh(device.type)};
    for (auto& block : m.lm.blocks) fsdp::fully_shard(block, opts);
    m.root = fsdp::fully_shard(m.lm.module, opts);
  };
  const fsdp::FSDPModule* root = nullptr;
  if (apps::is_hf_dir(from)) {
    build(apps::read_hf_config(from), {.rank = 0});
    if (m.root) root = &*m.root;
    apps::load_hf_checkpoint(from, m.lm, root);
    return m;
  }
  if (apps::is_peft_dir(from)) {  // a peft adapter: its base model, then its adapters
    const apps::PeftAdapter a = apps::read_peft_adapter(from);
    const apps::ModelConfig cfg = apps::read_hf_config(a.base);
    build(cfg, {.rank = a.lora.rank, .alpha = a.lora.alpha, .dropout = a.lora.dropout,
                .targets = a.lora.targets.empty() ? apps::lora_targets("", cfg) : a.lora.targets});
    if (m.root) root = &*m.root;
    apps::load_hf_checkpoint(a.base, m.lm, root);
    apps::load_peft_weights(a, m.lm, root);
    m.recorded["hf_source"] = a.base;  // its tokenizer and generation files
    return m;
  }
  if (std::filesystem::is_regular_file(from)) {
    WEFT_CHECK(!shard, "transformer: {} is one consolidated file, read whole: sample it without --fsdp, or from the "
               "checkpoint directory it was made from", from);
    auto contents = load_safetensors(from);
    WEFT_CHECK(!contents.metadata.count("lora_base_sha256"), "transformer: {} holds only LoRA adapters (the base is "
               "{}): read the checkpoint directory it was made from instead", from, contents.metadata["hf_source"]);
    auto cfg = config_of(contents.metadata, from);
    build(cfg, apps::lora_of(contents.metadata, from));
    fsdp::load_full_state_dict(*m.lm.module, contents.tensors, nullptr, head_alias(cfg));
    m.recorded = contents.metadata;
    apps::check_finite_parameters(*m.lm.module, fmt::format("transformer: refusing to load {}", from));
    return m;
  }
  std::string where = apps::readable_checkpoint(from, "transformer", say);
  WEFT_CHECK(!where.empty(), "transformer: no checkpoint at {} (neither a Hugging Face directory, a checkpoint directory "
             "nor a safetensors file)", from);
  m.recorded = fsdp::read_checkpoint_index(where).training.app;
  build(config_of(m.recorded, where), apps::lora_of(m.recorded, where));
  if (m.root) root = &*m.root;
  const std::string base = lora_base(m.recorded, where);  // a LoRA checkpoint of adapters only: its base first
  if (!base.empty()) apps::load_hf_checkpoint(base, m.lm, root);
  fsdp::load_checkpoint(where, *m.lm.module, nullptr, root, {.restore_rng = false, .frozen_elsewhere = !base.empty()});
  apps::check_finite_parameters(*m.lm.module, fmt::format("transformer: refusing to load {}", from));
  return m;
}

// The Hugging Face directory a model came from: --from itself, or the run's --init-from ("" if neither).
std::string hf_source(const std::string& from, const std::map<std::string, std::string>& recorded) {
  auto it = recorded.find("hf_source");
  const std::string source = apps::is_hf_dir(from) ? from : it != recorded.end() ? it->second : "";
  return !source.empty() && apps::is_hf_dir(source) ? source : "";
}

// --eos: a token id, or a token of the tokenizer; "none": never stop; not given: the eos ids of
// the generation_config.json of the Hugging Face directory the model came from (`source`), if any.
std::vector<int64_t> eos_ids(const std::string& eos, const apps::BpeTokenizer* tok, int64_t vocab,
                             const apps::HfGenerationConfig& gen, const std::string& source) {
  if (eos == "none") return {};
  if (eos.empty()) {
    const std::vector<int64_t>& ids = gen.eos;
    for (int64_t id : ids)
      WEFT_CHECK(id < vocab, "transformer: {}/generation_config.json's eos id {} is past the vocabulary of {}", source,
                 id, vocab);
    if (!ids.empty())
      std::fprintf(stderr, "weft-transformer: stopping after eos id(s) %s (%s/generation_config.json; --eos none: "
                   "never)\n", fmt::format("{}", fmt::join(ids, ",")).c_str(), source.c_str());
    return ids;
  }
  int64_t id = -1;
  if (eos.find_first_not_of("0123456789") == std::string::npos && eos.size() < 10) id = std::stoll(eos);
  else if (tok) id = tok->id_of(eos);
  WEFT_CHECK(id >= 0 && id < vocab, "transformer: --eos \"{}\" is not a token id below the vocabulary of {}{}", eos,
             vocab, tok ? " nor a token of --tokenizer" : " (a token's text needs --tokenizer)");
  return {id};
}

// --temperature, --top-k and --top-p where given; the others from the generation_config.json of
// the Hugging Face directory the model came from (do_sample false or absent: greedy), stderr
// naming what it took; without one, weft's defaults.
nn::SamplingOptions sampling_of(const SampleOptions& o, const apps::HfGenerationConfig& gen, const std::string& source) {
  nn::SamplingOptions s{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
  if (!gen.found) return s;
  std::vector<std::string> taken;
  if (!o.temperature_set) {
    s.temperature = gen.do_sample ? gen.temperature : 0;
    taken.push_back(gen.do_sample ? fmt::format("temperature {}", s.temperature) : "greedy (do_sample false)");
  }
  if (!o.top_k_set && gen.do_sample && s.temperature > 0) s.top_k = gen.top_k, taken.push_back(fmt::format("top_k {}", s.top_k));
  if (!o.top_p_set && gen.do_sample && s.temperature > 0) s.top_p = gen.top_p, taken.push_back(fmt::format("top_p {}", s.top_p));
  if (!taken.empty())
    std::fprintf(stderr, "weft-transformer: sampling %s, as %s/generation_config.json says (flags override)\n",
                 fmt::format("{}", fmt::join(taken, ", ")).c_str(), source.c_str());
  return s;
}

// --tokenizer (by default the tokenizer.json of the Hugging Face directory the model came from),
// checked against the model's vocabulary and the tokenizer its checkpoint records.
std::optional<apps::BpeTokenizer> sample_tokenizer(const SampleOptions& o, const LoadedModel& loaded,
                                                   const std::string& source) {
  const int64_t vocab = loaded.lm.cfg.vocab_size;
  std::optional<apps::BpeTokenizer> tok;
  std::string path = o.tokenizer;
  if (path.empty() && !source.empty() && std::filesystem::exists(source + "/tokenizer.json")) {
    path = source + "/tokenizer.json";
    std::fprintf(stderr, "weft-transformer: tokenizer %s (the model's; --tokenizer to give another)\n", path.c_str());
  }
  if (!path.empty()) {
    tok.emplace(path);
    WEFT_CHECK(tok->vocab_size() <= vocab, "transformer: --tokenizer {} has {} tokens, more than {}'s "
               "vocabulary of {}", path, tok->vocab_size(), o.checkpoint, vocab);
    if (auto recorded = loaded.recorded.find("tokenizer_sha256"); recorded != loaded.recorded.end()) {
      const std::string digest = apps::tokenizer_digest(path);
      WEFT_CHECK(recorded->second == digest, "transformer: --tokenizer {} is not the tokenizer {} was trained with "
                 "(sha256 {}, the checkpoint records {})", path, o.checkpoint, digest, recorded->second);
    }
  }
  WEFT_CHECK(o.ids || tok || vocab == 256, "transformer: {} has a vocabulary of {} tokens, not 256 bytes: "
             "give its --tokenizer (the tokenizer.json of the dataset it was trained on) or print token ids with --ids",
             o.checkpoint, vocab);
  return tok;
}

// The prompt's tokens: its bytes, or the tokenizer's encoding (with its special tokens, as
// `transformers` encodes a prompt, unless --no-special).
std::vector<int64_t> prompt_ids(const SampleOptions& o, const apps::BpeTokenizer* tok, int64_t vocab) {
  std::vector<int64_t> ids;
  if (tok) {
    for (int32_t id : tok->encode(o.prompt, !o.no_special)) ids.push_back(id);
  } else {
    for (unsigned char c : o.prompt) {
      WEFT_CHECK(int64_t(c) < vocab, "transformer: the prompt's byte {} is not a token of {}'s vocabulary "
                 "of {}", int(c), o.checkpoint, vocab);
      ids.push_back(c);
    }
  }
  WEFT_CHECK(!ids.empty(), "transformer: --prompt must not be empty (it starts the text)");
  return ids;
}

// --logits-out: the prompt's logits [T, vocab] (f32), as the model computes them in one forward.
void write_prompt_logits(nn::Module& model, const std::vector<int64_t>& ids, int64_t ctx, Device device,
                         const std::string& path, const Ranks& ranks) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t t = std::min<int64_t>(int64_t(ids.size()), ctx);
  Tensor x = empty({1, t}, {.dtype = kInt64});
  std::copy(ids.end() - t, ids.end(), x.data<int64_t>());
  Tensor logits = model(x.to(device)).select(0, 0).to(kCPU).to(kFloat32).contiguous();  // [t, vocab]
  if (ranks.lead()) save_safetensors(path, {{"logits", logits}}, {{"prompt_tokens", std::to_string(t)}});
}

int sample(const SampleOptions& o, const Ranks& ranks) {
  const Device device = apps::parse_device(o.device, "transformer");
  if (o.threads > 0) set_num_threads(o.threads);
  WEFT_CHECK(o.tokens >= 0, "transformer: --tokens must be non-negative");
  apps::check_outputs_apart({{"--logits-out", o.logits_out}, {"WEFT_TRACE", trace::file()}}, {{"--from", o.checkpoint}, {"--tokenizer", o.tokenizer}},
                            "transformer");
  LoadedModel loaded;
  const auto load_start = std::chrono::steady_clock::now();
  dist::agree(ranks.groups(), "transformer", [&] {
    const DType dtype = o.dtype == "bf16" ? kBFloat16 : kFloat32;
    if (!ranks.fsdp) {
      loaded = load_model(o.checkpoint, ranks.lead(), false, kCPU, dtype);
      loaded.lm.module->to(device);
    } else {
      loaded = load_model(o.checkpoint, ranks.lead(), true, device, dtype);
    }
  });
  if (ranks.lead())
    std::fprintf(stderr, "weft-transformer: loaded %s in %.2f s\n", o.checkpoint.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
  nn::Module& model = *loaded.lm.module;
  const apps::ModelConfig& cfg = loaded.lm.cfg;
  const std::string source = hf_source(o.checkpoint, loaded.recorded);
  const std::optional<apps::BpeTokenizer> tok = sample_tokenizer(o, loaded, source);
  const std::vector<int64_t> ids = prompt_ids(o, tok ? &*tok : nullptr, cfg.vocab_size);
  const apps::HfGenerationConfig gen = source.empty() ? apps::HfGenerationConfig{} : apps::read_hf_generation_config(source);
  nn::GenerateOptions g{.max_new_tokens = o.tokens,
                        .sampling = sampling_of(o, gen, source),
                        .seed = o.seed,
                        .eos = eos_ids(o.eos, tok ? &*tok : nullptr, cfg.vocab_size, gen, source),
                        .use_cache = !o.no_cache};
  if (ranks.fsdp)  // every rank takes rank 0's token, so all run the same steps and stop together
    g.agree = [](int64_t token) {
      Tensor t = full({1}, double(token), {.dtype = kFloat64});
      dist::world()->broadcast(t, 0)->wait();
      return int64_t(t.item());
    };
  if (!o.logits_out.empty()) write_prompt_logits(model, ids, cfg.ctx, device, o.logits_out, ranks);
  const bool print = ranks.lead();
  if (print && !o.ids) std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  std::string printed;
  auto on_token = [&](int64_t next) {
    if (!print) return;
    if (o.ids) {
      printed += (printed.empty() ? "" : ",") + std::to_string(next);
    } else if (tok) {  // the token's bytes as they come (a character may span tokens)
      const std::string b = next < tok->vocab_size() ? tok->bytes_of({int32_t(next)}, false, false) : std::string();
      std::fwrite(b.data(), 1, b.size(), stdout);
    } else {
      std::fputc(int(next), stdout);
    }
    std::fflush(stdout);
  };
  nn::GenerateStats st;
  nn::generate(model, ids, g, on_token, &st);
  if (!print) return 0;
  if (o.ids) std::fputs(printed.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double total = st.prefill_seconds + st.decode_seconds;
  if (st.new_tokens > 0)
    std::fprintf(stderr, "weft-transformer: %lld tokens in %.3f s (%.1f tokens/s; prompt of %lld tokens %.1f ms, then "
                 "%.1f tokens/s%s; %s)\n", (long long)st.new_tokens, total, double(st.new_tokens) / total,
                 (long long)st.prompt_tokens, 1e3 * st.prefill_seconds,
                 st.new_tokens > 1 ? double(st.new_tokens - 1) / st.decode_seconds : 0.0,
                 st.prefills > 1 ? fmt::format(", {} restart{} at a full context", st.prefills - 1, st.prefills > 2 ? "s" : "").c_str() : "",
                 o.no_cache ? "no cache" : fmt::format("key/value cache of {:.1f} MiB", double(st.cache_bytes) / (1 << 20)).c_str());
  return 0;
}

int export_hf(const ExportOptions& o) {
  const int64_t shard = parse_bytes(o.max_shard_size, "transformer: --max-shard-size");
  WEFT_CHECK(shard > 0, "transformer: --max-shard-size must be positive");
  apps::check_outputs_apart({{"--out", o.out}}, {{"--from", o.from}}, "transformer");
  const LoadedModel loaded = load_model(o.from, true);
  WEFT_CHECK(loaded.lora.rank > 0 || !o.merge, "transformer: {} has no LoRA adapters to --merge", o.from);
  WEFT_CHECK(loaded.lora.rank == 0 || o.merge, "transformer: {} holds LoRA adapters (rank {}): export-hf --merge folds "
             "them into the weights of a plain model", o.from, loaded.lora.rank);
  apps::LanguageModel merged;
  if (o.merge) {  // the plain model with W + (alpha / r) B A in each adapted weight
    merged = apps::make_model_to_load(loaded.lm.cfg);
    nn::materialize(*merged.module, kCPU);
    merged.module->load_state_dict(nn::merge_lora(loaded.lm.module->state_dict(), loaded.lora));
  }
  const apps::LanguageModel& lm = o.merge ? merged : loaded.lm;
  // The Hugging Face directory the model came from, whose tokenizer and generation files go along.
  std::string source = apps::is_hf_dir(o.from) ? o.from : "";
  if (auto it = loaded.recorded.find("hf_source"); it != loaded.recorded.end()) source = it->second;
  if (!source.empty() && !apps::is_hf_dir(source)) {
    std::fprintf(stderr, "weft-transformer: %s, the run's --init-from, is gone: its tokenizer and generation files "
                 "are not copied\n", source.c_str());
    source.clear();
  }
  apps::export_hf_checkpoint(lm, o.out, shard, o.dtype == "bf16" ? kBFloat16 : kFloat32, source);
  std::fprintf(stderr, "weft-transformer: wrote %s (Hugging Face model_type %s, %lld parameters, %s)\n", o.out.c_str(),
               (lm.cfg.family.empty() ? lm.cfg.arch : lm.cfg.family).c_str(),
               (long long)apps::count_parameters(*lm.module), o.dtype.c_str());
  return 0;
}

// prepare with JSONL records: a dataset of examples (apps/transformer/example_data.h).
int prepare_examples(const PrepareOptions& p) {
  const apps::PreparedExamples d =
      apps::prepare_examples(p.tokenizer, p.data, p.out, p.eos, 0.1, !p.no_special, p.chat_format);
  std::printf("prepared %s: %lld train and %lld val examples (%lld and %lld tokens, %lld of them trained) from %lld "
              "record(s) in %lld file(s) of %s\n", p.out.c_str(), (long long)d.train_examples,
              (long long)d.val_examples, (long long)d.train_tokens, (long long)d.val_tokens,
              (long long)d.trained_tokens, (long long)d.records, (long long)d.files, p.data.c_str());
  return 0;
}

// eval over a dataset of examples: every example of the split, the mean over its trained targets.
int eval_examples(const EvalOptions& o, nn::Module& model, const apps::TrainingData& data, int64_t ctx) {
  const bool train = o.split == "train";
  const apps::ExampleSet set(train ? data.train : data.val, train ? data.train_labels : data.val_labels, ctx,
                             data.files[train ? 0 : 1]);
  WEFT_CHECK(set.size() > 0, "transformer: no example of the {} part of {} has a target within --ctx {}", o.split,
             o.data, ctx);
  const apps::BlockLoss r = apps::example_loss(model, set, o.batch_size);
  WEFT_CHECK(std::isfinite(r.loss()), "transformer: the loss of {} on {} is {}", o.from, o.data,
             apps::describe_value(r.loss()));
  std::printf("loss %.6f perplexity %.4f tokens %lld\n", r.loss(), std::exp(r.loss()), (long long)r.tokens);
  std::fprintf(stderr, "weft-transformer: %s on the %s part of %s: %lld examples (%lld skipped: no target within "
               "--ctx %lld; %lld cut at it), %lld trained targets\n", o.from.c_str(), o.split.c_str(), o.data.c_str(),
               (long long)r.blocks, (long long)set.skipped(), (long long)ctx, (long long)set.truncated(),
               (long long)r.tokens);
  return 0;
}

// Loss, perplexity and token count of a model over a split of a dataset, in blocks of ctx + 1
// tokens (apps/transformer/block_eval.h).
int eval(const EvalOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const LoadedModel loaded = load_model(o.from, true);
  nn::Module& model = *loaded.lm.module;
  apps::TrainingData data;
  apps::load_training_data(o.data, data);
  const int64_t ctx = o.ctx > 0 ? o.ctx : loaded.lm.cfg.ctx, vocab = loaded.lm.cfg.vocab_size;
  WEFT_CHECK(ctx <= loaded.lm.cfg.ctx, "transformer: --ctx {} is longer than {}'s context {}", ctx, o.from,
             loaded.lm.cfg.ctx);
  WEFT_CHECK(vocab >= data.vocab_size, "transformer: {}'s vocabulary of {} is smaller than {}'s {}", o.from, vocab,
             o.data, data.vocab_size);
  if (data.examples()) return eval_examples(o, model, data, ctx);
  const apps::TokenView stream = o.split == "train" ? data.train : data.val;
  const int64_t blocks = apps::block_count(stream, ctx);
  WEFT_CHECK(blocks > 0, "transformer: the {} part of {} ({} tokens) is shorter than one block of --ctx + 1 = {}",
             o.split, o.data, stream.size(), ctx + 1);
  const apps::BlockLoss r = apps::block_loss(model, stream, ctx, 0, blocks, o.batch_size);
  WEFT_CHECK(std::isfinite(r.loss()), "transformer: the loss of {} on {} is {}", o.from, o.data,
             apps::describe_value(r.loss()));
  std::printf("loss %.6f perplexity %.4f tokens %lld\n", r.loss(), std::exp(r.loss()), (long long)r.tokens);
  std::fprintf(stderr, "weft-transformer: %s on the %s part of %s: %lld blocks of %lld + 1 tokens\n", o.from.c_str(),
               o.split.c_str(), o.data.c_str(), (long long)r.blocks, (long long)ctx);
  return 0;
}

// A LoRA run's adapters for peft: PeftModel.from_pretrained(base, OUT) on the run's --init-from.
int export_peft(const ExportOptions& o) {
  apps::check_outputs_apart({{"--out", o.out}}, {{"--from", o.from}}, "transformer");
  const LoadedModel loaded = load_model(o.from, true);
  WEFT_CHECK(loaded.lora.rank > 0, "transformer: {} holds no LoRA adapters (a train --lora-rank run's checkpoint has "
             "them)", o.from);
  const std::string base = hf_source(o.from, loaded.recorded);
  apps::export_peft_adapter(loaded.lm, loaded.lora, o.out, base.empty() ? "" : std::filesystem::absolute(base).string());
  std::fprintf(stderr, "weft-transformer: wrote %s (LoRA rank %lld on %s%s%s)\n", o.out.c_str(),
               (long long)loaded.lora.rank, apps::lora_fields(loaded.lora).at("lora_targets").c_str(),
               base.empty() ? ", no base directory recorded" : ", base ", base.c_str());
  return 0;
}

// train's flags for how a step runs: device, sharding, precision, determinism, NaN policy.
void add_step_flags(CLI::App* tr, TrainOptions& t) {
  tr->add_option("--device", t.device, "cpu, cuda (this rank's GPU) or cuda:N: where the model and batches live")
      ->capture_default_str();
  auto* det = tr->add_flag("--deterministic", t.deterministic, "the same bits at any number of ranks and threads: each step's batch "
               "split into --virtual-batches micro-batches, every sum over them in one fixed order (docs/FSDP.md)");
  tr->add_option("--virtual-batches", t.virtual_batches, "with --deterministic: micro-batches per step's batch; the "
                 "number of ranks must divide it into a power of two per rank")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str()->needs(det);
  tr->add_flag("--pack", t.pack, "a dataset of examples (prepare of JSONL): several examples per row, each attending "
               "to itself only, its positions from 0 (without: one example per row, padded)");
  auto* ac_full = tr->add_flag("--activation-checkpointing", t.ac_full, "--ac full");
  tr->add_option("--ac", t.ac, "activation checkpointing of each block: none, selective (keep the outputs of its "
                 "GEMMs and attention, recompute the element-wise ops and norms in backward) or full (keep its input "
                 "only, recompute its whole forward)")->check(CLI::IsMember({"none", "selective", "full"}))
      ->capture_default_str()->excludes(ac_full);
  apps::add_plan_flags(*tr, t.plan);
  tr->add_flag("--fsdp", t.fsdp, "shard over the ranks of mpirun: fully_shard per block, then the root");
  tr->add_option("--tp", t.tp, "under --fsdp: split each layer over N consecutive ranks (tensor parallel), "
                 "fully_shard over the world / N data-parallel groups")->check(apps::cli::integer(1, 1024))
      ->capture_default_str();
  tr->add_option("--reshard-after-forward", t.reshard_after_forward,
                 "under --fsdp: free each block's gathered parameters after forward (true), keep them for "
                 "backward (false), or keep 1/N per rank and gather within groups of N ranks (N)")
      ->check(CLI::IsMember({"true", "false"}) | apps::cli::integer(1, 1 << 20))->capture_default_str();
  tr->add_option("--sharding-strategy", t.sharding_strategy,
                 "under --fsdp: FULL_SHARD (parameters, gradients and optimizer state sharded), SHARD_GRAD_OP "
                 "(parameters kept gathered from forward to backward) or NO_SHARD (every rank holds the whole "
                 "model; gradients all-reduced, as DDP)")
      ->check(CLI::IsMember({"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"}))->capture_default_str();
  tr->add_option("--mixed-precision", t.mixed_precision,
                 "bf16: linear layers and attention in bf16 with f32 master weights (autocast; under --fsdp: "
                 "bf16 parameters gathered, gradients reduced in f32); none keeps f32")
      ->check(CLI::IsMember({"bf16", "none"}))->capture_default_str();
  tr->add_option("--on-nan", t.on_nan, "when the loss is NaN or infinite: error (stop), skip (drop that step's "
                 "update) or ignore (train on)")->check(CLI::IsMember({"error", "skip", "ignore"}))->capture_default_str();
  tr->add_option("--max-skipped-steps", t.max_skipped, "with --on-nan skip: give up (exit 1) after "
                 "N skipped steps in a row")->check(apps::cli::integer(1, 1000000))->capture_default_str();
  tr->footer(
      "Sharded training: mpirun -np N --oversubscribe --bind-to none weft-transformer train --fsdp ...\n"
      "  --batch-size stays the global batch (a multiple of N): rank r trains on rows [r*B/N, (r+1)*B/N)\n"
      "  of the same batch, so the losses match a single-process run up to float rounding.");
}

// train's model flags: the family and its shape, or --init-from's.
void add_model_flags(CLI::App* tr, TrainOptions& t) {
  auto* arch = tr->add_option("--arch", t.model.arch, "model family: gpt2 (learned positions, LayerNorm, GELU, tied "
                              "head) or llama (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head)")
                   ->check(CLI::IsMember({"gpt2", "llama"}))->capture_default_str();
  auto* init_from = tr->add_option("--init-from", t.init_from, "start from a Hugging Face model directory (config.json "
                                   "+ safetensors, model_type gpt2 or llama): its config and weights");
  std::vector<CLI::Option*> shape_flags;
  shape_flags.push_back(tr->add_option("--n-layer", t.model.n_layer, "transformer blocks")->check(apps::cli::integer(1, apps::kMaxLayers))->capture_default_str());
  shape_flags.push_back(tr->add_option("--n-head", t.model.n_head, "attention heads (must divide --d-model)")->check(apps::cli::integer(1, apps::kMaxHeads))
      ->capture_default_str());
  shape_flags.push_back(tr->add_option("--n-kv-head", t.model.n_kv_head, "llama: key/value heads, dividing --n-head (0: as many as "
                 "--n-head)")->check(apps::cli::integer(0, apps::kMaxHeads))->capture_default_str());
  shape_flags.push_back(tr->add_option("--d-model", t.model.d_model, "embedding width")->check(apps::cli::integer(1, apps::kMaxDModel))->capture_default_str());
  shape_flags.push_back(tr->add_option("--ffn-dim", t.model.ffn_dim, "the MLP's hidden width (0: gpt2 4 x --d-model, llama 8/3 x "
                 "--d-model rounded up to a multiple of 32)")->check(apps::cli::integer(0, 16 * apps::kMaxDModel))->capture_default_str());
  shape_flags.push_back(tr->add_option("--rope-theta", t.model.rope_theta, "llama: the rotary embeddings' base")
      ->check(apps::cli::number_above(0))->capture_default_str());
  tr->add_option("--ctx", t.model.ctx, "context length in bytes")->check(apps::cli::integer(1, apps::kMaxCtx))->capture_default_str();
  tr->add_option("--dropout", t.model.dropout, "dropout probability")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  auto* untie = tr->add_flag("--untie", t.untie, "give the LM head its own weight instead of sharing the token "
                             "embedding (llama is untied unless --tie)");
  shape_flags.push_back(untie);
  auto* tie_flag = tr->add_flag("--tie", t.tie, "llama: share the token embedding with the LM head")->excludes(untie);
  shape_flags.push_back(tie_flag);
  shape_flags.push_back(arch);
  for (CLI::Option* f : shape_flags) f->excludes(init_from);
}

// train's LoRA flags (nn/lora.h): adapters on the blocks' linear layers, the rest frozen.
void add_lora_flags(CLI::App* tr, TrainOptions& t) {
  auto* rank = tr->add_option("--lora-rank", t.lora.rank, "train LoRA adapters of this rank on the blocks' linear "
                              "layers, every other parameter frozen (0: train every parameter)")
                   ->check(apps::cli::integer(0, 1 << 16))->capture_default_str();
  tr->add_option("--lora-alpha", t.lora.alpha, "the adapters' term is scaled by alpha / rank (default: the rank)")
      ->check(apps::cli::number_above(0))->needs(rank);
  tr->add_option("--lora-dropout", t.lora.dropout, "dropout on the adapters' input, in training")
      ->check(apps::cli::number_in_half_open(0, 1))->needs(rank);
  tr->add_option("--lora-targets", t.lora_targets, "comma-separated names of the modules to adapt (default: every "
                 "linear layer of the blocks: llama q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; gpt2 "
                 "c_attn,c_proj,c_fc)")->needs(rank);
  tr->add_option("--base-dtype", t.base_dtype, "with --lora-rank and --init-from: the frozen base's dtype (bf16 halves "
                 "its memory; the adapters and their optimizer state stay f32; needs --mixed-precision bf16)")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
}

// train's flags: the model, the batches and schedule, checkpoints, and how the step runs.
CLI::App* add_train_flags(CLI::App& app, TrainOptions& t) {
  auto* tr = app.add_subcommand("train", "train a decoder on the bytes of a text file or folder");
  add_model_flags(tr, t);
  add_lora_flags(tr, t);
  tr->add_option("--batch-size", t.batch_size, "sequences per micro-step (the global batch under --fsdp)")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str();
  tr->add_option("--grad-accum", t.grad_accum, "micro-steps accumulated per optimizer step")->check(apps::cli::integer(1, 1 << 20))
      ->capture_default_str();
  tr->add_option("--steps", t.steps, "optimizer steps in all (the schedule's length)")
      ->check(apps::cli::integer(1, int64_t(1) << 40))->capture_default_str();
  tr->add_option("--lr", t.lr, "peak learning rate")->check(apps::cli::number_above(0))->capture_default_str();
  tr->add_option("--warmup", t.warmup, "linear warmup steps before the cosine decay")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->capture_default_str();
  tr->add_option("--weight-decay", t.weight_decay, "AdamW decay on 2-D weights (matmuls and embeddings; never biases "
                 "or norm weights)")->check(apps::cli::number_from(0, 1e6))->capture_default_str();
  tr->add_option("--lr-schedule", t.lr_schedule, "after the linear warmup: cosine or linear decay to --min-lr at "
                 "--steps, constant, or wsd (warmup-stable-decay: constant, then linear to --min-lr over the last "
                 "--decay-steps)")->check(CLI::IsMember({"cosine", "linear", "constant", "wsd"}))->capture_default_str();
  tr->add_option("--min-lr", t.min_lr, "the learning rate the decay ends at (default: 0.1 x --lr)")
      ->check(apps::cli::number_from(0, 1e6));
  tr->add_option("--decay-steps", t.decay_steps, "--lr-schedule wsd: the final decay's steps (default: a fifth of "
                 "--steps)")->check(apps::cli::integer(1, int64_t(1) << 40));
  tr->add_option("--beta1", t.beta1, "AdamW's beta1")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  tr->add_option("--beta2", t.beta2, "AdamW's beta2")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  tr->add_option("--eps", t.eps, "AdamW's epsilon")->check(apps::cli::number_above(0))->capture_default_str();
  tr->add_option("--clip", t.clip, "gradient norm clip (0: none)")->check(apps::cli::number_from(0, 1e30))->capture_default_str();
  tr->add_option("--seed", t.seed, "seed for initialisation and batches")->check(apps::cli::seed())->capture_default_str();
  tr->add_option("--threads", t.threads, "CPU threads per rank (default: OMP_NUM_THREADS or all cores)")
      ->check(apps::cli::threads());
  tr->add_option("--metrics", t.metrics, "append JSONL metrics to FILE (rank 0 writes)");
  tr->add_option("--data", t.data, "text file or folder of text files")->capture_default_str();
  tr->add_option("--eval-every", t.eval_every, "steps between validation losses (0: only at the end)")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->capture_default_str();
  tr->add_option("--eval-iters", t.eval_iters, "validation batches per evaluation")->check(apps::cli::integer(1, 1000000))
      ->capture_default_str();
  tr->add_option("--log-every", t.log_every, "steps between metrics lines")->check(apps::cli::integer(1, int64_t(1) << 40))
      ->capture_default_str();
  tr->add_option("--profile", t.profile, "time every op of the steps from step N on (the lead rank's thread; on a GPU "
                 "each op alone) and print a table of them after the run: calls, milliseconds, share of a step, rates")
      ->check(apps::cli::integer(1, int64_t(1) << 40));
  tr->add_option("--stop-after", t.stop_after, "end this run after N steps, keeping the --steps schedule (for --resume)")
      ->check(apps::cli::integer(1, int64_t(1) << 40));
  auto* ck_dir = tr->add_option("--checkpoint-dir", t.checkpoint_dir,
                                "save model, optimizer, RNG and data position to DIR/step_<N>/ (one file per rank + "
                                "index.json); one run at a time may write DIR");
  tr->add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->needs(ck_dir);
  tr->add_option("--keep-last", t.keep_last, "keep only the K newest checkpoints in --checkpoint-dir (0: all), and "
                 "besides them the one with the lowest training loss")
      ->check(apps::cli::integer(0, 1000000))->capture_default_str()->needs(ck_dir);
  tr->add_option("--resume", t.resume, "continue from the latest checkpoint in DIR (written at any number of ranks)");
  tr->add_flag(apps::kOverwriteCheckpointsFlag, t.overwrite_checkpoints, "let this run replace the checkpoints "
               "another run wrote to --checkpoint-dir (removed at its first save)")->needs(ck_dir);
  add_step_flags(tr, t);
  return tr;
}
CLI::App* add_sample_flags(CLI::App& app, SampleOptions& s) {
  auto* sa = app.add_subcommand("sample", "generate text from a checkpoint or a Hugging Face model");
  sa->add_option("--from,--checkpoint", s.checkpoint, "a Hugging Face model directory, a checkpoint directory (the "
                 "latest in it) or a consolidated .safetensors file")->required();
  sa->add_option("--prompt", s.prompt, "text to continue (its bytes are the token ids, or --tokenizer's encoding)")->capture_default_str();
  sa->add_option("--tokens,--max-new-tokens", s.tokens, "tokens to generate")
      ->check(apps::cli::integer(0, apps::kMaxSampleTokens))->capture_default_str();
  auto* temperature = sa->add_option("--temperature", s.temperature, "softmax temperature (0: greedy)")
                          ->check(apps::cli::number_from(0, 1e6))->capture_default_str();
  sa->add_flag("--greedy", s.greedy, "always take the most likely token (--temperature 0)")->excludes(temperature);
  sa->add_flag("--ids", s.ids, "print the generated token ids, comma-separated, on one line, instead of text");
  sa->add_option("--tokenizer", s.tokenizer, "tokenizer.json to encode the prompt and decode the output with (a "
                 "model trained on a prepared dataset: its DIR/tokenizer.json; default: the tokenizer.json of the "
                 "Hugging Face directory the model came from, if any)");
  sa->add_flag("--no-special", s.no_special, "encode the prompt without the tokenizer's special tokens (the BOS its "
               "post-processor puts first)");
  sa->add_option("--logits-out", s.logits_out, "write the prompt's logits [T, vocab] (f32) to FILE.safetensors");
  sa->add_option("--top-k", s.top_k, "draw from the K most likely tokens only (0: all)")
      ->check(apps::cli::integer(0, 1 << 20))->capture_default_str();
  sa->add_option("--top-p", s.top_p, "then from the fewest most likely tokens whose probability reaches P (1: all)")
      ->check(apps::cli::number_from(1e-9, 1))->capture_default_str();
  sa->add_option("--eos", s.eos, "stop after generating this token: an id, a token of --tokenizer, or none (default: "
                 "the eos ids of the model's Hugging Face generation_config.json, if any)");
  sa->add_flag("--no-cache", s.no_cache, "run the whole window again for every token instead of keeping each layer's "
               "keys and values");
  sa->add_flag("--fsdp", s.fsdp, "shard the model over the ranks of mpirun (fully_shard per block, then the root); "
               "rank 0 prints");
  sa->add_option("--seed", s.seed, "seed for drawing")->check(apps::cli::seed())->capture_default_str();
  sa->add_option("--threads", s.threads, "CPU threads")->check(apps::cli::threads());
  sa->add_option("--device", s.device, "cpu, cuda or cuda:N: where the model runs")->capture_default_str();
  sa->add_option("--dtype", s.dtype, "the weights' dtype, and so the computation's: f32, or bf16 (half the bytes "
                 "read per token)")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  return sa;
}

CLI::App* add_export_flags(CLI::App& app, ExportOptions& x) {
  auto* ex = app.add_subcommand("export-hf", "write a checkpoint as a Hugging Face model directory (config.json + "
                                 "safetensors) that transformers' from_pretrained loads");
  ex->add_option("--from", x.from, "checkpoint directory (the latest in it, written at any number of ranks) or a "
                 "consolidated .safetensors file")->required();
  ex->add_option("--out", x.out, "the directory to write (must not exist)")->required();
  ex->add_option("--max-shard-size", x.max_shard_size, "split the weights into files of at most this many bytes "
                 "(with model.safetensors.index.json) when they are larger")->check(apps::cli::bytes())->capture_default_str();
  ex->add_option("--dtype", x.dtype, "the weights' dtype in the files: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  ex->add_flag("--merge", x.merge, "a LoRA run's checkpoint: fold each adapter into its weight, W + (alpha / r) B A, "
               "and write the plain model");
  return ex;
}

CLI::App* add_eval_flags(CLI::App& app, EvalOptions& ev) {
  CLI::App* evc = app.add_subcommand("eval", "a model's loss, perplexity and token count on a dataset's validation "
                                     "(or training) part");
  evc->add_option("--from", ev.from, "a Hugging Face model directory, a checkpoint directory (the latest in it) or a "
                  "consolidated .safetensors file")->required();
  evc->add_option("--data", ev.data, "text file or folder of text files, or a prepared token dataset")->capture_default_str();
  evc->add_option("--split", ev.split, "val: the part training validates on (the last tenth of a text, a dataset's "
                  "val.tokens); train: the rest")->check(CLI::IsMember({"val", "train"}))->capture_default_str();
  evc->add_option("--ctx", ev.ctx, "tokens each block predicts (blocks of ctx + 1 tokens; default: the model's "
                  "context)")->check(apps::cli::integer(1, apps::kMaxCtx));
  evc->add_option("--batch-size", ev.batch_size, "blocks per forward")->check(apps::cli::integer(1, 1 << 20))
      ->capture_default_str();
  evc->add_option("--threads", ev.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")->check(apps::cli::threads());
  return evc;
}

CLI::App* add_peft_flags(CLI::App& app, ExportOptions& px) {
  CLI::App* pe = app.add_subcommand("export-peft", "write a LoRA run's adapters as a Hugging Face peft adapter "
                                    "directory (adapter_config.json + adapter_model.safetensors)");
  pe->add_option("--from", px.from, "a checkpoint directory of a train --lora-rank run (the latest in it) or its "
                 "consolidated .safetensors file")->required();
  pe->add_option("--out", px.out, "the directory to write (must not exist)")->required();
  return pe;
}

CLI::App* add_prepare_flags(CLI::App& app, PrepareOptions& p) {
  auto* pr = app.add_subcommand("prepare", "tokenize text files with a BPE tokenizer.json into a dataset directory "
                                 "(train.tokens, val.tokens, tokenizer.json)");
  pr->add_option("--tokenizer", p.tokenizer, "tokenizer.json (Hugging Face tokenizers format, byte-level BPE)")
      ->required();
  pr->add_option("--data", p.data, "text file or folder of text files; or a .jsonl file or folder of them, one "
                 "example per line: {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\": [{\"role\", "
                 "\"content\"}, ...]} (only completions and assistant messages carry loss)")->capture_default_str();
  pr->add_option("--out", p.out, "the dataset directory to write (created; its dataset files replaced)")->required();
  pr->add_option("--eos", p.eos, "token put after each file, or each text or completion record (\"\" for none; an "
                 "error if the tokenizer lacks it)")->capture_default_str();
  pr->add_option("--chat-format", p.chat_format, "how \"messages\" are rendered: llama3, chatml or mistral (default: "
                 "recognised from the tokenizer's chat_template)");
  pr->add_flag("--no-special", p.no_special, "leave out the special tokens the tokenizer's post-processor puts "
               "around each file (Llama's BOS)");
  return pr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-transformer: train a byte-level decoder (GPT-2 or Llama) on text, sample from it, export it"};
  app.require_subcommand(1);
  TrainOptions t;
  SampleOptions s;
  ExportOptions x;
  PrepareOptions p;
  CLI::App* tr = add_train_flags(app, t);
  CLI::App* sa = add_sample_flags(app, s);
  CLI::App* ex = add_export_flags(app, x);
  ExportOptions px;
  EvalOptions ev;
  CLI::App* evc = add_eval_flags(app, ev);
  CLI::App* pe = add_peft_flags(app, px);
  CLI::App* pr = add_prepare_flags(app, p);
  // A first word that is neither a flag nor a command is named (CLI11 would only say that a
  // subcommand is required).
  const std::string first = argc > 1 ? argv[1] : "";
  if (argc > 1 && first[0] != '-' && first != "train" && first != "sample" && first != "export-hf" &&
      first != "export-peft" && first != "eval" && first != "prepare") {
    std::fprintf(stderr, "weft-transformer: unknown command \"%s\" (the commands are train, sample, eval, export-hf, "
                 "export-peft and prepare; see --help)\n", argv[1]);
    return 2;
  }
  CLI11_PARSE(app, argc, argv);
  if (s.greedy) s.temperature = 0;
  s.temperature_set = s.greedy || sa->get_option("--temperature")->count() > 0;
  s.top_k_set = sa->get_option("--top-k")->count() > 0, s.top_p_set = sa->get_option("--top-p")->count() > 0;
  t.checkpointing = t.ac_full ? nn::Checkpointing::full : nn::parse_checkpointing(t.ac, "--ac");
  if (t.model.arch == "llama") t.untie = t.untie || !t.tie;  // Llama's head is untied by default
  else if (t.tie || tr->get_option("--rope-theta")->count() > 0) {  // flags GPT-2 would ignore
    std::fprintf(stderr, "weft-transformer: %s is for --arch llama (%s)\n", t.tie ? "--tie" : "--rope-theta",
                 t.tie ? "GPT-2's head is tied unless --untie" : "GPT-2 learns its positions: no rotary embeddings");
    return 2;
  }

  return dist::run_program("weft-transformer", [&] {
    if (sa->parsed()) {
      const Ranks ranks = apps::start_ranks("weft-transformer", s.fsdp, {{"command", "sample"}},
                                            {{"--from", s.checkpoint}, {"--prompt", s.prompt},
                                             {"--tokens", std::to_string(s.tokens)}, {"--seed", std::to_string(s.seed)},
                                             {"--eos", s.eos}, {"--tokenizer", s.tokenizer},
                                             {"--no-special", s.no_special ? "1" : "0"}});
      return sample(s, ranks);
    }
    if (ex->parsed()) {
      apps::start_ranks("weft-transformer", false, {{"command", "export-hf"}}, {});
      return export_hf(x);
    }
    if (evc->parsed()) {
      apps::start_ranks("weft-transformer", false, {{"command", "eval"}}, {});
      return eval(ev);
    }
    if (pe->parsed()) {
      apps::start_ranks("weft-transformer", false, {{"command", "export-peft"}}, {});
      return export_peft(px);
    }
    if (pr->parsed()) {
      apps::start_ranks("weft-transformer", false, {{"command", "prepare"}}, {});
      apps::check_outputs_apart({{"--out", p.out}}, {{"--tokenizer", p.tokenizer}, {"--data", p.data}}, "transformer");
      if (apps::is_jsonl_data(p.data)) return prepare_examples(p);
      WEFT_CHECK(p.chat_format.empty(), "transformer: --chat-format renders the \"messages\" of JSONL records, and {} "
                 "is text", p.data);
      const apps::PreparedData d = apps::prepare_tokens(p.tokenizer, p.data, p.out, p.eos, 0.1, !p.no_special);
      std::printf("prepared %s: %lld train and %lld val tokens from %lld bytes in %lld file(s) of %s\n", p.out.c_str(),
                  (long long)d.train_tokens, (long long)d.val_tokens, (long long)d.bytes, (long long)d.files,
                  p.data.c_str());
      return 0;
    }
    WEFT_CHECK(tr->get_option("--max-skipped-steps")->count() == 0 || t.on_nan == "skip", "transformer: --max-skipped-steps applies to --on-nan "
               "skip only (--on-nan is {})", t.on_nan);
    Ranks ranks = apps::start_ranks("weft-transformer", t.fsdp, {{"command", "train"}}, shared_settings(t));
    if (ranks.fsdp) ranks.tp = t.tp;
    return train(t, ranks);
  });
}
