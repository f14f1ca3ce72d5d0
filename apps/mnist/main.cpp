// weft-mnist: trains an MLP or CNN classifier on Fashion-MNIST (or any IDX data set), in one
// process or, with --fsdp, sharded over the ranks mpirun starts (one FSDP group per layer).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <numeric>
#include <map>
#include <optional>
#include <thread>

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
#include "apps/mnist/idx.h"
#include "apps/mnist/models.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/step_trace.h"
#include "dist/config_check.h"
#include "fsdp/fsdp.h"
#include "core/trace.h"
#include "weft.h"

using namespace weft;

namespace {

struct Options {
  std::string model = "mlp";
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 1e-3;
  std::string optimizer = "adamw";
  uint64_t seed = 0;
  int threads = 0;
  std::string metrics, save, load;
  int64_t checkpoint_every = 0;
  int keep_last = 0;
  bool overwrite_checkpoints = false;
  int64_t steps = 0;  // 0: no limit
  std::string data = apps::kDefaultMnistDir;
  int64_t log_every = 50;
  bool fsdp = false;
  bool deterministic = false;
  int64_t virtual_batches = 8;  // --deterministic's V
  std::string mixed_precision = "none";
  bool autocast() const { return mixed_precision == "bf16" && !fsdp; }  // else FSDP's policy, if any
  std::string device = "cpu";
  std::string on_nan = "error";
  int64_t max_skipped = 5;  // --on-nan skip: give up after this many skipped steps in a row
  apps::PlanFlags plan{.lighter = "a smaller --batch-size"};
};

using apps::Ranks;
using apps::mean_over_ranks;

// The flags that change the model, the math, the data stream or the collective sequence: under
// mpirun every rank must get the same ones (not --threads, --metrics or --device, which are the
// rank's own). --save as an absolute path: a rank saving elsewhere is refused now, not at the first save.
dist::ConfigSettings shared_settings(const Options& o) {
  dist::ConfigSettings s = {{"--model", o.model},
          {"--epochs", fmt::format("{}", o.epochs)},
          {"--batch-size", fmt::format("{}", o.batch_size)},
          {"--lr", fmt::format("{}", o.lr)},
          {"--optimizer", o.optimizer},
          {"--seed", fmt::format("{}", o.seed)},
          {"--save", o.save.empty() ? "" : WEFT_FS(std::filesystem::absolute(o.save)).lexically_normal().string()},
          {"--checkpoint-every", fmt::format("{}", o.checkpoint_every)},
          {"--keep-last", fmt::format("{}", o.keep_last)},
          {"--load", o.load},
          {"--steps", fmt::format("{}", o.steps)},
          {"--data", o.data},
          {"--log-every", fmt::format("{}", o.log_every)},
          {"--fsdp", o.fsdp ? "true" : "false"},
          {"--deterministic", o.deterministic ? "true" : "false"},
          {"--virtual-batches", fmt::format("{}", o.virtual_batches)},
          {"--mixed-precision", o.mixed_precision},
          {"--on-nan", o.on_nan},
          {"--max-skipped-steps", fmt::format("{}", o.max_skipped)},
          {"--overwrite-checkpoints", o.overwrite_checkpoints ? "true" : "false"}};
  for (auto& setting : apps::plan_settings(o.plan)) s.push_back(setting);
  return s;
}

std::unique_ptr<nn::Optimizer> make_optimizer(const Options& o, std::vector<Tensor> params) {
  if (o.optimizer == "adamw") return std::make_unique<nn::AdamW>(std::move(params), nn::AdamWOptions{.lr = o.lr});
  if (o.optimizer == "adam") return std::make_unique<nn::Adam>(std::move(params), nn::AdamOptions{.lr = o.lr});
  if (o.optimizer == "sgd")
    return std::make_unique<nn::SGD>(std::move(params), nn::SGDOptions{.lr = o.lr, .momentum = 0.9});
  WEFT_ERROR("mnist: unknown optimizer \"{}\" (choose adamw, adam or sgd)", o.optimizer);
}

// The sample order of an epoch: a Fisher-Yates shuffle from a generator seeded by (seed,
// epoch), so a resumed run sees the same batches as an uninterrupted one.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  Generator g(seed * 1000003ull + uint64_t(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) std::swap(idx[size_t(i)], idx[size_t(g.next_u64() % uint64_t(i + 1))]);
  return idx;
}

