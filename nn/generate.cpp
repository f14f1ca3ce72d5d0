#include "nn/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "autograd/ops.h"
#include "core/grad_mode.h"

namespace weft::nn {

int64_t sample_token(const Tensor& logits, const SamplingOptions& o, Generator& gen, const std::vector<int64_t>& sequence) {
  WEFT_CHECK(logits.defined() && logits.dim() == 1 && logits.numel() >= 1, "sample_token: expected logits [vocab], "
             "got {}", logits.defined() ? tensor_desc(logits) : "undefined");
  WEFT_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), "sample_token: temperature must be >= 0, got {}",
             o.temperature);
  WEFT_CHECK(o.top_k >= 0, "sample_token: top_k must be >= 0, got {}", o.top_k);
  WEFT_CHECK(o.top_p > 0 && o.top_p <= 1, "sample_token: top_p must be in (0, 1], got {}", o.top_p);
  WEFT_CHECK(o.repetition_penalty > 0 && std::isfinite(o.repetition_penalty), "sample_token: repetition_penalty must "
             "be a finite number > 0, got {}", o.repetition_penalty);
  Tensor l = logits.to(kCPU).to(kFloat64).contiguous();
  double* p = l.data<double>();
  const int64_t v = l.numel();
  for (int64_t i = 0; i < v; ++i)
    WEFT_CHECK(std::isfinite(p[i]), "sample_token: the logit of token {} is {}: the model's output is not finite, so "
               "there is nothing to sample", i, p[i]);
  if (o.repetition_penalty != 1) {  // each token of the sequence once, in one pass over it
    std::vector<char> seen(size_t(v), 0);
    for (int64_t t : sequence)
      if (t >= 0 && t < v && !std::exchange(seen[size_t(t)], 1))
        p[t] = p[t] < 0 ? p[t] * o.repetition_penalty : p[t] / o.repetition_penalty;
  }
  const int64_t best = int64_t(std::max_element(p, p + v) - p);
  if (o.temperature == 0) return best;
  // Tokens by falling logit (ties by id); the top-k cut, then the top-p cut, of that order.
  std::vector<int64_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  if (k < v) {  // every token tied with the k-th logit stays, as transformers' top-k keeps them
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
    const double kth = p[order[size_t(k - 1)]];
    k = std::count_if(p, p + v, [&](double x) { return x >= kth; });
  }
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(size_t(k));
  std::vector<double> w(order.size());
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) total += (w[i] = std::exp((p[order[i]] - p[best]) / o.temperature));
  if (o.top_p < 1) {  // keep the most likely tokens until their probability reaches top_p
    double mass = 0;
    size_t keep = 0;
    while (keep < w.size() && mass < o.top_p * total) mass += w[keep++];
    w.resize(std::max<size_t>(keep, 1));
    total = std::accumulate(w.begin(), w.end(), 0.0);
  }
  double u = gen.uniform() * total;
  for (size_t i = 0; i < w.size(); ++i)
    if ((u -= w[i]) < 0) return order[i];
  return order[w.size() - 1];
}

std::vector<int64_t> generate(Module& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                              const std::function<void(int64_t)>& on_token, GenerateStats* stats) {
  WEFT_CHECK(!prompt.empty(), "generate: the prompt must hold at least one token");
  WEFT_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", o.max_new_tokens);
  auto* lm = dynamic_cast<CausalLM*>(&model);
  WEFT_CHECK(lm || !o.use_cache, "generate: a {} cannot decode with a key/value cache (not a CausalLM); generate "
             "without it", model.type_name());
  const int64_t ctx = lm ? lm->context_length() : INT64_MAX;
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  GenerateStats st{.prompt_tokens = int64_t(prompt.size())};
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> ids = prompt, out;
  std::optional<KVCache> cache;  // the positions this call reaches, not all the context (Llama 3's: 131,072)
  const int64_t reach = std::min<int64_t>(ctx, int64_t(prompt.size()) + std::min(o.max_new_tokens, ctx));
  if (o.use_cache) cache.emplace(lm->make_cache().n_layer(), reach);
  const Device device = model.parameters().empty() ? kCPU : model.parameters().front().device();
  // The logits of the last token after running the last n tokens of ids (a prefill with the cache).
  auto run_window = [&](int64_t n) {
    n = std::min<int64_t>(n, int64_t(ids.size()));
    Tensor x = empty({1, n}, {.dtype = kInt64});
    std::copy(ids.end() - n, ids.end(), x.data<int64_t>());
    if (cache) cache->clear();
    Tensor logits = cache ? lm->forward_cached(x.to(device), *cache, 1) : model(x.to(device));
    return logits.select(0, 0).select(0, logits.size(1) - 1);
  };
  Generator gen(o.seed);
  try {
    auto t0 = Clock::now();
    Tensor last = o.max_new_tokens > 0 ? run_window(ctx) : Tensor();
    st.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    st.prefills = 1;
    t0 = Clock::now();
    for (int64_t n = 0; n < o.max_new_tokens; ++n) {
      int64_t next = sample_token(last, o.sampling, gen, ids);
      if (o.agree) next = o.agree(next);
      ids.push_back(next);
      out.push_back(next);
      if (on_token) on_token(next);
      if (std::find(o.eos.begin(), o.eos.end(), next) != o.eos.end() || n + 1 == o.max_new_tokens) break;
      if (!cache) {
        last = run_window(ctx);
      } else if (cache->length() == ctx) {  // full: restart from the last half of the context
        last = run_window(std::max<int64_t>(ctx / 2, 1));
        ++st.prefills;
      } else {
        Tensor x = full({1, 1}, double(next), {.dtype = kInt64, .device = device});
        last = lm->forward_cached(x, *cache, 1).select(0, 0).select(0, 0);
      }
    }
    st.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  st.new_tokens = int64_t(out.size()), st.cache_bytes = cache ? cache->bytes() : 0;
  if (stats) *stats = st;
  return out;
}

}  // namespace weft::nn
