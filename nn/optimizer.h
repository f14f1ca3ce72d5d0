// nn: optimizers. Each holds parameter groups (tensors + options) and per-parameter state; step() updates parameters in
// place from their .grad() without recording a graph, with PyTorch's update formulas and operation order (single-tensor
// path), so results agree to float rounding. State dicts are flat lists of named tensors that round-trip through
// safetensors: "state.<i>.<name>" for parameter i (in group order) and "param_groups.<g>.<option>" as 0-dim f64
// tensors.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../core/autograd_meta.h"
#include "clip_grad.h"  // clip_grad_norm_, used beside every optimizer
#include "module.h"

namespace weft::nn {

// A parameter a transform took out of its module (fsdp::fully_shard replaces it by its shard)
// carries what replaced it under this key: step() names it to an optimizer still holding it.
extern const AttachmentKey<std::string> replaced_parameter;

// Parameters sharing options; `options` may override some of the optimizer's defaults
// (e.g. {{"weight_decay", 0.0}} for biases and norms).
struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  // step() from every gradient times grad_scale (the bits of scaling the gradients first), read in the update's own
  // pass, unwritten: opt.step_scaled(nn::clip_grad_coefficient(params, 1.0).coef) is clip_grad_norm_ then step().
  void step_scaled(double grad_scale);
  void zero_grad(bool set_to_none = true);

  // The LRScheduler that owns "lr" (one at a time: each sets lr from its own base, so a second would override it).
  std::weak_ptr<const char> scheduled_by;

  size_t num_groups() const { return groups_.size(); }
  // Read only: the constructor's checks (leaves, each once) hold for the optimizer's life.
  const std::vector<Tensor>& params(size_t group) const { return groups_[checked_group(group)].params; }
  double option(size_t group, const std::string& name) const;
  void set_option(size_t group, const std::string& name, double value);
  double lr(size_t group = 0) const { return option(group, "lr"); }
  void set_lr(double lr);  // all groups

  NamedTensorList state_dict() const;
  // Restores options and state; the parameter layout (groups, sizes, shapes) must match, the
  // options pass check_options, each parameter's state has exactly state_names() (when not
  // empty), and every state tensor passes check_state.
  void load_state_dict(const NamedTensorList& state);
  // The same, keeping the given tensors as the state where they have their parameter's device and dtype (no copy).
  void load_state_dict(NamedTensorList&& state);
  // Throws naming `key` when `value` cannot be per-parameter state `state` (e.g. "exp_avg") of
  // this optimizer: a NaN or an infinity anywhere; Adam adds a negative second moment or step.
  // A checkpoint loader calls it with its own names for the entries.
  virtual void check_state(const std::string& key, const std::string& state, const Tensor& value) const;

 protected:
  // `defaults` lists every option this optimizer knows; groups may override some.
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults);
  // Throws naming the option unless one group's options are valid: every value finite, lr >= 0,
  // and each optimizer's own rules. The constructors, set_option and load_state_dict call it.
  virtual void check_options(const std::map<std::string, double>& o) const;
  // The state a stepped parameter holds (sorted; none at all is also accepted: not stepped, or SGD
  // without momentum); empty: any.
  virtual std::vector<std::string> state_names() const { return {}; }
  size_t checked_group(size_t group) const;
  // Throws if a parameter was replaced in its module after this optimizer was built (e.g. by fsdp::fully_shard):
  // stepping it would train a tensor the model no longer uses. Each step() calls it first.
  void check_params() const;
  // Per-parameter state (e.g. "exp_avg"), created lazily by step().
  std::map<std::string, Tensor>& state_of(const Tensor& param);
  virtual bool scales_grads() const { return false; }
  double grad_scale_ = 1;  // step_scaled's, for the one step() it calls
  std::vector<ParamGroup> groups_;
  std::string name_;
  std::string state_owner_ = name_ + " state";  // names the state step() allocates in out-of-memory reports

 private:
  std::map<TensorImpl*, std::map<std::string, Tensor>> state_;
  void load_state(const NamedTensorList& state, bool keep);
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions opts);
  SGD(std::vector<ParamGroup> groups, SGDOptions opts);
  void step() override;

 protected:
  void check_options(const std::map<std::string, double>& o) const override;
  bool scales_grads() const override { return true; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }  // with momentum
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
};
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions opts);
  Adam(std::vector<ParamGroup> groups, AdamOptions opts);
  void step() override;
  void check_state(const std::string& key, const std::string& state, const Tensor& value) const override;

 protected:
  Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions opts, bool decoupled);
  void check_options(const std::map<std::string, double>& o) const override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq", "step"}; }
  bool scales_grads() const override { return true; }
  bool decoupled_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions opts);
  AdamW(std::vector<ParamGroup> groups, AdamWOptions opts);
};

}  // namespace weft::nn
