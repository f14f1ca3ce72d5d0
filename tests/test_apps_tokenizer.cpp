// BPE tokenizers (apps/transformer/bpe_tokenizer.h) against the fixtures that
// scripts/tokenizer_fixtures.py made with the `tokenizers` library (tests/data/tokenizers: one
// per style a model family uses, byte-level and SentencePiece-style, Mistral 7B's own among
// them) and GPT-2's own tokenizer.json with the library's encodings (tests/data/gpt2,
// scripts/gpt2_tokenizer.py): every encoding and decoding equal to the library's, every form
// the library writes read, and tokenizer.json files weft cannot reproduce named.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <sstream>

#include "apps/transformer/bpe_tokenizer.h"
#include "scratch_dir.h"

using namespace weft;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kData = WEFT_TEST_DATA "/tokenizers";

json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return json::parse(in);
}

// `text` encoded in the parts split_point cuts, one after the other: each cut looked for from the limit `first()`
// gives, doubled until one is found; `cuts` counts them.
std::vector<int32_t> encode_in_cut_parts(const apps::BpeTokenizer& tok, std::string_view text,
                                         const std::function<size_t()>& first, size_t& cuts) {
  std::vector<int32_t> got;
  for (std::string_view rest = text; !rest.empty();) {
    size_t cut = 0;
    for (size_t limit = first(); cut == 0 && limit < rest.size(); limit *= 2) cut = tok.split_point(rest, limit);
    if (cut == 0) cut = rest.size();
    cuts += cut < rest.size();
    const std::vector<int32_t> part = tok.encode(rest.substr(0, cut), false, rest.size() < text.size());
    got.insert(got.end(), part.begin(), part.end());
    rest.remove_prefix(cut);
  }
  return got;
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? "," : "") << ids[i];
  return s.str();
}

// A tokenizer.json written from `j` into a fresh file; returns its path.
const test::ScratchDir kScratch("weft_tokenizer");
std::string write_tokenizer(const json& j, const std::string& name) {
  fs::create_directories(kScratch.path());
  const std::string path = (kScratch.path() / name).string();
  std::ofstream(path) << j.dump();
  return path;
}

// Each text's ids (with the special tokens) as `tokenizers` gives them, comma-separated.
void check_ids(const apps::BpeTokenizer& tok, const std::vector<std::pair<std::string, std::string>>& want) {
  for (const auto& [text, ids] : want) {
    INFO("text \"" << text << "\"");
    CHECK(show(tok.encode(text, true)) == ids);
  }
}

// An added token as `tokenizers`' add_tokens writes it into tokenizer.json.
void add_token(json& j, int id, const std::string& content, bool lstrip, bool rstrip, bool normalized, bool special) {
  j["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", lstrip},
                               {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}});
}

}  // namespace

// Every style weft reads: byte-level (gpt2, llama3 with its BOS template, llama3_prefix with
// ByteLevel's prefix space before each of the Split's pieces, qwen2 with NFC and lstrip/rstrip
// tokens) and SentencePiece-style (llama2 as Llama 2 and Mistral publish it, metaspace as
// transformers 5 converts it, and Mistral 7B's own 32,000-token tokenizer).
const char* const kStyles[] = {"gpt2", "llama3", "llama3_prefix", "qwen2", "llama2", "metaspace", "mistral"};

