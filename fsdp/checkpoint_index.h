// fsdp (internal): the index of a checkpoint directory, index.json, as text. Rank 0 writes it last, from a
// CheckpointIndex the save assembled from every rank's record; tools and loads read it back with read_checkpoint_index
// (fsdp/checkpoint.h), which validates every field. The format is described in docs/CHECKPOINTS.md.
#pragma once
#include <string>

#include "checkpoint.h"

namespace weft::fsdp {

// 2: RNG state as {seed, offset}; 3: tensors split by tensor parallelism ("split", each piece's
// "part"). A checkpoint without such tensors is written as 2; both are read.
inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr const char* kCheckpointIndexFile = "index.json";

// The file holding shard `shard`'s pieces: rank_<shard, 5 digits>.safetensors.
std::string checkpoint_shard_file(int shard);

// `index` as index.json's text (its `dir` is not written: the file lives there).
std::string checkpoint_index_json(const CheckpointIndex& index);

// "model.x" or "optim.y" entry as "<dtype> <shape>", for messages.
std::string describe(const CheckpointIndex::Entry& e);

}  // namespace weft::fsdp
