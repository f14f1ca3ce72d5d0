#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/autograd_meta.h"
#include "core/element_search.h"
#include "core/grad_mode.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"

namespace weft::nn {

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults)
    : groups_(std::move(groups)), name_(std::move(name)) {
  WEFT_CHECK(std::any_of(groups_.begin(), groups_.end(), [](const ParamGroup& g) { return !g.params.empty(); }),
             "{}: no parameters given (an empty parameter list, or only empty groups)", name_);
  std::map<TensorImpl*, size_t> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    for (auto& [k, v] : group.options)
      WEFT_CHECK(defaults.count(k), "{}: unknown option \"{}\" in parameter group {}", name_, k, g);
    for (auto& [k, v] : defaults) group.options.try_emplace(k, v);
    Optimizer::check_options(group.options);
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      WEFT_CHECK(p.defined() && p.is_leaf() && is_floating(p.dtype()),
                 "{}: parameters must be defined floating leaf tensors, got {}", name_, tensor_desc(p));
      WEFT_CHECK(!p.device().is_meta() || MetaComputeGuard::enabled(),  // shape propagation steps meta ones
                 "{}: parameter {} of group {} ({}) is on the meta device (deferred initialisation): materialise the "
                 "model (nn::materialize) or fsdp::fully_shard it before building the optimizer", name_, i, g,
                 tensor_desc(p));
      WEFT_CHECK(seen.emplace(p.impl(), g).second, "{}: a parameter {} appears in more than one place", name_,
                 tensor_desc(p));
    }
  }
}

void Optimizer::step_scaled(double grad_scale) {
  // NaN (clip_grad_coefficient of a NaN norm) makes every gradient NaN, as clip_grad_norm_ then step() does.
  WEFT_CHECK(!std::isinf(grad_scale) && !(grad_scale < 0), "{}: step_scaled: the gradients' scale must be finite and "
             ">= 0 (a negative one steps up the gradient), got {}", name_, grad_scale);
  NoGradGuard no_grad;
  if (grad_scale != 1 && !scales_grads())  // its step() does not read grad_scale_: the gradients scaled first
    for (auto& g : groups_)
      for (auto& p : g.params) if (p.grad().defined() && p.grad().numel() > 0) kernels::mul_scalar_(p.grad(), grad_scale);
  grad_scale_ = scales_grads() ? grad_scale : 1;
  try { step(); } catch (...) { grad_scale_ = 1; throw; }
  grad_scale_ = 1;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else p.grad().zero_();
    }
}

void Optimizer::check_options(const std::map<std::string, double>& o) const {
  for (auto& [k, v] : o) WEFT_CHECK(std::isfinite(v), "{}: option \"{}\" must be a finite number, got {}", name_, k, v);
  WEFT_CHECK(o.at("lr") >= 0, "{}: learning rate must be >= 0, got {}", name_, o.at("lr"));
}

size_t Optimizer::checked_group(size_t group) const {
  WEFT_CHECK(group < groups_.size(), "{}: no parameter group {} (have {})", name_, group, groups_.size());
  return group;
}

double Optimizer::option(size_t group, const std::string& name) const {
  auto it = groups_[checked_group(group)].options.find(name);
  WEFT_CHECK(it != groups_[group].options.end(), "{}: no option \"{}\"", name_, name);
  return it->second;
}

void Optimizer::set_option(size_t group, const std::string& name, double value) {
  option(group, name);  // the group and the name
  std::map<std::string, double> o = groups_[group].options;
  o[name] = value;
  check_options(o);
  groups_[group].options = std::move(o);
}

void Optimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_option(g, "lr", lr);
}

std::map<std::string, Tensor>& Optimizer::state_of(const Tensor& param) { return state_[param.impl()]; }

const AttachmentKey<std::string> replaced_parameter{};

void Optimizer::check_params() const {
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      const AutogradMeta* meta = p.defined() ? p.impl()->autograd.get() : nullptr;
      if (const std::string* by = meta ? meta->attached(replaced_parameter) : nullptr)
        WEFT_ERROR("{}::step: parameter {} of group {} ({}) is no longer in its module: it was replaced by {}. "
                   "This optimizer was built before that; build it after sharding, from model->parameters()",
                   name_, i, g, tensor_desc(p), *by);
      // Each check before any parameter or state changes: a step that threw part-way had left some stepped.
      if (!p.grad().defined()) continue;
      WEFT_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "{}::step: parameter {} of group {} is {}: "
                 "steps need f32 or f64 parameters (keep master weights in f32)", name_, i, g, tensor_desc(p));
      if (auto it = state_.find(p.impl()); it != state_.end())
        for (const auto& [name, t] : it->second)
          WEFT_CHECK(name == "step" || (t.shape() == p.shape() && t.dtype() == p.dtype() && t.device() == p.device()),
                     "{}::step: parameter {} of group {} ({}) has state \"{}\" {}: it must match the parameter (was "
                     "the model converted after the optimizer stepped?)", name_, i, g, tensor_desc(p), name, tensor_desc(t));
    }
}

