// Tensor parallelism (tp/): the differentiable collectives against their definitions, a
// colwise + rowwise pair against the unsplit layers, GPT-2's blocks, and Llama-family decoders split over every
// rank (the world as one tensor-parallel group) against the same model in one process: losses
// and parameters over AdamW steps, the gradients of Qwen2's q/k/v biases and Qwen3's head
// norms; (dp, tp) meshes with fully_shard over dp; plans and models that cannot be split raise
// the same error on every rank.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <optional>

#include "shared_dir.h"
#include "tp_test_models.h"

using namespace weft;
using namespace weft::tp_test;
using fsdp_test::check_close;
using Catch::Contains;

namespace {

// This rank's `n / P` slice along `dim` of the unsplit tensor (P the group's size).
Tensor my_slice(const Tensor& t, int64_t dim, const dist::ProcessGroup& g) {
  return t.narrow(dim, g.rank() * (t.size(dim) / g.size()), t.size(dim) / g.size());
}

// The split parameter's slice of the unsplit one: rows of colwise weights and biases, columns
// of rowwise weights, all of a whole one.
Tensor slice_like(const Tensor& whole, const Tensor& split, const dist::ProcessGroup& g) {
  if (whole.shape() == split.shape()) return whole;
  return my_slice(whole, whole.size(0) != split.size(0) ? 0 : 1, g);
}

// The split model's gradients against the unsplit one's, element by element: each split
// parameter's against this rank's slice.
void check_split_grads(nn::Module& split, nn::Module& whole, double rtol, const std::string& what) {
  auto s = split.named_parameters(), w = whole.named_parameters();
  REQUIRE(s.size() == w.size());
  for (size_t i = 0; i < s.size(); ++i) {
    REQUIRE(s[i].first == w[i].first);
    Tensor a = s[i].second.grad(), b = w[i].second.grad();
    check_close(values(a), values(slice_like(b, a, *group())), rtol, what + " " + s[i].first);
  }
}

// ||got - want|| <= rtol ||want|| (2-norms): parameters after AdamW steps, where an element whose
// gradient is near zero turns a rounding difference into a visible step (Adam divides by |g|).
void check_norm_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  const std::vector<double> a = values(got), b = values(want);
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  INFO(what << ": |difference| " << std::sqrt(diff) << ", |reference| " << std::sqrt(norm) << ", relative "
            << std::sqrt(diff / norm));
  CHECK(std::sqrt(diff) <= rtol * std::sqrt(norm));
}

}  // namespace

TEST_CASE("copy_to / reduce_from / gather_from: forward and backward as defined") {
  // x on rank r is r + 1 + its index; the gradient fed back is 10 (r + 1) + its index.
  auto rank_tensor = [](double base, Shape shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return arange(0, double(n)).reshape(shape) + base;
  };
  const double sum_r1 = P() * (P() + 1) / 2.0;  // sum over ranks of (r + 1)
  SECTION("copy_to_parallel: identity forward, gradients summed over the ranks") {
    Tensor x = rank_tensor(R() + 1, {2, 3}).set_requires_grad();
    Tensor y = tp::copy_to_parallel(x, group());
    check_close(values(y), values(x), 0, "forward");
    y.backward(rank_tensor(10 * (R() + 1), {2, 3}));
    check_close(values(x.grad()), values(rank_tensor(10 * sum_r1, {2, 3}) + (P() - 1) * arange(0, 6).reshape({2, 3})), 0,
                "backward");
  }
  SECTION("reduce_from_parallel: summed forward, identity backward") {
    Tensor x = rank_tensor(R() + 1, {2, 3}).set_requires_grad();
    Tensor y = tp::reduce_from_parallel(x, group());
    check_close(values(y), values(rank_tensor(sum_r1, {2, 3}) + (P() - 1) * arange(0, 6).reshape({2, 3})), 0, "forward");
    Tensor g = rank_tensor(10 * (R() + 1), {2, 3});
    y.backward(g);
    check_close(values(x.grad()), values(g), 0, "backward");
  }
  SECTION("the sequence forms: scatter, gather with a reduce-scattered gradient, reduce-scatter") {
    // Rank r's tensor [2, 2P, 3] holds 100 r + its index; each op against its definition.
    Tensor whole = rank_tensor(100 * R(), {2, 2 * P(), 3}).set_requires_grad();
    auto sum_over_ranks = [&](Shape shape) {  // sum over r of (100 r + index)
      return rank_tensor(0, shape) * double(P()) + 100.0 * (P() * (P() - 1) / 2.0);
    };
    Tensor mine = tp::scatter_to_parallel(whole, group(), 1);
    check_close(values(mine), values(whole.narrow(1, 2 * R(), 2)), 0, "scatter forward");
    Tensor g = rank_tensor(1000 * R(), {2, 2, 3});
    mine.backward(g);
    for (int r = 0; r < P(); ++r)
      check_close(values(whole.grad().narrow(1, 2 * r, 2)), values(rank_tensor(1000 * r, {2, 2, 3})), 0, "scatter backward");
    Tensor part = rank_tensor(100 * R(), {2, 2, 3}).set_requires_grad();
    Tensor gathered = tp::gather_sequence_parallel(part, group(), 1);
    for (int r = 0; r < P(); ++r)
      check_close(values(gathered.narrow(1, 2 * r, 2)), values(rank_tensor(100 * r, {2, 2, 3})), 0, "gather forward");
    gathered.backward(rank_tensor(100 * R(), {2, 2 * P(), 3}));
    check_close(values(part.grad()), values(sum_over_ranks({2, 2 * P(), 3}).narrow(1, 2 * R(), 2)), 0, "gather backward");
    Tensor x = rank_tensor(100 * R(), {2, 2 * P(), 3}).set_requires_grad();
    Tensor reduced = tp::reduce_scatter_parallel(x, group(), 1);
    check_close(values(reduced), values(sum_over_ranks({2, 2 * P(), 3}).narrow(1, 2 * R(), 2)), 0, "reduce-scatter forward");
    reduced.backward(rank_tensor(1000 * R(), {2, 2, 3}));
    for (int r = 0; r < P(); ++r)
      check_close(values(x.grad().narrow(1, 2 * r, 2)), values(rank_tensor(1000 * r, {2, 2, 3})), 0, "reduce-scatter backward");
    if (P() > 1) CHECK_THROWS_WITH(tp::scatter_to_parallel(rank_tensor(0, {2, 2 * P() + 1}), group(), 1),
                                   Contains("does not divide over " + std::to_string(P()) + " ranks"));
  }
  SECTION("gather_from_parallel: ranks joined along a middle dim, this rank's slice of the gradient back") {
    Tensor x = rank_tensor(100 * R(), {2, 3, 2}).set_requires_grad();
    Tensor y = tp::gather_from_parallel(x, group(), 1);
    REQUIRE(y.shape() == Shape{2, 3 * P(), 2});
    for (int r = 0; r < P(); ++r)
      check_close(values(y.narrow(1, 3 * r, 3)), values(rank_tensor(100 * r, {2, 3, 2})), 0, "block " + std::to_string(r));
    Tensor g = arange(0, double(y.numel())).reshape(y.shape());
    y.backward(g);
    check_close(values(x.grad()), values(g.narrow(1, 3 * R(), 3)), 0, "backward");
  }
}

