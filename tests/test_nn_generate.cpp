// nn/kv_cache.h and nn/generate.h: decoding with a key/value cache gives the logits of the
// full forward (prefill, single steps, several tokens after a prefill; grouped-query heads, tied
// and untied heads), greedy generation with the cache equals the path without it token for token,
// a full cache restarts from half the context, the cache's errors name what is wrong, and
// sample_token's temperature / top-k / top-p draw from the distributions they name.
#include <cmath>

#include "core/grad_mode.h"
#include "nn/nn.h"
#include "test_util.h"

using namespace weft;
using Catch::Matchers::Contains;

namespace {

nn::LlamaConfig small_llama(bool tie) {
  return {.vocab_size = 61, .ctx = 24, .n_layer = 2, .n_head = 4, .n_kv_head = 2, .d_model = 32, .ffn_dim = 48,
          .rope_theta = 500.0, .tie_weights = tie};
}

std::shared_ptr<nn::Llama> make_llama(bool tie, uint64_t seed = 7) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Llama>(small_llama(tie));
  nn::init_llama(*m);
  m->eval();
  return m;
}

Tensor ids_tensor(const std::vector<int64_t>& ids) {
  Tensor x = empty({1, int64_t(ids.size())}, {.dtype = kInt64});
  std::copy(ids.begin(), ids.end(), x.data<int64_t>());
  return x;
}

// max |got - want| / max |want|, printed.
double rel_diff(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = to_vector(got), w = to_vector(want);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff = std::max(diff, std::fabs(g[i] - w[i]));
    scale = std::max(scale, std::fabs(w[i]));
  }
  INFO("max |cached - full| " << diff << " of max |full| " << scale);
  return diff / scale;
}

}  // namespace

TEST_CASE("Llama decoding with a key/value cache gives the full forward's logits") {
  for (bool tie : {false, true}) {
    INFO("tied head: " << tie);
    auto model = make_llama(tie);
    const std::vector<int64_t> ids = {3, 17, 42, 8, 8, 59, 0, 23, 31, 5, 44, 12, 9};
    NoGradGuard no_grad;
    Tensor full = (*model)(ids_tensor(ids)).select(0, 0);  // [13, vocab]
    nn::KVCache cache = model->make_cache();
    CHECK(cache.n_layer() == 2);
    CHECK(cache.capacity() == 24);
    // A prefill of 5, four single steps, then 4 tokens at once (run one position at a time).
    std::vector<Tensor> parts;
    parts.push_back(model->forward_cached(ids_tensor({ids.begin(), ids.begin() + 5}), cache));
    CHECK(cache.length() == 5);
    for (int t = 5; t < 9; ++t) parts.push_back(model->forward_cached(ids_tensor({ids[size_t(t)]}), cache));
    parts.push_back(model->forward_cached(ids_tensor({ids.begin() + 9, ids.end()}), cache));
    CHECK(cache.length() == 13);
    CHECK(cache.bytes() == 2 * 2 * (1 * 2 * 24 * 8) * 4);  // layers x (k, v) x [1, 2, 24, 8] f32
    Tensor cached = cat(parts, 1).select(0, 0);
    CHECK(rel_diff(cached, full) < 1e-5);
    // clear() starts over: the same prefill gives the same logits.
    cache.clear();
    Tensor again = model->forward_cached(ids_tensor(ids), cache).select(0, 0);
    CHECK(rel_diff(again, full) < 1e-5);
    // logits_to_keep: the head of the last positions only, the prefill's and the one-at-a-time path's.
    cache.clear();
    Tensor last = model->forward_cached(ids_tensor({ids.begin(), ids.begin() + 9}), cache, 1);
    REQUIRE(last.shape() == Shape{1, 1, full.size(1)});
    CHECK(rel_diff(last.select(0, 0), full.narrow(0, 8, 1)) < 1e-5);
    Tensor tail = model->forward_cached(ids_tensor({ids.begin() + 9, ids.end()}), cache, 3);
    REQUIRE(tail.shape() == Shape{1, 3, full.size(1)});
    CHECK(rel_diff(tail.select(0, 0), full.narrow(0, 10, 3)) < 1e-5);
    cache.clear();
    CHECK(model->forward_cached(ids_tensor({ids.begin(), ids.begin() + 2}), cache, 5).size(1) == 2);
    CHECK_THROWS_WITH(model->forward_cached(ids_tensor({1}), cache, -1), Contains("logits_to_keep must be >= 0"));
  }
}

