#include "fsdp/fully_shard.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd_meta.h"
#include "core/fill_rule.h"
#include "core/grad_mode.h"
#include "dist/device_mesh.h"
#include "dist/dist.h"
#include "dist/group_reduction.h"
#include "fsdp/sharded_state_dict.h"
#include "fsdp/state.h"
#include "nn/optimizer.h"
#include "tp/parallel_style.h"

namespace weft::fsdp {

namespace {

using NamedModules = std::vector<std::pair<std::string, nn::Module*>>;

using nn::shard_of;  // on each shard: the fully_shard call that made it (nn/module.h)

// Checks the modules (non-null, not yet sharded, disjoint) and dtypes; returns the group's members.
std::vector<nn::Module*> check_arguments(const std::vector<nn::ModulePtr>& modules, const FullyShardOptions& opts) {
  WEFT_CHECK(!modules.empty(), "fully_shard: the list of modules is empty");
  std::vector<nn::Module*> members;
  for (size_t i = 0; i < modules.size(); ++i) {
    WEFT_CHECK(modules[i] != nullptr, "fully_shard: module {} of the list is null", i);
    WEFT_CHECK(!state_of(*modules[i]), "fully_shard: called twice on the same {} module{}", modules[i]->type_name(),
               modules.size() > 1 ? fmt::format(" (#{} of the list)", i) : "");
    WEFT_CHECK(!tp::swaps_parameters(*modules[i]), "fully_shard: the {} module{} swaps its parameters while it runs (a "
               "tensor-parallel rowwise bias or sum_gradients), which FSDP's hooks would undo: fully_shard the module "
               "holding it", modules[i]->type_name(), modules.size() > 1 ? fmt::format(" (#{} of the list)", i) : "");
    members.push_back(modules[i].get());
  }
  // The members of one group are disjoint: none holds another.
  for (size_t i = 0; i < members.size(); ++i)
    for (auto& [name, m] : members[i]->named_modules())
      for (size_t j = 0; j < members.size(); ++j)
        WEFT_CHECK(j == i || m.get() != members[j],
                   "fully_shard: module #{} of the list ({}) {} module #{} ({}); the modules of one group must be "
                   "distinct and none may contain another", j, members[j]->type_name(),
                   name.empty() ? "is the same as" : "is inside", i, members[i]->type_name());
  for (auto [what, d] : {std::pair{"param_dtype", opts.mp_policy.param_dtype}, {"reduce_dtype", opts.mp_policy.reduce_dtype},
                         {"output_dtype", opts.mp_policy.output_dtype}})
    WEFT_CHECK(!d || is_floating(*d), "fully_shard: mp_policy.{} must be a floating dtype, got {}", what, dtype_name(*d));
  return members;
}

// The subtree's parameters no earlier call took, each with every slot holding it and its shard dim.
std::vector<FSDPParamGroup::Entry> collect_entries(const NamedModules& walk, const FullyShardOptions& opts,
                                                   const std::string& what) {
  // Earlier calls' shards.
  std::unordered_set<TensorImpl*> shards;
  for (auto& [mn, m] : walk)
    if (auto s = state_of(*m); s && s->group)
      for (auto& p : s->group->params()) shards.insert(p->sharded().impl());
  std::vector<FSDPParamGroup::Entry> entries;
  std::unordered_map<TensorImpl*, size_t> index;
  for (auto& [mname, m] : walk) {
    for (auto& [pname, t] : m->named_parameters(false)) {
      std::string name = mname.empty() ? pname : mname + "." + pname;
      Tensor* slot = &m->parameter_slot(pname);
      TensorImpl* impl = t.impl();
      if (auto it = index.find(impl); it != index.end()) {  // tied within this group
        entries[it->second].slots.push_back(slot);
        continue;
      }
      if (shards.count(impl)) continue;
      const std::string* made_by = impl->autograd ? impl->autograd->attached(shard_of) : nullptr;
      WEFT_CHECK(!made_by, "fully_shard: parameter {} of this {} is already {} (another module): a module that "
                 "encloses this one was sharded first (call fully_shard bottom-up: the blocks first, the root last), "
                 "or this module also belongs to another sharded model", name, what, made_by ? *made_by : "");
      // A tensor an earlier call replaced by its shard, still registered here: tied across groups (in any order).
      const std::string* replaced = impl->autograd ? impl->autograd->attached(nn::replaced_parameter) : nullptr;
      WEFT_CHECK(!replaced, "fully_shard: parameter {} is tied to a parameter already sharded by an earlier fully_shard "
                 "call (replaced by {}); tied parameters must be in the same group (shard the module that holds both)",
                 name, replaced ? *replaced : "");
      int64_t dim = 0;
      if (opts.shard_placement_fn) {
        dim = opts.shard_placement_fn(name, t);
        WEFT_CHECK(dim >= 0 && dim < std::max<int64_t>(t.dim(), 1),
                   "fully_shard: shard_placement_fn gave dim {} for parameter {} of shape {}", dim, name,
                   shape_str(t.shape()));
      }
      index[impl] = entries.size();
      entries.push_back({name, {slot}, dim});
    }
  }
  return entries;
}

// The group's device: its parameters' (the same on every rank, so all or none build a mesh), else
// the mesh's for meta ones, else that of the groups below (a root whose blocks took everything).
Device pick_device(const std::vector<FSDPParamGroup::Entry>& entries, const NamedModules& walk,
                   const FullyShardOptions& opts) {
  for (auto& e : entries)
    if (!e.slots[0]->device().is_meta()) return e.slots[0]->device();
  if (!entries.empty()) return opts.mesh ? opts.mesh->group(opts.mesh->ndim() - 1)->device() : kCPU;
  for (auto& [mn, m] : walk)
    if (auto s = state_of(*m); s && s->group) return s->group->compute_device();
  return kCPU;
}

// The mesh to shard over (else dist's default one per device type), checked against `device`.
std::shared_ptr<dist::DeviceMesh> pick_mesh(const FullyShardOptions& opts, Device device, const std::string& what) {
  auto mesh = opts.mesh ? opts.mesh : dist::default_mesh(device.type);
  WEFT_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2, "fully_shard: the mesh must be 1-D or 2-D (replicate, shard), got {}",
             mesh->str());
  // The collectives run on the mesh's backend, which takes tensors of one device only.
  auto shard_group = mesh->group(mesh->ndim() - 1);
  Device comm_device = shard_group->device();
  WEFT_CHECK(comm_device.type == device.type,
             "fully_shard: the parameters of this {} are on {} but {} communicates with the {} backend, which "
             "takes {} tensors; {}", what, device.str(), mesh->str(), shard_group->backend(),
             comm_device.is_cpu() ? "CPU" : "CUDA",
             device.is_cuda() ? "build the mesh with DeviceMesh(DeviceType::cuda) (NCCL) or leave FullyShardOptions::mesh "
                                "unset to use the default CUDA mesh"
                              : fmt::format("move the module to {} first (module->to(...)) or use a DeviceMesh(DeviceType::cpu)",
                                            comm_device.str()));
  WEFT_CHECK(comm_device == device || device.is_cpu(),
             "fully_shard: the parameters of this {} are on {} but this rank's NCCL group of {} uses {} (local "
             "rank {} modulo the visible GPUs); move the module to {}", what, device.str(), mesh->str(),
             comm_device.str(), dist::local_rank(), comm_device.str());
  return mesh;
}

// Makes the group (null without entries), notes what replaced what, materialises meta buffers whole.
std::unique_ptr<FSDPParamGroup> make_group(std::vector<FSDPParamGroup::Entry> entries, const std::vector<nn::Module*>& members,
                                           const FullyShardOptions& opts, const dist::DeviceMesh& mesh, const std::string& what) {
  auto shard_group = mesh.group(mesh.ndim() - 1);
  std::vector<std::weak_ptr<TensorImpl>> originals;
  std::vector<std::shared_ptr<const PartialReduction>> held_in_part;  // e.g. split by tensor parallelism
  for (auto& e : entries) {
    originals.push_back(e.slots[0]->impl_ptr());
    held_in_part.push_back(partial_reduction(*e.slots[0]));
    e.slots[0]->autograd_meta().attach(nn::replaced_parameter,
                                       fmt::format("its shard when fsdp::fully_shard ran on the {} holding '{}'", what, e.name));
  }
  for (nn::Module* m : members)
    for (auto& [bname, b] : m->named_buffers())
      if (b.device().is_meta() && !shard_group->device().is_meta()) materialize_in_place(b, shard_group->device());
  // A part sharded over ranks that hold the other parts (the tensor-parallel group's own) mixed the ranks' slices.
  for (size_t i = 0; i < entries.size() && shard_group->size() > 1 && !shard_group->device().is_meta(); ++i) {
    if (!held_in_part[i] || (i > 0 && held_in_part[i - 1] && held_in_part[i]->same_processes(*held_in_part[i - 1])))
      continue;  // one gather per run of parameters split over the same ranks
    const std::vector<int>& shard = shard_group->world_ranks();
    int shared = 0;
    for (double r : held_in_part[i]->gather({double(dist::rank())})) shared += int(std::ranges::count(shard, int(r)));
    WEFT_CHECK(shared == 1, "fully_shard: '{}' is split over ranks that the {} would also shard it over ({} of them): "
               "shard a split model over the other dim of its mesh (the data-parallel ranks)", entries[i].name, what,
               shared);
  }
  if (entries.empty()) return nullptr;
  auto group = std::make_unique<FSDPParamGroup>(std::move(entries), opts, shard_group,
                                                mesh.ndim() == 2 ? mesh.group(0) : nullptr);
  group->originals = std::move(originals);
  // A shard's reductions (nn::clip_grad_norm_) complete over the ranks holding the others.
  for (size_t i = 0; i < group->params().size(); ++i) {
    FSDPParam& p = *group->params()[i];
    p.sharded().autograd_meta().attach(shard_of, fmt::format("a shard made by fsdp::fully_shard on a {}, as '{}'",
                                                             what, p.name()));
    p.set_held_in_part(held_in_part[i]);
    // nn totals norms over the shards through this ([Note: partial reductions], core/partial_reduction.h).
    if (shard_group->size() > 1 || held_in_part[i])
      set_partial_reduction(p.sharded(), shard_group->size() > 1 ? dist::reduction_over(shard_group, held_in_part[i])
                                                                 : held_in_part[i]);
  }
  return group;
}

// Attaches the state to each member (owned by its extension slot and hooks) and hooks its forward.
FSDPModule attach_state(const std::vector<nn::Module*>& members, const std::shared_ptr<FSDPState>& state) {
  for (size_t i = 0; i < members.size(); ++i) {
    members[i]->set_extension(state);
    members[i]->register_forward_pre_hook(
        [state, i](nn::Module&, const TensorList& in) { return state->pre_forward(in, i); });
    members[i]->register_forward_hook(
        [state, i](nn::Module&, const TensorList&, const TensorList& out) { return state->post_forward(out, i); });
  }
  return FSDPModule(state);
}

}  // namespace

