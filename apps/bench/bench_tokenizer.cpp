// weft-bench-tokenizer: encoding throughput of a byte-level BPE tokenizer.json
// (apps/transformer/bpe_tokenizer.h), one encode call per file of text, one thread, as the
// `tokenizers` library is called from Python (tok.encode(text) per file). Prints MB/s and
// tokens/s, the best and the median of --rounds, and checks that every file decodes back to its text.
//
//   weft-bench-tokenizer --tokenizer tests/data/tokenizers/gpt2/tokenizer.json
//   weft-bench-tokenizer --tokenizer T --data DIR|FILE --rounds 5
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/text_data.h"
#include "weft.h"

namespace {

// The files `prepare` and load_text read (text_files), each whole, as load_text reads them: regular
// files only (a FIFO or /dev/zero refused) within its size limit.
std::vector<std::string> read_texts(const std::string& path) {
  std::vector<std::string> texts;
  for (const std::string& n : weft::apps::text_files(path)) {
    const std::vector<uint8_t> text = weft::apps::load_text(n, 0).train;
    texts.emplace_back(text.begin(), text.end());
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench-tokenizer: encoding throughput of a BPE tokenizer.json, one call per file"};
  std::string tokenizer, data = weft::apps::kDefaultTextDir;
  int rounds = 3;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json (Hugging Face tokenizers format)")->required();
  app.add_option("--data", data, "a text file or a folder of them (default: the fortunes texts)");
  app.add_option("--rounds", rounds, "timed rounds over all files")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    const weft::apps::BpeTokenizer tok(tokenizer);
    const std::vector<std::string> texts = read_texts(data);
    size_t bytes = 0, tokens = 0;
    for (const std::string& t : texts) bytes += t.size();
    std::vector<double> secs;
    for (int r = 0; r < rounds; ++r) {
      tokens = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (const std::string& t : texts) tokens += tok.encode(t).size();
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    for (const std::string& t : texts)
      if (tok.decode(tok.encode(t)) != t) throw weft::Error("weft-bench-tokenizer: a file does not decode to its text");
    std::sort(secs.begin(), secs.end());
    const double best = secs.front(), median = secs[secs.size() / 2];
    std::printf("| tokenizer | files | MB | tokens | MB/s best / median | tokens/s best |\n|---|---:|---:|---:|---:|---:|\n");
    std::printf("| %s | %zu | %.2f | %zu | %.2f / %.2f | %.0f |\n", tokenizer.c_str(), texts.size(), bytes / 1e6, tokens,
                bytes / best / 1e6, bytes / median / 1e6, tokens / best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
