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

namespace weft::fsdp {

FSDPModule fully_shard(const nn::ModulePtr& module, const FullyShardOptions& opts) {
  WEFT_CHECK(module != nullptr, "fully_shard: module is null");
  return fully_shard(std::vector<nn::ModulePtr>{module}, opts);
}

FSDPModule fully_shard(const std::vector<nn::ModulePtr>& modules, const FullyShardOptions& opts) {
  WEFT_CHECK(!modules.empty(), "fully_shard: the list of modules is empty");
  std::vector<nn::Module*> members;
  for (size_t i = 0; i < modules.size(); ++i) {
    WEFT_CHECK(modules[i] != nullptr, "fully_shard: module {} of the list is null", i);
    WEFT_CHECK(!state_of(*modules[i]), "fully_shard: called twice on the same {} module{}", modules[i]->type_name(),
               modules.size() > 1 ? fmt::format(" (#{} of the list)", i) : "");
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
  const nn::Module* module = members[0];
  const std::string what = members.size() == 1 ? module->type_name() + " module"
                                               : fmt::format("list of {} modules", members.size());
  for (auto [what, d] : {std::pair{"param_dtype", opts.mp_policy.param_dtype}, {"reduce_dtype", opts.mp_policy.reduce_dtype},
                         {"output_dtype", opts.mp_policy.output_dtype}})
    WEFT_CHECK(!d || is_floating(*d), "fully_shard: mp_policy.{} must be a floating dtype, got {}", what, dtype_name(*d));
  if (!dist::is_initialized()) dist::init();
  // What earlier calls in this subtree took: their shards (skipped here) and the original
  // tensors they replaced (still registered elsewhere only if tied across groups).
  std::unordered_set<TensorImpl*> shards, originals_taken;
  const auto walk = named_modules_of(members);
  for (auto& [mn, m] : walk)
    if (auto s = state_of(*m); s && s->group) {
      for (auto& p : s->group->params()) shards.insert(p->sharded().impl());
      for (auto& w : s->group->originals)
        if (auto o = w.lock()) originals_taken.insert(o.get());
    }
  // Parameters of the subtree not yet in a group, with every slot that holds each of them.
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
      WEFT_CHECK(!impl->autograd || impl->autograd->shard_of.empty(),
                 "fully_shard: parameter {} of this {} is already a shard made by fully_shard on an enclosing "
                 "module ({}); call fully_shard bottom-up: on the blocks first, then on the modules that contain them, "
                 "the root last", name, what, impl->autograd ? impl->autograd->shard_of : "");
      WEFT_CHECK(!originals_taken.count(impl),
                 "fully_shard: parameter {} is tied to a parameter already sharded by an earlier fully_shard call; "
                 "tied parameters must be in the same group (shard the module that holds both)", name);
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
  // The device of the module's parameters picks the default mesh's backend (MPI for CPU
  // tensors, NCCL for CUDA ones). Every rank has the same model, hence the same choice, so the
  // collective mesh construction below happens on all ranks or none.
  // A module left without parameters of its own (a root whose blocks took them all) follows
  // the groups below it.
  // Meta (deferred) parameters follow the others, else the mesh's device (CPU by default).
  Device device = kCPU;
  bool all_meta = !entries.empty();
  for (auto& e : entries)
    if (!e.slots[0]->device().is_meta()) {
      device = e.slots[0]->device(), all_meta = false;
      break;
    }
  if (all_meta) {
    if (opts.mesh) device = opts.mesh->group(opts.mesh->ndim() - 1)->device();
  } else if (entries.empty()) {
    for (auto& [mn, m] : walk)
      if (auto s = state_of(*m); s && s->group) {
        device = s->group->compute_device();
        break;
      }
  }
  // One default world mesh per device type for every call (owned by dist until
  // dist::finalize), so all groups share a communicator.
  auto mesh = opts.mesh ? opts.mesh : dist::default_mesh(device.type);
  WEFT_CHECK(mesh->ndim() == 1 || mesh->ndim() == 2, "fully_shard: the mesh must be 1-D or 2-D (replicate, shard), got {}",
             mesh->str());
  auto shard_group = mesh->group(mesh->ndim() - 1);
  auto replicate_group = mesh->ndim() == 2 ? mesh->group(0) : nullptr;
  // The collectives run on the mesh's backend, which takes tensors of one device only.
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

  std::vector<std::weak_ptr<TensorImpl>> originals;
  for (auto& e : entries) {
    originals.push_back(e.slots[0]->impl_ptr());
    e.slots[0]->autograd_meta().replaced_by =
        fmt::format("its shard when fsdp::fully_shard ran on the {} holding '{}'", what, e.name);
  }
  // Meta buffers of the subtree are materialised whole on the group's device (they are not
  // sharded); meta parameters become shards initialised from their rules by the group.
  for (nn::Module* m : members)
    for (auto& [bname, b] : m->named_buffers())
      if (b.device().is_meta() && !comm_device.is_meta()) materialize_in_place(b, comm_device);
  std::unique_ptr<FSDPParamGroup> group;
  if (!entries.empty()) {
    group = std::make_unique<FSDPParamGroup>(std::move(entries), opts, shard_group, replicate_group);
    group->originals = std::move(originals);
    // A shard's reductions (nn::clip_grad_norm_) complete over the ranks holding the others.
    for (auto& p : group->params()) {
      p->sharded().autograd_meta().shard_of = fmt::format("a {}, as '{}'", what, p->name());
      if (shard_group->size() > 1) set_partial_reduction(p->sharded(), dist::reduction_over(shard_group));
    }
  }
  auto state = std::make_shared<FSDPState>(members, opts, std::move(group), mesh);
  // The modules own their state (their extension slot, and their hooks); the state refers back
  // to them by pointer and dies with them.
  for (size_t i = 0; i < members.size(); ++i) {
    members[i]->set_extension(state);
    members[i]->register_forward_pre_hook(
        [state, i](nn::Module&, const TensorList& in) { return state->pre_forward(in, i); });
    members[i]->register_forward_hook(
        [state, i](nn::Module&, const TensorList&, const TensorList& out) { return state->post_forward(out, i); });
  }
  return FSDPModule(state);
}

std::optional<FSDPModule> fsdp_module(const nn::Module& module) {
  auto s = state_of(module);
  if (!s) return std::nullopt;
  return FSDPModule(s);
}

nn::Module& FSDPModule::module() const { return state_->module(); }

std::vector<FSDPState*> FSDPModule::subtree() const {
  std::vector<FSDPState*> out;
  for (auto& [n, m] : state_->named_modules())
    if (auto s = state_of(*m); s && std::find(out.begin(), out.end(), s.get()) == out.end()) out.push_back(s.get());
  return out;
}

void FSDPModule::UnshardHandle::wait() {
  if (state_->group) state_->group->finish_unshard();
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
  WEFT_CHECK(factor > 0, "set_reduce_scatter_divide_factor: factor must be positive, got {}", factor);
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
  ShardInfo info;
  info.global_shape = p.global_shape();
  info.shard_dim = p.shard_dim();
  info.world_size = pg->size();
  info.rank = pg->rank();
  int64_t extent = p.global_shape().empty() ? 1 : p.global_shape()[size_t(p.shard_dim())];
  int64_t chunk = (extent + pg->size() - 1) / pg->size();
  info.offset = std::min(extent, int64_t(pg->rank()) * chunk);
  info.length = std::clamp<int64_t>(extent - int64_t(pg->rank()) * chunk, 0, chunk);
  return info;
}

CommStats FSDPModule::comm_stats(bool recurse) const {
  CommStats total;
  for (FSDPState* s : recurse ? subtree() : std::vector<FSDPState*>{state_.get()})
    if (s->group) {
      total.all_gathers += s->group->stats.all_gathers;
      total.reduce_scatters += s->group->stats.reduce_scatters;
      total.all_reduces += s->group->stats.all_reduces;
    }
  return total;
}

}  // namespace weft::fsdp
