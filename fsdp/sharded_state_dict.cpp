#include "fsdp/sharded_state_dict.h"

#include <set>
#include <unordered_map>

#include "core/copy.h"
#include "core/grad_mode.h"
#include "core/partial_reduction.h"
#include "fsdp/param_group.h"
#include "fsdp/state.h"

namespace weft::fsdp {
namespace {

Shape as_nd(const Shape& s) { return s.empty() ? Shape{1} : s; }

// Every group of `model` back to its shards, as FSDP2 reshards before state-dict work: a group still gathered (a
// forward without backward, reshard_after_backward false, unshard()) holds the whole parameters in its slots.
void reshard_gathered(nn::Module& model) {
  for (auto& [name, m] : model.named_modules())
    if (auto s = state_of(*m); s && s->group && s->group->state() != FSDPParamGroup::State::sharded) s->group->reshard();
}

// Along one dim, a piece holds runs of the global indices: `length` of them from `global`, at
// `local` in the piece (one run unless a tensor-parallel split cut the dim in blocks).
struct Run {
  int64_t local, global, length;
};
using Runs = std::vector<std::vector<Run>>;  // per dim, in local order

Runs runs_of(const Placement& p) {
  const Shape g = as_nd(p.global_shape);
  Runs r;
  for (int64_t e : g) r.push_back({{0, 0, e}});
  if (p.split.split()) {  // `chunks` blocks, part `index` of each
    const int64_t block = g[size_t(p.split.dim)] / p.split.chunks, n = block / p.split.parts;
    auto& d = r[size_t(p.split.dim)];
    d.clear();
    for (int64_t c = 0; c < p.split.chunks; ++c) d.push_back({c * n, c * block + p.split.index * n, n});
  }
  if (p.dim >= 0) {  // FSDP's shard: the part's local indices [offset, offset + length)
    std::vector<Run> kept;
    for (const Run& run : r[size_t(p.dim)]) {
      const int64_t lo = std::max(run.local, p.offset), hi = std::min(run.local + run.length, p.offset + p.length);
      if (hi > lo) kept.push_back({lo - p.offset, run.global + lo - run.local, hi - lo});
    }
    r[size_t(p.dim)] = kept;
  }
  return r;
}

int64_t volume(const std::vector<std::vector<Run>>& runs) {
  int64_t v = 1;
  for (auto& d : runs) {
    int64_t n = 0;
    for (const Run& run : d) n += run.length;
    v *= n;
  }
  return v;
}

// Where `want` and `have` hold the same global indices, per dim: runs whose `local` is the
// index in want's piece and `global` the index in have's.
Runs overlaps(const Runs& want, const Runs& have) {
  Runs out(want.size());
  for (size_t d = 0; d < want.size(); ++d)
    for (const Run& a : want[d])
      for (const Run& b : have[d]) {
        const int64_t lo = std::max(a.global, b.global), hi = std::min(a.global + a.length, b.global + b.length);
        if (hi > lo) out[d].push_back({a.local + lo - a.global, b.local + lo - b.global, hi - lo});
      }
  return out;
}

// Copies every block of `runs` (each dim's runs crossed with the others') from src into dst.
void copy_runs(const Tensor& dst, const Tensor& src, const Runs& runs) {
  std::vector<size_t> at(runs.size(), 0);
  while (true) {
    Tensor d = dst.dim() == 0 ? dst.view({1}) : dst, s = src.dim() == 0 ? src.view({1}) : src;
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i][at[i]];
      d = d.narrow(int64_t(i), r.local, r.length);
      s = s.narrow(int64_t(i), r.global, r.length);
    }
    copy_elements(d, s);
    size_t i = 0;
    while (i < runs.size() && ++at[i] == runs[i].size()) at[i++] = 0;
    if (i == runs.size()) return;
  }
}

void check_placement(const std::string& key, const Placement& got, const Placement& want, const char* what) {
  WEFT_CHECK(got == want, "fsdp: {}: \"{}\" is {} here but {} in the state dict being loaded (load_sharded_* needs "
             "the layout it was saved with; load a checkpoint to reshard)", what, key, want.str(), got.str());
}

