// weft-simple: the smallest complete FSDP program. A toy residual MLP is sharded block by block
// and then at the root, trained for a few AdamW steps on synthetic data, and each rank reports
// how much of the model it holds. The same binary runs alone or over N ranks:
//   ./build/apps/simple/weft-simple
//   mpirun -np 2 ./build/apps/simple/weft-simple
#include <cstdio>
#include <cstring>

#include "fsdp/fsdp.h"
#include "weft.h"

using namespace weft;

namespace {

constexpr int64_t kDim = 32, kClasses = 4;
constexpr int64_t kBatch = 64;  // the global batch: the ranks split it, so N must divide it
constexpr int kSteps = 10;

// Pre-norm residual block: x + fc2(gelu(fc1(norm(x)))).
struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  Block() : nn::Module("Block") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(kDim));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(kDim, 4 * kDim));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(4 * kDim, kDim));
  }
  Tensor forward(const Tensor& x) override { return x + (*fc2)(gelu((*fc1)((*norm)(x)))); }
  using nn::Module::forward;
};

struct ToyModel : nn::Module {
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::Linear> head;
  ToyModel() : nn::Module("ToyModel") {
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 3; ++i) blocks->push_back(std::make_shared<Block>());
    head = register_module("head", std::make_shared<nn::Linear>(kDim, kClasses));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& block : *blocks) h = (*block)(h);
    return (*head)(h);
  }
  using nn::Module::forward;
};

// Step `step`'s global batch, identical on every rank because its generator is seeded by the
// step alone. The task: which of the first kClasses inputs is the largest.
std::pair<Tensor, Tensor> global_batch(int step) {
  Generator gen(1000 + uint64_t(step));
  Tensor x = randn({kBatch, kDim}, {}, &gen);
  return {x, argmax(x.narrow(1, 0, kClasses), 1)};
}

int64_t numel_of(const std::vector<Tensor>& params) {
  int64_t n = 0;
  for (const Tensor& p : params) n += p.numel();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    // --help prints the usage to stdout; anything else is named on stderr, the usage after it.
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::FILE* out = help ? stdout : stderr;
    if (!help) std::fprintf(stderr, "weft-simple: unknown argument \"%s\" (it takes none)\n", argv[1]);
    std::fprintf(out, "usage: [mpirun -np N] weft-simple\n"
                 "Shards a 3-block toy MLP with fsdp::fully_shard and trains %d AdamW steps on a global\n"
                 "batch of %lld synthetic samples split over the N ranks (N must divide %lld).\n",
                 kSteps, (long long)kBatch, (long long)kBatch);
    return help ? 0 : 2;
  }
  try {
    dist::init();  // a world of one without mpirun
    const int rank = dist::rank(), world = dist::world_size();
    WEFT_CHECK(kBatch % world == 0, "{} ranks do not divide the global batch of {}", world, kBatch);

    manual_seed(0);  // every rank builds the same full model ...
    auto model = std::make_shared<ToyModel>();
    const int64_t full_params = numel_of(model->parameters());
    for (auto& block : *model->blocks) fsdp::fully_shard(block);  // ... then keeps 1/N of each block
    fsdp::FSDPModule root = fsdp::fully_shard(model);             // and of what is left (the head)
    nn::AdamW opt(model->parameters(), {.lr = 1e-2});              // built after sharding: steps the shards

    const int64_t rows = kBatch / world;
    double first_loss = 0, loss_avg = 0;
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = global_batch(step);
      opt.zero_grad();
      Tensor loss = cross_entropy((*model)(x.narrow(0, rank * rows, rows)), y.narrow(0, rank * rows, rows));
      loss.backward();  // gradients are averaged over the ranks and land in each rank's shard
      opt.step();
      Tensor l = from_vector({loss.item()}, {1}, {.dtype = kFloat64});
      dist::world()->all_reduce(l, dist::ReduceOp::avg)->wait();  // the loss of the global batch
      loss_avg = l.item();
      if (step == 0) first_loss = loss_avg;
      if (rank == 0) std::printf("step %2d  loss %.4f\n", step + 1, loss_avg);
    }

    // Every rank's share of the parameters, collected on rank 0.
    Tensor mine = from_vector({double(numel_of(model->parameters()))}, {1}, {.dtype = kInt64});
    Tensor counts = empty({world}, {.dtype = kInt64});
    dist::world()->all_gather_into_tensor(counts, mine)->wait();
    auto info = root.shard_info("blocks.0.fc1.weight");
    if (rank == 0) {
      std::vector<double> c = to_vector(counts);
      for (int r = 0; r < world; ++r)
        std::printf("rank %d holds %lld of %lld parameters (%.1f%%)\n", r, (long long)c[size_t(r)],
                    (long long)full_params, 100.0 * c[size_t(r)] / double(full_params));
      std::printf("e.g. blocks.0.fc1.weight: full %s, rank 0 holds rows [%lld, %lld) of dim 0\n",
                  shape_str(info.global_shape).c_str(), (long long)info.offset, (long long)(info.offset + info.length));
      std::printf("loss %s from %.4f to %.4f in %d steps on %d rank(s)\n",
                  loss_avg < first_loss ? "decreased" : "did not decrease", first_loss, loss_avg, kSteps, world);
    }
    dist::finalize();
    return 0;
  } catch (const std::exception& e) {
    // A failure on one rank must end the others too, or they would wait in the next collective.
    std::string message = std::string("weft-simple: error: ") + e.what();
    if (dist::is_initialized() && dist::world_size() > 1) dist::abort_job(message);
    std::fprintf(stderr, "%s\n", message.c_str());
    return 1;
  }
}
