// fsdp: the per-module state behind fully_shard, attached to the module it shards (the module's extension slot,
// nn::ModuleExtension) and destroyed with it. It hooks the module's forward (pre: unshard and prefetch the next group;
// post: reshard and arm the backward hooks), the gradients of its outputs (pre-backward: unshard again and prefetch in
// reverse order) and of its inputs (post-backward through an identity Function: reduce-scatter and reshard). The root
// state — the outermost sharded module run in forward — also validates the model across ranks on the first forward and,
// at the end of every backward, finishes what its descendants left.
//
// One state may serve several sibling modules (fully_shard on a list): they form one group, gathered
// when the first of them starts its forward and resharded when the last of them ends it, as
// FSDP2's group forward hooks; every member's inputs and outputs carry the backward hooks, and the
// post-backward runs once the inputs of every member have their gradients.
//
// Progress is explicit, as FSDP2's TrainingState: each state is IDLE, FORWARD, PRE_BACKWARD or
// POST_BACKWARD, and every hook moves it through a checked transition:
//
//   IDLE --pre_forward--> FORWARD --post_forward--> IDLE
//   IDLE --pre_backward--> PRE_BACKWARD --post_backward--> POST_BACKWARD
//   IDLE --post_backward--> POST_BACKWARD   (a module whose outputs got no gradient)
//   any  --end of backward (root) / root's next forward--> IDLE
//
// A hook called in another state raises weft::Error naming the module, the current and the
// requested state. Repeated backward hooks of one backward (a module whose outputs or inputs
// are several tensors) are no-ops once the state has moved on.
#pragma once
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/stream.h"
#include "param_group.h"

namespace weft::fsdp {

using nn::TensorList;

class FSDPModule;

enum class TrainingState { idle, forward, pre_backward, post_backward };
// "IDLE", "FORWARD", "PRE_BACKWARD", "POST_BACKWARD" (FSDP2's names).
const char* training_state_name(TrainingState state);

class FSDPState : public nn::ModuleExtension, public std::enable_shared_from_this<FSDPState> {
 public:
  // `modules`: the module fully_shard was called on, or the members of the list (in order).
  FSDPState(std::vector<nn::Module*> modules, const FullyShardOptions& opts, std::unique_ptr<FSDPParamGroup> group,
            std::shared_ptr<dist::DeviceMesh> mesh);

  // Read by FSDPModule, state dicts, checkpoints and clip_grad_norm_.
  const std::unique_ptr<FSDPParamGroup> group;  // null when the module had no unsharded parameters left
  const std::shared_ptr<dist::DeviceMesh> mesh;

  // The members as fully_shard got them: an FSDPModule used after they are gone is an error.
  std::vector<std::weak_ptr<nn::Module>> owners;
  void check_alive() const;
  nn::Module& module() const { return check_alive(), *modules_[0]; }  // the first member of a list
  const std::vector<nn::Module*>& modules() const { return modules_; }
  // The modules this state covers and every module below them, named as under the module
  // fully_shard was called on (for a list: as a ModuleList of its members, "0.fc", "1.fc").
  std::vector<std::pair<std::string, nn::Module*>> named_modules() const;
  TrainingState training_state() const { return training_state_; }
  // The module's path under its root ("blocks.3"; the root's type name); its type name until the root's first forward.
  const std::string& path() const { return path_; }

  // The hooks fully_shard installs on each member module (`member`: its index in modules()).
  std::optional<TensorList> pre_forward(const TensorList& inputs, size_t member = 0);
  std::optional<TensorList> post_forward(const TensorList& outputs, size_t member = 0);
  void pre_backward();
  void post_backward();
  void member_inputs_done();  // a member's inputs got their gradients (a list waits for all)
  void set_post_optim_event(Event event);
  void root_final_callback();  // root only: the end of a backward

 private:
  friend class FSDPModule;  // its setters write the settings below

  void lazy_init();
  void validate_across_ranks();
  void reset_iteration();  // root: recover from an interrupted step
  FSDPState* root() const { return root_.lock().get(); }
  FSDPState* next_in_order(int direction);
  // Moves to `to` if the state is one of `from`; else raises weft::Error naming the module, the
  // current and the requested state and `hook`.
  void transition(TrainingState to, std::initializer_list<TrainingState> from, const char* hook);

  // The members' part of the forward hooks: input casts and post-backward hooks; output casts and pre-backward hooks.
  TensorList prepare_inputs(const TensorList& inputs);
  TensorList prepare_outputs(const TensorList& outputs);

  std::vector<nn::Module*> modules_;
  // A list's forward: the members that have not run yet (empty between forwards). In this step: the calls whose inputs
  // carry a post-backward hook, those fired in this backward, the calls with none (members' or repeats).
  std::vector<bool> members_to_run_;
  size_t members_left_ = 0;
  int hooked_calls_ = 0, inputs_fired_ = 0, unhooked_calls_ = 0;
  int nested_forwards_ = 0;  // calls of this module inside its own forward (a method run through Module::call)
  MixedPrecisionPolicy mp_;
  TrainingState training_state_ = TrainingState::idle;
  std::string path_;

  // Settings (FSDPModule's setters).
  std::optional<bool> reshard_after_forward_;  // resolved at lazy init
  dist::ProcessGroupPtr reshard_group_;        // reshard_after_forward = k: the k ranks to keep 1/k for
  bool requires_gradient_sync_ = true;
  bool reshard_after_backward_ = true;
  bool unshard_in_backward_ = true;
  bool is_last_backward_ = true;
  // Explicit prefetch targets; unset: the implicit order (the next or previous forward).
  std::optional<std::vector<std::weak_ptr<FSDPState>>> forward_prefetch_, backward_prefetch_;

  // Set by the root's lazy init.
  std::optional<bool> is_root_;
  std::weak_ptr<FSDPState> root_;

  // Root only: the step every state under it takes part in (FSDP2's state context).
  std::vector<FSDPState*> states_;  // every state under the root, pre-order, itself first
  // The order forwards ran in: being recorded during the first forward, then fixed.
  std::vector<FSDPState*> recording_order_;
  std::optional<std::vector<FSDPState*>> forward_order_;
  // The whole step: FORWARD while the root's forward runs, PRE_BACKWARD from the first
  // pre-backward hook of a backward (the end-of-backward callback is queued) to its callback.
  TrainingState step_ = TrainingState::idle;
  int grad_forwards_ = 0;  // forwards with gradients since the last backward (a second one joins the step)
  FSDPState* last_reduce_scatter_ = nullptr;  // the group whose reduce-scatter was started last
  std::optional<Event> post_optim_event_;     // set_post_optim_event: waited on by the next forward's gathers

  uint64_t forward_started_us_ = 0, backward_started_us_ = 0;  // for traces
};

// Every module of `members` and below them, named as under the module fully_shard was called
// on; several members are named as a ModuleList of them ("0", "0.fc", "1", ...).
std::vector<std::pair<std::string, nn::Module*>> named_modules_of(const std::vector<nn::Module*>& members);

// The state fully_shard attached to a module, or null.
std::shared_ptr<FSDPState> state_of(const nn::Module& module);

}  // namespace weft::fsdp