TEST_CASE("tokenizer: encode and decode equal the tokenizers library's on every fixture text") {
  for (const char* style : kStyles) {
    INFO(style);
    const apps::BpeTokenizer tok(kData + "/" + style + "/tokenizer.json");
    const json want = read_json(kData + "/" + style + "/expected.json");
    CHECK(tok.vocab_size() == want["vocab_size"].get<int64_t>());
    CHECK(tok.id_of("no such token") == -1);
    size_t n = 0;
    for (const json& c : want["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const auto ids = c["ids"].get<std::vector<int32_t>>(), with = c["ids_special"].get<std::vector<int32_t>>();
      INFO("text " << json(text).dump());
      const std::vector<int32_t> got = tok.encode(text), got_with = tok.encode(text, true);
      INFO("got  " << show(got) << "\nwant " << show(ids));
      CHECK(got == ids);
      INFO("with special tokens: got  " << show(got_with) << "\nwant " << show(with));
      CHECK(got_with == with);
      CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
      if (std::string(style) == "gpt2" || std::string(style) == "llama3") CHECK(tok.decode(got) == text);
      ++n;
    }
    CHECK(n >= 17);
    for (const json& c : want["decode_cases"]) {  // random ids, byte tokens that are not UTF-8, specials
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      INFO("ids " << show(ids));
      CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
      CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
    }
  }
}

TEST_CASE("tokenizer: the post-processor's template adds what transformers adds, and nothing for GPT-2") {
  const apps::BpeTokenizer gpt2(kData + "/gpt2/tokenizer.json"), llama3(kData + "/llama3/tokenizer.json"),
      llama2(kData + "/llama2/tokenizer.json");
  CHECK(gpt2.special_prefix().empty());
  CHECK(llama3.special_prefix() == std::vector<int32_t>{llama3.id_of("<|begin_of_text|>")});
  CHECK(llama2.special_prefix() == std::vector<int32_t>{1});
  CHECK(llama2.special_suffix().empty());
  CHECK(llama2.encode("", true) == std::vector<int32_t>{1});
}

TEST_CASE("tokenizer: without a decoder the tokens are joined with spaces, as tokenizers does") {
  json j = read_json(kData + "/llama2/tokenizer.json");
  j["decoder"] = nullptr;
  const apps::BpeTokenizer tok(write_tokenizer(j, "no_decoder.json"));
  CHECK(tok.decode({tok.id_of("\xe2\x96\x81the"), tok.id_of("\xe2\x96\x81of")}) == "\xe2\x96\x81the \xe2\x96\x81of");
}

TEST_CASE("tokenizer: a continuation decodes with the space its first word had; the text's start without") {
  const apps::BpeTokenizer sp(kData + "/llama2/tokenizer.json"), meta(kData + "/metaspace/tokenizer.json");
  for (const apps::BpeTokenizer* tok : {&sp, &meta}) {
    const std::vector<int32_t> ids = tok->encode("the world");
    REQUIRE(ids.size() >= 2);
    CHECK(tok->bytes_of(ids) == "the world");
    CHECK(tok->bytes_of({ids.back()}, false, false).front() == ' ');
    CHECK(tok->bytes_of({ids.back()}, false, true).front() != ' ');
    std::string streamed = tok->bytes_of({ids.front()});
    for (size_t i = 1; i < ids.size(); ++i) streamed += tok->bytes_of({ids[i]}, false, false);
    CHECK(streamed == "the world");
  }
  // Byte tokens of a character split over two steps come back as its bytes, not as U+FFFD.
  const int32_t e4 = sp.id_of("<0xE4>"), b8 = sp.id_of("<0xB8>"), ad = sp.id_of("<0xAD>");
  CHECK(sp.bytes_of({e4}) + sp.bytes_of({b8, ad}, false, false) == "\xe4\xb8\xad");
  CHECK(sp.decode({e4, b8}) == "\xef\xbf\xbd\xef\xbf\xbd");
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

TEST_CASE("tokenizer: without byte_fallback an unknown character is unk_token, fused under fuse_unk") {
  json j = read_json(kData + "/llama2/tokenizer.json");
  j["model"]["byte_fallback"] = false;
  const std::string text = "a \xe4\xb8\xad\xe6\x96\x87 b";  // 中文: neither character is a token
  const apps::BpeTokenizer fused(write_tokenizer(j, "fuse_unk.json"));
  j["model"]["fuse_unk"] = false;
  const apps::BpeTokenizer apart(write_tokenizer(j, "no_fuse_unk.json"));
  const std::vector<int32_t> one = fused.encode(text), two = apart.encode(text);
  INFO("fused " << show(one) << "\napart " << show(two));
  CHECK(std::count(one.begin(), one.end(), 0) == 1);
  CHECK(std::count(two.begin(), two.end(), 0) == 2);
  j["model"]["unk_token"] = nullptr;  // `tokenizers` then drops the characters
  CHECK(apps::BpeTokenizer(write_tokenizer(j, "no_unk.json")).encode(text).size() == two.size() - 2);
}

TEST_CASE("tokenizer: Metaspace with split cuts words before each replacement, so no merge spans one") {
  json j = read_json(kData + "/metaspace/tokenizer.json");
  const int32_t id = int32_t(j["model"]["vocab"].size());
  j["model"]["vocab"]["o\xe2\x96\x81"] = id;  // "o▁", merged first
  j["model"]["merges"].insert(j["model"]["merges"].begin(), json::array({"o", "\xe2\x96\x81"}));
  const apps::BpeTokenizer split(write_tokenizer(j, "split.json"));
  j["pre_tokenizer"]["split"] = false;
  const apps::BpeTokenizer whole(write_tokenizer(j, "whole.json"));
  const std::vector<int32_t> a = split.encode("to world"), b = whole.encode("to world");
  INFO("split " << show(a) << "\nwhole " << show(b));
  CHECK(std::count(a.begin(), a.end(), id) == 0);
  CHECK(std::count(b.begin(), b.end(), id) == 1);
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
  expect_error([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer: normalizer \"Lowercase\" is not supported");
  expect_error([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}}; },
               "normalizer.normalizers[1]: normalizer \"Strip\"");
  expect_error([](json& j) { j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "x"}}; },
               "a String pattern here, not a Regex");
  expect_error([](json& j) { j["normalizer"] = 5; }, "normalizer: \"type\" is missing");
  expect_error([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, "post-processor \"BertProcessing\"");
  expect_error([](json& j) { j["post_processor"]["processors"][1]["single"][0]["SpecialToken"]["id"] = "<none>"; },
               "special_tokens: \"<none>\" is missing");
  expect_error([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "twice"}}; },
               "\"prepend_scheme\" \"twice\"");
  expect_error([](json& j) { j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}; },
               "\"start\" must be a non-negative integer");
  expect_error([](json& j) { j["decoder"] = json::array({1}); }, "decoder: \"type\" is missing");
  expect_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder \"WordPiece\"");
  expect_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  expect_error([](json& j) { j["model"]["merges"][3] = json::array({"zz-not", "a-token"}); },
               "merge 3 (\"zz-not\" + \"a-token\") names a token the vocabulary lacks");
  expect_error([](json& j) { j["model"]["merges"][0] = 7; }, "merge 0 is 7");
  expect_error([](json& j) { j["model"]["vocab"].erase("A"), j["model"]["merges"] = json::array(); }, "lacks byte 0x41");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
               "behavior \"Removed\"");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}}; },
               "does not compile");
  expect_error([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre-tokenizer \"Whitespace\"");
  expect_error([](json& j) { j["added_tokens"][0]["single_word"] = true; }, "added_tokens[0]: \"single_word\" is true");
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
  // " zqxj zqxj" with ignore_merges, and the words' bytes (222, 91, 82, 89, 75 each) without. (The word takes the id
  // of the BOS token, left out with its template.)
  json j = read_json(kData + "/llama3/tokenizer.json");
  j["added_tokens"].erase(2);
  j["post_processor"] = nullptr;
  j["model"]["vocab"]["\xc4\xa0zqxj"] = 2000;  // "Ġzqxj"
  const apps::BpeTokenizer with(write_tokenizer(j, "ignore_merges.json"));
  CHECK(with.encode(" zqxj zqxj") == std::vector<int32_t>{2000, 2000});
  CHECK(with.decode({2000}) == " zqxj");
  j["model"]["ignore_merges"] = false;
  const apps::BpeTokenizer without(write_tokenizer(j, "merges.json"));
  CHECK(without.encode(" zqxj zqxj") == std::vector<int32_t>{222, 91, 82, 89, 75, 222, 91, 82, 89, 75});
}