// The summed loss and the number of right answers of one evaluation batch.
std::pair<Tensor, Tensor> eval_batch(nn::Module& model, const Tensor& x, const Tensor& y, bool autocast) {
  AutocastGuard bf16(DType::bf16, autocast);
  Tensor logits = model(x);
  return {cross_entropy(logits, y, {.reduction = "sum"}), sum(eq(argmax(logits, 1), y))};
}

// Test loss and accuracy. Under FSDP each rank evaluates its slice of every batch of 1000 (the forward gathers the
// parameters and, without gradients, frees them again) and the sums are all-reduced; a batch smaller than the world is
// evaluated whole on every rank and counted once, so every rank runs the same forwards. With --deterministic each batch
// goes as the rank's virtual micro-batches, their sums added in one order at any world size.
std::pair<double, double> evaluate(nn::Module& model, const apps::MnistSplit& split, const Ranks& ranks, Device device,
                                   bool autocast, const std::optional<apps::LeafPlan>& leaves) {
  NoGradGuard no_grad;
  model.eval();
  int64_t n = split.images.size(0);
  double loss_sum = 0, correct = 0;
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> losses, rights;  // --deterministic: per micro-batch
  for (int64_t b = 0; b < n; b += 1000) {
    int64_t m = std::min<int64_t>(1000, n - b);
    for (int64_t j = 0; leaves && j < leaves->per_rank; ++j) {
      auto [lo, hi] = leaves->rows(leaves->micro(j), m);
      if (hi == lo) {  // a batch shorter than --virtual-batches: this part is empty
        losses.push_back(0);
        rights.push_back(0);
        if (ranks.fsdp) {  // a sharded model's forward is collective: the other ranks' parts wait for its all-gathers
          auto [x1, y1] = apps::mnist_batch(split, all, b, 1);
          eval_batch(model, x1.to(device), y1.to(device), autocast);
        }
        continue;
      }
      auto [x_host, y_host] = apps::mnist_batch(split, all, b + lo, hi - lo);
      auto [batch_loss, batch_correct] = eval_batch(model, x_host.to(device), y_host.to(device), autocast);
      losses.push_back(batch_loss.item());
      rights.push_back(batch_correct.item());
    }
    if (leaves) continue;
    bool split_batch = m >= ranks.world;
    int64_t lo = split_batch ? m * ranks.rank / ranks.world : 0;
    int64_t hi = split_batch ? m * (ranks.rank + 1) / ranks.world : m;
    auto [x_host, y_host] = apps::mnist_batch(split, all, b + lo, hi - lo);
    Tensor x = x_host.to(device), y = y_host.to(device);
    auto [batch_loss, batch_correct] = eval_batch(model, x, y, autocast);
    if (!split_batch && !ranks.lead()) continue;
    loss_sum += batch_loss.item();
    correct += double(int64_t(batch_correct.item()));
  }
  model.train();
  if (leaves) {
    const int64_t batches = (n + 999) / 1000;
    return {apps::ordered_sum(losses, batches, ranks) / double(n), apps::ordered_sum(rights, batches, ranks) / double(n)};
  }
  if (ranks.fsdp) {
    Tensor sums = from_vector({loss_sum, correct}, {2}, {.dtype = kFloat64});
    dist::world()->all_reduce(sums, dist::ReduceOp::sum)->wait();
    loss_sum = sums.data<double>()[0];
    correct = sums.data<double>()[1];
  }
  return {loss_sum / double(n), correct / double(n)};
}

