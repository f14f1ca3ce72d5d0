#include "apps/mnist/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace weft::apps {

namespace {
struct GzFile {
  gzFile f;
  ~GzFile() {
    if (f) gzclose(f);
  }
};
}  // namespace

Tensor read_idx(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  WEFT_CHECK(fs::exists(path, ec), "read_idx: {} does not exist", path);
  // A FIFO would block open() for ever and a device (/dev/zero) never ends: only regular files.
  WEFT_CHECK(fs::is_regular_file(path, ec), "read_idx: {} is not a regular file (a FIFO, device or directory?)", path);
  const uintmax_t size = fs::file_size(path, ec);
  WEFT_CHECK(!ec && size <= kMaxIdxBytes, "read_idx: {} is {} bytes, more than the limit of {} bytes", path, size,
             kMaxIdxBytes);
  GzFile gz{gzopen(path.c_str(), "rb")};  // reads plain files too
  WEFT_CHECK(gz.f != nullptr, "read_idx: cannot open {}", path);
  auto read_exact = [&](void* buf, size_t n, const char* what) {
    // gzread reads at most INT_MAX bytes a call (and returns fewer only at the end of the file).
    for (size_t done = 0; done < n;) {
      int got = gzread(gz.f, static_cast<char*>(buf) + done, unsigned(std::min<size_t>(n - done, size_t(1) << 30)));
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(gz.f, &errnum);
        WEFT_ERROR("read_idx: {}: reading {} failed: {}", path, what, msg);
      }
      WEFT_CHECK(got > 0, "read_idx: {} is truncated: expected {} bytes of {}, got {}", path, n, what, done);
      done += size_t(got);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "the magic number");
  WEFT_CHECK(magic[0] == 0 && magic[1] == 0, "read_idx: {} is not an IDX file (bad magic {:02x}{:02x}{:02x}{:02x})",
             path, magic[0], magic[1], magic[2], magic[3]);
  WEFT_CHECK(magic[2] == 0x08, "read_idx: {} holds IDX type 0x{:02x}; only unsigned bytes (0x08) are supported",
             path, magic[2]);
  int ndim = magic[3];
  WEFT_CHECK(ndim >= 1 && ndim <= 4, "read_idx: {} declares {} dims (expected 1 to 4)", path, ndim);
  Shape dims;
  uint64_t total = 1;  // <= 2^32 before each product with a dim < 2^32: never wraps
  for (int i = 0; i < ndim; ++i) {
    unsigned char b[4];
    read_exact(b, 4, "the dimensions");
    int64_t d = (int64_t(b[0]) << 24) | (int64_t(b[1]) << 16) | (int64_t(b[2]) << 8) | int64_t(b[3]);
    dims.push_back(d);
    total *= uint64_t(d);
    WEFT_CHECK(total <= kMaxIdxBytes, "read_idx: {} declares {} ({} bytes or more), more than the limit of {} bytes",
               path, shape_str(dims), total, kMaxIdxBytes);
  }
  // Nothing is allocated for data the file cannot hold: a plain file holds what follows its
  // header, a gzip'd one at most deflate's largest ratio (1032:1) times its size.
  const uint64_t header = 4 + 4 * uint64_t(ndim);
  const uint64_t room = gzdirect(gz.f) ? (size > header ? size - header : 0) : size * 1032;
  WEFT_CHECK(total <= room, "read_idx: {} is truncated: its header declares {} ({} bytes), the file holds at most {}",
             path, shape_str(dims), total, room);
  Tensor out = empty(dims, {.dtype = DType::u8});
  read_exact(out.data_ptr(), size_t(total), "the data");  // in pieces of at most 1 GiB
  unsigned char extra;
  WEFT_CHECK(gzread(gz.f, &extra, 1) == 0, "read_idx: {} has bytes after the {} declared by its header {}", path,
             total, shape_str(dims));
  return out;
}

static std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& cand : {dir + "/" + name, dir + "/" + name + ".gz"})
    if (WEFT_FS(std::filesystem::exists(cand))) return cand;
  WEFT_ERROR("mnist: {}/{}[.gz] not found. For the default Fashion-MNIST data install the Debian package: "
             "apt-get install dataset-fashion-mnist (or pass --data DIR with IDX files)", dir, name);
}

static MnistSplit load_split(const std::string& dir, const std::string& prefix, int64_t& rows, int64_t& cols) {
  std::string ip = find_file(dir, prefix + "-images-idx3-ubyte"), lp = find_file(dir, prefix + "-labels-idx1-ubyte");
  Tensor images = read_idx(ip), labels = read_idx(lp);
  WEFT_CHECK(images.dim() == 3, "mnist: {} should be [N, rows, cols], got {}", ip, shape_str(images.shape()));
  WEFT_CHECK(labels.dim() == 1, "mnist: {} should be [N], got {}", lp, shape_str(labels.shape()));
  WEFT_CHECK(images.size(0) == labels.size(0), "mnist: {} has {} images but {} has {} labels", ip, images.size(0),
             lp, labels.size(0));
  WEFT_CHECK(images.numel() > 0, "mnist: {} holds no pixels ({} images of {}x{})", ip, images.size(0), images.size(1),
             images.size(2));
  rows = images.size(1);
  cols = images.size(2);
  const uint8_t* l = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    WEFT_CHECK(l[i] < 10, "mnist: {}: label {} at index {} is not a class 0..9", lp, int(l[i]), i);
  return {images.view({images.size(0), rows * cols}), labels.to(DType::i64)};
}

MnistData load_mnist(const std::string& dir) {
  std::error_code ec;
  WEFT_CHECK(!std::filesystem::exists(dir, ec) || std::filesystem::is_directory(dir, ec),
             "mnist: --data {} is not a directory (it should hold the IDX files)", dir);
  WEFT_CHECK(std::filesystem::is_directory(dir, ec),
             "mnist: data directory {} does not exist. For Fashion-MNIST install the Debian package: "
             "apt-get install dataset-fashion-mnist (or pass --data DIR with IDX files)", dir);
  MnistData d;
  int64_t r2 = 0, c2 = 0;
  d.train = load_split(dir, "train", d.rows, d.cols);
  d.test = load_split(dir, "t10k", r2, c2);
  WEFT_CHECK(r2 == d.rows && c2 == d.cols, "mnist: train images are {}x{} but test images are {}x{}", d.rows, d.cols,
             r2, c2);
  return d;
}

std::pair<Tensor, Tensor> mnist_batch(const MnistSplit& split, const std::vector<int64_t>& indices, int64_t begin,
                                      int64_t n) {
  int64_t pixels = split.images.size(1);
  Tensor x = empty({n, pixels});
  Tensor y = empty({n}, {.dtype = DType::i64});
  const uint8_t* src = split.images.data<uint8_t>();
  const int64_t* lab = split.labels.data<int64_t>();
  float* dst = x.data<float>();
  int64_t* yd = y.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t row = indices[size_t(begin + i)];
    const uint8_t* s = src + row * pixels;
    float* d = dst + i * pixels;
    for (int64_t j = 0; j < pixels; ++j) d[j] = float(s[j]) / 255.0f;
    yd[i] = lab[row];
  }
  return {x, y};
}

}  // namespace weft::apps
