#include "fsdp/state.h"

#include <cstdio>
#include <map>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "core/deterministic.h"
#include "core/grad_mode.h"
#include "core/trace.h"
#include "dist/device_mesh.h"
#include "fsdp/comm_context.h"

namespace weft::fsdp {

namespace {

// Identity on the module's inputs whose backward runs when the gradients of all of them are
// complete, i.e. when the module's own backward has finished.
class PostBackward : public autograd::Function {
 public:
  explicit PostBackward(std::weak_ptr<FSDPState> s) : state_(std::move(s)) {}
  std::string name() const override { return "FSDPPostBackward"; }
  TensorList forward(autograd::FunctionCtx&, const TensorList& inputs) override { return inputs; }
  TensorList backward(autograd::FunctionCtx&, const TensorList& grads) override {
    if (auto s = state_.lock()) s->member_inputs_done();
    return grads;
  }

 private:
  std::weak_ptr<FSDPState> state_;
};

// The roots whose end-of-backward callbacks the running backward queued.
std::vector<std::string>& backward_roots() {
  static std::vector<std::string> roots;
  return roots;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

const char* training_state_name(TrainingState state) {
  switch (state) {
    case TrainingState::idle: return "IDLE";
    case TrainingState::forward: return "FORWARD";
    case TrainingState::pre_backward: return "PRE_BACKWARD";
    case TrainingState::post_backward: return "POST_BACKWARD";
  }
  return "?";
}

std::shared_ptr<FSDPState> state_of(const nn::Module& module) { return module.extension_as<FSDPState>(); }

FSDPState::FSDPState(std::vector<nn::Module*> modules, const FullyShardOptions& opts, std::unique_ptr<FSDPParamGroup> g,
                     std::shared_ptr<dist::DeviceMesh> mesh_)
    : group(std::move(g)), mesh(std::move(mesh_)), modules_(std::move(modules)), members_to_run_(modules_.size(), false),
      mp_(opts.mp_policy) {
  for (nn::Module* m : modules_) path_ += (path_.empty() ? "" : "+") + m->type_name();
  if (opts.reshard_after_forward) {
    if (const bool* b = std::get_if<bool>(&*opts.reshard_after_forward)) {
      reshard_after_forward_ = *b;
    } else {
      int k = std::get<int>(*opts.reshard_after_forward);
      int n = mesh->group(mesh->ndim() - 1)->size();
      WEFT_CHECK(mesh->ndim() == 1, "fully_shard: reshard_after_forward = {} needs a 1-D mesh, got {}", k, mesh->str());
      // As FSDP2: a non-trivial divisor of the shard dim's size. 1 would keep the full
      // parameters (false) and n would be plain resharding (true).
      WEFT_CHECK(k > 1 && k < n && n % k == 0,
                 "fully_shard: reshard_after_forward = {} must divide the {} ranks of the mesh and lie strictly between "
                 "1 and {} (for 1 pass false: keep the full parameters; for {} pass true: reshard to the shards)",
                 k, n, n, n);
      reshard_after_forward_ = true;
      // Groups of k neighbouring ranks (dist's shared mesh: one communicator per k for all modules).
      reshard_group_ = dist::default_mesh(mesh->device_type(), {n / k, k})->group(1);
    }
  }
}

std::vector<std::pair<std::string, nn::Module*>> named_modules_of(const std::vector<nn::Module*>& members) {
  std::vector<std::pair<std::string, nn::Module*>> out;
  for (size_t i = 0; i < members.size(); ++i)
    for (auto& [name, m] : members[i]->named_modules()) {
      std::string prefix = members.size() == 1 ? "" : std::to_string(i);
      out.emplace_back(prefix.empty() || name.empty() ? prefix + name : prefix + "." + name, m.get());
    }
  return out;
}

void FSDPState::check_alive() const {
  for (const auto& o : owners)
    WEFT_CHECK(!o.expired(), "FSDPModule of {}: the module fully_shard was applied to has been destroyed (keep the "
               "model alive while its FSDPModule is used)", path_);
}

std::vector<std::pair<std::string, nn::Module*>> FSDPState::named_modules() const {
  check_alive();
  return named_modules_of(modules_);
}

void FSDPState::lazy_init() {
  is_root_ = true;
  root_ = weak_from_this();
  // Every sharded module below this one becomes part of this root's step, and its group issues
  // its collectives through this root's communication context. A list's state is met once per
  // member: its path names them all ("blocks.0+blocks.1").
  std::shared_ptr<CommContext> comm = group ? group->comm_context() : std::make_shared<CommContext>();
  std::map<FSDPState*, std::string> paths;
  for (auto& [name, m] : named_modules()) {
    auto s = state_of(*m);
    if (!s) continue;
    std::string here = name.empty() ? m->type_name() : name;
    if (auto it = paths.find(s.get()); it != paths.end()) {
      it->second += "+" + here;
      continue;
    }
    paths[s.get()] = here;
    if (s.get() != this) {
      WEFT_CHECK(!s->is_root_.value_or(false) || (s->recording_order_.empty() && !s->forward_order_),
                 "fsdp: module '{}' ran forward as a root before its parent's first forward; call the "
                 "outermost sharded module", here);
      s->is_root_ = false;
      s->root_ = weak_from_this();
    }
    if (!s->reshard_after_forward_) s->reshard_after_forward_ = s.get() != this;  // root keeps its params
    if (!s->is_last_backward_) is_last_backward_ = false;  // set on a module before the first forward
    states_.push_back(s.get());
  }
  for (FSDPState* s : states_) {
    s->path_ = paths[s];
    if (s->group) {
      s->group->label = s->path_;
      s->group->set_comm_context(comm);
    }
  }
  try {
    validate_across_ranks();
  } catch (...) {  // not a root yet: the next forward initialises again (as on the other ranks, which failed alike)
    is_root_.reset();
    states_.clear();
    throw;
  }
}

void FSDPState::transition(TrainingState to, std::initializer_list<TrainingState> from, const char* hook) {
  for (TrainingState f : from)
    if (training_state_ == f) {
      training_state_ = to;
      return;
    }
  std::string allowed;
  for (TrainingState f : from) allowed += (allowed.empty() ? "" : " or ") + std::string(training_state_name(f));
  WEFT_ERROR("fsdp: {} of module '{}' cannot move its training state from {} to {} (only from {}); the module's "
             "forward and backward hooks ran out of order (a forward or backward re-entered, or one interrupted "
             "without the root's next forward to reset it)",
             hook, path_, training_state_name(training_state_), training_state_name(to), allowed);
}

// Every rank must hold the same model: same parameter names, global shapes, dtypes, shard dims (a
// shard_placement_fn's) and frozen ones in the same order, or the collectives would mismatch.
// Compared by hash, then per parameter to name the first difference; every rank raises the same error.
void FSDPState::validate_across_ranks() {
  auto pg = mesh->group(mesh->ndim() - 1);
  if (pg->device().is_meta()) return;  // a fake group (a memory plan): no other ranks to compare with
  std::vector<std::string> descs;
  for (FSDPState* s : states_)
    if (s->group)
      for (auto& p : s->group->params())
        descs.push_back(fmt::format("{} {} {}, sharded on dim {}{}", p->name(), shape_str(p->global_shape()),
                                    dtype_name(p->dtype()), p->shard_dim(), p->requires_grad() ? "" : ", frozen"));
  int world = pg->size();
  // Exchanged on the group's device (NCCL takes CUDA tensors only), read on the host.
  Device dev = pg->device();
  Tensor count = scalar_tensor(double(descs.size()), {.dtype = DType::i64}).view({1}).to(dev);
  Tensor counts = empty({world}, {.dtype = DType::i64, .device = dev});
  pg->all_gather_into_tensor(counts, count)->wait();
  counts = counts.to(kCPU);
  int64_t max_count = 0;
  for (double c : to_vector(counts)) max_count = std::max<int64_t>(max_count, int64_t(c));
  Tensor hashes = zeros({max_count}, {.dtype = DType::i64});
  for (size_t i = 0; i < descs.size(); ++i) hashes.data<int64_t>()[i] = int64_t(fnv1a(descs[i]) >> 1);
  Tensor all = empty({int64_t(world) * max_count}, {.dtype = DType::i64, .device = dev});
  if (max_count > 0) pg->all_gather_into_tensor(all, hashes.to(dev))->wait();
  all = all.to(kCPU);
  auto c = to_vector(counts);
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < max_count; ++i) {
    for (int r = 1; r < world; ++r) {
      bool differ = (i < int64_t(c[0])) != (i < int64_t(c[size_t(r)])) || h[i] != h[int64_t(r) * max_count + i];
      if (!differ) continue;
      std::string mine = i < int64_t(descs.size()) ? descs[size_t(i)] : "(none)";
      WEFT_ERROR("fully_shard: ranks hold different models: parameter #{} differs between rank 0 and rank {} "
                 "(this rank, {}, has \"{}\"; {} parameters here, counts per rank {})",
                 i, r, pg->rank(), mine, descs.size(), shape_str(Shape(c.begin(), c.end())));
    }
  }
}

void FSDPState::reset_iteration() {
  // A forward or backward that threw midway (the step did not come back to IDLE) can leave groups gathered: start
  // clean. After a completed step, groups left unsharded on purpose (reshard_after_backward off, a root that keeps its
  // parameters) stay so: the next forward needs no all-gather for them.
  const bool interrupted = step_ != TrainingState::idle;
  if (!autograd::Engine::is_running()) backward_roots().clear();  // stale: a backward that threw, of any root
  for (FSDPState* s : states_) {
    s->training_state_ = TrainingState::idle, s->hooked_calls_ = s->inputs_fired_ = s->unhooked_calls_ = 0;
    s->nested_forwards_ = 0;
    // A list whose members did not all run (a forward without gradients may skip some) is still gathered: reshard it.
    const bool list_unfinished = s->members_left_ > 0;
    s->members_left_ = 0;
    if (!s->group) continue;
    if (list_unfinished && s->group->state() != FSDPParamGroup::State::sharded) s->group->reshard();
    if (s->group->reduce_scatter_pending()) s->group->finish_reduce_scatter();
    if (interrupted && s->group->state() != FSDPParamGroup::State::sharded) s->group->reshard();
  }
  step_ = TrainingState::idle;
}

FSDPState* FSDPState::next_in_order(int direction) {
  FSDPState* r = root();
  if (!r || !r->forward_order_) return nullptr;
  auto& order = *r->forward_order_;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != this) continue;
    int64_t j = int64_t(i) + direction;
    while (j >= 0 && j < int64_t(order.size())) {
      if (order[size_t(j)]->group) return order[size_t(j)];
      j += direction;
    }
    return nullptr;
  }
  return nullptr;
}