FSDPModule fully_shard(const nn::ModulePtr& module, const FullyShardOptions& opts) {
  WEFT_CHECK(module != nullptr, "fully_shard: module is null");
  return fully_shard(std::vector<nn::ModulePtr>{module}, opts);
}

FSDPModule fully_shard(const std::vector<nn::ModulePtr>& modules, const FullyShardOptions& opts) {
  const std::vector<nn::Module*> members = check_arguments(modules, opts);
  const std::string what = members.size() == 1 ? members[0]->type_name() + " module"
                                               : fmt::format("list of {} modules", members.size());
  if (!dist::is_initialized()) dist::init();
  const NamedModules walk = named_modules_of(members);
  auto entries = collect_entries(walk, opts, what);
  auto mesh = pick_mesh(opts, pick_device(entries, walk, opts), what);
  auto group = make_group(std::move(entries), members, opts, *mesh, what);
  auto state = std::make_shared<FSDPState>(members, opts, std::move(group), mesh);
  state->owners.assign(modules.begin(), modules.end());
  return attach_state(members, state);
}

std::optional<FSDPModule> fsdp_module(const nn::Module& module) {
  if (auto s = state_of(module)) return FSDPModule(s);
  return std::nullopt;
}

nn::Module& FSDPModule::module() const { return state_->module(); }

