// Tests for nn::Module: registration order and dotted names, state dicts (strict and not,
// with clear errors), train/eval, to(dtype), apply, zero_grad, hooks and printing.
#include <catch2/catch.hpp>

#include "core/op_profiler.h"
#include "weft.h"

using namespace weft;
using namespace weft::nn;
using Catch::Contains;

namespace {
struct Net : Module {
  std::shared_ptr<Linear> fc1, fc2;
  Tensor& scale;
  Tensor& running;
  Net() : Module("Net"), scale(register_parameter("scale", ones({1}))), running(register_buffer("running", zeros({2}))) {
    fc1 = register_module("fc1", std::make_shared<Linear>(3, 4));
    fc2 = register_module("fc2", std::make_shared<Linear>(4, 2, false));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))) * scale; }
  using Module::forward;
};
std::vector<std::string> names(const NamedTensorList& l) {
  std::vector<std::string> out;
  for (auto& [n, t] : l) out.push_back(n);
  return out;
}
}  // namespace

TEST_CASE("parameters, buffers and modules have dotted names in registration order") {
  auto net = std::make_shared<Net>();
  CHECK(names(net->named_parameters()) == std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "fc2.weight"});
  CHECK(names(net->named_buffers()) == std::vector<std::string>{"running"});
  CHECK(names(net->state_dict()) ==
        std::vector<std::string>{"scale", "running", "fc1.weight", "fc1.bias", "fc2.weight"});
  auto mods = net->named_modules();
  REQUIRE(mods.size() == 3);
  CHECK(mods[0].first == "");
  CHECK(mods[1].first == "fc1");
  CHECK(mods[2].second.get() == net->fc2.get());
  for (auto& p : net->parameters()) CHECK(p.requires_grad());
  CHECK(net->fc1->weight.shape() == Shape{4, 3});
  CHECK_THROWS_WITH(net->register_parameter("scale", ones({1})), Contains("already registered"));
  CHECK_THROWS_WITH(net->register_buffer("a.b", ones({1})), Contains("'.'"));
}

TEST_CASE("a module cannot hold itself: a cycle would recurse without end in every walk of the tree") {
  auto s = std::make_shared<Sequential>();
  CHECK_THROWS_WITH(s->push_back(s), Contains("Sequential: child module \"0\" is this module or holds it"));
  auto a = std::make_shared<Sequential>(), b = std::make_shared<Sequential>();
  a->push_back(b);
  CHECK_THROWS_WITH(b->push_back(a), Contains("child module \"0\" is this module or holds it"));
  auto shared = std::make_shared<Linear>(2, 2);  // one module under two parents is no cycle
  a->push_back(shared);
  b->push_back(shared);
  CHECK(a->named_modules().size() == 3);  // a, b and the shared Linear, once
}

TEST_CASE("containers name a bad index or child type instead of std::out_of_range or a null pointer") {
  auto s = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{std::make_shared<Linear>(2, 2)});
  CHECK((*s)[0] != nullptr);
  CHECK_THROWS_WITH((*s)[1], Contains("Sequential[1]: index out of range for a Sequential of 1 module"));
  ModuleList l{std::make_shared<Linear>(2, 2), std::make_shared<ReLU>()};
  CHECK(l.at<Linear>(0) != nullptr);
  CHECK_THROWS_WITH(l[2], Contains("ModuleList[2]: index out of range for a ModuleList of 2 modules"));
  CHECK_THROWS_WITH(l.at<Linear>(1), Contains("ModuleList::at<M>(1): the module there is a ReLU"));
  struct Pair : Module {  // returns two tensors: Sequential's one-tensor forward cannot hand them on
    Pair() : Module("Pair") {}
    TensorList forward(const TensorList& in) override { return {in[0], in[0]}; }
    using Module::forward;
  };
  Sequential two{std::make_shared<Pair>()};
  CHECK_THROWS_WITH(two.forward(ones({2})), Contains("its last module returned 2 tensors, not one"));
}

