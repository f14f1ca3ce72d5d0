// apps/transformer: BPE tokenizers from Hugging Face's tokenizer.json (the format of the `tokenizers` library):
// byte-level ones (GPT-2, Llama 3, Qwen2) and SentencePiece-style ones (Llama 2, Mistral, TinyLlama: characters,
// byte_fallback to "<0xAB>" tokens, "▁" for spaces). encode and decode give exactly what `tokenizers` gives for
// encode(text, add_special_tokens) and decode(ids, skip_special_tokens): added tokens split the text first (leftmost,
// longest; lstrip/rstrip take the whitespace beside them; "normalized" ones are matched after the normalizer), the
// normalizer (tokenizer_normalizer.h) changes each remaining part, the pre-tokenizer cuts it into words (GPT-2's
// ByteLevel regex, a Split regex then ByteLevel, Metaspace, or none) and each word's symbols are merged by rank; the
// post-processor's template puts its special tokens (BOS, EOS) around the text; the decoder (tokenizer_decoder.h) turns
// tokens back into text. Every form `tokenizers` writes is read; a tokenizer.json weft cannot reproduce exactly
// (another model type such as Unigram, WordPiece or WordLevel, a subword prefix or suffix, dropout, single_word tokens,
// a component not listed) is an error that names the file and the field.
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

  // The ids of `text` (UTF-8; invalid UTF-8 is an error naming the byte offset), with the
  // post-processor's special tokens around them when add_special (as `transformers` encodes).
  // continues: `text` follows a cut at split_point, so nothing is put before it (Prepend, Metaspace's "▁").
  std::vector<int32_t> encode(std::string_view text, bool add_special = false, bool continues = false) const;
  // The post-processor's special tokens before and after a text (Llama's BOS; none for GPT-2).
  const std::vector<int32_t>& special_prefix() const;
  const std::vector<int32_t>& special_suffix() const;
  // A place at or before `limit` where `text` may be cut so that encoding the two parts one after the other (the second
  // with continues) gives encode(text)'s ids (for reading a long text in blocks): where an added token matched in the
  // raw text starts (with the whitespace lstrip takes), which `tokenizers` splits off first; a space between a
  // non-space and an ASCII letter, or an ASCII digit after an ASCII letter, under GPT-2's or Llama 3's or Qwen2's
  // pre-tokenizer pattern when no added token could span it and the normalizer is none or Unicode forms only; after a
  // "\n" for a SentencePiece-style tokenizer whose merges never join "\n" (Llama 2's, Mistral's: "\n" is the byte token
  // <0x0A>). 0 when there is none.
  size_t split_point(std::string_view text, size_t limit) const;
  // The text of `ids` (ids outside the vocabulary are an error), bytes that do not form UTF-8
  // replaced by U+FFFD as `tokenizers` does; special added tokens left out when skip_special.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false, bool at_start = true) const;
  // The bytes the ids stand for, before that replacement (a stream printed token by token
  // forms its characters at the reader). at_start false: the ids continue a text, so the space
  // the encoder put before its first word is not removed ("▁world" is " world").
  std::string bytes_of(const std::vector<int32_t>& ids, bool skip_special = false, bool at_start = true) const;
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  // Whether `id` is a byte token "<0xAB>" of byte fallback (a run of them decodes together).
  bool byte_token(int32_t id) const;
  // The id of a token (its vocabulary form, or an added token's content); -1 when none.
  int32_t id_of(std::string_view token) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::apps
