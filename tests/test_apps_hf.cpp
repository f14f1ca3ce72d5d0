// Hugging Face checkpoints (apps/transformer/hf_checkpoint.h) against the fixtures that
// scripts/hf_reference.py made with transformers (tests/data/hf: a GPT2LMHeadModel in one
// file, a LlamaForCausalLM with grouped-query attention and an untied head in three shards, and
// one made as Llama 3.x is: rope_scaling llama3 past its original context, rope_theta 5e5,
// head_dim != hidden / heads, eps 1e-6, a tied head, bf16 weights; a MistralForCausalLM with a
// sliding window of 48, bf16; a Qwen2ForCausalLM with q/k/v biases and a tied head; a
// Qwen3ForCausalLM with q/k head norms and head_dim != hidden / heads):
// logits within 1e-5 relative of transformers', also loaded under FSDP (run at 1, 2 and 4
// ranks) with each rank reading only its shards' bytes; the loss after one AdamW step; greedy
// generation (with and without the key/value cache); export then re-import bitwise; configs weft cannot represent named.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>

#include "apps/transformer/block_eval.h"
#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/lora_settings.h"
#include "apps/transformer/peft_adapter.h"
#include "core/allocator.h"
#include "fsdp/fsdp.h"
#include "fsdp_test_models.h"

using namespace weft;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::string kData = WEFT_TEST_DATA "/hf";

struct Expected {
  Tensor ids, logits, greedy, greedy_penalty, prompt;
  double loss, loss_after_step;
};
Expected expected(const std::string& family) {
  auto c = load_safetensors(kData + "/" + family + "/expected.safetensors");
  std::map<std::string, Tensor> t(c.tensors.begin(), c.tensors.end());
  return {t.at("ids"), t.at("logits"), t.at("greedy_ids"), t.at("greedy_ids_penalty"), t.at("prompt_ids"), t.at("loss").item(),
          t.at("loss_after_step").item()};
}

