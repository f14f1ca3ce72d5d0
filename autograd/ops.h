// autograd: the differentiable operations users write models with. Each runs a kernel and,
// when grad mode is on and an input requires grad, records a node whose backward computes
// the input gradients. All live in namespace weft: weft::matmul(a, b), weft::relu(x), a + b.
#pragma once
#include <optional>
#include <string_view>
#include <vector>

#include "engine.h"
#include "node.h"
#include "../core/generator.h"
#include "../core/tensor.h"
#include "../kernels/nn.h"  // RandomBlock
#include "../kernels/rope.h"

namespace weft {

// ---- element-wise (broadcasting, type promotion)
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate: "none" (erf form, the default as in torch) or "tanh".
Tensor gelu(const Tensor& x, std::string_view approximate = "none");
// x * sigmoid(x), as torch.nn.functional.silu.
Tensor silu(const Tensor& x);
// silu(gate) * up in one pass (SwiGLU's element-wise part, gate and up broadcast together);
// the backward reads gate and up, no silu(gate) is kept.
Tensor swiglu(const Tensor& gate, const Tensor& up);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// Comparisons and logic give bool tensors and are not differentiable; sign has a zero gradient (0 at NaN), as torch's.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor sign(const Tensor& x);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, double s);
Tensor operator<(const Tensor& a, double s);
Tensor operator>(const Tensor& a, double s);

// ---- reductions (dims empty = all dims)
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);  // values, indices
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);

// ---- linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x @ weight^T + bias, weight [out, in] (bias may be undefined)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// linear(x, weight, bias) + linear(linear(xa, a) * scale, b), a [r, in], b [out, r]: a Linear with
// a low-rank adapter (nn/lora.h), xa the adapter's input (x itself, or x after dropout), in one
// node that casts and keeps x once and sums its products in place (autograd/ops_low_rank.cpp).
Tensor low_rank_linear(const Tensor& x, const Tensor& xa, const Tensor& weight, const Tensor& bias, const Tensor& a,
                       const Tensor& b, double scale);

// ---- neural-network functions
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
// x / sqrt(mean(x^2 over normalized_shape) + eps) * weight, fused (torch.nn.functional.rms_norm).
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = {}, double eps = 1e-6);
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  std::string_view reduction = "mean";  // "mean", "sum" or "none"
};
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts = {});
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
// Identity when !training or p == 0. With a block: x is that part of a whole, drawing its masks (kernels/nn.h).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr,
               const kernels::RandomBlock& block = {});
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, int64_t stride = 1,
              int64_t padding = 0);
Tensor max_pool2d(const Tensor& x, int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);  // -1: kernel_size

// ---- attention (autograd/ops_attention.cpp) softmax(q k^T / sqrt(E) (+ causal mask)) v for q [B, H, Tq, E], k [B, H,
// Tk, E], v [B, H, Tk, Ev] -> [B, H, Tq, Ev], as torch's F.scaled_dot_product_attention with is_causal (which here
// needs Tq == Tk). One fused node that never holds the [B, H, Tq, Tk] probabilities; dropout on them (p > 0 while
// training) falls back to the composite ops. The output is stored [B, Tq, H, Ev], so out.transpose(1, 2) is contiguous.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, bool training = true, Generator* gen = nullptr);
// The same with grouped-query heads and rotary embeddings: k and v may have Hkv heads dividing q's H (query head h
// reads key/value head h / (H / Hkv), as torch's enable_gqa), and rope.theta > 0 rotates q and k (kernels/rope.h)
// inside the fused kernel, so the caller passes the projections' head views as they are. Not causal unless asked, as
// the other overload and torch's is_causal.
struct AttentionOptions {
  bool causal = false;
  double dropout_p = 0.0;
  bool training = true;
  Generator* gen = nullptr;
  kernels::Rope rope;
  kernels::RandomBlock dropout_block;  // the probabilities [B, H, Tq, Tk] as a part of a whole's (dropout)
};
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts);
// Rotary position embedding of x [..., T, E] (kernels/rope.h) with rows at positions pos0,
// pos0 + 1, ...: the differentiable op for code outside the fused attention.
Tensor rotary_embedding(const Tensor& x, double theta, int64_t pos0 = 0, const kernels::RopeScaling& scaling = {});
// The same on a fused projection qkv [B, T, 3d] (q | k | v along the last dim, each split
// into n_head heads, as nanoGPT's c_attn) -> [B, T, d] with the heads concatenated. Reads the
// heads in place and writes the gradient of qkv as one tensor.
Tensor scaled_dot_product_attention_qkv(const Tensor& qkv, int64_t n_head, bool causal = true,
                                        double dropout_p = 0.0, bool training = true, Generator* gen = nullptr,
                                        const kernels::RandomBlock& dropout_block = {});

}  // namespace weft
