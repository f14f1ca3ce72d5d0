// Tests for core/safetensors and core/atomic_file: bit-exact round trips of every dtype and
// layout, the exact bytes of a small file, clear errors for every kind of corrupt file, and
// that a save which fails midway leaves the old checkpoint intact.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/atomic_file.h"
#include "core/safetensors.h"

using namespace weft;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

// A fresh directory per test case, removed with everything in it afterwards.
struct TempDir {
  fs::path dir;
  TempDir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          fmt::format("weft_test_safetensors_{}_{}", ::getpid(), counter++);
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
  return s;
}

// A safetensors file made by hand: length prefix, header text as given, then the data.
std::string make_file(const std::string& header, const std::string& data = "") {
  return u64_le(header.size()) + header + data;
}

// The tensor's elements as raw bytes, row-major.
std::string tensor_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  if (c.numel() == 0) return {};
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// "" when equal, else where and how the byte strings differ (so a failed CHECK shows it).
std::string byte_diff(const std::string& got, const std::string& want) {
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto at = [&](const std::string& s) {
    return i < s.size() ? fmt::format("0x{:02x}", uint8_t(s[i])) : std::string("(end)");
  };
  return fmt::format("sizes {} vs {}; first difference at byte {}: got {}, want {}", got.size(),
                     want.size(), i, at(got), at(want));
}

// A tensor of `dtype` whose bytes are `n` random bytes (0/1 for bool) plus the given specials.
Tensor random_bits(DType dtype, const Shape& shape, uint32_t seed) {
  Tensor t = empty(shape, {.dtype = dtype});
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = dtype == kBool ? rng() & 1 : uint8_t(rng());
  return t;
}

template <class T>
Tensor from_values(const std::vector<T>& v, DType dtype) {
  Tensor t = empty({int64_t(v.size())}, {.dtype = dtype});
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(T));
  return t;
}

void check_same(const Tensor& got, const Tensor& want, const std::string& name) {
  INFO("tensor '" << name << "': got " << tensor_desc(got) << ", want " << tensor_desc(want));
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  CHECK(got.device() == kCPU);
  if (got.numel() > 0) CHECK(got.is_contiguous());  // (no layout to speak of when empty)
  CHECK(byte_diff(tensor_bytes(got), tensor_bytes(want)) == "");
}

void check_round_trip(const NamedTensors& tensors, const Metadata& metadata = {}) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  save_safetensors(path, tensors, metadata);
  SafetensorsContents back = load_safetensors(path);
  CHECK(back.metadata == metadata);
  REQUIRE(back.tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(back.tensors[i].first == tensors[i].first);
    check_same(back.tensors[i].second, tensors[i].second, tensors[i].first);
  }
  CHECK(tmp.listing() == std::vector<std::string>{"t.safetensors"});
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bit-exactly") {
  const float f_inf = std::numeric_limits<float>::infinity();
  const double d_inf = std::numeric_limits<double>::infinity();
  NamedTensors tensors = {
      {"f32", random_bits(kFloat32, {3, 5}, 1)},
      {"f64", random_bits(kFloat64, {4, 2}, 2)},
      {"bf16", random_bits(kBFloat16, {7}, 3)},
      {"f16", random_bits(kFloat16, {2, 3, 2}, 4)},
      {"i64", random_bits(kInt64, {5}, 5)},
      {"i32", random_bits(kInt32, {3, 3}, 6)},
      {"u8", random_bits(kUInt8, {17}, 7)},
      {"bool", random_bits(kBool, {9}, 8)},
      {"f32 specials", from_values<float>({NAN, -NAN, f_inf, -f_inf, -0.f, 1e-45f, 3.4e38f},
                                          kFloat32)},
      {"f64 specials", from_values<double>({NAN, d_inf, -d_inf, -0.0, 5e-324}, kFloat64)},
      // bf16/f16 as bit patterns: NaN with payload, +-inf, -0, smallest subnormal, max.
      {"bf16 bits", from_values<uint16_t>({0x7fc1, 0xff81, 0x7f80, 0xff80, 0x8000, 0x0001, 0x7f7f},
                                          kBFloat16)},
      {"f16 bits", from_values<uint16_t>({0x7e01, 0xfc01, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x7bff},
                                         kFloat16)},
      {"i64 extremes", from_values<int64_t>({INT64_MIN, INT64_MAX, -1, 0}, kInt64)},
  };
  check_round_trip(tensors);
}