// Checkpoints are fsdp::save_checkpoint directories: every rank writes its own shards, and a run resumes from them at
// any number of ranks, with or without --fsdp (docs/CHECKPOINTS.md). The training set's size and content (sha256 of its
// images and labels): a resumed run must draw its batches from the same one.
std::map<std::string, std::string> training_set(const apps::MnistSplit& train) {
  const Tensor images = train.images.contiguous(), labels = train.labels.contiguous();
  const std::string both = sha256_hex(images.data_ptr(), images.nbytes()) + sha256_hex(labels.data_ptr(), labels.nbytes());
  return {{"train_samples", std::to_string(train.images.size(0))}, {"train_sha256", sha256_hex(both.data(), both.size())}};
}

std::map<std::string, std::string> describe(const Options& o, const std::map<std::string, std::string>& train_set) {
  std::map<std::string, std::string> d = {{"format", "weft-mnist"}, {"model", o.model}, {"optimizer", o.optimizer},
                                          {"seed", std::to_string(o.seed)}, {"batch_size", std::to_string(o.batch_size)},
                                          {"lr", fmt::format("{}", o.lr)},
                                          {"virtual_batches", o.deterministic ? std::to_string(o.virtual_batches) : "0"}};
  d.insert(train_set.begin(), train_set.end());
  return d;
}

// The checkpoint --load names, checked against the flags: the model, the optimizer and everything that decides the
// batches (seed, batch size, training set) must be the ones it was written with. --epochs and --steps may change (they
// say where to stop), and so may --lr: it replaces the learning rate the optimizer state restores (run() says so).
std::string checkpoint_to_load(const Options& o, const std::map<std::string, std::string>& train_set,
                               int64_t steps_per_epoch, bool say) {
  std::string where = apps::readable_checkpoint(o.load, "mnist", say);
  WEFT_CHECK(!where.empty(), "mnist: no checkpoint in {} (no index.json there and no complete step_* directory)",
             o.load);
  const fsdp::CheckpointProgress ck = fsdp::read_checkpoint_index(where).training;
  auto get = [&](const std::string& k) {
    auto it = ck.app.find(k);
    WEFT_CHECK(it != ck.app.end(), "mnist: {} is not a weft-mnist checkpoint (no \"{}\" in its description)", where, k);
    return it->second;
  };
  WEFT_CHECK(get("format") == "weft-mnist", "mnist: {} was written by \"{}\", not weft-mnist", where, get("format"));
  WEFT_CHECK(get("model") == o.model, "mnist: {} holds a {} model but --model is {}", where, get("model"), o.model);
  WEFT_CHECK(get("optimizer") == o.optimizer, "mnist: {} was trained with {} but --optimizer is {}", where,
             get("optimizer"), o.optimizer);
  auto same = [&](const char* key, const char* flag, const std::string& value, const char* why) {
    apps::check_resumed_setting(ck.app, key, flag, value, why, where, "mnist");
  };
  same("seed", "--seed", std::to_string(o.seed), "the seed decides the order of the samples");
  same("batch_size", "--batch-size", std::to_string(o.batch_size), "the checkpoint's step counts batches of that size");
  apps::check_resumed_determinism(ck.app, o.deterministic ? o.virtual_batches : 0, where, "mnist");
  apps::check_resumed_data(ck.app, train_set, "training set", "--data " + o.data, where, "mnist");
  const int64_t total = o.epochs * steps_per_epoch;
  WEFT_CHECK(ck.step <= total, "mnist: {} is at step {}, beyond the {} steps of --epochs {} ({} steps per epoch): "
             "raise --epochs to go on", where, ck.step, total, o.epochs, steps_per_epoch);
  const int64_t epoch = apps::data_position(ck.data, "epoch", 0, o.epochs, where, "mnist");
  const int64_t batch = apps::data_position(ck.data, "batch", 0, steps_per_epoch - 1, where, "mnist");
  WEFT_CHECK(epoch * steps_per_epoch + batch == ck.step, "mnist: {}: data position epoch {} batch {} is not step {} "
             "at {} steps per epoch", where, epoch, batch, ck.step, steps_per_epoch);
  // The run's last step, as weft-transformer's: a restart with the same flags (weft-elastic) ends where one run would.
  WEFT_CHECK(o.steps == 0 || ck.step <= o.steps, "mnist: {} is at step {}, beyond --steps {} (the step to stop at, "
             "counted from the run's start): raise --steps to go on", where, ck.step, o.steps);
  return where;
}

