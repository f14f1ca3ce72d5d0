// nn: containers. Sequential chains its children's forwards; ModuleList only holds them.
#pragma once
#include <initializer_list>

#include "nn/module.h"

namespace weft::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  // Appends a child named by its position ("0", "1", ...).
  Sequential& push_back(ModulePtr m);
  TensorList forward(const TensorList& inputs) override;
  Tensor forward(const Tensor& x) override;
  size_t size() const { return items_.size(); }
  const ModulePtr& operator[](size_t i) const { return items_.at(i); }

 private:
  std::vector<ModulePtr> items_;
};

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<ModulePtr> modules);
  ModuleList& push_back(ModulePtr m);
  size_t size() const { return items_.size(); }
  const ModulePtr& operator[](size_t i) const { return items_.at(i); }
  template <class M> std::shared_ptr<M> at(size_t i) const { return std::dynamic_pointer_cast<M>(items_.at(i)); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<ModulePtr> items_;
};

}  // namespace weft::nn
