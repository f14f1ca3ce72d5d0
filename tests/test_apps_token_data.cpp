// Token datasets (apps/transformer/token_data.h): `prepare` writes what the tokenizer encodes,
// file by file with the end-of-text token between, split into train and val; token files read
// back memory-mapped at either width; bad files are named.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include <functional>
#include <iterator>

#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/file_contents.h"
#include "apps/transformer/token_data.h"
#include "core/sanitizers.h"
#include "core/sha256.h"
#include "scratch_dir.h"

using namespace weft;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kTokenizer = WEFT_TEST_DATA "/tokenizers/gpt2/tokenizer.json";

const test::ScratchDir kScratch("weft_token_data");

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::vector<uint32_t> all_tokens(const apps::TokenFile& f) {
  std::vector<uint32_t> v;
  for (int64_t i = 0; i < f.size(); ++i) v.push_back(f[i]);
  return v;
}

}  // namespace

TEST_CASE("token data: prepare writes each file's encoding, the end-of-text token after each, split train/val") {
  const fs::path texts = kScratch.fresh("texts"), out = kScratch.fresh("out") / "ds";
  const std::string a = "The quick brown fox jumps over the lazy dog.\n", b = "caf\xc3\xa9 \xe4\xb8\xad 1234\n\n",
                    c = "don't stop <|user|> now\n";
  write(texts / "a.txt", a), write(texts / "b.txt", b), write(texts / "c.txt", c);
  write(texts / "a.dat", "binary index, skipped");
  const apps::PreparedData d = apps::prepare_tokens(kTokenizer, texts.string(), out.string(), "<|endoftext|>", 0.25);
  const apps::BpeTokenizer tok(kTokenizer);
  std::vector<uint32_t> want;
  for (const std::string& t : {a, b, c}) {
    for (int32_t id : tok.encode(t)) want.push_back(uint32_t(id));
    want.push_back(uint32_t(tok.id_of("<|endoftext|>")));
  }
  const apps::TokenFile train((out / "train.tokens").string()), val((out / "val.tokens").string());
  std::vector<uint32_t> got = all_tokens(train);
  const std::vector<uint32_t> got_val = all_tokens(val);
  CHECK(got_val.size() == want.size() / 4);
  got.insert(got.end(), got_val.begin(), got_val.end());
  CHECK(got == want);
  CHECK(d.files == 3);
  CHECK(d.bytes == int64_t(a.size() + b.size() + c.size()));
  CHECK(d.train_tokens == train.size());
  CHECK(d.val_tokens == val.size());
  for (const apps::TokenFile* f : {&train, &val}) {
    CHECK(f->header().bytes_per_token == 2);
    CHECK(f->header().vocab_size == tok.vocab_size());
    CHECK(f->header().tokenizer_sha256 == sha256_file(kTokenizer));
  }
  CHECK(sha256_file((out / "tokenizer.json").string()) == sha256_file(kTokenizer));
  // No end-of-text token when --eos is empty; a token the tokenizer lacks is named.
  apps::prepare_tokens(kTokenizer, (texts / "a.txt").string(), out.string(), "", 0.0);
  std::vector<uint32_t> just_a;
  for (int32_t id : tok.encode(a)) just_a.push_back(uint32_t(id));
  CHECK(all_tokens(apps::TokenFile((out / "train.tokens").string())) == just_a);
  CHECK_THROWS_WITH(apps::prepare_tokens(kTokenizer, texts.string(), out.string(), "<|eot|>"),
                    Contains("--eos \"<|eot|>\" is not a token of"));
  write(texts / "d.txt", "bad \xff byte");
  CHECK_THROWS_WITH(apps::prepare_tokens(kTokenizer, texts.string(), out.string(), ""),
                    Contains("d.txt") && Contains("not valid UTF-8 at byte 4"));
}