namespace {
// One backward through several roots means the module that calls them is not sharded: its own
// parameters get each rank's gradients unsynchronized and drift apart. FSDP2 allows the
// pattern, so this warns (once per process) rather than fails.
void warn_if_parent_unsharded() {
  auto& roots = backward_roots();
  static bool warned = false;
  if (roots.size() > 1 && !warned) {
    warned = true;
    std::string names;
    for (auto& n : roots) names += (names.empty() ? "'" : ", '") + n + "'";
    std::fprintf(stderr,
                 "fsdp: warning: one backward ran through %zu separately sharded modules (%s) that are each a root: the "
                 "module that calls them is not sharded, so its own parameters, if any, get different gradients on "
                 "each rank and drift apart. Call fully_shard on the whole model last.\n", roots.size(), names.c_str());
  }
  roots.clear();
}
}  // namespace

std::optional<TensorList> FSDPState::pre_forward(const TensorList& inputs, size_t member) {
  // A list's later members join the forward their group's first member started.
  if (members_left_ > 0 && !members_to_run_[member]) {
    members_to_run_[member] = true;
    return prepare_inputs(inputs);
  }
  // A call inside this module's own forward (a method through Module::call that calls the module, FSDP2's
  // register_fsdp_forward_method): gathered already, and the outer call's hooks do the rest.
  if (nn::Module::calls_in_progress(*modules_[member]) > 1) {
    ++nested_forwards_;
    return prepare_inputs(inputs);
  }
  // Names the collectives issued from here in the fingerprint check and the flight recorder.
  dist::CollectiveLabel label(fmt::format("fsdp '{}' FORWARD", path_));
  if (!is_root_.has_value()) lazy_init();
  if (*is_root_) {
    if (grad_forwards_ == 0 || step_ != TrainingState::idle) reset_iteration();  // else a second forward, one step
    if (!forward_order_) recording_order_.clear();
    step_ = TrainingState::forward;
    // set_post_optim_event: the gathers wait for the event besides the issuing stream.
    if (post_optim_event_) {
      for (FSDPState* s : states_)
        if (s->group) s->group->comm_context()->all_gather_stream(s->group->compute_device()).wait(*post_optim_event_);
      post_optim_event_.reset();
    }
  }
  transition(TrainingState::forward, {TrainingState::idle}, "pre-forward");
  if (modules_.size() > 1) {
    members_to_run_.assign(modules_.size(), false);
    members_to_run_[member] = true;
    members_left_ = modules_.size();
  }
  forward_started_us_ = trace::enabled() ? trace::now_us() : 0;
  FSDPState* r = root();
  if (r && !r->forward_order_) r->recording_order_.push_back(this);
  if (group) {
    group->follow_requires_grad();
    group->finish_unshard();
    // Prefetch: the next group's all-gather runs while this module computes. Not in a recompute inside the backward
    // (activation checkpointing): the next group's backward has run, and its gather would outlive the step.
    if (autograd::Engine::is_running()) {
    } else if (forward_prefetch_) {
      for (auto& w : *forward_prefetch_)
        if (auto s = w.lock(); s && s->group) s->group->start_unshard();
    } else if (FSDPState* next = next_in_order(+1)) {
      next->group->start_unshard();
    }
  }
  return prepare_inputs(inputs);
}

