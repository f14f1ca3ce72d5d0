// libFuzzer target for the BPE tokenizer (apps/transformer/bpe_tokenizer.cpp): its
// tokenizer.json reader, its encoder and its decoder must either work or raise weft::Error —
// never crash, read out of bounds or hit undefined behaviour (built with AddressSanitizer and
// UndefinedBehaviorSanitizer). The first input byte picks what the rest is:
//   0  a whole tokenizer.json;
//   1  JSON put into one field (selected by the next byte) of a small valid tokenizer.json
//      (the GPT-2 fixture cut to its first ids), which is then read;
//   2  text for the fixture tokenizer: if it encodes, it must decode back to itself;
//   3  ids (32-bit) for the fixture tokenizer's decoder: the text must be valid UTF-8;
//   4  text for the SentencePiece-style fixture (normalizer, byte_fallback, template): if it
//      encodes, its ids must decode to valid UTF-8;
//   5  ids for the SentencePiece-style fixture's decoder: the text must be valid UTF-8.
// tests/fuzz/run_fuzz.sh builds and runs it with WEFT_FUZZ_TOKENIZER and WEFT_FUZZ_TOKENIZER_SP
// naming the fixtures.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/transformer/bpe_tokenizer.h"
#include "core/error.h"

using json = nlohmann::json;

namespace {

const char* fixture(const char* var = "WEFT_FUZZ_TOKENIZER") {
  const char* path = std::getenv(var);
  if (!path) {
    std::fprintf(stderr, "fuzz_tokenizer: set %s to a tokenizer.json\n", var);
    std::abort();
  }
  return path;
}

const weft::apps::BpeTokenizer& full() {
  static const weft::apps::BpeTokenizer tok(fixture());
  return tok;
}

const weft::apps::BpeTokenizer& sentencepiece() {
  static const weft::apps::BpeTokenizer tok(fixture("WEFT_FUZZ_TOKENIZER_SP"));
  return tok;
}

// The fixture with only ids below 600 (the byte tokens, the added ones, the first merges).
const json& small() {
  static const json j = [] {
    std::ifstream in(fixture());
    json t = json::parse(in);
    json vocab = json::object(), merges = json::array();
    for (const auto& [k, v] : t["model"]["vocab"].items())
      if (v.get<int>() < 600) vocab[k] = v;
    for (const json& m : t["model"]["merges"])
      if (vocab.contains(m[0].get<std::string>() + m[1].get<std::string>())) merges.push_back(m);
    t["model"]["vocab"] = vocab;
    t["model"]["merges"] = merges;
    return t;
  }();
  return j;
}

void read_file(const std::string& text) {
  static const std::string path = "fuzz_input." + std::to_string(::getpid()) + ".json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
    std::perror("fuzz_tokenizer: writing the input");
    std::abort();
  }
  try {
    const weft::apps::BpeTokenizer tok(path);
    const std::vector<int32_t> ids = tok.encode("The quick brown fox, 1234 \xc3\xa9t\xc3\xa9 <|endoftext|>");
    (void)tok.decode(ids, true);
  } catch (const weft::Error&) {
  }
}

bool valid_utf8(const std::string& s) {
  // The decoder's own promise, checked independently of it: no byte sequence that is not UTF-8.
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + size_t(len) > s.size()) return false;
    for (int k = 1; k < len; ++k)
      if ((uint8_t(s[i + size_t(k)]) >> 6) != 2) return false;
    i += size_t(len);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      read_file(rest);
      break;
    case 1: {
      if (rest.empty()) return 0;
      json value = json::parse(rest.substr(1), nullptr, false);
      if (value.is_discarded()) return 0;
      json t = small();
      switch (uint8_t(rest[0]) % 8) {
        case 0: t["model"] = value; break;
        case 1: t["pre_tokenizer"] = value; break;
        case 2: t["added_tokens"] = value; break;
        case 3: t["model"]["merges"] = value; break;
        case 4: t["model"]["vocab"] = value; break;
        case 5: t["normalizer"] = value; break;
        case 6: t["post_processor"] = value; break;
        default: t["decoder"] = value; break;
      }
      read_file(t.dump());
      break;
    }
    case 2:
      try {
        const std::vector<int32_t> ids = full().encode(rest);
        if (full().decode(ids) != rest) {
          std::fprintf(stderr, "fuzz_tokenizer: encode then decode changed the text\n");
          std::abort();
        }
      } catch (const weft::Error&) {
      }
      break;
    case 4:
      try {
        if (!valid_utf8(sentencepiece().decode(sentencepiece().encode(rest, true)))) {
          std::fprintf(stderr, "fuzz_tokenizer: the SentencePiece-style decode returned bytes that are not UTF-8\n");
          std::abort();
        }
      } catch (const weft::Error&) {
      }
      break;
    default: {
      const weft::apps::BpeTokenizer& tok = data[0] % 6 == 3 ? full() : sentencepiece();
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      const int64_t n = tok.vocab_size();
      for (int32_t& id : ids) id = int32_t(int64_t(uint32_t(id)) % (n + 2)) - 1;  // a few ids outside
      try {
        if (!valid_utf8(tok.decode(ids, ids.size() % 2 == 1))) {
          std::fprintf(stderr, "fuzz_tokenizer: decode returned bytes that are not UTF-8\n");
          std::abort();
        }
      } catch (const weft::Error&) {
      }
    }
  }
  return 0;
}
