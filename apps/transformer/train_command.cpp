// apps/transformer: `weft-transformer train`: a decoder (GPT-2 or Llama) trained on text or a prepared dataset, in one
// process or, with --fsdp, sharded over the ranks mpirun starts (one FSDP group per block, then the root), from scratch
// or from a Hugging Face checkpoint (--init-from), with LoRA adapters (--lora-rank); the loop is apps/common's Trainer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <memory>
#include <optional>

#include "apps/common/cli.h"
#include "apps/common/checkpoint_owner.h"
#include "apps/common/deterministic.h"
#include "apps/common/device.h"
#include "apps/common/metrics.h"
#include "apps/common/nonfinite.h"
#include "apps/common/output_paths.h"
#include "apps/common/resume.h"
#include "apps/common/trainer.h"
#include "apps/transformer/block_eval.h"
#include "apps/transformer/checkpoint_description.h"
#include "apps/transformer/commands.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/lora_settings.h"
#include "apps/transformer/peft_adapter.h"
#include "apps/transformer/tensor_parallel.h"
#include "apps/transformer/token_data.h"
#include "core/sha256.h"
#include "core/step_trace.h"
#include "core/trace.h"
#include "weft.h"

namespace weft::apps::transformer {

namespace {

constexpr uint64_t kValSeedOffset = 0x5eed0000ull;  // val batches: a stream apart from training's

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

// The model config, what decides the batches (seed, batch size, accumulation, the training
// text) and the weight decay (restored with the optimizer state): resuming checks these.
std::map<std::string, std::string> describe(const apps::ModelConfig& cfg, const TrainOptions& o,
                                            const std::map<std::string, std::string>& train_text) {
  std::map<std::string, std::string> d = model_fields(cfg);
  d.insert({{"format", kCheckpointFormat}, {"seed", std::to_string(o.seed)}, {"batch_size", std::to_string(o.batch_size)},
            {"grad_accum", std::to_string(o.grad_accum)}, {"weight_decay", fmt::format("{}", o.weight_decay)},
            {"beta1", fmt::format("{}", o.beta1)}, {"beta2", fmt::format("{}", o.beta2)}, {"eps", fmt::format("{}", o.eps)},
            {"virtual_batches", o.deterministic ? std::to_string(o.virtual_batches) : "0"},
            {"dropout", fmt::format("{}", cfg.dropout)}});  // not a model field: a resume may change it; export writes it
  d.insert(train_text.begin(), train_text.end());
  for (auto& [k, v] : apps::lora_fields(o.lora)) d[k] = v;
  if (o.base_elsewhere()) d["lora_base_sha256"] = o.base_digest;
  if (o.pack) d["pack"] = "1";
  if (o.base_dtype != "f32") d["base_dtype"] = o.base_dtype;
  if (!o.init_from.empty()) d["hf_source"] = WEFT_FS(std::filesystem::absolute(o.init_from)).string();  // export-hf's side files
  else if (!o.source.empty()) d["hf_source"] = o.source;
  return d;
}

// ---- FSDP: one group per block, then the root (embeddings, ln_f, head).

// A block's LoRA adapters (lora_A and lora_B of each adapted layer).
std::vector<nn::ModulePtr> lora_modules(nn::Module& block) {
  std::vector<nn::ModulePtr> out;
  for (auto& [name, m] : block.named_modules())
    if (name.ends_with("lora_A") || name.ends_with("lora_B")) out.push_back(m);
  return out;
}

// --reshard-after-forward applies to the blocks; the root keeps FSDP2's default (its parameters are needed again at
// once by backward). Under bf16 mixed precision parameters are gathered and used in bf16, gradients reduced in f32, and
// the logits come out in f32 for the loss. The model is on the meta device: its shards are allocated and initialised on
// `device`'s mesh, or on `mesh` when given (a memory plan's). `per_block`, when given, is each block's
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

// The rows a planned step trains and evaluates on. Text's hold ctx tokens. A dataset of examples pads each batch to its
// longest row, so the peak is reached at the batch holding the longest unit: the plan's rows are that long, and packed,
// each holds that unit's documents (docs/MEMORY_SCALING.md, "Rows of examples").
struct PlannedRows {
  int64_t train = 0, val = 0;
  std::vector<int64_t> documents;  // packed: the inputs of each document of a training row
  bool examples = false;           // the loss is summed over the targets that carry it
};

PlannedRows planned_rows(const TrainOptions& o, const std::optional<apps::ExampleSet>& train,
                         const std::optional<apps::ExampleSet>& val) {
  if (!train) return {.train = o.model.ctx, .val = o.model.ctx};
  const std::vector<int64_t> row = train->longest_row(), val_row = val->longest_row();
  return {.train = std::accumulate(row.begin(), row.end(), int64_t(0)),
          .val = std::accumulate(val_row.begin(), val_row.end(), int64_t(0)),
          .documents = train->packed() ? row : std::vector<int64_t>{}, .examples = true};
}

// `n` rows of the planned documents, for the meta positions of a planned step (null: not packed).
std::shared_ptr<const nn::Documents> planned_documents(const PlannedRows& p, int64_t n) {
  if (p.documents.empty()) return nullptr;
  auto d = std::make_shared<nn::Documents>();
  std::vector<std::pair<int64_t, int64_t>> row;
  for (int64_t at = 0; int64_t length : p.documents) row.push_back({at, at + length}), at += length;
  d->rows.assign(size_t(n), row);
  return d;
}

// `init_on`: the device the --init-from weights are read onto, when the run reads them.
fsdp::MemoryPlanRequest plan_request(const TrainOptions& o, bool fsdp, const PlannedRows& planned,
                                     std::optional<Device> init_on) {
  fsdp::MemoryPlanRequest r;
  auto load = std::make_shared<int64_t>(0);
  if (init_on && o.tp == 1) r.load_bytes = [load] { return *load; };
  if (o.tp > 1) r.load_bytes = [load] { return *load - memory_stats(Device::meta()).live_bytes; };  // beside the parts
  r.sharded = fsdp;
  r.tunable_groups = fsdp ? int(o.model.n_layer) : 0;
  r.can_checkpoint = true;
  r.settings.activation_checkpointing = o.checkpointing;
  r.settings.reshard_after_forward.assign(size_t(r.tunable_groups), o.reshard_after_forward == "true");
  if (o.ac_given()) r.fixed_checkpointing = o.checkpointing;  // a budget chooses only what the flags leave open
  if (o.reshard_given) r.fixed_reshard = o.reshard_after_forward == "true";
  r.setup = [o, planned, load, init_on](const fsdp::PlanSettings& s, const std::shared_ptr<dist::DeviceMesh>& mesh) -> fsdp::TrainingStep {
    manual_seed(o.seed);
    const apps::LanguageModel lm = apps::make_model(o.model);
    apps::init_model(lm);
    apps::add_lora(lm, o.lora, false);
    const apps::TensorParallel tp = o.tp > 1 ? apps::planned_tensor_parallel(o.model, o.tp, !planned.examples) : apps::TensorParallel{};
    if (o.base_dtype == "bf16") nn::cast_frozen(*lm.module, kBFloat16);
    if (o.tp > 1) {  // every rank holds the whole model, reads its values and splits it (its parts beside it) first
      int64_t largest = 0;  // the part made beside it before the whole of that parameter goes
      for (const Tensor& p : lm.module->parameters()) largest = std::max(largest, int64_t(p.nbytes()) / o.tp);
      *load = memory_stats(Device::meta()).live_bytes +
              std::max(init_on ? apps::hf_load_bytes(o.init_from, lm, nullptr, *init_on) : 0, largest);
      apps::parallelize(lm, tp);  // the shapes of this rank's parts (mesh: the data-parallel ranks)
    }
    const std::shared_ptr<nn::Module> model = lm.module;
    const auto decay = decayed_names(*model);
    for (auto& block : lm.blocks) block->set_checkpointing(s.activation_checkpointing);
    std::optional<fsdp::FSDPModule> root;
    if (mesh) root = shard_model(lm, o, Device::meta(), mesh, s.reshard_after_forward);
    if (init_on && o.tp == 1) *load = apps::hf_load_bytes(o.init_from, lm, root ? &*root : nullptr, *init_on);
    std::shared_ptr<nn::AdamW> opt = make_optimizer(*model, decay, o);
    const int world = mesh ? mesh->size(0) : 1;
    int64_t rows = o.batch_size / world;
    std::optional<apps::LeafPlan> leaves;  // --deterministic: rank 0's leaves, as the step runs them
    if (o.deterministic) {
      leaves = apps::make_leaf_plan("transformer", o.virtual_batches, o.batch_size, o.grad_accum, world, 0);
      rows = o.batch_size / o.virtual_batches;  // a leaf's, and an evaluation's part
    }
    return [model, opt, root, leaves, o, rows, planned, loss = apps::tensor_parallel_loss(tp)]() mutable {
      auto tokens = [&](int64_t n, int64_t T) { return empty({n, T}, {.dtype = kInt64}); };
      auto backward = [&](int64_t n, int64_t parts) {  // as a batch of the data's longest rows
        const Tensor x = tokens(n, planned.train), y = tokens(n, planned.train);
        const Tensor positions = planned.documents.empty() ? Tensor() : tokens(n, planned.train);
        nn::MetaDocuments layout(planned_documents(planned, n));
        // Examples: the loss summed, times a scale (not 1, which would skip the product and its gradient).
        apps::forward_backward(*model, x, y, o.autocast(), parts, planned.examples ? 0.5 : 0, positions, loss);
      };
      opt->zero_grad();
      nn::TreeSum tree;
      if (leaves)
        apps::run_leaves(*leaves, o.batch_size, root ? &*root : nullptr, tree, model->parameters(),
                         [&](int64_t, int64_t lo, int64_t hi) { backward(hi - lo, leaves->leaves()); });
      // The second micro-step reaches the peak the others repeat: all run only for --step-time's record of the step.
      for (int64_t micro = 0; !leaves && micro < (step_trace::recording() ? o.grad_accum : std::min<int64_t>(o.grad_accum, 2)); ++micro)
        backward(rows, o.grad_accum);
      if (o.clip > 0) nn::clip_grad_norm_(model->parameters(), o.clip);
      opt->step();
      NoGradGuard no_grad;  // an evaluation batch, as between the steps of train()
      step_trace::Pause not_timed;  // memory only: the step-time model times the training step
      AutocastGuard bf16(DType::bf16, o.autocast());
      model->eval();
      Tensor x = tokens(rows, planned.val), y = tokens(rows, planned.val), logits = (*model)(x);
      apps::loss_of(loss, logits.view({-1, logits.size(-1)}), y.view({-1}),
                    {.reduction = planned.examples ? "sum" : "mean"});
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

// Mean validation loss over `iters` fixed batches (the same ones at every evaluation and any world size); each rank
// evaluates its rows and the means are averaged over ranks. With --deterministic each batch goes as the rank's virtual
// micro-batches, their losses averaged in one order at any world size. A dataset of examples: each example at most once
// (all of them when the batches hold them: as many batches as that takes), the mean over the targets that carry loss.
double validation_loss(nn::Module& model, const Run& run, const TrainOptions& o, const Ranks& ranks,
                const std::optional<apps::LeafPlan>& leaves) {
  NoGradGuard no_grad;
  AutocastGuard bf16(DType::bf16, o.autocast());
  model.eval();
  double total = 0;
  std::vector<double> ordered;
  const apps::ExampleSet* examples = run.val_examples ? &*run.val_examples : nullptr;
  const int64_t iters = examples ? std::min(o.eval_iters, (examples->size() + o.batch_size - 1) / o.batch_size)
                                 : o.eval_iters;
  auto picked = [&](int64_t i) { return examples->draw_once(o.seed + kValSeedOffset, i, o.batch_size); };
  double share = 0;  // examples: a part's loss sum times share is its part of the mean over all targets
  for (int64_t i = 0; examples && i < iters; ++i) share += double(examples->targets(picked(i)));
  if (examples) share = double(iters * (leaves ? leaves->per_rank : 1) * ranks.data_world()) / share;
  const apps::LossFn loss_fn = apps::tensor_parallel_loss(run.tp);
  for (int64_t i = 0; i < iters; ++i) {
    auto loss = [&](int64_t lo, int64_t hi) {
      apps::ExampleRows r;  // validation examples are not packed
      if (examples) r = examples->rows(picked(i), lo, hi);
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
  if (leaves) return apps::ordered_mean(ordered, iters, ranks);
  return mean_over_ranks(total / double(iters), ranks);
}

// --resume without --init-from or a shape flag: the model is the one the checkpoint describes (--ctx, if given, must
// be its context: find_resume checks every field).
void take_resume_config(TrainOptions& o) {
  const std::string where = apps::readable_checkpoint(o.resume, "transformer", false);
  if (where.empty()) return;  // find_resume says so
  const std::map<std::string, std::string> app = fsdp::read_checkpoint_index(where).training.app;
  apps::ModelConfig c = config_of(app, where);
  c.dropout = o.model.dropout, c.ctx = o.ctx_given ? o.model.ctx : c.ctx;
  o.model = c, o.untie = !c.tie_weights;
  if (auto it = app.find("hf_source"); it != app.end()) o.source = it->second;
}

// --init-from: the model is the checkpoint's; --ctx may shorten its context.
void take_init_config(TrainOptions& o) {
  WEFT_CHECK(apps::is_hf_dir(o.init_from), "transformer: --init-from {} is not a Hugging Face model directory "
             "(no config.json there)", o.init_from);
  apps::ModelConfig hf = apps::read_hf_config(o.init_from);
  apps::check_ctx_within(o.model.ctx, hf, o.init_from);
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
  // wsd's default decay: a fifth of the run, within what the warmup leaves (none after a warmup as long as the run).
  if (o.lr_schedule == "wsd" && o.decay_steps == 0)
    o.decay_steps = std::min(std::max<int64_t>(1, o.steps / 5), std::max<int64_t>(0, o.steps - o.warmup));
  WEFT_CHECK(o.lr_schedule != "wsd" || o.decay_steps <= o.steps - o.warmup, "transformer: --decay-steps {} is more "
             "than the {} steps after the warmup of {}", o.decay_steps, std::max<int64_t>(0, o.steps - o.warmup), o.warmup);
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
  WEFT_CHECK(world % o.tp == 0, "transformer: --tp {} does not divide {}", o.tp, apps::ranks_text(o.plan, world));
  WEFT_CHECK(run.device.is_cpu(), "transformer: --tp runs on the CPU for now, not {}", run.device.str());
  WEFT_CHECK(!o.deterministic, "transformer: --tp cannot run --deterministic: a row-parallel layer adds its ranks' "
             "partial products in another order than one rank's matmul, so the bits differ at any --tp above 1");
  auto refuse = [&](bool used, const char* what) { WEFT_CHECK(!used, "transformer: --tp does not run with {} yet", what); };
  refuse(o.sharding_strategy != "FULL_SHARD", "--sharding-strategy other than FULL_SHARD");
  refuse(o.reshard_after_forward != "true" && o.reshard_after_forward != "false", "--reshard-after-forward N");
  // The adapters split with their layers sum their gradients over the group while they run (tp's sum_gradients),
  // which the FSDP group of their own that keeps them f32 would undo.
  refuse(o.base_dtype == "bf16", "--base-dtype bf16");
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
  if ((!ranks.fsdp || o.tp > 1) && !o.plan.only()) apps::check_fits_host(o.model);  // whole in each process
  WEFT_CHECK(o.lora.rank > 0 || (o.lora.alpha == 0 && o.lora.dropout == 0 && o.lora_targets.empty()),
             "transformer: --lora-alpha, --lora-dropout and --lora-targets need a --lora-rank above 0");
  if (o.lora.rank > 0 && !o.init_from.empty()) o.base_digest = apps::hf_weights_digest(o.init_from);
  if (o.lora.rank > 0 && o.lora.targets.empty()) {  // flags, or a peft adapter's "all-linear"
    o.lora.targets = apps::lora_targets(o.lora_targets, o.model);
    if (o.lora.alpha == 0) o.lora.alpha = double(o.lora.rank);
    WEFT_CHECK(o.untie || std::count(o.lora.targets.begin(), o.lora.targets.end(), "lm_head") == 0, "transformer: "
               "--lora-targets names lm_head, but this model's head is its token embedding (tied weights: no lm_head "
               "Linear){}", o.init_from.empty() ? ": give --untie, or leave lm_head out" : ": leave lm_head out");
  }
  check_base_dtype(o);
  WEFT_CHECK(ranks.fsdp || (o.reshard_after_forward.empty() && o.sharding_strategy == "FULL_SHARD"),
             "transformer: --reshard-after-forward and --sharding-strategy are FSDP options: add --fsdp");
  WEFT_CHECK(o.sharding_strategy == "FULL_SHARD" || o.reshard_after_forward.empty(),
             "transformer: --reshard-after-forward applies to --sharding-strategy FULL_SHARD only ({} decides it)",
             o.sharding_strategy);
  o.reshard_given = !o.reshard_after_forward.empty();
  if (o.reshard_after_forward.empty()) o.reshard_after_forward = "true";  // FULL_SHARD's default
  check_tensor_parallel(o, ranks, run);
  WEFT_CHECK(o.lr > 0 && o.steps > 0 && o.batch_size > 0 && o.grad_accum > 0,
             "transformer: --lr, --steps, --batch-size and --grad-accum must be positive");
  if (o.deterministic)  // checked at --plan-ranks' world too, before the plan
    run.leaves = apps::make_leaf_plan("transformer", o.virtual_batches, o.batch_size, o.grad_accum,
                                      o.plan.ranks > 0 ? o.plan.ranks : ranks.world, ranks.rank);
  WEFT_CHECK(!o.deterministic || o.sharding_strategy != "NO_SHARD",
             "transformer: --deterministic reduces gradients over one sharded dimension: use --sharding-strategy "
             "FULL_SHARD or SHARD_GRAD_OP, not NO_SHARD");
  const int dp = (o.plan.ranks > 0 ? o.plan.ranks : ranks.world) / o.tp;  // the batch's slices
  WEFT_CHECK(o.batch_size % dp == 0, "transformer: --batch-size {} does not split evenly over {}{}: it is the global "
             "batch and each takes an equal slice, so use a multiple of {}", o.batch_size,
             apps::ranks_text(o.plan, o.plan.ranks > 0 ? o.plan.ranks : ranks.world),
             o.tp > 1 ? fmt::format(" (their {} data-parallel groups of --tp {})", dp, o.tp) : "", dp);
  const bool raf_bool = o.reshard_after_forward == "true" || o.reshard_after_forward == "false";
  if (const int64_t k = raf_bool ? 0 : std::stoll(o.reshard_after_forward), n = ranks.data_world(); k > 0 && ranks.fsdp && !o.plan.wanted())
    WEFT_CHECK(k > 1 && k < n && n % k == 0, "transformer: --reshard-after-forward {} must divide the {} ranks and lie "
               "strictly between 1 and {} (for 1: false, keep the full parameters; for {}: true)", k, n, n, n);
  // The default warmup (10) ends before a short run's last step; a given one ramps at its own rate, however long.
  if (o.warmup < 0) o.warmup = std::min<int64_t>(10, o.steps - 1);
  check_schedule(o);
  apps::check_checkpoint_dir(o.checkpoint_dir, "--checkpoint-dir", "transformer");
  WEFT_CHECK(o.checkpoint_dir.empty() || !(apps::is_hf_dir(o.checkpoint_dir) || apps::is_peft_dir(o.checkpoint_dir)),
             "transformer: --checkpoint-dir {} holds a Hugging Face model or peft adapter, which sample, eval and "
             "export would read instead of its checkpoints: give the checkpoints a directory of their own",
             o.checkpoint_dir);
  o.plan.modelled = o.sharding_strategy == "FULL_SHARD" && raf_bool;
  if (o.plan.wanted())
    WEFT_CHECK(o.plan.modelled,
               "transformer: --plan, --plan-ranks and --memory-budget plan FULL_SHARD with --reshard-after-forward "
               "true or false, not {}", o.sharding_strategy != "FULL_SHARD" ? "--sharding-strategy " + o.sharding_strategy
               : "--reshard-after-forward " + o.reshard_after_forward);
}

// The text or token files; a token dataset sets the vocabulary.
void load_data(TrainOptions& o, Run& run, bool fsdp) {
  apps::load_training_data(o.data, run.data);
  if (!run.data.tokenizer_sha256.empty()) {  // token ids: the model's vocabulary must hold them
    if (o.init_from.empty() && !o.model_from_checkpoint()) o.model.vocab_size = run.data.vocab_size;
    WEFT_CHECK(o.model.vocab_size >= run.data.vocab_size, "transformer: {}'s vocabulary of {} is smaller than the "
               "dataset's {} ({})", o.init_from.empty() ? o.resume : o.init_from, o.model.vocab_size,
               run.data.vocab_size, o.data);
  }
  if (!o.checkpoint_dir.empty() || !o.resume.empty() || fsdp) run.train_text = training_text(run.data);
  if (run.data.examples()) {  // whole examples, cut at the context
    run.train_examples.emplace(run.data.train, run.data.train_labels, o.model.ctx, run.data.files[0], o.pack, o.seed);
    run.val_examples.emplace(run.data.val, run.data.val_labels, o.model.ctx, run.data.files[1]);
    for (const auto& [set, file] : {std::pair{&*run.train_examples, run.data.files[0]}, {&*run.val_examples, run.data.files[1]}})
      WEFT_CHECK(set->size() > 0, "transformer: no example of {} has a target that carries loss within the context "
                 "{} ({} skipped): use a longer --ctx", file, o.model.ctx, set->skipped());
    return;
  }
  WEFT_CHECK(!o.pack, "transformer: --pack packs the examples of a dataset that `weft-transformer prepare` made from "
             "JSONL records, and {} is read as text: prepare it first (prepare --tokenizer T --data {} --out DIR), then "
             "train with --data DIR", o.data, o.data);
  WEFT_CHECK(run.data.val.size() > o.model.ctx + 1,
             "transformer: the validation part of {} has {} tokens, and a context of {} needs at least {} (ctx + 2: "
             "windows of ctx + 1 tokens drawn from it)", o.data, run.data.val.size(), o.model.ctx, o.model.ctx + 2);
}

// The model of the checkpoint --resume names must be the flags' (or --init-from's) model.
void check_resumed_model(apps::ModelConfig c, apps::ModelConfig m, const std::string& where) {
  for (apps::ModelConfig* x : {&c, &m}) x->ffn_dim = x->arch != "llama" && !x->ffn_dim ? 4 * x->d_model : x->ffn_dim;  // GPT-2's
  const auto have = model_fields(c), want = model_fields(m);
  std::string held, asked;  // every field that differs (n_head changes head_dim too)
  for (const auto& [key, value] : have)
    if (want.at(key) != value) {
      held += fmt::format("{}{} {}", held.empty() ? "" : ", ", key, value);
      asked += fmt::format("{}{} {}", asked.empty() ? "" : ", ", key, want.at(key));
    }
  WEFT_CHECK(held.empty(), "transformer: checkpoint {} holds a model with {}; the flags (and --init-from) ask for {}",
             where, held, asked);
}

void check_lora_base(const std::map<std::string, std::string>& app, const TrainOptions& o, const std::string& where) {
  if (!app.count("lora_base_sha256")) return;
  WEFT_CHECK(!o.init_from.empty(), "transformer: {} holds only LoRA adapters: resume it with --init-from {}, its base",
             where, app.at("hf_source"));
  lora_base(app, where, o.init_from, o.base_digest);  // hashed once, by validate(), when the flags ask for LoRA
}

// --resume: the latest checkpoint in the directory, checked against the flags. The batches: another seed, batch size,
// accumulation or text would continue on another data stream than the checkpoint's position means. (--lr, --warmup and
// --steps take effect: the schedule is recomputed from them at the checkpoint's step; docs/CHECKPOINTS.md.)
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
  apps::check_resumed_determinism(ck.app, o.deterministic ? o.virtual_batches : 0, where, "transformer");
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
  auto fields = [](nn::LoRAOptions l) {  // the same modules, named in any order
    std::ranges::sort(l.targets);
    return apps::lora_fields(l);
  };
  const auto recorded = fields(apps::lora_of(ck.app, where)), wanted = fields(o.lora);
  WEFT_CHECK(recorded == wanted, "transformer: checkpoint {} holds {}; the --lora-* flags ask for {}", where,
             text(recorded), text(wanted));
  WEFT_CHECK(ck.step <= o.steps, "transformer: {} is at step {}, beyond --steps {}: raise --steps to go on", where,
             ck.step, o.steps);
  if (ck.data.count("batch"))  // the run draws batch step * --grad-accum next
    apps::data_position(ck.data, "batch", ck.step * o.grad_accum, ck.step * o.grad_accum, where, "transformer");
}

// The memory plan (when asked), then the same full model on every rank: under --fsdp deferred, on the meta device
// (init_model records its rules there too; fully_shard then initialises only this rank's shards, bitwise the eager
// build's values). --init-from draws nothing: its weights replace every parameter (load_init_weights). --tp builds it
// whole (materialised), to be split over its group before sharding.
void build_model(TrainOptions& o, const Ranks& ranks, Run& run) {
  reset_peak_memory_stats(run.device);
  run.start_bytes = memory_stats(run.device).live_bytes;
  const apps::StepItems tokens{double(o.batch_size * o.grad_accum * o.model.ctx), "tokens"};
  const bool init_weights = !o.init_from.empty() && (run.resume_from.empty() || o.base_elsewhere());  // read below
  const PlannedRows rows = planned_rows(o, run.train_examples, run.val_examples);
  run.plan = apps::plan_from_flags(o.plan, plan_request(o, ranks.fsdp, rows, init_weights ? std::optional<Device>(run.device)
                                   : std::nullopt), ranks, run.device, tokens, "weft-transformer");
  if (o.plan.only()) return;  // printed; nothing to build or train
  if (run.plan && run.plan->budget) {  // train with the plan's choices
    o.checkpointing = run.plan->settings.activation_checkpointing;
    run.per_block = run.plan->settings.reshard_after_forward;
  }
  manual_seed(o.seed);
  if (init_weights) {  // load_init_weights reads them
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

// Fine-tuning a downloaded model on another tokenizer's ids (or on bytes) teaches it a code it does not know: said,
// not refused (another copy of the same tokenizer may differ in its bytes); on bytes, refused for a model whose
// tokenizer weft cannot read (SentencePiece's tokenizer.model only: its export would ship that tokenizer).
void check_data_tokens(const TrainOptions& o, const Run& run, bool lead) {
  if (run.data.tokenizer_sha256.empty()) apps::check_tokenizer_readable(o.init_from, o.data + "'s text");
  if (o.init_from.empty() || !WEFT_FS(std::filesystem::exists(o.init_from + "/tokenizer.json"))) return;
  const std::string model = apps::tokenizer_digest(o.init_from), data = run.data.tokenizer_sha256;
  if (lead && model != data)
    std::fprintf(stderr, "weft-transformer: warning: %s holds %s, not the tokens of %s/tokenizer.json (sha256 %s): the "
                 "model is trained on ids it was not made for\n", o.data.c_str(), apps::describe_tokens(data).c_str(),
                 o.init_from.c_str(), model.c_str());
}

// Everything before sharding, rank-local: run inside dist::agree, so that a failure on any rank
// (bad flags, missing files, a checkpoint that does not fit) stops every rank.
void prepare_run(TrainOptions& o, const Ranks& ranks, Run& run) {
  run.device = apps::parse_device(o.device, "transformer");  // first: a device that cannot work ends the run at once
  apps::cli::use_threads(o.threads);
  set_deterministic(o.deterministic);
  if (o.model_from_checkpoint()) take_resume_config(o);
  o.model.tie_weights = !o.untie;
  validate(o, ranks, run);
  load_data(o, run, ranks.fsdp);
  check_data_tokens(o, run, ranks.lead());
  if (!o.resume.empty()) find_resume(o, run, ranks.lead());
  std::vector<apps::PathFlag> inputs = {{"--resume", run.resume_from}, {"--init-from", o.init_from}};
  for (const std::string& file : run.data.files) inputs.push_back({"--data", file});
  inputs.push_back({"--data", o.data});  // a folder: what is written inside it would be read as data next time
  apps::check_outputs_apart({{"--metrics", o.metrics}, {"--checkpoint-dir", o.checkpoint_dir, true},
                             {"WEFT_TRACE", trace::file()}}, inputs, "transformer");
  if (!o.checkpoint_dir.empty() && ranks.lead() && !o.plan.only()) run.dir_lock.emplace(o.checkpoint_dir);  // made now
  run.identity = apps::run_identity(run.resume_from);
  if (run.dir_lock)
    apps::check_checkpoint_owner(o.checkpoint_dir, "--checkpoint-dir", run.identity, run.resume_from,
                                 o.overwrite_checkpoints, "--resume", "transformer");
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
    const double val = validation_loss(*run_.lm.module, run_, o_, ranks_, run_.leaves);
    at.metrics.write({{"split", std::string("val")}, {"step", at.step}, {"loss", val}, {"perplexity", std::exp(val)}});
    at.nan.check_evaluation(val, fmt::format("the validation loss is {} at step {}", apps::describe_value(val),
                                             at.step), at.watch);
    if (!ranks_.lead()) return;
    std::printf("step %lld train_loss %.4f val_loss %.4f val_ppl %s\n", (long long)at.step,
                apps::unsigned_nan(at.train_loss), apps::unsigned_nan(val),
                apps::perplexity_text(val, 3).c_str());
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
    std::fprintf(stderr, "weft-transformer: FSDP over %d rank%s: one group per block and the root; %lld parameters "
                 "on rank 0, %lld sequences per %s per micro-step\n", ranks.data_world(), ranks.data_world() > 1 ? "s" : "",
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
  if (const int64_t n = run.val_examples ? run.val_examples->size() : 0; o.eval_every > 0 && o.eval_iters * o.batch_size < n)
    std::fprintf(stderr, "weft-transformer: a validation scores %lld of the %lld val examples (--eval-iters x "
                 "--batch-size); `eval` scores them all\n", (long long)(o.eval_iters * o.batch_size), (long long)n);
}

// --init-from without --resume: the Hugging Face weights replace the initial ones (each rank
// reads its shards' bytes only; a NaN or infinity in them throws as it is read).
void load_init_weights(const TrainOptions& o, const Run& run, const Ranks& ranks, const fsdp::FSDPModule* root) {
  if (ranks.fsdp) {  // each rank reads its shards' bytes only: one path may hold other weights on another host
    dist::ConfigSettings held;
    dist::agree(ranks.groups(), "transformer", [&] {
      held = {{o.init_from + "'s weights", o.base_elsewhere() ? o.base_digest : apps::hf_weights_digest(o.init_from)}};
      if (run.adapter) held.emplace_back(run.adapter->dir + "'s adapters", sha256_file(run.adapter->dir + "/adapter_model.safetensors"));
    });
    dist::check_same_config(held, "weft-transformer", nullptr, "every rank must start from the same weights: the "
                            "path holds other files on some rank's host");
  }
  dist::agree(ranks.groups(), "transformer", [&] {
    apps::load_hf_checkpoint(o.init_from, run.lm, root);
    if (run.adapter) apps::load_peft_weights(*run.adapter, run.lm, root);
  });
  if (ranks.lead())
    std::fprintf(stderr, "weft-transformer: initialised from %s%s%s\n", o.init_from.c_str(),
                 run.adapter ? " and the adapters of " : "", run.adapter ? run.adapter->dir.c_str() : "");
}

}  // namespace

dist::ConfigSettings shared_settings(const TrainOptions& o) {
  auto num = [](auto v) { return fmt::format("{}", v); };
  dist::ConfigSettings s = {{"--arch", o.model.arch},
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
          {"--deterministic", o.deterministic ? "true" : "false"},
          {"--virtual-batches", num(o.virtual_batches)},
          {"--pack", o.pack ? "true" : "false"},
          {"--base-dtype", o.base_dtype},
          {"--steps", num(o.steps)},
          {"--lr", num(o.lr)},
          {"--warmup", o.warmup < 0 ? "(default)" : num(o.warmup)},
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
          {"--checkpoint-dir", o.checkpoint_dir.empty() ? "" :  // a rank saving elsewhere is refused now, not at
           WEFT_FS(std::filesystem::absolute(o.checkpoint_dir)).lexically_normal().string()},  // the first save
          {"--checkpoint-every", num(o.checkpoint_every)},
          {"--keep-last", num(o.keep_last)},
          {"--resume", o.resume},
          {"--fsdp", o.fsdp ? "true" : "false"},
          {"--tp", num(o.tp)},
          {"--ac", nn::checkpointing_name(o.checkpointing)},
          {"--reshard-after-forward", o.reshard_after_forward.empty() ? "(default)" : o.reshard_after_forward},
          {"--sharding-strategy", o.sharding_strategy},
          {"--mixed-precision", o.mixed_precision},
          {"--on-nan", o.on_nan},
          {"--max-skipped-steps", num(o.max_skipped)},
          {"--overwrite-checkpoints", o.overwrite_checkpoints ? "true" : "false"},
          {"--lora-rank", num(o.lora.rank)},
          {"--lora-alpha", num(o.lora.alpha)},
          {"--lora-dropout", num(o.lora.dropout)},
          {"--lora-targets", o.lora_targets}};
  for (auto& setting : apps::plan_settings(o.plan)) s.push_back(setting);
  return s;
}

int train(TrainOptions o, const Ranks& ranks) {
  Run run;
  dist::agree(ranks.groups(), "transformer", [&] { prepare_run(o, ranks, run); });
  if (o.plan.only()) return 0;  // the plan is printed; nothing to train
  auto read = run.train_text;
  if (ranks.fsdp) read["val_sha256"] = sha256_hex(run.data.val.p, size_t(run.data.val.n * run.data.val.width));
  apps::check_same_data(read, ranks, "weft-transformer");
  apps::check_shared_dir(o.checkpoint_dir, "--checkpoint-dir", ranks, "weft-transformer");
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

}  // namespace weft::apps::transformer
