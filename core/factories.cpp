// core: tensor factories, in-place fills, and element access as doubles.
#include <cmath>
#include <limits>
#include <utility>

#include "core/copy.h"
#include "core/dispatch.h"
#include "core/fill_rule.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "core/strided_iter.h"

namespace weft {

namespace {
// shape_numel(shape) * element_size, checked: the byte count of a tensor must fit an int64.
size_t shape_nbytes(const Shape& shape, size_t element_size) {
  size_t bytes = 0;
  int64_t n = shape_numel(shape);
  WEFT_CHECK(n >= 0 && !__builtin_mul_overflow(size_t(n), element_size, &bytes) &&
                 bytes <= size_t(std::numeric_limits<int64_t>::max()),
             "shape {}: {} elements of {} bytes overflow the byte size", shape_str(shape), n, element_size);
  return bytes;
}
}  // namespace

Tensor empty(const Shape& shape, TensorOptions opts) {
  for (int64_t s : shape) WEFT_CHECK(s >= 0, "empty: negative size in shape {}", shape_str(shape));
  size_t nbytes = shape_nbytes(shape, dtype_size(opts.dtype));
  auto storage = std::make_shared<StorageImpl>(nbytes, opts.device);
  Tensor t(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, opts.dtype));
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  t.fill_(value);
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), {.dtype = t.dtype(), .device = t.device()}); }

namespace {
// Builds a tensor of opts' dtype from doubles produced in row-major order, writing straight into a CPU tensor (no f64
// staging copy: initialising a large weight must not need twice its size), then moves it to opts' device.
template <class Fill>
Tensor from_doubles(const Shape& shape, TensorOptions opts, Fill&& fill) {
  if (opts.device.is_meta() && MetaComputeGuard::enabled()) return empty(shape, opts);  // shapes only
  WEFT_CHECK(!opts.device.is_meta(),
             "factory: a tensor of given values (shape {}) cannot be built on the meta device, which holds no data "
             "(under DefaultDeviceGuard(Device::meta()) pass .device = kCPU for it)", shape_str(shape));
  Tensor host = empty(shape, {.dtype = opts.dtype, .device = kCPU});
  int64_t n = host.numel();
  WEFT_DISPATCH(opts.dtype, "factory", [&]<typename T>() {
    T* p = static_cast<T*>(host.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const double v = fill(i);
      WEFT_CHECK(scalar_fits(v, opts.dtype), "factory: element {} is {}, which {} cannot hold", i, v,
                 dtype_name(opts.dtype));
      p[i] = convert_scalar<T>(v);
    }
  });
  Tensor out = opts.device.is_cpu() ? host : host.to(opts.device);
  if (opts.requires_grad) out.set_requires_grad(true);
  return out;
}
}  // namespace