// max |got - want| <= 1e-5 * max |want|, the numbers printed either way.
void check_logits(const Tensor& got, const Tensor& want, const std::string& what) {
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = to_vector(got.contiguous()), w = to_vector(want.contiguous());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff = std::max(diff, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  INFO(what << ": max |weft - transformers| " << diff << ", max |logit| " << scale << ", rank " << dist::rank()
            << " of " << dist::world_size());
  CHECK(diff <= 1e-5 * scale);
}

Tensor inputs(const Expected& e) { return e.ids.narrow(1, 0, e.ids.size(1) - 1).contiguous(); }
Tensor targets(const Expected& e) { return e.ids.narrow(1, 1, e.ids.size(1) - 1).contiguous(); }

double loss_of(nn::Module& m, const Expected& e) {
  Tensor logits = m(inputs(e));
  return cross_entropy(logits.view({-1, logits.size(-1)}), targets(e).view({-1})).item();
}

// The loss after one AdamW step (lr 1e-2, no decay) on the fixture batch, as the script took it.
double loss_after_step(nn::Module& m, const Expected& e) {
  nn::AdamW opt(m.parameters(), nn::AdamWOptions{.lr = 1e-2, .weight_decay = 0.0});
  Tensor logits = m(inputs(e));
  cross_entropy(logits.view({-1, logits.size(-1)}), targets(e).view({-1})).backward();
  opt.step();
  NoGradGuard no_grad;
  return loss_of(m, e);
}

apps::LanguageModel load_whole(const std::string& dir) {
  apps::LanguageModel lm = apps::make_model(apps::read_hf_config(dir));
  apps::load_hf_checkpoint(dir, lm, nullptr);
  return lm;
}

std::string temp_dir(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / fmt::format("weft-hf-{}-{}-{}", tag, ::getpid(), dist::rank());
  fs::remove_all(p);
  return p.string();
}

// The fixtures, and the architecture weft reads each as.
const std::vector<std::string> kFixtures = {"gpt2", "llama", "llama3", "mistral", "qwen2", "qwen3"};
std::string arch_of(const std::string& fixture) { return fixture == "gpt2" ? "gpt2" : "llama"; }

// A copy of a llama fixture whose config.json `edit` changed (the weight files linked).
std::string llama_with_config(const std::string& tag, const std::function<void(nlohmann::json&)>& edit,
                              const std::string& fixture = "llama") {
  const std::string src = kData + "/" + fixture, dst = temp_dir(tag);
  fs::create_directories(dst);
  for (auto& f : fs::directory_iterator(src))
    if (f.path().filename() != "config.json") fs::create_symlink(fs::absolute(f.path()), fs::path(dst) / f.path().filename());
  std::ifstream in(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(dst + "/config.json") << j.dump();
  return dst;
}

}  // namespace

TEST_CASE("Hugging Face checkpoints: logits, one training step and greedy generation match transformers") {
  for (const std::string& family : kFixtures) {
    INFO(family);
    const Expected e = expected(family);
    apps::LanguageModel lm = load_whole(kData + "/" + family);
    CHECK(lm.cfg.arch == arch_of(family));
    {
      NoGradGuard no_grad;
      check_logits((*lm.module)(inputs(e)), e.logits, family + " logits");
      CHECK(loss_of(*lm.module, e) == Approx(e.loss).epsilon(1e-6));
      // Greedy generation of 32 tokens from the prompt (the whole context each time).
      std::vector<double> ids = to_vector(e.prompt), generated;
      for (int n = 0; n < 32; ++n) {
        Tensor x = from_vector(ids, {1, int64_t(ids.size())}, {.dtype = kInt64});
        Tensor last = (*lm.module)(x).select(0, 0).select(0, int64_t(ids.size()) - 1);
        const double next = argmax(last, 0).item();
        ids.push_back(next);
        generated.push_back(next);
      }
      CHECK(generated == to_vector(e.greedy));
      // The same 32 tokens from nn::generate, with the key/value cache and without it.
      std::vector<int64_t> prompt;
      for (double id : to_vector(e.prompt)) prompt.push_back(int64_t(id));
      for (bool cache : {true, false}) {
        INFO("generate with the cache: " << cache);
        const auto out = nn::generate(*lm.module, prompt,
                                      {.max_new_tokens = 32, .sampling = {.temperature = 0}, .use_cache = cache});
        CHECK(std::vector<double>(out.begin(), out.end()) == to_vector(e.greedy));
        // generate()'s repetition_penalty 1.3 over the prompt and the ids so far, as transformers' processor.
        const auto penalised = nn::generate(
            *lm.module, prompt, {.max_new_tokens = 32, .sampling = {.repetition_penalty = 1.3, .temperature = 0}, .use_cache = cache});
        CHECK(std::vector<double>(penalised.begin(), penalised.end()) == to_vector(e.greedy_penalty));
      }
    }
    const double after = loss_after_step(*lm.module, e);
    INFO("loss after one AdamW step: weft " << after << ", transformers " << e.loss_after_step);
    CHECK(after == Approx(e.loss_after_step).epsilon(1e-5));
  }
}

TEST_CASE("Hugging Face checkpoints load sharded, each rank reading only its own shards") {
  for (const std::string& family : kFixtures) {
    INFO(family << " at " << dist::world_size() << " ranks");
    const std::string dir = kData + "/" + family;
    const Expected e = expected(family);
    const apps::ModelConfig cfg = apps::read_hf_config(dir);
    apps::LanguageModel lm;
    {
      DefaultDeviceGuard meta(Device::meta());
      lm = apps::make_model(cfg);
    }
    for (auto& block : lm.blocks) fsdp::fully_shard(block);
    fsdp::FSDPModule root = fsdp::fully_shard(lm.module);
    // The load adds to the shards only the piece of one tensor being read: reading whole
    // tensors (or the whole model) on every rank would pass that at one rank only.
    int64_t largest_piece = 0;
    for (auto& p : lm.module->parameters()) largest_piece = std::max(largest_piece, p.numel() * 4);
    const int64_t before = memory_stats().live_bytes;
    reset_peak_memory_stats();
    apps::load_hf_checkpoint(dir, lm, &root);
    const int64_t extra = memory_stats().peak_bytes - before;
    INFO("load peak above the shards: " << extra << " bytes; largest local piece " << largest_piece);
    CHECK(extra <= largest_piece + 4096);
    NoGradGuard no_grad;
    check_logits((*lm.module)(inputs(e)), e.logits, family + " logits, sharded");
  }
}

TEST_CASE("Hugging Face checkpoints load into a model built in bf16, whole and sharded: logits within bf16's rounding") {
  for (const std::string& family : kFixtures) {
    for (bool shard : {false, true}) {
      INFO(family << (shard ? ", sharded" : ", whole") << " at " << dist::world_size() << " ranks");
      const std::string dir = kData + "/" + family;
      const Expected e = expected(family);
      apps::LanguageModel lm = apps::make_model_to_load(apps::read_hf_config(dir));
      lm.module->to(kBFloat16);  // on the meta device: the weights are read into bf16 storage
      std::optional<fsdp::FSDPModule> root;
      if (shard) {
        for (auto& block : lm.blocks) fsdp::fully_shard(block);
        root = fsdp::fully_shard(lm.module);
      } else {
        nn::materialize(*lm.module, kCPU);
      }
      apps::load_hf_checkpoint(dir, lm, root ? &*root : nullptr);
      for (auto& [name, p] : lm.module->named_parameters()) {
        INFO(name);
        CHECK(p.dtype() == kBFloat16);
      }
      NoGradGuard no_grad;
      // Within 2 % of the largest logit of transformers' f32 model, but not within the 1e-5 of
      // an f32 computation: the weights and the products were bf16.
      const Tensor got = (*lm.module)(inputs(e)).to(kFloat32);
      double diff = 0, scale = 0;
      std::vector<double> g = to_vector(got.contiguous()), w = to_vector(e.logits.contiguous());
      REQUIRE(g.size() == w.size());
      for (size_t i = 0; i < g.size(); ++i) {
        diff = std::max(diff, std::fabs(g[i] - w[i]));
        scale = std::max(scale, std::fabs(w[i]));
      }
      INFO("max |weft bf16 - transformers f32| " << diff << ", max |logit| " << scale);
      CHECK(diff <= 2e-2 * scale);
      CHECK(diff > 1e-5 * scale);
    }
  }
}

TEST_CASE("export-hf then import gives the same parameters bitwise, single file or sharded") {
  for (const std::string& family : kFixtures) {
    for (int64_t shard : {int64_t(1) << 30, int64_t(60000)}) {
      INFO(family << ", shards of at most " << shard << " bytes");
      apps::LanguageModel lm = load_whole(kData + "/" + family);
      const std::string out = temp_dir(family);
      apps::export_hf_checkpoint(lm, out, shard);
      CHECK(fs::exists(fs::path(out) / "model.safetensors.index.json") == (shard < (1 << 20)));
      apps::LanguageModel back = load_whole(out);
      CHECK(back.cfg.rope_theta == lm.cfg.rope_theta);
      CHECK(back.cfg.rope_scaling == lm.cfg.rope_scaling);
      CHECK(back.cfg.norm_eps == lm.cfg.norm_eps);
      CHECK(back.cfg.tie_weights == lm.cfg.tie_weights);
      CHECK(back.cfg.family == lm.cfg.family);
      CHECK(back.cfg.qkv_bias == lm.cfg.qkv_bias);
      CHECK(back.cfg.qk_norm == lm.cfg.qk_norm);
      CHECK(back.cfg.sliding_window == lm.cfg.sliding_window);
      CHECK(back.cfg.ctx == lm.cfg.ctx);
      auto a = lm.module->named_parameters(), b = back.module->named_parameters();
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(a[i].first == b[i].first);
        CHECK(to_vector(a[i].second) == to_vector(b[i].second));
      }
      CHECK_THROWS_WITH(apps::export_hf_checkpoint(lm, out, shard), Contains("already exists"));
      fs::remove_all(out);
    }
  }
}

