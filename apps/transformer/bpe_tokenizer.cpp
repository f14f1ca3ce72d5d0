#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/file_contents.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "apps/transformer/tokenizer_decoder.h"
#include "apps/transformer/tokenizer_json.h"
#include "apps/transformer/tokenizer_normalizer.h"
#include "apps/transformer/utf8.h"
#include "core/error.h"

namespace weft::apps {

using json = nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's and Qwen2's (a Split before ByteLevel): they differ in how many digits go together.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;  // as matched: normalized when the token is
  int32_t id;
  bool special, lstrip, rstrip;
};

struct StringHash {  // lets the vocabulary be searched with a string_view
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

}  // namespace

struct BpeTokenizer::Impl {
  std::string path;
  std::vector<std::string> tokens;  // by id: the vocabulary form, or an added token's content
  std::vector<char> is_special;     // by id
  std::unordered_map<int32_t, std::string> decoded_as;  // a normalized added token's normalized form
  // The model's tokens (what BPE builds words from) and the added ones (matched in the text before it: never a
  // symbol inside a word, as `tokenizers` keeps them apart).
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab, added_vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged id)
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  std::string unk_token;                 // "" when none
  std::array<int32_t, 256> fallback_id{};  // "<0xAB>" tokens' ids (-1: none)
  // The pre-tokenizer: ByteLevel (regex or none), Metaspace, or none (the part is one word).
  enum class Pre { None, ByteLevel, Metaspace } pre = Pre::None;
  bool add_prefix_space = false;     // ByteLevel
  bool after_split = false;          // ByteLevel after a Split: its prefix space goes before each of the Split's pieces
  std::array<int32_t, 256> byte_id{};  // ByteLevel: each byte's one-character token
  std::string replacement;           // Metaspace
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;                 // Metaspace: each replacement starts a word
  pcre2_code* regex = nullptr;
  std::string pattern;  // regex's
  TokenizerNormalizer normalizer;
  std::optional<TokenizerDecoder> decoder;
  std::vector<AddedToken> raw_added, normalized_added;  // matched before and after normalizing; longest first
  std::vector<int32_t> prefix, suffix;  // the post-processor's tokens around a text
  bool newline_cuts = false;  // split_point may cut after any "\n" (SentencePiece-style tokenizers)
  bool raw_strips = false;  // a raw added token takes the whitespace beside it (lstrip or rstrip)

  ~Impl() { pcre2_code_free(regex); }
  [[noreturn]] void fail(const std::string& what) const { throw Error(fmt::format("tokenizer {}: {}", path, what)); }

  void read_model(const TokenizerField& m);
  void read_merges(const TokenizerField& m);
  void read_pre_tokenizer(const TokenizerField& p);
  void read_metaspace(const TokenizerField& p);
  void read_added_tokens(const TokenizerField& root);
  void read_post_processor(const TokenizerField& p);
  void compile(const std::string& pattern);
  void merge(std::vector<int32_t>& sym) const;
  void bpe(std::string_view word, bool bytes, std::vector<int32_t>& out) const;
  void byte_level(std::string_view part, std::vector<int32_t>& out) const;
  void encode_part(std::string_view part, bool first, bool continues, std::vector<int32_t>& out) const;
  bool cuts_after_newlines() const;
  bool newline_cut_at(std::string_view text, size_t cut) const;
  void split_added(std::string_view text, const std::vector<AddedToken>& list, std::vector<int32_t>& out,
                   const std::function<void(std::string_view, bool)>& part, std::vector<size_t>* cuts = nullptr) const;
  size_t added_cut(std::string_view text, size_t limit) const;
  std::string text_of(const std::vector<int32_t>& ids, bool skip_special, bool lossy, bool at_start) const;
};

