// weft-mnist: trains an MLP or CNN classifier on Fashion-MNIST (or any IDX data set).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <numeric>
#include <thread>

#include "apps/common/metrics.h"
#include "apps/common/progress.h"
#include "apps/mnist/idx.h"
#include "apps/mnist/models.h"
#include "core/safetensors.h"
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
  int64_t steps = 0;  // 0: no limit
  std::string data = apps::kDefaultMnistDir;
  int64_t log_every = 50;
};

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

std::pair<double, double> evaluate(nn::Module& model, const apps::MnistSplit& split) {
  NoGradGuard no_grad;
  model.eval();
  int64_t n = split.images.size(0), correct = 0;
  double loss_sum = 0;
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t b = 0; b < n; b += 1000) {
    int64_t m = std::min<int64_t>(1000, n - b);
    auto [x, y] = apps::mnist_batch(split, all, b, m);
    Tensor logits = model(x);
    loss_sum += cross_entropy(logits, y, {.reduction = "sum"}).item();
    correct += int64_t(sum(eq(argmax(logits, 1), y)).item());
  }
  model.train();
  return {loss_sum / double(n), double(correct) / double(n)};
}

void save_checkpoint(const std::string& path, nn::Module& model, nn::Optimizer& opt, const Options& o,
                     int64_t step) {
  NamedTensors all;
  for (auto& [k, t] : model.state_dict()) all.emplace_back("model." + k, t);
  for (auto& [k, t] : opt.state_dict()) all.emplace_back("optim." + k, t);
  save_safetensors(path, all,
                   {{"format", "weft-mnist"}, {"model", o.model}, {"optimizer", o.optimizer},
                    {"step", std::to_string(step)}, {"seed", std::to_string(o.seed)},
                    {"batch_size", std::to_string(o.batch_size)}});
}

// Restores model and optimizer; returns the step the checkpoint was taken at.
int64_t load_checkpoint(const std::string& path, nn::Module& model, nn::Optimizer& opt, const Options& o) {
  auto contents = load_safetensors(path);
  auto& meta = contents.metadata;
  auto get = [&](const std::string& k) {
    auto it = meta.find(k);
    WEFT_CHECK(it != meta.end(), "mnist: {} is not a weft-mnist checkpoint (no \"{}\" in its metadata)", path, k);
    return it->second;
  };
  WEFT_CHECK(get("format") == "weft-mnist", "mnist: {} is a \"{}\" file, not a weft-mnist checkpoint", path,
             get("format"));
  WEFT_CHECK(get("model") == o.model, "mnist: {} holds a {} model but --model is {}", path, get("model"), o.model);
  WEFT_CHECK(get("optimizer") == o.optimizer, "mnist: {} was trained with {} but --optimizer is {}", path,
             get("optimizer"), o.optimizer);
  nn::NamedTensorList model_sd, optim_sd;
  for (auto& [k, t] : contents.tensors) {
    if (k.rfind("model.", 0) == 0) model_sd.emplace_back(k.substr(6), t);
    else if (k.rfind("optim.", 0) == 0) optim_sd.emplace_back(k.substr(6), t);
    else WEFT_ERROR("mnist: unexpected tensor \"{}\" in {}", k, path);
  }
  model.load_state_dict(model_sd);
  opt.load_state_dict(optim_sd);
  return std::stoll(get("step"));
}