TEST_CASE("export-hf removes what exports killed before their rename left beside the output, no live export's") {
  const pid_t child = ::fork();  // a pid that is gone once waited for
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  const fs::path out = fs::path(temp_dir("leftovers")) / "export";
  const fs::path dead = out.parent_path() / fmt::format(".export.tmp-{}", child);
  const fs::path live = out.parent_path() / fmt::format(".export.tmp-{}", ::getppid());
  for (const fs::path& d : {dead, live}) {
    fs::create_directories(d);
    std::ofstream(d / "model.safetensors") << "half";
  }
  apps::export_hf_checkpoint(load_whole(kData + "/" + kFixtures[0]), out.string(), int64_t(1) << 30);
  CHECK(fs::exists(out / "config.json"));
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(live / "model.safetensors"));
  fs::remove_all(out.parent_path());
}

TEST_CASE("Hugging Face rope scaling: llama3, linear and dynamic as transformers computes them, either config form") {
  using Kind = kernels::RopeScaling::Kind;
  const apps::ModelConfig cfg = apps::read_hf_config(kData + "/llama3");
  CHECK(cfg.rope_theta == 500000.0);
  CHECK(cfg.norm_eps == 1e-6);
  CHECK(cfg.tie_weights);
  CHECK(cfg.rope_scaling == kernels::RopeScaling{.kind = Kind::llama3, .factor = 8, .low_freq_factor = 1,
                                                 .high_freq_factor = 8, .original_context = 64});
  const Tensor ids = inputs(expected("llama3"));
  REQUIRE(ids.size(1) > 64);  // past the original context
  auto c = load_safetensors(kData + "/llama3/expected.safetensors");
  std::map<std::string, Tensor> want(c.tensors.begin(), c.tensors.end());
  // Theta and the scaling in rope_scaling (Llama 3.x's files) or in rope_parameters (newer
  // transformers'), and the same weights under the other rope types.
  struct Case {
    std::string name;
    nlohmann::json scaling;
    std::string logits;
  };
  const nlohmann::json llama3 = nlohmann::json::parse(apps::rope_scaling_text(cfg.rope_scaling));
  for (const Case& k : {Case{"llama3", llama3, "logits"},
                        Case{"linear", {{"rope_type", "linear"}, {"factor", 4.0}}, "logits_linear"},
                        Case{"dynamic", {{"type", "dynamic"}, {"factor", 4.0}}, "logits_dynamic"},
                        // a smaller original context changes nothing: transformers starts at max_position_embeddings
                        Case{"dynamic", {{"type", "dynamic"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}},
                             "logits_dynamic"},
                        Case{"none", nullptr, "logits_unscaled"}}) {
    for (bool parameters : {false, true}) {
      INFO(k.name << (parameters ? " in rope_parameters" : " in rope_scaling"));
      const std::string dir = llama_with_config("rope", [&](nlohmann::json& j) {
        for (const char* key : {"rope_scaling", "rope_parameters", "rope_theta"}) j.erase(key);
        nlohmann::json p = k.scaling.is_null() ? nlohmann::json{{"rope_type", "default"}} : k.scaling;
        p["rope_theta"] = 500000.0;
        if (parameters) {
          j["rope_parameters"] = p;
        } else {
          j["rope_scaling"] = k.scaling;
          j["rope_theta"] = 500000.0;
        }
      }, "llama3");
      apps::LanguageModel lm = load_whole(dir);
      CHECK(kernels::rope_scaling_name(lm.cfg.rope_scaling.kind) == k.name);
      NoGradGuard no_grad;
      // The last 16 positions, which the fixture holds for every rope type.
      auto last = [](const Tensor& t) { return t.narrow(1, t.size(1) - 16, 16); };
      check_logits(last((*lm.module)(ids)), last(want.at(k.logits)), k.name + " logits");
      fs::remove_all(dir);
    }
  }
  // Both keys in one file: the same scaling (and theta) reads; scalings or thetas that differ are refused.
  auto both = [&](const nlohmann::json& scaling, const nlohmann::json& parameters) {
    const std::string dir = llama_with_config("both", [&](nlohmann::json& j) {
      j["rope_scaling"] = scaling, j["rope_parameters"] = parameters;
    }, "llama3");
    struct Remove { std::string d; ~Remove() { fs::remove_all(d); } } remove{dir};
    return apps::read_hf_config(dir);
  };
  const nlohmann::json linear4 = {{"rope_type", "linear"}, {"factor", 4.0}};
  CHECK(both(linear4, {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e4}}).rope_scaling.factor == 4.0);
  CHECK_THROWS_WITH(both(linear4, {{"rope_type", "linear"}, {"factor", 2.0}}),
                    Contains("rope_parameters\" differs from rope_scaling in the same file"));
  CHECK_THROWS_WITH(both({{"rope_type", "default"}, {"rope_theta", 1e4}}, {{"rope_type", "default"}, {"rope_theta", 5e5}}),
                    Contains("differs from rope_scaling"));
  // A top-level rope_theta beside rope_parameters' (transformers takes the latter): the same reads, another is refused.
  auto beside = [&](double theta) {
    const std::string dir = llama_with_config("theta", [&](nlohmann::json& j) { j["rope_theta"] = theta; }, "llama3");
    struct Remove { std::string d; ~Remove() { fs::remove_all(d); } } remove{dir};
    return apps::read_hf_config(dir);
  };
  CHECK(beside(500000.0).rope_theta == 500000.0);
  CHECK_THROWS_WITH(beside(1e4), Contains("\"rope_theta\" is 10000, and rope_parameters's rope_theta 500000"));
  // Dynamic scaling changes every frequency with the sequence's length past max_position_embeddings.
  const std::string dir = llama_with_config("dynamic", [](nlohmann::json& j) {
    j.erase("rope_parameters");
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
    j["max_position_embeddings"] = 32;
  }, "llama3");
  apps::ModelConfig dyn = apps::read_hf_config(dir);
  CHECK(dyn.rope_scaling.original_context == 32);
  dyn.ctx = 48;
  CHECK_THROWS_WITH(apps::make_model(dyn), Contains("ctx 48 is past max_position_embeddings 32"));
  fs::remove_all(dir);
}