TEST_CASE("colwise then rowwise: the unsplit pair's output and gradients") {
  auto make = [] {
    manual_seed(5);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(6, 4 * 4, true));
    m->push_back(std::make_shared<nn::GELU>());
    m->push_back(std::make_shared<nn::Linear>(4 * 4, 5, false));
    return m;
  };
  auto whole = make(), split = make();
  tp::parallelize_module(*split, group(), {{"0", tp::colwise()}, {"2", tp::rowwise()}});
  Generator g(9);
  Tensor x = randn({3, 6}, {}, &g), xs = x.clone().set_requires_grad();
  x.set_requires_grad();
  Tensor y = (*whole)(x), ys = (*split)(xs);
  check_close(values(ys), values(y), 1e-5, "output");
  Tensor dy = randn({3, 5}, {}, &g);
  y.backward(dy);
  ys.backward(dy);
  check_close(values(xs.grad()), values(x.grad()), 1e-5, "input gradient");
  check_split_grads(*split, *whole, 1e-5, "gradient");
}

namespace {

// `steps` AdamW steps of the unsplit model and of the split one on the same batches; the
// losses compared at every step, the parameters after the last.
template <class Model>
void train_against_unsplit(const nn::LlamaConfig& cfg, int steps, const tp::LlamaPlan& plan = {}) {
  auto whole = seeded_llama<Model>(cfg, 11), split = seeded_llama<Model>(cfg, 11);
  tp::parallelize_llama(*split, group(), plan);
  nn::AdamW whole_opt(whole->parameters(), {.lr = 1e-3}), split_opt(split->parameters(), {.lr = 1e-3});
  for (int step = 0; step < steps; ++step) {
    const fsdp_test::Batch b = token_batch(step);
    whole_opt.zero_grad();
    split_opt.zero_grad();
    Tensor lw = fsdp_test::loss_of(*whole, b), ls = plan.loss_parallel ? parallel_loss_of(*split, b) : fsdp_test::loss_of(*split, b);
    lw.backward();
    ls.backward();
    // Clipped below the gradients' norm, so the norm over every rank's slices scales the step.
    const double nw = nn::clip_grad_norm_(whole->parameters(), 0.5), ns = nn::clip_grad_norm_(split->parameters(), 0.5);
    whole_opt.step();
    split_opt.step();
    check_close({ls.item(), ns}, {lw.item(), nw}, 1e-5, "loss and gradient norm at step " + std::to_string(step));
  }
  auto s = split->named_parameters(), w = whole->named_parameters();
  for (size_t i = 0; i < s.size(); ++i)
    check_norm_close(s[i].second, slice_like(w[i].second, s[i].second, *group()), 1e-5,
                     "after " + std::to_string(steps) + " steps: " + s[i].first);
}

// One forward and backward: the split model's gradients against the unsplit one's.
template <class Model>
void gradients_against_unsplit(const nn::LlamaConfig& cfg) {
  auto whole = seeded_llama<Model>(cfg, 12), split = seeded_llama<Model>(cfg, 12);
  tp::parallelize_llama(*split, group());
  const fsdp_test::Batch b = token_batch(0);
  fsdp_test::loss_of(*whole, b).backward();
  fsdp_test::loss_of(*split, b).backward();
  check_split_grads(*split, *whole, 1e-5, "gradient of");
}

}  // namespace

TEST_CASE("Llama split over the ranks trains as the unsplit model") {
  auto split = seeded_llama<nn::Llama>(small_llama(), 1);
  tp::parallelize_llama(*split, group());
  const auto& attn = *split->blocks[0]->self_attn;
  CHECK(attn.n_head == 8 / P());
  CHECK(attn.n_kv_head == 4 / P());
  CHECK(attn.q_proj->weight.shape() == Shape{8 / P() * 4, 32});
  CHECK(attn.o_proj->weight.shape() == Shape{32, 8 / P() * 4});
  CHECK(split->blocks[1]->mlp->down_proj->weight.shape() == Shape{32, 48 / P()});
  // Megatron's count: an all-reduce after the attention and after the MLP in forward, one at
  // each one's input in backward (q, k and v share theirs, as gate and up do).
  const uint64_t before = group()->num_collectives();
  fsdp_test::loss_of(*split, token_batch(0)).backward();
  CHECK(group()->num_collectives() - before == 4 * 2);
  train_against_unsplit<nn::Llama>(small_llama(), 20);
}

