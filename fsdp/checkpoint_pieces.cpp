#include "fsdp/checkpoint_pieces.h"

#include <filesystem>
#include <set>

#include "core/sha256.h"
#include "fsdp/checkpoint_index.h"

namespace weft::fsdp {

namespace fs = std::filesystem;

void PieceSource::check_file(const CheckpointIndex::File& f) {
  std::string path = index_.file_path(f.name);
  WEFT_CHECK(WEFT_FS(fs::is_regular_file(path)), "checkpoint: {} is missing (listed in {}/{})", path, index_.dir,
             kCheckpointIndexFile);
  uint64_t size = WEFT_FS(fs::file_size(path));
  WEFT_CHECK(size == f.bytes, "checkpoint: {} is {} bytes but the index records {}: the file is truncated or was "
             "changed", path, size, f.bytes);
  std::string sha = sha256_file(path);
  WEFT_CHECK(sha == f.sha256, "checkpoint: sha256 of {} is {} but the index records {}: the file is corrupt or was "
             "changed", path, sha, f.sha256);
}

SafetensorsReader& PieceSource::open(const std::string& file) {
  auto it = readers_.find(file);
  if (it != readers_.end()) return *it->second;
  if (verify_)
    for (auto& f : index_.files)
      if (f.name == file) check_file(f);
  auto reader = std::make_unique<SafetensorsReader>(index_.file_path(file));
  // A tensor the index does not place in this file is not the checkpoint the index describes
  // (a file from another save, or an edited one): refuse it rather than ignore it.
  std::set<std::string> listed;
  for (auto& e : index_.tensors)
    for (auto& sh : e.shards)
      if (sh.file == file) listed.insert(e.key);
  for (auto& e : reader->entries())
    WEFT_CHECK(listed.count(e.name), "checkpoint: {} holds \"{}\", which the index does not list there",
               index_.file_path(file), e.name);
  return *readers_.emplace(file, std::move(reader)).first->second;
}

Tensor PieceSource::read(const std::string& file, const CheckpointIndex::Entry& e) {
  std::string path = index_.file_path(file);
  try {
    SafetensorsReader& r = open(file);
    const SafetensorsEntry* se = r.find(e.key);
    WEFT_CHECK(se, "the file has no tensor \"{}\" although the index lists a piece of it there", e.key);
    WEFT_CHECK(se->dtype == e.dtype, "\"{}\" is {} in the file but {} in the index", e.key,
               safetensors_dtype_name(se->dtype), safetensors_dtype_name(e.dtype));
    return r.read(e.key);
  } catch (const Error& err) {
    WEFT_ERROR("checkpoint: cannot read \"{}\" from {}: {}", e.key, path, err.what());
  }
}

std::vector<Piece> PieceSource::pieces(const CheckpointIndex::Entry& e) {
  std::vector<Piece> out;
  for (auto& s : e.shards) {
    out.push_back({e.placement(s), [this, file = s.file, &e] { return read(file, e); }, index_.file_path(s.file)});
  }
  return out;
}

Tensor PieceSource::full(const CheckpointIndex::Entry& e) {
  Tensor t = empty(e.shape, {.dtype = e.dtype});
  assemble_from_pieces(e.key, t, Placement::of_whole(e.shape), pieces(e));
  return t;
}

}  // namespace weft::fsdp