TEST_CASE("greedy generation with the cache equals generation without it, token for token") {
  auto model = make_llama(false, 11);
  const std::vector<int64_t> prompt = {1, 2, 3, 4, 5};
  nn::GenerateOptions o{.max_new_tokens = 19, .sampling = {.temperature = 0}};
  nn::GenerateStats with_stats, without_stats;
  const auto with = nn::generate(*model, prompt, o, {}, &with_stats);
  o.use_cache = false;
  const auto without = nn::generate(*model, prompt, o, {}, &without_stats);
  REQUIRE(with.size() == 19);
  CHECK(with == without);
  CHECK(with_stats.prompt_tokens == 5);
  CHECK(with_stats.new_tokens == 19);
  CHECK(with_stats.prefills == 1);  // 5 + 19 = 24 positions: the context, never restarted
  // Sampled (temperature, top-k, top-p) with one seed: the same draws either way too.
  o.sampling = {.temperature = 0.8, .top_k = 20, .top_p = 0.9};
  o.seed = 5;
  const auto sampled_without = nn::generate(*model, prompt, o);
  o.use_cache = true;
  CHECK(nn::generate(*model, prompt, o) == sampled_without);
  // on_token sees each token as it is chosen; eos stops after generating it.
  std::vector<int64_t> seen;
  o.sampling = {.temperature = 0};
  o.eos = {-5, with[3]};  // any of them stops it
  model->train();
  const auto stopped = nn::generate(*model, prompt, o, [&](int64_t t) { seen.push_back(t); });
  CHECK(stopped == std::vector<int64_t>(with.begin(), with.begin() + 4));
  CHECK(seen == stopped);
  CHECK(model->is_training());  // generate ran in eval mode and restored training mode
}

TEST_CASE("a full cache restarts from the last half of the context") {
  auto model = make_llama(true, 3);
  model->train();
  nn::GenerateStats st;
  const auto out = nn::generate(*model, {7, 8, 9}, {.max_new_tokens = 40, .sampling = {.temperature = 0}}, {}, &st);
  CHECK(out.size() == 40);
  // 3 + 21 fill the 24 positions; each restart keeps 12 and adds 12 more.
  CHECK(st.prefills == 3);
  CHECK(model->is_training());  // the mode is restored
  // The restarted path's next token is the no-cache path's over the same window (12 tokens).
  std::vector<int64_t> all = {7, 8, 9};
  all.insert(all.end(), out.begin(), out.begin() + 21);  // the cache is full after these 24
  std::vector<int64_t> window(all.end() - 12, all.end());
  const auto restart = nn::generate(*model, window, {.max_new_tokens = 1, .sampling = {.temperature = 0}});
  CHECK(restart[0] == out[21]);
}

TEST_CASE("generate sizes its key/value cache for the prompt and the new tokens (at most the context)") {
  auto model = make_llama(false);
  const std::vector<int64_t> prompt = {3, 17, 42};
  auto cache_bytes = [&](int64_t new_tokens) {
    nn::GenerateStats st;
    nn::generate(*model, prompt, {.max_new_tokens = new_tokens, .sampling = {.temperature = 0}}, {}, &st);
    return st.cache_bytes;
  };
  const int64_t per_position = 2 * 2 * (1 * 2 * 8) * 4;  // layers x (k, v) x [1, 2, ., 8] f32
  CHECK(cache_bytes(5) == (3 + 5) * per_position);
  CHECK(cache_bytes(1) == (3 + 1) * per_position);
  CHECK(cache_bytes(40) == 24 * per_position);  // past the context: the context, restarting when full
  // No limit but an end token (the first one greedy decoding gives): prompt + new had wrapped to -2^63 positions.
  const int64_t first = nn::generate(*model, prompt, {.max_new_tokens = 1, .sampling = {.temperature = 0}})[0];
  nn::GenerateStats st;
  const auto out = nn::generate(*model, prompt, {.max_new_tokens = INT64_MAX, .sampling = {.temperature = 0},
                                                 .eos = {first}}, {}, &st);
  CHECK(out == std::vector<int64_t>{first});
  CHECK(st.cache_bytes == 24 * per_position);
}