void BpeTokenizer::Impl::read_model(const TokenizerField& m) {
  // `tokenizers` before 0.9 wrote no "type"; it reads a model with merges as BPE.
  const std::string type = m.is_null("type") && m.j.contains("merges") ? "BPE" : m.text("type");
  if (type != "BPE") m.fail(fmt::format("model type \"{}\" is not supported: weft reads BPE tokenizers only", type));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})  // "" is none, as null
    if (!m.is_null(key) && m.j[key] != "")
      m.fail(fmt::format("\"{}\" is {}: weft supports none (null or \"\")", key, m.j[key].dump()));
  if (!m.is_null("dropout") && m.j["dropout"] != 0)  // 0 merges as null does
    m.fail(fmt::format("\"dropout\" is {}: dropout skips merges at random; weft supports null or 0",
                       m.j["dropout"].dump()));
  ignore_merges = m.flag("ignore_merges", false);
  byte_fallback = m.flag("byte_fallback", false);
  fuse_unk = m.flag("fuse_unk", false);
  unk_token = m.is_null("unk_token") ? "" : m.text("unk_token");
  const json& v = m.at("vocab");
  if (!v.is_object()) m.fail("\"vocab\" must be an object of token: id");
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
      m.fail(fmt::format("vocab entry \"{}\" has id {}, not a non-negative 32-bit integer", token, id.dump()));
    const auto i = id.get<int32_t>();
    if (token.empty()) m.fail(fmt::format("vocab entry {} is the empty string", i));
    if (size_t(i) >= tokens.size()) tokens.resize(size_t(i) + 1), is_special.resize(size_t(i) + 1);
    if (!tokens[size_t(i)].empty()) m.fail(fmt::format("vocab ids repeat: {} is \"{}\" and \"{}\"", i, tokens[size_t(i)], token));
    tokens[size_t(i)] = token;
    vocab[token] = i;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(fmt::format("<0x{:02X}>", b));
    fallback_id[size_t(b)] = it == vocab.end() ? -1 : it->second;
  }
  read_merges(m);
}

void BpeTokenizer::Impl::read_merges(const TokenizerField& m) {
  const json& ms = m.at("merges");
  if (!ms.is_array()) m.fail("\"merges\" must be an array");
  int32_t rank = 0;
  for (const json& e : ms) {
    std::string a, b;
    if (e.is_string()) {  // the older "a b" form
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        m.fail(fmt::format("merge {} (\"{}\") is not two tokens separated by one space", rank, s));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      m.fail(fmt::format("merge {} is {}: neither \"a b\" nor [\"a\", \"b\"]", rank, e.dump()));
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
      m.fail(fmt::format("merge {} (\"{}\" + \"{}\") names a token the vocabulary lacks", rank, a, b));
    // A merge listed twice takes its later rank, as `tokenizers` does (its map of merges keeps the last one written).
    merges.insert_or_assign(pair_key(ia->second, ib->second), std::make_pair(rank, iab->second));
    ++rank;
  }
}

void BpeTokenizer::Impl::compile(const std::string& p) {
  pattern = p;
  int code = 0;
  PCRE2_SIZE offset = 0;
  regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &code,
                        &offset, nullptr);
  if (!regex) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(code, msg.data(), msg.size());
    fail(fmt::format("pre-tokenizer regex {} does not compile at offset {}: {}", json(pattern).dump(), offset,
                     reinterpret_cast<const char*>(msg.data())));
  }
  pcre2_jit_compile(regex, PCRE2_JIT_COMPLETE);  // where JIT is unavailable the interpreter runs
}

void BpeTokenizer::Impl::read_metaspace(const TokenizerField& p) {
  pre = Pre::Metaspace;
  replacement = p.text("replacement");
  if (replacement.empty() || utf8::length(replacement[0]) != replacement.size())
    p.fail("\"replacement\" must be one character");
  const std::string scheme = p.is_null("prepend_scheme") ? "always" : p.text("prepend_scheme");
  if (scheme != "always" && scheme != "first" && scheme != "never")
    p.fail(fmt::format("\"prepend_scheme\" \"{}\" is none of always, first, never", scheme));
  prepend = scheme == "first" ? Prepend::First : scheme == "never" ? Prepend::Never : Prepend::Always;
  if (!p.flag("add_prefix_space", true)) prepend = Prepend::Never;  // the older form of never
  split = p.flag("split", true);
}

