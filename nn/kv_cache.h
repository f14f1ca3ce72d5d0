// nn: the key/value cache of incremental decoding. A decoder that has seen positions 0..P-1
// keeps each layer's keys and values for them, so the next token costs one position (its
// projections and one attention row over P + 1 keys) instead of the whole sequence again.
//
// Vocabulary: the *prefill* runs the prompt (T tokens into an empty cache, the causal attention
// of training); a *decode step* runs one token against the cache. Keys are cached as projected,
// before rotary embeddings: the fused attention rotates them as it reads them (kernels/rope.h),
// from the cache's first position, so a cache never holds rotated copies.
#pragma once
#include <utility>
#include <vector>

#include "../autograd/ops.h"

namespace weft::nn {

// One layer's keys and values, [B, Hkv, capacity, E] each, of which the first length() positions
// are filled. Storage is allocated on the first append, in the dtype and on the device of the keys.
class LayerCache {
 public:
  explicit LayerCache(int64_t capacity) : capacity_(capacity) {}
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  // Appends k [B, Hkv, T, E] and v [B, Hkv, T, Ev] (any strides) after the cached positions and
  // returns views of every cached key and value, [B, Hkv, length() + T, E] (last stride 1).
  // Throws when the positions would pass the capacity or the shapes differ from the cached ones.
  std::pair<Tensor, Tensor> append(const Tensor& k, const Tensor& v);
  void clear() { length_ = 0; }
  int64_t bytes() const;

 private:
  int64_t capacity_, length_ = 0;
  Tensor k_, v_;
};

// Every layer's cache; the positions a model has seen are layer 0's.
class KVCache {
 public:
  KVCache(int64_t n_layer, int64_t capacity);
  LayerCache& layer(int64_t i);
  int64_t n_layer() const { return int64_t(layers_.size()); }
  int64_t length() const { return layers_.front().length(); }
  int64_t capacity() const { return layers_.front().capacity(); }
  void clear();
  int64_t bytes() const;

 private:
  std::vector<LayerCache> layers_;
};

// A self-attention module that can run on new positions only: x [B, T, d] holds the tokens after
// the cache's length() positions; their keys and values are appended to `cache`. T > 1 needs an
// empty cache (the prefill's causal mask); one token attends to the whole cache.
class CachedAttention {
 public:
  virtual ~CachedAttention() = default;
  virtual Tensor forward_cached(const Tensor& x, LayerCache& cache) = 0;
};

// Appends k, v [B, Hkv, T, E] to `cache` and attends q [B, H, T, E] to every cached position (causal among the T new
// ones, which must then start an empty cache, when T > 1); a rope that is on (its theta and scaling; the positions are
// the cache's) rotates q and the keys by their positions. Returns [B, T, H * Ev], the heads concatenated as an output
// projection reads them. No dropout; no gradient reaches the cache.
Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, LayerCache& cache,
                     const kernels::Rope& rope = {});

// A decoder over token ids that decodes incrementally (nn::Llama, the GPT of weft-transformer).
class CausalLM {
 public:
  virtual ~CausalLM() = default;
  // The logits [B, T, vocab] of tokens idx [B, T] (i64) at positions cache.length() .. + T - 1,
  // extending the cache; logits_to_keep > 0: of the last ones only (a prefill's head for one row,
  // not T). T > 1 after cached positions runs one position at a time. The model's forward hooks
  // run around it (Module::call), so under FSDP its parameters are gathered.
  Tensor forward_cached(const Tensor& idx, KVCache& cache, int64_t logits_to_keep = 0);
  // An empty cache for this model: one layer per block, its context long.
  virtual KVCache make_cache() const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t vocab_size() const = 0;  // the logits' columns

 protected:
  // forward_cached's hidden states [B, T, d] for T == 1 or an empty cache, hooks already
  // running; then the final norm and the head of the kept positions.
  virtual Tensor hidden_cached(const Tensor& idx, KVCache& cache) = 0;
  virtual Tensor logits(const Tensor& h) = 0;
};

}  // namespace weft::nn