TEST_CASE("key/value cache errors name what is wrong") {
  auto model = make_llama(false);
  NoGradGuard no_grad;
  nn::KVCache cache = model->make_cache();
  CHECK_THROWS_WITH(model->forward_cached(ids_tensor(std::vector<int64_t>(25, 1)), cache),
                    Contains("pass the model's context of 24"));
  model->forward_cached(ids_tensor(std::vector<int64_t>(20, 1)), cache);
  CHECK_THROWS_WITH(model->forward_cached(ids_tensor(std::vector<int64_t>(5, 1)), cache),
                    Contains("20 cached and 5 new positions"));
  nn::KVCache other(3, 24);
  CHECK_THROWS_WITH(model->forward_cached(ids_tensor({1}), other), Contains("a cache of 3 layers for a model of 2"));
  CHECK_THROWS_WITH(model->forward_cached(zeros({1, 2}), cache), Contains("int64"));
  nn::LayerCache layer(4);
  layer.append(zeros({1, 2, 3, 8}), zeros({1, 2, 3, 8}));
  CHECK_THROWS_WITH(layer.append(zeros({1, 2, 2, 8}), zeros({1, 2, 2, 8})), Contains("pass the capacity of 4"));
  CHECK_THROWS_WITH(layer.append(zeros({1, 3, 1, 8}), zeros({1, 3, 1, 8})), Contains("do not fit the cached ones"));
  CHECK_THROWS_WITH(layer.append(zeros({1, 2, 1, 8}, {.dtype = kFloat64}), zeros({1, 2, 1, 8})),
                    Contains("do not fit the cached ones"));
  CHECK_THROWS_WITH(layer.append(zeros({1, 2, 1, 8}), zeros({1, 2, 2, 8})), Contains("as many positions"));
  CHECK_THROWS_WITH(nn::attend_cached(zeros({1, 2, 2, 8}), zeros({1, 2, 2, 8}), zeros({1, 2, 2, 8}), layer),
                    Contains("only a prefill"));
  CHECK_THROWS_WITH(nn::KVCache(0, 4), Contains("at least one layer"));
  CHECK_THROWS_WITH(cache.layer(2), Contains("no layer 2"));
  CHECK_THROWS_WITH(nn::generate(*model, {}, {}), Contains("at least one token"));
  nn::Linear not_lm(4, 4);
  CHECK_THROWS_WITH(nn::generate(not_lm, {1}, {}), Contains("not a CausalLM"));
}

// transformers' RepetitionPenaltyLogitsProcessor: each token of the sequence once, a positive logit divided by the
// penalty, a negative one multiplied; before temperature, and for greedy too.
TEST_CASE("sample_token: the repetition penalty of the tokens already in the sequence") {
  using weft::test::vec;
  Generator gen(1);
  const Tensor l = vec({3.0, 2.0, -1.0, -0.4, 1.0});
  CHECK(nn::sample_token(l, {.temperature = 0}, gen, {0, 0, 3}) == 0);  // penalty 1: off
  CHECK(nn::sample_token(l, {.repetition_penalty = 2, .temperature = 0}, gen, {0, 0, 3}) == 1);  // 3 / 2 < 2
  CHECK(nn::sample_token(l, {.repetition_penalty = 1.4, .temperature = 0}, gen, {0}) == 0);  // 3 / 1.4 > 2
  // A negative logit is multiplied: -0.4 * 3 = -1.2 falls below -1 (divided, -0.13, it would have stayed ahead).
  CHECK(nn::sample_token(vec({-1.0, -0.4}), {.repetition_penalty = 3, .temperature = 0}, gen, {1}) == 0);
  CHECK_THROWS_WITH(nn::sample_token(l, {.repetition_penalty = 0}, gen), Contains("repetition_penalty must be"));
}