TEST_CASE("Mistral, Qwen2 and Qwen3: the sliding window caps the context, q/k/v biases, q/k norms, fields refused") {
  const apps::ModelConfig mistral = apps::read_hf_config(kData + "/mistral");
  CHECK(mistral.family == "mistral");
  CHECK(mistral.sliding_window == 48);
  CHECK(mistral.ctx == 48);  // max_position_embeddings 128, capped at the window
  CHECK(!mistral.qkv_bias);
  apps::ModelConfig longer = mistral;
  longer.ctx = 64;
  CHECK_THROWS_WITH(apps::make_model(longer), Contains("--ctx 64 is past the model's sliding_window 48"));
  const apps::ModelConfig qwen2 = apps::read_hf_config(kData + "/qwen2");
  CHECK(qwen2.family == "qwen2");
  CHECK(qwen2.qkv_bias);
  CHECK(qwen2.tie_weights);
  apps::LanguageModel lm = apps::make_model(qwen2);
  int biases = 0;
  for (auto& [name, p] : lm.module->named_parameters()) biases += name.ends_with(".bias");
  CHECK(biases == 3 * qwen2.n_layer);  // q, k, v; not o_proj
  auto expect_error = [](const std::string& key, const nlohmann::json& value, const std::string& text) {
    const std::string dir = llama_with_config("qwen2", [&](nlohmann::json& j) { j[key] = value; }, "qwen2");
    INFO(key << " = " << value.dump());
    CHECK_THROWS_WITH(apps::read_hf_config(dir), Contains(text));
    fs::remove_all(dir);
  };
  expect_error("use_sliding_window", true, "\"use_sliding_window\" is true");
  const apps::ModelConfig qwen3 = apps::read_hf_config(kData + "/qwen3");
  CHECK(qwen3.family == "qwen3");
  CHECK((qwen3.qk_norm && !qwen3.qkv_bias && qwen3.head_dim == 16));
  apps::LanguageModel q3 = apps::make_model(qwen3);
  REQUIRE(dynamic_cast<nn::Qwen3*>(q3.module.get()) != nullptr);
  int head_norms = 0;
  for (auto& [name, p] : q3.module->named_parameters())
    head_norms += (name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight")) && p.numel() == 16;
  CHECK(head_norms == 2 * qwen3.n_layer);
  expect_error("layer_types", nlohmann::json{"full_attention", "sliding_attention"},
               "\"layer_types\" holds \"sliding_attention\"");
}

TEST_CASE("a field a config leaves out means what transformers' default for its family says") {
  // The fixture's config without `keys`, with 32 heads of 64 (so that every family's default of key/value heads fits).
  auto read_without = [](const std::string& fixture, const std::vector<std::string>& keys) {
    const std::string dir = llama_with_config("defaults", [&](nlohmann::json& j) {
      j.update({{"num_attention_heads", 32}, {"hidden_size", 2048}});
      for (const std::string& k : keys) j.erase(k);
    }, fixture);
    const apps::ModelConfig c = apps::read_hf_config(dir);
    fs::remove_all(dir);
    return c;
  };
  const std::vector<std::string> sizes = {"num_key_value_heads", "max_position_embeddings", "head_dim"};
  const apps::ModelConfig mistral = read_without("mistral", {"sliding_window", "num_key_value_heads",
                                                             "max_position_embeddings", "head_dim"});
  CHECK(mistral.sliding_window == 4096);  // transformers' MistralConfig: 4096 when absent, none when null
  CHECK(mistral.n_kv_head == 8);
  CHECK(mistral.ctx == 4096);  // max_position_embeddings 131072, capped at the window
  for (const std::string fixture : {"qwen2", "qwen3"}) {
    const apps::ModelConfig q = read_without(fixture, sizes);
    INFO(fixture);
    CHECK((q.n_kv_head == 32 && q.ctx == 32768));
    CHECK(q.head_dim == (fixture == "qwen3" ? 128 : 0));  // 0: hidden_size / num_attention_heads
  }
  const apps::ModelConfig llama = read_without("llama", sizes);
  CHECK((llama.n_kv_head == 32 && llama.ctx == 2048 && llama.head_dim == 0));
}

TEST_CASE("Hugging Face configs weft cannot represent are errors naming the field") {
  // The llama fixture with one config field changed (null: removed, except rope_scaling).
  auto with_config = [](const std::string& key, const nlohmann::json& value) {
    return llama_with_config("cfg", [&](nlohmann::json& j) {
      if (value.is_null() && key != "rope_scaling") j.erase(key);
      else j[key] = value;
    });
  };
  auto expect_error = [&](const std::string& key, const nlohmann::json& value, const std::string& text) {
    const std::string dir = with_config(key, value);
    INFO(key << " = " << value.dump());
    CHECK_THROWS_WITH(apps::read_hf_config(dir), Contains(text));
    fs::remove_all(dir);
  };
  expect_error("model_type", "bert", "\"model_type\" is \"bert\": weft reads gpt2, llama, mistral, qwen2 and qwen3");
  expect_error("rope_scaling", nlohmann::json{{"rope_type", "yarn"}, {"factor", 2.0}},
               "\"rope_type\" is \"yarn\": weft computes the rope types default, linear, dynamic and llama3");
  expect_error("rope_scaling", nlohmann::json{{"type", "longrope"}, {"factor", 2.0}}, "\"type\" is \"longrope\"");
  expect_error("rope_parameters", nlohmann::json{{"rope_type", "yarn"}, {"rope_theta", 1e4}}, "\"rope_type\"");
  expect_error("rope_scaling", nlohmann::json{{"rope_type", "linear"}}, "rope_scaling: \"factor\" is missing");
  expect_error("rope_scaling", nlohmann::json{{"rope_type", "linear"}, {"factor", 2.0}, {"attention_factor", 0.5}},
               "\"attention_factor\" is 0.5: weft does not use it with rope type linear (only factor)");
  expect_error("rope_scaling", nlohmann::json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                              {"high_freq_factor", 1.0}, {"original_max_position_embeddings", 16}},
               "low_freq_factor (4) must be positive and below high_freq_factor (1)");
  expect_error("rope_scaling", nlohmann::json{{"rope_type", "linear"}, {"factor", -2.0}},
               "factor must be finite and positive, got -2");
  expect_error("rope_scaling", "linear", "\"rope_scaling\" must be an object or null, got \"linear\"");
  expect_error("partial_rotary_factor", 0.5, "\"partial_rotary_factor\" is 0.5");
  expect_error("hidden_act", "gelu", "\"hidden_act\"");
  expect_error("attention_bias", true, "\"attention_bias\"");
  expect_error("num_key_value_heads", 3, "--n-kv-head 3 must divide --n-head 4");
  expect_error("hidden_size", "big", "\"hidden_size\" must be a positive integer, got \"big\"");
  // 0 is not "unset": a size of 0 is named as the invalid value it is.
  expect_error("num_key_value_heads", 0, "\"num_key_value_heads\" must be a positive integer, got 0");
  expect_error("intermediate_size", 0, "\"intermediate_size\" must be a positive integer, got 0");
  expect_error("vocab_size", nullptr, "\"vocab_size\" is missing");
  // Weights that do not fit the config: a layer more than the files hold.
  const std::string dir = with_config("num_hidden_layers", 3);
  apps::LanguageModel lm = apps::make_model(apps::read_hf_config(dir));
  CHECK_THROWS_WITH(apps::load_hf_checkpoint(dir, lm, nullptr), Contains("model.layers.2."));
  fs::remove_all(dir);
}

