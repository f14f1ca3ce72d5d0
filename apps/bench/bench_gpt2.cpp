// weft-bench-gpt2: training-step throughput of GPT-2 124M (12 layers, 12 heads, d_model 768, ctx 1024, vocabulary 50304
// = GPT-2's 50257 padded to a multiple of 128) on one GPU, printed every step as llm.c does: loss, step time, tokens/s,
// model FLOPs utilisation (MFU) and the device allocator's peak. scripts/bench_gpt2.sh runs it beside PyTorch eager and
// torch.compile (scripts/bench_gpt2_pytorch.py, the same model and step) and prints the comparison.
//
//   weft-bench-gpt2                                   # GPT-2 124M, bf16, batch 8, 20 steps, cuda
//   weft-bench-gpt2 --device cpu --n-layer 2 --n-head 2 --d-model 64 --ctx 64 --vocab 256
//
// The step: random token ids in [0, min(vocab, 50257)) from weft's generator (drawn before the
// timer; the upload is timed), forward, cross-entropy over all B x T positions, backward,
// gradient-norm clip, AdamW (betas 0.9/0.95, weight decay 0.1 on 2-D weights only, constant
// lr). The model is apps/transformer's GPT (nanoGPT's layout, GELU tanh, head tied to wte).
//
// bf16 (--precision bf16, the default): weft's mixed precision is FSDP's MixedPrecisionPolicy, so the model is wrapped
// by fully_shard (each block, then the root) in a world of one process: parameters stay f32 (AdamW updates f32 master
// weights, as torch.autocast training keeps them), each forward "gathers" them as bf16 copies that the matmuls,
// attention and layer norms read, gradients come back to the f32 shards, and the logits are returned in f32 for the
// loss. With one rank the gather is a cast and the reduce-scatter a copy; the blocks keep their bf16 copies from
// forward to backward (reshard_after_forward = false), so each parameter is cast once per step, as autocast does.
// Casting the whole model to bf16 instead would leave AdamW without f32 master weights (and weft's fused Adam takes
// f32/f64 only). --precision autocast trains the plain model under weft's autocast instead (the linear layers and
// attention read bf16 copies of the f32 weights, made in each forward), as weft-transformer trains bf16 without --fsdp;
// --precision f32 trains the plain f32 model without FSDP.
//
// Model FLOPs per token (PaLM's estimate, as nanoGPT's estimate_mfu and llm.c use):
//   6 N + 12 L H hd T
// N = parameters except the position table (the tied wte is the LM head's matmul, so it counts; wpe is a lookup), 6N =
// forward + backward of every weight matmul, 12 L H hd T = the attention scores and weighted sums (not halved for the
// causal mask). MFU = FLOPs per token x tokens/s / --peak-tflops (default 989: H100 SXM dense bf16; use the f32/TF32
// peak with --precision f32 and the CPU's own peak, from weft-bench, with --device cpu).
//
// Timing: the device is synchronised before and after each step and the step is timed with steady_clock, so a step's
// time includes every kernel it queued. The summary line gives the medians over the steps after --warmup (default 5:
// cuBLASLt's heuristics, the caching allocator's first segments and NCCL's set-up happen in the first steps).
//
// --profile times every op of the measured steps (core/op_profiler.h; on a GPU alone, the device
// waited for around it) and prints, after the summary, one row per op: calls and milliseconds
// per step, its share of the step, its rate and on the CPU the op's own limit, measured here: the
// GEMM peak of its dtype for the GEMMs and attention (the AMX tile or bf16 dot peak for bf16, the
// FMA peak for f32), the streaming bandwidth for every other op. "framework": outside every op.
//
// Without a CUDA build or a visible GPU, --device cuda prints why and exits 77 (SKIP).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/cli.h"
#include "apps/bench/machine_peaks.h"
#include "apps/common/device.h"
#include "apps/common/op_table.h"
#include "apps/common/trainer.h"
#include "apps/transformer/gpt.h"
#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/op_profiler.h"
#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "weft.h"
#include "core/stream.h"

using namespace weft;

namespace {

constexpr int kSkip = 77;  // meson's SKIP: no usable device
constexpr int64_t kGpt2Tokens = 50257;  // GPT-2's real vocabulary; ids above it are padding
constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  apps::ModelConfig model{.vocab_size = 50304, .ctx = 1024, .n_layer = 12, .n_head = 12, .d_model = 768};
  std::string device = "cuda", precision = "bf16";
  int64_t batch = 8, steps = 20, warmup = 5;
  double lr = 3e-4, weight_decay = 0.1, clip = 1.0, peak_tflops = 989.0;
  uint64_t seed = 0;
  int threads = 0;
  bool profile = false;
};

