// kernels/cpu: the register-tiled attention loops, f32 (attention_avx512.cpp, built for AVX-512) and bf16
// (attention_avx512bf16.cpp, built for AVX512_BF16; attention_amx.cpp on AMX tiles), called by attention.cpp when the
// CPU has the instructions (the same run-time choice as the f32 and bf16 GEMM kernels, gemm.h). Plain pointers and
// strides: this header has no inline code, so nothing compiled for AVX-512 reaches code that runs on other CPUs.
#pragma once
#include <cstdint>

namespace weft::kernels::cpu {

// One [B, H, T, C] operand: element (b, h, t, c) at p[b*sb + h*sh + t*st + c].
struct HeadsF32 {
  float* p;
  int64_t sb, sh, st;
};

// The same for bf16 operands (their bits).
struct HeadsBF16 {
  uint16_t* p;
  int64_t sb, sh, st;
};

struct AttentionDims {
  int64_t B, H, Hkv, Tq, Tk, E, Ev;  // E and Ev multiples of 16; Hkv divides H
  bool causal;
  float scale;
  bool parallel;  // split the (batch, head) pairs over OpenMP threads
  // Rotary tables [positions, E/2] (kernels/rope.h) and the first query and key positions; null: no rotation.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t q_pos = 0, k_pos = 0;
};

// Bytes of workspace each thread needs (bf16: for the bf16 heads below); the caller passes one block of that many per
// thread the call may use (one unless d.parallel, else omp_get_max_threads()), uninitialised.
int64_t attention_workspace_avx512(const AttentionDims& d, bool backward, bool bf16);
// lse: [B, H, Tq] contiguous. The backward overwrites dq, dk and dv.
void attention_forward_avx512(const AttentionDims& d, HeadsF32 q, HeadsF32 k, HeadsF32 v, HeadsF32 out, float* lse,
                              char* workspace);
void attention_backward_avx512(const AttentionDims& d, HeadsF32 grad, HeadsF32 q, HeadsF32 k, HeadsF32 v,
                               HeadsF32 out, const float* lse, HeadsF32 dq, HeadsF32 dk, HeadsF32 dv, char* workspace);
// The same f32 tiles on bf16 operands, on CPUs with AVX-512 but no bf16 kernel: each task widens its own heads into
// f32 buffers as it reads them and rounds what it writes (attention.cpp: 16-bit operands computed in f32).
void attention_forward_avx512(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out,
                              float* lse, char* workspace);
void attention_backward_avx512(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                               HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv,
                               char* workspace);

// bf16 operands, products summed in f32 (attention_avx512bf16.cpp: which values round to
// bf16); lse is f32. The workspace as above.
int64_t attention_workspace_avx512bf16(const AttentionDims& d, bool backward);
void attention_forward_avx512bf16(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out,
                                  float* lse, char* workspace);
void attention_backward_avx512bf16(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                                   HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv,
                                   char* workspace);
// The same on AMX tiles (attention_amx.cpp), with the same workspace: called only where the
// bf16 GEMM runs on AMX (gemm.h's bgemm_kernel), whose choice has asked Linux for the tiles.
void attention_forward_amx(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out, float* lse,
                           char* workspace);
void attention_backward_amx(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                            HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv, char* workspace);

}  // namespace weft::kernels::cpu
