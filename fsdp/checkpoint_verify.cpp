// fsdp: checkpoint tools that need no model and no other rank: verify_checkpoint checks a directory against its index,
// consolidate_checkpoint writes the whole model to one file (declared in fsdp/checkpoint.h).
#include "core/element_search.h"
#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_index.h"
#include "fsdp/checkpoint_pieces.h"

namespace weft::fsdp {

VerifyReport verify_checkpoint(const std::string& path) {
  CheckpointIndex index = read_checkpoint_index(path);
  PieceSource source(index, false);
  VerifyReport report;
  for (auto& f : index.files) {
    source.check_file(f);
    source.open(f.name);  // refuses a tensor the index does not list in the file
    ++report.files;
    report.bytes += f.bytes;
  }
  for (auto& e : index.tensors) {
    for (auto& s : e.shards) {  // read_checkpoint_index has checked that they tile the tensor
      const Placement pl = e.placement(s);
      const SafetensorsEntry* se = source.open(s.file).find(e.key);
      WEFT_CHECK(se, "checkpoint: {} has no tensor \"{}\" although the index lists a piece of it there",
                 index.file_path(s.file), e.key);
      WEFT_CHECK(se->dtype == e.dtype && se->shape == pl.local_shape(), "checkpoint: {}: \"{}\" is {} {} but the "
                 "index needs {} {} ({})", index.file_path(s.file), e.key, safetensors_dtype_name(se->dtype),
                 shape_str(se->shape), safetensors_dtype_name(e.dtype), shape_str(pl.local_shape()), pl.str());
      if (auto bad = find_nonfinite(source.read(s.file, e)))
        WEFT_ERROR("checkpoint: {}: \"{}\" holds {} (element of this file's piece): the checkpoint was written from "
                   "state that is not finite", index.file_path(s.file), e.key, bad->str());
    }
    ++report.tensors;
  }
  return report;
}

void consolidate_checkpoint(const std::string& path, const std::string& out, bool with_optimizer,
                            bool allow_nonfinite) {
  CheckpointIndex index = read_checkpoint_index(path);
  PieceSource source(index, true);
  std::vector<SafetensorsEntry> entries;
  std::vector<const CheckpointIndex::Entry*> from;
  for (auto& e : index.tensors) {
    bool model = e.key.rfind("model.", 0) == 0;
    if (!model && !with_optimizer) continue;
    entries.push_back({model ? e.key.substr(6) : e.key, e.dtype, e.shape});
    from.push_back(&e);
  }
  for (auto& [name, target] : index.training.aliases) {
    const CheckpointIndex::Entry* e = index.find("model." + target);
    WEFT_CHECK(e, "checkpoint: {}: alias \"{}\" names \"{}\", which the checkpoint does not hold", index.dir, name,
               target);
    entries.push_back({name, e->dtype, e->shape});
    from.push_back(e);
  }
  Metadata meta(index.training.app.begin(), index.training.app.end());
  meta["step"] = std::to_string(index.training.step);
  meta["weft_version"] = index.weft_version;
  save_safetensors(out, entries, [&](size_t i) {
    Tensor t = source.full(*from[i]);
    if (auto bad = allow_nonfinite ? std::nullopt : find_nonfinite(t))
      WEFT_ERROR("checkpoint: {}: \"{}\" holds {}; nothing was written (allow it explicitly to copy it anyway)",
                 index.dir, from[i]->key, bad->str());
    return t;
  }, meta, /*replace=*/false);  // an OUT made since the caller checked it stays
}

}  // namespace weft::fsdp
