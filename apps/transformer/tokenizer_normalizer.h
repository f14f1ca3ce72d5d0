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

  // continues: `text` goes on from a part cut after a "\n" (keeps_newlines), so nothing is prepended.
  std::string operator()(std::string_view text, bool continues = false) const;
  // Whether a text cut after a "\n" normalizes part by part as it does whole, the second part continuing: no
  // Replace pattern holds a "\n" (the Unicode forms leave a "\n" and what follows it apart).
  bool keeps_newlines() const;
  // Whether it changes a text only within runs of non-ASCII characters and their neighbours (none, or Unicode forms
  // only), so that a text cut between ASCII letters, digits and spaces normalizes part by part as it does whole.
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
