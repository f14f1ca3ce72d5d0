// apps/transformer: a tokenizer.json "decoder", turning tokens (their vocabulary strings, or an added token's content)
// back into text as `tokenizers` does: ByteLevel (each character of the byte-level alphabet is one byte), ByteFallback
// ("<0xE4>"-style byte tokens), Fuse, Strip, Replace of a String pattern ("▁" -> " "), Metaspace, and a Sequence of
// these; none joins the tokens with spaces. Another decoder is an error naming its type.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/transformer/tokenizer_json.h"

namespace weft::apps {

// The byte-level alphabet: the code point standing for each byte (printable Latin-1 bytes stand
// for themselves, the other 68 for 256, 257, ... in byte order).
std::array<uint32_t, 256> byte_level_alphabet();

class TokenizerDecoder {
 public:
  // Reads the decoder at `f` (null: none).
  explicit TokenizerDecoder(const TokenizerField& f);

  // The text of `tokens`. lossy: bytes that do not form UTF-8 are replaced by U+FFFD as each decoder replaces them
  // (ByteLevel: one per maximal ill-formed part; ByteFallback: one per byte); otherwise they are kept (a stream printed
  // token by token forms its characters at the reader). at_start: tokens[0] is the text's first token (Strip and
  // Metaspace remove the space the encoder put before it); a continuation is neither the text's start nor its end.
  std::string operator()(std::vector<std::string> tokens, bool lossy, bool at_start) const;

 private:
  enum class Kind { ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, JoinWithSpaces };
  struct Step {
    Kind kind;
    std::string from, to;  // Replace: from -> to; Strip: from is the content; Metaspace: from
    size_t start = 0, stop = 0;  // Strip: at most this many at each end
    bool drop_first = false;  // Metaspace: the first token loses its replacement characters
  };
  void read(const TokenizerField& f);
  void apply(const Step& step, std::vector<std::string>& tokens, bool lossy, bool at_start) const;
  std::vector<Step> steps_;
  std::array<int16_t, 0x144> byte_of_{};  // byte-level code point -> byte (-1: none)
};

}  // namespace weft::apps
