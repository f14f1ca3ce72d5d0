// Tests for the mnist app's data layer: IDX files (plain and gzip'd), and every malformed
// or missing input it must reject with a message naming the file and the problem.
#include <catch2/catch.hpp>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>

#include "apps/mnist/idx.h"
#include "apps/mnist/models.h"
#include "weft.h"

using namespace weft;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("weft_idx_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, size_t data_bytes, uint8_t fill = 7) {
  std::vector<uint8_t> b{0, 0, type, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(d >> s));
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(uint8_t(fill + i));
  return b;
}
void write_plain(const std::string& path, const std::vector<uint8_t>& b) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(b.data(), 1, b.size(), f) == b.size());
  std::fclose(f);
}
void write_gz(const std::string& path, const std::vector<uint8_t>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), unsigned(b.size())) == int(b.size()));
  gzclose(f);
}
}  // namespace

TEST_CASE("IDX files read plain and gzip'd") {
  TempDir d;
  auto bytes = idx_bytes(0x08, {2, 3}, 6);
  write_plain(d.file("a.idx"), bytes);
  write_gz(d.file("a.idx.gz"), bytes);
  for (auto name : {"a.idx", "a.idx.gz"}) {
    Tensor t = apps::read_idx(d.file(name));
    CHECK(t.shape() == Shape{2, 3});
    CHECK(t.dtype() == kUInt8);
    CHECK(to_vector(t) == std::vector<double>{7, 8, 9, 10, 11, 12});
  }
}

TEST_CASE("malformed IDX files are clear errors") {
  TempDir d;
  write_plain(d.file("magic"), {1, 2, 8, 1, 0, 0, 0, 1, 5});
  CHECK_THROWS_WITH(apps::read_idx(d.file("magic")), Contains("magic") && Contains("magic"));
  write_plain(d.file("type"), idx_bytes(0x0D, {1}, 4));
  CHECK_THROWS_WITH(apps::read_idx(d.file("type")), Contains("only unsigned bytes"));
  auto trunc = idx_bytes(0x08, {10, 10}, 50);
  write_gz(d.file("trunc.gz"), trunc);
  CHECK_THROWS_WITH(apps::read_idx(d.file("trunc.gz")), Contains("truncated") && Contains("trunc.gz"));
  write_plain(d.file("short"), {0, 0});
  CHECK_THROWS_WITH(apps::read_idx(d.file("short")), Contains("truncated"));
  write_plain(d.file("extra"), idx_bytes(0x08, {2}, 5));
  CHECK_THROWS_WITH(apps::read_idx(d.file("extra")), Contains("bytes after"));
  CHECK_THROWS_WITH(apps::read_idx(d.file("nope")), Contains("does not exist"));
}

TEST_CASE("IDX headers declaring more than the file holds are refused before allocating") {
  TempDir d;
  // 4 GiB declared by a 9-byte file (plain) and by a few dozen bytes of gzip (found by fuzz_idx).
  write_plain(d.file("big"), idx_bytes(0x08, {0xffffffff}, 1));
  CHECK_THROWS_WITH(apps::read_idx(d.file("big")), Contains("truncated") && Contains("holds at most 1"));
  write_gz(d.file("big.gz"), idx_bytes(0x08, {0xffffffff}, 0));
  CHECK_THROWS_WITH(apps::read_idx(d.file("big.gz")), Contains("truncated") && Contains("[4294967295]"));
  // Two dims near 2^32 multiply past 2^63: refused by the size limit, without overflowing.
  write_plain(d.file("wide"), idx_bytes(0x08, {0xffffffff, 0xffffffff}, 0));
  CHECK_THROWS_WITH(apps::read_idx(d.file("wide")), Contains("more than the limit"));
}

TEST_CASE("data sets: missing files name the Debian package; counts must agree") {
  TempDir d;
  CHECK_THROWS_WITH(apps::load_mnist(d.file("missing_dir")), Contains("dataset-fashion-mnist"));
  CHECK_THROWS_WITH(apps::load_mnist(d.path.string()), Contains("train-images-idx3-ubyte") &&
                                                           Contains("dataset-fashion-mnist"));
  write_gz(d.file("train-images-idx3-ubyte.gz"), idx_bytes(0x08, {3, 2, 2}, 12));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {2}, 2, 1));
  write_gz(d.file("t10k-images-idx3-ubyte.gz"), idx_bytes(0x08, {1, 2, 2}, 4));
  write_gz(d.file("t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {1}, 1, 3));
  CHECK_THROWS_WITH(apps::load_mnist(d.path.string()), Contains("3 images") && Contains("2 labels"));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {3}, 3, 9));  // labels 9, 10, 11
  CHECK_THROWS_WITH(apps::load_mnist(d.path.string()), Contains("label 10"));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {3}, 3, 0));
  auto data = apps::load_mnist(d.path.string());
  CHECK(data.rows == 2);
  CHECK(data.train.images.shape() == Shape{3, 4});
  auto [x, y] = apps::mnist_batch(data.train, {2, 0}, 0, 2);
  CHECK(to_vector(y) == std::vector<double>{2, 0});
  CHECK(to_vector(x)[0] == Approx(15.0 / 255));
}

TEST_CASE("both models map 784 pixels to 10 logits") {
  for (auto name : {"mlp", "cnn"}) {
    auto m = apps::make_mnist_model(name, 28, 28);
    CHECK((*m)(zeros({3, 784})).shape() == Shape{3, 10});
  }
  CHECK_THROWS_WITH(apps::make_mnist_model("rnn", 28, 28), Contains("mlp or cnn"));
}