TEST_CASE("sample_token: greedy, temperature, top-k and top-p draw from what they name") {
  using weft::test::vec;
  Generator gen(1);
  const Tensor l = vec({0.5, 2.0, 1.0, 2.0, -1.0});
  CHECK(nn::sample_token(l, {.temperature = 0}, gen) == 1);  // the first of equal maxima
  // top-k keeps every token tied with the k-th logit, as transformers' TopKLogitsWarper (it had cut ties by id).
  const Tensor tied = vec({3.0, 1.0, 1.0, 1.0, 0.0});
  int threes = 0, past_k = 0;
  for (int i = 0; i < 200; ++i) {
    const int64_t one = nn::sample_token(l, {.temperature = 1, .top_k = 1}, gen);  // 1 and 3 tie at the top
    CHECK((one == 1 || one == 3));
    threes += one == 3;
    CHECK(nn::sample_token(l, {.temperature = 1, .top_p = 1e-6}, gen) == 1);
    const int64_t two = nn::sample_token(l, {.temperature = 1, .top_k = 2}, gen);
    CHECK((two == 1 || two == 3));
    const int64_t t = nn::sample_token(tied, {.temperature = 1, .top_k = 2}, gen);
    CHECK(t != 4);
    past_k += t == 2 || t == 3;
  }
  CHECK(threes > 50);
  CHECK(past_k > 10);
  // p = softmax([0, log 3]) = (1/4, 3/4); at temperature 2, (sqrt 3 against 1): 0.634.
  auto frequency_of_1 = [&](double temperature, const Tensor& logits, double top_p) {
    int ones = 0;
    for (int i = 0; i < 4000; ++i) ones += nn::sample_token(logits, {.temperature = temperature, .top_p = top_p}, gen) == 1;
    return ones / 4000.0;
  };
  const Tensor two = vec({0.0, std::log(3.0)});
  CHECK(frequency_of_1(1, two, 1) == Approx(0.75).margin(0.03));
  CHECK(frequency_of_1(2, two, 1) == Approx(std::sqrt(3.0) / (1 + std::sqrt(3.0))).margin(0.03));
  // top_p 0.7 of (0.5, 0.3, 0.2) keeps the first two: 0.5 / 0.8 and 0.3 / 0.8.
  const Tensor three = vec({std::log(0.3), std::log(0.5), std::log(0.2)});
  CHECK(frequency_of_1(1, three, 0.7) == Approx(0.625).margin(0.03));
  for (int i = 0; i < 200; ++i) CHECK(nn::sample_token(three, {.top_p = 0.7}, gen) != 2);
  // One seed, one sequence.
  Generator a(9), b(9);
  for (int i = 0; i < 20; ++i) CHECK(nn::sample_token(l, {}, a) == nn::sample_token(l, {}, b));
  CHECK_THROWS_WITH(nn::sample_token(vec({0.0, NAN}), {}, gen), Contains("the logit of token 1 is nan"));
  CHECK_THROWS_WITH(nn::sample_token(l, {.temperature = -1}, gen), Contains("temperature must be >= 0"));
  CHECK_THROWS_WITH(nn::sample_token(l, {.top_k = -2}, gen), Contains("top_k must be >= 0"));
  CHECK_THROWS_WITH(nn::sample_token(l, {.top_p = 0}, gen), Contains("top_p must be in (0, 1]"));
  CHECK_THROWS_WITH(nn::sample_token(zeros({2, 3}), {}, gen), Contains("expected logits [vocab]"));
}
