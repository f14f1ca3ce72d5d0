// apps/transformer: supervised examples, the data of instruction and chat fine-tuning. `prepare`
// reads JSONL (one JSON object per line) whose records are
//   {"text": T}                         every token trained: BOS T EOS
//   {"prompt": P, "completion": C}      BOS P C EOS, the tokens of C and EOS trained
//   {"messages": [{"role", "content"}, ...]}   rendered by the chat template (chat_template.h),
//                                       the assistant messages trained
// and writes, beside the ids of train.tokens / val.tokens, train.labels / val.labels: token files (token_data.h) of one
// label per token: 1 when the token is a target that carries loss, 0 when not, 2 on the first token of each example
// (never a target). The whole text of an example is encoded at once; a piece starts at the first token where the
// encoding of the text before it stops agreeing with the whole (so a token that straddles two pieces belongs to the
// second). The last val_fraction of the examples are the validation split.
//
// Training draws whole examples (ExampleSet): each row of a batch is one example from its start, right-padded to the
// longest row of the global batch, with target -100 (kIgnoreLabel, as transformers' labels) wherever a token carries no
// loss; the loss is the mean over the targets that do, over the whole global batch. Packed (--pack), a row holds
// several examples, each exactly as its own row would (inputs, targets), with positions counting from 0 in each: the
// model attends within each example only (nn/documents.h).
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

// Encodes the JSONL files of `data` with the tokenizer at `tokenizer_path` into `out_dir` as prepare_tokens does, with
// the .labels files. `eos` ends text and completion records (a token of the tokenizer; "" for none); `special` puts the
// post-processor's tokens (BOS) around them; `chat_format` names the chat template (empty: recognised from the
// tokenizer's). A line that is not an object or lacks its fields is an error naming the file and line.
PreparedExamples prepare_examples(const std::string& tokenizer_path, const std::string& data,
                                  const std::string& out_dir, const std::string& eos, double val_fraction,
                                  bool special, const std::string& chat_format);

// Rows of a batch: ids [rows, T], targets [rows, T] and, packed, positions [rows, T].
struct ExampleRows {
  Tensor x, y, positions;
};

// The examples of one split (ids and labels of a dataset directory) as a run with context `ctx` sees them: an example
// longer than ctx + 1 tokens is cut there; one with no target that carries loss in its first ctx + 1 tokens is skipped
// (counted). With `pack` the units a batch draws are packs: the examples in an order drawn from `seed`, each added to
// the current pack while its inputs (its length - 1) fit in ctx, else starting the next.
class ExampleSet {
 public:
  ExampleSet(TokenView ids, TokenView labels, int64_t ctx, const std::string& what, bool pack = false,
             uint64_t seed = 0);
  // Units: examples, or packs.
  int64_t size() const { return packed() ? int64_t(packs_.size()) : int64_t(starts_.size()); }
  int64_t examples() const { return int64_t(starts_.size()); }
  bool packed() const { return !packs_.empty(); }
  int64_t skipped() const { return skipped_; }
  int64_t truncated() const { return truncated_; }

  // The unit indices of global batch `index` of `batch` rows: consecutive slots of a
  // permutation of the units that changes every epoch (from Generator(seed, epoch)).
  std::vector<int64_t> draw(uint64_t seed, int64_t index, int64_t batch) const;
  // Batch `index` of one pass over the units in the first epoch's order: each once, -1 in the slots past the last (a
  // row of padding, no target).
  std::vector<int64_t> draw_once(uint64_t seed, int64_t index, int64_t batch) const;
  // Rows [lo, hi) of the batch of units `picked` (targets kIgnoreLabel where no loss and past a
  // row's end), T the longest of all `picked` (so the same at every rank); packed, the positions
  // too (the padding after the last example counts as one more document).
  ExampleRows rows(const std::vector<int64_t>& picked, int64_t lo, int64_t hi) const;
  // The targets that carry loss in the units `picked`.
  int64_t targets(const std::vector<int64_t>& picked) const;
  // The row of the longest unit: the inputs of each of its examples, in its order (their sum is
  // the longest row a batch can have; a memory plan's rows).
  std::vector<int64_t> longest_row() const;
  // The examples of unit `u`, in their order in its row.
  std::vector<int64_t> unit(int64_t u) const {  // -1: none
    return u < 0 ? std::vector<int64_t>{} : packed() ? packs_[size_t(u)] : std::vector<int64_t>{u};
  }

 private:
  int64_t length(int64_t e) const { return lengths_[size_t(e)]; }
  int64_t inputs(int64_t u) const;  // a unit's row length: its examples' lengths - 1, summed
  TokenView ids_, labels_;
  std::vector<int64_t> starts_, lengths_, targets_;
  std::vector<std::vector<int64_t>> packs_;
  int64_t skipped_ = 0, truncated_ = 0;
  mutable int64_t epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace weft::apps