TEST_CASE("Llama families split: Qwen2's q/k/v biases, Qwen3's head norms, a tied head") {
  SECTION("q/k/v biases are split with their rows") {
    nn::LlamaConfig cfg = small_llama();
    cfg.qkv_bias = true;
    gradients_against_unsplit<nn::Llama>(cfg);
  }
  SECTION("head norms, applied to each rank's heads, have the whole gradient") {
    nn::LlamaConfig cfg = small_llama();
    cfg.head_dim = 8;  // not d_model / n_head
    gradients_against_unsplit<nn::Qwen3>(cfg);
  }
  SECTION("tied head") {
    nn::LlamaConfig cfg = small_llama();
    cfg.tie_weights = true;
    train_against_unsplit<nn::Llama>(cfg, 3);
  }
}

TEST_CASE("a split module checkpointed itself: the recompute sees the parameters its hooks set") {
  // Sequence-parallel norms: whole weights applied to this rank's block of the sequence, their gradients summed.
  auto whole = seeded_llama<nn::Llama>(small_llama(), 13), split = seeded_llama<nn::Llama>(small_llama(), 13);
  tp::parallelize_llama(*split, group(), {.sequence_parallel = true});
  for (auto& b : split->blocks) b->input_layernorm->set_activation_checkpointing(true);
  split->norm->set_checkpointing(nn::Checkpointing::selective);
  const fsdp_test::Batch b = token_batch(0);
  fsdp_test::loss_of(*whole, b).backward();
  fsdp_test::loss_of(*split, b).backward();
  check_split_grads(*split, *whole, 1e-5, "gradient of");
}

TEST_CASE("generate refuses a model split by vocabulary or by sequence, on every rank") {
  for (bool loss : {true, false}) {
    auto split = seeded_llama<nn::Llama>(small_llama(), 13);
    tp::parallelize_llama(*split, group(), {.loss_parallel = loss, .sequence_parallel = !loss});
    const nn::GenerateOptions greedy{.max_new_tokens = 4, .sampling = {.temperature = 0}};
    if (P() == 1) {  // nothing split: it decodes
      CHECK(nn::generate(*split, {1, 2, 3, 4}, greedy).size() == 4);
      continue;
    }
    CHECK_THROWS_WITH(nn::generate(*split, {1, 2, 3, 4}, greedy),
                      Contains(loss ? "the logits hold " + std::to_string(32 / P()) + " columns for a vocabulary of 32"
                                    : "the blocks gave " + std::to_string(4 / P()) + " positions for 4 tokens"));
  }
}

TEST_CASE("a module registered twice is found at either of its paths, and split once") {
  auto shared_twice = [] {
    auto lin = std::make_shared<nn::Linear>(8, 8, false);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(lin);
    m->push_back(lin);
    return m;
  };
  auto m = shared_twice();
  tp::parallelize_module(*m, group(), {{"1", {.input = tp::Comm::copy}}});  // its second path only
  tp::parallelize_module(*shared_twice(), group(), {{"*", {.input = tp::Comm::copy}}});  // both: one style
  CHECK_THROWS_WITH(tp::parallelize_module(*shared_twice(), group(), {{"0", tp::colwise()}, {"1", tp::rowwise()}}),
                    Contains("1 is matched by two plan entries (the second: '1') at 0, the same module registered twice"));
}

