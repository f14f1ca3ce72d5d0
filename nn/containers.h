// nn: containers. ModuleList holds its children in order; Sequential also chains their forwards.
#pragma once
#include <initializer_list>

#include "module.h"

namespace weft::nn {

class ModuleList : public Module {
 public:
  ModuleList(std::initializer_list<ModulePtr> modules = {}, std::string type_name = "ModuleList");
  // Appends a child named by its position ("0", "1", ...).
  ModuleList& push_back(ModulePtr m);
  size_t size() const { return items_.size(); }
  // Out of range is an error naming the index and the size.
  const ModulePtr& operator[](size_t i) const;
  // The child as M; an error naming the index where it is not an M.
  template <class M> std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    WEFT_CHECK(m, "ModuleList::at<M>({}): the module there is a {}, not the type asked for", i, items_[i]->type_name());
    return m;
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<ModulePtr> items_;
};

class Sequential : public ModuleList {
 public:
  Sequential(std::initializer_list<ModulePtr> modules = {}) : ModuleList(modules, "Sequential") {}
  TensorList forward(const TensorList& inputs) override;
  Tensor forward(const Tensor& x) override;
};

}  // namespace weft::nn