TEST_CASE("state_dict round trip and load errors") {
  manual_seed(1);
  auto a = std::make_shared<Net>();
  manual_seed(2);
  auto b = std::make_shared<Net>();
  CHECK(to_vector(a->fc1->weight) != to_vector(b->fc1->weight));
  b->load_state_dict(a->state_dict());
  CHECK(to_vector(a->fc1->weight) == to_vector(b->fc1->weight));
  CHECK(to_vector(a->fc2->weight) == to_vector(b->fc2->weight));

  auto sd = a->state_dict();
  sd.erase(sd.begin() + 2);  // fc1.weight
  sd.emplace_back("extra", ones({1}));
  CHECK_THROWS_WITH(b->load_state_dict(sd), Contains("missing keys: fc1.weight") && Contains("unexpected keys: extra"));
  CHECK_NOTHROW(b->load_state_dict(sd, /*strict=*/false));
  auto bad = a->state_dict();
  bad[0].second = ones({3});
  CHECK_THROWS_WITH(b->load_state_dict(bad, false), Contains("scale (checkpoint [3], model [1])"));
  // Each entry defined, named once, and finite (a NaN weight had loaded; of two "scale"s, the last).
  auto edited = [&](auto change) {
    auto sd = a->state_dict();
    change(sd);
    return sd;
  };
  CHECK_THROWS_WITH(b->load_state_dict(edited([](NamedTensorList& sd) { sd[2].second = full({4, 3}, NAN); })),
                    Contains("load_state_dict for Net: \"fc1.weight\" holds nan at element 0"));
  // Infinity too, and nothing is loaded, not even the finite entries before it (docs/NN.md).
  std::vector<std::vector<double>> before;  // values, not the state dict's handles on b's own tensors
  for (auto& [n, t] : b->state_dict()) before.push_back(to_vector(t));
  CHECK_THROWS_WITH(b->load_state_dict(edited([](NamedTensorList& sd) { sd[3].second = full({4}, -INFINITY); })),
                    Contains("load_state_dict for Net: \"fc1.bias\" holds -inf at element 0"));
  for (size_t i = 0; i < before.size(); ++i) CHECK(to_vector(b->state_dict()[i].second) == before[i]);
  CHECK_THROWS_WITH(b->load_state_dict(edited([](NamedTensorList& sd) { sd.push_back(sd[0]); })),
                    Contains("load_state_dict for Net: \"scale\" is given twice"));
  CHECK_THROWS_WITH(b->load_state_dict(edited([](NamedTensorList& sd) { sd[1].second = Tensor(); })),
                    Contains("load_state_dict for Net: \"running\" is an undefined tensor"));
}

TEST_CASE("forward hooks run on every call and may replace inputs and outputs") {
  auto lin = std::make_shared<Linear>(2, 2);
  std::vector<std::string> log;
  auto h1 = lin->register_forward_pre_hook([&](Module& m, const TensorList& in) -> std::optional<TensorList> {
    log.push_back("pre:" + m.type_name());
    return TensorList{in[0] * 0.0};  // zero the input: output becomes the bias
  });
  auto h2 = lin->register_forward_hook([&](Module&, const TensorList&, const TensorList& out) -> std::optional<TensorList> {
    log.push_back("post");
    return std::nullopt;
  });
  Tensor y = (*lin)(ones({1, 2}));
  CHECK(to_vector(y) == to_vector(lin->bias));
  (*lin)(ones({1, 2}));
  CHECK(log == std::vector<std::string>{"pre:Linear", "post", "pre:Linear", "post"});
  h1.remove();
  h1.remove();  // idempotent
  Tensor y2 = (*lin)(ones({1, 2}));
  CHECK(to_vector(y2) != to_vector(lin->bias));
  h2.remove();
}

TEST_CASE("train/eval, to(dtype), apply and zero_grad") {
  auto net = std::make_shared<Net>();
  net->eval();
  CHECK(!net->fc1->is_training());
  net->train();
  CHECK(net->fc2->is_training());
  Tensor handle = net->fc1->weight;  // e.g. held by an optimizer
  net->to(kFloat64);
  CHECK(handle.dtype() == kFloat64);
  CHECK(net->fc1->weight.dtype() == kFloat64);
  CHECK(net->running.dtype() == kFloat64);
  int count = 0;
  net->apply([&](Module&) { ++count; });
  CHECK(count == 3);
  sum((*net)(ones({2, 3}, {.dtype = kFloat64}))).backward();
  CHECK(net->fc1->weight.grad().defined());
  net->zero_grad(false);
  CHECK(to_vector(net->fc1->weight.grad()) == std::vector<double>(12, 0.0));
  net->zero_grad();
  CHECK(!net->fc1->weight.grad().defined());
}