// An added token is matched in the text, never a symbol of a word the model builds: `tokenizers` gives these ids for
// Mistral's tokenizer with "鿃" added (normalized, so "▁鿃" after Prepend: only after a space or at the start), the
// character's bytes through byte fallback elsewhere.
TEST_CASE("tokenizer: an added token is not one of the model's symbols inside a word") {
  json j = read_json(kData + "/mistral/tokenizer.json");
  add_token(j, 32000, "\xe9\xbf\x83", false, false, true, false);
  const apps::BpeTokenizer tok(write_tokenizer(j, "added_char.json"));
  check_ids(tok, {{"x\xe9\xbf\x83y", "1,1318,236,194,134,28724"}, {"\xe9\xbf\x83\xe9\xbf\x83", "1,32000,236,194,134"},
                 {"(\xe9\xbf\x83)", "1,325,236,194,134,28731"}, {" \xe9\xbf\x83 a", "1,28705,32000,264"}});
  CHECK(tok.id_of("\xe9\xbf\x83") == 32000);
}

// Added tokens are found before their lstrip/rstrip take whitespace: one inside the whitespace another took is still
// a token (`tokenizers`' ids for GPT-2's fixture with "<tool>" (special, lstrip, rstrip) and "\n\n" (rstrip) added).
TEST_CASE("tokenizer: an added token inside the whitespace another one strips is kept") {
  json j = read_json(kData + "/gpt2/tokenizer.json");
  add_token(j, 2000, "<tool>", true, true, false, true);
  add_token(j, 2001, "\n\n", false, true, false, false);
  const apps::BpeTokenizer tok(write_tokenizer(j, "stripped.json"));
  check_ids(tok, {{"x  <tool>\n\ny", "89,2000,2001,90"}, {"para\n\n\n\nnext", "81,285,66,2001,2001,563,1040"},
                 {"a <tool> <tool>  b", "66,2000,2000,67"}, {"a\n\n <tool>c", "66,2001,2000,68"}, {"q\n\n\n", "82,2001"}});
}

