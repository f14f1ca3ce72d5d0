// Bad input must throw weft::Error with a message that says what is wrong — never crash.
#include <catch2/catch.hpp>

#include <filesystem>

#include "weft.h"

using namespace weft;
using Catch::Contains;

TEST_CASE("mismatched shapes are named") {
  Tensor a = ones({2, 3}), b = ones({4});
  CHECK_THROWS_WITH(a + b, Contains("[2, 3]") && Contains("[4]"));
  CHECK_THROWS_WITH(matmul(ones({2, 3}), ones({4, 5})), Contains("matmul") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(linear(ones({2, 3}), ones({5, 4})), Contains("linear"));
  CHECK_THROWS_WITH(cat({ones({2, 3}), ones({3, 3})}, 1), Contains("cat"));
  CHECK_THROWS_WITH(layer_norm(ones({2, 3}), {4}), Contains("normalized_shape"));
  CHECK_THROWS_WITH(a.view({4, 2}), Contains("view") && Contains("[4, 2]"));
  CHECK_THROWS_WITH(a.expand({2, 5}), Contains("expand"));
  CHECK_THROWS_WITH(from_vector({1, 2, 3}, {2, 2}), Contains("from_vector"));
}

TEST_CASE("wrong dtypes are named") {
  Tensor i = ones({2, 2}, {.dtype = kInt64});
  CHECK_THROWS_WITH(exp(i), Contains("i64"));
  CHECK_THROWS_WITH(i.set_requires_grad(), Contains("floating"));
  CHECK_THROWS_WITH(ones({2}).data<double>(), Contains("f32") && Contains("f64"));
  CHECK_THROWS_WITH(embedding(ones({4, 2}), ones({3})), Contains("embedding"));
  CHECK_THROWS_WITH(cross_entropy(ones({2, 3}), ones({2})), Contains("cross_entropy"));
  // mean of integers or bools: torch.mean's error (no output dtype to infer); convert first.
  CHECK_THROWS_WITH(mean(i), Contains("mean") && Contains("i64[2, 2]") && Contains("floating"));
  CHECK_THROWS_WITH(mean(ones({3}, {.dtype = kBool}), {0}), Contains("mean") && Contains("bool[3]"));
  CHECK_THROWS_WITH(var(i), Contains("var") && Contains("i64[2, 2]"));
}

TEST_CASE("out-of-range dims and indices are named") {
  Tensor a = ones({2, 3});
  CHECK_THROWS_WITH(a.transpose(0, 2), Contains("dim 2 out of range"));
  CHECK_THROWS_WITH(a.select(1, 3), Contains("index 3"));
  CHECK_THROWS_WITH(a.narrow(1, 2, 2), Contains("narrow"));
  CHECK_THROWS_WITH(sum(a, {5}), Contains("sum"));
  CHECK_THROWS_WITH(softmax(a, 2), Contains("softmax"));
  Tensor idx = from_vector({0, 7}, {2}, {.dtype = kInt64});
  CHECK_THROWS_WITH(embedding(ones({4, 2}), idx), Contains("7"));
  CHECK_THROWS_WITH(cross_entropy(ones({2, 3}), idx), Contains("7"));
  CHECK_THROWS_WITH(ones({3}).item(), Contains("item"));
  CHECK_THROWS_WITH(a.permute({0, 0}), Contains("repeated"));
}

TEST_CASE("autograd misuse is reported") {
  Tensor x = ones({2, 2}).set_requires_grad();
  Tensor y = exp(x);
  CHECK_THROWS_WITH(y.backward(), Contains("scalar"));
  Tensor s = sum(y);
  s.backward();
  CHECK_THROWS_WITH(s.backward(), Contains("second time"));
  CHECK_THROWS_WITH(ones({2}).backward(), Contains("does not require grad"));
  CHECK_THROWS_WITH(y.set_requires_grad(false), Contains("leaf"));
  CHECK_THROWS_WITH(x.fill_(1), Contains("in place"));
  CHECK_THROWS_WITH(sum(x).backward(ones({3})), Contains("does not match"));
}

TEST_CASE("undefined tensors, freed storage and invalid arguments") {
  Tensor undefined;
  CHECK_THROWS_WITH(undefined.shape(), Contains("undefined"));
  CHECK_THROWS_WITH(ones({2}) + undefined, Contains("undefined"));
  CHECK_THROWS_WITH(cat({undefined, ones({2})}, 0), Contains("cat: expects at least one tensor, none undefined (2 given)"));
  Tensor t = ones({4});
  t.storage()->free();
  CHECK_THROWS_WITH(t + t, Contains("freed"));
  CHECK_THROWS_WITH(dropout(ones({2}), 1.5), Contains("dropout"));
  CHECK_THROWS_WITH(gelu(ones({2}), "fast"), Contains("approximate"));
  CHECK_THROWS_WITH(empty({2, -1}), Contains("negative"));
  CHECK_THROWS_WITH(arange(0, 1, 0), Contains("step"));
  CHECK_THROWS_WITH(set_num_threads(0), Contains("thread"));
  // A device past the visible ones (all of them where no GPU or no CUDA build is there).
  const int gpus = device_count(DeviceType::cuda);
  CHECK_THROWS_WITH(ones({2}).to(Device::cuda(gpus)), Contains("cuda"));
  CHECK_THROWS_WITH(cross_entropy(ones({2, 3}), from_vector({0, 1}, {2}, {.dtype = kInt64}), {.reduction = "avg"}),
                    Contains("reduction"));
}

TEST_CASE("element and byte counts that overflow are refused, naming the shape") {
  const int64_t big = int64_t(1) << 40;
  CHECK_THROWS_WITH(empty({big, big}), Contains("[1099511627776, 1099511627776]") && Contains("overflows int64"));
  CHECK_THROWS_WITH(shape_numel({big, big, 2}), Contains("overflows int64"));
  CHECK_THROWS_WITH(zeros({int64_t(1) << 62, 4}), Contains("overflows"));
  // The element count fits but the bytes do not: 2^62 float32s are 2^64 bytes.
  CHECK_THROWS_WITH(empty({int64_t(1) << 62}), Contains("[4611686018427387904]") && Contains("byte size"));
  CHECK_THROWS_WITH(empty({int64_t(1) << 61}, {.dtype = kFloat64}), Contains("byte size"));
  // A zero dim makes any shape empty, however large the others.
  CHECK(shape_numel({big, big, 0}) == 0);
  CHECK(empty({big, 0, big}).numel() == 0);
  CHECK(shape_numel({int64_t(1) << 31, int64_t(1) << 31}) == int64_t(1) << 62);
}

TEST_CASE("a failed std::filesystem call in WEFT_FS is weft::Error with the library's text and weft's file:line") {
  const std::string missing = "/nonexistent-weft-dir/file";
  std::string message;  // a std::filesystem_error passing through fails the test
  try { WEFT_FS(std::filesystem::file_size(missing)); } catch (const Error& e) { message = e.what(); }
  const int line = __LINE__ - 1;
  CHECK_THAT(message, Contains("No such file or directory") && Contains(missing) &&
                          Contains(fmt::format("test_errors.cpp:{})", line)));
  CHECK(WEFT_FS(std::filesystem::exists(missing)) == false);  // a call that succeeds returns its value
}