// ---- FSDP: one group per layer, and full state dicts gathered from the shards.

// fully_shard on every direct child that holds parameters (fc1, fc2, fc3 of the MLP; conv1, conv2, fc1, fc2 of the
// CNN), then on the root: one all-gather and one reduce-scatter per layer. The model is on the meta device: its shards
// are allocated and initialised on `device`'s mesh. A memory plan passes its fake `mesh` and each layer's
// reshard_after_forward (`per_layer`). --mixed-precision bf16 gathers bf16 parameters, computes in bf16 and reduces
// gradients in f32; the root's output (the logits) comes back in f32 for the loss.
fsdp::FSDPModule shard_model(const nn::ModulePtr& model, Device device, const Options& o,
                             const std::shared_ptr<dist::DeviceMesh>& mesh = nullptr,
                             const std::vector<bool>& per_layer = {}) {
  fsdp::FullyShardOptions opts{.mesh = mesh ? mesh : dist::default_mesh(device.type)};
  if (o.mixed_precision == "bf16") opts.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = kFloat32};
  size_t i = 0;
  for (auto& [name, child] : model->named_children())
    if (!child->parameters().empty()) {
      fsdp::FullyShardOptions layer = opts;
      if (!per_layer.empty()) layer.reshard_after_forward = bool(per_layer[i++]);
      fsdp::fully_shard(child, layer);
    }
  if (o.mixed_precision == "bf16") opts.mp_policy.output_dtype = kFloat32;
  return fsdp::fully_shard(model, opts);
}

// The memory planner's training step: run()'s model, sharding, optimizer, step and an
// evaluation batch, on meta tensors (fsdp::plan_memory runs it on the meta device).
fsdp::MemoryPlanRequest plan_request(const Options& o, bool fsdp, int64_t rows, int64_t cols) {
  int64_t layers = 0;
  {
    DefaultDeviceGuard meta(Device::meta());
    for (auto& [name, child] : apps::make_mnist_model(o.model, rows, cols)->named_children())
      layers += child->parameters().empty() ? 0 : 1;
  }
  fsdp::MemoryPlanRequest r;
  r.sharded = fsdp;
  r.tunable_groups = fsdp ? int(layers) : 0;
  r.setup = [o, rows, cols](const fsdp::PlanSettings& s, const std::shared_ptr<dist::DeviceMesh>& mesh) -> fsdp::TrainingStep {
    manual_seed(o.seed);
    nn::ModulePtr model = apps::make_mnist_model(o.model, rows, cols);
    std::optional<fsdp::FSDPModule> root;
    if (mesh) root = shard_model(model, Device::meta(), o, mesh, s.reshard_after_forward);
    std::shared_ptr<nn::Optimizer> opt = make_optimizer(o, model->parameters());
    const int world = mesh ? mesh->size(0) : 1;
    const int64_t batch = o.batch_size / world;
    int64_t eval_rows = 1000 >= world ? 1000 / world + (1000 % world ? 1 : 0) : 1000;
    std::optional<apps::LeafPlan> leaves;  // --deterministic: rank 0's leaves, as the step and evaluate() run them
    if (o.deterministic) leaves = apps::make_leaf_plan("mnist", o.virtual_batches, o.batch_size, 1, world, 0);
    if (leaves) eval_rows = std::min<int64_t>(1000, (1000 + o.virtual_batches - 1) / o.virtual_batches);  // the largest part
    return [model, opt, root, leaves, o, batch, eval_rows, pixels = rows * cols, autocast = o.autocast()]() mutable {
      opt->zero_grad();
      auto backward = [&](int64_t n, int64_t parts) {
        apps::forward_backward(*model, empty({n, pixels}), empty({n}, {.dtype = kInt64}), autocast, parts);
      };
      nn::TreeSum tree;
      if (leaves)
        apps::run_leaves(*leaves, o.batch_size, root ? &*root : nullptr, tree, model->parameters(),
                         [&](int64_t, int64_t lo, int64_t hi) { backward(hi - lo, leaves->leaves()); });
      else
        backward(batch, 1);
      opt->step();
      NoGradGuard no_grad;  // an evaluation batch, as after each epoch of run()
      step_trace::Pause not_timed;  // memory only: the step-time model times the training step
      model->eval();
      eval_batch(*model, empty({eval_rows, pixels}), empty({eval_rows}, {.dtype = kInt64}), autocast);
      model->train();
    };
  };
  return r;
}

