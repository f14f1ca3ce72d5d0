// tp: where a parameter that tensor parallelism split sits in the whole tensor it was cut from, so that checkpoints
// (fsdp/checkpoint.h) can write and read the pieces of any (dp, tp) layout. The split is carried by the parameter's
// PartialReduction ([Note: partial reductions]), which tp attaches when it splits: fully_shard reads it from the
// parameter it shards and keeps it with the shard (fsdp::ShardInfo::split).
#pragma once
#include <memory>

#include "../core/partial_reduction.h"
#include "../core/shape.h"
#include "../dist/process_group.h"

namespace weft::tp {

// Along `dim` the whole tensor is `chunks` equal blocks, each cut into `parts` (the group's
// size); this part holds piece `index` of every block, joined in block order (one block for a
// plain colwise or rowwise split; GPT-2's fused q | k | v is three). dim -1: not split.
struct Split {
  int64_t dim = -1, chunks = 1, parts = 1, index = 0;
  bool split() const { return dim >= 0; }
  Shape whole_shape(Shape part_shape) const;  // the part's shape with `dim` times parts
  bool operator==(const Split&) const = default;
};

// Splits along `dim` over `group` (this rank's index): the reduction tp attaches to the part
// (a sum or max over the group, as dist::reduction_over), carrying the split.
std::shared_ptr<const PartialReduction> split_reduction(const dist::ProcessGroupPtr& group, int64_t dim,
                                                        int64_t chunks);

// The split `reduction` (a parameter's) carries, and the group holding the other parts: {} and
// null for any other reduction (none, or fsdp's over its shards).
Split split_of(const std::shared_ptr<const PartialReduction>& reduction);
dist::ProcessGroupPtr split_group(const std::shared_ptr<const PartialReduction>& reduction);

}  // namespace weft::tp