// After a token with rstrip, an added token inside the whitespace it took ends the match there: the text after that
// token is encoded from its end, the whitespace past it again (`tokenizers`' ids for the qwen2 fixture with "<a>"
// (special, rstrip) and "\n\n" added: "<a>\n\n world" is <a>, "\n\n", " world").
TEST_CASE("tokenizer: the text after an added token inside another's rstrip starts at its end") {
  json j = read_json(kData + "/qwen2/tokenizer.json");
  add_token(j, 2002, "<a>", false, true, false, true);
  add_token(j, 2003, "\n\n", false, false, false, false);
  const apps::BpeTokenizer tok(write_tokenizer(j, "rstrip_inner.json"));
  check_ids(tok, {{"<a>\n\n world", "2002,2003,702"}, {"<a>  \n\n  x", "2002,2003,223,223,90"},
                 {"<a> \n\n \n\n y", "2002,2003,223,2003,300"}, {"q<a>\n\n<a> z\n\n", "83,2002,2003,2002,92,2003"}});
}

// A merge listed twice has its later rank, as in `tokenizers` (whose map of merges keeps the last one written): with
// merges [a b], [b c], [a b] it gives "abc" [a, bc], where the first rank would give [ab, c].
TEST_CASE("tokenizer: a merge listed twice takes its last rank") {
  const json j = {{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", nullptr},
                  {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
                  {"model", {{"type", "BPE"}, {"unk_token", nullptr},
                             {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}}},
                             {"merges", json::array({json::array({"a", "b"}), json::array({"b", "c"}),
                                                     json::array({"a", "b"})})}}}};
  const apps::BpeTokenizer tok(write_tokenizer(j, "repeated_merge.json"));
  CHECK(tok.encode("abc") == std::vector<int32_t>{0, 4});
  CHECK(tok.encode("abcab") == std::vector<int32_t>{0, 4, 3});
}