// What run() sets up before the first step (prepare_run, rank-local: inside dist::agree).
struct Run {
  Device device = kCPU;
  std::optional<apps::LeafPlan> leaves;             // --deterministic
  std::optional<fsdp::CheckpointDirLock> dir_lock;  // rank 0's claim on --save
  apps::MnistData data;
  int64_t steps_per_epoch = 0;                      // the last partial batch is dropped
  std::map<std::string, std::string> train_set;     // its size and sha256, recorded in checkpoints
  std::string resume_from;
  std::string identity;  // the run identity its checkpoints record
  int64_t start_bytes = 0;  // live before the model (the data): the baseline of the peak reported
  std::optional<fsdp::MemoryPlan> plan;
  std::vector<bool> per_layer;  // reshard_after_forward per layer, when a memory budget chose it
  nn::ModulePtr model;
  std::optional<apps::MetricsWriter> metrics;
};

// Everything before sharding, rank-local: run inside dist::agree, so that a failure on any rank
// (bad flags, missing files, a checkpoint that does not fit) stops every rank.
void prepare_run(const Options& o, const Ranks& ranks, Run& run) {
  run.device = apps::parse_device(o.device, "mnist");  // first: a device that cannot work ends the run at once
  apps::cli::use_threads(o.threads);
  set_deterministic(o.deterministic);
  if (o.deterministic)  // checked at --plan-ranks' world too, before the plan
    run.leaves = apps::make_leaf_plan("mnist", o.virtual_batches, o.batch_size, 1, o.plan.ranks > 0 ? o.plan.ranks : ranks.world,
                                      ranks.rank);
  WEFT_CHECK(o.batch_size > 0 && o.epochs > 0 && o.lr > 0, "mnist: --batch-size, --epochs and --lr must be positive");
  WEFT_CHECK(o.batch_size % ranks.world == 0,
             "mnist: --batch-size {} does not split evenly over {} ranks: --batch-size is the global batch and "
             "each rank takes an equal slice of it, so use a multiple of {}", o.batch_size, ranks.world, ranks.world);
  apps::check_checkpoint_dir(o.save, "--save", "mnist");
  run.data = apps::load_mnist(o.data);
  const int64_t n_train = run.data.train.images.size(0);
  run.steps_per_epoch = n_train / o.batch_size;
  WEFT_CHECK(run.steps_per_epoch > 0, "mnist: batch size {} exceeds the {} training samples", o.batch_size, n_train);
  if (!o.save.empty() || !o.load.empty() || ranks.fsdp) run.train_set = training_set(run.data.train);
  // --load's checkpoint is checked before any plan: weft-plan plans only a run that can start.
  if (!o.load.empty()) run.resume_from = checkpoint_to_load(o, run.train_set, run.steps_per_epoch, ranks.lead());
  reset_peak_memory_stats(run.device);
  run.start_bytes = memory_stats(run.device).live_bytes;
  WEFT_CHECK(o.plan.ranks == 0 || o.batch_size % o.plan.ranks == 0,
             "mnist: --batch-size {} does not split evenly over {}", o.batch_size, apps::ranks_text(o.plan, 0));
  run.plan = apps::plan_from_flags(o.plan, plan_request(o, ranks.fsdp, run.data.rows, run.data.cols), ranks,
                                   run.device, {double(o.batch_size), "images"}, "weft-mnist");
  if (o.plan.only()) return;  // printed; nothing to build or train
  if (run.plan && run.plan->budget) run.per_layer = run.plan->settings.reshard_after_forward;
  manual_seed(o.seed);  // the same full model on every rank
  if (ranks.fsdp) {
    // Deferred: built on the meta device, each rank later initialises only its shards (the
    // values of the eager build, bit for bit).
    DefaultDeviceGuard meta(Device::meta());
    run.model = apps::make_mnist_model(o.model, run.data.rows, run.data.cols);
  } else {
    run.model = apps::make_mnist_model(o.model, run.data.rows, run.data.cols);
    run.model->to(run.device);  // initialised on the host (the same values on every device), then moved
  }
  apps::check_outputs_apart({{"--metrics", o.metrics}, {"--save", o.save, true}, {"WEFT_TRACE", trace::file()}},
                            {{"--data", o.data}, {"--load", run.resume_from}}, "mnist");
  if (!o.save.empty() && ranks.lead() && !o.plan.only()) run.dir_lock.emplace(o.save);  // nothing made before
  run.identity = apps::run_identity(run.resume_from);
  if (run.dir_lock)
    apps::check_checkpoint_owner(o.save, "--save", run.identity, run.resume_from, o.overwrite_checkpoints, "--load", "mnist");
  run.metrics.emplace(ranks.lead() ? o.metrics : std::string());  // one file, written by rank 0
}