TEST_CASE("safetensors: 0-dim and 0-element tensors round-trip") {
  NamedTensors tensors = {
      {"scalar", scalar_tensor(3.5)},
      {"empty", empty({0})},
      {"empty 3d", empty({2, 0, 3}, {.dtype = kInt64})},
      {"after", from_vector({1, 2, 3}, {3}, {.dtype = kInt32})},
      {"scalar bf16", scalar_tensor(-1.25, {.dtype = kBFloat16})},
  };
  check_round_trip(tensors);
  TempDir tmp;
  std::string path = tmp.file("z.safetensors");
  save_safetensors(path, tensors);
  auto index = read_safetensors_index(path);
  REQUIRE(index.size() == 5);
  CHECK(index[0].shape == Shape{});
  CHECK(index[1].shape == Shape{0});
  CHECK(index[2].shape == Shape{2, 0, 3});
  CHECK(load_safetensors(path).tensors[0].second.item() == 3.5);
}

TEST_CASE("safetensors: a write that must not replace leaves a file made at its path meanwhile, and nothing else") {
  TempDir tmp;
  const std::string path = tmp.file("out.safetensors");
  const std::vector<SafetensorsEntry> entries = {{"x", kFloat32, {2}}};
  // The file appears while the tensors are written (after the caller checked that the path was free).
  auto produce = [&](size_t) {
    std::ofstream(path) << "someone else's";
    return from_vector({1, 2}, {2});
  };
  CHECK_THROWS_WITH(save_safetensors(path, entries, produce, {}, /*replace=*/false),
                    Contains("linking") && Contains("File exists"));
  CHECK(read_bytes(path) == "someone else's");
  CHECK(tmp.listing() == std::vector<std::string>{"out.safetensors"});  // no temporary left
  fs::remove(path);
  save_safetensors(path, entries, [](size_t) { return from_vector({1, 2}, {2}); }, {}, false);  // a free path: written
  CHECK(to_vector(load_safetensors(path).tensors[0].second) == std::vector<double>{1, 2});
}

TEST_CASE("safetensors: non-contiguous inputs are written contiguously") {
  Tensor base = arange(0, 24).view({4, 6});
  NamedTensors tensors = {
      {"transposed", base.t()},
      {"sliced", base.slice(1, 1, 6, 2)},
      {"column", base.select(1, 3)},
      {"expanded", arange(0, 3, 1, {.dtype = kInt64}).view({3, 1}).expand({3, 4})},
      {"permuted f16", base.to(kFloat16).view({2, 3, 4}).permute({2, 0, 1})},
  };
  for (auto& [name, t] : tensors) REQUIRE((!t.is_contiguous() || name == "column"));
  check_round_trip(tensors);
  TempDir tmp;
  std::string path = tmp.file("v.safetensors");
  save_safetensors(path, tensors);
  auto back = load_safetensors(path).tensors;
  CHECK(to_vector(back[0].second) == to_vector(base.t()));
  CHECK(to_vector(back[1].second) == std::vector<double>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23});
  CHECK(to_vector(back[3].second) == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});
}