// A graph recorded before Module::to refuses its backward (its gradients would be of the old dtype, for parameters
// of the new one); a forward after it trains as usual.
TEST_CASE("to(dtype) between a forward and its backward is refused") {
  auto lin = std::make_shared<Linear>(2, 2);
  Tensor through_weight = sum((*lin)(ones({1, 2}))), bias_only = sum(ones({2}) + lin->bias);
  lin->to(kFloat64);
  CHECK_THROWS_WITH(through_weight.backward(), Contains("written in place after the forward used it"));
  CHECK_THROWS_WITH(bias_only.backward(), Contains("was f32 on cpu when the forward used it (a Module::to"));
  CHECK(!lin->bias.grad().defined());
  sum((*lin)(ones({1, 2}, {.dtype = kFloat64}))).backward();
  CHECK((lin->weight.grad().dtype() == kFloat64 && lin->bias.grad().dtype() == kFloat64));
}

TEST_CASE("set_parameter swaps what forward uses") {
  auto lin = std::make_shared<Linear>(2, 1, false);
  lin->set_parameter("weight", from_vector({2, 3}, {1, 2}).set_requires_grad());
  CHECK((*lin)(from_vector({1, 1}, {1, 2})).item() == 5);
  CHECK_THROWS_WITH(lin->set_parameter("nope", ones({1})), Contains("no parameter named \"nope\""));
}

TEST_CASE("printing shows the module tree") {
  auto seq = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      std::make_shared<Linear>(784, 512), std::make_shared<ReLU>(), std::make_shared<Linear>(512, 10)});
  std::string s = seq->str();
  CHECK(s.find("Sequential(") == 0);
  CHECK(s.find("(0): Linear(in_features=784, out_features=512, bias=true)") != std::string::npos);
  CHECK(s.find("(1): ReLU()") != std::string::npos);
}

TEST_CASE("activation checkpointing: the same outputs and gradients, dropout included, from a recompute") {
  nn::TransformerConfig cfg{.d_model = 16, .n_head = 4, .dropout = 0.2};
  auto make = [&] {
    manual_seed(21);
    return std::make_shared<nn::Block>(cfg);
  };
  auto plain = make(), ckpt = make();
  ckpt->set_activation_checkpointing(true);
  int mlp_calls = 0;
  ckpt->mlp->register_forward_hook([&](nn::Module&, const TensorList&, const TensorList&) {
    ++mlp_calls;
    return std::optional<TensorList>();
  });
  Tensor x = randn({2, 8, 16});
  auto run = [&](nn::Block& b, Tensor& xg) {
    manual_seed(5);  // the dropout masks
    xg = x.clone();
    xg.set_requires_grad(true);
    Tensor y = b(xg);
    int64_t live_after_forward = memory_stats().live_bytes;
    sum(y * y).backward();
    return std::make_pair(y, live_after_forward);
  };
  Tensor xp, xc;
  int64_t base = memory_stats().live_bytes;
  auto [yp, live_plain] = run(*plain, xp);
  auto [yc, live_ckpt] = run(*ckpt, xc);
  // Forward once, and again in backward.
  CHECK(mlp_calls == 2);
  CHECK(to_vector(yc) == to_vector(yp));
  CHECK(to_vector(xc.grad()) == to_vector(xp.grad()));
  auto gp = plain->named_parameters(), gc = ckpt->named_parameters();
  for (size_t i = 0; i < gp.size(); ++i) {
    INFO(gp[i].first);
    CHECK(to_vector(gc[i].second.grad()) == to_vector(gp[i].second.grad()));
  }
  // Without the block's activations held, less is live between forward and backward.
  INFO("live after forward: plain " << live_plain - base << " bytes, checkpointed " << live_ckpt - base);
  CHECK(live_ckpt < live_plain);
  // Inputs that need no gradient: the parameters still get theirs.
  ckpt->zero_grad();
  sum((*ckpt)(x)).backward();
  CHECK(ckpt->mlp->c_fc->weight.grad().defined());
}