void BpeTokenizer::Impl::read_pre_tokenizer(const TokenizerField& p) {
  auto byte_level = [&](const TokenizerField& f, bool regex_allowed) {
    pre = Pre::ByteLevel;
    add_prefix_space = f.flag("add_prefix_space", true);
    const bool use_regex = f.flag("use_regex", true);
    if (use_regex && !regex_allowed) f.fail("\"use_regex\" is true after a Split: weft supports one pattern");
    if (use_regex) compile(kGpt2Pattern);
  };
  if (p.j.is_null()) return;  // the part is one word
  const std::string type = p.text("type");
  if (type == "ByteLevel") return byte_level(p, true);
  if (type == "Metaspace") return read_metaspace(p);
  if (type != "Sequence")
    p.fail(fmt::format("pre-tokenizer \"{}\" is not supported: weft reads ByteLevel, Metaspace, or a Sequence of a "
                       "regex Split and ByteLevel",
                       type));
  if (p.items("pretokenizers") != 2)
    p.fail("\"pretokenizers\": weft supports a Sequence of exactly a regex Split and a ByteLevel");
  const TokenizerField split = p.item("pretokenizers", 0), level = p.item("pretokenizers", 1);
  if (split.text("type") != "Split" || level.text("type") != "ByteLevel")
    p.fail(fmt::format("a Sequence of \"{}\" and \"{}\": weft supports Split then ByteLevel", split.text("type"),
                       level.text("type")));
  if (split.text("behavior") != "Isolated")
    split.fail(fmt::format("behavior \"{}\" is not supported: weft supports Isolated", split.text("behavior")));
  if (split.flag("invert", false)) split.fail("\"invert\" is true: weft supports only false");
  const TokenizerField pattern = split.sub("pattern");
  if (pattern.is_null("Regex")) pattern.fail("weft supports a Regex pattern only (not a String)");
  compile(pattern.text("Regex"));
  byte_level(level, false);
  after_split = true;
}

void BpeTokenizer::Impl::read_added_tokens(const TokenizerField& root) {
  if (root.is_null("added_tokens")) return;
  int64_t last = -1;  // the largest added id so far
  for (size_t k = 0, n = root.items("added_tokens"); k < n; ++k) {
    const TokenizerField a = root.item("added_tokens", k);
    if (a.flag("single_word", false)) a.fail("\"single_word\" is true: weft supports only false");
    const json& id = a.at("id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
      a.fail(fmt::format("\"id\" is {}, not a non-negative 32-bit integer", id.dump()));
    AddedToken tok{a.text("content"), id.get<int32_t>(), a.flag("special", false), a.flag("lstrip", false),
                   a.flag("rstrip", false)};
    if (tok.content.empty()) a.fail("\"content\" is empty");
    if (!utf8::valid(tok.content)) a.fail("\"content\" is not valid UTF-8");
    // `tokenizers` gives it the vocabulary's id for its content, else the next one past the vocabulary and the added
    // tokens before it, whatever the file says: a file that says otherwise (edited by hand) is refused.
    const auto known = vocab.find(tok.content);
    const int64_t want = known != vocab.end() ? known->second : std::max<int64_t>(int64_t(vocab.size()), last + 1);
    if (tok.id != want)
      a.fail(fmt::format("\"id\" is {}, but tokenizers gives \"{}\" the id {} ({}): weft would encode it otherwise",
                         tok.id, tok.content, want, known != vocab.end() ? "its id in the vocabulary"
                                                                         : "added tokens follow the vocabulary in order"));
    last = std::max(last, want);
    const size_t i = size_t(tok.id);
    if (i >= tokens.size()) tokens.resize(i + 1), is_special.resize(i + 1);
    if (!tokens[i].empty() && tokens[i] != tok.content) a.fail(fmt::format("id {} is \"{}\" in the vocabulary", i, tokens[i]));
    tokens[i] = tok.content;
    is_special[i] = tok.special;
    added_vocab[tok.content] = tok.id;
    // `tokenizers` reads "normalized" as true for a token that is not special when it is absent.
    const bool normalized = a.flag("normalized", !tok.special);
    if (normalized) tok.content = normalizer(tok.content);  // matched and decoded in normalized form
    if (tok.content != tokens[i]) decoded_as[tok.id] = tok.content;
    if (!tok.content.empty()) (normalized ? normalized_added : raw_added).push_back(std::move(tok));
  }
  for (auto* list : {&raw_added, &normalized_added})
    std::stable_sort(list->begin(), list->end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
}

void BpeTokenizer::Impl::read_post_processor(const TokenizerField& p) {
  if (p.j.is_null()) return;
  const std::string type = p.text("type");
  if (type == "ByteLevel") return;  // it changes only offsets
  if (type == "Sequence") {
    for (size_t k = 0, n = p.items("processors"); k < n; ++k) read_post_processor(p.item("processors", k));
    return;
  }
  if (type != "TemplateProcessing")
    p.fail(fmt::format("post-processor \"{}\" is not supported: weft supports TemplateProcessing, ByteLevel and a "
                       "Sequence of these", type));
  if (!prefix.empty() || !suffix.empty()) p.fail("a second TemplateProcessing: weft supports one");
  const TokenizerField specials = p.sub("special_tokens");
  bool seen_a = false;
  for (size_t k = 0, n = p.items("single"); k < n; ++k) {
    const TokenizerField piece = p.item("single", k);
    if (!piece.is_null("Sequence")) {
      if (seen_a || piece.sub("Sequence").text("id") != "A")
        piece.fail("the single template must hold the sequence A once, and no other");
      seen_a = true;
      continue;
    }
    const TokenizerField special = specials.sub(piece.sub("SpecialToken").text("id"));
    const json& ids = special.at("ids");
    if (!ids.is_array()) special.fail("\"ids\" must be an array");
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(tokens.size()) ||
          tokens[size_t(id.get<int64_t>())].empty())
        special.fail(fmt::format("id {} is not a token of the vocabulary", id.dump()));
      (seen_a ? suffix : prefix).push_back(id.get<int32_t>());
    }
  }
  if (!seen_a) p.fail("the single template lacks the sequence A");
}