TEST_CASE("token data: prepare puts the tokenizer's template tokens (Llama's BOS) around each file unless told not to") {
  const std::string sp = WEFT_TEST_DATA "/tokenizers/llama2/tokenizer.json";
  const fs::path texts = kScratch.fresh("sp_texts"), out = kScratch.fresh("sp_out") / "ds";
  const std::string a = "The quick brown fox.\n", b = "  two  spaces \xe4\xb8\xad\n";
  write(texts / "a.txt", a), write(texts / "b.txt", b);
  const apps::BpeTokenizer tok(sp);
  REQUIRE(tok.special_prefix() == std::vector<int32_t>{1});
  for (bool special : {true, false}) {
    INFO("special " << special);
    apps::prepare_tokens(sp, texts.string(), out.string(), "</s>", 0.0, special);
    std::vector<uint32_t> want;
    for (const std::string& t : {a, b}) {
      for (int32_t id : tok.encode(t, special)) want.push_back(uint32_t(id));
      want.push_back(2);
    }
    const std::vector<uint32_t> got = all_tokens(apps::TokenFile((out / "train.tokens").string()));
    CHECK(got == want);
    CHECK((got.front() == 1) == special);
  }
}

// A stretch with no place to cut is encoded at once, ~40 bytes of BPE state a byte: one the
// memory cannot hold is refused naming the file, before it is read whole (here: a 3 MiB "word"
// against 16 MiB, read in 16 MiB blocks; the same text with spaces, cut as it goes, fits).
TEST_CASE("token data: prepare refuses a stretch without a place to cut that the memory cannot hold") {
  const fs::path texts = kScratch.fresh("unbroken"), out = kScratch.fresh("unbroken_out") / "ds";
  write(texts / "a.txt", std::string(3 << 20, 'a'));
  CHECK_THROWS_WITH(apps::prepare_tokens(kTokenizer, texts.string(), out.string(), "", 0.1, true, 16 << 20),
                    Contains("a.txt: the 3.0 MiB from byte 0 have no place where the tokenizer may cut them") &&
                        Contains("needs about 0.1 GiB, more than the 0.0 GiB available"));
  std::string words;
  while (words.size() < (3u << 20)) words += "abc ";
  write(texts / "a.txt", words);
  CHECK(apps::prepare_tokens(kTokenizer, texts.string(), out.string(), "", 0.1, true, 16 << 20).bytes == int64_t(words.size()));
}

