// apps/transformer: supervised examples, the data of instruction and chat fine-tuning. `prepare`
// reads JSONL (one JSON object per line) whose records are
//   {"text": T}                         every token trained: BOS T EOS
//   {"prompt": P, "completion": C}      BOS P C EOS, the tokens of C and EOS trained
//   {"messages": [{"role", "content"}, ...]}   rendered by the chat template (chat_template.h),
//                                       the assistant messages trained
// and writes, beside the ids of train.tokens / val.tokens, train.labels / val.labels: token files
// (token_data.h) of one label per token: 1 when the token is a target that carries loss, 0 when
// not, 2 on the first token of each example (never a target). The whole text of an example is
// encoded at once; a piece starts at the first token where the encoding of the text before it
// stops agreeing with the whole (so a token that straddles two pieces belongs to the second).
// The last val_fraction of the examples are the validation split.
//
// Training draws whole examples (ExampleSet): each row of a batch is one example from its start,
// right-padded to the longest row of the global batch, with target -100 (kIgnoreLabel, as
// transformers' labels) wherever a token carries no loss; the loss is the mean over the targets
// that do, over the whole global batch.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "apps/transformer/text_data.h"
#include "weft.h"

namespace weft::apps {

constexpr int64_t kIgnoreLabel = -100;

// Label values of a .labels file.
enum : uint32_t { kLabelContext = 0, kLabelTrained = 1, kLabelStart = 2 };

// One encoded example: ids and, per id, whether it carries loss.
struct Example {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> trained;
};

struct PreparedExamples {
  int64_t files = 0, records = 0, train_examples = 0, val_examples = 0, train_tokens = 0, val_tokens = 0,
          trained_tokens = 0;
};

// True when `data` is a .jsonl file or a folder of them (a folder mixing .jsonl with other files
// is an error naming one of each).
bool is_jsonl_data(const std::string& data);

// Encodes the JSONL files of `data` with the tokenizer at `tokenizer_path` into `out_dir` as
// prepare_tokens does, with the .labels files. `eos` ends text and completion records (a token
// of the tokenizer; "" for none); `special` puts the post-processor's tokens (BOS) around them;
// `chat_format` names the chat template (empty: recognised from the tokenizer's). A line that is
// not an object or lacks its fields is an error naming the file and line.
PreparedExamples prepare_examples(const std::string& tokenizer_path, const std::string& data,
                                  const std::string& out_dir, const std::string& eos, double val_fraction,
                                  bool special, const std::string& chat_format);

// The examples of one split (ids and labels of a dataset directory) as a run with context `ctx`
// sees them: an example longer than ctx + 1 tokens is cut there; one with no target that
// carries loss in its first ctx + 1 tokens is skipped (counted).
class ExampleSet {
 public:
  ExampleSet(TokenView ids, TokenView labels, int64_t ctx, const std::string& what);
  int64_t size() const { return int64_t(starts_.size()); }
  int64_t skipped() const { return skipped_; }
  int64_t truncated() const { return truncated_; }

  // The example indices of global batch `index` of `batch` rows: consecutive slots of a
  // permutation of the examples that changes every epoch (from Generator(seed, epoch)).
  std::vector<int64_t> draw(uint64_t seed, int64_t index, int64_t batch) const;
  // Rows [lo, hi) of the batch of examples `picked` (ids [rows, T], targets [rows, T] with
  // kIgnoreLabel), T the longest of all `picked` (so the same at every rank).
  std::pair<Tensor, Tensor> rows(const std::vector<int64_t>& picked, int64_t lo, int64_t hi) const;
  // The targets that carry loss in the examples `picked`.
  int64_t targets(const std::vector<int64_t>& picked) const;

 private:
  int64_t length(int64_t e) const { return lengths_[size_t(e)]; }
  TokenView ids_, labels_;
  std::vector<int64_t> starts_, lengths_, targets_;
  int64_t skipped_ = 0, truncated_ = 0;
  mutable int64_t epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace weft::apps