NamedTensorList Optimizer::state_dict() const {
  NamedTensorList out;
  size_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [k, v] : groups_[g].options)
      out.emplace_back(fmt::format("param_groups.{}.{}", g, k), scalar_tensor(v, {.dtype = DType::f64}));
    out.emplace_back(fmt::format("param_groups.{}.num_params", g),
                     scalar_tensor(double(groups_[g].params.size()), {.dtype = DType::f64}));
    for (const Tensor& p : groups_[g].params) {
      auto it = state_.find(p.impl());
      if (it != state_.end())
        for (auto& [k, t] : it->second) out.emplace_back(fmt::format("state.{}.{}", index, k), t.detach());
      ++index;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensorList& state) { load_state(state, false); }
void Optimizer::load_state_dict(NamedTensorList&& state) { load_state(std::exchange(state, {}), true); }

void Optimizer::load_state(const NamedTensorList& state, bool keep) {
  check_state_entries(state, name_ + ".load_state_dict");
  std::map<std::string, Tensor> given(state.begin(), state.end());
  auto take = [&](const std::string& key) -> Tensor {
    auto it = given.find(key);
    WEFT_CHECK(it != given.end(), "{}.load_state_dict: missing key \"{}\"", name_, key);
    Tensor t = it->second;
    given.erase(it);
    return t;
  };
  std::vector<std::map<std::string, double>> options(groups_.size());
  std::map<TensorImpl*, std::map<std::string, Tensor>> new_state;
  size_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    double n = take(fmt::format("param_groups.{}.num_params", g)).item();
    WEFT_CHECK(n == double(groups_[g].params.size()),
               "{}.load_state_dict: group {} has {} parameters in the checkpoint but {} here", name_, g, n,
               groups_[g].params.size());
    for (auto& [k, v] : groups_[g].options) options[g][k] = take(fmt::format("param_groups.{}.{}", g, k)).item();
    check_options(options[g]);
    for (const Tensor& p : groups_[g].params) {
      std::string prefix = fmt::format("state.{}.", index++);
      for (auto it = given.begin(); it != given.end();) {
        if (it->first.rfind(prefix, 0) != 0) {
          ++it;
          continue;
        }
        std::string k = it->first.substr(prefix.size());
        const auto names = state_names();
        WEFT_CHECK(names.empty() || std::find(names.begin(), names.end(), k) != names.end(), "{}.load_state_dict: unknown state \"{}\" "
                   "(a parameter's state is {})", name_, it->first, fmt::join(names, ", "));
        const Tensor& t = it->second;
        bool per_element = k != "step";
        WEFT_CHECK(!per_element || t.shape() == p.shape(),
                   "{}.load_state_dict: state \"{}\" has shape {} but its parameter has shape {}", name_, it->first,
                   shape_str(t.shape()), shape_str(p.shape()));
        check_state(it->first, k, t);
        Tensor own = per_element ? t.to(p.device(), p.dtype()).contiguous() : t;
        // Kept only if nothing else holds its storage (another optimizer's live state: both would step it).
        new_state[p.impl()][k] = keep && own.storage().use_count() == 1 ? own : own.clone();
        it = given.erase(it);
      }
      std::vector<std::string> held;
      for (auto& [k, t] : new_state[p.impl()]) held.push_back(k);
      WEFT_CHECK(held.empty() || state_names().empty() || held == state_names(), "{}.load_state_dict: {}* holds "
                 "{}, not {}", name_, prefix, fmt::join(held, ", "), fmt::join(state_names(), ", "));
    }
  }
  WEFT_CHECK(given.empty(), "{}.load_state_dict: unexpected key \"{}\"", name_, given.begin()->first);
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = options[g];
  state_ = std::move(new_state);
}

void Optimizer::check_state(const std::string& key, const std::string& /*state*/, const Tensor& value) const {
  if (auto bad = find_nonfinite(value))
    WEFT_ERROR("{}: state \"{}\" holds {}: optimizer state must be finite", name_, key, bad->str());
}

// ---------------------------------------------------------------- SGD

