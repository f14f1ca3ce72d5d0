#include "nn/module.h"

#include "nn/activation_checkpoint.h"

#include <algorithm>
#include <ostream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/autograd_meta.h"
#include "core/element_search.h"
#include "core/grad_mode.h"

namespace weft::nn {

TensorList Module::forward(const TensorList& inputs) {
  WEFT_CHECK(inputs.size() == 1, "{}: forward takes one tensor, got {}", type_name_, inputs.size());
  return {forward(inputs[0])};
}

Tensor Module::forward(const Tensor&) {
  WEFT_ERROR("{}: forward is not implemented for this module", type_name_);
}

TensorList Module::operator()(const TensorList& inputs) {
  return call([this](const TensorList& x) { return forward(x); }, inputs);
}

namespace {
// Hooks run once, outside the checkpointed region: the recompute puts back the parameters the pre-hooks set for this
// call (tp's views, whose backward sums the gradients; fsdp's unsharded ones), whatever the slots hold by then.
CheckpointFn with_call_parameters(const CheckpointFn& method, std::deque<std::pair<std::string, Tensor>>& params) {
  auto set = std::make_shared<std::vector<std::pair<Tensor*, Tensor>>>();
  for (auto& [n, t] : params) set->emplace_back(&t, t);
  return [method, set, first = std::make_shared<bool>(true)](const TensorList& x) {
    if (std::exchange(*first, false)) return method(x);
    struct Swap {  // the call's parameters in the slots while it lives, the slots' own held in `set`
      std::vector<std::pair<Tensor*, Tensor>>& set;
      void swap() { for (auto& [slot, t] : set) std::swap(*slot, t); }
      ~Swap() { swap(); }
    } in{*set};
    in.swap();
    return method(x);
  };
}

thread_local std::vector<const Module*> t_calls;  // the calls in progress, innermost last
}  // namespace

int Module::calls_in_progress(const Module& m) { return int(std::ranges::count(t_calls, &m)); }

TensorList Module::call(const std::function<TensorList(const TensorList&)>& method, const TensorList& inputs) {
  t_calls.push_back(this);
  struct Pop { ~Pop() { t_calls.pop_back(); } } pop;  // also when the call throws
  TensorList in = inputs;
  // Iterate over copies: a hook may register or remove hooks.
  auto pre = hooks_->pre;
  for (auto& [id, hook] : pre)
    if (auto r = hook(*this, in)) in = std::move(*r);
  if (!MetaComputeGuard::enabled()) check_not_meta("forward");
  TensorList out;
  {
    MemoryOwner owner(memory_owner_);
    out = checkpointing_ != Checkpointing::none
              ? checkpoint(with_call_parameters(method, params_), in, checkpointing_ == Checkpointing::selective,
                           parameters())
              : method(in);
  }
  auto post = hooks_->post;
  for (auto& [id, hook] : post)
    if (auto r = hook(*this, in, out)) out = std::move(*r);
  return out;
}

Tensor Module::operator()(const Tensor& input) {
  TensorList out = (*this)(TensorList{input});
  WEFT_CHECK(out.size() == 1, "{}: called with one tensor but forward returned {}", type_name_, out.size());
  return out[0];
}

void Module::check_new_name(const std::string& name, const char* what) const {
  WEFT_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "{}: {} name \"{}\" must be non-empty and contain no '.'", type_name_, what, name);
  auto taken = [&](const auto& list) { return std::ranges::any_of(list, [&](auto& e) { return e.first == name; }); };
  WEFT_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_),
             "{}: name \"{}\" is already registered", type_name_, name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  if (t.defined()) {
    t = t.is_leaf() ? t : t.detach();
    if (requires_grad) t.set_requires_grad(true);
    if (MemoryOwner::wanted() && t.storage() && t.storage()->data_or_null())
      allocator_for(t.device()).label(t.storage()->data_or_null(), fmt::format("parameter '{}' of {}", name, type_name_));
  }
  params_.emplace_back(name, std::move(t));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "buffer");
  buffers_.emplace_back(name, std::move(t));
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, ModulePtr m) {
  check_new_name(name, "module");
  WEFT_CHECK(m != nullptr, "{}: child module \"{}\" is null", type_name_, name);
  auto holds_this = [this](auto& self, const Module& n) -> bool {  // the tree below m, acyclic so far
    return &n == this || std::any_of(n.children_.begin(), n.children_.end(), [&](auto& c) { return self(self, *c.second); });
  };
  WEFT_CHECK(!holds_this(holds_this, *m), "{}: child module \"{}\" is this module or holds it: a module tree cannot "
             "contain itself", type_name_, name);
  children_.emplace_back(name, std::move(m));
}

Tensor& Module::parameter_slot(const std::string& name) {
  for (auto& [n, t] : params_)
    if (n == name) return t;
  WEFT_ERROR("{}: no parameter named \"{}\"", type_name_, name);
}

