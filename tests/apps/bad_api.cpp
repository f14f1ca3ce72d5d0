// Bad input to weft's API, table driven: `bad_api CASE` runs one case that must throw weft::Error
// (exit 1, the message on stderr). A case that returns prints "no error" and exits 3; another
// exception type exits 2; a crash is a signal. tests/apps/bad_input.tsv lists the cases with the
// message each must print (rows "api CASE"); `bad_api --list` prints the names.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "core/safetensors.h"
#include "fsdp/fsdp.h"
#include "weft.h"

using namespace weft;

namespace {

nn::ModulePtr tiny_mlp() {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(4, 8));
  m->push_back(std::make_shared<nn::Linear>(8, 2));
  return m;
}

// A fresh directory of this process's own under the temp directory.
std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("weft_bad_api_{}_{}", ::getpid(), name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// An AdamW state dict after one step, with element 0 of every `state` tensor set to `value`,
// loaded back.
void load_adamw_state_with(const std::string& state, double value) {
  auto m = tiny_mlp();
  nn::AdamW opt(m->parameters(), {});
  for (auto& p : m->parameters()) p.set_grad(ones_like(p));
  opt.step();
  auto sd = opt.state_dict();
  for (auto& [k, t] : sd)
    if (k.size() > state.size() && k.compare(k.size() - state.size(), state.size(), state) == 0 &&
        k[k.size() - state.size() - 1] == '.')
      t.view({-1}).narrow(0, 0, 1).fill_(value);
  opt.load_state_dict(sd);
}

const std::map<std::string, std::function<void()>> kCases = {
    // nn layers: bad sizes at construction, bad shapes, dtypes and devices at forward
    {"linear_zero_features", [] { nn::Linear(0, 4); }},
    {"linear_negative_features", [] { nn::Linear(4, -1); }},
    {"linear_wrong_in_features", [] { nn::Linear(4, 3)(ones({2, 5})); }},
    {"linear_f64_input", [] { nn::Linear(4, 3)(ones({2, 4}, {.dtype = kFloat64})); }},
    {"linear_int_input", [] { nn::Linear(4, 3)(ones({2, 4}, {.dtype = kInt64})); }},
    {"embedding_index_out_of_range", [] { nn::Embedding(10, 4)(from_vector({3, 10}, {2}, {.dtype = kInt64})); }},
    {"embedding_negative_index", [] { nn::Embedding(10, 4)(from_vector({-1}, {1}, {.dtype = kInt64})); }},
    {"embedding_float_indices", [] { nn::Embedding(10, 4)(ones({2})); }},
    {"layernorm_wrong_dim", [] { nn::LayerNorm(8)(ones({2, 4})); }},
    {"conv2d_2d_input", [] { nn::Conv2d(1, 2, 3)(ones({8, 8})); }},
    {"conv2d_wrong_channels", [] { nn::Conv2d(3, 2, 3)(ones({1, 1, 8, 8})); }},
    {"conv2d_kernel_too_large", [] { nn::Conv2d(1, 2, 9)(ones({1, 1, 8, 8})); }},
    {"conv2d_zero_kernel", [] { nn::Conv2d(1, 2, 0); }},
    {"maxpool_zero_kernel", [] { nn::MaxPool2d(0)(ones({1, 1, 4, 4})); }},
    {"dropout_p_one", [] { nn::Dropout(1.5); }},
    {"cross_entropy_target_out_of_range", [] { cross_entropy(ones({2, 3}), from_vector({0, 3}, {2}, {.dtype = kInt64})); }},
    {"cross_entropy_batch_mismatch", [] { cross_entropy(ones({2, 3}), from_vector({0, 1, 2}, {3}, {.dtype = kInt64})); }},
    {"mse_shape_mismatch", [] { nn::mse_loss(ones({2, 3}), ones({3, 2})); }},
    {"gradcheck_eps_zero", [] {
       autograd::gradcheck([](const autograd::TensorList& in) { return sum(in[0]); }, {ones({2}, {.dtype = kFloat64})
                           .set_requires_grad()}, {.eps = 0});
     }},
    {"cast_frozen_int", [] { nn::cast_frozen(*tiny_mlp(), DType::i64); }},
    {"safetensors_no_producer", [] {
       save_safetensors(scratch_dir("producer") + "/x.safetensors", {{"a", DType::f32, {2}}}, {}, {});
     }},
    // optimizers and schedules: NaN and out-of-range settings
    {"adamw_nan_lr", [] { nn::AdamW(tiny_mlp()->parameters(), {.lr = NAN}); }},
    {"adamw_negative_lr", [] { nn::AdamW(tiny_mlp()->parameters(), {.lr = -1}); }},
    {"adam_beta_one", [] { nn::Adam(tiny_mlp()->parameters(), {.beta1 = 1.0}); }},
    {"sgd_negative_momentum", [] { nn::SGD(tiny_mlp()->parameters(), {.momentum = -0.5}); }},
    {"cosine_warmup_past_total", [] {
       auto m = tiny_mlp();
       nn::AdamW opt(m->parameters(), {});
       nn::WarmupCosineLR(opt, 10, 0);
     }},
    {"clip_grad_nan_max_norm", [] { nn::clip_grad_norm_(tiny_mlp()->parameters(), NAN); }},
    // state dicts and files
    {"load_state_dict_missing_key", [] {
       auto m = tiny_mlp();
       auto sd = m->state_dict();
       sd.pop_back();
       m->load_state_dict(sd);
     }},
    {"load_state_dict_wrong_shape", [] {
       auto m = tiny_mlp();
       auto sd = m->state_dict();
       sd[0].second = ones({3, 3});
       m->load_state_dict(sd);
     }},
    // optimizer state and checkpoints that cannot be right
    {"optimizer_state_negative_second_moment", [] { load_adamw_state_with("exp_avg_sq", -1.0); }},
    {"optimizer_state_nan_moment", [] { load_adamw_state_with("exp_avg", NAN); }},
    {"checkpoint_unlisted_tensor", [] {
       const std::string dir = scratch_dir("unlisted");
       auto m = tiny_mlp();
       const std::string ck = fsdp::save_checkpoint(dir, *m, nullptr, nullptr, {.step = 1});
       auto c = load_safetensors(ck + "/rank_00000.safetensors");
       c.tensors.emplace_back("model.stray", zeros({2}));
       save_safetensors(ck + "/rank_00000.safetensors", c.tensors, c.metadata);
       fsdp::load_checkpoint(ck, *m, nullptr, nullptr, {.verify = false});
     }},
    {"checkpoint_nan_weights", [] {
       const std::string dir = scratch_dir("nan");
       auto m = tiny_mlp();
       NoGradGuard no_grad;
       m->parameters()[0].fill_(NAN);
       fsdp::load_checkpoint(fsdp::save_checkpoint(dir, *m, nullptr, nullptr, {.step = 1}), *m, nullptr, nullptr);
     }},
    {"checkpoint_dir_held", [] {
       const std::string dir = scratch_dir("held");
       fsdp::CheckpointDirLock first(dir);
       fsdp::CheckpointDirLock second(dir);
     }},
    {"safetensors_directory", [] { load_safetensors("/"); }},
    {"safetensors_dev_zero", [] { load_safetensors("/dev/zero"); }},
    {"safetensors_missing", [] { load_safetensors("/nonexistent/x.safetensors"); }},
    // fsdp::fully_shard
    {"fully_shard_null", [] { fsdp::fully_shard(nullptr); }},
    {"fully_shard_twice", [] {
       auto m = tiny_mlp();
       fsdp::fully_shard(m);
       fsdp::fully_shard(m);
     }},
    {"fully_shard_int_parameter", [] {
       auto m = std::make_shared<nn::Linear>(4, 4);
       m->register_parameter("count", ones({4}, {.dtype = kInt64}), false);
       fsdp::fully_shard(m);
     }},
    {"fully_shard_bad_placement_dim", [] {
       fsdp::FullyShardOptions o;
       o.shard_placement_fn = [](const std::string&, const Tensor&) { return int64_t(5); };
       fsdp::fully_shard(tiny_mlp(), o);
     }},
    {"fully_shard_bad_reshard_int", [] {
       fsdp::FullyShardOptions o;
       o.reshard_after_forward = std::variant<bool, int>(0);
       fsdp::fully_shard(tiny_mlp(), o);
     }},
    {"fully_shard_mixed_precision_int", [] {
       fsdp::FullyShardOptions o;
       o.mp_policy.param_dtype = kInt64;
       fsdp::fully_shard(tiny_mlp(), o);
     }},
    {"module_to_unusable_cuda", [] {
       auto m = tiny_mlp();
       m->to(Device::cuda(0));
     }},
    // deferred initialisation: meta parameters used before they are materialised or sharded
    {"meta_forward", [] {
       nn::ModulePtr m;
       {
         DefaultDeviceGuard meta(Device::meta());
         m = tiny_mlp();
       }
       (*m)(ones({2, 4}));
     }},
    {"meta_optimizer", [] {
       DefaultDeviceGuard meta(Device::meta());
       nn::AdamW opt(tiny_mlp()->parameters(), {.lr = 1e-3});
     }},
    {"meta_state_dict", [] {
       DefaultDeviceGuard meta(Device::meta());
       tiny_mlp()->state_dict();
     }},
    {"meta_values", [] {
       DefaultDeviceGuard meta(Device::meta());
       to_vector(randn({3}));
     }},
    {"meta_partial_fill", [] { empty({4, 4}, {.device = Device::meta()}).narrow(0, 1, 2).normal_(); }},
    {"materialize_to_meta", [] { nn::materialize(*tiny_mlp(), Device::meta()); }},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--list") {
    for (auto& [name, fn] : kCases) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (argc != 2 || !kCases.count(argv[1])) {
    std::fprintf(stderr, "usage: bad_api CASE (bad_api --list names them)\n");
    return 4;
  }
  try {
    kCases.at(argv[1])();
  } catch (const Error& e) {
    std::fprintf(stderr, "bad_api %s: error: %s\n", argv[1], e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bad_api %s: not a weft::Error: %s\n", argv[1], e.what());
    return 2;
  }
  std::fprintf(stderr, "bad_api %s: no error\n", argv[1]);
  return 3;
}