TEST_CASE("activation checkpointing refuses a recompute after its parameters were written (a step before backward)") {
  for (const bool checkpointed : {false, true}) {
    INFO("checkpointed " << checkpointed);
    manual_seed(0);
    auto l = std::make_shared<nn::Linear>(2, 2);
    l->set_activation_checkpointing(checkpointed);
    nn::SGD opt(l->parameters(), {.lr = 10.0});
    Tensor x = ones({1, 2}).set_requires_grad();
    sum((*l)(x)).backward();  // gradients for the step
    Tensor y = (*l)(x);       // a forward with the weights before the step
    opt.step();
    // The recompute had used the stepped weights silently (x's gradient -15.78, -14.68).
    CHECK_THROWS_WITH(sum(y * y).backward(), Catch::Contains(checkpointed ? "of a checkpointed block was written in place "
                      "after its forward" : "was written in place after the forward used it"));
  }
}

TEST_CASE("selective activation checkpointing: GEMMs and attention kept and not run again, the rest recomputed") {
  const nn::TransformerConfig cfg{.d_model = 32, .n_head = 4};
  const Tensor x = randn({2, 16, 32});
  struct Result {
    std::vector<double> y, dx;
    std::vector<std::vector<double>> grads;
    int64_t held = 0;               // bytes live between forward and backward
    int64_t products = 0, attention = 0;  // GEMM and attention kernel calls in forward and backward
  };
  auto run = [&](nn::Checkpointing c) {
    manual_seed(21);
    auto block = std::make_shared<nn::Block>(cfg);
    block->set_checkpointing(c);
    Tensor xg = x.clone();
    xg.set_requires_grad(true);
    Result r;
    const int64_t base = memory_stats().live_bytes;
    op_profiler::start();
    Tensor y = (*block)(xg);
    r.held = memory_stats().live_bytes - base;
    sum(y * y).backward();
    op_profiler::stop();
    for (const auto& row : op_profiler::rows()) {
      if (row.name.starts_with("gemm ") || row.name.starts_with("matmul ")) r.products += row.calls;
      if (row.name.starts_with("attention ")) r.attention += row.calls;
    }
    r.y = to_vector(y), r.dx = to_vector(xg.grad());
    for (auto& [name, p] : block->named_parameters()) r.grads.push_back(to_vector(p.grad()));
    return r;
  };
  const Result none = run(nn::Checkpointing::none), selective = run(nn::Checkpointing::selective),
               full = run(nn::Checkpointing::full);
  // The kept outputs are the first forward's own: the same bits as without checkpointing.
  CHECK(selective.y == none.y);
  CHECK(selective.dx == none.dx);
  CHECK(selective.grads == none.grads);
  CHECK(full.grads == none.grads);
  // The recompute runs no GEMM and no attention again (full checkpointing runs them all twice).
  INFO("GEMM calls: none " << none.products << ", selective " << selective.products << ", full " << full.products
       << "; attention: " << none.attention << ", " << selective.attention << ", " << full.attention);
  CHECK(selective.products == none.products);
  CHECK(selective.attention == none.attention);
  CHECK(full.products > none.products);
  CHECK(full.attention == 2 * none.attention);
  // What stays live between forward and backward lies between the two.
  INFO("held after forward: none " << none.held << ", selective " << selective.held << ", full " << full.held);
  CHECK(selective.held < none.held);
  CHECK(selective.held > full.held);
}

TEST_CASE("selective activation checkpointing: a recompute that runs other ops is a clear error") {
  Tensor w = randn({8, 8}), x = randn({4, 8});
  w.set_requires_grad(true);
  int calls = 0;
  auto fn = [&](const TensorList& in) {  // a second linear on the recompute only
    Tensor h = linear(in[0], w);
    if (++calls > 1) h = linear(h, w);
    return TensorList{h};
  };
  Tensor y = nn::checkpoint(fn, {x}, true)[0];
  CHECK_THROWS_WITH(sum(y).backward(), Contains("the recompute ran linear after the 1 ops the first forward kept"));
  CHECK_THROWS_WITH(nn::parse_checkpointing("some", "--ac"), Contains("--ac: \"some\" is not an activation "
                                                                          "checkpointing policy"));
}