TEST_CASE("what cannot be split is refused on every rank, before anything changes") {
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto model = seeded_llama<nn::Llama>(small_llama(), 2);
  const Shape q_shape = model->blocks[0]->self_attn->q_proj->weight.shape();
  CHECK_THAT(error_of([&] { tp::parallelize_module(*model, group(), {{"model.layers.*.nothing", tp::colwise()}}); }),
             Contains("'model.layers.*.nothing' matches no module"));
  CHECK_THAT(error_of([&] { tp::parallelize_module(*model, group(), {{"model.layers.*.self_attn.q_proj", tp::colwise()},
                                                                     {"model.layers.0.mlp", tp::rowwise()}}); }),
             Contains("matches model.layers.0.mlp, a SwiGLU, not a Linear"));
  CHECK_THAT(error_of([&] { tp::parallelize_module(*model, group(), {{"model.layers.*.self_attn.q_proj", tp::colwise()},
                                                                     {"model.layers.0.self_attn.q_proj", tp::colwise()}}); }),
             Contains("model.layers.0.self_attn.q_proj is matched by two plan entries"));
  CHECK_THAT(error_of([&] { tp::parallelize_gpt2_blocks(*model, group()); }),
             Contains("Llama holds no GPT-2 block (nn::Block)"));
  CHECK(model->blocks[0]->self_attn->q_proj->weight.shape() == q_shape);  // nothing split by the refusals
  // A second style on a module whose weights stay whole: its hooks had run beside the first's (two
  // copy_to_parallel: the input's gradient P^2 times too large).
  nn::Linear copied(8, 8);
  tp::parallelize(copied, {.input = tp::Comm::copy}, group(), "copied");
  CHECK_THAT(error_of([&] { tp::parallelize(copied, {.input = tp::Comm::copy}, group(), "copied"); }),
             Contains("tp: copied (copied) has a parallel style already"));
  // A style's chunks below 1 (a colwise Linear's blocks): refused, where 0 had divided by zero (SIGFPE).
  for (const int64_t chunks : {0, -2}) {
    nn::Linear blocks(4, 6);
    tp::Style style = tp::colwise();
    style.chunks = chunks;
    CHECK_THAT(error_of([&] { tp::parallelize(blocks, style, group(), "blocks"); }),
               Contains("tp: blocks (blocks): its style's chunks must be at least 1, got " + std::to_string(chunks)));
  }
  // A colwise output reduced as if it were a partial sum: the ranks' different columns had been added, silently.
  for (const tp::Comm out : {tp::Comm::reduce, tp::Comm::reduce_scatter}) {
    nn::Linear cols(4, 6);
    CHECK_THAT(error_of([&] { tp::parallelize(cols, {tp::Weights::colwise, tp::Comm::copy, out}, group(), "cols"); }),
               Contains("tp: cols (cols): a colwise module's output is this rank's columns, not a partial sum"));
  }
  // Ids past the vocabulary, which every rank had taken for another rank's rows (zeros), as the whole layer.
  nn::Embedding rows(4 * P(), 8);
  tp::parallelize(rows, {.weights = tp::Weights::vocab_rows, .output = tp::Comm::reduce}, group(), "rows");
  for (const double id : {double(4 * P()), -1.0})
    CHECK_THAT(error_of([&] { rows(from_vector({1.0, id}, {2}, {.dtype = kInt64})); }),
               Contains(fmt::format("embedding: index {} is out of range for {} embeddings", int64_t(id), 4 * P())));
  if (P() > 1) {
    nn::LlamaConfig cfg = small_llama();
    cfg.n_kv_head = 1;
    auto mqa = seeded_llama<nn::Llama>(cfg, 3);
    CHECK_THAT(error_of([&] { tp::parallelize_llama(*mqa, group()); }),
               Contains("the 1 key/value heads (n_kv_head) do not divide over " + std::to_string(P()) + " ranks"));
    auto twice = seeded_llama<nn::Llama>(small_llama(), 3);
    tp::parallelize_llama(*twice, group());
    CHECK_THAT(error_of([&] { tp::parallelize_llama(*twice, group()); }),
               Contains("tp: model.layers.0.self_attn (plan entry 'model.layers.*.self_attn') has a parallel style already"));
    nn::Linear odd(8, 3 * P() + 1);
    CHECK_THAT(error_of([&] { tp::parallelize(odd, tp::colwise(), group(), "odd"); }),
               Contains("colwise odd: its out_features " + std::to_string(3 * P() + 1) + " do not divide over"));
    // Ranks with different plans had split different layers (different wrong outputs); a refusal on one
    // rank had left the others to the collective timeout.
    auto differ = seeded_llama<nn::Llama>(small_llama(), 4);
    const std::string layer = fmt::format("model.layers.{}.self_attn.q_proj", dist::rank() == 0 ? 0 : 1);
    CHECK_THAT(error_of([&] { tp::parallelize_module(*differ, group(), {{layer, tp::colwise()}}); }),
               Contains("tp: parallelize_module: the ranks differ: the plan is model.layers.0.self_attn.q_proj"));
    nn::Sequential one;
    one.push_back(std::make_shared<nn::Linear>(8, dist::rank() == 0 ? 3 * P() + 1 : 3 * P()));
    CHECK_THAT(error_of([&] { tp::parallelize_module(one, group(), {{"0", tp::colwise()}}); }),
               Contains(dist::rank() == 0 ? "do not divide over" : "tp: parallelize_module failed on another rank"));
    CHECK(one.named_parameters()[0].second.size(0) == (dist::rank() == 0 ? 3 * P() + 1 : 3 * P()));  // unchanged
    // Values that differ between the ranks (a seed per rank) had made, silently, a model that no rank holds.
    auto apart = seeded_llama<nn::Llama>(small_llama(), 10 + uint64_t(dist::rank()));
    CHECK_THAT(error_of([&] { tp::parallelize_llama(*apart, group()); }),
               Contains("tp: parallelize: the ranks differ: the values of model.") &&
                   Contains("(every rank of the group must hold the same values before the split"));
    CHECK(apart->blocks[0]->self_attn->q_proj->weight.shape() == q_shape);
    nn::Linear alone(8, 2 * P());  // the default generators differ too
    CHECK_THAT(error_of([&] { tp::parallelize(alone, tp::colwise(), group(), "alone"); }),
               Contains("the values of alone.weight is f32[" + std::to_string(2 * P()) + ", 8] hash"));
    manual_seed(5);
    // A style that differs between the ranks (parallelize alone compared none): each rank kept other columns.
    nn::Linear styled(4, 4 * P());
    tp::Style mine = tp::colwise();
    mine.chunks = dist::rank() == 0 ? 1 : 2;
    CHECK_THAT(error_of([&] { tp::parallelize(styled, mine, group(), "styled"); }),
               Contains("tp: parallelize: the ranks differ: the style of styled is"));
    // Checks before a llama's plan stop every rank (a rank with other heads had waited out the collective timeout).
    nn::LlamaConfig kv = small_llama();
    kv.n_kv_head = dist::rank() == 0 ? 1 : P();
    auto some = seeded_llama<nn::Llama>(kv, 3);
    CHECK_THAT(error_of([&] { tp::parallelize_llama(*some, group()); }),
               Contains(dist::rank() == 0 ? "do not divide over" : "tp: parallelize_llama failed on another rank"));
  }
  // chunks on a split other than colwise had been ignored; sum_gradients on split weights added different rows
  // (colwise) or crashed the second backward (rowwise with a bias).
  nn::Linear rows2(4 * P(), 4);
  tp::Style chunked = tp::rowwise();
  chunked.chunks = 3;
  CHECK_THAT(error_of([&] { tp::parallelize(rows2, chunked, group(), "rows2"); }),
             Contains("tp: rows2 (rows2): chunks 3 splits colwise weights only, not rowwise ones"));
  for (tp::Style summed : {tp::colwise(), tp::rowwise()}) {
    summed.sum_gradients = true;
    nn::Linear l(4 * P(), 4 * P());
    CHECK_THAT(error_of([&] { tp::parallelize(l, summed, group(), "l"); }),
               Contains("tp: l (l): sum_gradients is for weights kept whole"));
  }
  CHECK_THAT(error_of([&] { tp::parallelize_module(*model, nullptr, {{"lm_head", tp::colwise()}}); }),
             Contains("tp: parallelize_module: no process group"));  // had been a segmentation fault
  // A tied head split alone (its embedding kept the whole tensor): untied, silently.
  nn::Sequential tied;
  auto emb = std::make_shared<nn::Embedding>(4 * P(), 4);
  auto head = std::make_shared<nn::Linear>(4, 4 * P(), false);
  tied.push_back(emb);
  tied.push_back(head);
  head->set_parameter("weight", emb->weight);
  CHECK_THAT(error_of([&] { tp::parallelize_module(tied, group(), {{"1", tp::colwise()}}); }),
             Contains("tp: 1.weight is tied to 0.weight (one tensor): splitting 1 would untie them"));
  // fully_shard before the split (at one data-parallel rank no shard marks the weights), LoRA after it: both had
  // trained a model unlike the unsplit one.
  auto pair = std::make_shared<nn::Sequential>();
  pair->push_back(std::make_shared<nn::Linear>(6, 4 * P()));
  dist::DeviceMesh mesh(DeviceType::cpu, {1, P()}, {"dp", "tp"});
  fsdp::fully_shard(pair, {.mesh = std::make_shared<dist::DeviceMesh>(
                               DeviceType::cpu, std::vector<int>{1}, std::vector<std::string>{"dp"},
                               std::vector<int>{mesh.coordinate(0)}, std::vector<dist::ProcessGroupPtr>{mesh.group("dp")})});
  CHECK_THAT(error_of([&] { tp::parallelize_module(*pair, group(), {{"0", tp::colwise()}}); }),
             Contains("tp: fully_shard was applied to Sequential already: split a model first, then fully_shard"));
  if (P() > 1) {
    // fully_shard over the ranks the split is over (the world twice, or the wrong dim of a mesh): each rank's slice
    // had been sharded over the ranks holding the other slices, and trained a mix of them.
    // fully_shard on a module whose style swaps its parameters while it runs: FSDP's pre-forward hook had put the
    // unsharded parameters back over the swapped ones (the rowwise bias added on every rank, the norm's gradient not
    // summed).
    manual_seed(9);
    auto biased = std::make_shared<nn::Linear>(4 * P(), 4);
    auto norm = std::make_shared<nn::LayerNorm>(4);
    tp::parallelize(*biased, tp::rowwise(), group(), "biased");
    tp::parallelize(*norm, {.sum_gradients = true}, group(), "norm");
    for (const nn::ModulePtr& m : std::vector<nn::ModulePtr>{biased, norm})
      CHECK_THAT(error_of([&] { fsdp::fully_shard(m); }),
                 Contains("module swaps its parameters while it runs (a tensor-parallel rowwise bias or sum_gradients)"));
    manual_seed(8);
    auto both = std::make_shared<nn::Sequential>();
    both->push_back(std::make_shared<nn::Linear>(6, 4 * P()));
    tp::parallelize_module(*both, group(), {{"0", tp::colwise()}});
    CHECK_THAT(error_of([&] { fsdp::fully_shard(both); }),
               Contains("fully_shard: '0.weight' is split over ranks that the") &&
                   Contains("would also shard it over (" + std::to_string(P()) + " of them)"));
    auto split = seeded_llama<nn::Llama>(small_llama(), 7);
    tp::parallelize_llama(*split, group());
    CHECK_THAT(error_of([&] { nn::apply_lora(*split, {.rank = 2, .targets = {"q_proj"}}); }),
               Contains("is split over ranks already (tensor parallel); apply LoRA to the model first"));
  }
}