// A SentencePiece-style tokenizer (Mistral's: "\n" is its byte token) encodes a file in blocks cut after a line's
// end: a 17 MiB file of lines (two 16 MiB blocks) within 16 MiB, id for id as the whole text; one line of 3 MiB is refused.
TEST_CASE("token data: prepare with a SentencePiece-style tokenizer reads a long file line by line") {
#if defined(WEFT_ASAN) || defined(WEFT_TSAN)
  WARN("not run under a sanitizer: 17 MiB encoded twice takes minutes there (the plain build runs it)");
  return;
#endif
  const std::string sp = WEFT_TEST_DATA "/tokenizers/mistral/tokenizer.json";
  const fs::path texts = kScratch.fresh("sp_lines"), out = kScratch.fresh("sp_lines_out") / "ds";
  const char* words[] = {"the ", "cat", "  ", "Über ", "日本", "42", "\n", "\n", " \n  "};
  std::string text;
  uint64_t state = 7;
  while (text.size() < (17u << 20)) text += words[((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 9];
  write(texts / "a.txt", text);
  apps::prepare_tokens(sp, texts.string(), out.string(), "", 0.0, false, 16 << 20);
  std::vector<uint32_t> want;
  for (int32_t id : apps::BpeTokenizer(sp).encode(text)) want.push_back(uint32_t(id));
  const std::vector<uint32_t> got = all_tokens(apps::TokenFile((out / "train.tokens").string()));
  const auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
  INFO("ids " << got.size() << " and " << want.size() << ", first difference at " << (g - got.begin()));
  CHECK((g == got.end() && w == want.end()));
  std::replace(text.begin(), text.end(), '\n', ' ');
  write(texts / "a.txt", text.substr(0, 3u << 20));
  CHECK_THROWS_WITH(apps::prepare_tokens(sp, texts.string(), out.string(), "", 0.0, false, 16 << 20),
                    Contains("a.txt: the 3.0 MiB from byte 0 have no place where the tokenizer may cut them"));
}

// An --out that holds a tokenizer.json and no token files is a model's directory: its tokenizer is not replaced.
TEST_CASE("token data: prepare refuses a directory with a tokenizer.json of its own") {
  const fs::path texts = kScratch.fresh("model_out_texts"), model = kScratch.fresh("model_out");
  write(texts / "a.txt", "some text to encode\n");
  write(model / "tokenizer.json", "{\"a model's\": 1}"), write(model / "config.json", "{}");
  CHECK_THROWS_WITH(apps::prepare_tokens(kTokenizer, texts.string(), model.string(), ""),
                    Contains("exists and is not a dataset directory: it holds a tokenizer.json (a model's?) and no "
                             "train.tokens or val.tokens"));
  write(texts / "b.jsonl", "{\"text\": \"hello\"}\n");
  CHECK_THROWS_WITH(apps::prepare_examples(kTokenizer, (texts / "b.jsonl").string(), model.string(), "", 0.1, true, ""),
                    Contains("is not a dataset directory"));
  CHECK(apps::read_file((model / "tokenizer.json").string()) == "{\"a model's\": 1}");
  CHECK(!fs::exists(model / "train.tokens"));
  // A dataset's directory is prepared again.
  fs::remove(texts / "b.jsonl");
  apps::prepare_tokens(kTokenizer, texts.string(), (model / "ds").string(), "");
  CHECK(apps::prepare_tokens(kTokenizer, texts.string(), (model / "ds").string(), "").files == 1);
}

// prepare replaces train.tokens, then val.tokens, each by rename: stopped between the two, a
// directory holds one split of the new text and one of the old, under the same tokenizer.
TEST_CASE("token data: the files of one dataset carry its id; splits of two prepares are refused together") {
  const fs::path texts = kScratch.fresh("ids_texts"), one = kScratch.fresh("ids") / "one", two = kScratch.fresh("ids2") / "two";
  write(texts / "a.txt", "The quick brown fox jumps over the lazy dog, again and again and again.\n");
  apps::prepare_tokens(kTokenizer, texts.string(), one.string(), "<|endoftext|>", 0.25);
  apps::prepare_tokens(kTokenizer, texts.string(), two.string(), "<|endoftext|>", 0.25);
  const apps::TokenFile a((one / "train.tokens").string()), b((two / "train.tokens").string());
  CHECK(a.header().dataset_id.size() == 32);
  CHECK(a.header().dataset_id == b.header().dataset_id);  // the same text, the same bytes
  write(texts / "a.txt", "Another text entirely: its tokens are not the first one's.\n");
  apps::prepare_tokens(kTokenizer, texts.string(), two.string(), "<|endoftext|>", 0.25);
  fs::copy_file(two / "val.tokens", one / "val.tokens", fs::copy_options::overwrite_existing);
  apps::TrainingData d;
  CHECK_THROWS_WITH(apps::load_training_data(one.string(), d),
                    Contains("belong to different datasets") && Contains("prepare the dataset again"));
}

TEST_CASE("token data: token files hold 16-bit ids up to 65,536 tokens and 32-bit ones past it") {
  const fs::path dir = kScratch.fresh("widths");
  const std::string digest(64, 'a');
  const std::vector<uint32_t> small = {0, 1, 65535, 7}, large = {0, 65536, 69999, 123456 % 70000};
  const std::string id = apps::dataset_id({small, large});
  apps::write_token_file((dir / "s").string(), small, 65536, digest, id);
  apps::write_token_file((dir / "l").string(), large, 70000, digest, id);
  const apps::TokenFile s((dir / "s").string()), l((dir / "l").string());
  CHECK(s.header().bytes_per_token == 2);
  CHECK(l.header().bytes_per_token == 4);
  CHECK(all_tokens(s) == small);
  CHECK(all_tokens(l) == large);
  CHECK(fs::file_size(dir / "s") == 128 + 4 * 2);
  CHECK(fs::file_size(dir / "l") == 128 + 4 * 4);
  CHECK(s.header().dataset_id == id);
  CHECK_THROWS_WITH(apps::write_token_file((dir / "x").string(), std::vector<uint32_t>{3, 70000}, 70000, digest, id),
                    Contains("id 70000 at 1 is outside the vocabulary of 70000"));
  CHECK(!fs::exists(dir / "x"));  // nothing left behind
}

TEST_CASE("token data: bad token files are named") {
  const fs::path dir = kScratch.fresh("bad");
  apps::write_token_file((dir / "good").string(), std::vector<uint32_t>{1, 2, 3}, 100, std::string(64, 'f'),
                         std::string(32, 'c'));
  std::string bytes;
  {
    std::ifstream in(dir / "good", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto variant = [&](const std::string& name, const std::function<void(std::string&)>& edit) {
    std::string b = bytes;
    edit(b);
    write(dir / name, b);
    return (dir / name).string();
  };
  CHECK_THROWS_WITH(apps::TokenFile(variant("magic", [](std::string& b) { b[0] = 'X'; })), Contains("no WEFTTOK1 magic"));
  CHECK_THROWS_WITH(apps::TokenFile(variant("version", [](std::string& b) { b[8] = 9; })), Contains("format version 9"));
  CHECK_THROWS_WITH(apps::TokenFile(variant("width", [](std::string& b) { b[12] = 3; })), Contains("3 bytes per token"));
  CHECK_THROWS_WITH(apps::TokenFile(variant("short", [](std::string& b) { b.pop_back(); })),
                    Contains("counts 3 tokens of 2 bytes but the file holds 5 bytes"));
  CHECK_THROWS_WITH(apps::TokenFile(variant("count", [](std::string& b) { b[23] = char(0x80); })),
                    Contains("but the file holds 6 bytes"));
  CHECK_THROWS_WITH(apps::TokenFile(variant("tiny", [](std::string& b) { b.resize(50); })),
                    Contains("shorter than its 128-byte header"));
  CHECK_THROWS_WITH(apps::TokenFile((dir / "missing").string()), Contains("cannot open token file"));
  CHECK_THROWS_WITH(apps::TokenFile(dir.string()), Contains("is not a regular file"));
}

// Run by the next case in a process of its own: it maps a token file, truncates it in place and reads on.
const char* const kTruncatedChild = "token data: reading a token file truncated while mapped (a child process)";
TEST_CASE(kTruncatedChild, "[.]") {
  const char* path = std::getenv("WEFT_TEST_TOKEN_FILE");
  REQUIRE(path != nullptr);
  const apps::TokenFile f(path);
  REQUIRE(::truncate(path, 4096) == 0);
  uint64_t sum = 0;
  for (int64_t i = 0; i < f.size(); ++i) sum += f[i];  // faults at the first page past the new end
  FAIL("read all " << f.size() << " tokens of a truncated file (sum " << sum << ") without a fault");
}

TEST_CASE("token data: a token file truncated in place while it is mapped is an error naming it, not a signal") {
  const fs::path dir = kScratch.fresh("truncated"), file = dir / "train.tokens";
  apps::write_token_file(file.string(), std::vector<uint32_t>(100000, 7), 100, std::string(64, 'e'), std::string(32, 'd'));
  // exec: the status is the child's own, so that a death by SIGBUS shows as one (not as the shell's exit 135).
  const std::string cmd = fmt::format("WEFT_TEST_TOKEN_FILE='{}' exec '{}' '{}' 2>&1", file.string(),
                                      fs::read_symlink("/proc/self/exe").string(), kTruncatedChild);
  std::FILE* child = ::popen(cmd.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string out;
  for (char buf[4096]; size_t n = std::fread(buf, 1, sizeof buf, child);) out.append(buf, n);
  const int status = ::pclose(child);
  INFO(cmd << "\n" << out);
  REQUIRE(WIFEXITED(status));  // not ended by SIGBUS
  CHECK(WEXITSTATUS(status) == 1);
  CHECK_THAT(out, Contains("token file " + file.string() + " became shorter while it was read"));
  CHECK(fs::file_size(file) == 4096);
}
