// weft-bench-tp: training-step throughput of a Llama or a GPT-2 split by tensor parallelism over the ranks of mpirun as
// weft-transformer --tp splits it (apps/transformer/tensor_parallel.h), the twin of scripts/fsdp2_llama_pytorch.py
// --mode tp and scripts/tp_gpt_pytorch.py (PyTorch's DTensor ColwiseParallel / RowwiseParallel on the same blocks). The
// ranks form a (dp, tp) mesh, tp = --tp (default: all of them): the ranks of a tp group train on the same rows of the
// batch, the dp groups on different rows, with fully_shard over dp when dp > 1.
//
//   mpirun -np 2 weft-bench-tp                  # the Llama medium config, 20 steps, 1 thread a rank
//   mpirun -np 2 weft-bench-tp --sequence-parallel --loss-parallel
//   mpirun -np 4 weft-bench-tp --tp 2           # (dp 2, tp 2): fully_shard over dp on top
//   mpirun -np 2 weft-bench-tp --arch gpt2      # GPT medium (6 layers, 6 heads, d_model 384)
//
// The step: random token ids (drawn before the timer), forward, cross-entropy over all B x T positions
// (tp::vocab_parallel_cross_entropy under --loss-parallel), backward, gradient-norm clip 1.0, AdamW (lr 3e-4, weight
// decay 0.1 on every parameter, as the twin). Ranks meet at a barrier before each step; rank 0 prints the median step
// time after --warmup and tokens/s of the whole batch (its loss is its dp group's).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <vector>

#include "apps/common/cli.h"
#include "apps/common/trainer.h"
#include "apps/transformer/model.h"
#include "apps/transformer/tensor_parallel.h"
#include "weft.h"

using namespace weft;