// Qwen3 (its head norms' gradients summed over the tp group inside fsdp's unsharded parameters),
// sequence and loss parallel, with activation checkpointing (the recompute runs the split
// layers' collectives again).
TEST_CASE("dp x tp: fully_shard over the data-parallel dim of a 2-D mesh, on the split model") {
  // (dp, tp) = (1, 1) at 1 rank, (1, 2) at 2, (2, 2) and (1, 4) at 4.
  std::vector<std::pair<int, int>> layouts = {{P() / std::min(P(), 2), std::min(P(), 2)}};
  if (P() == 4) layouts.emplace_back(1, 4);
  for (const auto& [dp, tp_size] : layouts) {
    DYNAMIC_SECTION("dp " << dp << " x tp " << tp_size) {
      dist::DeviceMesh mesh(DeviceType::cpu, {dp, tp_size}, {"dp", "tp"});
      const dist::ProcessGroupPtr& tp_group = mesh.group("tp");
      auto dp_mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{dp},
                                                        std::vector<std::string>{"dp"},
                                                        std::vector<int>{mesh.coordinate(0)},
                                                        std::vector<dist::ProcessGroupPtr>{mesh.group("dp")});
      nn::LlamaConfig cfg = small_llama();
      cfg.head_dim = 8;
      auto whole = seeded_llama<nn::Qwen3>(cfg, 13), model = seeded_llama<nn::Qwen3>(cfg, 13);
      tp::parallelize_llama(*model, tp_group, {.loss_parallel = true, .sequence_parallel = true});
      for (auto& b : model->blocks) b->set_activation_checkpointing(true);
      for (auto& b : model->blocks) fsdp::fully_shard(b, {.mesh = dp_mesh});
      fsdp::FSDPModule root = fsdp::fully_shard(model, {.mesh = dp_mesh});
      nn::AdamW whole_opt(whole->parameters(), {.lr = 1e-3}), opt(model->parameters(), {.lr = 1e-3});
      for (int step = 0; step < 20; ++step) {
        const fsdp_test::Batch global = token_batch(step);  // 4 rows: 4 / dp a data-parallel rank
        const int64_t rows = global.x.size(0) / dp, first = rows * mesh.coordinate(0);
        const fsdp_test::Batch mine{global.x.narrow(0, first, rows), global.y.narrow(0, first, rows)};
        whole_opt.zero_grad();
        opt.zero_grad();
        Tensor lw = fsdp_test::loss_of(*whole, global), l = parallel_loss_of(*model, mine, tp_group);
        lw.backward();
        l.backward();
        const double nw = nn::clip_grad_norm_(whole->parameters(), 0.5), n = nn::clip_grad_norm_(model->parameters(), 0.5);
        whole_opt.step();
        opt.step();
        Tensor mean = from_vector({l.item()}, {1}, {.dtype = kFloat64});
        mesh.group("dp")->all_reduce(mean, dist::ReduceOp::avg)->wait();
        check_close({mean.item(), n}, {lw.item(), nw}, 1e-5, "loss and gradient norm at step " + std::to_string(step));
      }
      for (auto& [name, p] : whole->named_parameters()) {
        Tensor full = root.full_tensor(name);
        // 2e-5: twenty Adam steps carry the rounding of differently ordered sums (1.07e-5 in a
        // -Dnative=false build at 4 ranks); a wrong split is off by whole units.
        check_norm_close(full, slice_like(p, full, *tp_group), 2e-5, "after 20 steps: " + name);
      }
    }
  }
}