TEST_CASE("export-hf --dtype bf16 writes bf16 files and copies the source's tokenizer and generation files") {
  // llama3's weights are bf16 values: written as bf16 and read back, they are bitwise the same.
  const std::string src = kData + "/llama3", out = temp_dir("bf16");
  apps::LanguageModel lm = load_whole(src);
  apps::export_hf_checkpoint(lm, out, int64_t(1) << 30, kBFloat16, src);
  for (const SafetensorsEntry& e : read_safetensors_index(out + "/model.safetensors")) {
    INFO(e.name);
    CHECK(e.dtype == kBFloat16);
  }
  std::ifstream in(out + "/config.json");
  CHECK(nlohmann::json::parse(in)["torch_dtype"] == "bfloat16");
  auto slurp = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  REQUIRE(fs::exists(src + "/generation_config.json"));
  CHECK(slurp(out + "/generation_config.json") == slurp(src + "/generation_config.json"));
  CHECK(!fs::exists(out + "/tokenizer.json"));  // the fixture has none
  apps::LanguageModel back = load_whole(out);
  auto a = lm.module->named_parameters(), b = back.module->named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(to_vector(a[i].second) == to_vector(b[i].second));
  fs::remove_all(out);
  CHECK_THROWS_WITH(apps::export_hf_checkpoint(lm, out, 1 << 30, kFloat16), Contains("f32 or bf16, not f16"));
}

