// apps/transformer: byte-level BPE tokenizers from Hugging Face's tokenizer.json (the format of
// the `tokenizers` library, used by GPT-2 and Llama 3 style models). encode and decode give
// exactly what `tokenizers` gives for encode(text, add_special_tokens=False) and decode(ids,
// skip_special_tokens): added tokens split the text first (leftmost, longest), each remaining
// part is pre-tokenized (GPT-2's ByteLevel regex, or a Split regex followed by ByteLevel),
// mapped byte by byte to the byte-level alphabet and merged by rank. Every form `tokenizers`
// writes is read (no prefix as "" or null, dropout null or 0, merges as "a b" or pairs, a model
// without "type"); a tokenizer.json weft cannot reproduce exactly (another model type such as
// Unigram, WordPiece or WordLevel, a normalizer, a decoder other than ByteLevel, a subword
// prefix or suffix, dropout) is an error that names the file and the field. Post-processors
// (adding BOS/EOS) are not applied: encode adds no special tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace weft::apps {

// The tokenizer.json `path` names: itself, or DIR/tokenizer.json when it is a directory (a Hugging
// Face model directory or a prepared dataset). A directory without one is an error naming it.
std::string tokenizer_json_path(const std::string& path);

class BpeTokenizer {
 public:
  // Reads and checks `path`; errors name the file and what is wrong.
  explicit BpeTokenizer(const std::string& path);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // The ids of `text` (UTF-8; invalid UTF-8 is an error naming the byte offset).
  std::vector<int32_t> encode(std::string_view text) const;
  // A place at or before `limit` where `text` may be cut so that encoding the two parts one after
  // the other gives encode(text)'s ids (for reading a long text in blocks): a space between a
  // non-space and an ASCII letter, or an ASCII digit after an ASCII letter, under GPT-2's or
  // Llama 3's pre-tokenizer pattern when no added token could span it. 0 when there is none.
  size_t split_point(std::string_view text, size_t limit) const;
  // The text of `ids` (ids outside the vocabulary are an error), bytes that do not form UTF-8
  // replaced by U+FFFD as `tokenizers` does; special added tokens left out when skip_special.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The bytes the ids stand for, before that replacement (a stream printed token by token
  // forms its characters at the reader).
  std::string bytes_of(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  // The id of a token (its vocabulary form, or an added token's content); -1 when none.
  int32_t id_of(std::string_view token) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::apps