TEST_CASE("tokenizer: GPT-2's tokenizer.json encodes and decodes as the tokenizers library does, id for id") {
  const apps::BpeTokenizer tok(WEFT_TEST_DATA "/gpt2/tokenizer.json");
  const json want = read_json(WEFT_TEST_DATA "/gpt2/expected.json");
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.id_of("<|endoftext|>") == 50256);
  size_t n = 0;
  for (const json& c : want["cases"]) {  // Unicode, whitespace runs, digits, <|endoftext|>, a random mix
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    INFO(c["name"].get<std::string>() << ": " << json(text).dump().substr(0, 200));
    const std::vector<int32_t> got = tok.encode(text);
    INFO("got  " << show(got).substr(0, 400) << "\nwant " << show(ids).substr(0, 400));
    CHECK(got == ids);
    CHECK(tok.decode(ids) == c["decoded"].get<std::string>());
    CHECK(tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>());
    CHECK(tok.decode(got) == text);
    n += ids.size();
  }
  CHECK(n > 8000);
  // Bytes that are not UTF-8: encode names the first bad byte where Python's UTF-8 decoder stops;
  // the text Python reads with errors="replace" encodes as the library's; the raw bytes' byte
  // tokens decode to that text (U+FFFD per bad part) and give back the bytes themselves.
  for (const json& c : want["invalid_utf8"]) {
    INFO(c["name"].get<std::string>());
    const std::string hex = c["bytes_hex"].get<std::string>();
    std::string raw;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) raw += char(std::stoi(hex.substr(i, 2), nullptr, 16));
    const std::string replaced = c["replaced"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>(), byte_ids = c["byte_ids"].get<std::vector<int32_t>>();
    CHECK_THROWS_WITH(tok.encode(raw), Contains("not valid UTF-8 at byte " + std::to_string(c["first_bad_byte"].get<int>())));
    CHECK(tok.encode(replaced) == ids);
    CHECK(tok.decode(tok.encode(replaced)) == replaced);
    CHECK(tok.decode(byte_ids) == c["byte_ids_decoded"].get<std::string>());
    CHECK(tok.bytes_of(byte_ids) == raw);
  }
}

namespace {

// A small byte-level BPE tokenizer.json as `tokenizers` 0.23 writes GPT-2's: byte b is id b,
// ten merges (ids 256-265), <|endoftext|> 266. ordered_json keeps the keys in the order given.
nlohmann::ordered_json small_tokenizer() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object(), merges = nlohmann::ordered_json::array();
  for (uint32_t b = 0, next = 256; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    const uint32_t cp = printable ? b : next++;  // GPT-2's bytes_to_unicode
    vocab[cp < 0x80 ? std::string(1, char(cp)) : std::string{char(0xc0 | cp >> 6), char(0x80 | (cp & 0x3f))}] = b;
  }
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"Ġ", "w"},
         {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"1", "2"}, {"'", "s"}}) {
    merges.push_back({a, b});
    const size_t id = vocab.size();
    vocab[a + b] = id;
  }
  using oj = nlohmann::ordered_json;
  const oj byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return oj{{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
            {"added_tokens", oj::array({{{"id", 266}, {"content", "<|endoftext|>"}, {"single_word", false},
                                         {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}}})},
            {"normalizer", nullptr}, {"pre_tokenizer", byte_level}, {"post_processor", byte_level}, {"decoder", byte_level},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                       {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                       {"vocab", vocab}, {"merges", merges}}}};
}