// The source's token ids stay in config.json (what generate falls back on without generation_config.json); an --out
// ending in "/" names the directory.
TEST_CASE("export-hf keeps the source's bos and eos token ids") {
  const std::string src = WEFT_TEST_DATA "/chat/model", out = temp_dir("ids") + "/";
  apps::export_hf_checkpoint(load_whole(src), out, int64_t(1) << 30, kFloat32, src);
  std::ifstream in(out + "config.json"), src_in(src + "/config.json");
  const nlohmann::json cfg = nlohmann::json::parse(in), src_cfg = nlohmann::json::parse(src_in);
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    INFO(key);
    REQUIRE(src_cfg[key].is_number_integer());
    CHECK(cfg[key] == src_cfg[key]);
  }
  fs::remove_all(out);
}

TEST_CASE("source weights in f16 load as their f32 values, as those in bf16 and f32 do") {
  // qwen2's f32 weights written in f16 (its config, one file): the loaded model holds exactly
  // each weight rounded to f16, and its logits are those of the f32 model with rounded weights.
  const std::string src = kData + "/qwen2", dst = temp_dir("f16");
  fs::create_directories(dst);
  fs::copy_file(src + "/config.json", dst + "/config.json");
  NamedTensors half;
  for (auto& [name, t] : load_safetensors(src + "/model.safetensors").tensors) half.emplace_back(name, t.to(kFloat16));
  save_safetensors(dst + "/model.safetensors", half);
  REQUIRE(read_safetensors_index(dst + "/model.safetensors").front().dtype == kFloat16);
  apps::LanguageModel f16 = load_whole(dst), f32 = load_whole(src);
  size_t changed = 0;
  auto p16 = f16.module->named_parameters(), p32 = f32.module->named_parameters();
  REQUIRE(p16.size() == p32.size());
  for (size_t i = 0; i < p16.size(); ++i) {
    INFO(p16[i].first);
    CHECK(p16[i].second.dtype() == kFloat32);
    const Tensor rounded = p32[i].second.to(kFloat16).to(kFloat32);
    CHECK(to_vector(p16[i].second) == to_vector(rounded));
    changed += to_vector(p32[i].second) != to_vector(rounded);
  }
  CHECK(changed > 0);  // the rounding is visible: the file was not read as f32
  fs::remove_all(dst);
}

TEST_CASE("a NaN or infinity in a Hugging Face file is refused as it is read, naming the tensor and element") {
  // qwen2's gate_proj [64, 32] in bf16 (read by rows, converted) with a NaN in column 3 of every
  // row; gpt2's c_attn, stored [32, 96] as the transpose of the parameter (read a column at a
  // time), with -inf in all of stored row 5: every rank's shard holds one, the first is named.
  struct Case { std::string family, tensor, value; int64_t first; };
  for (const Case& c : {Case{"qwen2", "model.layers.0.mlp.gate_proj.weight", "nan", 3},
                        Case{"gpt2", "transformer.h.0.attn.c_attn.weight", "-inf", 5 * 96}}) {
    INFO(c.family << " at " << dist::world_size() << " ranks");
    const std::string dst = temp_dir("nonfinite-" + c.family);
    fs::create_directories(dst);
    fs::copy_file(kData + "/" + c.family + "/config.json", dst + "/config.json");
    NamedTensors edited;
    for (auto& [name, t] : load_safetensors(kData + "/" + c.family + "/model.safetensors").tensors) {
      Tensor e = t.clone();
      const float bad = c.value == "nan" ? NAN : -INFINITY;
      if (name == c.tensor)
        for (int64_t i = 0; i < e.numel(); ++i)
          if (c.family == "qwen2" ? i % e.size(1) == 3 : i / e.size(1) == 5) e.data<float>()[i] = bad;
      edited.emplace_back(name, c.family == "qwen2" ? e.to(kBFloat16) : e);
    }
    save_safetensors(dst + "/model.safetensors", edited);
    const std::string named = fmt::format("tensor '{}' holds {} at element", c.tensor, c.value);
    CHECK_THROWS_WITH(load_whole(dst), Contains(fmt::format("{} {} (not finite: refused)", named, c.first)));
    apps::LanguageModel lm;
    {
      DefaultDeviceGuard meta(Device::meta());
      lm = apps::make_model(apps::read_hf_config(dst));
    }
    for (auto& block : lm.blocks) fsdp::fully_shard(block);
    fsdp::FSDPModule root = fsdp::fully_shard(lm.module);
    CHECK_THROWS_WITH(apps::load_hf_checkpoint(dst, lm, &root), Contains(named));
    fs::remove_all(dst);
  }
}