// Checks keys and placements of `given` against `expected`, then copies every value.
void copy_into(const ShardedStateDict& expected, const ShardedStateDict& given, const char* what) {
  std::map<std::string, const ShardedTensor*> by_key;
  for (auto& [k, t] : given) by_key[k] = &t;
  std::vector<std::string> missing;
  for (auto& [k, t] : expected) {
    auto it = by_key.find(k);
    if (it == by_key.end()) {
      missing.push_back(k);
      continue;
    }
    check_placement(k, it->second->placement, t.placement, what);
    WEFT_CHECK(it->second->local.shape() == t.local.shape(), "fsdp: {}: \"{}\" holds {} but its placement {} needs {}",
               what, k, tensor_desc(it->second->local), t.placement.str(), shape_str(t.local.shape()));
    by_key.erase(it);
  }
  WEFT_CHECK(missing.empty(), "fsdp: {}: the state dict lacks \"{}\"{}", what, missing.empty() ? "" : missing[0],
             missing.size() > 1 ? fmt::format(" and {} more keys", missing.size() - 1) : "");
  WEFT_CHECK(by_key.empty(), "fsdp: {}: unexpected key \"{}\" in the state dict", what,
             by_key.empty() ? "" : by_key.begin()->first);
  NoGradGuard no_grad;
  std::map<std::string, const ShardedTensor*> src;
  for (auto& [k, t] : given) src[k] = &t;
  for (auto& [k, t] : expected) copy_elements(t.local, src[k]->local);
}

}  // namespace

Shape Placement::local_shape() const {
  if (dim >= 0 && global_shape.empty()) return length == 1 ? Shape{} : Shape{0};
  Shape s = global_shape;
  if (split.split()) s[size_t(split.dim)] /= split.parts;
  if (dim >= 0) s[size_t(dim)] = length;
  return s;
}

std::string Placement::str() const {
  if (whole()) return "whole " + shape_str(global_shape);
  const std::string part = split.split() ? fmt::format("part {} of {} along dim {}{} of ", split.index, split.parts,
                                                       split.dim, split.chunks > 1 ? fmt::format(" ({} blocks)",
                                                       split.chunks) : "") : "";
  if (dim < 0) return part + shape_str(global_shape);
  return fmt::format("[{}, {}) of dim {} of {}{}", offset, offset + length, dim, part, shape_str(global_shape));
}

Placement Placement::of_whole(const Shape& shape) { return {shape, -1, 0, 0}; }

Placement Placement::of(const ShardInfo& info) {
  return {info.split.whole_shape(info.global_shape), info.shard_dim, info.offset, info.length, info.split};
}

Placement param_placement(const FSDPModule* root, const std::string& name, const Tensor& param) {
  if (root && root->shards(name)) return Placement::of(root->shard_info(name));
  const tp::Split split = tp::split_of(partial_reduction(param));  // a tensor-parallel part, not sharded
  return {split.whole_shape(param.shape()), -1, 0, 0, split};
}

std::map<std::string, std::string> tied_parameter_names(nn::Module& model) {
  std::map<std::string, std::string> tied;
  std::unordered_map<TensorImpl*, std::string> first;
  // named_parameters() lists a tied tensor once: walk every module's own slots instead.
  for (auto& [mname, m] : model.named_modules())
    for (auto& [pname, t] : m->named_parameters(false)) {
      std::string name = mname.empty() ? pname : mname + "." + pname;
      if (auto [it, fresh] = first.emplace(t.impl(), name); !fresh) tied[name] = it->second;
    }
  return tied;
}

ShardedStateDict sharded_state_dict(nn::Module& model, const FSDPModule* root) {
  reshard_gathered(model);
  ShardedStateDict out;
  std::set<TensorImpl*> seen;
  for (auto& [name, t] : model.named_parameters())
    if (seen.insert(t.impl()).second) out.emplace_back(name, ShardedTensor{t.detach(), param_placement(root, name, t)});
  for (auto& [name, t] : model.named_buffers()) out.emplace_back(name, ShardedTensor{t, Placement::of_whole(t.shape())});
  return out;
}

std::vector<std::string> optimizer_param_names(const nn::Optimizer& opt, nn::Module& model) {
  reshard_gathered(model);
  std::unordered_map<TensorImpl*, std::string> names;
  for (auto& [name, t] : model.named_parameters()) names.emplace(t.impl(), name);
  std::vector<std::string> out;
  for (size_t g = 0; g < opt.num_groups(); ++g)
    for (const Tensor& p : opt.params(g)) {
      auto it = names.find(p.impl());
      WEFT_CHECK(it != names.end(), "fsdp: parameter {} of the optimizer's group {} ({}) is not a parameter of the "
                 "model (build the optimizer from the model's parameters after fully_shard)", out.size(), g,
                 tensor_desc(p));
      out.push_back(it->second);
    }
  return out;
}

bool split_optimizer_state_key(const std::string& key, std::string& param, std::string& state) {
  if (key.rfind("state.", 0) != 0) return false;
  size_t dot = key.rfind('.');
  if (dot <= 6) return false;
  param = key.substr(6, dot - 6);
  state = key.substr(dot + 1);
  return true;
}

