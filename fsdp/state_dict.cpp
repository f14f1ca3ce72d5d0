#include "fsdp/state_dict.h"

#include <optional>

#include "fsdp/state.h"

namespace weft::fsdp {
namespace {

// "state.<i>.<name>" holding one value per element of parameter i (every state but "step").
std::optional<size_t> per_element_state(const std::string& key) {
  if (key.rfind("state.", 0) != 0) return std::nullopt;
  size_t dot = key.find('.', 6);
  if (dot == std::string::npos || key.substr(dot + 1) == "step") return std::nullopt;
  return size_t(std::stoull(key.substr(6, dot - 6)));
}

}  // namespace

nn::NamedTensorList full_state_dict(nn::Module& model, const FSDPModule& root) {
  nn::NamedTensorList out;
  for (auto& [name, t] : model.named_parameters()) out.emplace_back(name, root.full_tensor(name));
  for (auto& [name, t] : model.named_buffers()) out.emplace_back(name, t);
  return out;
}

nn::NamedTensorList full_optimizer_state_dict(const nn::Optimizer& opt, const std::vector<std::string>& names,
                                              const FSDPModule& root) {
  auto local = opt.state_dict();
  // Every rank must gather the same tensors in the same order; they differ only if some
  // shard never had a gradient. The all-reduce gives every rank the same verdict.
  auto group = root.state()->mesh->group(root.state()->mesh->ndim() - 1);
  Tensor n = from_vector({double(local.size()), -double(local.size())}, {2}, {.dtype = kFloat64});
  group->all_reduce(n, dist::ReduceOp::max)->wait();
  WEFT_CHECK(n.data<double>()[0] == -n.data<double>()[1],
             "fsdp: the ranks hold different optimizer states ({} to {} tensors); cannot gather a full state dict",
             -n.data<double>()[1], n.data<double>()[0]);
  nn::NamedTensorList out;
  for (auto& [key, t] : local) {
    auto i = per_element_state(key);
    WEFT_CHECK(!i || *i < names.size(), "fsdp: optimizer state \"{}\" names parameter {} of {}", key, i.value_or(0),
               names.size());
    out.emplace_back(key, i ? root.gather_shard(names[*i], t) : t);
  }
  return out;
}

nn::NamedTensorList local_optimizer_state_dict(const nn::NamedTensorList& full, const std::vector<std::string>& names,
                                               const FSDPModule& root) {
  nn::NamedTensorList out;
  for (auto& [key, t] : full) {
    auto i = per_element_state(key);
    if (!i) {
      out.emplace_back(key, t);
      continue;
    }
    WEFT_CHECK(*i < names.size(), "fsdp: checkpoint state \"{}\" names parameter {} of {}", key, *i, names.size());
    auto info = root.shard_info(names[*i]);
    WEFT_CHECK(t.shape() == info.global_shape, "fsdp: checkpoint state \"{}\" has shape {} but {} is {}", key,
               shape_str(t.shape()), names[*i], shape_str(info.global_shape));
    out.emplace_back(key, t.narrow(info.shard_dim, info.offset, info.length).contiguous());
  }
  return out;
}

}  // namespace weft::fsdp