TEST_CASE("as transformers reads them: a stored head wins over tie_word_embeddings, the single file over an index") {
  const std::string src = kData + "/llama";
  // The config ties the head, but the files store lm_head.weight.
  const std::string dir = llama_with_config("agree", [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  {
    NoGradGuard no_grad;
    apps::LanguageModel lm = load_whole(dir);
    CHECK(!lm.cfg.tie_weights);
    check_logits((*lm.module)(inputs(expected("llama"))), expected("llama").logits, "tied config, stored head");
  }
  // Beside the index and its shards, a model.safetensors holding other values: it is the one read.
  apps::LanguageModel other = load_whole(src);
  {
    NoGradGuard no_grad;
    Tensor head = other.module->named_parameters().back().second;
    head.copy_(head * 2.0);
  }
  const std::string single = temp_dir("single");
  apps::export_hf_checkpoint(other, single, int64_t(1) << 30);
  fs::create_symlink(fs::path(single) / "model.safetensors", fs::path(dir) / "model.safetensors");
  apps::LanguageModel read = load_whole(dir);
  auto want = other.module->named_parameters(), got = read.module->named_parameters();
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(to_vector(want[i].second) == to_vector(got[i].second));
  }
  fs::remove_all(dir);
  fs::remove_all(single);
}

TEST_CASE("LoRA on a Hugging Face model, sharded: the base loads, adapters start at zero, only they train") {
  for (const std::string& family : {std::string("llama"), std::string("qwen2")}) {
    INFO(family << " at " << dist::world_size() << " ranks");
    const std::string dir = kData + "/" + family;
    const Expected e = expected(family);
    manual_seed(3);
    apps::LanguageModel lm = apps::make_model_to_load(apps::read_hf_config(dir));
    apps::add_lora(lm, {.rank = 2, .alpha = 4, .targets = {"q_proj", "v_proj", "down_proj"}}, false);
    for (auto& block : lm.blocks) fsdp::fully_shard(block);
    fsdp::FSDPModule root = fsdp::fully_shard(lm.module);
    apps::load_hf_checkpoint(dir, lm, &root);  // the file has no adapters: they keep their initial values
    {
      NoGradGuard no_grad;
      check_logits((*lm.module)(inputs(e)), e.logits, family + " logits with lora_B zero");
    }
    std::vector<Tensor> trainable;
    for (auto& [name, p] : lm.module->named_parameters())
      if (p.requires_grad()) trainable.push_back(p);
    CHECK(trainable.size() == 6 * size_t(lm.cfg.n_layer));  // A and B of three modules per layer
    nn::AdamW opt(trainable, {.lr = 1e-2});
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      Tensor logits = (*lm.module)(inputs(e));
      cross_entropy(logits.view({-1, logits.size(-1)}), targets(e).view({-1})).backward();
      opt.step();
    }
    std::map<std::string, Tensor> hf;
    for (auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".safetensors" && entry.path().filename() != "expected.safetensors")
        for (auto& [name, t] : load_safetensors(entry.path().string()).tensors) hf[name] = t;
    for (auto& [name, p] : lm.module->named_parameters()) {
      const Tensor full = root.full_tensor(name);
      INFO(name);
      if (nn::is_lora_parameter(name)) {
        if (name.ends_with("lora_B.weight")) CHECK(to_vector(full) != std::vector<double>(size_t(full.numel()), 0.0));
        continue;
      }
      REQUIRE(hf.count(name));
      CHECK(to_vector(full) == to_vector(hf.at(name).to(kFloat32)));  // frozen: the file's values, bit for bit
    }
  }
}

TEST_CASE("a peft LoRA adapter loads onto its base as peft computes it, sharded; export-peft writes it back") {
  const std::string dir = WEFT_TEST_DATA "/peft/llama";
  const apps::PeftAdapter adapter = apps::read_peft_adapter(dir);
  CHECK(adapter.lora.rank == 4);
  CHECK(adapter.lora.alpha == 8);
  CHECK(fs::equivalent(adapter.base, kData + "/llama"));  // "../../hf/llama", from the adapter's directory
  auto c = load_safetensors(dir + "/expected.safetensors");
  std::map<std::string, Tensor> e(c.tensors.begin(), c.tensors.end());
  const Tensor ids = e.at("ids").narrow(1, 0, e.at("ids").size(1) - 1).contiguous();
  auto build = [&](bool shard) {
    apps::LanguageModel lm = apps::make_model_to_load(apps::read_hf_config(adapter.base));
    apps::add_lora(lm, adapter.lora, true);
    std::optional<fsdp::FSDPModule> root;
    if (shard) {
      for (auto& block : lm.blocks) fsdp::fully_shard(block);
      root = fsdp::fully_shard(lm.module);
    } else {
      nn::materialize(*lm.module);
    }
    apps::load_hf_checkpoint(adapter.base, lm, root ? &*root : nullptr);
    apps::load_peft_weights(adapter, lm, root ? &*root : nullptr);
    return std::make_pair(lm, std::move(root));
  };
  {
    auto [lm, root] = build(true);
    NoGradGuard no_grad;
    check_logits((*lm.module)(ids), e.at("logits"), "peft adapter logits, sharded");
  }
  if (dist::rank() != 0) return;
  auto [lm, root] = build(false);
  const std::string out = fs::temp_directory_path() / ("weft_peft_" + std::to_string(::getpid()));
  fs::remove_all(out);
  apps::export_peft_adapter(lm, adapter.lora, out, adapter.base);
  auto wrote = load_safetensors(out + "/adapter_model.safetensors"), fixture = load_safetensors(dir + "/adapter_model.safetensors");
  std::map<std::string, Tensor> theirs(fixture.tensors.begin(), fixture.tensors.end());
  CHECK(wrote.tensors.size() == theirs.size());
  for (auto& [name, t] : wrote.tensors) {
    INFO(name);
    REQUIRE(theirs.count(name));
    CHECK(to_vector(t) == to_vector(theirs.at(name)));
  }
  const apps::PeftAdapter back = apps::read_peft_adapter(out);
  CHECK(back.lora.rank == 4);
  CHECK(back.lora.alpha == 8);
  CHECK(back.lora.targets == adapter.lora.targets);
  fs::remove_all(out);
}