void Module::set_parameter(const std::string& name, Tensor t) { parameter_slot(name) = std::move(t); }

void Module::collect(const std::string& prefix, bool recurse, bool buffers, NamedTensorList& out) const {
  for (auto& [n, t] : buffers ? buffers_ : params_)
    if (t.defined()) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (auto& [n, child] : children_) child->collect(prefix + n + ".", true, buffers, out);
}

// A tensor registered twice (tied weights, a shared module's buffer) once, under its first name.
NamedTensorList Module::first_of_each(bool recurse, bool buffers) const {
  NamedTensorList all;
  collect("", recurse, buffers, all);
  std::unordered_set<TensorImpl*> seen;
  std::erase_if(all, [&](const auto& e) { return !seen.insert(e.second.impl()).second; });
  return all;
}

NamedTensorList Module::named_parameters(bool recurse) const { return first_of_each(recurse, false); }

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensorList Module::named_buffers(bool recurse) const { return first_of_each(recurse, true); }

std::vector<std::pair<std::string, ModulePtr>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules() {
  std::vector<std::pair<std::string, ModulePtr>> out;
  // Modules not owned by a shared_ptr (e.g. on the stack) are listed with a non-owning handle.
  ModulePtr self = weak_from_this().lock();
  if (!self) self = ModulePtr(this, [](Module*) {});
  out.emplace_back("", self);
  std::unordered_set<Module*> seen{this};  // a module registered twice (shared) once, under its first name
  for (auto& [n, child] : children_)
    for (auto& [sub, m] : child->named_modules())
      if (seen.insert(m.get()).second) out.emplace_back(sub.empty() ? n : n + "." + sub, m);
  return out;
}

std::vector<ModulePtr> Module::modules() {
  std::vector<ModulePtr> out;
  for (auto& [n, m] : named_modules()) out.push_back(m);
  return out;
}

void Module::check_not_meta(const char* what) const {
  for (auto* list : {&params_, &buffers_})
    for (auto& [n, t] : *list)
      WEFT_CHECK(!t.defined() || !t.device().is_meta(),
                 "{}: {} of this {} module: {} '{}' is on the meta device (built under DefaultDeviceGuard(Device::meta()), "
                 "deferred initialisation) and has no values yet; materialise the module first (nn::materialize(module, "
                 "device)) or fsdp::fully_shard it", type_name_, what, type_name_, list == &params_ ? "parameter" : "buffer",
                 n);
}

NamedTensorList Module::state_dict() const {
  check_not_meta("state_dict");
  NamedTensorList out;
  for (auto& [n, t] : params_)
    if (t.defined()) out.emplace_back(n, t.detach());
  for (auto& [n, t] : buffers_)
    if (t.defined()) out.emplace_back(n, t.detach());
  for (auto& [cn, child] : children_)
    for (auto& [n, t] : child->state_dict()) out.emplace_back(cn + "." + n, t);
  return out;
}

void check_state_entries(const NamedTensorList& state, const std::string& what) {
  std::unordered_set<std::string> seen;
  for (auto& [n, t] : state) {
    WEFT_CHECK(t.defined(), "{}: \"{}\" is an undefined tensor", what, n);
    WEFT_CHECK(seen.insert(n).second, "{}: \"{}\" is given twice", what, n);
    if (auto bad = find_nonfinite(t)) WEFT_ERROR("{}: \"{}\" holds {}", what, n, bad->str());
  }
}

void Module::load_state_dict(const NamedTensorList& state, bool strict) {
  for (auto& [n, m] : named_modules()) m->check_not_meta("load_state_dict");
  check_state_entries(state, "load_state_dict for " + type_name_);
  std::unordered_map<std::string, const Tensor*> given;
  for (auto& [n, t] : state) given[n] = &t;
  std::vector<std::string> missing, mismatched;
  std::unordered_set<std::string> used;
  auto own = state_dict();
  for (auto& [n, t] : own) {
    auto it = given.find(n);
    if (it == given.end()) {
      missing.push_back(n);
      continue;
    }
    used.insert(n);
    if (it->second->shape() != t.shape())
      mismatched.push_back(fmt::format("{} (checkpoint {}, model {})", n, shape_str(it->second->shape()),
                                       shape_str(t.shape())));
  }
  std::vector<std::string> unexpected;
  for (auto& [n, t] : state)
    if (!used.count(n)) unexpected.push_back(n);
  std::string problems;
  if (!mismatched.empty()) problems += fmt::format(" shape mismatch: {};", fmt::join(mismatched, ", "));
  if (const auto m = mismatched.empty() ? decltype(named_modules())() : named_modules();  // listed only on a mismatch
      std::any_of(m.begin(), m.end(), [](auto& e) { return e.second->extension(); }))
    problems += " the module is sharded (fsdp::fully_shard): its parameters are this rank's shards; load a full state "
                "dict with fsdp::load_full_state_dict (and take one with fsdp::full_state_dict);";
  if (strict && !missing.empty()) problems += fmt::format(" missing keys: {};", fmt::join(missing, ", "));
  if (strict && !unexpected.empty()) problems += fmt::format(" unexpected keys: {};", fmt::join(unexpected, ", "));
  WEFT_CHECK(problems.empty(), "load_state_dict for {}:{}", type_name_, problems);
  NoGradGuard no_grad;
  for (auto& [n, t] : own)
    if (auto it = given.find(n); it != given.end()) Tensor(t).copy_(*it->second);
}

