// nn: Module, the tree users build models from. A module owns named parameters, buffers
// and child modules in registration order; names are dotted paths ("blocks.3.attn.qkv.weight").
// Calling a module runs its forward pre-hooks, forward and forward hooks, each of which may
// replace the tensors passed on (FSDP schedules its communication through them).
//
// Parameters live in slots with stable addresses: a layer keeps a `Tensor&` to its slot, and
// whoever replaces the slot's tensor (set_parameter, FSDP's sharding) is seen by forward.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/node.h"
#include "activation_checkpoint.h"
#include "../core/autograd_meta.h"  // and tensor.h

namespace weft::nn {

using autograd::TensorList;
using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

// What every loader of a state dict checks first: each entry defined, each name once, and no
// NaN or infinity in a floating tensor; throws "<what>: ..." naming the entry.
void check_state_entries(const NamedTensorList& state, const std::string& what);

class Module;

// On a parameter a layer above keeps in storage of its own (fsdp's shards): what made it. Module::to won't convert it.
extern const AttachmentKey<std::string> shard_of;

// An object a layer above nn attaches to a module (fsdp's per-module state): owned by the
// module and destroyed with it, so nothing outside keys state by a module's address.
class ModuleExtension {
 public:
  virtual ~ModuleExtension() = default;
};

using ModulePtr = std::shared_ptr<Module>;
// May return replacement inputs (or nothing to keep them).
using ForwardPreHook = std::function<std::optional<TensorList>(Module&, const TensorList& inputs)>;
// May return replacement outputs (or nothing to keep them).
using ForwardHook =
    std::function<std::optional<TensorList>(Module&, const TensorList& inputs, const TensorList& outputs)>;

// Returned by hook registration; remove() unregisters (idempotent).
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (remover_) std::exchange(remover_, nullptr)();
  }

 private:
  std::function<void()> remover_;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module")
      : type_name_(std::move(type_name)), memory_owner_("forward of " + type_name_) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- forward. Single-tensor modules override forward(const Tensor&); others override
  // forward(const TensorList&). Call a module with operator() so hooks run.
  virtual TensorList forward(const TensorList& inputs);
  virtual Tensor forward(const Tensor& input);
  TensorList operator()(const TensorList& inputs);
  Tensor operator()(const Tensor& input);
  // Runs `method` (any computation of this module, e.g. a sampling loop) in place of forward,
  // with this module's forward hooks around it, so fsdp's hooks gather and reshard the
  // parameters for it as for forward (FSDP2's register_fsdp_forward_method).
  TensorList call(const std::function<TensorList(const TensorList&)>& method, const TensorList& inputs);
  // The calls of `m` in progress on this thread (each counted from before its pre-hooks to after its hooks, or until
  // it throws): 2 inside a call that calls the module again.
  static int calls_in_progress(const Module& m);

  // ---- registration. Names must be non-empty, without dots, and unique per module.
  // An undefined tensor registers an empty slot (like an optional bias set to None).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  // Replaces a direct parameter's tensor (the slot keeps its address and name).
  void set_parameter(const std::string& name, Tensor t);

  // ---- access (recursive by default; empty slots are skipped)
  NamedTensorList named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensorList named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, ModulePtr>> named_children() const;
  // All modules in the tree, pre-order, self first under the name ""; a shared module once, under
  // its first name (as named_parameters lists a tied tensor, and nn.Module.named_modules does).
  std::vector<std::pair<std::string, ModulePtr>> named_modules();
  std::vector<ModulePtr> modules();
  // Slot of a direct parameter (throws if there is none of that name).
  Tensor& parameter_slot(const std::string& name);

  // ---- state: parameters then buffers of each module, pre-order, dotted names.
  NamedTensorList state_dict() const;
  // Copies values into the existing tensors (converting dtype). strict: missing and
  // unexpected keys are errors; shapes must always match. The error lists every problem.
  void load_state_dict(const NamedTensorList& state, bool strict = true);

  // ---- modes and conversions
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Converts floating parameters and buffers in place: every existing handle (optimizers,
  // layers' slots) sees the new dtype/device.
  Module& to(DType dtype);
  Module& to(Device device);
  // fn(module) on every module of the tree once, children before their parent, self last (like nn.Module.apply).
  Module& apply(const std::function<void(Module&)>& fn);
  void zero_grad(bool set_to_none = true);

  // ---- activation checkpointing (nn/activation_checkpoint.h): each call with gradients keeps only its
  // inputs for backward and runs forward again when the backward reaches it. Hooks run once.
  // Selective: the GEMMs' and attention's outputs are kept too, and not run again.
  void set_activation_checkpointing(bool on) { checkpointing_ = on ? Checkpointing::full : Checkpointing::none; }
  void set_checkpointing(Checkpointing c) { checkpointing_ = c; }
  bool activation_checkpointing() const { return checkpointing_ != Checkpointing::none; }
  Checkpointing checkpointing() const { return checkpointing_; }

  // ---- hooks, run on every call in registration order (prepend: before those registered so far)
  HookHandle register_forward_pre_hook(ForwardPreHook hook, bool prepend = false);
  HookHandle register_forward_hook(ForwardHook hook);
  bool has_forward_hooks() const { return !hooks_->pre.empty() || !hooks_->post.empty(); }

  // ---- attached extension: one slot, set by fsdp's fully_shard. A typed read returns null
  // when the slot is empty or holds another type.
  void set_extension(std::shared_ptr<ModuleExtension> ext) { extension_ = std::move(ext); }
  const std::shared_ptr<ModuleExtension>& extension() const { return extension_; }
  template <class T>
  std::shared_ptr<T> extension_as() const {
    return std::dynamic_pointer_cast<T>(extension_);
  }

  // ---- printing: the module tree, one line per module, like PyTorch's repr.
  const std::string& type_name() const { return type_name_; }
  virtual std::string extra_repr() const { return ""; }
  std::string str() const;

 protected:
  void add_child(const std::string& name, ModulePtr m);
  bool training_ = true;
  Checkpointing checkpointing_ = Checkpointing::none;

 private:
  void check_new_name(const std::string& name, const char* what) const;
  // Throws naming the first direct parameter or buffer on the meta device.
  void check_not_meta(const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool buffers, NamedTensorList& out) const;
  NamedTensorList first_of_each(bool recurse, bool buffers) const;  // collect()'s, each tensor once
  void convert(const std::function<Tensor(const Tensor&)>& fn);
  std::string type_name_;
  std::string memory_owner_;  // names the memory its forward allocates in out-of-memory reports
  std::deque<std::pair<std::string, Tensor>> params_;  // deque: slot addresses stay valid
  std::deque<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
  // Shared with HookHandles (weakly), so removing a hook after the module died is harmless.
  struct Hooks {
    std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
    std::vector<std::pair<uint64_t, ForwardHook>> post;
    uint64_t next_id = 0;
  };
  std::shared_ptr<Hooks> hooks_ = std::make_shared<Hooks>();
  std::shared_ptr<ModuleExtension> extension_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace weft::nn
