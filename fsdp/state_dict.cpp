#include "fsdp/state_dict.h"

#include <unordered_map>

#include "core/copy.h"
#include "core/grad_mode.h"
#include "core/sha256.h"
#include "dist/agree.h"
#include "dist/config_check.h"
#include "dist/dist.h"
#include "fsdp/state.h"

namespace weft::fsdp {
namespace {

// Every rank must pass the same full dict (each takes its own slices from it): compared across the
// world by a digest of the names, shapes, dtypes and bytes, so that different dicts stop every rank.
void check_same_full_dict(const nn::NamedTensorList& full, const char* what) {
  if (!dist::is_initialized() || dist::world_size() == 1) return;
  std::string all;
  for (auto& [k, t] : full) {
    const Tensor c = t.defined() && !t.device().is_meta() ? t.to(kCPU).contiguous() : Tensor();
    all += fmt::format("{} {} {} {}\n", k, t.defined() ? shape_str(t.shape()) : "undefined", t.defined() ?
                       dtype_name(t.dtype()) : "", c.defined() ? sha256_hex(c.data_ptr(), c.nbytes()) : "");
  }
  dist::check_same_config({{"the full dict's digest", sha256_hex(all.data(), all.size())}}, fmt::format("fsdp: {}", what),
                          nullptr, "every rank must pass the same full dict");
}

// Gathers each entry of a sharded state dict (a whole one is already full), one at a time.
// `param_of(key)` names the FSDP parameter whose layout a sharded entry follows.
template <class ParamOf>
nn::NamedTensorList gather(const ShardedStateDict& sd, const FSDPModule* root, const FullStateDictOptions& o,
                           ParamOf param_of) {
  const bool keep = !o.rank0_only || !root || dist::rank() == 0;
  nn::NamedTensorList out;
  for (auto& [key, t] : sd) {
    WEFT_CHECK(!t.placement.split.split(), "fsdp: full_state_dict: \"{}\" is {}: tensor-parallel parts are not "
               "gathered here; save a checkpoint and consolidate it", key, t.placement.str());
    Tensor full = t.placement.whole() ? t.local : root->gather_shard(param_of(key), t.local);
    if (!keep) continue;
    if (o.cpu_offload && !full.device().is_cpu()) full = full.to(Device::cpu());
    out.emplace_back(key, full);
  }
  return out;
}

// A full tensor as the only piece of itself.
std::vector<Piece> whole_piece(const Tensor& full) {
  return {Piece{Placement::of_whole(full.shape()), [full] { return full; }, "the full state dict"}};
}

// This rank's slice of every key of `expected` from `full`.
std::map<std::string, Tensor> slices(const ShardedStateDict& expected, const std::map<std::string, Tensor>& full,
                                     const char* what) {
  std::map<std::string, Tensor> out;
  for (auto& [key, t] : expected) {
    auto it = full.find(key);
    WEFT_CHECK(it != full.end(), "fsdp: {}: the full state dict lacks \"{}\"", what, key);
    WEFT_CHECK(it->second.shape() == t.placement.global_shape, "fsdp: {}: \"{}\" is {} in the full state dict but {} "
               "here", what, key, tensor_desc(it->second), shape_str(t.placement.global_shape));
    WEFT_CHECK(is_floating(it->second.dtype()) == is_floating(t.local.dtype()), "fsdp: {}: \"{}\" is {} in the full "
               "state dict but {} here: integers and floating point do not convert", what, key,
               tensor_desc(it->second), dtype_name(t.local.dtype()));
    Tensor local = empty(t.local.shape(), {.dtype = t.local.dtype(), .device = t.local.device()});
    assemble_from_pieces(key, local, t.placement, whole_piece(it->second));
    out.emplace(key, local);
  }
  return out;
}

}  // namespace

nn::NamedTensorList full_state_dict(nn::Module& model, const FSDPModule* root, const FullStateDictOptions& o) {
  auto gathered = gather(sharded_state_dict(model, root), root, o, [](const std::string& k) { return k; });
  std::map<std::string, Tensor> by_name(gathered.begin(), gathered.end());
  if (gathered.empty()) return {};
  // In state_dict()'s order, a tied parameter under each of its names.
  nn::NamedTensorList out;
  auto tied = tied_parameter_names(model);
  for (auto& [name, t] : model.state_dict()) {
    auto it = tied.find(name);
    out.emplace_back(name, by_name.at(it == tied.end() ? name : it->second));
  }
  return out;
}

nn::NamedTensorList full_optimizer_state_dict(const nn::Optimizer& opt, nn::Module& model, const FSDPModule* root,
                                              const FullStateDictOptions& o) {
  auto local = sharded_optimizer_state_dict(opt, model, root);
  if (root) {
    // Every rank must gather the same tensors in the same order; they differ only if some
    // shard never had a gradient. The all-reduce gives every rank the same verdict.
    auto group = root->state()->mesh->group(root->state()->mesh->ndim() - 1);
    double n = double(local.size()), fp = double(keys_fingerprint(local) >> 12);
    Tensor v = from_vector({n, -n, fp, -fp}, {4}, {.dtype = kFloat64}).to(group->device());
    group->all_reduce(v, dist::ReduceOp::max)->wait();
    v = v.to(kCPU);
    const double* m = v.data<double>();
    WEFT_CHECK(m[0] == -m[1] && m[2] == -m[3], "fsdp: the ranks hold different optimizer states ({} to {} tensors, "
               "or different keys); cannot gather a full state dict", -m[1], m[0]);
  }
  return gather(local, root, o, [](const std::string& key) {
    std::string param, state;
    split_optimizer_state_key(key, param, state);
    return param;
  });
}

namespace {
// `full`'s keys beyond the model's (`given` less `expected`'s) must be a tie's or an alias's second name, equal to it.
void check_duplicates(nn::Module& model, const nn::NamedTensorList& full, std::map<std::string, Tensor> given,
                      const ShardedStateDict& expected, const std::map<std::string, std::string>& aliases,
                      const char* what) {
  for (auto& [k, t] : expected) given.erase(k);
  auto duplicates = tied_parameter_names(model);
  duplicates.insert(aliases.begin(), aliases.end());
  for (auto& [key, t] : given) {
    auto it = duplicates.find(key);
    WEFT_CHECK(it != duplicates.end(), "fsdp: {}: unexpected key \"{}\" in the full state dict (the model has no such "
               "parameter or buffer)", what, key);
    auto target = full.end();
    for (auto f = full.begin(); f != full.end(); ++f)
      if (f->first == it->second) target = f;
    WEFT_CHECK(target != full.end() && target->second.shape() == t.shape() &&
                   to_vector(target->second) == to_vector(t),
               "fsdp: {}: \"{}\" must equal \"{}\" (the model ties them), but the full state dict holds different "
               "values", what, key, it->second);
  }
}
}  // namespace

void load_full_state_dict(nn::Module& model, const nn::NamedTensorList& full, const FSDPModule* root,
                          const std::map<std::string, std::string>& aliases) {
  const char* what = "load_full_state_dict";
  check_same_full_dict(full, what);
  nn::check_state_entries(full, std::string("fsdp: ") + what);
  const std::map<std::string, Tensor> given(full.begin(), full.end());
  auto expected = sharded_state_dict(model, root);
  auto local = slices(expected, given, what);
  check_duplicates(model, full, given, expected, aliases, what);
  NoGradGuard no_grad;
  for (auto& [k, t] : expected) copy_elements(t.local, local.at(k));
}

void broadcast_full_state_dict(nn::Module& model, const nn::NamedTensorList& full, const FSDPModule* root,
                               const std::map<std::string, std::string>& aliases) {
  const char* what = "broadcast_full_state_dict";
  if (!dist::is_initialized() || dist::world_size() == 1) return load_full_state_dict(model, full, root, aliases);
  const bool lead = dist::rank() == 0;
  auto expected = sharded_state_dict(model, root);
  const std::map<std::string, Tensor> given(full.begin(), full.end());
  std::map<std::string, Tensor> local;  // rank 0's slices come from its check
  dist::agree({dist::world()}, std::string("fsdp: ") + what, [&] {  // rank 0's dict checked whole: fails every rank
    WEFT_CHECK(lead || full.empty(), "fsdp: {}: rank {} passed {} entries: only global rank 0 passes the full dict",
               what, dist::rank(), full.size());
    if (!lead) return;
    nn::check_state_entries(full, std::string("fsdp: ") + what);
    local = slices(expected, given, what);
    check_duplicates(model, full, given, expected, aliases, what);
  });
  const Device at = dist::world()->device();
  for (auto& [key, t] : expected) {  // one full tensor at a time, in the same order on every rank
    Tensor whole = lead ? given.at(key).to(at).to(t.local.dtype()).contiguous()
                        : empty(t.placement.global_shape, {.dtype = t.local.dtype(), .device = at});
    dist::world()->broadcast(whole, 0)->wait();
    if (!lead) local.emplace(key, slices({{key, t}}, {{key, whole}}, what).at(key));
  }
  NoGradGuard no_grad;
  for (auto& [k, t] : expected) copy_elements(t.local, local.at(k));
}

void load_full_optimizer_state_dict(nn::Optimizer& opt, nn::Module& model, const nn::NamedTensorList& full,
                                    const FSDPModule* root) {
  check_same_full_dict(full, "load_full_optimizer_state_dict");
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params.emplace(name, t);
  nn::NamedTensorList local;
  for (auto& [key, t] : full) {
    std::string param, state;
    if (!split_optimizer_state_key(key, param, state) || state == "step" || !params.count(param)) {
      local.emplace_back(key, t);
      continue;
    }
    Placement want = param_placement(root, param, params.at(param));
    WEFT_CHECK(t.shape() == want.global_shape, "fsdp: load_full_optimizer_state_dict: \"{}\" is {} but parameter {} "
               "is {}", key, tensor_desc(t), param, shape_str(want.global_shape));
    Tensor slice = empty(want.local_shape(), {.dtype = t.dtype()});
    assemble_from_pieces(key, slice, want, whole_piece(t));
    local.emplace_back(key, slice);
  }
  opt.load_state_dict(position_optimizer_state(local, optimizer_param_names(opt, model)));
}

}  // namespace weft::fsdp
