// nn: text generation from a decoder: drawing the next token from logits (greedy, temperature,
// top-k, top-p) and the loop that continues a prompt, with a key/value cache (nn/kv_cache.h) or
// by running the whole window again for every token.
#pragma once
#include <functional>
#include <vector>

#include "../core/generator.h"
#include "kv_cache.h"
#include "module.h"

namespace weft::nn {

// Applied in this order, as Hugging Face's generate does: the repetition penalty, temperature, then top-k, then top-p.
struct SamplingOptions {
  // > 0; 1: off. As transformers' RepetitionPenaltyLogitsProcessor: the logit of a token already in the sequence
  // (prompt and generated, each once) is divided by it when positive, multiplied when negative (greedy too).
  double repetition_penalty = 1.0;
  double temperature = 1.0;  // 0: greedy (the most likely token; the first of equal ones)
  int64_t top_k = 0;         // draw among the k most likely tokens only (0: all)
  double top_p = 1.0;        // then among the fewest most likely whose probability reaches p (1: all)
};

// A token drawn from logits [vocab] (any float dtype and device) with one uniform draw of `gen`.
// Throws naming the token when a logit is not finite.
int64_t sample_token(const Tensor& logits, const SamplingOptions& opts, Generator& gen,
                     const std::vector<int64_t>& sequence = {});  // what the repetition penalty applies to

struct GenerateOptions {
  int64_t max_new_tokens = 200;
  SamplingOptions sampling;
  uint64_t seed = 0;        // of the draws (unused when greedy)
  std::vector<int64_t> eos;  // stop after generating any of these tokens (none: never)
  bool use_cache = true;    // false: run the last context_length tokens again for every token
  // Under several processes, maps this process's choice to the one all take (rank 0's, say), so
  // that they stop together; empty: the choice as drawn.
  std::function<int64_t(int64_t)> agree;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, new_tokens = 0, prefills = 0, cache_bytes = 0;  // of the key/value cache's storage
  double prefill_seconds = 0, decode_seconds = 0;  // the prompt's forward; every later one
};

// Continues `prompt` (token ids of one sequence, not empty) by up to max_new_tokens tokens, calling
// on_token with each as it is chosen; returns the new tokens. The model sees at most its context:
// without the cache, the last context_length() tokens each time; with it, a full cache restarts
// from the last half of the context (one prefill), so past the context the two paths see different
// windows. With the cache the model must be a CausalLM. Runs without gradients, in eval mode.
std::vector<int64_t> generate(Module& model, const std::vector<int64_t>& prompt, const GenerateOptions& opts,
                              const std::function<void(int64_t)>& on_token = {}, GenerateStats* stats = nullptr);

}  // namespace weft::nn
