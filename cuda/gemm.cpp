// cuda/: cuBLASLt GEMMs (cuda/gemm.h). Per device, one cuBLASLt handle made
// on first use; per (device, stream), one workspace, so that products queued on different
// streams never share scratch memory; per device, a cache of the algorithm cuBLASLt's
// heuristic picked for each distinct problem, so the heuristic runs once per shape.
#include "cuda/gemm.h"

#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <optional>

#include "core/copy.h"
#include "cuda/check.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"

namespace weft::kernels::cuda {
namespace {

using cpu::MatLayout;

// cuBLASLt's recommended workspace on Hopper. Held outside weft's caching allocator (it is
// not a tensor): memory_stats(cuda:i) does not count it; docs/CUDA.md says so.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// Every parameter the heuristic's choice can depend on.
using AlgoKey = std::array<int64_t, 18>;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
};

std::mutex g_mu;
// Never destroyed: destroying handles and freeing memory from a static destructor can run
// after the CUDA runtime has shut down.
std::map<int, DeviceState>& states() {
  static auto* s = new std::map<int, DeviceState>();
  return *s;
}

// The device's state with its handle and the stream's workspace made (mu held).
DeviceState& state_for(int device, cudaStream_t stream, void** workspace) {
  DeviceState& st = states()[device];
  if (!st.handle) WEFT_CUBLAS_CHECK(cublasLtCreate(&st.handle));
  auto it = st.workspaces.find(stream);
  if (it == st.workspaces.end()) {
    void* p = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&p, kWorkspaceBytes));
    it = st.workspaces.emplace(stream, p).first;
  }
  *workspace = it->second;
  return st;
}

// RAII owners of cuBLASLt descriptors, so an exception between create and destroy leaks nothing.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

void make_layout(Layout& out, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t batch_stride) {
  WEFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&out.l, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    WEFT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(out.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    WEFT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(out.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &batch_stride, sizeof(batch_stride)));
  }
}

// Largest power of two (up to 256) dividing the address: the heuristic otherwise assumes
// 256-byte aligned operands and may pick kernels that fault on narrower views.
uint32_t alignment(const void* p) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a /= 2;
  return a;
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: WEFT_ERROR("cuda gemm: expects f32, f64, bf16 or f16, got {}", dtype_name(t));
  }
}

// ---------------------------------------------------------------- tensor-level helpers

Tensor with_layout(const Tensor& t) { return cpu::mat_layout(t).ok ? t : t.contiguous(); }

// The distance between consecutive matrices of t ([..., r, c], batch dims right-aligned to
// `batch`) when one stride describes the whole flattened batch (0 when t is broadcast).
std::optional<int64_t> batch_stride(const Tensor& t, const Shape& batch) {
  int64_t nd = int64_t(batch.size()), lead = nd - (t.dim() - 2), running = 1;
  std::optional<int64_t> stride;
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (batch[size_t(d)] == 1) continue;
    int64_t s = d >= lead && t.size(d - lead) != 1 ? t.stride(d - lead) : 0;
    if (!stride) stride = s;  // the innermost non-trivial dim: running is 1 here
    else if (s != *stride * running) return std::nullopt;
    running *= batch[size_t(d)];
  }
  return stride.value_or(0);
}


}  // namespace

void gemm_raw(DType dtype, int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, void* c,
              int64_t ldc, int64_t c_batch_stride, int64_t batch, double alpha, double beta, int device) {
  if (m == 0 || n == 0 || batch == 0) return;
  WEFT_CHECK(k >= 1, "cuda gemm: inner dim must be >= 1, got {}", k);
  WEFT_CHECK(a.layout.ok && b.layout.ok, "cuda gemm: operand layouts must be row- or column-major");
  WEFT_CHECK(batch <= INT32_MAX, "cuda gemm: batch of {} matrices exceeds cuBLASLt's limit", batch);
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  const cudaDataType_t type = data_type(dtype);
  const bool f64 = dtype == DType::f64;
  const bool tf32 = dtype == DType::f32 && allow_tf32();
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_type = f64 ? CUDA_R_64F : CUDA_R_32F;

  // Column-major problem: D^T[n, m] = op(B)^T [n, k] * op(A)^T [k, m] (see gemm.h).
  // First cuBLASLt operand: our b. Row-major b[k, n] read column-major is b^T[n, k] as stored.
  const bool b_row = b.layout.row_major, a_row = a.layout.row_major;
  cublasOperation_t op_first = b_row ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t op_second = a_row ? CUBLAS_OP_N : CUBLAS_OP_T;
  int64_t first_rows = b_row ? n : k, first_cols = b_row ? k : n;
  int64_t second_rows = a_row ? k : m, second_cols = a_row ? m : k;

  MatmulDesc desc;
  WEFT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, compute, scale_type));
  WEFT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  WEFT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  Layout la, lb, lc;
  make_layout(la, type, first_rows, first_cols, b.layout.ld, batch, b.batch_stride);
  make_layout(lb, type, second_rows, second_cols, a.layout.ld, batch, a.batch_stride);
  make_layout(lc, type, n, m, ldc, batch, c_batch_stride);

  const uint32_t align_first = alignment(b.data), align_second = alignment(a.data), align_c = alignment(c);
  AlgoKey key{int64_t(dtype), int64_t(compute), int64_t(op_first), int64_t(op_second), m, n, k,
              b.layout.ld, a.layout.ld, ldc, batch, b.batch_stride, a.batch_stride, c_batch_stride,
              int64_t(align_first), int64_t(align_second), int64_t(align_c), beta != 0};

  std::lock_guard<std::mutex> lock(g_mu);
  void* workspace = nullptr;
  DeviceState& st = state_for(device, stream, &workspace);
  auto found = st.algos.find(key);
  if (found == st.algos.end()) {
    Preference pref;
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    uint64_t ws = kWorkspaceBytes;
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws)));
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                           &align_first, sizeof(align_first)));
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                           &align_second, sizeof(align_second)));
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &align_c, sizeof(align_c)));
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                           &align_c, sizeof(align_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    WEFT_CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(st.handle, desc.d, la.l, lb.l, lc.l, lc.l, pref.p, 1, &result, &count));
    WEFT_CHECK(count > 0,
               "cuda gemm: cuBLASLt has no algorithm for {} [{}, {}] x [{}, {}] (batch {}, leading dims {}, {}, {})",
               dtype_name(dtype), m, k, k, n, batch, a.layout.ld, b.layout.ld, ldc);
    found = st.algos.emplace(key, result.algo).first;
  }
  float alpha32 = float(alpha), beta32 = float(beta);
  const void* alpha_p = f64 ? static_cast<const void*>(&alpha) : &alpha32;
  const void* beta_p = f64 ? static_cast<const void*>(&beta) : &beta32;
  // cuBLASLt reads C even when beta is 0 only if C aliases D with beta != 0; passing D as C is
  // the documented in-place form.
  WEFT_CUBLAS_CHECK(cublasLtMatmul(st.handle, desc.d, alpha_p, b.data, la.l, a.data, lb.l, beta_p, c, lc.l, c,
                                   lc.l, &found->second, workspace, kWorkspaceBytes, stream));
}