// The loop's batches (each epoch's shuffled order, batch after batch), the test set's
// evaluation after each epoch, and what the checkpoints record.
class MnistTask : public apps::TrainingTask {
 public:
  MnistTask(const Options& o, const Run& run, const Ranks& ranks) : o_(o), run_(run), ranks_(ranks) {}
  apps::Batch batch(int64_t step, int64_t, int64_t lo, int64_t hi) override {
    const int64_t epoch = step / run_.steps_per_epoch;
    if (epoch != order_epoch_) order_ = epoch_order(run_.data.train.images.size(0), o_.seed, epoch);
    order_epoch_ = epoch;
    const int64_t i = step - epoch * run_.steps_per_epoch;
    auto [x, y] = apps::mnist_batch(run_.data.train, order_, i * o_.batch_size + lo, hi - lo);
    return {x, y};
  }
  void evaluate(const Evaluation& at) override {
    auto [test_loss, acc] = ::evaluate(*run_.model, run_.data.test, ranks_, run_.device, o_.autocast(), run_.leaves);
    const int64_t epoch = (at.step - 1) / run_.steps_per_epoch + 1;
    if (ranks_.lead()) {
      std::fprintf(stderr, "epoch %lld: test loss %.4f, test accuracy %.2f%%\n", (long long)epoch,
                   apps::unsigned_nan(test_loss), 100 * acc);
      std::printf("epoch %lld test_accuracy %.4f test_loss %.4f\n", (long long)epoch, acc, apps::unsigned_nan(test_loss));
      std::fflush(stdout);
    }
    at.metrics.write({{"split", std::string("test")}, {"epoch", epoch}, {"step", at.step}, {"loss", test_loss},
                      {"accuracy", acc}});
    at.nan.check_evaluation(test_loss, fmt::format("the test loss is {} after epoch {}",
                                                   apps::describe_value(test_loss), epoch), at.watch);
  }
  fsdp::CheckpointProgress checkpoint(int64_t step) override {
    return {.data = {{"epoch", step / run_.steps_per_epoch}, {"batch", step % run_.steps_per_epoch}},
            .app = describe(o_, run_.train_set)};
  }