TEST_CASE("safetensors: metadata and the index round-trip without reading data") {
  Metadata metadata = {{"format", "pt"}, {"step", "1200"}, {"quote\"and\\slash", "ünï\ncode"}};
  NamedTensors tensors = {{"w", ones({2, 3})}, {"b", zeros({3}, {.dtype = kFloat64})}};
  check_round_trip(tensors, metadata);
  check_round_trip(tensors, {});
  check_round_trip({}, {{"only", "metadata"}});
  check_round_trip({});

  TempDir tmp;
  std::string path = tmp.file("m.safetensors");
  save_safetensors(path, tensors, metadata);
  CHECK(read_safetensors_metadata(path) == metadata);
  auto index = read_safetensors_index(path);
  REQUIRE(index.size() == 2);
  CHECK(index[0].name == "w");
  CHECK(index[0].dtype == kFloat32);
  CHECK(index[0].shape == Shape{2, 3});
  CHECK(index[1].name == "b");
  CHECK(index[1].dtype == kFloat64);
  // Without metadata the header has no "__metadata__" key at all, as Python's writer does.
  save_safetensors(path, tensors);
  CHECK(read_bytes(path).find("__metadata__") == std::string::npos);
  CHECK(read_safetensors_metadata(path).empty());
}

TEST_CASE("safetensors: rows read into a tensor, converted piece by piece or straight") {
  TempDir tmp;
  const std::string path = tmp.file("rows.safetensors");
  Tensor w = randn({7, 10}).to(kBFloat16);
  auto same = [](const Tensor& a, const Tensor& b) {  // dtype, shape and every byte
    const Tensor ca = a.contiguous(), cb = b.contiguous();
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(ca.data_ptr(), cb.data_ptr(), size_t(ca.numel()) * dtype_size(a.dtype())) == 0;
  };
  save_safetensors(path, {{"w", w}, {"s", full({}, 2.5, {.dtype = kBFloat16})}});
  SafetensorsReader r(path);
  for (int64_t buffer : {int64_t(20), int64_t(40), int64_t(1) << 20}) {  // 1 row, 2 rows, all in one piece
    Tensor f = full({4, 10}, -1.0);
    r.read_rows_into("w", 2, 4, f, buffer);
    CHECK(same(f, w.narrow(0, 2, 4).to(kFloat32)));
  }
  Tensor straight = empty({3, 10}, {.dtype = kBFloat16});  // the file's dtype: read straight into it
  r.read_rows_into("w", 4, 3, straight);
  CHECK(same(straight, w.narrow(0, 4, 3)));
  Tensor scalar = empty({}, {.dtype = kFloat64});
  r.read_rows_into("s", 0, 1, scalar);
  CHECK(scalar.item() == 2.5);
  Tensor wrong = empty({3, 9});
  CHECK_THROWS_WITH(r.read_rows_into("w", 0, 3, wrong), Contains("rows of tensor 'w' (bf16, 3 x 10 elements)"));
  Tensor strided = empty({10, 3}).transpose(0, 1);
  CHECK_THROWS_WITH(r.read_rows_into("w", 0, 3, strided), Contains("into a contiguous CPU tensor"));
  Tensor ints = empty({3, 10}, {.dtype = kInt64});
  CHECK_THROWS_WITH(r.read_rows_into("w", 0, 3, ints), Contains("of its dtype or (a float) any float dtype, not i64"));
  CHECK_THROWS_WITH(r.read_rows_into("w", 5, 3, straight), Contains("cannot read 3 rows from 5 of tensor 'w' shaped [7, 10]"));
  // An offset near the int64 limit: offset + length wraps, and the read would seek into another tensor or the header.
  Tensor one = empty({1, 10});
  CHECK_THROWS_WITH(r.read_rows_into("w", INT64_MAX, 1, one), Contains("cannot read 1 rows from 9223372036854775807"));
  CHECK_THROWS_WITH(r.read_slice("w", 1, INT64_MAX - 1, 2), Contains("cannot read 2 from 9223372036854775806 of dim 1"));
  CHECK_THROWS_WITH(r.read_slice("w", 0, INT64_MAX, 1), Contains("cannot read 1 from 9223372036854775807 of dim 0"));
}

