#include "apps/transformer/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace weft::apps {

using json = nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (a Split before ByteLevel).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6)), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f)), out += char(0x80 | (cp & 0x3f));
  }
}

// The byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// the code points 256, 257, ... in byte order (GPT-2's bytes_to_unicode).
std::array<uint32_t, 256> byte_code_points() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// Decodes one UTF-8 sequence at s[i] (valid input), advancing i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = uint8_t(s[i]);
  const int len = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
  uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3f);
  i += size_t(len);
  return cp;
}

// Length of the well-formed UTF-8 sequence at s[i], or of its maximal ill-formed prefix
// negated (at least one byte): the unit that is replaced by one U+FFFD.
int utf8_unit(std::string_view s, size_t i) {
  const auto b = uint8_t(s[i]);
  if (b < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xbf;
  if (b >= 0xc2 && b <= 0xdf) len = 2;
  else if (b == 0xe0) len = 3, lo = 0xa0;
  else if (b >= 0xe1 && b <= 0xec) len = 3;
  else if (b == 0xed) len = 3, hi = 0x9f;
  else if (b >= 0xee && b <= 0xef) len = 3;
  else if (b == 0xf0) len = 4, lo = 0x90;
  else if (b >= 0xf1 && b <= 0xf3) len = 4;
  else if (b == 0xf4) len = 4, hi = 0x8f;
  else return -1;
  for (int k = 1; k < len; ++k) {
    if (i + size_t(k) >= s.size()) return -k;
    const auto c = uint8_t(s[i + size_t(k)]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return -k;
  }
  return len;
}

// What a component of the file is, for messages: its "type" when it has one, else its JSON.
std::string kind_of(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return j.dump();
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// A part of the file: its JSON, the file's path and where the part is in it ("" for the whole).
struct Field {
  const json& j;
  const std::string& file;
  std::string where;
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("tokenizer {}: {}{}", file, where.empty() ? "" : where + ": ", what));
  }
  const json& at(const std::string& key) const {
    if (!j.is_object() || !j.contains(key)) fail(fmt::format("\"{}\" is missing", key));
    return j[key];
  }
  bool is_null(const std::string& key) const { return !j.is_object() || !j.contains(key) || j[key].is_null(); }
  std::string text(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(fmt::format("\"{}\" must be a string, got {}", key, v.dump()));
    return v.get<std::string>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (is_null(key)) return fallback;
    if (!j[key].is_boolean()) fail(fmt::format("\"{}\" must be true or false, got {}", key, j[key].dump()));
    return j[key].get<bool>();
  }
  Field sub(const std::string& key) const { return Field{at(key), file, where.empty() ? key : where + "." + key}; }
};

}  // namespace

struct BpeTokenizer::Impl {
  std::string path;
  std::vector<std::string> tokens;  // by id: the vocabulary form, or an added token's content
  std::vector<char> is_special;     // by id
  std::unordered_map<std::string, int32_t> vocab;
  std::array<int32_t, 256> byte_id{};       // the id of each byte's one-character token
  std::unordered_map<uint32_t, uint8_t> code_point_byte;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged id)
  bool ignore_merges = false;
  bool add_prefix_space = false;
  std::vector<AddedToken> added;  // longest first
  pcre2_code* regex = nullptr;
  std::string pattern;  // regex's

  ~Impl() { pcre2_code_free(regex); }
  [[noreturn]] void fail(const std::string& what) const { throw Error(fmt::format("tokenizer {}: {}", path, what)); }

  void read_model(const Field& m);
  void read_pre_tokenizer(const Field& p);
  void compile(const std::string& pattern);
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_part(std::string_view part, std::vector<int32_t>& out) const;
};