namespace {
// Models for deferred initialisation: every default init (Linear, Embedding, LayerNorm,
// RMSNorm, Conv2d, the transformer blocks), a tied weight, a buffer, and a re-initialisation
// after construction (as a GPT's scaled residual projections).
struct SmallGPT : Module {
  std::shared_ptr<Embedding> wte;
  std::shared_ptr<ModuleList> blocks;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> head;
  SmallGPT() : Module("SmallGPT") {
    TransformerConfig cfg{.d_model = 12, .n_head = 3, .bias = true};
    wte = register_module("wte", std::make_shared<Embedding>(11, 12));
    blocks = register_module("blocks", std::make_shared<ModuleList>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>(cfg));
    norm = register_module("norm", std::make_shared<RMSNorm>(12));
    head = register_module("head", std::make_shared<Linear>(12, 11, false));
    head->set_parameter("weight", wte->weight);  // tied
    NoGradGuard ng;
    for (auto& [name, p] : named_parameters())
      if (name.find("c_proj.weight") != std::string::npos) init::normal_(p, 0, 0.02 / std::sqrt(4.0));
  }
  Tensor forward(const Tensor& idx) override {
    Tensor h = (*wte)(idx);
    for (auto& b : *blocks) h = (*b)(h);
    return (*head)((*norm)(h));
  }
  using Module::forward;
};
std::shared_ptr<Module> conv_net() {
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Conv2d>(1, 4, 3, 1, 1));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Conv2d>(4, 2, 3, 2, 0, false));
  m->push_back(std::make_shared<Flatten>());
  m->push_back(std::make_shared<Linear>(8, 3));
  return m;
}
// Builds the model with the default generator seeded, eagerly or on the meta device.
template <class Make>
std::shared_ptr<Module> build(Make make, bool deferred) {
  manual_seed(1234);
  if (!deferred) return make();
  DefaultDeviceGuard meta(Device::meta());
  return make();
}
void check_bitwise_equal(Module& a, Module& b) {
  auto sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(names(sa) == names(sb));
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(sa[i].second.device() == sb[i].second.device());
    CHECK(to_vector(sa[i].second) == to_vector(sb[i].second));
  }
}
}  // namespace

TEST_CASE("deferred initialisation: a meta build costs no memory and materialises bitwise as the eager one") {
  auto mlp = [] {
    auto m = std::make_shared<Sequential>();
    m->push_back(std::make_shared<Linear>(7, 15));
    m->push_back(std::make_shared<ReLU>());
    m->push_back(std::make_shared<Linear>(15, 3));
    return std::static_pointer_cast<Module>(m);
  };
  auto gpt = [] { return std::static_pointer_cast<Module>(std::make_shared<SmallGPT>()); };
  auto net = [] { return std::static_pointer_cast<Module>(std::make_shared<Net>()); };
  std::vector<std::pair<std::string, std::function<std::shared_ptr<Module>()>>> models{
      {"mlp", mlp}, {"gpt", gpt}, {"conv", conv_net}, {"net with a buffer", net}};
  for (auto& [what, make] : models) {
    INFO(what);
    auto eager = build(make, false);
    const uint64_t offset_after = default_generator().offset();
    int64_t before = memory_stats().live_bytes;
    auto deferred = build(make, true);
    CHECK(memory_stats().live_bytes == before);  // no parameter or buffer memory
    CHECK(default_generator().offset() == offset_after);  // the same counters reserved
    CHECK(!meta_tensor_names(*deferred).empty());
    for (auto& p : deferred->parameters()) CHECK(p.device().is_meta());
    materialize(*deferred);
    CHECK(meta_tensor_names(*deferred).empty());
    check_bitwise_equal(*eager, *deferred);
  }
  // Tied parameters stay one tensor.
  auto g = std::static_pointer_cast<SmallGPT>(build(gpt, true));
  materialize(*g);
  CHECK(g->head->weight.is_same(g->wte->weight));
  CHECK(g->wte->weight.requires_grad());
}