namespace {

struct Options {
  apps::ModelConfig model{.vocab_size = 256, .ctx = 256, .n_layer = 6, .n_head = 6, .d_model = 384,
                          .tie_weights = false, .arch = "llama", .n_kv_head = 2, .ffn_dim = 1024};
  int64_t batch = 8, steps = 20, warmup = 5, threads = 1, tp = 0;
  bool sequence_parallel = false, loss_parallel = false;
};

int run(const Options& o) {
  set_num_threads(int(o.threads));
  const int tp = o.tp > 0 ? int(o.tp) : dist::world_size(), dp = dist::world_size() / tp;
  WEFT_CHECK(dp * tp == dist::world_size(), "--tp {} must divide the {} ranks of mpirun", tp, dist::world_size());
  WEFT_CHECK(o.batch % dp == 0, "--batch-size {} must split evenly over the {} data-parallel groups", o.batch, dp);
  apps::check_config(o.model);
  manual_seed(0);
  const apps::LanguageModel lm = apps::make_model(o.model);
  apps::init_model(lm);
  const auto& model = lm.module;
  const int64_t n_params = apps::count_parameters(*model);
  // weft-transformer --tp's layout and plan, with sequence and loss parallel as the flags say.
  apps::TensorParallel layout = apps::make_tensor_parallel(o.model, tp, true);
  layout.sequence_parallel = o.sequence_parallel, layout.loss_parallel = o.loss_parallel;
  apps::parallelize(lm, layout);
  const dist::DeviceMesh& mesh = *layout.mesh;
  std::optional<fsdp::FSDPModule> root;
  if (dp > 1) {
    for (auto& block : lm.blocks) fsdp::fully_shard(block, {.mesh = layout.over_dp});
    root = fsdp::fully_shard(model, {.mesh = layout.over_dp});
  }
  const apps::LossFn loss_fn = apps::tensor_parallel_loss(layout);
  nn::AdamW opt(model->parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  Generator gen(1);
  std::vector<double> times, losses;
  for (int64_t step = 0; step < o.steps; ++step) {
    const Tensor ids = (rand({o.batch, o.model.ctx + 1}, {}, &gen) * double(o.model.vocab_size)).to(kInt64);
    const int64_t rows = o.batch / dp, first = rows * mesh.coordinate(0);  // this dp group's rows
    const Tensor x = ids.narrow(0, first, rows).narrow(1, 0, o.model.ctx);
    const Tensor y = ids.narrow(0, first, rows).narrow(1, 1, o.model.ctx).contiguous();
    dist::world()->barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor logits = (*model)(x);
    logits = logits.reshape({-1, logits.size(-1)});
    Tensor loss = apps::loss_of(loss_fn, logits, y.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    losses.push_back(loss.item());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (dist::rank() != 0) return 0;
  std::vector<double> timed(times.begin() + std::min<int64_t>(o.warmup, o.steps - 1), times.end());
  std::sort(timed.begin(), timed.end());
  const double median = timed[timed.size() / 2];
  std::printf("weft %s dp=%d tp=%d threads/rank=%lld sequence_parallel=%d loss_parallel=%d params=%lld n_layer=%lld "
              "d_model=%lld ctx=%lld batch=%lld\n", o.model.arch.c_str(), dp, tp, (long long)o.threads,
              int(o.sequence_parallel), int(o.loss_parallel), (long long)n_params, (long long)o.model.n_layer, (long long)o.model.d_model,
              (long long)o.model.ctx, (long long)o.batch);
  std::printf("summary ms_per_step=%.1f tokens_per_s=%.0f min_ms=%.1f max_ms=%.1f\nlosses:", 1e3 * median,
              double(o.batch * o.model.ctx) / median, 1e3 * timed.front(), 1e3 * timed.back());
  for (size_t i = 0; i < losses.size(); ++i) std::printf(" %zu:%.6f", i + 1, losses[i]);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"weft-bench-tp: Llama or GPT-2 training steps split by tensor parallelism over the ranks of mpirun; rank 0 "
               "prints the median step, tokens/s of the whole batch, and the losses of its data-parallel group's rows"};
  app.add_option("--arch", o.model.arch, "llama, or gpt2 (biases, GELU, 4 d_model MLP, tied head: --n-kv-head and "
                 "--ffn-dim are ignored)")->check(CLI::IsMember({"llama", "gpt2"}))->capture_default_str();
  app.add_option("--n-layer", o.model.n_layer, "blocks")->check(apps::cli::integer(1, apps::kMaxLayers))->capture_default_str();
  app.add_option("--n-head", o.model.n_head, "query heads")->check(apps::cli::integer(1, apps::kMaxHeads))->capture_default_str();
  app.add_option("--n-kv-head", o.model.n_kv_head, "key/value heads")->check(apps::cli::integer(1, apps::kMaxHeads))->capture_default_str();
  app.add_option("--d-model", o.model.d_model, "width")->check(apps::cli::integer(1, apps::kMaxDModel))->capture_default_str();
  app.add_option("--ffn-dim", o.model.ffn_dim, "SwiGLU's width")->check(apps::cli::integer(1, int64_t(1) << 20))->capture_default_str();
  app.add_option("--ctx", o.model.ctx, "tokens per sequence")->check(apps::cli::integer(1, apps::kMaxCtx))->capture_default_str();
  app.add_option("--vocab", o.model.vocab_size, "vocabulary")->check(apps::cli::integer(1, apps::kMaxVocab))->capture_default_str();
  app.add_option("--batch-size", o.batch, "sequences per step in all (each data-parallel group trains batch / dp of them)")->check(apps::cli::integer(1, int64_t(1) << 30))->capture_default_str();
  app.add_option("--steps", o.steps, "steps")->check(apps::cli::integer(1, int64_t(1) << 30))->capture_default_str();
  CLI::Option* warmup = app.add_option("--warmup", o.warmup, "first steps left out of the median (fewer than --steps)")->check(apps::cli::integer(0, int64_t(1) << 30))->capture_default_str();
  app.add_option("--threads", o.threads, "threads per rank")->check(apps::cli::threads())->capture_default_str();
  app.add_option("--tp", o.tp, "ranks a tensor-parallel group (default: all; the rest data-parallel under fully_shard)")
      ->check(apps::cli::integer(1, int64_t(1) << 20));
  app.add_flag("--sequence-parallel", o.sequence_parallel, "llama: norms and the residual stream on sequence blocks");
  app.add_flag("--loss-parallel", o.loss_parallel, "llama: the vocabulary split (embedding, head, loss)");
  CLI11_PARSE(app, argc, argv);
  if (o.model.arch == "gpt2") o.model.n_kv_head = 0, o.model.ffn_dim = 0, o.model.tie_weights = true;
  if (o.model.arch == "gpt2" && (o.sequence_parallel || o.loss_parallel)) {
    std::fprintf(stderr, "weft-bench-tp: --sequence-parallel and --loss-parallel are for --arch llama\n");
    return 105;
  }
  if (warmup->count() && o.warmup >= o.steps) {
    std::fprintf(stderr, "weft-bench-tp: --warmup %lld must be fewer than --steps %lld (a step is measured)\n",
                 (long long)o.warmup, (long long)o.steps);
    return 105;
  }
  dist::init();
  int status = 1;
  try {
    status = run(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-bench-tp: %s\n", e.what());
  }
  dist::finalize();
  return status;
}