void BpeTokenizer::Impl::read_model(const Field& m) {
  // `tokenizers` before 0.9 wrote no "type"; it reads a model with merges as BPE.
  const std::string type = m.is_null("type") && m.j.contains("merges") ? "BPE" : m.text("type");
  if (type != "BPE")
    m.fail(fmt::format("model type \"{}\" is not supported: weft reads byte-level BPE tokenizers only", type));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})  // "" is none, as null
    if (!m.is_null(key) && m.j[key] != "")
      m.fail(fmt::format("\"{}\" is {}: weft supports none (null or \"\")", key, m.j[key].dump()));
  if (!m.is_null("dropout") && m.j["dropout"] != 0)  // 0 merges as null does
    m.fail(fmt::format("\"dropout\" is {}: dropout skips merges at random; weft supports null or 0",
                       m.j["dropout"].dump()));
  // unk_token, fuse_unk and byte_fallback never act: every byte's character is in the vocabulary.
  ignore_merges = m.flag("ignore_merges", false);
  const json& v = m.at("vocab");
  if (!v.is_object()) m.fail("\"vocab\" must be an object of token: id");
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
      m.fail(fmt::format("vocab entry \"{}\" has id {}, not a non-negative 32-bit integer", token, id.dump()));
    const auto i = id.get<int32_t>();
    if (size_t(i) >= tokens.size()) tokens.resize(size_t(i) + 1), is_special.resize(size_t(i) + 1);
    if (!tokens[size_t(i)].empty()) m.fail(fmt::format("vocab ids repeat: {} is \"{}\" and \"{}\"", i, tokens[size_t(i)], token));
    tokens[size_t(i)] = token;
    vocab[token] = i;
  }
  const std::array<uint32_t, 256> cps = byte_code_points();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, cps[size_t(b)]);
    auto it = vocab.find(ch);
    if (it == vocab.end())
      m.fail(fmt::format("the vocabulary lacks byte 0x{:02x} (\"{}\"): not a byte-level BPE vocabulary", b, ch));
    byte_id[size_t(b)] = it->second;
    code_point_byte[cps[size_t(b)]] = uint8_t(b);
  }
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
    const uint64_t key = uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second);
    merges.emplace(key, std::make_pair(rank, iab->second));  // the first rank of a repeated merge
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

