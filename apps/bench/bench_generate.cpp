// weft-bench-generate: text generation speed, batch 1, with the key/value cache (nn::generate) and without it (the
// whole window again for every token), on GPT medium or the Llama config of its size, freshly initialised (speed does
// not depend on the weights). A prompt of --prompt random bytes is continued greedily by --new tokens, so the context
// grows to prompt + new (default 448 + 64 = 512 positions). Prints, per path, the prompt's forward, the new tokens/s
// after it (decode), the best and median of --rounds, and checks that both paths chose the same tokens.
// scripts/generate_pytorch.py is the PyTorch twin (docs/PERFORMANCE.md).
//
//   weft-bench-generate --arch gpt2|llama --threads 1 [--prompt 448 --new 64 --rounds 3]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "apps/common/trainer.h"
#include "apps/transformer/model.h"
#include "weft.h"

using namespace weft;

namespace {

struct Timing {
  std::vector<double> prefill_ms, decode_tps;
  std::vector<int64_t> tokens;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench-generate: generation tokens/s with and without the key/value cache"};
  std::string arch = "gpt2";
  int threads = 1, rounds = 3;
  int64_t prompt_len = 448, new_tokens = 64, no_cache_new = 0;
  app.add_option("--arch", arch, "gpt2 (GPT medium: L6 H6 d384) or llama (L6 H6 2 KV heads d384, SwiGLU)")
      ->check(CLI::IsMember({"gpt2", "llama"}))->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--prompt", prompt_len, "prompt tokens")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--new", new_tokens, "new tokens (the context is prompt + new)")
      ->check(CLI::Range(2, 1 << 16))->capture_default_str();
  app.add_option("--no-cache-new", no_cache_new, "new tokens of the no-cache path (default: --new)")
      ->check(CLI::Range(2, 1 << 16));
  app.add_option("--rounds", rounds, "timed rounds of each path")->check(CLI::Range(1, 100))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (no_cache_new == 0) no_cache_new = new_tokens;
  try {
    set_num_threads(threads);
    apps::ModelConfig cfg{.ctx = prompt_len + new_tokens, .n_layer = 6, .n_head = 6, .d_model = 384, .arch = arch};
    if (arch == "llama") cfg.n_kv_head = 2, cfg.tie_weights = false;
    apps::check_config(cfg);
    manual_seed(0);
    apps::LanguageModel lm = apps::make_model(cfg);
    apps::init_model(lm);
    Generator g(1);
    Tensor bytes = rand({prompt_len}, {}, &g);
    std::vector<int64_t> prompt;
    for (double u : to_vector(bytes)) prompt.push_back(int64_t(u * 256) % 256);
    std::printf("weft-bench-generate: %s, %lld parameters, batch 1, %d thread(s); prompt %lld tokens, then %lld new "
                "(context %lld); greedy\n", arch.c_str(), (long long)apps::count_parameters(*lm.module), threads,
                (long long)prompt_len, (long long)new_tokens, (long long)cfg.ctx);
    std::printf("| path | new tokens | prompt forward ms (median) | decode tokens/s (best) | decode tokens/s (median) |\n"
                "|---|---:|---:|---:|---:|\n");
    Timing t[2];
    for (int cache = 1; cache >= 0; --cache) {
      const int64_t n = cache ? new_tokens : no_cache_new;
      nn::GenerateOptions o{.max_new_tokens = n, .sampling = {.temperature = 0}, .use_cache = bool(cache)};
      nn::generate(*lm.module, prompt, {.max_new_tokens = 2, .sampling = {.temperature = 0}, .use_cache = bool(cache)});
      for (int r = 0; r < rounds; ++r) {
        nn::GenerateStats st;
        t[cache].tokens = nn::generate(*lm.module, prompt, o, {}, &st);
        t[cache].prefill_ms.push_back(1e3 * st.prefill_seconds);
        t[cache].decode_tps.push_back(double(st.new_tokens - 1) / st.decode_seconds);
      }
      std::printf("| %s | %lld | %.1f | %.1f | %.1f |\n", cache ? "key/value cache" : "no cache (whole window)",
                  (long long)n, median(t[cache].prefill_ms),
                  *std::max_element(t[cache].decode_tps.begin(), t[cache].decode_tps.end()), median(t[cache].decode_tps));
      std::fflush(stdout);
    }
    const size_t common = std::min(t[0].tokens.size(), t[1].tokens.size());
    const bool same = std::equal(t[0].tokens.begin(), t[0].tokens.begin() + long(common), t[1].tokens.begin());
    std::printf("cache / no cache, decode tokens/s (medians): %.1fx; the first %zu tokens %s\n",
                median(t[1].decode_tps) / median(t[0].decode_tps), common, same ? "agree" : "DIFFER");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-generate: %s\n", e.what());
    return 1;
  }
}
