// Tests for nn::Module: registration order and dotted names, state dicts (strict and not,
// with clear errors), train/eval, to(dtype), apply, zero_grad, hooks and printing.
#include <catch2/catch.hpp>

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