void BpeTokenizer::Impl::read_pre_tokenizer(const Field& p) {
  auto byte_level = [&](const Field& f, bool regex_allowed) {
    add_prefix_space = f.flag("add_prefix_space", true);
    const bool use_regex = f.flag("use_regex", true);
    if (use_regex && !regex_allowed) f.fail("\"use_regex\" is true after a Split: weft supports one pattern");
    if (use_regex) compile(kGpt2Pattern);
  };
  const std::string type = p.text("type");
  if (type == "ByteLevel") return byte_level(p, true);
  if (type != "Sequence")
    p.fail(fmt::format("pre-tokenizer \"{}\" is not supported: weft reads ByteLevel, or a Sequence of a regex "
                       "Split and ByteLevel",
                       type));
  const json& list = p.at("pretokenizers");
  if (!list.is_array() || list.size() != 2)
    p.fail("\"pretokenizers\": weft supports a Sequence of exactly a regex Split and a ByteLevel");
  const Field split{list[0], p.file, p.where + ".pretokenizers[0]"};
  const Field level{list[1], p.file, p.where + ".pretokenizers[1]"};
  if (split.text("type") != "Split" || level.text("type") != "ByteLevel")
    p.fail(fmt::format("a Sequence of \"{}\" and \"{}\": weft supports Split then ByteLevel", split.text("type"),
                       level.text("type")));
  if (split.text("behavior") != "Isolated")
    split.fail(fmt::format("behavior \"{}\" is not supported: weft supports Isolated", split.text("behavior")));
  if (split.flag("invert", false)) split.fail("\"invert\" is true: weft supports only false");
  const Field pattern = split.sub("pattern");
  if (pattern.is_null("Regex")) pattern.fail("weft supports a Regex pattern only (not a String)");
  compile(pattern.text("Regex"));
  byte_level(level, false);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) t.fail("cannot be opened (a tokenizer.json of the Hugging Face `tokenizers` format is expected)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    t.fail(fmt::format("is not valid JSON: {}", e.what()));
  }
  const Field root{j, path, ""};
  if (!j.is_object()) root.fail("is not a JSON object");
  if (!root.is_null("normalizer"))
    root.fail(fmt::format("normalizer \"{}\" is not supported: weft supports none (null)",
                          kind_of(j["normalizer"])));
  t.read_model(root.sub("model"));
  if (root.is_null("pre_tokenizer")) root.fail("\"pre_tokenizer\" is missing: byte-level BPE needs ByteLevel");
  t.read_pre_tokenizer(root.sub("pre_tokenizer"));
  if (root.is_null("decoder") || root.sub("decoder").text("type") != "ByteLevel")
    root.fail(fmt::format("decoder {} is not supported: weft decodes ByteLevel",
                          root.is_null("decoder") ? "null" : json(kind_of(j["decoder"])).dump()));
  if (!root.is_null("added_tokens")) {
    const json& list = j["added_tokens"];
    if (!list.is_array()) root.fail("\"added_tokens\" must be an array");
    for (size_t k = 0; k < list.size(); ++k) {
      const Field a{list[k], path, fmt::format("added_tokens[{}]", k)};
      for (const char* key : {"single_word", "lstrip", "rstrip"})
        if (a.flag(key, false)) a.fail(fmt::format("\"{}\" is true: weft supports only false", key));
      const json& id = a.at("id");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31))
        a.fail(fmt::format("\"id\" is {}, not a non-negative 32-bit integer", id.dump()));
      AddedToken tok{a.text("content"), id.get<int32_t>(), a.flag("special", false)};
      if (tok.content.empty()) a.fail("\"content\" is empty");
      const size_t i = size_t(tok.id);
      if (i >= t.tokens.size()) t.tokens.resize(i + 1), t.is_special.resize(i + 1);
      if (!t.tokens[i].empty() && t.tokens[i] != tok.content)
        a.fail(fmt::format("id {} is \"{}\" in the vocabulary", i, t.tokens[i]));
      t.tokens[i] = tok.content;
      t.is_special[i] = tok.special;
      t.vocab[tok.content] = tok.id;
      t.added.push_back(std::move(tok));
    }
    std::stable_sort(t.added.begin(), t.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  }
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

int64_t BpeTokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