nn::NamedTensorList name_optimizer_state(const nn::NamedTensorList& positional, const std::vector<std::string>& names) {
  nn::NamedTensorList out;
  for (auto& [key, t] : positional) {
    std::string index, state;
    if (!split_optimizer_state_key(key, index, state)) {
      out.emplace_back(key, t);
      continue;
    }
    size_t i = std::stoull(index);
    WEFT_CHECK(i < names.size(), "fsdp: optimizer state \"{}\" names parameter {} of {}", key, i, names.size());
    out.emplace_back("state." + names[i] + "." + state, t);
  }
  return out;
}

nn::NamedTensorList position_optimizer_state(const nn::NamedTensorList& named, const std::vector<std::string>& names) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  nn::NamedTensorList out;
  for (auto& [key, t] : named) {
    std::string param, state;
    if (!split_optimizer_state_key(key, param, state)) {
      out.emplace_back(key, t);
      continue;
    }
    auto it = index.find(param);
    WEFT_CHECK(it != index.end(), "fsdp: optimizer state \"{}\" belongs to parameter \"{}\", which this optimizer "
               "does not step", key, param);
    out.emplace_back(fmt::format("state.{}.{}", it->second, state), t);
  }
  return out;
}

ShardedStateDict sharded_optimizer_state_dict(const nn::Optimizer& opt, nn::Module& model, const FSDPModule* root) {
  auto names = optimizer_param_names(opt, model);
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params.emplace(name, t);
  ShardedStateDict out;
  for (auto& [key, t] : name_optimizer_state(opt.state_dict(), names)) {
    std::string param, state;
    bool per_element = split_optimizer_state_key(key, param, state) && state != "step";
    out.emplace_back(key, ShardedTensor{t, per_element ? param_placement(root, param, params.at(param))
                                                       : Placement::of_whole(t.shape())});
  }
  return out;
}

void load_sharded_state_dict(nn::Module& model, const ShardedStateDict& sd, const FSDPModule* root) {
  copy_into(sharded_state_dict(model, root), sd, "load_sharded_state_dict");
}

void load_sharded_optimizer_state_dict(nn::Optimizer& opt, nn::Module& model, const ShardedStateDict& sd,
                                       const FSDPModule* root) {
  auto names = optimizer_param_names(opt, model);
  std::map<std::string, Tensor> params;
  for (auto& [name, t] : model.named_parameters()) params.emplace(name, t);
  nn::NamedTensorList named;
  for (auto& [key, t] : sd) {
    std::string param, state;
    if (split_optimizer_state_key(key, param, state) && state != "step" && params.count(param))
      check_placement(key, t.placement, param_placement(root, param, params.at(param)),
                      "load_sharded_optimizer_state_dict");
    named.emplace_back(key, t.local);
  }
  opt.load_state_dict(position_optimizer_state(named, names));
}

uint64_t keys_fingerprint(const ShardedStateDict& sd) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  for (auto& [k, t] : sd) {
    mix(k);
    mix(shape_str(t.placement.global_shape));
    mix(std::string(dtype_name(t.local.dtype())));
  }
  return h;
}

void assemble_from_pieces(const std::string& name, const Tensor& dst, const Placement& want,
                          const std::vector<Piece>& pieces) {
  WEFT_CHECK(dst.shape() == want.local_shape(), "fsdp: assembling \"{}\": destination {} is not shaped like {}", name,
             tensor_desc(dst), want.str());
  const Runs target = runs_of(want);
  const int64_t needed = volume(target);
  int64_t covered = 0;
  NoGradGuard no_grad;
  for (const Piece& piece : pieces) {
    if (covered == needed) break;  // e.g. a second copy of a whole tensor
    WEFT_CHECK(as_nd(piece.placement.global_shape) == as_nd(want.global_shape),
               "fsdp: \"{}\" has global shape {} in {} but {} here", name, shape_str(piece.placement.global_shape),
               piece.where, shape_str(want.global_shape));
    const Runs part = overlaps(target, runs_of(piece.placement));
    if (volume(part) == 0) continue;
    Tensor src = piece.read();
    WEFT_CHECK(src.shape() == piece.placement.local_shape(), "fsdp: \"{}\" in {} is {}, but its placement {} needs "
               "shape {}", name, piece.where, tensor_desc(src), piece.placement.str(),
               shape_str(piece.placement.local_shape()));
    copy_runs(dst, src, part);
    covered += volume(part);
  }
  WEFT_CHECK(covered == needed, "fsdp: the pieces of \"{}\" cover {} of the {} elements of {}{}", name, covered,
             needed, want.str(), pieces.empty() ? " (there are no pieces of it)" : "");
}

}  // namespace weft::fsdp