int run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  WEFT_CHECK(o.batch_size > 0 && o.epochs > 0 && o.lr > 0, "mnist: --batch-size, --epochs and --lr must be positive");
  apps::MnistData data = apps::load_mnist(o.data);
  int64_t n_train = data.train.images.size(0);
  int64_t steps_per_epoch = n_train / o.batch_size;  // the last partial batch is dropped
  WEFT_CHECK(steps_per_epoch > 0, "mnist: batch size {} exceeds the {} training samples", o.batch_size, n_train);

  manual_seed(o.seed);
  nn::ModulePtr model = apps::make_mnist_model(o.model, data.rows, data.cols);
  auto opt = make_optimizer(o, model->parameters());
  int64_t step = 0;
  if (!o.load.empty()) {
    step = load_checkpoint(o.load, *model, *opt, o);
    std::fprintf(stderr, "resumed from %s at step %lld\n", o.load.c_str(), (long long)step);
  }
  int64_t total_steps = o.epochs * steps_per_epoch;
  if (o.steps > 0) total_steps = std::min(total_steps, step + o.steps);
  int64_t n_params = 0;
  for (auto& p : model->parameters()) n_params += p.numel();
  std::fprintf(stderr, "weft-mnist: %s (%lld parameters), %lld train / %lld test samples from %s, batch %lld, "
               "%lld steps/epoch, %d threads\n", o.model.c_str(), (long long)n_params, (long long)n_train,
               (long long)data.test.images.size(0), o.data.c_str(), (long long)o.batch_size,
               (long long)steps_per_epoch, get_num_threads());

  apps::MetricsWriter metrics(o.metrics);
  while (step < total_steps) {
    int64_t epoch = step / steps_per_epoch;
    auto order = epoch_order(n_train, o.seed, epoch);
    int64_t epoch_end = std::min((epoch + 1) * steps_per_epoch, total_steps);
    apps::Progress progress(fmt::format("epoch {}", epoch + 1), epoch_end - epoch * steps_per_epoch, "samples");
    auto window_start = std::chrono::steady_clock::now();
    int64_t window_samples = 0;
    double loss_v = 0;
    while (step < epoch_end) {
      int64_t i = step - epoch * steps_per_epoch;
      auto [x, y] = apps::mnist_batch(data.train, order, i * o.batch_size, o.batch_size);
      opt->zero_grad();
      Tensor loss = cross_entropy((*model)(x), y);
      loss.backward();
      opt->step();
      ++step;
      window_samples += o.batch_size;
      loss_v = loss.item();
      progress.update(i + 1, o.batch_size, fmt::format("loss {:.4f}", loss_v));
      if (step % o.log_every == 0 || step == epoch_end) {
        auto now = std::chrono::steady_clock::now();
        double dt = std::chrono::duration<double>(now - window_start).count();
        metrics.write({{"step", step}, {"epoch", epoch + 1}, {"loss", loss_v}, {"lr", opt->lr()},
                       {"samples_per_s", dt > 0 ? double(window_samples) / dt : 0.0}});
        window_start = now;
        window_samples = 0;
      }
    }
    progress.finish(fmt::format("loss {:.4f}", loss_v));
    auto [test_loss, acc] = evaluate(*model, data.test);
    std::fprintf(stderr, "epoch %lld: test loss %.4f, test accuracy %.2f%%\n", (long long)(epoch + 1), test_loss,
                 100 * acc);
    std::printf("epoch %lld test_accuracy %.4f test_loss %.4f\n", (long long)(epoch + 1), acc, test_loss);
    metrics.write({{"split", std::string("test")}, {"epoch", epoch + 1}, {"step", step}, {"loss", test_loss},
                   {"accuracy", acc}});
  }
  if (!o.save.empty()) {
    save_checkpoint(o.save, *model, *opt, o, step);
    std::fprintf(stderr, "saved model and optimizer at step %lld to %s\n", (long long)step, o.save.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"weft-mnist: train an MLP or CNN classifier on Fashion-MNIST (IDX files)"};
  app.add_option("--model", o.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "samples per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw, adam or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adamw", "adam", "sgd"}))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for initialisation and data order")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", o.metrics, "append JSONL metrics to FILE");
  app.add_option("--save", o.save, "save model and optimizer (safetensors) to FILE at the end");
  app.add_option("--load", o.load, "resume from a checkpoint written by --save")->check(CLI::ExistingFile);
  app.add_option("--steps", o.steps, "stop after N more optimizer steps")->check(CLI::NonNegativeNumber);
  app.add_option("--data", o.data, "directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]")->capture_default_str();
  app.add_option("--log-every", o.log_every, "steps between metrics lines")->check(CLI::PositiveNumber)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-mnist: error: %s\n", e.what());
    return 1;
  }
}
