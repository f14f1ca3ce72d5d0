#include "nn/activation_checkpoint.h"

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/kept_outputs.h"
#include "core/generator.h"
#include "core/grad_mode.h"

namespace weft::nn {
namespace {

class CheckpointFunction : public autograd::Function {
 public:
  CheckpointFunction(CheckpointFn fn, bool selective, const TensorList& reads) : fn_(std::move(fn)), selective_(selective) {
    for (const Tensor& t : reads)
      if (t.defined()) reads_.emplace_back(t.storage(), t.storage()->version);
  }
  std::string name() const override { return "CheckpointBackward"; }

  TensorList forward(autograd::FunctionCtx& ctx, const TensorList& inputs) override {
    rng_ = default_generator().state();
    autocast_ = autocast_dtype();
    ctx.save_for_backward(inputs);
    if (!selective_) return fn_(inputs);  // Function::run records nothing inside forward
    autograd::KeptOutputsGuard keep(kept_, autograd::KeptOutputs::Mode::record);
    return fn_(inputs);
  }

  TensorList backward(autograd::FunctionCtx& ctx, const TensorList& grad_outputs) override {
    for (size_t i = 0; i < reads_.size(); ++i)
      if (auto s = reads_[i].first.lock(); s && s->version != reads_[i].second)
        WEFT_ERROR("backward: parameter {} of a checkpointed block was written in place after its forward (its "
                   "storage's version {} -> {}; an optimizer step?), so the recompute would use other values: step "
                   "after backward", i, reads_[i].second, s->version);
    // The inputs again, as leaves of the recomputed graph.
    TensorList x;
    for (size_t i = 0; i < ctx.saved.size(); ++i) {
      Tensor t = ctx.saved[i].defined() ? ctx.saved[i].detach() : Tensor();
      if (t.defined() && i < ctx.needs_input_grad.size() && ctx.needs_input_grad[i]) t.set_requires_grad(true);
      x.push_back(t);
    }
    TensorList out;
    {
      auto now = default_generator().state();
      default_generator().set_state(rng_);
      struct Restore {
        Generator::State state;
        ~Restore() { default_generator().set_state(state); }
      } restore{now};
      // The recompute runs under the autocast state of the first forward (backward may run
      // outside the user's AutocastGuard).
      AutocastGuard autocast(autocast_.value_or(DType::bf16), autocast_.has_value());
      bool prev = GradMode::is_enabled();
      GradMode::set_enabled(true);
      try {
        std::optional<autograd::KeptOutputsGuard> replay;
        if (selective_) replay.emplace(kept_, autograd::KeptOutputs::Mode::replay);
        out = fn_(x);
        if (selective_) kept_.finish_replay();
      } catch (...) {
        GradMode::set_enabled(prev);
        throw;
      }
      GradMode::set_enabled(prev);
    }
    WEFT_CHECK(out.size() == grad_outputs.size(),
               "nn::checkpoint: the recomputed forward returned {} outputs, the first run {}", out.size(),
               grad_outputs.size());
    TensorList roots, grads;
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].defined() && out[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(out[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) autograd::Engine::backward(roots, grads);
    TensorList result;
    for (auto& t : x) result.push_back(t.defined() && t.requires_grad() ? t.grad() : Tensor());
    return result;
  }

 private:
  CheckpointFn fn_;
  bool selective_;
  autograd::KeptOutputs kept_;  // selective: the first forward's GEMM and attention outputs
  Generator::State rng_;
  std::optional<DType> autocast_;
  std::vector<std::pair<std::weak_ptr<StorageImpl>, uint64_t>> reads_;  // (storage, version) at the first run
};

}  // namespace

Checkpointing parse_checkpointing(const std::string& name, const std::string& what) {
  for (Checkpointing c : {Checkpointing::none, Checkpointing::selective, Checkpointing::full})
    if (name == checkpointing_name(c)) return c;
  WEFT_ERROR("{}: \"{}\" is not an activation checkpointing policy (none, selective or full)", what, name);
}

const char* checkpointing_name(Checkpointing c) {
  return c == Checkpointing::none ? "none" : c == Checkpointing::selective ? "selective" : "full";
}

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, bool selective, const TensorList& reads) {
  if (!GradMode::is_enabled()) return fn(inputs);
  bool any = false;
  for (const Tensor& t : inputs) any |= t.defined() && t.requires_grad();
  if (any) return autograd::Function::apply<CheckpointFunction>(inputs, fn, selective, reads);
  // No input needs a gradient, but fn's parameters may: an empty anchor that does makes the
  // call part of the graph, so the backward reaches the recompute.
  Tensor anchor = empty({0});
  anchor.set_requires_grad(true);
  TensorList in = inputs;
  in.push_back(anchor);
  const size_t n = inputs.size();
  return autograd::Function::apply<CheckpointFunction>(
      in, [fn, n](const TensorList& x) { return fn(TensorList(x.begin(), x.begin() + int64_t(n))); }, selective, reads);
}

}  // namespace weft::nn