Tensor arange(double start, double end, double step, TensorOptions opts) {
  WEFT_CHECK(step != 0, "arange: step must be non-zero");
  const double count = (end - start) / step;
  WEFT_CHECK(count >= 0 && count < 0x1p62, "arange: range [{}, {}) with step {} does not hold 0 to 2^62 elements (it "
             "runs in the wrong direction, or is not finite)", start, end, step);
  const int64_t n = int64_t(std::ceil(count));
  return from_doubles({n}, opts, [&](int64_t i) { return start + double(i) * step; });
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  bool rg = std::exchange(opts.requires_grad, false);
  Tensor t = empty(shape, opts);
  t.uniform_(0, 1, gen);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  bool rg = std::exchange(opts.requires_grad, false);
  Tensor t = empty(shape, opts);
  t.normal_(0, 1, gen);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  WEFT_CHECK(int64_t(values.size()) == shape_numel(shape),
             "from_vector: {} values do not fill shape {} ({} elements)", values.size(),
             shape_str(shape), shape_numel(shape));
  return from_doubles(shape, opts, [&](int64_t i) { return values[size_t(i)]; });
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                 std::function<void(void*)> deleter) {
  for (int64_t d : shape) WEFT_CHECK(d >= 0, "from_blob: negative size in shape {}", shape_str(shape));
  size_t nbytes = shape_nbytes(shape, dtype_size(dtype));
  WEFT_CHECK(data != nullptr || nbytes == 0, "from_blob: null data for {} {}", dtype_name(dtype), shape_str(shape));
  auto storage = std::make_shared<StorageImpl>(data, nbytes, device, std::move(deleter));
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

std::vector<double> to_vector(const Tensor& t) {
  Tensor host = empty(t.shape(), {.dtype = DType::f64, .device = kCPU});
  copy_elements(host, t.detach());
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

double Tensor::item() const {
  check_defined("item");
  WEFT_CHECK(numel() == 1, "item: tensor {} has {} elements, expected exactly one", tensor_desc(*this), numel());
  return to_vector(*this)[0];
}

// ---------------------------------------------------------------- in-place fills

// Every public in-place write starts here once its arguments are checked: refused into a tensor
// autograd tracks, counted in its storage's version (a refused call leaves the version as it was).
static void start_inplace(const Tensor& t, const char* op) {
  WEFT_CHECK(!(GradMode::is_enabled() && t.requires_grad()), "{}: {} requires grad and cannot be written in place "
             "while grad mode is on: autograd does not record in-place writes (use NoGradGuard, or a new tensor)", op,
             tensor_desc(t));
  check_no_grad_view(t, op);
  ++t.storage()->version;
}

Tensor& Tensor::fill_(double value) {
  check_defined("fill_");
  WEFT_CHECK(scalar_fits(value, dtype()), "fill_: {} cannot hold {}", tensor_desc(*this), value);
  start_inplace(*this, "fill_");
  if (device().is_meta()) {
    record_fill(*this, {.kind = FillRule::Kind::constant, .a = value}, "fill_");
    return *this;
  }
  if (numel() == 0) return *this;
  if (!device().is_cpu()) {
    // One host element broadcast: the device backend uploads it once and fills on the device.
    copy_elements(*this, full({}, value, {.dtype = dtype()}).expand(shape()));
    return *this;
  }
  WEFT_DISPATCH(dtype(), "fill_", [&]<typename T>() {
    T v = convert_scalar<T>(value);
    T* p = static_cast<T*>(data_ptr());
    StridedIter<1> it(shape(), {strides()});
    for (int64_t r = 0; r < it.num_runs(); ++r) {
      T* q = p + it.run_offsets(r)[0];
      int64_t s = it.inner_strides()[0];
      for (int64_t i = 0; i < it.inner_size(); ++i) q[i * s] = v;
    }
  });
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

// A random fill reserves one counter per element of the generator (offset += numel) and
// writes element i (row-major) from counter offset + i; on the meta device it only records
// that rule, so the tensor's values are computed when it is materialised or sharded.
void Tensor::random_fill(FillRule rule, Generator* gen, const char* op) {
  Generator& g = gen ? *gen : default_generator();
  rule.seed = g.seed();
  rule.offset = g.reserve(uint64_t(numel()));
  if (device().is_meta()) record_fill(*this, rule, op);
  else fill_slice(*this, rule, shape());
}

Tensor& Tensor::uniform_(double low, double high, Generator* gen) {
  check_defined("uniform_");
  WEFT_CHECK(is_floating(dtype()), "uniform_: expects a floating tensor, got {}", tensor_desc(*this));
  WEFT_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, "uniform_: needs finite low <= high, got [{}, {}]",
             low, high);
  start_inplace(*this, "uniform_");
  random_fill({.kind = FillRule::Kind::uniform, .a = low, .b = high}, gen, "uniform_");
  return *this;
}

Tensor& Tensor::normal_(double mean, double std, Generator* gen) {
  check_defined("normal_");
  WEFT_CHECK(is_floating(dtype()), "normal_: expects a floating tensor, got {}", tensor_desc(*this));
  WEFT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal_: needs a finite mean and a finite std >= "
             "0, got mean {} std {}", mean, std);
  start_inplace(*this, "normal_");
  random_fill({.kind = FillRule::Kind::normal, .a = mean, .b = std}, gen, "normal_");
  return *this;
}

}  // namespace weft