TEST_CASE("peft adapters weft cannot reproduce are errors naming the field") {
  const std::string dir = fs::temp_directory_path() / ("weft_peft_bad_" + std::to_string(::getpid()));
  auto write = [&](const std::string& edit_key, const nlohmann::json& value) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ifstream in(WEFT_TEST_DATA "/peft/llama/adapter_config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    c["base_model_name_or_path"] = kData + "/llama";  // the fixture's relative one is not found from dir
    c[edit_key] = value;
    std::ofstream(dir + "/adapter_config.json") << c.dump();
  };
  write("use_dora", true);
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"use_dora\" is true: DoRA"));
  write("target_modules", ".*proj");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("a regular expression is not supported"));
  write("peft_type", "IA3");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("only LORA adapters"));
  write("base_model_name_or_path", "/nowhere/llama");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("is \"/nowhere/llama\", which is not a Hugging Face model"));
  // A relative base as peft writes it (the path it was given, from the current directory) is found there too.
  const std::string from_here = fs::relative(WEFT_TEST_DATA "/hf/llama").string();
  write("base_model_name_or_path", from_here);
  CHECK(fs::equivalent(apps::read_peft_adapter(dir).base, WEFT_TEST_DATA "/hf/llama"));
  write("base_model_name_or_path", "nowhere/llama");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("at " + dir + "/nowhere/llama nor from the current directory"));
  write("r", 0);
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("adapter_config.json: rank must be >= 1 (peft's \"r\"), got 0"));
  write("lora_alpha", -2);
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("alpha must be a finite number > 0 (peft's \"lora_alpha\"), got -2"));
  write("lora_dropout", "0.1");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"lora_dropout\" is \"0.1\", not a number"));
  write("task_type", "SEQ_CLS");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"task_type\" is \"SEQ_CLS\": an adapter of a model other"));
  write("modules_to_save", nlohmann::json::array({"lm_head"}));
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"modules_to_save\" is [\"lm_head\"]"));
  // Initialisations for which peft changes the base weights as it loads the adapter; those that leave it load.
  for (const char* method : {"pissa", "pissa_niter_4", "olora", "corda", "loftq"}) {
    write("init_lora_weights", method);
    CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains(fmt::format("\"init_lora_weights\" is \"{}\": peft changes "
                      "the base weights", method)));
  }
  write("init_lora_weights", "kaiming");
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"init_lora_weights\" is \"kaiming\": an initialisation weft "
                    "does not know"));
  for (const nlohmann::json& method : {nlohmann::json(false), nlohmann::json("gaussian"), nlohmann::json("eva")}) {
    write("init_lora_weights", method);
    CHECK(apps::read_peft_adapter(dir).lora.rank == 4);
  }
  // Settings that change the forward, known or from a newer peft, are refused by name.
  write("alora_invocation_tokens", nlohmann::json::array({1, 2}));
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"alora_invocation_tokens\" is [1,2]: a peft setting weft does not reproduce"));
  write("use_bdlora", true);
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"use_bdlora\" is true: a peft setting"));
  write("some_future_setting", 3);
  CHECK_THROWS_WITH(apps::read_peft_adapter(dir), Contains("\"some_future_setting\" is 3: a peft setting"));
  // A base layer peft saved beside the adapters (save_embedding_layers) is named as such.
  write("base_model_name_or_path", kData + "/llama");
  auto weights = load_safetensors(WEFT_TEST_DATA "/peft/llama/adapter_model.safetensors");
  weights.tensors.emplace_back("base_model.model.lm_head.base_layer.weight", zeros({256, 4}));
  save_safetensors(dir + "/adapter_model.safetensors", weights.tensors);
  const apps::PeftAdapter saved = apps::read_peft_adapter(dir);
  apps::LanguageModel lm = apps::make_model_to_load(apps::read_hf_config(saved.base));
  apps::add_lora(lm, saved.lora, true);
  nn::materialize(*lm.module);
  CHECK_THROWS_WITH(apps::load_peft_weights(saved, lm, nullptr), Contains("lm_head.base_layer.weight\", which the "
                    "adapters") && Contains("peft saves a base layer beside its adapters with save_embedding_layers"));
  fs::remove_all(dir);
}

TEST_CASE("eval's blocks of ctx + 1 tokens give the loss transformers computes on the fixtures' sequences") {
  for (const std::string& family : {std::string("gpt2"), std::string("llama"), std::string("qwen3")}) {
    INFO(family);
    const Expected e = expected(family);
    apps::LanguageModel lm = load_whole(kData + "/" + family);
    // The fixture's rows [2, 17] one after the other: blocks of 17 bytes are exactly the rows.
    std::vector<uint8_t> bytes;
    for (double id : to_vector(e.ids)) bytes.push_back(uint8_t(id));
    bytes.push_back(7);  // a tail shorter than a block, left out
    const apps::TokenView stream = apps::TokenView::bytes(bytes);
    REQUIRE(apps::block_count(stream, 16) == 2);
    for (int64_t batch : {1, 2}) {
      const apps::BlockLoss r = apps::block_loss(*lm.module, stream, 16, 0, 2, batch);
      CHECK(r.tokens == 32);
      CHECK(r.loss() == Approx(e.loss).epsilon(1e-5));
    }
    CHECK(lm.module->is_training());  // restored
    CHECK_THROWS_WITH(apps::block_loss(*lm.module, stream, 16, 1, 2, 1), Contains("are not within the 2 whole blocks"));
  }
}