 private:
  const Options& o_;
  const Run& run_;
  const Ranks& ranks_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

apps::LoopOptions loop_options(const Options& o, const Run& run) {
  return {.program = "weft-mnist", .device = run.device, .batch_size = o.batch_size, .items_per_step = o.batch_size,
          .unit = "samples", .epoch_steps = run.steps_per_epoch, .log_every = o.log_every, .autocast = o.autocast(),
          .on_nan = apps::parse_on_nan(o.on_nan), .max_skipped = o.max_skipped,
          .checkpoints = {o.save, "--save", o.checkpoint_every, o.keep_last, run.identity, o.overwrite_checkpoints}};
}

void print_run(const Options& o, const Run& run, const Ranks& ranks, int64_t n_params, bool sharded) {
  if (!ranks.lead()) return;
  std::fprintf(stderr, "weft-mnist: %s (%lld parameters), %lld train / %lld test samples from %s, batch %lld, "
               "%lld steps/epoch, %d threads, on %s\n", o.model.c_str(), (long long)n_params,
               (long long)run.data.train.images.size(0), (long long)run.data.test.images.size(0), o.data.c_str(),
               (long long)o.batch_size, (long long)run.steps_per_epoch, get_num_threads(), run.device.str().c_str());
  if (sharded)
    std::fprintf(stderr, "weft-mnist: FSDP over %d ranks: one group per layer, %lld parameters on rank 0, "
                 "%lld samples per rank per step\n", ranks.world, (long long)apps::count_parameters(*run.model),
                 (long long)(o.batch_size / ranks.world));
}

int run(const Options& o, const Ranks& ranks) {
  Run run;
  dist::agree(ranks.groups(), "mnist", [&] { prepare_run(o, ranks, run); });
  if (o.plan.only()) return 0;
  auto read = run.train_set;
  if (ranks.fsdp) read["test_sha256"] = training_set(run.data.test).at("train_sha256");  // its images and labels
  apps::check_same_data(read, ranks, "weft-mnist");
  apps::check_shared_dir(o.save, "--save", ranks, "weft-mnist");
  const int64_t n_params = apps::count_parameters(*run.model);
  std::optional<fsdp::FSDPModule> root;
  if (ranks.fsdp) root = shard_model(run.model, run.device, o, nullptr, run.per_layer);
  auto opt = make_optimizer(o, run.model->parameters());  // after sharding: steps this rank's shards
  MnistTask task(o, run, ranks);
  apps::Trainer trainer(loop_options(o, run), {run.model.get(), opt.get(), nullptr, root ? &*root : nullptr}, ranks,
                        run.leaves, task, *run.metrics);
  if (!run.resume_from.empty()) {
    trainer.resume(run.resume_from);
    // The optimizer state brought the checkpoint's learning rate back; an explicit --lr wins (as
    // setting param_groups' lr after load_state_dict does in PyTorch).
    if (opt->lr() != o.lr && ranks.lead())
      std::fprintf(stderr, "weft-mnist: --lr %g replaces the checkpoint's learning rate %g\n", o.lr, opt->lr());
    opt->set_lr(o.lr);
  }
  print_run(o, run, ranks, n_params, root.has_value());
  int64_t end = o.epochs * run.steps_per_epoch;
  if (o.steps > 0) end = std::min(end, o.steps);
  if (const int status = trainer.run(end); status != 0) return status;
  apps::report_peak_memory("weft-mnist", run.device, run.start_bytes, ranks, run.plan);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"weft-mnist: train an MLP or CNN classifier on Fashion-MNIST (IDX files)"};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(apps::cli::integer(1, 1000000))->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "samples per step (the global batch under --fsdp)")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->check(apps::cli::number_above(0))->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw, adam or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adamw", "adam", "sgd"}))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for initialisation and data order")->check(apps::cli::seed())->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (per rank; default: OMP_NUM_THREADS or all cores)")
      ->check(apps::cli::threads());
  app.add_option("--metrics", o.metrics, "append JSONL metrics to FILE (rank 0 writes)");
  auto* save = app.add_option("--save", o.save, "write a checkpoint (model, optimizer, data position) to "
                              "DIR/step_<N>/ at the end: one file per rank plus index.json, also under --fsdp; one "
                              "run at a time may write DIR");
  app.add_option("--checkpoint-every", o.checkpoint_every, "with --save: also every N steps (0: only at the end)")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->needs(save);
  app.add_option("--keep-last", o.keep_last, "with --save: keep only the K newest checkpoints (0: all), besides "
                 "them the lowest training loss's, the one before it and the newest known to resume")
      ->check(apps::cli::integer(0, 1000000))->needs(save);
  app.add_flag(apps::kOverwriteCheckpointsFlag, o.overwrite_checkpoints, "let this run replace the checkpoints "
               "another run wrote to --save (removed at its first save)")->needs(save);
  app.add_option("--load,--resume", o.load, "resume from the latest checkpoint in DIR (written at any number of ranks)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--steps", o.steps, "stop at optimizer step N, counted from the run's start also after --load (0, the "
                 "default: run all of --epochs)")->check(apps::cli::integer(0, int64_t(1) << 40));
  app.add_option("--data", o.data, "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]")->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between metrics lines")->check(apps::cli::integer(1, int64_t(1) << 40))->capture_default_str();
  app.add_option("--device", o.device, "cpu, cuda (this rank's GPU) or cuda:N: where the model and batches live")
      ->capture_default_str();
  app.add_option("--on-nan", o.on_nan, "when the loss is NaN or infinite: error (stop), skip (drop that step's "
                 "update) or ignore (train on)")->check(CLI::IsMember({"error", "skip", "ignore"}))->capture_default_str();
  auto* max_skipped = app.add_option("--max-skipped-steps", o.max_skipped, "with --on-nan skip: give up (exit 1) "
                                     "after N skipped steps in a row")->check(apps::cli::integer(1, 1000000))
                          ->capture_default_str();
  apps::add_plan_flags(app, o.plan);
  app.add_flag("--fsdp", o.fsdp, "shard the model over the ranks of mpirun with fsdp::fully_shard (see below)");
  auto* det = app.add_flag("--deterministic", o.deterministic, "the same bits at any number of ranks and threads: each "
                           "batch split into --virtual-batches micro-batches, every sum over them in one fixed order");
  app.add_option("--virtual-batches", o.virtual_batches, "with --deterministic: micro-batches per batch; the number "
                 "of ranks must divide it into a power of two per rank")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str()->needs(det);
  app.add_option("--mixed-precision", o.mixed_precision,
                 "bf16: products (linear, conv) in bf16 with f32 master weights: autocast, or under --fsdp "
                 "bf16 parameters gathered and gradients reduced in f32; none keeps f32")
      ->check(CLI::IsMember({"bf16", "none"}))->capture_default_str();
  app.footer(
      "Sharded training (--fsdp): mpirun -np N --oversubscribe --bind-to none weft-mnist --fsdp ...\n"
      "  Each layer (fc1, fc2, fc3 / conv1, conv2, fc1, fc2) is one FSDP group, then the root; each rank\n"
      "  holds 1/N of the parameters, gradients and optimizer state. --batch-size stays the global\n"
      "  batch: rank r trains on rows [r*B/N, (r+1)*B/N) of the same batch, so B must be a multiple of\n"
      "  N, and losses and accuracy match a single-process run with the same flags (up to float\n"
      "  rounding). The logged loss is the mean over all ranks; rank 0 prints and writes metrics.\n"
      "  --save writes a checkpoint directory: every rank its own shards (no gathering) and rank 0 an\n"
      "  index; --load reads it at any number of ranks, with or without --fsdp (each rank reads the\n"
      "  pieces of its slice), so the directory must be visible to all of them.\n"
      "  Set OMP_NUM_THREADS or --threads so that ranks x threads fits the cores.");
  if (const auto rc = apps::parse_launched(app, argc, argv, "weft-mnist")) return *rc;
  return dist::run_program("weft-mnist", [&] {
    WEFT_CHECK(max_skipped->count() == 0 || o.on_nan == "skip", "mnist: --max-skipped-steps applies to --on-nan skip "
               "only (--on-nan is {})", o.on_nan);
    const Ranks ranks = apps::start_ranks("weft-mnist", o.fsdp, {}, shared_settings(o));
    return run(o, ranks);
  });
}