TEST_CASE("vocab_parallel_cross_entropy: cross_entropy of the whole logits, and its gradient's columns") {
  Generator g(21);
  const int64_t V = 6 * P();
  Tensor whole = (randn({5, V}, {}, &g) * 3.0).set_requires_grad();
  // Targets on every rank's columns, one ignored row.
  Tensor target = from_vector({0.0, double(V - 1), -100.0, double(V / 2), 5.0}, {5}, {.dtype = kInt64});
  for (std::string_view reduction : {"mean", "sum", "none"}) {
    INFO("reduction " << reduction);
    whole.set_grad(Tensor());
    Tensor mine = my_slice(whole.detach(), 1, *group()).clone().set_requires_grad();
    Tensor want = cross_entropy(whole, target, {.reduction = reduction});
    Tensor got = tp::vocab_parallel_cross_entropy(mine, target, group(), {.reduction = reduction});
    check_close(values(got), values(want), 1e-6, "loss");
    Generator gg(22);
    Tensor dy = reduction == "none" ? randn({5}, {}, &gg) : Tensor();
    want.backward(dy);
    got.backward(dy);
    check_close(values(mine.grad()), values(my_slice(whole.grad(), 1, *group())), 1e-6, "gradient of this rank's columns");
  }
  auto error_of = [&](const CrossEntropyOptions& o) {
    try {
      tp::vocab_parallel_cross_entropy(my_slice(whole.detach(), 1, *group()), target, group(), o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of({.label_smoothing = 0.1}), Contains("label_smoothing 0.1 is not supported"));
  CHECK_THAT(error_of({.reduction = "max"}), Contains("unknown reduction 'max'"));
  target = from_vector({0.0, double(V), -100.0, 1.0, 2.0}, {5}, {.dtype = kInt64});
  CHECK_THAT(error_of({}), Contains("target " + std::to_string(V) + " (row 1) is out of range for " + std::to_string(V) + " classes"));
}

TEST_CASE("sequence parallel: norms and the residual stream on sequence blocks train as the unsplit model") {
  SECTION("whole head") { train_against_unsplit<nn::Llama>(small_llama(), 20, {.sequence_parallel = true}); }
  SECTION("with loss parallel, tied") {
    nn::LlamaConfig cfg = small_llama();
    cfg.tie_weights = true;
    train_against_unsplit<nn::Llama>(cfg, 20, {.loss_parallel = true, .sequence_parallel = true});
  }
  SECTION("a block's residual stream holds this rank's block of the sequence") {
    auto split = seeded_llama<nn::Llama>(small_llama(), 1);
    tp::parallelize_llama(*split, group(), {.sequence_parallel = true});
    Shape seen;
    split->blocks[1]->register_forward_pre_hook([&](nn::Module&, const nn::TensorList& in) -> std::optional<nn::TensorList> {
      seen = in[0].shape();
      return std::nullopt;
    });
    (*split)(token_batch(0).x);
    CHECK(seen == Shape{4, 12 / P(), 32});
  }
}

TEST_CASE("loss parallel: the embedding and the head split by vocabulary train as the unsplit model") {
  SECTION("untied head") {
    auto split = seeded_llama<nn::Llama>(small_llama(), 1);
    tp::parallelize_llama(*split, group(), {.loss_parallel = true});
    CHECK(split->embed_tokens->weight.shape() == Shape{32 / P(), 32});
    CHECK(split->lm_head->weight.shape() == Shape{32 / P(), 32});
    CHECK(split->forward(token_batch(0).x).shape() == Shape{4, 12, 32 / P()});
    train_against_unsplit<nn::Llama>(small_llama(), 20, {.loss_parallel = true});
  }
  SECTION("tied head") {
    nn::LlamaConfig cfg = small_llama();
    cfg.tie_weights = true;
    train_against_unsplit<nn::Llama>(cfg, 20, {.loss_parallel = true});
  }
}

namespace {

// TinyGPT's two GPT-2 blocks with biases everywhere (a fused c_attn, biased rowwise projections)
// between a whole embedding and head.
std::shared_ptr<fsdp_test::TinyGPT> biased_gpt() {
  manual_seed(4);
  return std::make_shared<fsdp_test::TinyGPT>(nn::TransformerConfig{.d_model = 16, .n_head = 4, .bias = true}, 32);
}

}  // namespace

TEST_CASE("GPT-2's blocks split: the fused q|k|v in three blocks, biased rowwise projections") {
  auto whole = biased_gpt(), split = biased_gpt();
  tp::parallelize_gpt2_blocks(*split, group());
  auto& attn = *split->blocks->at<nn::Block>(0)->attn;
  CHECK(attn.n_head == 4 / P());
  CHECK(attn.c_attn->weight.shape() == Shape{3 * 16 / P(), 16});
  // Rank r's rows of c_attn: its heads' rows of q, of k and of v.
  auto& whole_attn = *whole->blocks->at<nn::Block>(0)->attn;
  for (int64_t part = 0; part < 3; ++part)
    check_close(values(attn.c_attn->weight.narrow(0, part * 16 / P(), 16 / P())),
                values(whole_attn.c_attn->weight.narrow(0, part * 16 + R() * 16 / P(), 16 / P())), 0,
                "c_attn rows of block " + std::to_string(part));
  // One step's gradients element by element (the key bias's is zero in exact arithmetic: Adam
  // would make its rounding a step), then SGD steps.
  const fsdp_test::Batch b = token_batch(0);
  fsdp_test::loss_of(*whole, b).backward();
  fsdp_test::loss_of(*split, b).backward();
  auto s = split->named_parameters(), w = whole->named_parameters();
  for (size_t i = 0; i < s.size(); ++i) {
    Tensor got = s[i].second.grad(), want = w[i].second.grad();
    if (s[i].first.ends_with("c_attn.weight") || s[i].first.ends_with("c_attn.bias")) {
      std::vector<Tensor> mine;
      for (int64_t part = 0; part < 3; ++part) mine.push_back(my_slice(want.narrow(0, part * 16, 16), 0, *group()));
      want = cat(mine, 0);
    }
    check_close(values(got), values(slice_like(want, got, *group())), 1e-5, "gradient of " + s[i].first);
  }
  nn::SGD whole_opt(whole->parameters(), {.lr = 0.1}), split_opt(split->parameters(), {.lr = 0.1});
  for (int step = 0; step < 20; ++step) {
    const fsdp_test::Batch batch = token_batch(step);
    whole_opt.zero_grad();
    split_opt.zero_grad();
    Tensor lw = fsdp_test::loss_of(*whole, batch), ls = fsdp_test::loss_of(*split, batch);
    lw.backward();
    ls.backward();
    whole_opt.step();
    split_opt.step();
    check_close({ls.item()}, {lw.item()}, 1e-5, "loss at step " + std::to_string(step));
  }
  check_norm_close(split->blocks->at<nn::Block>(1)->mlp->c_proj->bias, whole->blocks->at<nn::Block>(1)->mlp->c_proj->bias, 1e-5,
                   "a rowwise bias after 20 steps");
}

namespace {

// A Llama split by `layout` (dp, tp) with sequence and loss parallel, fully_shard over dp.
struct SplitLlama {
  std::shared_ptr<dist::DeviceMesh> mesh;
  std::shared_ptr<nn::Llama> model;
  std::optional<fsdp::FSDPModule> root;
  std::unique_ptr<nn::AdamW> opt;
  SplitLlama(int dp, int tp_size, uint64_t seed) {
    mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{dp, tp_size},
                                              std::vector<std::string>{"dp", "tp"});
    auto dp_mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{dp},
                                                      std::vector<std::string>{"dp"},
                                                      std::vector<int>{mesh->coordinate(0)},
                                                      std::vector<dist::ProcessGroupPtr>{mesh->group("dp")});
    model = seeded_llama<nn::Llama>(small_llama(), seed);
    tp::parallelize_llama(*model, mesh->group("tp"), {.loss_parallel = true, .sequence_parallel = true});
    for (auto& b : model->blocks) fsdp::fully_shard(b, {.mesh = dp_mesh});
    root = fsdp::fully_shard(model, {.mesh = dp_mesh});
    opt = std::make_unique<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 1e-2});
  }
  double step(int i) {  // one AdamW step on batch i; the loss averaged over dp
    const fsdp_test::Batch global = token_batch(i);
    const int64_t rows = global.x.size(0) / mesh->size(0), first = rows * mesh->coordinate(0);
    opt->zero_grad();
    Tensor l = parallel_loss_of(*model, {global.x.narrow(0, first, rows), global.y.narrow(0, first, rows)},
                                mesh->group("tp"));
    l.backward();
    opt->step();
    Tensor mean = from_vector({l.item()}, {1}, {.dtype = kFloat64});
    mesh->group("dp")->all_reduce(mean, dist::ReduceOp::avg)->wait();
    return mean.item();
  }
  // Each parameter this rank's tp group holds, whole along dp, against its slice of `whole`'s.
  void check_against(nn::Module& whole, const std::string& what) {
    for (auto& [name, p] : whole.named_parameters()) {
      Tensor full = root->full_tensor(name);
      check_close(values(full), values(slice_like(p, full, *mesh->group("tp"))), 0, what + ": " + name, 0);
    }
  }
};

}  // namespace

