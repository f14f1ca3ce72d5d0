// nn: packed rows. Several documents (fine-tuning examples) packed into one sequence each stay a causal sequence of
// their own: positions count from 0 at each document's first token, as Hugging Face's position_ids of packed examples
// do, and no token attends to another document's. A model called with (ids, positions) hands the layout to its
// attention layers (DocumentAttention), which then attend document by document.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "../autograd/ops.h"

namespace weft::nn {

struct Documents {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rows;  // per row, [begin, end) of each document
  // From positions [B, T] (i64, on any device): a document starts at each 0 and counts up by
  // one; anything else is an error naming the row and the position.
  static std::shared_ptr<const Documents> from_positions(const Tensor& positions);
};

// Positions on the meta device (a memory plan's step) hold no values: while a MetaDocuments is
// alive on this thread, from_positions of meta positions gives its layout, so that the planned
// step attends document by document as the run will.
class MetaDocuments {
 public:
  explicit MetaDocuments(std::shared_ptr<const Documents> d);
  ~MetaDocuments();
  MetaDocuments(const MetaDocuments&) = delete;
  MetaDocuments& operator=(const MetaDocuments&) = delete;

 private:
  std::shared_ptr<const Documents> previous_;
};

// The outputs of `attend(row, begin, length)` for every document, concatenated along `time_dim`
// within a row and the rows along dim 0: [B, ..., T, ...] as one call over the whole batch gives.
Tensor attend_per_document(const Documents& d, int64_t time_dim,
                           const std::function<Tensor(int64_t, int64_t, int64_t)>& attend);

// An attention layer that packed rows reach: the model sets the layout before its blocks run
// (null: each row one causal sequence). It stays set until the model's next forward, so that
// activation checkpointing's recompute in backward sees it.
class DocumentAttention {
 public:
  virtual ~DocumentAttention() = default;
  void set_documents(std::shared_ptr<const Documents> d) { documents_ = std::move(d); }

 protected:
  std::shared_ptr<const Documents> documents_;
};

}  // namespace weft::nn