std::string write_ordered(const nlohmann::ordered_json& j, const std::string& name) {
  const std::string path = write_tokenizer(json::object(), name);
  std::ofstream(path) << j.dump();
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("tokenizer: every form the tokenizers library writes for what weft supports is read alike") {
  using oj = nlohmann::ordered_json;
  const std::string text = "the world's 123 <|endoftext|> th\xc3\xa9world";
  // What `tokenizers` 0.23.3 gives for the small tokenizer (each form below, too).
  const std::vector<int32_t> want{116, 257, 263, 265, 32, 264, 51, 32, 266, 256, 104, 195, 169, 119, 260, 262};
  auto model_edit = [](const std::function<void(oj&)>& f) { return [f](oj& j) { f(j["model"]); }; };
  const std::vector<std::pair<std::string, std::function<void(oj&)>>> forms{
      {"as written for GPT-2 (\"\" prefix and suffix)", [](oj&) {}},
      {"null prefix and suffix", model_edit([](oj& m) { m["continuing_subword_prefix"] = m["end_of_word_suffix"] = nullptr; })},
      {"no prefix or suffix", model_edit([](oj& m) { m.erase("continuing_subword_prefix"), m.erase("end_of_word_suffix"); })},
      {"dropout 0", model_edit([](oj& m) { m["dropout"] = 0; })},
      {"dropout 0.0", model_edit([](oj& m) { m["dropout"] = 0.0; })},
      {"no dropout", model_edit([](oj& m) { m.erase("dropout"); })},
      {"no ignore_merges", model_edit([](oj& m) { m.erase("ignore_merges"); })},
      {"byte_fallback true", model_edit([](oj& m) { m["byte_fallback"] = true; })},
      {"merges before vocab", model_edit([](oj& m) {
         const oj v = m["vocab"];
         m.erase("vocab"), m["vocab"] = v;
       })},
      {"merges as \"a b\"", model_edit([](oj& m) {
         for (oj& e : m["merges"]) e = e[0].get<std::string>() + " " + e[1].get<std::string>();
       })},
      {"before tokenizers 0.9 (no model type, no use_regex, normalized added tokens, \"a b\" merges)", [](oj& j) {
         j["model"].erase("type"), j["model"].erase("ignore_merges"), j["model"].erase("byte_fallback");
         for (oj& e : j["model"]["merges"]) e = e[0].get<std::string>() + " " + e[1].get<std::string>();
         j["pre_tokenizer"].erase("use_regex"), j["decoder"].erase("use_regex");
         j["added_tokens"][0]["normalized"] = true;
       }}};
  int k = 0;
  for (const auto& [name, edit] : forms) {
    INFO(name);
    oj j = small_tokenizer();
    edit(j);
    const std::string path = write_ordered(j, "form" + std::to_string(k++) + ".json"), file = read_text(path);
    if (name == "merges before vocab") CHECK(file.find("\"merges\"") < file.find("\"vocab\""));
    else CHECK(file.find("\"vocab\"") < file.find("\"merges\""));
    const apps::BpeTokenizer tok(path);
    CHECK(tok.encode(text) == want);
    CHECK(tok.decode(want) == text);
  }
}

TEST_CASE("tokenizer: a BPE setting that changes the encoding is refused, naming the file and the field") {
  using oj = nlohmann::ordered_json;
  auto refused = [](const std::function<void(oj&)>& edit, const std::string& text) {
    oj j = small_tokenizer();
    edit(j["model"]);
    const std::string path = write_ordered(j, "refused.json");
    INFO("expecting an error containing: " << text);
    CHECK_THROWS_WITH(apps::BpeTokenizer(path), StartsWith("tokenizer " + path + ": model: ") && Contains(text));
  };
  refused([](oj& m) { m["continuing_subword_prefix"] = "##"; }, "\"continuing_subword_prefix\" is \"##\": weft supports none (null or \"\")");
  refused([](oj& m) { m["end_of_word_suffix"] = "</w>"; }, "\"end_of_word_suffix\" is \"</w>\"");
  refused([](oj& m) { m["continuing_subword_prefix"] = 5; }, "\"continuing_subword_prefix\" is 5");
  refused([](oj& m) { m["dropout"] = 0.1; }, "\"dropout\" is 0.1: dropout skips merges at random; weft supports null or 0");
  refused([](oj& m) { m["dropout"] = 1; }, "\"dropout\" is 1");
  refused([](oj& m) { m["dropout"] = "0"; }, "\"dropout\" is \"0\"");
  refused([](oj& m) { m["ignore_merges"] = "no"; }, "\"ignore_merges\" must be true or false");
  refused([](oj& m) { m.erase("type"), m.erase("merges"); }, "\"type\" is missing");
  refused([](oj& m) { m["type"] = "WordPiece"; }, "model type \"WordPiece\" is not supported");
}

TEST_CASE("tokenizer: a text cut at split_point encodes as the whole (prepare reads long lines in blocks)") {
  // The fixture texts, natural text, and long unbroken runs of letters, digits and signs.
  std::string base64, words;
  uint64_t state = 1;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 4000; ++i) base64 += alphabet[next() % alphabet.size()];
  // qwen2's rstrip and lstrip tokens (and llama2's), a decomposed é, a line of spaces, an unknown character, and
  // Unicode whitespace (an rstrip token takes "\u3000 " after it: no cut at that space).
  const char* vocabulary[] = {"the", " ", "  ", "don't", "x2", "42", "\n", "\n\n", "\n  ", "Über", "日本", ".", "a\tb",
                              "'s", "<|user|>", "[END]", "<mask>", "e\xcc\x81", "qzx", "<s>", "\xf0\x9f\x98\x80",
                              "[END]\xe3\x80\x80", "\xc2\x85", "[END]\xc2\xa0"};
  for (int i = 0; i < 3000; ++i) words += std::string(vocabulary[next() % std::size(vocabulary)]) + (next() % 3 ? " " : "");
  // Byte-level ones cut before words and digits; SentencePiece-style ones after a "\n" (llama2's lstrip and rstrip
  // tokens only where no whitespace follows it).
  for (const char* family : kStyles) {
    INFO(family);
    const apps::BpeTokenizer tok(kData + "/" + family + "/tokenizer.json");
    std::vector<std::string> texts = {base64, words};
    const json expected = read_json(kData + "/" + family + "/expected.json");
    for (const json& c : expected["cases"]) texts.push_back(c["text"]);
    size_t cuts = 0;
    for (const std::string& text : texts) {
      INFO("text " << json(text.substr(0, 80)).dump(-1, ' ', false, json::error_handler_t::replace));
      const std::vector<int32_t> got = encode_in_cut_parts(tok, text, [] { return size_t(16); }, cuts);
      const std::vector<int32_t> want = tok.encode(text);
      INFO("got  " << show(got) << "\nwant " << show(want));
      CHECK(got == want);
    }
    const bool byte_level = std::string_view(family) == "gpt2" || std::string_view(family).starts_with("llama3") ||
                            std::string_view(family) == "qwen2";
    CHECK(cuts > (byte_level ? 500u : 40u));
  }
  // Where merges may join "\n" to its neighbours (a token holds it with more), or one fused unknown token spans it,
  // there is no cut after a line's end: words of SentencePiece-style ones merge across spaces (the lines hold no added
  // token, before which it would cut).
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += "the cat x2\n\xc3\x9c" "ber 42 \n";
  for (const auto& [edit, what] : std::vector<std::pair<std::function<void(json&)>, const char*>>{
           {[](json& j) { j["model"]["vocab"]["\n\n"] = j["model"]["vocab"].size(); }, "a token \"\\n\\n\""},
           {[](json& j) { j["model"]["byte_fallback"] = false; }, "unknown tokens fused"},
           {[](json& j) {
              j["added_tokens"].push_back({{"id", j["model"]["vocab"].size()}, {"content", "\n\n"}, {"single_word", false},
                                           {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
            }, "an added token \"\\n\\n\""},
           {[](json& j) { j["model"]["ignore_merges"] = true; }, "ignore_merges"}}) {
    INFO(what);
    json j = read_json(kData + "/mistral/tokenizer.json");
    edit(j);
    CHECK(apps::BpeTokenizer(write_tokenizer(j, "no_newline_cut.json")).split_point(lines, lines.size()) == 0);
  }
}

// Text with no other place to cut (no "\n", no space before an ASCII letter: CJK, chat formats without new lines) is cut
// before each added token matched in the raw text, with the whitespace an lstrip token takes: cut after it instead,
// the part after would lose the Prepend normalizer's "▁" (llama2, mistral); cut before the whitespace, that whitespace
// would be encoded alone.
TEST_CASE("tokenizer: a text with no other place to cut is cut before its added tokens") {
  const char* chunks[] = {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x8c", " \xe6\xbc\xa2",
                          "\xe3\x80\x80", "\xf0\x9f\x98\x80", "\xc3\xa9t\xc3\xa9", "]", "  ", "<|endoftext|>", "<|user|>", "<s>",
                          "</s>", "<mask>", "[END]", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"};
  uint64_t state = 7;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  std::string text;
  for (int i = 0; i < 2000; ++i) text += std::string(next() % 4 ? "" : " ") + chunks[next() % std::size(chunks)];
  for (const char* family : kStyles) {
    INFO(family);
    const apps::BpeTokenizer tok(kData + "/" + family + "/tokenizer.json");
    size_t cuts = 0;
    const std::vector<int32_t> got = encode_in_cut_parts(tok, text, [&] { return size_t(16 + next() % 64); }, cuts);
    const std::vector<int32_t> want = tok.encode(text);
    INFO("got  " << show(got) << "\nwant " << show(want));
    CHECK(got == want);
    CHECK(cuts > 100);
  }
}

// `tokenizers` gives an added token the vocabulary's id for its content, else the next id past the vocabulary and the
// added tokens before it, whatever the file says: a file that says otherwise is refused, naming both ids (weft had
// kept the file's: other ids than `tokenizers`', and a gap that decoded to nothing). An id past the last is an error.
TEST_CASE("tokenizer: an added token's id is the one tokenizers gives it") {
  json j = read_json(kData + "/mistral/tokenizer.json");
  json gap = j, swapped = j;
  add_token(gap, 32003, "<extra>", false, false, false, true);
  CHECK_THROWS_WITH(apps::BpeTokenizer(write_tokenizer(gap, "gap.json")),
                    Contains("\"id\" is 32003, but tokenizers gives \"<extra>\" the id 32000 (added tokens follow"));
  add_token(swapped, 32001, "<b>", false, false, false, true);
  add_token(swapped, 32000, "<a>", false, false, false, true);
  CHECK_THROWS_WITH(apps::BpeTokenizer(write_tokenizer(swapped, "swapped.json")), Contains("\"id\" is 32001"));
  j["added_tokens"][0]["id"] = 5;  // "<unk>", the vocabulary's 0
  CHECK_THROWS_WITH(apps::BpeTokenizer(write_tokenizer(j, "moved.json")), Contains("its id in the vocabulary"));
  add_token(j = read_json(kData + "/mistral/tokenizer.json"), 32000, "<extra>", false, false, false, true);
  const apps::BpeTokenizer tok(write_tokenizer(j, "next.json"));
  CHECK(tok.id_of("<extra>") == 32000);
  CHECK_THROWS_WITH(tok.decode({32001}), Contains("is not in the vocabulary"));
}

// The one known difference from `tokenizers` (TRANSFORMER.md): the pre-tokenizer's regex runs in Debian 12's PCRE2,
// whose Unicode tables are 14's. U+31350 (CJK Extension H, Unicode 15) is unassigned there, so GPT-2's regex takes it
// with the "'" after it (tokenizers: alone, then "'ll"); U+180E is whitespace there (tokenizers: a format character),
// so " \u180e's" is " \u180e", "'s" (tokenizers: " \u180e'", "s"). A PCRE2 with newer tables fails this: then the
// difference is gone and the note with it.
TEST_CASE("tokenizer: the Unicode 14 regex tables' pieces, as TRANSFORMER.md says") {
  const apps::BpeTokenizer tok(WEFT_TEST_DATA "/gpt2/tokenizer.json");
  auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    for (int32_t id : tok.encode(text)) out.push_back(tok.decode({id}));
    return out;
  };
  const std::vector<std::string> ext_h = pieces("\U00031350'll"), mvs = pieces(" \u180e's");
  INFO(json(ext_h).dump() << " " << json(mvs).dump());
  REQUIRE(ext_h.size() == 6);  // the character's 4 byte tokens (each alone not UTF-8), then "'" and "ll"
  CHECK(tok.decode(tok.encode("\U00031350")) == "\U00031350");
  CHECK((ext_h[4] == "'" && ext_h[5] == "ll"));
  CHECK(mvs.back() == "'s");
  CHECK(tok.decode(tok.encode(" \u180e's")) == " \u180e's");
}
