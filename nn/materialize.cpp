#include "nn/materialize.h"

#include <unordered_set>

#include "core/fill_rule.h"

namespace weft::nn {

namespace {
template <class Fn>
void for_each_meta(Module& module, Fn&& fn) {
  std::unordered_set<TensorImpl*> seen;
  for (auto& list : {module.named_parameters(), module.named_buffers()})
    for (auto& [name, t] : list)
      if (t.device().is_meta() && seen.insert(t.impl()).second) fn(name, t);
}
}  // namespace

void materialize(Module& module, Device device) {
  WEFT_CHECK(!device.is_meta(), "nn::materialize: the target device must hold data, got {}", device.str());
  for_each_meta(module, [&](const std::string& name, const Tensor& t) {
    try {
      materialize_in_place(t, device);
    } catch (const Error& e) {
      WEFT_ERROR("nn::materialize: {} of this {} module: {}", name, module.type_name(), e.what());
    }
  });
}

std::vector<std::string> meta_tensor_names(Module& module) {
  std::vector<std::string> out;
  for_each_meta(module, [&](const std::string& name, const Tensor&) { out.push_back(name); });
  return out;
}

}  // namespace weft::nn