// Why --device cannot be used ("" when it can). Only a missing CUDA build or device is a
// reason to skip; a malformed name is left to parse_device's error.
std::string unavailable(const std::string& device) {
  if (device != "cuda" && device.rfind("cuda:", 0) != 0) return "";
  return apps::cuda_unavailable_reason();
}

std::string describe(Device d) {
  if (!d.is_cpu()) return d.str() + ", " + device_description(d);
  return fmt::format("{}, {} threads", d.str(), get_num_threads());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// [rows, cols] int64 ids in [0, range), drawn on the host from `gen`.
Tensor random_tokens(int64_t rows, int64_t cols, int64_t range, Generator& gen) {
  Tensor t = empty({rows, cols}, {.dtype = kInt64});
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = int64_t(gen.next_u64() % uint64_t(range));
  return t;
}

// bf16: fully_shard each block, then the root, with bf16 compute and f32 master weights and
// gradients (see the header comment).
fsdp::FSDPModule shard_bf16(const std::shared_ptr<apps::GPT>& model) {
  fsdp::FullyShardOptions opts;
  opts.reshard_after_forward = false;  // one rank: keep the bf16 copies for backward
  opts.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = kFloat32};
  for (auto& block : model->blocks) fsdp::fully_shard(block, opts);
  opts.mp_policy.output_dtype = kFloat32;  // logits in f32 for the loss
  return fsdp::fully_shard(model, opts);
}

// AdamW with weight decay on the parameters named in `decay_names` only.
nn::AdamW make_adamw(const Options& o, apps::GPT& model, const std::vector<std::string>& decay_names) {
  std::vector<Tensor> decay, no_decay;
  for (auto& [name, p] : model.named_parameters())
    (std::find(decay_names.begin(), decay_names.end(), name) != decay_names.end() ? decay : no_decay).push_back(p);
  const nn::AdamWOptions opts{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay};
  return nn::AdamW({nn::ParamGroup{decay, {}}, nn::ParamGroup{no_decay, {{"weight_decay", 0.0}}}}, opts);
}

