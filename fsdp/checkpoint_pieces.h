// fsdp (internal): reading the pieces of a checkpoint's tensors from its shard files. Each
// file is opened once and, when asked, checked against the index (size and sha256) before its
// first read; load_checkpoint, verify_checkpoint and consolidate_checkpoint all read through it.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/safetensors.h"
#include "checkpoint.h"

namespace weft::fsdp {

class PieceSource {
 public:
  PieceSource(const CheckpointIndex& index, bool verify) : index_(index), verify_(verify) {}

  // Throws unless the file exists with the size and sha256 the index records.
  void check_file(const CheckpointIndex::File& f);
  SafetensorsReader& open(const std::string& file);
  // The piece of `e` stored in `file`, checked against the index's dtype.
  Tensor read(const std::string& file, const CheckpointIndex::Entry& e);
  // Every piece of `e`, read on demand (for assemble_from_pieces).
  std::vector<Piece> pieces(const CheckpointIndex::Entry& e);
  // A tensor's full value.
  Tensor full(const CheckpointIndex::Entry& e);

 private:
  const CheckpointIndex& index_;
  bool verify_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

}  // namespace weft::fsdp