std::vector<FSDPState*> FSDPModule::subtree() const {
  std::vector<FSDPState*> out;
  for (auto& [n, m] : state_->named_modules())
    if (auto s = state_of(*m); s && std::find(out.begin(), out.end(), s.get()) == out.end()) out.push_back(s.get());
  return out;
}

void FSDPModule::UnshardHandle::wait() {  // a gather still pending: one a forward has used since is done
  if (state_->group && state_->group->state() == FSDPParamGroup::State::gathering) state_->group->finish_unshard();
}

FSDPModule::UnshardHandle FSDPModule::unshard(bool async_op) {
  if (state_->group) {
    state_->group->start_unshard();
    if (!async_op) state_->group->finish_unshard();
  }
  return UnshardHandle(state_);
}

void FSDPModule::reshard() {
  if (state_->group) state_->group->reshard();
}

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()}) s->requires_gradient_sync_ = sync;
}
void FSDPModule::set_reshard_after_backward(bool r, bool recurse) {
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()}) s->reshard_after_backward_ = r;
}
void FSDPModule::set_reshard_after_forward(bool r, bool recurse) {
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()}) s->reshard_after_forward_ = r;
}
void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  auto& targets = state_->forward_prefetch_.emplace();
  for (auto& m : modules) targets.push_back(m.state_);
}
void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  auto& targets = state_->backward_prefetch_.emplace();
  for (auto& m : modules) targets.push_back(m.state_);
}
// One setting for the whole step, as FSDP2's state context: called on any module, it sets the
// root's (read at the end of backward); before the first forward the root adopts it.
void FSDPModule::set_is_last_backward(bool last) {
  state_->is_last_backward_ = last;
  if (FSDPState* r = state_->root()) r->is_last_backward_ = last;
}
void FSDPModule::set_reduce_scatter_divide_factor(double factor) {
  WEFT_CHECK(factor > 0 && factor < HUGE_VAL, "set_reduce_scatter_divide_factor: factor must be a finite number > 0, "
             "got {}", factor);
  for (FSDPState* s : subtree())
    if (s->group) s->group->reduce_scatter_divide_factor = factor;
}
void FSDPModule::set_unshard_in_backward(bool u) { state_->unshard_in_backward_ = u; }
void FSDPModule::set_post_optim_event(Event event) { state_->set_post_optim_event(std::move(event)); }
void FSDPModule::set_requires_all_reduce(bool a, bool recurse) {
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()})
    if (s->group) s->group->requires_all_reduce = a;
}