void clear_gemm_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [device, st] : states()) st.algos.clear();
}

namespace {

// The backend functions of kernels::matmul / dot / gemm (contracts in kernels/backend.h).
void matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int dev = out.device().index;
  if (k == 0) {
    Tensor(out).zero_();
    return;
  }
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  const int64_t nb = shape_numel(batch);
  Tensor A = with_layout(a), B = with_layout(b);
  std::optional<int64_t> sa = batch_stride(A, batch), sb = batch_stride(B, batch);
  // b shared by every batch entry and a's rows folding into one matrix (a Linear layer on
  // [..., k] inputs): one GEMM over all rows.
  if (nb > 1 && sb && *sb == 0 && a.numel() == nb * m * k) {
    if (auto rows = cpu::fold_rows(a)) {
      gemm_raw(out.dtype(), nb * m, n, k, {a.data_ptr(), *rows, 0}, {B.data_ptr(), cpu::mat_layout(B), 0},
               out.data_ptr(), n, 0, 1, 1.0, 0.0, dev);
      return;
    }
  }
  // Batch dims that no single stride describes (e.g. [B, 1] against [1, H]): materialise.
  auto full = [&](const Tensor& t, int64_t r, int64_t c) {
    Shape s = batch;
    s.push_back(r);
    s.push_back(c);
    return t.expand(s).contiguous();
  };
  if (!sa) {
    A = full(A, m, k);
    sa = m * k;
  }
  if (!sb) {
    B = full(B, k, n);
    sb = k * n;
  }
  gemm_raw(out.dtype(), m, n, k, {A.data_ptr(), cpu::mat_layout(A), *sa}, {B.data_ptr(), cpu::mat_layout(B), *sb},
           out.data_ptr(), n, m * n, nb, 1.0, 0.0, dev);
}

void dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t len = a.size(0);
  if (len == 0) {
    Tensor(out).zero_();
    return;
  }
  // a as a [1, len] matrix times b as a [len, 1] matrix.
  Tensor A = a, B = b;
  cpu::MatLayout la = cpu::mat_layout(1, len, len * a.stride(0), a.stride(0));
  cpu::MatLayout lb = cpu::mat_layout(len, 1, b.stride(0), 1);
  if (!la.ok) {
    A = a.contiguous();
    la = cpu::mat_layout(1, len, len, 1);
  }
  if (!lb.ok) {
    B = b.contiguous();
    lb = cpu::mat_layout(len, 1, 1, 1);
  }
  gemm_raw(out.dtype(), 1, 1, len, {A.data_ptr(), la, 0}, {B.data_ptr(), lb, 0}, out.data_ptr(), 1, 0, 1, 1.0,
           0.0, out.device().index);
}

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, const Tensor& bias) {
  if (out.numel() == 0) return;
  if (bias.defined()) {  // out starts as the bias rows and the product adds onto them
    copy_elements(out, bias.expand(out.shape()));
    return gemm(a, b, out, alpha, 1.0, Tensor());
  }
  if (a.size(1) == 0) {
    if (beta == 0) Tensor(out).zero_();
    else if (beta != 1) mul_scalar_(out, beta);
    return;
  }
  // 16-bit operands into an f32 out (kernels/linalg.h): the same products from f32 copies.
  if (out.dtype() != a.dtype()) return gemm(a.to(kFloat32), b.to(kFloat32), out, alpha, beta, Tensor());
  Tensor A = with_layout(a), B = with_layout(b);
  gemm_raw(out.dtype(), A.size(0), B.size(1), A.size(1), {A.data_ptr(), cpu::mat_layout(A), 0},
           {B.data_ptr(), cpu::mat_layout(B), 0}, out.data_ptr(), out.size(1), 0, 1, alpha, beta,
           out.device().index);
}

}  // namespace

void fill_gemm_ops(KernelBackend& t) {
  t.matmul = &matmul;
  t.dot = &dot;
  t.gemm = [](const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, const Tensor& bias,
              const Tensor&) {
    gemm(a, b, out, alpha, beta, bias);
    return false;  // a's row sums: kernels::gemm reduces a
  };
}

}  // namespace weft::kernels::cuda
