// kernels: the fused neural-network kernels (softmax, layer norm, embedding and indexing,
// cross-entropy, concatenation, dropout, convolution, pooling), forward and backward.
#pragma once
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/generator.h"
#include "../core/tensor.h"

namespace weft::kernels {

// ---- softmax family (along any dim)
Tensor softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);      // y = softmax(x)
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);  // y = log_softmax(x)

// ---- layer norm over the last `normalized_ndim` dims; weight/bias optional (undefined). Returns (y, mean, rstd);
// mean/rstd have shape x.shape[:-normalized_ndim] and are f32 (f64 for f64 inputs).
std::tuple<Tensor, Tensor, Tensor> layer_norm(const Tensor& x, int64_t normalized_ndim,
                                              const Tensor& weight, const Tensor& bias, double eps);
// Returns (dx, dweight, dbias); dweight/dbias undefined when weight/bias are.
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x,
                                                       const Tensor& mean, const Tensor& rstd,
                                                       const Tensor& weight, const Tensor& bias,
                                                       int64_t normalized_ndim);

// ---- RMS norm over the last `normalized_ndim` dims: y = x * rstd * weight with rstd = 1/sqrt(mean(x^2) + eps) (no
// centring, no bias); weight optional. Returns (y, rstd), rstd as layer_norm's; the backward returns (dx, dweight).
std::pair<Tensor, Tensor> rms_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& weight, double eps);
std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t normalized_ndim);

// ---- indexing (index tensors are i64 or i32; out-of-range indices are errors)
Tensor embedding(const Tensor& weight, const Tensor& indices);  // weight [V, D] -> indices.shape + [D]
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index 1-D
// out = zeros(shape); out.index_select(dim, index) += src (accumulates repeats)
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// out = self.clone(); out[..index[i]..] += src[i] along dim (torch.scatter_add)
Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);

// ---- cross-entropy on logits [N, C] (or [C]) and targets [N] (i64/i32) as in torch.nn.functional.cross_entropy;
// reduction "mean" (over non-ignored targets), "sum" or "none". Returns (loss, row_stats) where row_stats [N, 2] (each
// row's max and log(sum e^(x - max))) is what the backward needs besides the logits: it makes the log-probabilities
// again instead of keeping an [N, C] tensor. 16-bit logits are read as they are and computed in f32: loss and row_stats
// are f32 then; dlogits has the logits' dtype.
enum class Reduction { none, mean, sum };
std::pair<Tensor, Tensor> cross_entropy(const Tensor& logits, const Tensor& target,
                                        int64_t ignore_index, double label_smoothing,
                                        Reduction reduction);
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats,
                              const Tensor& target, int64_t ignore_index, double label_smoothing,
                              Reduction reduction);

// ---- concatenation (dtypes promoted, shapes equal except along dim)
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);

// ---- dropout: returns (y, mask) with mask a bool/u8 tensor of kept elements; y = x*mask/(1-p).
// A call takes one counter of the generator, its seed; element i's keep decision is a function of
// (seed, i) (kernels/dropout_mask.h). Given a block, x is block `index` of `parts` equal blocks
// along `dim` of a whole tensor (its other dims whole: a rank's part of a split activation), and
// each element is decided as the whole's element at its index, as DTensor's sharded random ops.
struct RandomBlock {
  int64_t dim = 0, parts = 1, index = 0;  // parts 1: x is the whole
};
std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, Generator* gen = nullptr, const RandomBlock& block = {});
Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double p);

// ---- 2-D convolution and max pooling, NCHW, weight [O, C/groups=C, kh, kw]
struct Conv2dParams { int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0; };
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p);
// Returns (dx, dweight, dbias); dbias undefined when bias is.
std::tuple<Tensor, Tensor, Tensor> conv2d_backward(const Tensor& grad, const Tensor& x,
                                                   const Tensor& weight, bool has_bias,
                                                   const Conv2dParams& p);
struct Pool2dParams { int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0; };
// Returns (y, indices) where indices (i64) are flat positions within each input plane.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Shape& input_shape);

}  // namespace weft::kernels
