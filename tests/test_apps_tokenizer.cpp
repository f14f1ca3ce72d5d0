// Byte-level BPE tokenizers (apps/transformer/bpe_tokenizer.h) against the fixtures that
// scripts/hf_reference.py made with the `tokenizers` library (tests/data/tokenizers: a GPT-2
// pre-tokenizer and a Llama-3-style one, each trained on the fortunes texts): every encoding
// and decoding equal to the library's, and tokenizer.json files weft cannot reproduce named.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <sstream>

#include "apps/transformer/bpe_tokenizer.h"

using namespace weft;
using Catch::Matchers::Contains;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = WEFT_TEST_DATA "/tokenizers";

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return json::parse(in);
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? "," : "") << ids[i];
  return s.str();
}

// A tokenizer.json written from `j` into a fresh file; returns its path.
std::string write_tokenizer(const json& j, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("weft_tokenizer_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << j.dump();
  return path;
}

}  // namespace

TEST_CASE("tokenizer: encode and decode equal the tokenizers library's on every fixture text") {
  for (const char* family : {"gpt2", "llama3"}) {
    INFO(family);
    const apps::BpeTokenizer tok(kData + "/" + family + "/tokenizer.json");
    const json want = read_json(kData + "/" + family + "/expected.json");
    CHECK(tok.vocab_size() == want["vocab_size"].get<int64_t>());
    CHECK(tok.id_of("<|endoftext|>") == 0);
    CHECK(tok.id_of("<|user|>") == 1);
    CHECK(tok.id_of("no such token") == -1);
    size_t n = 0;
    for (const json& c : want["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      INFO("text " << json(text).dump());
      const std::vector<int32_t> got = tok.encode(text);
      INFO("got  " << show(got) << "\nwant " << show(ids));
      CHECK(got == ids);
      CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
      CHECK(tok.decode(got) == text);  // valid UTF-8 comes back whole
      ++n;
    }
    CHECK(n >= 15);
  }
}

TEST_CASE("tokenizer: bytes that do not form UTF-8 decode to U+FFFD, bad text and ids are named") {
  const apps::BpeTokenizer tok(kData + "/gpt2/tokenizer.json");
  // The byte-level tokens of é's two bytes, 0xc3 and 0xa9 (written as U+00C3 and U+00A9).
  const int32_t lead = tok.id_of("\xc3\x83"), trail = tok.id_of("\xc2\xa9");
  REQUIRE(lead >= 0);
  REQUIRE(trail >= 0);
  CHECK(tok.decode({lead, trail}) == "\xc3\xa9");
  CHECK(tok.decode({lead}) == "\xef\xbf\xbd");
  CHECK(tok.decode({trail, lead, trail}) == "\xef\xbf\xbd\xc3\xa9");
  CHECK(tok.decode({lead, lead}) == "\xef\xbf\xbd\xef\xbf\xbd");
  CHECK_THROWS_WITH(tok.encode("ok\xff" "bad"), Contains("not valid UTF-8 at byte 2"));
  CHECK_THROWS_WITH(tok.encode("\xe2\x82"), Contains("not valid UTF-8 at byte 0"));
  CHECK_THROWS_WITH(tok.decode({5, int32_t(tok.vocab_size())}), Contains("decoding: id") && Contains("is not in the vocabulary"));
  CHECK_THROWS_WITH(tok.decode({-1}), Contains("id -1"));
}

TEST_CASE("tokenizer: a tokenizer.json weft cannot reproduce is an error naming the field") {
  const json base = read_json(kData + "/llama3/tokenizer.json");
  auto expect_error = [&](const std::function<void(json&)>& edit, const std::string& text) {
    json j = base;
    edit(j);
    INFO("expecting an error containing: " << text);
    CHECK_THROWS_WITH(apps::BpeTokenizer(write_tokenizer(j, "bad.json")), Contains(text));
  };
  expect_error([](json& j) { j["model"]["type"] = "Unigram"; }, "model type \"Unigram\" is not supported");
  expect_error([](json& j) { j["model"]["type"] = "WordPiece"; }, "\"WordPiece\"");
  expect_error([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer \"NFC\"");
  expect_error([](json& j) { j["normalizer"] = 5; }, "normalizer \"5\"");
  expect_error([](json& j) { j["decoder"] = json::array({1}); }, "decoder");
  expect_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder \"WordPiece\"");
  expect_error([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  expect_error([](json& j) { j["model"]["merges"][3] = json::array({"zz-not", "a-token"}); },
               "merge 3 (\"zz-not\" + \"a-token\") names a token the vocabulary lacks");
  expect_error([](json& j) { j["model"]["merges"][0] = 7; }, "merge 0 is 7");
  expect_error([](json& j) { j["model"]["vocab"].erase("A"); }, "lacks byte 0x41");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
               "behavior \"Removed\"");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}}; },
               "does not compile");
  expect_error([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre-tokenizer \"Whitespace\"");
  expect_error([](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "\"lstrip\" is true");
  expect_error([](json& j) { j.erase("model"); }, "\"model\" is missing");
  CHECK_THROWS_WITH(apps::BpeTokenizer("/nonexistent/tokenizer.json"), Contains("cannot be opened"));
  const std::string junk = write_tokenizer(json::object(), "junk.json");
  std::ofstream(junk) << "{ not json";
  CHECK_THROWS_WITH(apps::BpeTokenizer(junk), Contains("is not valid JSON"));
}

TEST_CASE("tokenizer: the older \"a b\" merges and the GPT-2 form read the same") {
  json j = read_json(kData + "/gpt2/tokenizer.json");
  for (json& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const apps::BpeTokenizer old_form(write_tokenizer(j, "old_merges.json"));
  const apps::BpeTokenizer tok(kData + "/gpt2/tokenizer.json");
  const std::string text = "The quick brown fox, don't 1234 \xc3\xa9t\xc3\xa9.";
  CHECK(old_form.encode(text) == tok.encode(text));
}

TEST_CASE("tokenizer: with ignore_merges a pre-token in the vocabulary is one token, merges or not") {
  // A vocabulary word no merge builds (as in Llama 3's): `tokenizers` gives [2000, 2000] for
  // " zqxj zqxj" with ignore_merges, and the words' bytes (222, 91, 82, 89, 75 each) without.
  json j = read_json(kData + "/llama3/tokenizer.json");
  j["model"]["vocab"]["\xc4\xa0zqxj"] = 2000;  // "Ġzqxj"
  const apps::BpeTokenizer with(write_tokenizer(j, "ignore_merges.json"));
  CHECK(with.encode(" zqxj zqxj") == std::vector<int32_t>{2000, 2000});
  CHECK(with.decode({2000}) == " zqxj");
  j["model"]["ignore_merges"] = false;
  const apps::BpeTokenizer without(write_tokenizer(j, "merges.json"));
  CHECK(without.encode(" zqxj zqxj") == std::vector<int32_t>{222, 91, 82, 89, 75, 222, 91, 82, 89, 75});
}