TensorList FSDPState::prepare_inputs(const TensorList& inputs) {
  TensorList out = inputs;
  if (mp_.param_dtype && mp_.cast_forward_inputs)
    for (Tensor& t : out)
      if (t.defined() && is_floating(t.dtype()) && t.dtype() != *mp_.param_dtype) t = t.to(*mp_.param_dtype);
  // Hook the inputs that need gradients so this module's post-backward runs when they have them.
  TensorList need;
  std::vector<size_t> where;
  if (!GradMode::is_enabled() || !group) return out;
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].defined() && out[i].requires_grad()) need.push_back(out[i]), where.push_back(i);
  ++(need.empty() ? unhooked_calls_ : hooked_calls_);
  if (!need.empty()) {
    TensorList wrapped = autograd::Function::apply<PostBackward>(need, weak_from_this());
    for (size_t k = 0; k < where.size(); ++k) out[where[k]] = wrapped[k];
  }
  return out;
}

void FSDPState::member_inputs_done() {
  // The post-backward waits for the inputs of every call (a list's members, one after another or side by side; a
  // module called twice); a call without such inputs leaves it to the end of the backward.
  if (++inputs_fired_ < hooked_calls_ || unhooked_calls_ > 0) return;
  post_backward();
}

std::optional<TensorList> FSDPState::post_forward(const TensorList& outputs, size_t member) {
  if (nested_forwards_ > 0) {
    --nested_forwards_;
    return prepare_outputs(outputs);
  }
  if (modules_.size() > 1) {
    if (members_left_ == 0 || !members_to_run_[member]) return prepare_outputs(outputs);  // a member run twice
    if (--members_left_ > 0) return prepare_outputs(outputs);  // the group stays gathered for the others
  }
  transition(TrainingState::idle, {TrainingState::forward}, "post-forward");
  bool grad = GradMode::is_enabled();
  if (*is_root_) {  // the root's forward ends last: the order is recorded
    if (!forward_order_) forward_order_ = std::move(recording_order_);
    recording_order_.clear();
    step_ = TrainingState::idle;
    grad_forwards_ += grad;
    // A group still gathering was prefetched for a module this forward did not run: its gather would outlive the step.
    for (FSDPState* s : states_)
      if (s->group && s->group->state() == FSDPParamGroup::State::gathering) s->group->reshard();
  }
  // Without gradients no backward follows, so nothing needs to stay gathered.
  if (group && (*reshard_after_forward_ || !grad)) {
    if (grad && reshard_group_) group->reshard_to_subgroup(reshard_group_);
    else group->reshard();
  }
  if (forward_started_us_)
    trace::record("forward " + path_, "fsdp", forward_started_us_, trace::now_us() - forward_started_us_);
  return prepare_outputs(outputs);
}

