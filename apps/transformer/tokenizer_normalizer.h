// apps/transformer: a tokenizer.json "normalizer", applied to each part of the text between the
// added tokens before pre-tokenization, as `tokenizers` applies it: Prepend (a string put before
// a non-empty part: SentencePiece's "▁"), Replace of a String pattern (" " -> "▁"), the Unicode
// normalization forms NFC, NFD, NFKC and NFKD (through ICU), and a Sequence of these. Any other
// normalizer (Lowercase, Strip, a Regex Replace, BERT's, ...) is an error naming its type.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "apps/transformer/tokenizer_json.h"

namespace weft::apps {

class TokenizerNormalizer {
 public:
  TokenizerNormalizer() = default;  // none: the text as it is
  // Reads the normalizer at `f` (null: none).
  explicit TokenizerNormalizer(const TokenizerField& f);

  std::string operator()(std::string_view text) const;
  // Whether it changes a text only within runs of non-ASCII characters and their neighbours
  // (none, or Unicode forms only), so that a text cut between ASCII letters, digits and spaces
  // normalizes part by part as it does whole.
  bool local() const;

 private:
  enum class Kind { Prepend, Replace, Nfc, Nfd, Nfkc, Nfkd };
  struct Step {
    Kind kind;
    std::string from, to;  // Prepend: to; Replace: from -> to
  };
  void read(const TokenizerField& f);
  std::vector<Step> steps_;
};

}  // namespace weft::apps
