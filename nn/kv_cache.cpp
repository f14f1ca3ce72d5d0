#include "nn/kv_cache.h"

#include "core/error.h"
#include "nn/module.h"

namespace weft::nn {

std::pair<Tensor, Tensor> LayerCache::append(const Tensor& k, const Tensor& v) {
  WEFT_CHECK(k.defined() && v.defined() && k.dim() == 4 && v.dim() == 4 && k.size(0) == v.size(0) &&
                 k.size(1) == v.size(1) && k.size(2) == v.size(2),
             "KVCache: expected keys [B, Hkv, T, E] and values [B, Hkv, T, Ev] of as many positions, got {} and {}",
             k.defined() ? tensor_desc(k) : "undefined", v.defined() ? tensor_desc(v) : "undefined");
  const int64_t T = k.size(2);
  WEFT_CHECK(length_ + T <= capacity_, "KVCache: {} new positions after {} pass the capacity of {} (the model's context)",
             T, length_, capacity_);
  if (!k_.defined()) {
    k_ = empty({k.size(0), k.size(1), capacity_, k.size(3)}, {.dtype = k.dtype(), .device = k.device()});
    v_ = empty({v.size(0), v.size(1), capacity_, v.size(3)}, {.dtype = v.dtype(), .device = v.device()});
  }
  auto same = [&](const Tensor& cached, const Tensor& x, const char* what) {
    WEFT_CHECK(x.size(0) == cached.size(0) && x.size(1) == cached.size(1) && x.size(3) == cached.size(3) &&
                   x.dtype() == cached.dtype() && x.device() == cached.device(),
               "KVCache: new {} {} do not fit the cached ones {} (same batch, heads, head dim, dtype and device)", what,
               tensor_desc(x), tensor_desc(cached));
  };
  same(k_, k, "keys");
  same(v_, v, "values");
  k_.narrow(2, length_, T).copy_(k);  // data, not part of any graph (copy_ records no gradient)
  v_.narrow(2, length_, T).copy_(v);
  length_ += T;
  return {k_.narrow(2, 0, length_), v_.narrow(2, 0, length_)};
}

int64_t LayerCache::bytes() const { return k_.defined() ? int64_t(k_.nbytes() + v_.nbytes()) : 0; }

Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, LayerCache& cache, const kernels::Rope& rope) {
  WEFT_CHECK(q.defined() && q.dim() == 4, "attend_cached: expected queries [B, H, T, E], got {}",
             q.defined() ? tensor_desc(q) : "undefined");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), pos = cache.length();
  WEFT_CHECK(T == 1 || pos == 0, "attend_cached: {} new positions after {} cached ones: only a prefill (an empty "
             "cache) takes more than one position at a time", T, pos);
  auto [keys, values] = cache.append(k, v);
  Tensor y = scaled_dot_product_attention(
      q, keys, values, AttentionOptions{.causal = T > 1, .dropout_p = 0, .training = false,
                                        .rope = {.theta = rope.theta, .scaling = rope.scaling, .q_pos = pos}});
  return y.transpose(1, 2).reshape({B, T, H * values.size(3)});  // stored [B, T, H, Ev]: a view
}

Tensor CausalLM::forward_cached(const Tensor& idx, KVCache& cache, int64_t logits_to_keep) {
  WEFT_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == kInt64 && idx.size(1) >= 1,
             "forward_cached: expected token ids [B, T] (int64, T >= 1), got {}",
             idx.defined() ? tensor_desc(idx) : "undefined");
  const int64_t layers = make_cache().n_layer(), n = cache.n_layer();
  WEFT_CHECK(n == layers, "forward_cached: a cache of {} layers for a model of {}", n, layers);
  WEFT_CHECK(cache.length() + idx.size(1) <= context_length(), "forward_cached: {} cached and {} new positions pass "
             "the model's context of {}", cache.length(), idx.size(1), context_length());
  WEFT_CHECK(logits_to_keep >= 0, "forward_cached: logits_to_keep must be >= 0, got {}", logits_to_keep);
  auto run = [&](const TensorList& in) -> TensorList {
    const int64_t t = in[0].size(1), keep = logits_to_keep > 0 ? std::min(logits_to_keep, t) : t;
    const int64_t step = cache.length() == 0 ? t : 1;  // after a prefill, T > 1 runs one position at a time
    TensorList steps;
    for (int64_t i = 0; i < t; i += step) steps.push_back(hidden_cached(step == t ? in[0] : in[0].narrow(1, i, 1), cache));
    Tensor h = steps.size() == 1 ? steps[0] : cat(steps, 1);
    WEFT_CHECK(h.size(1) == t, "forward_cached: the blocks gave {} positions for {} tokens (the model holds a block "
               "of the sequence: tp's sequence parallel); decode from a split without it, or whole", h.size(1), t);
    Tensor out = logits(keep == t ? h : h.narrow(1, t - keep, keep).contiguous());
    WEFT_CHECK(out.size(-1) == vocab_size(), "forward_cached: the logits hold {} columns for a vocabulary of {} (the "
               "head is split by vocabulary: tp's loss parallel); decode from a split without it, or whole",
               out.size(-1), vocab_size());
    return {out};
  };
  auto* module = dynamic_cast<Module*>(this);
  return module ? module->call(run, {idx})[0] : run({idx})[0];
}

KVCache::KVCache(int64_t n_layer, int64_t capacity) {
  WEFT_CHECK(n_layer >= 1 && capacity >= 1, "KVCache: needs at least one layer and one position, got {} and {}",
             n_layer, capacity);
  layers_.assign(size_t(n_layer), LayerCache(capacity));
}

LayerCache& KVCache::layer(int64_t i) {
  WEFT_CHECK(i >= 0 && i < n_layer(), "KVCache: no layer {} in a cache of {}", i, n_layer());
  return layers_[size_t(i)];
}

void KVCache::clear() { for (auto& l : layers_) l.clear(); }

int64_t KVCache::bytes() const {
  int64_t n = 0;
  for (const auto& l : layers_) n += l.bytes();
  return n;
}

}  // namespace weft::nn