int32_t BpeTokenizer::id_of(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

// The ids of one pre-token (raw bytes): its bytes' tokens merged pair by pair, the lowest rank
// first and the leftmost of equal ranks, until no adjacent pair has a merge.
void BpeTokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {  // a pre-token that is itself in the vocabulary is taken whole
    std::string mapped;
    for (char c : piece) mapped += tokens[size_t(byte_id[uint8_t(c)])];
    auto it = vocab.find(mapped);
    if (it != vocab.end()) return out.push_back(it->second);
  }
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (char c : piece) sym.push_back(byte_id[uint8_t(c)]);
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = 0;
    size_t best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(uint64_t(uint32_t(sym[i])) << 32 | uint32_t(sym[i + 1]));
      if (it != merges.end() && it->second.first < best_rank) best_rank = it->second.first, best_id = it->second.second, best = i;
    }
    if (best_rank == INT32_MAX) break;
    sym[best] = best_id;
    sym.erase(sym.begin() + std::ptrdiff_t(best) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

// A part of the text between added tokens: the prefix space, the pre-tokenizer's pieces (its
// matches and the text between them), each piece's BPE.
void BpeTokenizer::Impl::encode_part(std::string_view part, std::vector<int32_t>& out) const {
  std::string prefixed;
  if (add_prefix_space && !part.empty() && part[0] != ' ') {
    prefixed.reserve(part.size() + 1);
    prefixed.append(1, ' ').append(part);
    part = prefixed;
  }
  if (!regex) return bpe(part, out);
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(regex, nullptr), pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(part.data());
  size_t pos = 0;
  while (pos < part.size()) {  // encode checked the text as UTF-8
    const int rc = pcre2_match(regex, s, part.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      bpe(part.substr(pos), out);
      break;
    }
    if (rc < 0) {  // a PCRE2 limit (matching or JIT stack)
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      fail(fmt::format("encode: the pre-tokenizer regex fails: {}", reinterpret_cast<const char*>(msg.data())));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > pos) bpe(part.substr(pos, ov[0] - pos), out);
    if (ov[1] > ov[0]) {
      bpe(part.substr(ov[0], ov[1] - ov[0]), out);
      pos = ov[1];
    } else {  // an empty match: step over one character
      size_t next = ov[0];
      if (next < part.size()) next_code_point(part, next);
      if (next > pos) bpe(part.substr(pos, next - pos), out);
      pos = next;
    }
  }
}

size_t BpeTokenizer::split_point(std::string_view text, size_t limit) const {
  const Impl& t = *impl_;
  // Both patterns end a piece, and start one whatever came before, at a space that follows a
  // non-space when a letter follows (" word") and at a digit that follows a letter ("ab|12"); an
  // added token holding a space, a letter or a digit could span such a place.
  if (t.pattern != kGpt2Pattern && t.pattern != kLlama3Pattern) return 0;
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  for (const AddedToken& a : t.added)
    for (size_t i = 1; i < a.content.size(); ++i)
      if (a.content[i] == ' ' || (letter(a.content[i - 1]) && digit(a.content[i]))) return 0;
  for (size_t i = std::min(limit, text.size() < 2 ? 0 : text.size() - 2); i > 0; --i)
    if ((text[i] == ' ' && !space(text[i - 1]) && letter(text[i + 1])) || (letter(text[i - 1]) && digit(text[i])))
      return i;
  return 0;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  const Impl& t = *impl_;
  for (size_t i = 0; i < text.size();) {  // invalid UTF-8 is named before any work
    const int n = utf8_unit(text, i);
    if (n < 0) throw Error(fmt::format("tokenizer {}: encode: the text is not valid UTF-8 at byte {}", t.path, i));
    i += size_t(n);
  }
  std::vector<int32_t> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : t.added)  // longest first: the longest match at the leftmost position
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) t.encode_part(text.substr(start, i - start), out);
    out.push_back(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) t.encode_part(text.substr(start), out);
  return out;
}

std::string BpeTokenizer::bytes_of(const std::vector<int32_t>& ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= t.tokens.size() || t.tokens[size_t(id)].empty())
      throw Error(fmt::format("tokenizer {}: decoding: id {} is not in the vocabulary (size {})", t.path, id,
                              t.tokens.size()));
    if (skip_special && t.is_special[size_t(id)]) continue;
    // Each character of the token stands for one byte; a token with a character outside the
    // byte-level alphabet (an added token's text) is taken as its own UTF-8 bytes.
    const std::string& tok = t.tokens[size_t(id)];
    std::string b;
    bool mapped = true;
    for (size_t i = 0; i < tok.size() && mapped;) {
      auto it = t.code_point_byte.find(next_code_point(tok, i));
      if (it == t.code_point_byte.end()) mapped = false;
      else b += char(it->second);
    }
    bytes += mapped ? b : tok;
  }
  return bytes;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const std::string bytes = bytes_of(ids, skip_special);
  std::string out;  // bytes that do not form UTF-8 become U+FFFD, one per maximal ill-formed part
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int n = utf8_unit(bytes, i);
    if (n > 0) out.append(bytes, i, size_t(n)), i += size_t(n);
    else append_utf8(out, 0xfffd), i += size_t(-n);
  }
  return out;
}

}  // namespace weft::apps