Module& Module::train(bool on) {
  training_ = on;
  for (auto& [n, child] : children_) child->train(on);
  return *this;
}

void Module::convert(const std::function<Tensor(const Tensor&)>& fn) {
  // Swap the converted data into the existing TensorImpl so every handle follows.
  auto swap_in = [&](Tensor& t) {
    if (!t.defined() || !is_floating(t.dtype())) return;
    Tensor c = fn(t.detach());
    if (c.is_same(t) || (c.storage() == t.storage() && c.dtype() == t.dtype())) return;
    TensorImpl* impl = t.impl();
    ++impl->storage->version;  // a graph that saved the old values refuses its backward
    impl->storage = c.storage();
    impl->shape = c.shape(), impl->strides = c.strides();
    impl->offset = c.offset();
    impl->dtype = c.dtype();
    if (impl->autograd) impl->autograd->grad = Tensor(), impl->autograd->grad_accumulator.reset();  // a new graph's own
  };
  std::unordered_set<TensorImpl*> done;
  for (auto& [n, t] : params_)
    if (t.defined() && done.insert(t.impl()).second) swap_in(t);
  for (auto& [n, t] : buffers_) swap_in(t);
  for (auto& [n, child] : children_) child->convert(fn);
}

const AttachmentKey<std::string> shard_of{};
static void check_shards_kept(const Module& m, const std::string& to, const auto& changes) {
  for (auto& [n, t] : m.named_parameters())
    if (const std::string* by = t.impl()->autograd ? t.impl()->autograd->attached(shard_of) : nullptr; by && changes(t))
      WEFT_ERROR("{}.to({}): parameter '{}' is {}: its group's buffers hold it and a conversion would leave "
                 "them behind; convert before fully_shard", m.type_name(), to, n, *by);
}

Module& Module::to(DType dtype) {
  WEFT_CHECK(is_floating(dtype), "{}.to: modules take floating dtypes only, got {}", type_name_, dtype_name(dtype));
  check_shards_kept(*this, std::string(dtype_name(dtype)), [dtype](const Tensor& t) { return t.dtype() != dtype; });
  convert([dtype](const Tensor& t) { return t.to(dtype).contiguous(); });
  return *this;
}

Module& Module::to(Device device) {
  check_shards_kept(*this, device.str(), [device](const Tensor& t) { return t.device() != device; });
  convert([device](const Tensor& t) { return t.to(device); });
  return *this;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  std::unordered_set<Module*> seen{this};  // a shared module once, at its first place
  std::function<void(Module&)> visit = [&](Module& m) {
    for (auto& [n, child] : m.children_)
      if (seen.insert(child.get()).second) visit(*child);
    fn(m);
  };
  visit(*this);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& t : parameters()) {
    Tensor g = t.grad();
    if (!g.defined()) continue;
    if (set_to_none) t.set_grad(Tensor());
    else g.zero_();
  }
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook, bool prepend) {
  uint64_t id = hooks_->next_id++;
  hooks_->pre.emplace(prepend ? hooks_->pre.begin() : hooks_->pre.end(), id, std::move(hook));
  return HookHandle([weak = std::weak_ptr<Hooks>(hooks_), id] {
    if (auto h = weak.lock()) std::erase_if(h->pre, [id](auto& e) { return e.first == id; });
  });
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  uint64_t id = hooks_->next_id++;
  hooks_->post.emplace_back(id, std::move(hook));
  return HookHandle([weak = std::weak_ptr<Hooks>(hooks_), id] {
    if (auto h = weak.lock()) std::erase_if(h->post, [id](auto& e) { return e.first == id; });
  });
}

std::string Module::str() const {
  std::string head = type_name_ + "(" + extra_repr();
  if (children_.empty()) return head + ")";
  std::ostringstream os;
  os << head << "\n";
  for (auto& [n, child] : children_) {  // each child's lines indented by two spaces
    std::string sub = child->str();
    for (size_t i = sub.find('\n'); i != std::string::npos; i = sub.find('\n', i + 1)) sub.insert(i + 1, "  ");
    os << "  (" << n << "): " << sub << "\n";
  }
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace weft::nn
