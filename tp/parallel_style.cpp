#include "tp/parallel_style.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <tuple>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/partial_reduction.h"
#include "dist/agree.h"
#include "dist/config_check.h"
#include "nn/layers.h"
#include "tp/collectives.h"
#include "tp/split.h"
#include "tp/vocab_parallel_loss.h"

namespace weft::tp {

using nn::TensorList;

namespace {

// This rank's `n / size` slice of `t` along `dim` (of each of `chunks` equal blocks along it, joined), a new parameter
// with t's requires_grad whose norms (nn::clip_grad_norm_) total over the group ([Note: partial reductions]).
Tensor slice_of(const Tensor& t, int64_t dim, const dist::ProcessGroupPtr& group, int64_t chunks = 1) {
  const int64_t block = t.size(dim) / chunks, n = block / group->size();
  std::vector<Tensor> parts;
  for (int64_t c = 0; c < chunks; ++c) parts.push_back(t.detach().narrow(dim, c * block + group->rank() * n, n));
  Tensor part = cat(parts, dim);  // a new tensor, even of one part
  part.set_requires_grad(t.requires_grad());
  if (group->size() > 1) set_partial_reduction(part, split_reduction(group, dim, chunks));
  return part;
}

const char* weights_name(Weights w) { return std::array{"whole", "colwise", "rowwise", "vocab_rows"}[size_t(w)]; }

void check_linear(const nn::Linear& l, Weights w, int64_t chunks, const dist::ProcessGroup& group,
                  const std::string& path) {
  const bool col = w == Weights::colwise;
  const int64_t parts = group.size() * (col ? chunks : 1);
  WEFT_CHECK((col ? l.out_features : l.in_features) % parts == 0, "tp: {} {}: its {} {} do not divide over {} ranks{}",
             weights_name(w), path, col ? "out_features" : "in_features", col ? l.out_features : l.in_features,
             group.size(), chunks > 1 ? fmt::format(" in each of {} blocks", chunks) : "");
}

// The modules a style was applied to, each holding its entry's token in a hook: an entry expires with its module.
std::map<const nn::Module*, std::weak_ptr<const bool>> g_styled;
void mark_styled(nn::Module& m) {
  std::erase_if(g_styled, [](const auto& entry) { return entry.second.expired(); });
  auto token = std::make_shared<const bool>(true);
  m.register_forward_pre_hook([token](nn::Module&, const TensorList&) { return std::optional<TensorList>(); });
  g_styled[&m] = token;
}

// fully_shard on `m` or a module under it (at one data-parallel rank no shard marks the weights) comes first no more.
void check_unsharded(nn::Module& m, const std::string& path) {
  for (const auto& [name, sub] : m.named_modules())
    WEFT_CHECK(!sub->extension(), "tp: fully_shard was applied to {} already: split a model first, then fully_shard",
               name.empty() ? path : path.empty() ? name : path + "." + name);
}

// Throws naming what about `m` stands in the way of `style` (`what` names the caller's entry).
void check(nn::Module& m, const Style& style, const dist::ProcessGroupPtr& group, const std::string& path,
           const std::string& what) {
  WEFT_CHECK(group != nullptr, "tp: parallelize {}: no process group", path);
  WEFT_CHECK(style.chunks >= 1, "tp: {} ({}): its style's chunks must be at least 1, got {}", path, what, style.chunks);
  WEFT_CHECK(style.chunks == 1 || style.weights == Weights::colwise, "tp: {} ({}): chunks {} splits colwise weights "
             "only, not {} ones", path, what, style.chunks, weights_name(style.weights));
  WEFT_CHECK(!style.sum_gradients || style.weights == Weights::whole, "tp: {} ({}): sum_gradients is for weights kept "
             "whole (a norm beside sequence parallelism); the ranks' {} parts are different rows", path, what,
             weights_name(style.weights));
  check_unsharded(m, path);
  WEFT_CHECK(style.weights != Weights::colwise || (style.output != Comm::reduce && style.output != Comm::reduce_scatter),
             "tp: {} ({}): a colwise module's output is this rank's columns, not a partial sum to reduce", path, what);
  WEFT_CHECK(!g_styled.contains(&m) || g_styled.at(&m).expired(), "tp: {} ({}) has a parallel style already: a second one's "
             "collectives would run beside the first's (its values or gradients scaled by the group's size); "
             "parallelize a module once", path, what);
  if (style.weights == Weights::whole) return;
  auto* linear = dynamic_cast<nn::Linear*>(&m);
  auto* embedding = dynamic_cast<nn::Embedding*>(&m);
  if (style.weights == Weights::vocab_rows) {
    WEFT_CHECK(embedding != nullptr, "tp: {} matches {}, a {}, not an Embedding", what, path, m.type_name());
    WEFT_CHECK(embedding->num_embeddings % group->size() == 0, "tp: vocab_rows {}: its {} rows do not divide over {} ranks",
               path, embedding->num_embeddings, group->size());
  } else {
    WEFT_CHECK(linear != nullptr, "tp: {} matches {}, a {}, not a Linear", what, path, m.type_name());
    check_linear(*linear, style.weights, style.chunks, *group, path);
  }
  for (const auto& [name, p] : m.named_parameters(false)) {
    WEFT_CHECK(p.device().type != DeviceType::meta || MetaComputeGuard::enabled(),
               "tp: {} {}: its {} is on the meta device; materialise the model before splitting it (a meta model "
               "splits only for shapes, under a MetaComputeGuard: a memory plan)",
               weights_name(style.weights), path, name);
    WEFT_CHECK(partial_reduction(p) == nullptr, "tp: {} {}: its {} is held in part already (split, or sharded by "
               "fully_shard): split a model once, before fully_shard", weights_name(style.weights), path, name);
  }
}

// Ids outside this rank's rows look up row 0, then are zeroed (`hit` carries the mask from the pre-hook to the hook).
void split_vocab(nn::Embedding& e, const dist::ProcessGroupPtr& group) {
  const int64_t total = e.num_embeddings, n = total / group->size(), first = group->rank() * n;
  e.weight = slice_of(e.weight, 0, group);
  e.num_embeddings = n;
  auto hit = std::make_shared<Tensor>();
  e.register_forward_pre_hook([hit, n, first, total](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
    if (const int64_t at = first_id_outside(in[0], total); at >= 0)  // every rank sees the same ids: all throw
      WEFT_CHECK(false, "embedding: index {} is out of range for {} embeddings (split by vocabulary over {} ranks)",
                 int64_t(in[0].reshape({-1})[at].item()), total, total / n);
    VocabRows rows = vocab_rows_of(in[0], first, n);
    *hit = rows.hit;
    return TensorList{rows.local};
  });
  e.register_forward_hook([hit](nn::Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
    const Tensor rows = out[0] * hit->to(out[0].dtype()).unsqueeze(-1);
    *hit = Tensor();
    return TensorList{rows};
  });
}

void sum_gradients(nn::Module& m, const dist::ProcessGroupPtr& group);

// A LoRA adapter (nn/lora.h) splits with its layer: colwise, B's rows (A whole, its gradient
// summed: each rank's B rows add to it); rowwise, A's columns (B whole, applied to a partial sum:
// its gradient summed). The adapter's term is then the same part of y as the layer's own.
void split_weights(nn::Module& m, const Style& style, const dist::ProcessGroupPtr& group) {
  if (style.weights == Weights::vocab_rows) return split_vocab(static_cast<nn::Embedding&>(m), group);
  auto& l = static_cast<nn::Linear&>(m);
  const int P = group->size();
  if (style.weights == Weights::colwise) {
    l.weight = slice_of(l.weight, 0, group, style.chunks);
    if (l.bias.defined()) l.bias = slice_of(l.bias, 0, group, style.chunks);
    l.out_features /= P;
    if (!l.low_rank) return;
    nn::Linear& b = *l.low_rank->b;
    b.weight = slice_of(b.weight, 0, group, style.chunks);
    b.out_features /= P;
    sum_gradients(*l.low_rank->a, group);
  } else {
    l.weight = slice_of(l.weight, 1, group);
    l.in_features /= P;
    if (!l.low_rank) return;
    nn::Linear& a = *l.low_rank->a;
    a.weight = slice_of(a.weight, 1, group);
    a.in_features /= P;
    sum_gradients(*l.low_rank->b, group);
    if (auto* d = dynamic_cast<nn::Dropout*>(l.low_rank->dropout.get())) d->block = {-1, P, group->rank()};  // x's columns
  }
}

Tensor communicate(const Tensor& x, Comm c, const dist::ProcessGroupPtr& g) {
  switch (c) {
    case Comm::none: return x;
    case Comm::copy: return copy_to_parallel(x, g);
    case Comm::reduce: return reduce_from_parallel(x, g);
    case Comm::gather: return gather_from_parallel(x, g, 1);
    case Comm::scatter: return scatter_to_parallel(x, g, 1);
    case Comm::gather_sequence: return gather_sequence_parallel(x, g, 1);
    case Comm::reduce_scatter: return reduce_scatter_parallel(x, g, 1);
  }
  return x;
}

// While `m` runs, the slot of each parameter `view` names holds view(p) (parallel_style.h).
using View = std::function<std::optional<Tensor>(const std::string& name, const Tensor& p)>;
std::map<const nn::Module*, std::weak_ptr<const void>> g_swapping;  // as g_styled: the modules while_running hooks
void while_running(nn::Module& m, View view) {
  std::erase_if(g_swapping, [](const auto& entry) { return entry.second.expired(); });
  auto held = std::make_shared<std::vector<std::pair<std::string, Tensor>>>();
  g_swapping[&m] = held;
  auto restore = [held](nn::Module& mod) {
    for (auto& [name, p] : *held) mod.parameter_slot(name) = p;
    held->clear();
  };
  m.register_forward_pre_hook([view, held, restore](nn::Module& mod, const TensorList&) -> std::optional<TensorList> {
    restore(mod);  // after a forward that threw
    for (auto& [name, p] : mod.named_parameters(false))
      if (std::optional<Tensor> v = view(name, p)) {
        held->emplace_back(name, p);
        mod.parameter_slot(name) = *v;
      }
    return std::nullopt;
  });
  m.register_forward_hook([restore](nn::Module& mod, const TensorList&, const TensorList&) -> std::optional<TensorList> {
    restore(mod);
    return std::nullopt;
  });
}

void apply(nn::Module& m, const Style& style, const dist::ProcessGroupPtr& group) {
  mark_styled(m);
  if (style.weights != Weights::whole) split_weights(m, style, group);
  if (style.input != Comm::none)
    m.register_forward_pre_hook([group, c = style.input](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
      TensorList out = in;
      out[0] = communicate(in[0], c, group);
      return out;
    });
  if (style.output != Comm::none)
    m.register_forward_hook(
        [group, c = style.output](nn::Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
          return TensorList{communicate(out[0], c, group)};
        });
  if (style.sum_gradients) sum_gradients(m, group);
  // A rowwise bias counts once: rank 0's partial output adds it, and its gradient (rank 0's,
  // zeros elsewhere) is summed into every rank's.
  if (style.weights == Weights::rowwise && static_cast<nn::Linear&>(m).bias.defined())
    while_running(m, [group](const std::string& name, const Tensor& p) -> std::optional<Tensor> {
      if (name != "bias") return std::nullopt;
      return copy_to_parallel(p, group) * (group->rank() == 0 ? 1.0 : 0.0);
    });
}

void sum_gradients(nn::Module& m, const dist::ProcessGroupPtr& group) {
  while_running(m, [group](const std::string&, const Tensor& p) { return copy_to_parallel(p, group); });
}

// Each rank keeps its part of its own tensors, so the ranks (a seed per rank would differ) compare a 64-bit hash of
// each parameter's bytes first (a meta one: dtype and shape). PyTorch's parallelize_module scatters rank 0's instead.
using Styled = std::tuple<nn::Module*, Style, std::string>;  // a module, its style, its path
void check_same_values(const std::vector<Styled>& modules, const dist::ProcessGroupPtr& group) {
  if (group->size() == 1 || group->device().is_meta()) return;
  dist::ConfigSettings values;
  for (const auto& [m, style, path] : modules)
    for (const auto& [name, p] : m->named_parameters()) {
      std::string v = std::string(dtype_name(p.dtype())) + shape_str(p.shape());
      const Tensor c = p.device().is_meta() ? Tensor() : p.detach().to(kCPU).contiguous();
      if (c.defined())
        v += fmt::format(" hash {:016x}", std::hash<std::string_view>{}({static_cast<char*>(c.data_ptr()), c.nbytes()}));
      values.emplace_back(fmt::format("the values of {}.{}", path, name), v);
    }
  dist::check_same_config(values, "tp: parallelize", group, "every rank of the group must hold the same values "
                          "before the split: seed every rank alike, or load the same checkpoint on each");
}

std::string describe(const Style& st) {
  return fmt::format("{} {} {} {} {}", int(st.weights), int(st.input), int(st.output), st.sum_gradients, st.chunks);
}

// A parameter a split module shares with a module outside the split (a tied head and embedding) would come untied.
void check_untied(nn::Module& root, const std::vector<Styled>& todo) {
  std::map<const void*, std::vector<std::string>> holders;  // each parameter's slots, by module path
  for (const auto& [path, m] : root.named_modules())
    for (const auto& [name, p] : m->named_parameters(false)) holders[p.impl_ptr().get()].push_back(path + "." + name);
  for (const auto& [m, style, path] : todo)
    for (const auto& [name, p] : m->named_parameters(false))
      if (const auto& at = holders[p.impl_ptr().get()]; style.weights != Weights::whole && at.size() > 1)
        WEFT_ERROR("tp: {}.{} is tied to {} (one tensor): splitting {} would untie them; keep the tied module whole, "
                   "or untie them before the split", path, name, at[0] == path + "." + name ? at[1] : at[0], path);
}

bool matches(const std::string& pattern, const std::string& path) {
  std::istringstream p(pattern), q(path);
  std::string a, b;
  while (true) {
    const bool more_p = bool(std::getline(p, a, '.')), more_q = bool(std::getline(q, b, '.'));
    if (!more_p || !more_q) return more_p == more_q;
    if (a != "*" && a != b) return false;
  }
}

// Every path to every module: one registered twice is under each (named_modules lists it at its first only).
std::vector<std::pair<std::string, nn::Module*>> every_path(nn::Module& root) {
  std::vector<std::pair<std::string, nn::Module*>> out;
  std::function<void(nn::Module&, const std::string&)> walk = [&](nn::Module& m, const std::string& at) {
    for (const auto& [n, c] : m.named_children()) walk(*out.emplace_back(at + n, c.get()).second, at + n + ".");
  };
  walk(root, "");
  return out;
}

}  // namespace

bool swaps_parameters(const nn::Module& module) {
  return g_swapping.contains(&module) && !g_swapping.at(&module).expired();
}

void parallelize(nn::Module& m, const Style& style, const dist::ProcessGroupPtr& group, const std::string& path) {
  const dist::ProcessGroupPtr real = group && !group->device().is_meta() ? group : nullptr;  // a plan's fake one: none
  dist::agree({real}, "tp: parallelize", [&] { check(m, style, group, path, path); });
  if (real) dist::check_same_config({{"the style of " + path, describe(style)}}, "tp: parallelize", group,
                                    "every rank of the group must split the module with the same style");
  check_same_values({{&m, style, path}}, group);
  apply(m, style, group);
}

void parallelize_module(nn::Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan) {
  // One plan on every rank of the group (different plans had split different layers, silently).
  WEFT_CHECK(group != nullptr, "tp: parallelize_module: no process group");
  std::string described;
  for (const auto& [pattern, st] : plan) described += pattern + " " + describe(st) + "; ";
  const std::vector<dist::ProcessGroupPtr> groups = {group->device().is_meta() ? nullptr : group};  // a plan's fake one
  if (groups[0]) dist::check_same_config({{"the plan", described}}, "tp: parallelize_module", group,
                                         "every rank of the group must split the model with the same plan");
  // Every entry is checked against every match before any module changes; a refusal stops every rank.
  std::vector<Styled> todo;
  const auto modules = every_path(root);
  dist::agree(groups, "tp: parallelize_module", [&] {
    check_unsharded(root, root.type_name());
    for (const auto& [pattern, style] : plan) {
      const size_t before = todo.size();
      for (const auto& [path, m] : modules) {
        if (!matches(pattern, path)) continue;
        const auto done = std::ranges::find(todo, m, [](const Styled& t) { return std::get<0>(t); });
        if (done != todo.end() && done - todo.begin() >= int64_t(before)) continue;  // registered twice: split once
        WEFT_CHECK(done == todo.end(), "tp: {} is matched by two plan entries (the second: '{}'){}", path, pattern,
                   std::get<2>(*done) == path ? "" : " at " + std::get<2>(*done) + ", the same module registered twice");
        check(*m, style, group, path, "plan entry '" + pattern + "'");
        todo.emplace_back(m, style, path);
      }
      WEFT_CHECK(todo.size() > before, "tp: plan entry '{}' matches no module of {}", pattern, root.type_name());
    }
    check_untied(root, todo);
  });
  check_same_values(todo, group);
  for (auto& [m, style, path] : todo) apply(*m, style, group);
}

}  // namespace weft::tp