// The model, the run and the FLOPs lines, then the head of the per-step table.
void print_header(const Options& o, Device device, int64_t n_params, int64_t n_flop_params, double flops_per_token,
                  int64_t token_range) {
  const int64_t B = o.batch, T = o.model.ctx;
  std::printf("# weft-bench-gpt2: GPT n_layer %lld, n_head %lld, d_model %lld, ctx %lld, vocab %lld (tied head): "
              "%lld parameters\n", (long long)o.model.n_layer, (long long)o.model.n_head, (long long)o.model.d_model,
              (long long)T, (long long)o.model.vocab_size, (long long)n_params);
  std::printf("# %s; %s; batch %lld x %lld = %lld tokens/step; AdamW lr %g, clip %g; random tokens in [0, %lld)\n",
              describe(device).c_str(),
              o.precision == "bf16"       ? "bf16 compute, f32 master weights (FSDP MixedPrecisionPolicy, one rank)"
              : o.precision == "autocast" ? "bf16 compute, f32 weights (autocast)" : "f32",
              (long long)B, (long long)T, (long long)(B * T), o.lr, o.clip, (long long)token_range);
  std::printf("# model FLOPs/token 6N + 12*L*H*hd*T = %.4g (N = %lld without wpe); MFU against %g TFLOP/s\n",
              flops_per_token, (long long)n_flop_params, o.peak_tflops);
  std::printf("| step | loss | ms | tokens/s | MFU %% | peak MiB |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
}

// One line in a fixed key=value form: scripts/bench_gpt2.sh reads it (as it reads the PyTorch script's).
void print_summary(const Options& o, Device device, int64_t warmup, double flops_per_token,
                   const std::vector<double>& ms_measured) {
  const double ms = median(ms_measured), tok_s = double(o.batch * o.model.ctx) / (ms * 1e-3);
  const MemoryStats mem = memory_stats(device);
  std::printf("summary impl=weft precision=%s steps=%lld-%lld ms=%.2f tokens_per_s=%.0f mfu=%.4f peak_mib=%.1f "
              "reserved_mib=%.1f\n", o.precision.c_str(), (long long)(warmup + 1), (long long)o.steps, ms, tok_s,
              flops_per_token * tok_s / (o.peak_tflops * 1e12), double(mem.peak_bytes) / kMiB,
              double(mem.reserved_bytes) / kMiB);
  std::fflush(stdout);
}

// The op profiler's rows over `steps` steps of `step_ms` (their mean) each, against this machine's
// limits on the CPU (see the header comment).
void print_profile(int64_t steps, double step_ms, Device device) {
  if (!device.is_cpu()) {
    std::printf("# per-op profile of %lld steps on %s, each op timed alone\n", (long long)steps, device.str().c_str());
    return apps::print_op_table(steps, step_ms, {});
  }
  const int threads = get_num_threads();
  std::fprintf(stderr, "weft-bench-gpt2: measuring the machine's peaks for the profile\n");
  const double peak_f32 = bench::gemm_peak_gflops("f32", threads), peak_bf16 = bench::gemm_peak_gflops("bf16", threads);
  const double stream = bench::stream_gbs(threads);
  std::printf("# per-op profile of %lld steps, %d thread%s; limits: GEMM peak f32 %.0f GFLOP/s, bf16 %.0f GFLOP/s, "
              "streaming bandwidth %.1f GB/s\n", (long long)steps, threads, threads > 1 ? "s" : "", peak_f32, peak_bf16,
              stream);
  apps::print_op_table(steps, step_ms, [&](const op_profiler::Row& r) {
    const double gflops = r.flops / r.seconds / 1e9, gbs = r.bytes / r.seconds / 1e9;
    return r.flops > 0 ? 100 * gflops / (r.name.ends_with("bf16") ? peak_bf16 : peak_f32) : 100 * gbs / stream;
  });
}

int run(const Options& o) {
  const bool bf16 = o.precision == "bf16";
  // fully_shard needs dist; a world of one process (MPI singleton start) is all this uses.
  if (bf16) {
    dist::init();
    WEFT_CHECK(dist::world_size() == 1, "weft-bench-gpt2: measures one GPU in one process; run it without mpirun "
               "(this is rank {} of {})", dist::rank(), dist::world_size());
  }
  const Device device = apps::parse_device(o.device, "weft-bench-gpt2");
  apps::cli::use_threads(o.threads);
  apps::check_config(o.model);
  const int64_t B = o.batch, T = o.model.ctx, V = o.model.vocab_size;
  const int64_t warmup = std::min(o.warmup, o.steps - 1);  // the default's 5 at most; a given --warmup is checked

  manual_seed(o.seed);
  auto model = std::make_shared<apps::GPT>(o.model);
  model->to(device);
  apps::init_gpt(*model);
  const int64_t n_params = apps::count_parameters(*model);
  const int64_t n_flop_params = n_params - model->wpe->weight.numel();
  const double hd = double(o.model.d_model / o.model.n_head);
  const double flops_per_token = 6.0 * double(n_flop_params) +
                                 12.0 * double(o.model.n_layer) * double(o.model.n_head) * hd * double(T);

  // Weight decay on the 2-D weights only, decided on the full shapes before sharding.
  std::vector<std::string> decay_names;
  for (auto& [name, p] : model->named_parameters())
    if (p.dim() >= 2) decay_names.push_back(name);
  std::optional<fsdp::FSDPModule> root;
  if (bf16) root = shard_bf16(model);
  nn::AdamW opt = make_adamw(o, *model, decay_names);

  const int64_t token_range = std::min(V, kGpt2Tokens);
  Generator gen(o.seed + 1);
  print_header(o, device, n_params, n_flop_params, flops_per_token, token_range);
  std::vector<double> ms_measured;
  for (int64_t step = 1; step <= o.steps; ++step) {
    Tensor tokens = random_tokens(B, T + 1, token_range, gen);
    Tensor x_host = tokens.narrow(1, 0, T).contiguous(), y_host = tokens.narrow(1, 1, T).contiguous();
    synchronize(device);
    if (o.profile && step == warmup + 1) op_profiler::start();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor x = x_host.to(device), y = y_host.to(device);
    opt.zero_grad();
    Tensor loss = apps::forward_backward(*model, x, y, o.precision == "autocast", 1);
    if (o.clip > 0) nn::clip_grad_norm_(model->parameters(), o.clip);  // sharded or not
    opt.step();
    const double loss_v = loss.item();
    synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step > warmup) ms_measured.push_back(ms);
    const double tok_s = double(B * T) / (ms * 1e-3);
    const double mfu = flops_per_token * tok_s / (o.peak_tflops * 1e12);
    std::printf("| %lld | %.6f | %.2f | %.0f | %.2f | %.1f |\n", (long long)step, loss_v, ms, tok_s, 100.0 * mfu,
                double(memory_stats(device).peak_bytes) / kMiB);
    std::fflush(stdout);
    WEFT_CHECK(std::isfinite(loss_v), "weft-bench-gpt2: loss is {} at step {}", loss_v, step);
  }
  print_summary(o, device, warmup, flops_per_token, ms_measured);
  if (o.profile) {
    op_profiler::stop();
    print_profile(int64_t(ms_measured.size()), std::accumulate(ms_measured.begin(), ms_measured.end(), 0.0) /
                                                   double(ms_measured.size()), device);
  }
  root.reset();
  opt.zero_grad();
  if (dist::is_initialized()) dist::finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench-gpt2: GPT-2 124M training steps on one GPU (bf16), with tokens/s, MFU and peak memory "
               "every step"};
  Options o;
  app.add_option("--device", o.device, "cuda, cuda:N or cpu")->capture_default_str();
  app.add_option("--precision", o.precision, "bf16: bf16 compute with f32 master weights (FSDP mixed precision on "
                 "one rank); autocast: the same under autocast, without FSDP; f32: plain f32")
      ->check(CLI::IsMember({"bf16", "autocast", "f32"}))->capture_default_str();
  app.add_option("--batch-size", o.batch, "sequences per step")->check(apps::cli::integer(1, int64_t(1) << 30))->capture_default_str();
  app.add_option("--steps", o.steps, "training steps")->check(apps::cli::integer(1, int64_t(1) << 30))->capture_default_str();
  CLI::Option* warmup = app.add_option("--warmup", o.warmup, "first steps left out of the summary's medians (fewer than --steps)")
      ->check(apps::cli::integer(0, int64_t(1) << 30))->capture_default_str();
  app.add_option("--ctx", o.model.ctx, "tokens per sequence (and the position table)")->check(apps::cli::integer(1, apps::kMaxCtx))
      ->capture_default_str();
  app.add_option("--vocab", o.model.vocab_size, "vocabulary size (GPT-2's 50257 padded to 50304)")
      ->check(apps::cli::integer(1, apps::kMaxVocab))->capture_default_str();
  app.add_option("--n-layer", o.model.n_layer, "transformer blocks")->check(apps::cli::integer(1, apps::kMaxLayers))->capture_default_str();
  app.add_option("--n-head", o.model.n_head, "attention heads (must divide --d-model)")->check(apps::cli::integer(1, apps::kMaxHeads))
      ->capture_default_str();
  app.add_option("--d-model", o.model.d_model, "embedding width")->check(apps::cli::integer(1, apps::kMaxDModel))->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate (constant)")->check(apps::cli::number_above(0))->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW decay on 2-D weights")->check(apps::cli::number_from(0, 1e30))->capture_default_str();
  app.add_option("--clip", o.clip, "gradient-norm clip (0: none)")->check(apps::cli::number_from(0, 1e30))
      ->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "the device's peak for MFU, TFLOP/s (989: H100 SXM dense bf16)")
      ->check(apps::cli::number_above(0))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for the weights and the tokens")->check(apps::cli::seed())->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")
      ->check(apps::cli::threads());
  app.add_flag("--profile", o.profile, "print the time, rate and (cpu) limit of every op of the measured steps");
  CLI11_PARSE(app, argc, argv);
  if (warmup->count() && o.warmup >= o.steps) {
    std::fprintf(stderr, "weft-bench-gpt2: --warmup %lld must be fewer than --steps %lld (a step is measured)\n",
                 (long long)o.warmup, (long long)o.steps);
    return 105;
  }
  try {
    if (std::string why = unavailable(o.device); !why.empty()) {
      std::printf("weft-bench-gpt2: skipped: --device %s: %s\n", o.device.c_str(), why.c_str());
      return kSkip;
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-gpt2: error: %s\n", e.what());
    try {
      if (dist::is_initialized()) dist::finalize();
    } catch (const std::exception&) {
    }
    return 1;
  }
}
