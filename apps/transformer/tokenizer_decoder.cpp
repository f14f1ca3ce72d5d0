#include "apps/transformer/tokenizer_decoder.h"

#include "apps/transformer/utf8.h"

namespace weft::apps {

std::array<uint32_t, 256> byte_level_alphabet() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

TokenizerDecoder::TokenizerDecoder(const TokenizerField& f) {
  byte_of_.fill(-1);
  const std::array<uint32_t, 256> cps = byte_level_alphabet();
  for (size_t b = 0; b < 256; ++b) byte_of_[cps[b]] = int16_t(b);
  if (f.j.is_null()) steps_.push_back({Kind::JoinWithSpaces, "", ""});
  else read(f);
}

void TokenizerDecoder::read(const TokenizerField& f) {
  const std::string type = f.text("type");
  if (type == "Sequence") {
    for (size_t k = 0, n = f.items("decoders"); k < n; ++k) read(f.item("decoders", k));
  } else if (type == "ByteLevel") {
    steps_.push_back({Kind::ByteLevel, "", ""});
  } else if (type == "ByteFallback") {
    steps_.push_back({Kind::ByteFallback, "", ""});
  } else if (type == "Fuse") {
    steps_.push_back({Kind::Fuse, "", ""});
  } else if (type == "Replace") {
    steps_.push_back({Kind::Replace, f.string_pattern("pattern"), f.text("content")});
    if (steps_.back().from.empty()) f.fail("the pattern is empty");
  } else if (type == "Strip") {
    Step s{Kind::Strip, f.text("content"), ""};
    if (utf8::length(s.from[0]) != s.from.size()) f.fail("\"content\" must be one character");
    for (auto [key, n] : {std::pair{"start", &s.start}, std::pair{"stop", &s.stop}}) {
      if (!f.at(key).is_number_unsigned()) f.fail(fmt::format("\"{}\" must be a non-negative integer", key));
      *n = f.at(key).get<size_t>();
    }
    steps_.push_back(s);
  } else if (type == "Metaspace") {
    Step s{Kind::Metaspace, f.text("replacement"), " "};
    if (s.from.empty() || utf8::length(s.from[0]) != s.from.size()) f.fail("\"replacement\" must be one character");
    const std::string scheme = f.is_null("prepend_scheme") ? "always" : f.text("prepend_scheme");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      f.fail(fmt::format("\"prepend_scheme\" \"{}\" is none of always, first, never", scheme));
    s.drop_first = scheme != "never" && f.flag("add_prefix_space", true);
    steps_.push_back(s);
  } else {
    f.fail(fmt::format("decoder \"{}\" is not supported: weft supports ByteLevel, ByteFallback, Fuse, Strip, Replace "
                       "(of a String), Metaspace and a Sequence of these",
                       type));
  }
}

namespace {

// "<0xAB>" -> 0xAB; -1 for any other token.
int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

void TokenizerDecoder::apply(const Step& step, std::vector<std::string>& tokens, bool lossy, bool at_start) const {
  std::vector<std::string> out;
  switch (step.kind) {
    case Kind::ByteLevel: {  // each token's characters as bytes; a token with another character as it is
      std::string bytes;
      for (const std::string& t : tokens) {
        std::string b;
        bool mapped = true;
        for (size_t i = 0; i < t.size() && mapped;) {
          const uint32_t cp = utf8::next(t, i);
          mapped = cp < byte_of_.size() && byte_of_[cp] >= 0;
          if (mapped) b += char(byte_of_[cp]);
        }
        bytes += mapped ? b : t;
      }
      out.push_back(lossy ? utf8::lossy(bytes) : bytes);
      break;
    }
    case Kind::ByteFallback: {  // a run of byte tokens: its text, or one U+FFFD per byte
      std::string run;
      auto flush = [&] {
        if (run.empty()) return;
        if (!lossy || utf8::valid(run)) out.push_back(run);
        else for (size_t i = 0; i < run.size(); ++i) out.push_back("\xef\xbf\xbd");
        run.clear();
      };
      for (std::string& t : tokens) {
        const int b = fallback_byte(t);
        if (b >= 0) run += char(b);
        else flush(), out.push_back(std::move(t));
      }
      flush();
      break;
    }
    case Kind::Fuse:
    case Kind::JoinWithSpaces: {
      std::string all;
      for (size_t i = 0; i < tokens.size(); ++i) all += (i && step.kind == Kind::JoinWithSpaces ? " " : "") + tokens[i];
      out.push_back(std::move(all));
      break;
    }
    case Kind::Strip:  // a continuation is neither the text's start nor its end
      for (std::string& t : tokens) {
        if (at_start) {
          size_t begin = 0, end = t.size();
          for (size_t k = 0; k < step.start && t.compare(begin, step.from.size(), step.from) == 0; ++k)
            begin += step.from.size();
          for (size_t k = 0; k < step.stop && end >= begin + step.from.size() &&
                             t.compare(end - step.from.size(), step.from.size(), step.from) == 0; ++k)
            end -= step.from.size();
          t = t.substr(begin, end - begin);
        }
        out.push_back(std::move(t));
      }
      break;
    case Kind::Replace:
    case Kind::Metaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        out.push_back(utf8::replace_all(tokens[i], step.from, step.drop_first && at_start && i == 0 ? "" : step.to));
      break;
  }
  tokens = std::move(out);
}

std::string TokenizerDecoder::operator()(std::vector<std::string> tokens, bool lossy, bool at_start) const {
  for (const Step& step : steps_) apply(step, tokens, lossy, at_start);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace weft::apps
