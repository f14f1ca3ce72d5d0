#include "nn/documents.h"

#include <algorithm>
#include <utility>

namespace weft::nn {

namespace {
thread_local std::shared_ptr<const Documents> meta_documents;
}  // namespace

MetaDocuments::MetaDocuments(std::shared_ptr<const Documents> d) : previous_(std::exchange(meta_documents, std::move(d))) {}
MetaDocuments::~MetaDocuments() { meta_documents = std::move(previous_); }

std::shared_ptr<const Documents> Documents::from_positions(const Tensor& positions) {
  WEFT_CHECK(positions.dim() == 2 && positions.dtype() == kInt64, "positions: expected [B, T] int64, got {}",
             tensor_desc(positions));
  if (positions.device().is_meta()) {
    const auto& d = meta_documents;
    auto spans = [&](const auto& row) { return !row.empty() && row.back().second == positions.size(1); };
    WEFT_CHECK(d && int64_t(d->rows.size()) == positions.size(0) && std::ranges::all_of(d->rows, spans),
               "positions: {} on the meta device hold no values, and no MetaDocuments gives their layout",
               tensor_desc(positions));
    return d;
  }
  const Tensor p = positions.to(kCPU).contiguous();
  const int64_t B = p.size(0), T = p.size(1);
  const int64_t* v = p.data<int64_t>();
  auto d = std::make_shared<Documents>();
  d->rows.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t want = t == 0 || v[b * T + t] == 0 ? 0 : v[b * T + t - 1] + 1;
      WEFT_CHECK(v[b * T + t] == want, "positions: row {} position {} is {}, but a document starts at 0 and counts up "
                 "by one (expected {}{})", b, t, v[b * T + t], want, want == 0 ? "" : " or 0");
      if (want == 0) d->rows[size_t(b)].push_back({t, t});
      d->rows[size_t(b)].back().second = t + 1;
    }
  }
  return d;
}

Tensor attend_per_document(const Documents& d, int64_t time_dim,
                           const std::function<Tensor(int64_t, int64_t, int64_t)>& attend) {
  std::vector<Tensor> rows;
  for (size_t b = 0; b < d.rows.size(); ++b) {
    std::vector<Tensor> parts;
    for (auto [begin, end] : d.rows[b]) parts.push_back(attend(int64_t(b), begin, end - begin));
    rows.push_back(parts.size() == 1 ? parts[0] : cat(parts, time_dim));
  }
  return rows.size() == 1 ? rows[0] : cat(rows, 0);
}

}  // namespace weft::nn
