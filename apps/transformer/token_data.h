// apps/transformer: pre-tokenized datasets. `weft-transformer prepare` encodes a text file or
// folder with a BPE tokenizer (bpe_tokenizer.h) into DIR/train.tokens and DIR/val.tokens, with
// a copy of the tokenizer as DIR/tokenizer.json. A token file is a 128-byte header and then
// the ids, little-endian, 2 bytes each when the vocabulary fits in 16 bits, else 4:
//   0   magic "WEFTTOK1" (8 bytes)       8  format version (u32, 1)
//   12  bytes per token (u32, 2 or 4)    16 token count (u64)
//   24  vocabulary size (u64)            32 the tokenizer.json's sha256 (64 hex characters)
//   96  the dataset's id (32 hex characters, the same in every file of one dataset; zeros in
//       files written before it was kept)
// Files are written atomically (core/atomic_file.h) and read memory-mapped (TokenFile), so a
// dataset never has to fit in memory.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "apps/common/output_paths.h"
#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/text_data.h"

namespace weft::apps {

struct TokenFileHeader {
  int64_t bytes_per_token = 0, count = 0, vocab_size = 0;
  std::string tokenizer_sha256;
  std::string dataset_id;  // empty in files from before it was kept
};

// The id every file of one prepared dataset carries (32 hex characters of a sha256 of all its ids and labels: the same
// text prepared again gets the same bytes). Files of one dataset with different ids (a prepare stopped between its
// renames, a file copied in from another dataset) are refused.
std::string dataset_id(std::initializer_list<std::span<const uint32_t>> parts);

// Writes `tokens` (each < vocab_size) as a token file at `path`, replacing it atomically.
void write_token_file(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size,
                      const std::string& tokenizer_sha256, const std::string& dataset_id);

// A token file, memory-mapped read-only; a bad header or a size that disagrees with it is an
// error naming the file and the field, and so is the file's truncation while it is mapped.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const TokenFileHeader& header() const { return header_; }
  TokenView view() const { return {data_, header_.count, int(header_.bytes_per_token)}; }
  int64_t size() const { return header_.count; }
  uint32_t operator[](int64_t i) const {
    const unsigned char* p = data_ + i * header_.bytes_per_token;
    return header_.bytes_per_token == 2 ? uint32_t(p[0] | p[1] << 8)
                                        : uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }

 private:
  std::string path_;
  TokenFileHeader header_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* data_ = nullptr;
  int guard_ = -1;  // the slot of its SIGBUS guard (token_data.cpp): truncated while mapped, an error naming it
};

// What `train --data PATH` reads: a dataset directory of `prepare` (it holds train.tokens),
// memory-mapped, or else text as bytes (load_text). The views point into this object.
struct TrainingData {
  TextData text;                           // bytes, when PATH is text
  std::optional<TokenFile> train_file, val_file, train_labels_file, val_labels_file;
  TokenView train, val;
  TokenView train_labels, val_labels;      // a dataset of examples (example_data.h): their labels
  int64_t vocab_size = 256;                // of the ids: 256 for bytes
  std::string tokenizer_sha256;            // empty for bytes
  std::vector<std::string> files;          // what was read
  TrainingData() = default;
  TrainingData(TrainingData&&) = delete;   // the views point into it
  bool examples() const { return train_labels_file.has_value(); }
};
bool is_token_dataset(const std::string& path);
// Fills `d` from `path`; the token files (and .labels files, when there are) must come from one tokenizer.
void load_training_data(const std::string& path, TrainingData& d);

// The sha256 (hex) of the tokenizer.json at `path`, as a dataset and its checkpoints record it.
std::string tokenizer_digest(const std::string& path);
// What a dataset or a model holds, in messages: text (bytes) for no tokenizer, else the tokenizer's tokens.
inline std::string describe_tokens(const std::string& sha) {
  return sha.empty() ? "text (bytes)" : "tokens of tokenizer sha256 " + sha;
}
// Writes the tokenizer.json of `tokenizer_path` into the dataset directory `dir`, atomically.
void copy_tokenizer(const std::string& tokenizer_path, const std::string& dir);
// prepare's --out: an existing directory that holds a tokenizer.json but no token files is a model's
// (prepare would replace its tokenizer), refused by check_output_place before any work.
PathFlag dataset_out(const std::string& dir);

struct PreparedData {
  int64_t files = 0, bytes = 0, train_tokens = 0, val_tokens = 0;
};

// Encodes the text files of `data` (text_files' order) with the tokenizer at `tokenizer_path`, each between its
// post-processor's special tokens when `special` (Llama's BOS before it, as `transformers` encodes a text), then `eos`
// (a token of the tokenizer, or empty for none) after each file, and writes the last `val_fraction` of the tokens as
// val.tokens, the rest as train.tokens, and the tokenizer as tokenizer.json, into `out_dir` (created; existing dataset
// files there are replaced, .labels files of an earlier dataset of examples removed). Prints a progress bar with rate
// and ETA to stderr. Text encoded at once (no place to cut it: BpeTokenizer::split_point) holds about
// kEncodeBytesPerByte bytes of BPE state a byte: a stretch `memory` (0: MemAvailable) cannot hold is an error naming
// the file, not an OOM kill.
PreparedData prepare_tokens(const std::string& tokenizer_path, const std::string& data, const std::string& out_dir,
                            const std::string& eos, double val_fraction = 0.1, bool special = true, int64_t memory = 0);
constexpr int64_t kEncodeBytesPerByte = 40;  // 32 MiB of one GPT-2 "word" peaked at 1.2 GB

}  // namespace weft::apps