TensorList FSDPState::prepare_outputs(const TensorList& outputs) {
  TensorList out = outputs;
  if (mp_.output_dtype)
    for (Tensor& t : out)
      if (t.defined() && is_floating(t.dtype()) && t.dtype() != *mp_.output_dtype) t = t.to(*mp_.output_dtype);
  if (GradMode::is_enabled()) {
    std::weak_ptr<FSDPState> self = weak_from_this();
    for (Tensor& t : out)
      if (t.defined() && t.requires_grad())
        t.register_hook([self](const Tensor&) {
          if (auto s = self.lock()) s->pre_backward();
          return Tensor();
        });
  }
  return out;
}

void FSDPState::set_post_optim_event(Event event) {
  FSDPState* r = root();
  (r ? r : this)->post_optim_event_ = std::move(event);
}

void FSDPState::pre_backward() {
  // Once per backward: the hook is on every output of the module.
  if (training_state_ == TrainingState::pre_backward || training_state_ == TrainingState::post_backward) return;
  WEFT_CHECK(members_left_ == 0,
             "fsdp: backward reached the group of modules '{}' (one fully_shard call on a list) whose forward ran only "
             "{} of its {} modules; each forward that needs gradients must run every module of the list, as the "
             "group is resharded when the last of them ends its forward", path_, modules_.size() - members_left_,
             modules_.size());
  transition(TrainingState::pre_backward, {TrainingState::idle}, "pre-backward");
  dist::CollectiveLabel label(fmt::format("fsdp '{}' PRE_BACKWARD", path_));
  backward_started_us_ = trace::enabled() ? trace::now_us() : 0;
  if (FSDPState* r = root(); r && r->step_ != TrainingState::pre_backward) {
    r->step_ = TrainingState::pre_backward;
    backward_roots().push_back(r->path_);
    autograd::Engine::queue_callback([r] { r->root_final_callback(); });
  }
  if (!group || !unshard_in_backward_) return;
  group->finish_unshard();
  if (backward_prefetch_) {
    for (auto& w : *backward_prefetch_)
      if (auto s = w.lock(); s && s->group && s->unshard_in_backward_) s->group->start_unshard();
  } else if (FSDPState* prev = next_in_order(-1)) {
    if (*prev->reshard_after_forward_ && prev->unshard_in_backward_) prev->group->start_unshard();
  }
}

