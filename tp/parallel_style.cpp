#include "tp/parallel_style.h"

#include <memory>
#include <sstream>
#include <tuple>

#include "autograd/ops.h"
#include "core/error.h"
#include "tp/collectives.h"
#include "tp/vocab_parallel_loss.h"

namespace weft::tp {

using nn::TensorList;

namespace {

// This rank's `n / size` slice of `t` along `dim`, a new parameter with t's requires_grad.
Tensor slice_of(const Tensor& t, int64_t dim, const dist::ProcessGroup& group) {
  const int64_t n = t.size(dim) / group.size();
  Tensor part = t.detach().narrow(dim, group.rank() * n, n).clone();
  part.set_requires_grad(t.requires_grad());
  return part;
}

void check_splittable(const nn::Linear& l, Split split, const dist::ProcessGroupPtr& group, const std::string& path) {
  WEFT_CHECK(group != nullptr, "tp: parallelize {}: no process group", path);
  WEFT_CHECK(split == Split::colwise || split == Split::colwise_shared || split == Split::rowwise,
             "tp: {}: a Linear is split colwise, colwise_shared or rowwise", path);
  const bool col = split != Split::rowwise;
  const char* name = col ? "colwise" : "rowwise";
  WEFT_CHECK((col ? l.out_features : l.in_features) % group->size() == 0, "tp: {} {}: its {} {} do not divide over {} ranks",
             name, path, col ? "out_features" : "in_features", col ? l.out_features : l.in_features, group->size());
  WEFT_CHECK(l.weight.device().type != DeviceType::meta,
             "tp: {} {}: its weight is on the meta device; materialise the model before splitting it", name, path);
  WEFT_CHECK(!l.low_rank, "tp: {} {}: a layer with a low-rank adapter cannot be split (apply LoRA after tp)", name,
             path);
  WEFT_CHECK(col || !l.bias.defined(),
             "tp: rowwise {}: a rowwise layer with a bias is not supported (its bias would be added on every rank)",
             path);
}

void share_input(nn::Module& m, const dist::ProcessGroupPtr& group) {
  m.register_forward_pre_hook([group](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
    TensorList out = in;
    out[0] = copy_to_parallel(in[0], group);
    return out;
  });
}

void share_output(nn::Module& m, const dist::ProcessGroupPtr& group) {
  m.register_forward_hook([group](nn::Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
    return TensorList{copy_to_parallel(out[0], group)};
  });
}

// Ids outside this rank's rows look up row 0, then are zeroed (`hit` carries the mask from the
// pre-hook to the hook).
void split_vocab(nn::Embedding& e, const dist::ProcessGroupPtr& group) {
  const int64_t n = e.num_embeddings / group->size(), first = group->rank() * n;
  e.weight = slice_of(e.weight, 0, *group);
  e.num_embeddings = n;
  auto hit = std::make_shared<Tensor>();
  e.register_forward_pre_hook([hit, n, first](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
    VocabRows rows = vocab_rows_of(in[0], first, n);
    *hit = rows.hit;
    return TensorList{rows.local};
  });
  e.register_forward_hook([hit, group](nn::Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
    const Tensor rows = out[0] * hit->to(out[0].dtype()).unsqueeze(-1);
    *hit = Tensor();
    return TensorList{reduce_from_parallel(rows, group)};
  });
}

void check_module(nn::Module& m, Split split, const dist::ProcessGroupPtr& group, const std::string& path,
                  const std::string& pattern) {
  if (split == Split::shared_input || split == Split::shared_output) return;
  if (split == Split::vocab_rows) {
    auto* e = dynamic_cast<nn::Embedding*>(&m);
    WEFT_CHECK(e != nullptr, "tp: plan entry '{}' matches {}, a {}, not an Embedding", pattern, path, m.type_name());
    WEFT_CHECK(e->num_embeddings % group->size() == 0, "tp: vocab_rows {}: its {} rows do not divide over {} ranks",
               path, e->num_embeddings, group->size());
    WEFT_CHECK(e->weight.device().type != DeviceType::meta,
               "tp: vocab_rows {}: its weight is on the meta device; materialise the model before splitting it", path);
    return;
  }
  auto* linear = dynamic_cast<nn::Linear*>(&m);
  WEFT_CHECK(linear != nullptr, "tp: plan entry '{}' matches {}, a {}, not a Linear", pattern, path, m.type_name());
  check_splittable(*linear, split, group, path);
}

}  // namespace

void parallelize_linear(nn::Linear& l, Split split, const dist::ProcessGroupPtr& group, const std::string& path) {
  check_splittable(l, split, group, path);
  if (split != Split::rowwise) {
    l.weight = slice_of(l.weight, 0, *group);
    if (l.bias.defined()) l.bias = slice_of(l.bias, 0, *group);
    l.out_features /= group->size();
    if (split == Split::colwise) share_input(l, group);
    return;
  }
  l.weight = slice_of(l.weight, 1, *group);
  l.in_features /= group->size();
  l.register_forward_hook([group](nn::Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
    return TensorList{reduce_from_parallel(out[0], group)};
  });
}

namespace {

bool matches(const std::string& pattern, const std::string& path) {
  std::istringstream p(pattern), q(path);
  std::string a, b;
  while (true) {
    const bool more_p = bool(std::getline(p, a, '.')), more_q = bool(std::getline(q, b, '.'));
    if (!more_p || !more_q) return more_p == more_q;
    if (a != "*" && a != b) return false;
  }
}

}  // namespace

void parallelize_module(nn::Module& root, const dist::ProcessGroupPtr& group, const ParallelPlan& plan) {
  // Every entry is checked against every match before any layer is split.
  std::vector<std::tuple<nn::Module*, Split, std::string>> todo;
  const auto modules = root.named_modules();
  for (const auto& [pattern, split] : plan) {
    const size_t before = todo.size();
    for (const auto& [path, m] : modules) {
      if (path.empty() || !matches(pattern, path)) continue;
      check_module(*m, split, group, path, pattern);
      for (const auto& done : todo)
        WEFT_CHECK(std::get<0>(done) != m.get(), "tp: {} is matched by two plan entries (the second: '{}')", path, pattern);
      todo.emplace_back(m.get(), split, path);
    }
    WEFT_CHECK(todo.size() > before, "tp: plan entry '{}' matches no module of {}", pattern, root.type_name());
  }
  for (auto& [m, split, path] : todo) {
    if (split == Split::shared_input)
      share_input(*m, group);
    else if (split == Split::shared_output)
      share_output(*m, group);
    else if (split == Split::vocab_rows)
      split_vocab(static_cast<nn::Embedding&>(*m), group);
    else
      parallelize_linear(static_cast<nn::Linear&>(*m), split, group, path);
  }
}

}  // namespace weft::tp
