#include "fsdp/summon_full_params.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "autograd/engine.h"
#include "core/copy.h"
#include "core/grad_mode.h"
#include "dist/dist.h"
#include "fsdp/state.h"

namespace weft::fsdp {

namespace {

// Groups under a live guard: a nested guard over them would restore the shards under the outer one's feet.
std::unordered_set<const FSDPState*>& summoned() {
  static std::unordered_set<const FSDPState*> s;
  return s;
}

// The full tensor of `p` from its group's all-gathered shard buffer [world, group_numel], in
// the shards' own dtype (f32 master weights even under mixed precision).
Tensor assemble(const FSDPParam& p, const Tensor& gathered) {
  Tensor full = empty(p.global_shape(), {.dtype = gathered.dtype(), .device = gathered.device()});
  p.assemble_into(gathered, p.storage_offset(), full);
  if (p.requires_grad()) full.set_requires_grad(true);
  return full;
}

}  // namespace

SummonFullParams::SummonFullParams(const FSDPModule& module, SummonOptions options) : opts_(options) {
  // Every check below depends on arguments and on the training state, which all ranks share,
  // so a refused call fails on every rank before any collective.
  WEFT_CHECK(!(opts_.writeback && opts_.rank0_only),
             "fsdp::SummonFullParams: rank0_only needs writeback = false (only rank 0 holds full tensors to "
             "write back)");
  WEFT_CHECK(!autograd::Engine::is_running(),
             "fsdp::SummonFullParams: called inside backward; summon the full parameters between training steps");
  const auto walk = module.state()->named_modules();
  for (auto& [name, m] : walk) {
    auto s = state_of(*m);
    if (!s || (!opts_.recurse && s != module.state()) ||
        std::find(states_.begin(), states_.end(), s) != states_.end())
      continue;
    std::string where = s == module.state() ? s->path() + " (the module summoned)" : "'" + name + "'";
    WEFT_CHECK(!summoned().count(s.get()),
               "fsdp::SummonFullParams: sharded module {} is already summoned by an enclosing SummonFullParams; "
               "nested guards are not supported", where);
    WEFT_CHECK(!s->group || s->group->state() == FSDPParamGroup::State::sharded,
               "fsdp::SummonFullParams: the parameters of sharded module {} are gathered, i.e. this is inside "
               "forward or backward or between them; summon between training steps (a module kept gathered by "
               "set_reshard_after_backward(false) or unshard() needs reshard() first)", where);
    states_.push_back(s);
  }
  // One all-gather per group, all in flight at once, straight from the flat shard buffers.
  struct Gather {
    FSDPParamGroup* group;
    Tensor recv;
    dist::WorkPtr work;
  };
  std::vector<Gather> gathers;
  for (auto& s : states_) {
    if (!s->group) continue;
    FSDPParamGroup& g = *s->group;
    // On the group's device: an offloaded shard buffer sits in host memory, which NCCL cannot read.
    const Device dev = g.shard_group()->device();
    const Tensor flat = g.flat_shard().device() == dev ? g.flat_shard() : g.flat_shard().to(dev);
    Tensor recv = empty({int64_t(g.shard_group()->size()), flat.numel()}, {.dtype = flat.dtype(), .device = dev});
    gathers.push_back({&g, recv, g.shard_group()->all_gather_into_tensor(recv.view({-1}), flat)});
  }
  const bool hold = !opts_.rank0_only || dist::rank() == 0;
  std::unordered_map<TensorImpl*, size_t> index;  // shard -> its entry in held_
  {
    NoGradGuard no_grad;
    for (auto& ga : gathers) {
      ga.work->wait();
      for (auto& p : ga.group->params()) {
        index[p->sharded().impl()] = held_.size();
        Tensor full = hold ? assemble(*p, ga.recv) : Tensor();
        if (full.defined() && opts_.offload_to_cpu && !full.device().is_cpu()) {
          full = full.to(Device::cpu());
          if (p->requires_grad()) full.set_requires_grad(true);
        }
        held_.push_back({p.get(), ga.group, full, {}});
      }
      ga.recv = Tensor();
    }
  }
  for (auto& [name, m] : walk)
    for (auto& [pname, t] : m->named_parameters(false))
      if (auto it = index.find(t.impl()); it != index.end())
        held_[it->second].slots.push_back(&m->parameter_slot(pname));
  for (auto& s : states_) {
    summoned().insert(s.get());
    // Registered after fully_shard's own hooks, so these run after its pre- and post-forward;
    // the first runs before them, while the slots still hold what the caller left there.
    for (nn::Module* member : s->modules()) {
      hooks_.push_back(member->register_forward_pre_hook([this](nn::Module&, const TensorList&) {
        if (!forward_starter_) adopt_replacements();
        return std::optional<TensorList>();
      }, /*prepend=*/true));
      hooks_.push_back(member->register_forward_pre_hook([this](nn::Module& m, const TensorList&) {
        before_forward(m);
        return std::optional<TensorList>();
      }));
      hooks_.push_back(member->register_forward_hook([this](nn::Module& m, const TensorList&, const TensorList&) {
        if (&m == forward_starter_) {  // the forward's post-hooks resharded: full tensors again
          forward_starter_ = nullptr;
          point_slots_at_full();
        }
        return std::optional<TensorList>();
      }));
    }
  }
  active_ = true;
  point_slots_at_full();
}

// A failed exit is tried again without the writeback, so the module is not left holding full tensors.
SummonFullParams::~SummonFullParams() {
  for (int attempt = 0; attempt < 2 && active_; ++attempt, opts_.writeback = false) try {
      exit();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdp::SummonFullParams: error while restoring the shards: %s\n", e.what());
    }
}

void SummonFullParams::point_slots_at_full() {
  for (auto& h : held_)
    if (h.full.defined())
      for (Tensor* slot : h.slots) *slot = h.full;
}

// A parameter replaced inside the guard (set_parameter, a module's to()) rather than edited in
// place: its values become the full tensor's, so they reach the shards as an in-place edit
// would (a different dtype is converted to the parameter's); a different shape is an error.
void SummonFullParams::adopt_replacements() {
  NoGradGuard no_grad;
  for (auto& h : held_) {
    if (!h.full.defined()) continue;
    for (Tensor* slot : h.slots) {
      const bool fsdp_own = slot->defined() && (slot->is_same(h.param->sharded()) || slot->is_same(h.param->unsharded()));
      if (slot->is_same(h.full) || fsdp_own) continue;  // a forward inside the guard swaps in FSDP's own tensors
      WEFT_CHECK(slot->defined() && slot->shape() == h.full.shape(), "fsdp::SummonFullParams: parameter {} was "
                 "replaced inside the guard by {}, not a tensor of its full shape {}: its shards cannot take it",
                 h.param->name(), slot->defined() ? tensor_desc(*slot) : "an undefined tensor", shape_str(h.full.shape()));
      h.full.detach().copy_(*slot);
      *slot = h.full;
    }
  }
}

void SummonFullParams::writeback_to_shards() {
  adopt_replacements();
  NoGradGuard no_grad;
  for (auto& h : held_)
    if (h.full.defined()) h.param->load_full(h.full);  // this rank's chunk; padding stays zero
}

// A forward of a sharded module inside the guard: fully_shard's pre-forward has just gathered
// this module's group (and maybe started the next one's all-gather) from the shards, which do
// not have the edits yet. Bring the edits into the shards and into what is already gathered.
void SummonFullParams::before_forward(nn::Module& m) {
  WEFT_CHECK(!GradMode::is_enabled(),
             "fsdp::SummonFullParams: forward of sharded module {} inside the guard runs under NoGradGuard only "
             "(evaluation); train after the guard ends", m.type_name());
  WEFT_CHECK(opts_.writeback,
             "fsdp::SummonFullParams: forward of sharded module {} inside a guard with writeback = false: the "
             "forward gathers the shards, which never see the edits", m.type_name());
  if (forward_starter_ && forward_starter_ != &m) return;  // inside a forward already brought up to date
  forward_starter_ = &m;
  // No collective may still be reading a shard buffer when it is written.
  for (auto& s : states_)
    if (s->group && s->group->state() == FSDPParamGroup::State::gathering) s->group->finish_unshard();
  writeback_to_shards();
  NoGradGuard no_grad;
  for (auto& h : held_)
    if (h.full.defined() && h.group->state() == FSDPParamGroup::State::unsharded)
      h.param->unsharded().detach().copy_(h.full);
}

void SummonFullParams::exit() {
  if (!active_) return;
  if (opts_.writeback) adopt_replacements();  // a refused replacement leaves the guard as it was
  active_ = false;
  for (auto& h : hooks_) h.remove();
  hooks_.clear();
  for (auto& s : states_) summoned().erase(s.get());
  // A forward that failed inside the guard can leave groups gathered (or gathering, which
  // reads the shard buffer): settle them before writing the shards.
  for (auto& s : states_)
    if (s->group && s->group->state() != FSDPParamGroup::State::sharded) s->group->reshard();
  if (opts_.writeback) writeback_to_shards();
  for (auto& h : held_)
    for (Tensor* slot : h.slots) *slot = h.param->sharded();
  held_.clear();
  states_.clear();
}

}  // namespace weft::fsdp