TEST_CASE("safetensors: a reader that refuses NaN and infinity names the element, however it reads") {
  TempDir tmp;
  const std::string path = tmp.file("nonfinite.safetensors");
  Tensor w = randn({7, 10});
  w.data<float>()[53] = std::numeric_limits<float>::quiet_NaN();  // [5, 3]
  Tensor b = randn({3, 4});
  b.data<float>()[6] = -std::numeric_limits<float>::infinity();  // [1, 2]
  save_safetensors(path, {{"w", w}, {"b", b.to(kBFloat16)}});
  CHECK(std::isnan(SafetensorsReader(path).read("w").data<float>()[53]));  // by default values are as stored
  SafetensorsReader r(path, true);
  const auto refused = [](const std::string& what) { return Contains(what + " (not finite: refused)"); };
  CHECK_THROWS_WITH(r.read("w"), refused("tensor 'w' holds nan at element 53"));
  CHECK_THROWS_WITH(r.read("b"), refused("tensor 'b' holds -inf at element 6"));
  for (int64_t buffer : {int64_t(40), int64_t(1) << 20}) {  // one row a piece, all in one
    for (DType d : {kFloat32, kBFloat16}) {  // straight, converted
      Tensor clean = empty({5, 10}, {.dtype = d});
      r.read_rows_into("w", 0, 5, clean, buffer);  // rows 0-4: all finite, read whole
      const Tensor want = w.narrow(0, 0, 5).to(d).contiguous();
      CHECK(std::memcmp(clean.data_ptr(), want.data_ptr(), size_t(want.nbytes())) == 0);
      Tensor bad = empty({3, 10}, {.dtype = d});
      CHECK_THROWS_WITH(r.read_rows_into("w", 4, 3, bad, buffer), refused("tensor 'w' holds nan at element 53"));
    }
  }
  CHECK_THROWS_WITH(r.read_slice("w", 1, 2, 3), refused("tensor 'w' holds nan at element 53"));  // columns 2-4
  CHECK(r.read_slice("w", 1, 4, 3).shape() == Shape{7, 3});  // columns 4-6: finite
  CHECK_THROWS_WITH(r.read_slice("b", 0, 1, 1), refused("tensor 'b' holds -inf at element 6"));
}

TEST_CASE("safetensors: exact bytes of a tiny file") {
  TempDir tmp;
  std::string path = tmp.file("tiny.safetensors");
  save_safetensors(path, {{"a", from_values<float>({1.0f, -2.0f}, kFloat32)}}, {{"k", "v"}});
  // 79 bytes of JSON plus one space of padding: N = 80, so the data starts at byte 88.
  std::string header = R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],)"
                       R"("data_offsets":[0,8]}} )";
  REQUIRE(header.size() == 80);
  std::string want = std::string("\x50\0\0\0\0\0\0\0", 8) + header +
                     std::string("\x00\x00\x80\x3f" "\x00\x00\x00\xc0", 8);  // 1.0f, -2.0f
  CHECK(byte_diff(read_bytes(path), want) == "");
}