static std::vector<ParamGroup> one_group(std::vector<Tensor> params) { return {{std::move(params), {}}}; }

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : SGD(one_group(std::move(params)), o) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer("SGD", std::move(groups),
                {{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
                 {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov ? 1.0 : 0.0}}) {
  for (auto& g : groups_) check_options(g.options);
}

void SGD::check_options(const std::map<std::string, double>& o) const {
  Optimizer::check_options(o);
  WEFT_CHECK(o.at("momentum") >= 0 && o.at("weight_decay") >= 0 && (o.at("nesterov") == 0 || o.at("nesterov") == 1),
             "SGD: momentum and weight_decay must be >= 0 and nesterov is a flag (0 or 1), got {}, {} and {}",
             o.at("momentum"), o.at("weight_decay"), o.at("nesterov"));
  WEFT_CHECK(o.at("nesterov") == 0 || (o.at("momentum") > 0 && o.at("dampening") == 0),
             "SGD: nesterov momentum requires a momentum and zero dampening");
}

void SGD::step() {
  check_params();
  MemoryOwner owner(state_owner_);
  trace::Span span("optimizer step", "optim");
  NoGradGuard no_grad;
  for (auto& g : groups_) {
    kernels::SgdStep s{g.options["lr"], g.options["momentum"], g.options["dampening"], g.options["weight_decay"],
                       g.options["nesterov"] != 0, false, grad_scale_};
    for (Tensor& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor buf;
      if (s.momentum != 0) {
        auto& st = state_of(p);
        s.first = !st.count("momentum_buffer");
        if (s.first) st["momentum_buffer"] = empty_like(p);
        buf = st["momentum_buffer"];
      }
      Tensor work = p.is_contiguous() ? p : p.contiguous();  // a strided leaf (a transposed one) as torch steps it
      kernels::sgd_step_(work, grad.contiguous(), buf, s);
      if (!work.is_same(p)) p.copy_(work);
      ++p.storage()->version;  // written in place: a graph that read p cannot backward any more
    }
  }
}

// ---------------------------------------------------------------- Adam / AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions o) : Adam(one_group(std::move(params)), o) {}
Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o) : Adam("Adam", std::move(groups), o, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions o, bool decoupled)
    : Optimizer(std::move(name), std::move(groups),
                {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                 {"weight_decay", o.weight_decay}}),
      decoupled_(decoupled) {
  for (auto& g : groups_) check_options(g.options);
}

void Adam::check_options(const std::map<std::string, double>& o) const {
  Optimizer::check_options(o);
  const double b1 = o.at("beta1"), b2 = o.at("beta2");
  WEFT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "{}: betas must be in [0, 1), got ({}, {})", name_, b1, b2);
  WEFT_CHECK(o.at("eps") >= 0 && o.at("weight_decay") >= 0, "{}: eps and weight_decay must be >= 0", name_);
}

void Adam::check_state(const std::string& key, const std::string& state, const Tensor& value) const {
  Optimizer::check_state(key, state, value);
  // Second moments are running means of squares, and the step a count: never negative.
  if (state == "exp_avg_sq" || state == "max_exp_avg_sq" || state == "step")
    if (value.numel() > 0 && min(value).item() < 0)  // a scan first: find_element copies slices as f64
      if (auto bad = find_element(value, [](double v) { return v < 0; }))
        WEFT_ERROR("{}: state \"{}\" holds {}: {} cannot be negative", name_, key, bad->str(), state);
  if (state == "step")
    WEFT_CHECK(value.numel() == 1 && value.item() == std::floor(value.item()) && value.item() < 0x1p53, "{}: state "
               "\"{}\" is {}: a step count is one whole number below 2^53", name_, key,
               value.numel() == 1 ? fmt::format("{}", value.item()) : tensor_desc(value));
}

void Adam::step() {
  check_params();
  MemoryOwner owner(state_owner_);
  trace::Span span("optimizer step", "optim");
  NoGradGuard no_grad;
  for (auto& g : groups_) {
    for (Tensor& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      auto& st = state_of(p);
      if (!st.count("step")) {
        st["step"] = scalar_tensor(0, {.dtype = DType::f32, .device = kCPU});  // a host count, as in PyTorch
        st["exp_avg"] = zeros_like(p);
        st["exp_avg_sq"] = zeros_like(p);
      }
      // The step count is kept as a f32 tensor, as PyTorch does, so state dicts look alike.
      int64_t step = int64_t(st["step"].item()) + 1;
      st["step"].fill_(double(step));
      Tensor work = p.is_contiguous() ? p : p.contiguous();  // a strided leaf (a transposed one) as torch steps it
      kernels::adam_step_(work, grad.contiguous(), st["exp_avg"], st["exp_avg_sq"],
                          {g.options["lr"], g.options["beta1"], g.options["beta2"], g.options["eps"],
                           g.options["weight_decay"], step, decoupled_, grad_scale_});
      if (!work.is_same(p)) p.copy_(work);
      ++p.storage()->version;
    }
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o) : AdamW(one_group(std::move(params)), o) {}
AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions o)
    : Adam("AdamW", std::move(groups), {o.lr, o.beta1, o.beta2, o.eps, o.weight_decay}, true) {}

}  // namespace weft::nn
