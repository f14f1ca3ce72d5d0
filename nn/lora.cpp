#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/grad_mode.h"
#include "nn/init.h"
#include "nn/layers.h"

namespace weft::nn {

void check_lora_values(const LoRAOptions& o, const std::string& where) {
  WEFT_CHECK(o.rank >= 1, "{}: rank must be >= 1 (peft's \"r\"), got {}", where, o.rank);
  WEFT_CHECK(std::isfinite(o.alpha) && o.alpha > 0, "{}: alpha must be a finite number > 0 (peft's "
             "\"lora_alpha\"), got {}", where, o.alpha);
  WEFT_CHECK(o.dropout >= 0 && o.dropout < 1, "{}: dropout must be in [0, 1) (peft's \"lora_dropout\"), got {}", where,
             o.dropout);
}

namespace {

bool names_target(const std::string& module_name, const std::string& target) {
  return module_name == target ||
         (module_name.size() > target.size() && module_name.ends_with(target) &&
          module_name[module_name.size() - target.size() - 1] == '.');
}

// The last parts of the Linear modules' names ("q_proj, k_proj, ..."): what a target can name.
std::string linear_names(const std::vector<std::pair<std::string, ModulePtr>>& modules) {
  std::vector<std::string> names;
  for (auto& [name, m] : modules)
    if (const std::string last = name.substr(name.rfind('.') + 1); dynamic_cast<Linear*>(m.get()) &&
        std::find(names.begin(), names.end(), last) == names.end()) names.push_back(last);
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

void check_options(Module& model, const LoRAOptions& o) {
  check_lora_values(o, "apply_lora");
  WEFT_CHECK(!o.targets.empty(), "apply_lora: no target modules given (e.g. q_proj, v_proj)");
  for (auto& [name, m] : model.named_modules()) {
    WEFT_CHECK(!m->extension(), "apply_lora: fully_shard was applied to '{}' already; apply LoRA to the model first, "
               "then fully_shard", name.empty() ? "the model" : name);
    auto* l = dynamic_cast<Linear*>(m.get());  // a tensor-parallel split: its adapter would be drawn whole, unsplit
    WEFT_CHECK(!l || !partial_reduction(l->weight), "apply_lora: '{}' is split over ranks already (tensor parallel); "
               "apply LoRA to the model first, then split it", name);
  }
}

// The adapter's modules, made on the adapted weight's device and in its dtype; on the meta
// device with their init rules recorded, as the model's own were.
struct Adapter {
  std::shared_ptr<Linear> a, b;
  std::shared_ptr<Dropout> dropout;
};
Adapter make_adapter(const Linear& base, const LoRAOptions& o, Generator* gen) {
  const Tensor& w = base.weight;
  std::optional<DefaultDeviceGuard> on_meta;
  if (w.device().is_meta()) on_meta.emplace(w.device());
  Adapter ad{std::make_shared<Linear>(base.in_features, o.rank, false, gen),
             std::make_shared<Linear>(o.rank, base.out_features, false, gen), std::make_shared<Dropout>(o.dropout)};
  init::zeros_(ad.b->weight);
  for (Linear* l : {ad.a.get(), ad.b.get()}) {
    if (!w.device().is_meta() && l->weight.device() != w.device()) l->to(w.device());
    if (l->weight.dtype() != w.dtype()) l->to(w.dtype());
  }
  return ad;
}

Linear& adaptable(const std::string& name, Module& m) {
  auto* base = dynamic_cast<Linear*>(&m);
  WEFT_CHECK(base, "apply_lora: target module '{}' is a {}; only Linear modules can be adapted", name, m.type_name());
  for (auto& child : m.named_children())
    WEFT_CHECK(child.first != "lora_A", "apply_lora: '{}' has an adapter already", name);
  return *base;
}

void adapt(Linear& m, const LoRAOptions& o, Generator* gen) {
  Adapter ad = make_adapter(m, o, gen);
  m.register_module("lora_A", ad.a);
  m.register_module("lora_B", ad.b);
  m.register_module("lora_dropout", ad.dropout);
  m.low_rank = Linear::LowRank{ad.a, ad.b, ad.dropout, o.scale()};  // forward adds the adapter's term
}

}  // namespace

std::vector<std::string> apply_lora(Module& model, const LoRAOptions& opts, Generator* gen) {
  check_options(model, opts);
  auto modules = model.named_modules();
  std::vector<std::string> adapted;
  std::vector<Linear*> chosen;
  for (const std::string& t : opts.targets) {
    bool found = false;
    for (auto& [name, m] : modules) {
      if (!names_target(name, t)) continue;
      found = true;
      if (std::find(adapted.begin(), adapted.end(), name) != adapted.end()) continue;  // named by two targets
      chosen.push_back(&adaptable(name, *m));
      adapted.push_back(name);
    }
    WEFT_CHECK(found, "apply_lora: target '{}' names no module of the model (its Linear modules: {})", t,
               linear_names(modules));
  }
  // Everything checked: the base is frozen, then the adapters (which train) are made.
  for (auto& [name, m] : modules)
    for (auto& [pname, p] : m->named_parameters(false)) m->parameter_slot(pname).set_requires_grad(false);
  for (Linear* m : chosen) adapt(*m, opts, gen);
  return adapted;
}

bool is_lora_parameter(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") || name == "lora_A.weight" ||
         name == "lora_B.weight";
}

NamedTensorList merge_lora(const NamedTensorList& state, const LoRAOptions& opts) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  // "...q_proj.lora_A.weight" -> "...q_proj." (the adapted module's prefix)
  auto prefix_of = [](const std::string& name) { return name.substr(0, name.size() - 13); };
  for (auto& [name, t] : state) {
    if (!is_lora_parameter(name)) continue;
    WEFT_CHECK(t.dim() == 2 && t.size(name.ends_with("lora_A.weight") ? 0 : 1) == opts.rank, "merge_lora: {} is "
               "shaped {}: not an adapter of rank {}, which the options give", name, shape_str(t.shape()), opts.rank);
    for (const char* partner : {"lora_A.weight", "lora_B.weight", "weight"})
      WEFT_CHECK(by_name.count(prefix_of(name) + partner), "merge_lora: the state has {} but no {}", name,
                 prefix_of(name) + partner);
  }
  NoGradGuard no_grad;
  NamedTensorList out;
  for (auto& [name, t] : state) {
    if (is_lora_parameter(name)) continue;
    const bool weight = name == "weight" || name.ends_with(".weight");
    const std::string prefix = weight ? name.substr(0, name.size() - 6) : "";
    auto a = weight ? by_name.find(prefix + "lora_A.weight") : by_name.end();
    if (a == by_name.end()) {
      out.emplace_back(name, t);
      continue;
    }
    Tensor delta = matmul(by_name.at(prefix + "lora_B.weight").to(DType::f32), a->second.to(DType::f32));
    out.emplace_back(name, add(t.to(DType::f32), delta, opts.scale()).to(t.dtype()));
  }
  return out;
}

void cast_frozen(Module& model, DType dtype) {
  WEFT_CHECK(is_floating(dtype), "cast_frozen: the frozen parameters compute in a floating dtype, not {}", dtype_name(dtype));
  NoGradGuard no_grad;
  std::map<TensorImpl*, Tensor> cast;
  for (auto& [name, m] : model.named_modules())
    for (auto& [pname, t] : m->named_parameters(false)) {
      if (t.requires_grad() || t.dtype() == dtype) continue;
      auto [it, fresh] = cast.try_emplace(t.impl());
      if (fresh) it->second = t.to(dtype);
      m->set_parameter(pname, it->second);
      if (fresh && MemoryOwner::wanted() && it->second.storage() && it->second.storage()->data_or_null())
        allocator_for(it->second.device()).label(it->second.storage()->data_or_null(),  // as register_parameter does
                                                 fmt::format("parameter '{}' of {}", pname, m->type_name()));
    }
}

}  // namespace weft::nn
