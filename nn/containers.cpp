#include "nn/containers.h"

namespace weft::nn {

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(m);
}

Sequential& Sequential::push_back(ModulePtr m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
  return *this;
}

TensorList Sequential::forward(const TensorList& inputs) {
  TensorList x = inputs;
  for (auto& m : items_) x = (*m)(x);
  return x;
}

Tensor Sequential::forward(const Tensor& x) { return forward(TensorList{x}).at(0); }

ModuleList::ModuleList(std::initializer_list<ModulePtr> modules) : Module("ModuleList") {
  for (auto& m : modules) push_back(m);
}

ModuleList& ModuleList::push_back(ModulePtr m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
  return *this;
}

}  // namespace weft::nn