TEST_CASE("deferred initialisation: meta parameters are clear errors until materialised; mixed trees work") {
  manual_seed(3);
  // An eager child and a deferred one: the tree is partly meta.
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Linear>(3, 4));
  {
    DefaultDeviceGuard meta(Device::meta());
    m->push_back(std::make_shared<Linear>(4, 2));
  }
  Tensor x = ones({1, 3});
  CHECK_THROWS_WITH((*m)(x), Contains("parameter 'weight' is on the meta device") && Contains("nn::materialize"));
  CHECK_THROWS_WITH(m->state_dict(), Contains("state_dict") && Contains("meta device"));
  CHECK_THROWS_WITH(m->load_state_dict({}), Contains("load_state_dict") && Contains("'weight' is on the meta device"));
  CHECK_THROWS_WITH(Adam(m->parameters(), {.lr = 1e-3}), Contains("parameter 2 of group 0") && Contains("meta"));
  CHECK(meta_tensor_names(*m) == std::vector<std::string>{"1.weight", "1.bias"});
  auto first = to_vector(m->parameters()[0]);
  materialize(*m);
  CHECK(to_vector(m->parameters()[0]) == first);  // the eager part is untouched
  CHECK((*m)(x).shape() == Shape{1, 2});
  Adam opt(m->parameters(), {.lr = 1e-3});
  CHECK_THROWS_WITH(materialize(*m, Device::meta()), Contains("must hold data"));
}

TEST_CASE("shape propagation: forward and backward on a meta model give the shapes and the bytes of a real run") {
  // The same model and batch on the CPU and on the meta device; the activation and gradient
  // bytes of one training step (the allocator's peak above what was live before it) agree.
  auto step_peak = [](Module& model, Device device) {
    Tensor idx = device.is_meta() ? empty({4, 9}, {.dtype = DType::i64, .device = device})
                                  : (rand({4, 9}) * 11.0).to(DType::i64);
    Tensor target = device.is_meta() ? empty({36}, {.dtype = DType::i64, .device = device})
                                     : (rand({36}) * 11.0).to(DType::i64);
    const int64_t before = memory_stats(device).live_bytes;
    reset_peak_memory_stats(device);
    Tensor logits = model(idx);
    CHECK(logits.shape() == Shape{4, 9, 11});
    CHECK(logits.device() == device);
    cross_entropy(logits.view({-1, 11}), target).backward();
    for (auto& [name, p] : model.named_parameters()) {
      INFO(name);
      REQUIRE(p.grad().defined());
      CHECK(p.grad().shape() == p.shape());
      CHECK(p.grad().device() == device);
    }
    return memory_stats(device).peak_bytes - before;
  };
  manual_seed(1);
  SmallGPT real;
  int64_t real_peak = step_peak(real, kCPU);
  std::shared_ptr<SmallGPT> meta;
  {
    DefaultDeviceGuard on_meta(Device::meta());
    meta = std::make_shared<SmallGPT>();
  }
  int64_t meta_peak = 0;
  {
    MetaComputeGuard shapes_only;
    meta_peak = step_peak(*meta, Device::meta());
  }
  INFO("CPU step peak " << real_peak << " bytes, meta " << meta_peak);
  CHECK(meta_peak > 0);
  CHECK(meta_peak == real_peak);
  // Outside the guard the meta model is refused again.
  CHECK_THROWS_WITH((*meta)(empty({1, 2}, {.dtype = DType::i64, .device = Device::meta()})),
                    Contains("meta device"));
}

TEST_CASE("a module registered twice is visited and listed once, as nn.Module's apply and named_modules do") {
  struct Twice : Module {
    Twice() {
      auto shared = std::make_shared<Linear>(2, 2);
      register_module("a", shared);
      register_module("b", shared);
      register_module("c", std::make_shared<Linear>(2, 2));
    }
  };
  auto m = std::make_shared<Twice>();
  int visits = 0;
  std::vector<Module*> order;
  m->apply([&](Module& x) {
    order.push_back(&x);
    if (dynamic_cast<Linear*>(&x)) ++visits;
  });
  CHECK(visits == 2);                        // a (= b) and c: a re-initialisation through apply ran twice on a before
  CHECK(order.back() == m.get());            // children before the module itself
  std::vector<std::string> names;
  for (auto& [n, sub] : m->named_modules()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"", "a", "c"});
  CHECK(m->modules().size() == 3);
  struct WithBuffer : Module {
    WithBuffer() { register_buffer("count", zeros({1})); }
  };
  struct Outer : Module {
    Outer() {
      auto shared = std::make_shared<WithBuffer>();
      register_module("a", shared);
      register_module("b", shared);
    }
  };
  const auto buffers = Outer().named_buffers();
  REQUIRE(buffers.size() == 1);
  CHECK(buffers[0].first == "a.count");
}
