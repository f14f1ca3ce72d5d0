// core: Tensor geometry, views and autograd accessors.
#include "core/tensor.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/autograd_meta.h"
#include "core/error.h"
#include "core/grad_mode.h"

namespace weft {

TensorImpl::TensorImpl(Storage storage_, Shape shape_, Shape strides_, int64_t offset_, DType dtype_)
    : storage(std::move(storage_)), shape(std::move(shape_)), strides(std::move(strides_)),
      offset(offset_), dtype(dtype_) {}
TensorImpl::~TensorImpl() = default;

namespace detail {
AutogradHooks& autograd_hooks() {
  static AutogradHooks hooks;
  return hooks;
}
[[noreturn]] void throw_dtype_mismatch(const Tensor& t, DType wanted) {
  WEFT_ERROR("data<T>: tensor {} accessed as {}", tensor_desc(t), dtype_name(wanted));
}
}  // namespace detail

std::string tensor_desc(const Tensor& t) {
  if (!t.defined()) return "(undefined tensor)";
  return fmt::format("{}{} on {}", dtype_name(t.dtype()), shape_str(t.shape()), t.device().str());
}

void Tensor::check_defined(const char* op) const {
  WEFT_CHECK(impl_ != nullptr, "{}: called on an undefined tensor", op);
}

const Shape& Tensor::shape() const { check_defined("shape"); return impl_->shape; }
const Shape& Tensor::strides() const { check_defined("strides"); return impl_->strides; }
int64_t Tensor::size(int64_t dim) const { return shape()[wrap_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides()[wrap_dim(dim, this->dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::offset() const { check_defined("offset"); return impl_->offset; }
DType Tensor::dtype() const { check_defined("dtype"); return impl_->dtype; }
Device Tensor::device() const { check_defined("device"); return impl_->storage->device(); }
const Storage& Tensor::storage() const { check_defined("storage"); return impl_->storage; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no elements: any strides describe the same (empty) layout
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (impl_->shape[d] == 1) continue;
    if (impl_->strides[d] != expected) return false;
    expected *= impl_->shape[d];
  }
  return true;
}

void* Tensor::data_ptr() const {
  check_defined("data_ptr");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(element_size());
}

// ---------------------------------------------------------------- views

void check_no_grad_view(const Tensor& t, const char* op) {
  WEFT_CHECK(!(GradMode::is_enabled() && t.impl_ptr()->no_grad_view), "{}: {} is a view made with grad mode off (under "
             "NoGradGuard) of a tensor that requires grad; written with grad mode on, its gradients would flow as if "
             "the write had not happened: write it under NoGradGuard too, or into a copy", op, tensor_desc(t));
}

namespace {

// Records `out` as a view of `base` for autograd when base needs gradients.
// `replay` re-applies the same view to another tensor of base's shape (autograd writes the
// gradient through it); it is only built when base takes part in autograd.
template <class Replay>
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset, Replay&& replay) {
  auto impl = std::make_shared<TensorImpl>(base.storage(), std::move(shape), std::move(strides), offset, base.dtype());
  Tensor out(std::move(impl));
  out.impl_ptr()->no_grad_view = base.impl_ptr()->no_grad_view || (base.requires_grad() && !GradMode::is_enabled());
  if (base.requires_grad()) {
    if (auto fn = detail::autograd_hooks().record_view) fn(base, out, detail::ViewReplay(replay));
  }
  return out;
}

Shape infer_shape(Shape shape, int64_t numel, const char* op, const Shape& from) {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      WEFT_CHECK(infer < 0, "{}: only one dim can be -1 in {}", op, shape_str(shape));
      infer = int64_t(i);
    } else {
      WEFT_CHECK(shape[i] >= 0, "{}: invalid size {} in {}", op, shape[i], shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    WEFT_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for input {} of {} elements",
               op, shape_str(shape), shape_str(from), numel);
    shape[infer] = numel / known;
  }
  WEFT_CHECK(shape_numel(shape) == numel, "{}: shape {} is invalid for input {} of {} elements", op,
             shape_str(shape), shape_str(from), numel);
  return shape;
}

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), if any.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides,
                                  const Shape& new_shape) {
  Shape new_strides(new_shape.size());
  if (old_shape.empty() || shape_numel(old_shape) == 0) return contiguous_strides(new_shape);
  int64_t view_d = int64_t(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = int64_t(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::view(Shape new_shape) const {
  new_shape = infer_shape(std::move(new_shape), numel(), "view", shape());
  auto st = view_strides(shape(), strides(), new_shape);
  WEFT_CHECK(st.has_value(),
             "view: shape {} is not compatible with input {} of strides {} (use reshape, which copies)",
             shape_str(new_shape), shape_str(shape()), shape_str(strides()));
  Shape replay_shape = new_shape;
  return make_view(*this, std::move(new_shape), std::move(*st), offset(),
                   [replay_shape](const Tensor& t) { return t.view(replay_shape); });
}

Tensor Tensor::reshape(Shape new_shape) const {
  new_shape = infer_shape(std::move(new_shape), numel(), "reshape", shape());
  if (view_strides(shape(), strides(), new_shape)) return view(std::move(new_shape));
  return contiguous().view(std::move(new_shape));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  WEFT_CHECK(start_dim <= end_dim, "flatten: start_dim {} > end_dim {}", start_dim, end_dim);
  Shape s(shape().begin(), shape().begin() + start_dim);
  int64_t n = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) n *= shape()[d];
  s.push_back(n);
  s.insert(s.end(), shape().begin() + end_dim + 1, shape().end());
  return reshape(std::move(s));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  int64_t n = shape()[d];
  if (start < 0) start += n;
  WEFT_CHECK(start >= 0 && start <= n && length >= 0 && length <= n - start,  // (start + length could overflow)
             "narrow: {} elements from {} are out of bounds for dim {} of size {} (tensor {})", length, start, d, n,
             tensor_desc(*this));
  Shape s = shape();
  s[d] = length;
  return make_view(*this, std::move(s), strides(), offset() + start * strides()[d],
                   [=](const Tensor& t) { return t.narrow(d, start, length); });
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  WEFT_CHECK(step > 0, "slice: step must be positive, got {}", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  s[d] = end == start ? 0 : 1 + (end - start - 1) / step;  // (end - start + step - 1 could overflow)
  if (s[d] > 1) st[d] *= step;  // within the storage then; one element takes no step
  return make_view(*this, std::move(s), std::move(st), offset() + start * strides()[d],
                   [=](const Tensor& t) { return t.slice(d, start, end, step); });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  WEFT_CHECK(dim() > 0, "select: cannot select from a 0-dim tensor");
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  WEFT_CHECK(index >= -n && index < n, "select: index {} out of range for dim {} of size {} (tensor {})",
             index, d, n, tensor_desc(*this));
  if (index < 0) index += n;
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, std::move(s), std::move(st), offset() + index * strides()[d],
                   [=](const Tensor& t) { return t.select(d, index); });
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) return make_view(*this, {}, {}, offset(), [](const Tensor& t) { return t.detach(); });
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape s = shape(), st = strides();
  std::swap(s[d0], s[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(*this, std::move(s), std::move(st), offset(), [=](const Tensor& t) { return t.transpose(d0, d1); });
}

Tensor Tensor::t() const {
  WEFT_CHECK(dim() <= 2, "t: expects a tensor of at most 2 dims, got {}", tensor_desc(*this));
  return dim() < 2 ? transpose(0, 0) : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  WEFT_CHECK(int64_t(dims.size()) == dim(), "permute: got {} dims {} for tensor {}", dims.size(),
             shape_str(dims), tensor_desc(*this));
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    WEFT_CHECK(!seen[d], "permute: dim {} repeated in {}", d, shape_str(dims));
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, std::move(s), std::move(st), offset(), [dims](const Tensor& t) { return t.permute(dims); });
}

Tensor Tensor::expand(Shape target) const {
  WEFT_CHECK(target.size() >= shape().size(), "expand: target {} has fewer dims than tensor {}",
             shape_str(target), tensor_desc(*this));
  size_t lead = target.size() - shape().size();
  Shape st(target.size(), 0);
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      WEFT_CHECK(target[i] >= 0, "expand: size -1 not allowed in new leading dim {} of {}", i, shape_str(target));
      continue;
    }
    int64_t cur = shape()[i - lead];
    if (target[i] == -1) target[i] = cur;
    WEFT_CHECK((cur == target[i] || cur == 1) && target[i] >= 0, "expand: cannot expand {} to {} (dim {}: {} vs {})",
               shape_str(shape()), shape_str(target), i, cur, target[i]);
    st[i] = cur == target[i] ? strides()[i - lead] : 0;
  }
  Shape replay_shape = target;
  return make_view(*this, std::move(target), std::move(st), offset(),
                   [replay_shape](const Tensor& t) { return t.expand(replay_shape); });
}

Tensor Tensor::squeeze() const {
  Shape s, st;
  for (int64_t d = 0; d < dim(); ++d)
    if (shape()[d] != 1) { s.push_back(shape()[d]); st.push_back(strides()[d]); }
  return make_view(*this, std::move(s), std::move(st), offset(), [](const Tensor& t) { return t.squeeze(); });
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return make_view(*this, {}, {}, offset(), [](const Tensor& t) { return t.detach(); });
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return make_view(*this, shape(), strides(), offset(), [](const Tensor& t) { return t.detach(); });
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, std::move(s), std::move(st), offset(), [d](const Tensor& t) { return t.squeeze(d); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape(), st = strides();
  int64_t stride = d < dim() ? strides()[d] * shape()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view(*this, std::move(s), std::move(st), offset(), [d](const Tensor& t) { return t.unsqueeze(d); });
}

std::vector<Tensor> Tensor::split_with_sizes(const Shape& sizes, int64_t d) const {
  d = wrap_dim(d, dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    WEFT_CHECK(s >= 0, "split_with_sizes: negative size {} in {}", s, shape_str(sizes));
    total += s;
  }
  WEFT_CHECK(total == shape()[d], "split_with_sizes: sizes {} sum to {} but dim {} has size {}",
             shape_str(sizes), total, d, shape()[d]);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  d = wrap_dim(d, dim(), "split");
  WEFT_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  int64_t n = shape()[d];
  Shape sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(sizes, d);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  WEFT_CHECK(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  d = wrap_dim(d, dim(), "chunk");
  int64_t n = shape()[d];
  int64_t each = (n + chunks - 1) / chunks;  // torch.chunk: ceil(n / chunks)
  return split(std::max<int64_t>(each, 1), d);
}

Tensor Tensor::as_strided(Shape s, Shape st, int64_t off) const {
  WEFT_CHECK(s.size() == st.size(), "as_strided: shape {} and strides {} differ in length",
             shape_str(s), shape_str(st));
  int64_t max_index = off, step = 0;  // the last element's index; overflow: past any storage
  bool overflow = false;
  for (size_t i = 0; i < s.size(); ++i) {
    WEFT_CHECK(s[i] >= 0 && st[i] >= 0, "as_strided: negative size or stride in {} / {}", shape_str(s), shape_str(st));
    if (s[i] == 0) max_index = -1;
    if (max_index >= 0)
      overflow |= __builtin_mul_overflow(s[i] - 1, st[i], &step) || __builtin_add_overflow(max_index, step, &max_index);
  }
  WEFT_CHECK(off >= 0 && !overflow && max_index < int64_t(storage()->nbytes() / element_size()),
             "as_strided: view (shape {}, strides {}, offset {}) reaches past storage of {} bytes",
             shape_str(s), shape_str(st), off, storage()->nbytes());
  return make_view(*this, std::move(s), std::move(st), off, nullptr);
}

Tensor Tensor::detach() const {
  check_defined("detach");
  return Tensor(std::make_shared<TensorImpl>(impl_->storage, impl_->shape, impl_->strides,
                                             impl_->offset, impl_->dtype));
}

// ---------------------------------------------------------------- autograd accessors

AutogradMeta& Tensor::autograd_meta() const {
  check_defined("autograd_meta");
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

bool Tensor::requires_grad() const {
  return impl_ && impl_->autograd && (impl_->autograd->requires_grad || impl_->autograd->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  check_defined("set_requires_grad");
  WEFT_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad; use detach()");
  WEFT_CHECK(!requires_grad || is_floating(dtype()),
             "set_requires_grad: only floating tensors can require gradients, got {}", tensor_desc(*this));
  autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn; }

Tensor Tensor::grad() const {
  return impl_ && impl_->autograd ? impl_->autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    WEFT_CHECK(g.shape() == shape() && g.device() == device() && g.dtype() == dtype(),
               "set_grad: gradient {} does not match tensor {}", tensor_desc(g), tensor_desc(*this));
  }
  autograd_meta().grad = g;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  return impl_ && impl_->autograd ? impl_->autograd->grad_fn : none;
}

uint32_t Tensor::output_nr() const { return impl_ && impl_->autograd ? impl_->autograd->output_nr : 0; }

static const detail::AutogradHooks& require_hooks(const char* op) {
  const auto& h = detail::autograd_hooks();
  WEFT_CHECK(h.backward != nullptr, "{}: the autograd engine is not linked into this program", op);
  return h;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  check_defined("backward");
  require_hooks("backward").backward(*this, gradient, retain_graph);
}

void Tensor::register_hook(GradHook hook) const {
  check_defined("register_hook");
  WEFT_CHECK(requires_grad(), "register_hook: tensor {} does not require grad", tensor_desc(*this));
  require_hooks("register_hook").register_hook(*this, std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  check_defined("register_post_accumulate_grad_hook");
  WEFT_CHECK(is_leaf() && requires_grad(),
             "register_post_accumulate_grad_hook: only leaf tensors that require grad, got {}", tensor_desc(*this));
  autograd_meta().post_accumulate_grad_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  check_defined("retain_grad");
  WEFT_CHECK(requires_grad(), "retain_grad: tensor {} does not require grad", tensor_desc(*this));
  if (is_leaf()) return;
  require_hooks("retain_grad").retain_grad(*this);
}

}  // namespace weft
