// fsdp: loading a checkpoint another program wrote (a Hugging Face model's safetensors files) into a model, sharded or
// not, through a name map. Each rank reads only the bytes of its own shards: a dim-0 slice of a tensor stored as the
// parameter is one byte range; of a tensor stored transposed (a Conv1D weight, [in, out]) one range per stored row.
// With the model built on the meta device and sharded first (deferred init), the load's peak is this rank's shards plus
// one tensor's piece.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "fully_shard.h"
#include "../nn/module.h"

namespace weft::fsdp {

// Where one parameter is stored: a tensor of a safetensors file, as the parameter or (2-D)
// as its transpose. Any float dtype; values are converted to the parameter's.
struct ExternalTensor {
  std::string file;
  std::string name;
  bool transposed = false;
};
using ExternalNames = std::map<std::string, ExternalTensor>;  // parameter name -> where it is

// Loads every parameter of `model` (this rank's shard when `root` shards it) from `names`, but those `keep` names,
// which keep their values (e.g. LoRA adapters a base model's files lack). Throws naming the parameter and the file when
// one is missing from the map or the file, or stored with another shape or a non-float dtype; nothing is loaded then.
// Every value is checked as it is read, while in cache: a NaN or infinity throws naming the file, tensor and element
// (what was read before it stays loaded), so the loaded parameters need no second scan.
void load_external_checkpoint(nn::Module& model, const FSDPModule* root, const ExternalNames& names,
                              const std::function<bool(const std::string&)>& keep = nullptr);
// The most bytes that load holds at once beside the model it reads into (a dtype conversion's buffer, a piece read
// whole) when the model is placed as `model` and `root` place it, on `device`: what a memory plan adds at loading.
int64_t external_load_bytes(nn::Module& model, const FSDPModule* root, const ExternalNames& names, Device device,
                            const std::function<bool(const std::string&)>& keep = nullptr);

}  // namespace weft::fsdp