TEST_CASE("checkpoints across (dp, tp) layouts: saved split and sharded, loaded whole and at another layout") {
  const auto dir = test::shared_dir("tp_layouts");
  const int tp_size = std::min(P(), 2);
  SplitLlama saved(P() / tp_size, tp_size, 21);
  for (int i = 0; i < 3; ++i) saved.step(i);
  const std::string ck = fsdp::save_checkpoint(dir.string(), *saved.model, saved.opt.get(), &*saved.root, {.step = 3});
  const fsdp::CheckpointIndex index = fsdp::read_checkpoint_index(ck);
  CHECK(index.files.size() == size_t(P()));  // every rank writes its own pieces
  CHECK(fsdp::verify_checkpoint(ck).tensors == index.tensors.size());
  // Whole, on every rank: each split parameter's slice is what the split model holds.
  auto whole = seeded_llama<nn::Llama>(small_llama(), 99);
  nn::AdamW whole_opt(whole->parameters(), {.lr = 1e-2});
  CHECK(fsdp::load_checkpoint(ck, *whole, &whole_opt, nullptr).step == 3);
  saved.check_against(*whole, "the checkpoint loaded whole");
  // At the other layout ((1, P) for (P/2, 2)), then one more step in each: the same loss.
  SplitLlama other(P() == 4 ? 1 : P(), P() == 4 ? 4 : 1, 99);
  fsdp::load_checkpoint(ck, *other.model, other.opt.get(), &*other.root);
  other.check_against(*whole, "the checkpoint loaded at another layout");
  const double next = saved.step(3), there = other.step(3);
  Tensor lw = fsdp_test::loss_of(*whole, token_batch(3));
  whole_opt.zero_grad();
  lw.backward();
  whole_opt.step();
  check_close({next, there}, {lw.item(), lw.item()}, 1e-5, "the step after loading (optimizer state restored)");
  group()->barrier()->wait();  // every rank has read it
  if (R() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a checkpoint of GPT-2's split blocks holds q, k and v whole (three blocks of each part), unsharded") {
  const auto dir = test::shared_dir("tp_gpt2");
  auto whole = biased_gpt(), split = biased_gpt();
  tp::parallelize_gpt2_blocks(*split, group());
  nn::SGD opt(split->parameters(), {.lr = 0.1});
  fsdp_test::loss_of(*split, token_batch(0)).backward();
  opt.step();
  const std::string ck = fsdp::save_checkpoint(dir.string(), *split, &opt, nullptr, {.step = 1});
  auto loaded = biased_gpt();
  for (auto& p : loaded->parameters()) p.detach().zero_();
  fsdp::load_checkpoint(ck, *loaded, nullptr, nullptr);
  // The loaded c_attn's rows of q, k and v hold the split ones' rows of this rank's heads.
  for (int64_t b = 0; b < 2; ++b) {
    auto& got = *loaded->blocks->at<nn::Block>(b)->attn->c_attn;
    auto& mine = *split->blocks->at<nn::Block>(b)->attn->c_attn;
    for (int64_t part = 0; part < 3; ++part)
      check_close(values(mine.weight.narrow(0, part * 16 / P(), 16 / P())),
                  values(got.weight.narrow(0, part * 16 + R() * 16 / P(), 16 / P())), 0,
                  "c_attn rows of q, k or v (" + std::to_string(part) + ") in block " + std::to_string(b), 0);
    CHECK(values(got.weight) != values(whole->blocks->at<nn::Block>(b)->attn->c_attn->weight));  // the step's
  }
  group()->barrier()->wait();  // every rank has read it
  if (R() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("LoRA adapters split with their layers: the unsplit adapted model's gradients and losses") {
  auto make = [] {
    auto m = seeded_llama<nn::Llama>(small_llama(), 31);
    manual_seed(5);
    nn::apply_lora(*m, {.rank = 4, .alpha = 8, .targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"}});
    NoGradGuard no_grad;  // B moved off zero, so that A's gradient is not zero
    for (auto& [name, p] : m->named_parameters())
      if (name.ends_with("lora_B.weight")) nn::init::normal_(p, 0, 0.1);
    return m;
  };
  auto whole = make(), split = make();
  tp::parallelize_llama(*split, group(), {.loss_parallel = true, .sequence_parallel = true});
  const auto& q = *split->blocks[0]->self_attn->q_proj;
  CHECK(q.low_rank->b->weight.shape() == Shape{32 / P(), 4});  // colwise: B's rows, A whole
  CHECK(q.low_rank->a->weight.shape() == Shape{4, 32});
  const auto& down = *split->blocks[0]->mlp->down_proj;
  CHECK(down.low_rank->a->weight.shape() == Shape{4, 48 / P()});  // rowwise: A's columns, B whole
  nn::AdamW whole_opt(whole->parameters(), {.lr = 1e-2}), split_opt(split->parameters(), {.lr = 1e-2});
  for (int step = 0; step < 10; ++step) {
    const fsdp_test::Batch b = token_batch(step);
    whole_opt.zero_grad();
    split_opt.zero_grad();
    Tensor lw = fsdp_test::loss_of(*whole, b), ls = parallel_loss_of(*split, b);
    lw.backward();
    ls.backward();
    auto s = split->named_parameters(), w = whole->named_parameters();
    for (size_t i = 0; step == 0 && i < s.size(); ++i)
      if (nn::is_lora_parameter(s[i].first)) {  // the base is frozen: no gradient
        Tensor got = s[i].second.grad(), want = w[i].second.grad();
        check_close(values(got), values(slice_like(want, got, *group())), 1e-5, "gradient of " + s[i].first);
      }
    whole_opt.step();
    split_opt.step();
    check_close({ls.item()}, {lw.item()}, 1e-5, "loss at step " + std::to_string(step));
  }
}

