// core: Tensor, a shared handle to a strided view (shape, strides, offset, dtype, device)
// of a Storage. Copying a Tensor copies the handle; views share storage with their base.
// Math lives in autograd/ops.h as free functions (weft::add, weft::matmul, a + b, ...);
// the view and copy methods here take part in autograd through hooks autograd installs.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "device.h"
#include "dtype.h"
#include "error.h"
#include "half.h"
#include "shape.h"
#include "storage.h"

namespace weft {

namespace autograd { class Node; }
class Tensor;
class Generator;
struct AutogradMeta;
struct FillRule;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = default_device();  // the CPU unless a DefaultDeviceGuard says otherwise
  bool requires_grad = false;
};

class TensorImpl {
 public:
  TensorImpl(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype);
  ~TensorImpl();

  Storage storage;
  Shape shape;
  Shape strides;      // in elements
  int64_t offset = 0;  // in elements
  DType dtype;
  std::unique_ptr<AutogradMeta> autograd;  // null until autograd touches the tensor
  // A view made with grad mode off of a tensor that requires grad (or a view of such a view): written in place with
  // grad mode on, gradients would flow as if the write had not happened, so in-place writes refuse it then.
  bool no_grad_view = false;
};

// Hook called on a tensor's gradient; may return a replacement (or an undefined Tensor to keep the gradient as is).
using GradHook = std::function<Tensor(const Tensor&)>;
using PostAccumulateGradHook = std::function<void(Tensor&)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- geometry
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;
  const Storage& storage() const;

  // Pointer to the first element (storage data + offset); throws if the storage was freed.
  void* data_ptr() const;
  template <typename T> T* data() const;  // checks that T matches dtype()

  // ---- views (share storage; differentiable)
  Tensor view(Shape shape) const;     // requires compatible strides; one dim may be -1
  Tensor reshape(Shape shape) const;  // a view when possible, else a contiguous copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const Shape& dims) const;
  Tensor expand(Shape shape) const;  // -1 keeps a dim; new leading dims allowed
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;  // torch.chunk sizes
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split_with_sizes(const Shape& sizes, int64_t dim = 0) const;
  Tensor as_strided(Shape shape, Shape strides, int64_t offset) const;
  Tensor operator[](int64_t index) const { return select(0, index); }

  // ---- copies
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  Tensor& copy_(const Tensor& src);  // broadcasts src; converts dtype; not differentiable
  Tensor detach() const;             // shares storage, no autograd history

  // ---- in-place fills (not differentiable)
  Tensor& fill_(double value);
  Tensor& zero_();
  Tensor& uniform_(double low = 0, double high = 1, Generator* gen = nullptr);
  Tensor& normal_(double mean = 0, double std = 1, Generator* gen = nullptr);

  // ---- scalars
  double item() const;  // single-element tensor as double
  template <typename T> T item() const { return T(item()); }

  // ---- autograd
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad = true);
  bool is_leaf() const;
  Tensor grad() const;          // undefined if none yet
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  void register_hook(GradHook hook) const;
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  void retain_grad() const;
  AutogradMeta& autograd_meta() const;  // created on first use

  std::string str() const;  // shape/dtype header plus values (summarised when large)

 private:
  void check_defined(const char* op) const;
  void random_fill(FillRule rule, Generator* gen, const char* op);
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string tensor_desc(const Tensor& t);  // "f32[2, 3] on cpu", for error messages

// ---- factories
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor arange(double start, double end, double step = 1, TensorOptions opts = {});
inline Tensor arange(double end, TensorOptions opts = {}) { return arange(0, end, 1, opts); }
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor scalar_tensor(double value, TensorOptions opts = {});
// Refuses (naming `op`) an in-place write with grad mode on into a view made with it off of a tensor that requires
// grad (TensorImpl::no_grad_view), as PyTorch does.
void check_no_grad_view(const Tensor& t, const char* op);

Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// A tensor holding a copy of `values` (converted to opts.dtype) with the given shape.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
// A tensor over memory owned elsewhere (no copy); `deleter` runs when the storage dies.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                 std::function<void(void*)> deleter = {});
// All elements as doubles, in row-major order (for tests and printing).
std::vector<double> to_vector(const Tensor& t);

// ---- template definitions
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<Half>() { return DType::f16; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<bool>() { return DType::bool_; }

namespace detail {
[[noreturn]] void throw_dtype_mismatch(const Tensor& t, DType wanted);
}
template <typename T> T* Tensor::data() const {
  if (dtype() != dtype_of<T>()) detail::throw_dtype_mismatch(*this, dtype_of<T>());
  return static_cast<T*>(data_ptr());
}

}  // namespace weft