void FSDPState::post_backward() {
  // Once per backward: the identity Function fires it, or the root's end-of-backward callback.
  if (!group || training_state_ == TrainingState::post_backward) return;
  transition(TrainingState::post_backward, {TrainingState::idle, TrainingState::pre_backward}, "post-backward");
  dist::CollectiveLabel label(fmt::format("fsdp '{}' POST_BACKWARD", path_));
  if (backward_started_us_)
    trace::record("backward " + path_, "fsdp", backward_started_us_, trace::now_us() - backward_started_us_);
  // Gradients accumulated across backwards without sync are kept in the reduce dtype, as
  // FSDP2 does (not in a lower param dtype).
  group->accumulate_unsharded_grads();
  if (deterministic()) group->add_grad_leaf();
  if (requires_gradient_sync_) {
    // At most one reduce-scatter in flight besides this one: finishing the previous group's
    // frees its send buffer before this group's is filled (the backward memory bound).
    FSDPState* r = root() ? root() : this;
    if (r->last_reduce_scatter_ && r->last_reduce_scatter_ != this && r->last_reduce_scatter_->group)
      r->last_reduce_scatter_->group->finish_reduce_scatter();
    group->start_reduce_scatter();
    r->last_reduce_scatter_ = this;
  }
  if (reshard_after_backward_) group->reshard();
}

void FSDPState::root_final_callback() {
  warn_if_parent_unsharded();
  dist::CollectiveLabel label(fmt::format("fsdp '{}' end of backward", path_));
  // Groups whose inputs needed no gradient (the root itself, a first layer fed raw data)
  // have not run their post-backward yet.
  for (auto it = states_.rbegin(); it != states_.rend(); ++it) {
    FSDPState* s = *it;
    if (!s->group || s->training_state_ == TrainingState::post_backward) continue;
    if (s->group->state() != FSDPParamGroup::State::sharded || s->group->has_unsharded_grads()) s->post_backward();
  }
  bool offloaded = false;
  for (FSDPState* s : states_) {
    if (s->group && is_last_backward_) s->group->finish_reduce_scatter();  // set on any module of this root
    if (s->group && s->group->state() == FSDPParamGroup::State::gathering) s->group->reshard();  // never consumed
    if (s->group && s->group->offloaded()) offloaded = true;
    s->training_state_ = TrainingState::idle;
    s->inputs_fired_ = 0;  // a backward through the same graph again (retain_graph) fires its hooks again
  }
  grad_forwards_ = 0;
  // With CPU offload the optimizer writes the pinned shards on the host next: every upload
  // from them (the all-gathers' copy-in) must have completed.
  if (offloaded)
    for (FSDPState* s : states_)
      if (s->group) s->group->comm_context()->release_all();
  last_reduce_scatter_ = nullptr;
  step_ = TrainingState::idle;
}

}  // namespace weft::fsdp