const FSDPParam& FSDPModule::find_param(const std::string& name) const {
  if (const FSDPParam* p = lookup_param(name)) return *p;
  WEFT_ERROR("fsdp: no sharded parameter named \"{}\" under this module", name);
}

// Resolved through the module tree: the tensor in the slot `name` names (any name of a tied
// parameter), then the group parameter whose sharded or unsharded tensor it is.
const FSDPParam* FSDPModule::lookup_param(const std::string& name) const {
  const size_t dot = name.rfind('.');
  const std::string mname = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string pname = dot == std::string::npos ? name : name.substr(dot + 1);
  const TensorImpl* impl = nullptr;
  for (auto& [n, m] : state_->named_modules())
    if (n == mname)
      for (auto& [own, t] : m->named_parameters(false))
        if (own == pname) impl = t.impl();
  if (!impl) return nullptr;
  for (FSDPState* s : subtree())
    if (s->group)
      for (auto& p : s->group->params())
        if (p->sharded().impl() == impl || (p->unsharded().defined() && p->unsharded().impl() == impl)) return p.get();
  return nullptr;
}

Tensor FSDPModule::full_tensor(const std::string& name) const { return gather_shard(name, find_param(name).sharded()); }

Tensor FSDPModule::gather_shard(const std::string& name, const Tensor& local) const {
  const FSDPParam& p = find_param(name);
  WEFT_CHECK(local.defined(), "fsdp: gather_shard of {}: the local tensor is undefined", name);
  WEFT_CHECK(local.shape() == p.sharded().shape(), "fsdp: gather_shard of {}: tensor {} is not shaped like the shard {}",
             name, tensor_desc(local), shape_str(p.sharded().shape()));
  auto pg = state_->mesh->group(state_->mesh->ndim() - 1);
  NoGradGuard ng;
  // Gathered on the group's device (where an offloaded shard is not), returned on local's.
  const Device dev = pg->device();
  // Padded like the parameter's own chunk, so the all-gather sends equal sizes.
  Tensor padded = zeros({p.padded_numel()}, {.dtype = local.dtype(), .device = dev});
  Shape chunk_shape = p.global_shape().empty() ? Shape{1} : p.global_shape();
  int64_t extent = chunk_shape[size_t(p.shard_dim())];
  chunk_shape[size_t(p.shard_dim())] = (extent + pg->size() - 1) / pg->size();
  if (local.numel() > 0)
    padded.view(chunk_shape).narrow(p.shard_dim(), 0, local.dim() == 0 ? 1 : local.size(p.shard_dim()))
        .copy_(local.dim() == 0 ? local.view({1}) : local);
  Tensor recv = empty({int64_t(pg->size()), p.padded_numel()}, {.dtype = local.dtype(), .device = dev});
  pg->all_gather_into_tensor(recv.view({-1}), padded)->wait();
  Tensor full = empty(p.global_shape(), {.dtype = local.dtype(), .device = dev});
  p.assemble_into(recv, 0, full);
  return full.device() == local.device() ? full : full.to(local.device());
}

ShardInfo FSDPModule::shard_info(const std::string& name) const {
  const FSDPParam& p = find_param(name);
  auto pg = state_->mesh->group(state_->mesh->ndim() - 1);
  const int64_t extent = p.global_shape().empty() ? 1 : p.global_shape()[size_t(p.shard_dim())];
  const int64_t chunk = (extent + pg->size() - 1) / pg->size(), start = int64_t(pg->rank()) * chunk;
  return {p.global_shape(), p.shard_dim(), std::min(extent, start), std::clamp<int64_t>(extent - start, 0, chunk),
          pg->size(), pg->rank(), tp::split_of(p.held_in_part()), tp::split_group(p.held_in_part())};
}

CommStats FSDPModule::comm_stats(bool recurse) const {
  CommStats total;
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()})
    if (s->group) {
      total.all_gathers += s->group->stats.all_gathers;
      total.reduce_scatters += s->group->stats.reduce_scatters;
      total.all_reduces += s->group->stats.all_reduces;
      total.reduce_scatter_elements += s->group->stats.reduce_scatter_elements;
    }
  return total;
}

}  // namespace weft::fsdp