TEST_CASE("safetensors: data starts 8-byte aligned whatever the header length") {
  TempDir tmp;
  std::string path = tmp.file("a.safetensors");
  for (int len = 1; len <= 16; ++len) {
    std::string name(size_t(len), 'x');
    save_safetensors(path, {{name, from_values<double>({1.5}, kFloat64)}});
    std::string bytes = read_bytes(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | uint8_t(bytes[size_t(i)]);
    INFO("name length " << len << ", header length " << n);
    CHECK((8 + n) % 8 == 0);
    CHECK(bytes.size() == 8 + n + 8);
    std::string header = bytes.substr(8, n);
    CHECK(header.substr(header.find_last_not_of(' ') + 1).size() < 8);  // only spaces padded
    CHECK(load_safetensors(path).tensors[0].second.item() == 1.5);
  }
}

TEST_CASE("safetensors: files written by hand load; tensors come in data order") {
  TempDir tmp;
  std::string path = tmp.file("hand.safetensors");
  // Header order differs from data order; extra keys in an entry are ignored; padding after
  // the JSON is whitespace.
  std::string header = R"({"b":{"dtype":"BOOL","shape":[3],"data_offsets":[4,7],"x":1},)"
                       R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
                       R"("__metadata__":{"m":"1"}}   )";
  write_bytes(path, make_file(header, std::string("\x07\x00\x00\x00" "\x00\x01\x01", 7)));
  auto c = load_safetensors(path);
  REQUIRE(c.tensors.size() == 2);
  CHECK(c.tensors[0].first == "a");
  CHECK(c.tensors[0].second.item() == 7);
  CHECK(c.tensors[1].first == "b");
  CHECK(to_vector(c.tensors[1].second) == std::vector<double>{0, 1, 1});
  CHECK(c.metadata == Metadata{{"m", "1"}});
  CHECK(read_safetensors_index(path)[0].name == "a");
}

TEST_CASE("safetensors: corrupt files give errors naming the file and the problem") {
  TempDir tmp;
  std::string path = tmp.file("bad.safetensors");
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::string eight(8, '\0');
  // Every reader fails the same way: the header is always validated in full.
  auto check_bad = [&](const std::string& bytes, const std::string& problem) {
    write_bytes(path, bytes);
    INFO("file bytes: " << bytes.substr(0, 200));
    CHECK_THROWS_WITH(load_safetensors(path), Contains(problem) && Contains(path));
    CHECK_THROWS_WITH(read_safetensors_index(path), Contains(problem) && Contains(path));
    CHECK_THROWS_WITH(read_safetensors_metadata(path), Contains(problem) && Contains(path));
  };

  SECTION("missing file or a directory") {
    CHECK_THROWS_WITH(load_safetensors(tmp.file("nope.safetensors")),
                      Contains("cannot open") && Contains("nope.safetensors") &&
                          Contains("No such file or directory"));
    CHECK_THROWS_WITH(read_safetensors_index(tmp.dir.string()), Contains("is a directory"));
  }
  SECTION("too short, or a header length past the end") {
    check_bad("", "too short");
    check_bad(std::string("\x05\0\0\0", 4), "too short");
    check_bad(make_file("{}").substr(0, 9), "larger than the file");
    check_bad(u64_le(100) + "{}", "larger than the file");
    check_bad(u64_le(uint64_t(1) << 40) + "{}", "larger than the limit");
    check_bad(u64_le(~uint64_t(0)) + "{}", "larger than the limit");
  }
  SECTION("the header is not a JSON object") {
    check_bad(make_file(""), "not valid JSON");
    check_bad(make_file(R"({"a": )"), "not valid JSON");
    check_bad(make_file("{\"\xff\xfe\":{}}"), "not valid JSON");  // not UTF-8
    check_bad(make_file("[1, 2]"), "header is a JSON array, not an object");
    check_bad(make_file(std::string(100000, '[') + std::string(100000, ']')), "not an object");
  }
  SECTION("entries of the wrong shape") {
    check_bad(make_file(R"({"a":5})"), "entry 'a' is a JSON number");
    check_bad(make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight),
              "tensor 'a' has no \"dtype\"");
    check_bad(make_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
              "tensor 'a' has no \"shape\"");
    check_bad(make_file("{\"a\":{" + f32x2 + "}}", eight), "tensor 'a' has no \"data_offsets\"");
    check_bad(make_file(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", eight),
              "dtype 7, not a string");
    check_bad(make_file(R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", eight),
              "unsupported dtype \"F8_E4M3\"");
  }
  SECTION("bad shapes") {
    for (std::string shape : {"[-2]", "[2.0]", "[\"2\"]", "2", "[null]", "[18446744073709551615]"})
      check_bad(make_file(R"({"a":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,2]}})",
                          "xx"),
                "has shape " + shape + "; a shape must be a list of non-negative integers");
    check_bad(make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],)"
                        R"("data_offsets":[0,8]}})", eight),
              "too large to address");
  }
  SECTION("bad data offsets") {
    for (std::string offsets : {"[0]", "[0,8,16]", "[-8,0]", "[0,8.5]", "{}", "null"})
      check_bad(make_file("{\"a\":{" + f32x2 + ",\"data_offsets\":" + offsets + "}}", eight),
                "data_offsets " + offsets + "; they must be [begin, end]");
    check_bad(make_file("{\"a\":{" + f32x2 + R"(,"data_offsets":[8,0]}})", eight),
              "data_offsets [8, 0], which end before they begin");
    check_bad(make_file("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,16]}})", eight),
              "past the end of the data section (8 bytes");
    check_bad(make_file("{\"a\":{" + f32x2 + R"(,"data_offsets":[0,4]}})", eight),
              "tensor 'a' (F32 [2]) needs 8 bytes but its data_offsets [0, 4] hold 4");
  }
  SECTION("data regions must tile the data section") {
    const std::string a = "\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]})";
    check_bad(make_file("{" + a + ",\"b\":{" + f32x2 + R"(,"data_offsets":[4,12]}})",
                        std::string(12, '\0')),
              "tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))");
    check_bad(make_file("{" + a + ",\"b\":{" + f32x2 + R"(,"data_offsets":[0,8]}})", eight),
              "overlaps tensor");
    check_bad(make_file("{" + a + ",\"b\":{" + f32x2 + R"(,"data_offsets":[12,20]}})",
                        std::string(20, '\0')),
              "4 unused bytes before tensor 'b'");
    check_bad(make_file("{" + a + "}", std::string(9, '\0')),
              "data section is 9 bytes but the tensors end at byte 8: 1 trailing bytes");
    check_bad(make_file("{" + a + "}", std::string(5, '\0')),  // truncated data
              "past the end of the data section (5 bytes; is the file truncated?)");
    check_bad(make_file("{}", "x"), "1 trailing bytes");
  }
  SECTION("a key given twice (a JSON parser keeps one of them)") {
    const std::string a = "\"a\":{" + f32x2 + R"(,"data_offsets":[0,8]})";
    check_bad(make_file("{" + a + "," + a + "}", eight), "the header has key 'a' twice");
    check_bad(make_file(R"({"a":{"dtype":"I32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
              "'a' has key 'dtype' twice");
    check_bad(make_file(R"({"__metadata__":{"k":"1","k":"2"}})"), "'__metadata__' has key 'k' twice");
  }
  SECTION("bad metadata") {
    check_bad(make_file(R"({"__metadata__":{"k":1}})"), "__metadata__ entry 'k' is 1, not a string");
    check_bad(make_file(R"({"__metadata__":[]})"), "__metadata__ is a JSON array");
  }
}

