#include "fsdp/external_checkpoint.h"

#include <algorithm>
#include <memory>

#include "core/grad_mode.h"
#include "core/safetensors.h"
#include "fsdp/sharded_state_dict.h"

namespace weft::fsdp {

// Whether `dst`'s piece is read by rows straight into it (converted through read_rows_into's buffer).
static bool reads_rows(const ExternalTensor& src, const Placement& p, const Tensor& dst, Device device) {
  return !src.transposed && device == kCPU && dst.is_contiguous() && (p.whole() || p.dim == 0);
}

int64_t external_load_bytes(nn::Module& model, const FSDPModule* root, const ExternalNames& names, Device device,
                            const std::function<bool(const std::string&)>& keep) {
  int64_t most = 0;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;  // each file's header read once
  for (const auto& [name, t] : sharded_state_dict(model, root)) {
    if (keep && keep(name)) continue;
    const ExternalTensor& src = names.at(name);
    auto& reader = readers[src.file];
    if (!reader) reader = std::make_unique<SafetensorsReader>(src.file);
    const SafetensorsEntry* e = reader->find(src.name);
    WEFT_CHECK(e, "external_load_bytes: {} has no tensor \"{}\" (for parameter \"{}\")", src.file, src.name, name);
    const Shape rows = t.placement.local_shape();
    most = std::max(most, t.placement.split.split() ? shape_numel(e->shape) * int64_t(dtype_size(e->dtype))  // whole
        : reads_rows(src, t.placement, t.local, device) ? reader->rows_buffer_bytes(src.name, rows.empty() ? 1 : rows[0], t.local.dtype())
        : shape_numel(rows) * int64_t(dtype_size(e->dtype)));  // the piece, read whole
  }
  return most;
}

void load_external_checkpoint(nn::Module& model, const FSDPModule* root, const ExternalNames& names,
                              const std::function<bool(const std::string&)>& keep) {
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  auto reader = [&](const std::string& file) -> SafetensorsReader& {
    auto& r = readers[file];
    if (!r) r = std::make_unique<SafetensorsReader>(file, true);  // NaN and infinity refused as read
    return *r;
  };
  ShardedStateDict local = sharded_state_dict(model, root);
  if (keep) std::erase_if(local, [&](const auto& entry) { return keep(entry.first); });
  // Check everything before anything is read into the model.
  for (const auto& [name, t] : local) {
    auto it = names.find(name);
    WEFT_CHECK(it != names.end(), "load_external_checkpoint: parameter \"{}\" of the model has no source", name);
    const ExternalTensor& src = it->second;
    const SafetensorsEntry* e = reader(src.file).find(src.name);
    WEFT_CHECK(e != nullptr, "load_external_checkpoint: {} has no tensor \"{}\" (for parameter \"{}\")", src.file,
               src.name, name);
    Shape want = t.placement.global_shape;
    if (src.transposed) {
      WEFT_CHECK(want.size() == 2, "load_external_checkpoint: \"{}\" is {}-D: only 2-D tensors are stored transposed",
                 name, want.size());
      std::swap(want[0], want[1]);
    }
    WEFT_CHECK(e->shape == want, "load_external_checkpoint: \"{}\" in {} is shaped {}, but parameter \"{}\" needs {}{}",
               src.name, src.file, shape_str(e->shape), name, shape_str(want), src.transposed ? " (transposed)" : "");
    WEFT_CHECK(is_floating(e->dtype), "load_external_checkpoint: \"{}\" in {} is {}, not a float dtype", src.name,
               src.file, dtype_name(e->dtype));
  }
  NoGradGuard no_grad;
  for (const auto& [name, t] : local) {
    const ExternalTensor& src = names.at(name);
    const Placement& p = t.placement;
    Tensor dst = t.local;
    if (p.split.split()) {  // a tensor-parallel part: the whole tensor, cut by its placement
      Tensor whole = reader(src.file).read(src.name);
      if (src.transposed) whole = whole.transpose(0, 1);
      assemble_from_pieces(name, dst, p, {Piece{Placement::of_whole(whole.shape()), [&] { return whole; }, src.file}});
      continue;
    }
    if (reads_rows(src, p, dst, dst.device())) {
      const Shape rows = p.local_shape();  // the piece's rows of dim 0 (one for a 0-d tensor)
      reader(src.file).read_rows_into(src.name, p.whole() ? 0 : p.offset, rows.empty() ? 1 : rows[0], dst);
      continue;
    }
    Tensor piece;
    if (p.whole()) piece = reader(src.file).read(src.name);
    else piece = reader(src.file).read_slice(src.name, src.transposed ? 1 - p.dim : p.dim, p.offset, p.length);
    if (src.transposed) piece = piece.transpose(0, 1);
    dst.copy_(piece.to(dst.device()));
  }
}

}  // namespace weft::fsdp
