#include "apps/transformer/tokenizer_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/utypes.h>

#include <algorithm>

#include "apps/transformer/utf8.h"

namespace weft::apps {

namespace {

// `text` in a Unicode normalization form, through ICU.
std::string unicode_form(std::string_view text, const char* form, UNormalization2Mode mode) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getInstance(nullptr, form, mode, err);
  WEFT_CHECK(U_SUCCESS(err) && n, "tokenizer: ICU has no normalizer {} ({})", form, u_errorName(err));
  std::string out;
  icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
  n->normalizeUTF8(0, icu::StringPiece(text.data(), int32_t(text.size())), sink, nullptr, err);
  WEFT_CHECK(U_SUCCESS(err), "tokenizer: ICU's {} normalization fails: {}", form, u_errorName(err));
  return out;
}

}  // namespace

TokenizerNormalizer::TokenizerNormalizer(const TokenizerField& f) {
  if (!f.j.is_null()) read(f);
}

void TokenizerNormalizer::read(const TokenizerField& f) {
  const std::string type = f.text("type");
  if (type == "Sequence") {
    for (size_t k = 0, n = f.items("normalizers"); k < n; ++k) read(f.item("normalizers", k));
  } else if (type == "Prepend") {
    steps_.push_back({Kind::Prepend, "", f.text("prepend")});
  } else if (type == "Replace") {
    const std::string from = f.string_pattern("pattern");
    if (from.empty()) f.fail("the pattern is empty");
    steps_.push_back({Kind::Replace, from, f.text("content")});
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    const Kind kinds[] = {Kind::Nfc, Kind::Nfd, Kind::Nfkc, Kind::Nfkd};
    const char* names[] = {"NFC", "NFD", "NFKC", "NFKD"};
    const size_t i = size_t(std::find(names, names + 4, type) - names);
    steps_.push_back({kinds[i], "", ""});
  } else {
    f.fail(fmt::format("normalizer \"{}\" is not supported: weft supports Prepend, Replace (of a String), NFC, NFD, "
                       "NFKC, NFKD and a Sequence of these",
                       type));
  }
}

bool TokenizerNormalizer::local() const {
  return std::all_of(steps_.begin(), steps_.end(), [](const Step& s) { return s.kind != Kind::Prepend && s.kind != Kind::Replace; });
}

bool TokenizerNormalizer::keeps_newlines() const {
  return std::none_of(steps_.begin(), steps_.end(), [](const Step& s) { return s.from.find('\n') != std::string::npos; });
}

std::string TokenizerNormalizer::operator()(std::string_view text, bool continues) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::Prepend:
        if (!s.empty() && !continues) s.insert(0, step.to);
        break;
      case Kind::Replace: s = utf8::replace_all(s, step.from, step.to); break;
      case Kind::Nfc: s = unicode_form(s, "nfc", UNORM2_COMPOSE); break;
      case Kind::Nfd: s = unicode_form(s, "nfc", UNORM2_DECOMPOSE); break;
      case Kind::Nfkc: s = unicode_form(s, "nfkc", UNORM2_COMPOSE); break;
      case Kind::Nfkd: s = unicode_form(s, "nfkc", UNORM2_DECOMPOSE); break;
    }
  }
  return s;
}

}  // namespace weft::apps