// A C++ bool holding another byte than 0 or 1 is undefined behaviour: such a file is refused,
// naming the first bad byte, however the tensor is read.
TEST_CASE("safetensors: a BOOL tensor with a byte other than 0 or 1 is refused") {
  TempDir tmp;
  std::string path = tmp.file("bool.safetensors");
  write_bytes(path, make_file(R"({"b":{"dtype":"BOOL","shape":[5],"data_offsets":[0,5]}})",
                              std::string("\x01\x00\x01\x05\x02", 5)));
  const std::string third = "bool tensor 'b' holds byte 5 at index 3";
  CHECK_THROWS_WITH(load_safetensors(path), Contains(path) && Contains(third));
  SafetensorsReader reader(path, /*refuse_nonfinite=*/true);
  CHECK_THROWS_WITH(reader.read("b"), Contains(path) && Contains(third));
  Tensor rows = empty({2}, {.dtype = kBool});
  CHECK_NOTHROW(reader.read_rows_into("b", 0, 2, rows));
  CHECK(to_vector(rows) == std::vector<double>{1, 0});
  CHECK(to_vector(reader.read_slice("b", 0, 1, 2)) == std::vector<double>{0, 1});
  CHECK_THROWS_WITH(reader.read_slice("b", 0, 2, 3), Contains("'b' holds byte 5 at index 3"));
  Tensor last = empty({1}, {.dtype = kBool});
  CHECK_THROWS_WITH(SafetensorsReader(path).read_rows_into("b", 4, 1, last), Contains("'b' holds byte 2 at index 4"));
}