std::string tokenizer_json_path(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const std::string file = (std::filesystem::path(path) / "tokenizer.json").string();
  WEFT_CHECK(std::filesystem::exists(file, ec), "transformer: the tokenizer {} is a directory without a tokenizer.json "
             "(give the tokenizer.json file, or a model or dataset directory holding one)", path);
  return file;
}

BpeTokenizer::BpeTokenizer(const std::string& given) : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  const std::string path = t.path = tokenizer_json_path(given);
  std::error_code ec;  // a directory or FIFO would fail inside the parser with the stream's own words
  if (!std::filesystem::is_regular_file(path, ec))
    t.fail("cannot be opened (a tokenizer.json of the Hugging Face `tokenizers` format is expected)");
  json j;
  try {
    j = json::parse(read_file(path));
  } catch (const json::exception& e) {
    const bool sp = path.size() > 6 && path.compare(path.size() - 6, 6, ".model") == 0;
    t.fail(sp ? "is a SentencePiece model: weft reads tokenizer.json (the Hugging Face tokenizers format), which model "
                "directories on the Hub hold beside it"
              : fmt::format("is not valid JSON: {}", e.what()));
  }
  const TokenizerField root{j, path, ""};
  if (!j.is_object()) root.fail("is not a JSON object");
  static const json null_part = nullptr;
  auto part = [&](const char* key) { return root.is_null(key) ? TokenizerField{null_part, path, key} : root.sub(key); };
  t.normalizer = TokenizerNormalizer(part("normalizer"));
  t.read_model(root.sub("model"));
  t.read_pre_tokenizer(part("pre_tokenizer"));
  if (t.pre == Impl::Pre::ByteLevel) {  // every byte's character must be a token
    const std::array<uint32_t, 256> cps = byte_level_alphabet();
    for (size_t b = 0; b < 256; ++b) {
      std::string ch;
      utf8::append(ch, cps[b]);
      auto it = t.vocab.find(ch);
      if (it == t.vocab.end())
        root.fail(fmt::format("model: the vocabulary lacks byte 0x{:02x} (\"{}\"): not a byte-level BPE vocabulary", b, ch));
      t.byte_id[b] = it->second;
    }
  }
  t.decoder.emplace(part("decoder"));
  t.read_added_tokens(root);
  t.read_post_processor(part("post_processor"));
  t.newline_cuts = t.cuts_after_newlines();
  t.raw_strips =
      std::any_of(t.raw_added.begin(), t.raw_added.end(), [](const AddedToken& a) { return a.lstrip || a.rstrip; });
}

