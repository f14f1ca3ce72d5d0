#include "nn/containers.h"

namespace weft::nn {

ModuleList::ModuleList(std::initializer_list<ModulePtr> modules, std::string type_name) : Module(std::move(type_name)) {
  for (auto& m : modules) push_back(m);
}

ModuleList& ModuleList::push_back(ModulePtr m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
  return *this;
}

const ModulePtr& ModuleList::operator[](size_t i) const {
  WEFT_CHECK(i < items_.size(), "{}[{}]: index out of range for a {} of {} module{}", type_name(), i, type_name(),
             items_.size(), items_.size() == 1 ? "" : "s");
  return items_[i];
}

TensorList Sequential::forward(const TensorList& inputs) {
  TensorList x = inputs;
  for (auto& m : *this) x = (*m)(x);
  return x;
}

Tensor Sequential::forward(const Tensor& x) {
  TensorList y = forward(TensorList{x});
  WEFT_CHECK(y.size() == 1, "Sequential::forward(Tensor): its last module returned {} tensors, not one: call "
             "forward(TensorList) instead", y.size());
  return y[0];
}

}  // namespace weft::nn