TEST_CASE("safetensors: bad tensor lists are refused before the file is touched") {
  TempDir tmp;
  std::string path = tmp.file("s.safetensors");
  Tensor t = ones({2});
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t}, {"b", t}, {"a", t}}),
                    Contains("tensor name 'a' appears more than once") && Contains(path));
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t}, {"", t}}),
                    Contains("tensor #1 has an empty name") && Contains(path));
  CHECK_THROWS_WITH(save_safetensors(path, {{"__metadata__", t}}), Contains("reserves"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"u", Tensor()}}), Contains("tensor 'u' is undefined"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"bad\xff", t}}), Contains("not valid UTF-8"));
  CHECK(tmp.listing().empty());
  CHECK_THROWS_WITH(save_safetensors(tmp.file("no/such/dir/x.safetensors"), {{"a", t}}),
                    Contains("no/such/dir/x.safetensors") && Contains("No such file or directory"));
}

TEST_CASE("safetensors: a save that fails midway leaves the old file intact") {
  TempDir tmp;
  std::string path = tmp.file("ckpt.safetensors");
  save_safetensors(path, {{"w", arange(0, 10)}}, {{"step", "1"}});
  const std::string old_bytes = read_bytes(path);

  // The second tensor's memory is gone: the write throws after the header and "a" went out.
  Tensor freed = ones({1000});
  freed.storage()->free();
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", ones({1000})}, {"b", freed}}),
                    Contains("cannot write tensor 'b'") && Contains("freed") && Contains(path));
  CHECK(byte_diff(read_bytes(path), old_bytes) == "");
  CHECK(tmp.listing() == std::vector<std::string>{"ckpt.safetensors"});  // no temp file left
  auto back = load_safetensors(path);
  CHECK(to_vector(back.tensors.at(0).second) == to_vector(arange(0, 10)));
  CHECK(back.metadata.at("step") == "1");
}

TEST_CASE("write_file_atomic: replaces whole files, or not at all") {
  TempDir tmp;
  std::string path = tmp.file("f.txt");
  auto put = [](const char* text) {
    return [text](std::FILE* f) { REQUIRE(std::fputs(text, f) >= 0); };
  };
  write_file_atomic(path, put("first"));
  CHECK(read_bytes(path) == "first");
  write_file_atomic(path, put("second, longer"));
  CHECK(read_bytes(path) == "second, longer");

  CHECK_THROWS_WITH(write_file_atomic(path,
                                      [](std::FILE* f) {
                                        std::fputs("partial", f);
                                        throw std::runtime_error("writer gave up");
                                      }),
                    "writer gave up");
  CHECK(read_bytes(path) == "second, longer");
  CHECK(tmp.listing() == std::vector<std::string>{"f.txt"});

  // A new file gets the usual permissions (0666 less the umask), not a temp file's 0600.
  mode_t mask = ::umask(022);
  std::string fresh = tmp.file("fresh.txt");
  write_file_atomic(fresh, put("x"));
  ::umask(mask);
  struct stat st;
  REQUIRE(::stat(fresh.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);

  CHECK_THROWS_WITH(write_file_atomic(tmp.file("missing/f.txt"), put("x")),
                    Contains("missing/f.txt") && Contains("No such file or directory"));
}

TEST_CASE("write_file_atomic: removes the temporary files of killed writers to the same path, no others") {
  TempDir tmp;
  const pid_t child = ::fork();  // a pid that is gone once waited for
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  const std::string path = tmp.file("train.tokens"), dead = fmt::format("train.tokens.tmp.{}.0", child);
  const std::string live = fmt::format("train.tokens.tmp.{}.7", ::getpid());
  for (const std::string& name : {dead, live, fmt::format("other.tmp.{}.0", child), std::string("train.tokens.tmp.x.0")})
    write_bytes(tmp.file(name), "half");
  CHECK(temp_owner_gone(std::to_string(child)));
  CHECK_FALSE(temp_owner_gone(std::to_string(::getpid())));
  CHECK_FALSE(temp_owner_gone("12a"));
  write_file_atomic(path, [](std::FILE* f) { REQUIRE(std::fputs("whole", f) >= 0); });
  std::vector<std::string> want = {fmt::format("other.tmp.{}.0", child), "train.tokens", live,
                                   "train.tokens.tmp.x.0"};
  std::sort(want.begin(), want.end());
  CHECK(tmp.listing() == want);
}