// Whether a text cut after a "\n" encodes part by part as it does whole, the second part continuing the first (no
// Prepend, no Metaspace prefix): a tokenizer that reads a part as one word (no pre-tokenizer) or splits words only at
// its replacement, whose normalizer keeps "\n" where it is, whose added tokens matched after the normalizer do not take
// whitespace beside them (newline_cut_at checks the others at each cut), where no token (added ones too) holds "\n"
// with more (so no merge or match joins it to anything), that does not take words whole (ignore_merges), and where
// "\n" ends an unknown token's run (fuse_unk would join runs across the cut).
bool BpeTokenizer::Impl::cuts_after_newlines() const {
  if (pre == Pre::ByteLevel || ignore_merges || !normalizer.keeps_newlines()) return false;
  if (replacement.find('\n') != std::string::npos) return false;
  for (const AddedToken& a : normalized_added)
    if (a.lstrip || a.rstrip) return false;
  for (const std::string& token : tokens)  // added tokens among them
    if (token.size() > 1 && token.find('\n') != std::string::npos) return false;
  const bool every_byte = std::all_of(fallback_id.begin(), fallback_id.end(), [](int32_t id) { return id >= 0; });
  return !fuse_unk || unk_token.empty() || vocab.count("\n") || (byte_fallback && every_byte);
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

int64_t BpeTokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

int32_t BpeTokenizer::id_of(std::string_view token) const {  // an added token first, as `tokenizers`' token_to_id
  if (auto it = impl_->added_vocab.find(token); it != impl_->added_vocab.end()) return it->second;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::vector<int32_t>& BpeTokenizer::special_prefix() const { return impl_->prefix; }
const std::vector<int32_t>& BpeTokenizer::special_suffix() const { return impl_->suffix; }

// Merges adjacent symbols pair by pair, the lowest rank first and the leftmost of equal ranks,
// until no adjacent pair has a merge: a short word by scanning its pairs for each merge, a long
// one through a heap of candidate pairs over a linked list (as `tokenizers` does: n log n).
void BpeTokenizer::Impl::merge(std::vector<int32_t>& sym) const {
  const int n = int(sym.size());
  if (n < 2) return;
  if (n <= 32) {
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = 0;
      size_t best = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merges.find(pair_key(sym[i], sym[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) best_rank = it->second.first, best_id = it->second.second, best = i;
      }
      if (best_rank == INT32_MAX) return;
      sym[best] = best_id;
      sym.erase(sym.begin() + std::ptrdiff_t(best) + 1);
    }
    return;
  }
  struct Candidate {
    int32_t rank, pos, id, left, right;  // merging (left, right) at pos into id
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<int> next, prev;  // reused: most words are a few bytes
  thread_local std::vector<Candidate> heap;
  next.resize(size_t(n)), prev.resize(size_t(n)), heap.clear();
  for (int i = 0; i < n; ++i) next[size_t(i)] = i + 1 < n ? i + 1 : -1, prev[size_t(i)] = i - 1;
  auto push = [&](int i) {
    if (i < 0 || next[size_t(i)] < 0) return;
    auto it = merges.find(pair_key(sym[size_t(i)], sym[size_t(next[size_t(i)])]));
    if (it == merges.end()) return;
    heap.push_back({it->second.first, i, it->second.second, sym[size_t(i)], sym[size_t(next[size_t(i)])]});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    const int j = next[size_t(c.pos)];
    if (j < 0 || sym[size_t(c.pos)] != c.left || sym[size_t(j)] != c.right) continue;  // the pair has changed
    sym[size_t(c.pos)] = c.id, sym[size_t(j)] = -1;
    next[size_t(c.pos)] = next[size_t(j)];
    if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = c.pos;
    push(prev[size_t(c.pos)]);
    push(c.pos);
  }
  sym.erase(std::remove(sym.begin(), sym.end(), -1), sym.end());
}

// The ids of one word: its symbols (bytes: each byte's byte-level token; else each character's
// token, or its "<0xAB>" byte tokens under byte_fallback, or the unknown token) merged; a word holding lines line by
// line when merges never join "\n" (cuts_after_newlines), which keeps the merge's state to a line's.
void BpeTokenizer::Impl::bpe(std::string_view word, bool bytes, std::vector<int32_t>& out) const {
  if (const size_t nl = word.find('\n'); !bytes && newline_cuts && nl != word.npos && nl + 1 < word.size()) {
    for (size_t b = 0, e; b < word.size(); b = e) {
      e = std::min(word.find('\n', b), word.size() - 1) + 1;
      bpe(word.substr(b, e - b), false, out);
    }
    return;
  }
  if (ignore_merges) {  // a word that is itself in the vocabulary is taken whole
    std::string mapped;
    if (bytes)
      for (char c : word) mapped += tokens[size_t(byte_id[uint8_t(c)])];
    auto it = vocab.find(bytes ? std::string_view(mapped) : word);
    if (it != vocab.end()) return out.push_back(it->second);
  }
  thread_local std::vector<int32_t> sym;
  sym.clear();
  if (bytes) {
    for (char c : word) sym.push_back(byte_id[uint8_t(c)]);
  } else {
    bool unk_last = false;  // the last symbol is an unknown token (fused with the next under fuse_unk)
    for (size_t i = 0; i < word.size();) {
      const std::string_view ch = word.substr(i, utf8::length(word[i]));
      i += ch.size();
      if (auto it = vocab.find(ch); it != vocab.end()) {
        sym.push_back(it->second), unk_last = false;
        continue;
      }
      if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) { return fallback_id[uint8_t(c)] >= 0; })) {
        for (char c : ch) sym.push_back(fallback_id[uint8_t(c)]);
        continue;  // as `tokenizers`: an unknown token before stays fusable
      }
      if (unk_token.empty()) continue;  // `tokenizers` drops the character
      auto unk = vocab.find(unk_token);
      if (unk == vocab.end()) fail(fmt::format("encode: the unknown token \"{}\" is not in the vocabulary", unk_token));
      if (!(fuse_unk && unk_last)) sym.push_back(unk->second);
      unk_last = true;
    }
  }
  merge(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

// A part under the ByteLevel pre-tokenizer: the prefix space, the regex's pieces (its matches and the text between
// them), each piece's BPE. `tokenizers` puts ByteLevel's prefix space before each piece it is given that does not start
// with one: the part when ByteLevel splits with its own regex, but each of the Split's pieces when a Split comes first.
void BpeTokenizer::Impl::byte_level(std::string_view part, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (add_prefix_space && !after_split && !part.empty() && part[0] != ' ') {
    prefixed.reserve(part.size() + 1);
    prefixed.append(1, ' ').append(part);
    part = prefixed;
  }
  std::string spaced;
  auto piece = [&](std::string_view p) {
    if (!add_prefix_space || !after_split || p[0] == ' ') return bpe(p, true, out);
    spaced.assign(1, ' ').append(p);
    bpe(spaced, true, out);
  };
  if (!regex) return bpe(part, true, out);
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(regex, nullptr), pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(part.data());
  size_t pos = 0;
  while (pos < part.size()) {  // encode checked the text as UTF-8
    const int rc = pcre2_match(regex, s, part.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      piece(part.substr(pos));
      break;
    }
    if (rc < 0) {  // a PCRE2 limit (matching or JIT stack)
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      fail(fmt::format("encode: the pre-tokenizer regex fails: {}", reinterpret_cast<const char*>(msg.data())));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > pos) piece(part.substr(pos, ov[0] - pos));
    if (ov[1] > ov[0]) {
      piece(part.substr(ov[0], ov[1] - ov[0]));
      pos = ov[1];
    } else {  // an empty match: step over one character
      size_t next = ov[0];
      if (next < part.size()) next += utf8::length(part[next]);
      if (next > pos) piece(part.substr(pos, next - pos));
      pos = next;
    }
  }
}

// A normalized part between added tokens; `first`: it starts the text; `continues`: it continues the part before a cut
// (cuts_after_newlines), which put the replacement before it already.
void BpeTokenizer::Impl::encode_part(std::string_view part, bool first, bool continues, std::vector<int32_t>& out) const {
  if (pre == Pre::ByteLevel) return byte_level(part, out);
  if (pre == Pre::None) return bpe(part, false, out);
  std::string s;  // Metaspace: spaces become the replacement, which may start the part and each word
  for (char c : part) c == ' ' ? s += replacement : s += c;
  const bool starts = s.compare(0, replacement.size(), replacement) == 0;
  if (!s.empty() && !starts && !continues && (prepend == Prepend::Always || (prepend == Prepend::First && first)))
    s.insert(0, replacement);
  if (!split) return bpe(s, false, out);
  for (size_t begin = 0; begin < s.size();) {
    size_t end = s.find(replacement, begin + 1);
    if (end == std::string::npos) end = s.size();
    bpe(std::string_view(s).substr(begin, end - begin), false, out);
    begin = end;
  }
}

// Splits `text` at the added tokens of `list` (the leftmost, then the longest), appending their ids and calling part()
// for the text between them with whether it starts `text`. A token with lstrip or rstrip takes the whitespace before or
// after it along. `cuts`: where each match starts with that whitespace, unless inside whitespace an rstrip took or in
// the text's last bytes, where a longer token could match in a longer text (added_cut).
void BpeTokenizer::Impl::split_added(std::string_view text, const std::vector<AddedToken>& list,
                                     std::vector<int32_t>& out, const std::function<void(std::string_view, bool)>& part,
                                     std::vector<size_t>* cuts) const {
  size_t start = 0, stripped = 0;  // where the next part starts; the end of the whitespace any rstrip took
  for (size_t i = 0; i < text.size() && !list.empty();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : list)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->content.size();
    while (hit->lstrip && begin > start) {  // the whitespace before it, back to the last split
      size_t b = begin - 1;
      while (b > start && (uint8_t(text[b]) & 0xc0) == 0x80) --b;
      size_t k = b;
      if (!utf8::is_space(utf8::next(text, k))) break;
      begin = b;
    }
    while (hit->rstrip && end < text.size()) {
      size_t k = end;
      if (!utf8::is_space(utf8::next(text, k))) break;
      end = k;
    }
    if (cuts && i >= stripped && i + list.front().content.size() <= text.size()) cuts->push_back(begin);
    if (begin > start) part(text.substr(start, begin - start), start == 0);
    out.push_back(hit->id);
    // Matches are found before stripping, and the next part starts at this match's end even when that is inside the
    // whitespace an rstrip before took (which it then encodes again), as `tokenizers` does.
    i += hit->content.size(), start = end, stripped = std::max(stripped, end);
  }
  if (start < text.size()) part(text.substr(start), start == 0);
}

// The last place at or before `limit` where an added token matched in the raw text starts (split_added's cuts):
// `tokenizers` splits the text there first, and the part after starts with the token, so no Prepend or Metaspace
// prefix goes before it, cut or not. 0 when there is none.
size_t BpeTokenizer::Impl::added_cut(std::string_view text, size_t limit) const {
  std::vector<int32_t> ids;
  std::vector<size_t> cuts;
  split_added(text, raw_added, ids, [](std::string_view, bool) {}, &cuts);
  const auto after = std::upper_bound(cuts.begin(), cuts.end(), limit);
  return after == cuts.begin() ? 0 : *(after - 1);
}

// Whether `text` may be cut at `cut`, after a "\n" (cuts_after_newlines). An added token with lstrip or rstrip takes
// the whitespace beside it: the text must go on past the cut with a character that is neither whitespace nor the start
// of a token with lstrip, and the whitespace before the cut must not follow a token with rstrip (which would end the
// part there, so that what follows starts one).
bool BpeTokenizer::Impl::newline_cut_at(std::string_view text, size_t cut) const {
  if (!raw_strips) return true;
  size_t k = cut;
  if (cut >= text.size() || utf8::unit(text, cut) < 0 || utf8::is_space(utf8::next(text, k))) return false;
  size_t b = cut;  // back over the whitespace before the cut
  for (size_t p = b; p > 0; b = p) {
    do --p;
    while (p > 0 && (uint8_t(text[p]) & 0xc0) == 0x80);
    size_t q = p;
    if (!utf8::is_space(utf8::next(text, q))) break;
  }
  for (const AddedToken& a : raw_added) {
    if (a.lstrip && (text.size() - cut < a.content.size() || text.compare(cut, a.content.size(), a.content) == 0))
      return false;
    if (a.rstrip && b >= a.content.size() && text.compare(b - a.content.size(), a.content.size(), a.content) == 0)
      return false;
  }
  return true;
}

size_t BpeTokenizer::split_point(std::string_view text, size_t limit) const {
  const Impl& t = *impl_;
  const size_t added = t.added_cut(text, limit);  // before an added token, or (the later) one of the places below
  // The three patterns end a piece, and start one whatever came before, at a space that follows a non-space when a
  // letter follows (" word") and at a digit that follows a letter ("ab|12"); an added token holding a space, a letter
  // or a digit could span such a place, one with rstrip that ends there would take the space, a normalizer other than a
  // Unicode form could change it, and a prefix space would be put before a digit (unless after a Split, which puts it
  // before the digits' piece whole or cut).
  if (t.newline_cuts) {
    for (size_t nl = text.substr(0, std::min(limit, text.size())).rfind('\n'); nl != std::string_view::npos;
         nl = nl == 0 ? std::string_view::npos : text.rfind('\n', nl - 1))
      if (t.newline_cut_at(text, nl + 1)) return std::max(added, nl + 1);
    return added;
  }
  if (t.pattern != kGpt2Pattern && t.pattern != kLlama3Pattern && t.pattern != kQwen2Pattern) return added;
  if (!t.normalizer.local()) return added;
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  auto space_before = [&](size_t i) {  // the character ending at i is whitespace (Unicode's: "\u3000 " too)
    do --i;
    while (i > 0 && (uint8_t(text[i]) & 0xc0) == 0x80);
    return utf8::is_space(utf8::next(text, i));
  };
  for (const auto* list : {&t.raw_added, &t.normalized_added})
    for (const AddedToken& a : *list)
      for (size_t i = 0; i < a.content.size(); ++i)
        if (a.content[i] == ' ' || (i > 0 && letter(a.content[i - 1]) && digit(a.content[i]))) return added;
  auto rstrip_ends = [&](size_t i) {
    for (const auto* list : {&t.raw_added, &t.normalized_added})
      for (const AddedToken& a : *list)
        if (a.rstrip && i >= a.content.size() && text.compare(i - a.content.size(), a.content.size(), a.content) == 0)
          return true;
    return false;
  };
  for (size_t i = std::min(limit, text.size() < 2 ? 0 : text.size() - 2); i > 0; --i)
    if ((text[i] == ' ' && !space_before(i) && letter(text[i + 1]) && !rstrip_ends(i)) ||
        ((!t.add_prefix_space || t.after_split) && letter(text[i - 1]) && digit(text[i])))
      return std::max(added, i);
  return added;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special, bool continues) const {
  const Impl& t = *impl_;
  for (size_t i = 0; i < text.size();) {  // invalid UTF-8 is named before any work
    const int n = utf8::unit(text, i);
    if (n < 0) throw Error(fmt::format("tokenizer {}: encode: the text is not valid UTF-8 at byte {}", t.path, i));
    i += size_t(n);
  }
  std::vector<int32_t> out;
  if (add_special) out = t.prefix;
  // Added tokens matched in the text as it is, then normalized ones in each normalized part.
  t.split_added(text, t.raw_added, out, [&](std::string_view part, bool first) {
    const bool on = continues && first;  // the part that goes on from before the cut
    const std::string normalized = t.normalizer(part, on);
    t.split_added(normalized, t.normalized_added, out, [&](std::string_view piece, bool starts) {
      t.encode_part(piece, first && starts && !on, on && starts, out);
    });
  });
  if (add_special) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

std::string BpeTokenizer::Impl::text_of(const std::vector<int32_t>& ids, bool skip_special, bool lossy,
                                        bool at_start) const {
  std::vector<std::string> pieces;
  pieces.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= tokens.size())
      throw Error(fmt::format("tokenizer {}: decoding: id {} is not in the vocabulary (size {})", path, id,
                              tokens.size()));
    if (tokens[size_t(id)].empty()) continue;  // an id between the vocabulary's and the added tokens': nothing, as tokenizers
    auto form = decoded_as.find(id);
    if (!(skip_special && is_special[size_t(id)])) pieces.push_back(form == decoded_as.end() ? tokens[size_t(id)] : form->second);
  }
  return (*decoder)(std::move(pieces), lossy, at_start);
}

bool BpeTokenizer::byte_token(int32_t id) const {
  return impl_->byte_fallback && std::find(impl_->fallback_id.begin(), impl_->fallback_id.end(), id) != impl_->fallback_id.end();
}

std::string BpeTokenizer::bytes_of(const std::vector<int32_t>& ids, bool skip_special, bool at_start) const {
  return impl_->text_of(ids, skip_special, false, at_start);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special, bool at_start) const {
  return impl_->text_of(ids, skip_special, true, at_start);
}

}  // namespace weft::apps
