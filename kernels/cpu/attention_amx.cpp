// kernels/cpu: bf16 attention on AMX tiles, for CPUs with AMX-BF16 and head dims that are multiples of 16: the loops of
// attention_bf16_loops.h (which values round to bf16, the pair layouts) with each product on tdpbf16ps. A product block
// is 32 rows x 32 columns of c in four 16 x 16 tiles of f32 sums, 16 pairs of depth per step. The operands are already
// in the tiles' layouts: a row-major A (pairs along the depth) is read in place when a block is 32 whole rows of whole
// steps, else copied with zeros to that shape (a transposed A, P^T or dS^T, by 16 x 16 transposes of pairs); B's pair
// rows are read in place, a last partial step copied with zero rows. A whole block of c with alpha 1 is summed in the
// tiles (from c's own values when the product adds onto c) and stored back; the rest go through a 32 x 32 f32 block.
// Compiled with -mamx-tile -mamx-bf16 in weft-kernels-amx and called only where the bf16 GEMM runs on AMX
// (attention.cpp), which has asked Linux for the tile state.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention_bf16_loops.h"
#include "kernels/cpu/bgemm_pack.h"
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kR = 32;  // rows and columns of a c block
constexpr int64_t kQ = 16;  // pairs (32 bf16) of depth per tile step

// Rows [0, rows) (<= kR) and pairs [0, k2) of a, the pair (r, q) at word r ars + q acs, into
// out: kR rows of kq words (k2 rounded up to kQ), zeros past rows and k2.
void pack_a(int64_t rows, int64_t k2, int64_t kq, const uint32_t* a, int64_t ars, int64_t acs, uint32_t* out) {
  if (ars == 1 && acs != 1) {  // transposed: 16 rows' pairs are 16 adjacent words of each q
    for (int64_t r0 = 0; r0 < kR; r0 += 16) {
      const int64_t lanes = rows - r0 >= 16 ? 16 : rows > r0 ? rows - r0 : 0;
      const __mmask16 m = __mmask16((1u << lanes) - 1);
      for (int64_t q0 = 0; q0 < kq; q0 += 16) {
        __m512i v[16];
        for (int64_t q = 0; q < 16; ++q)
          v[q] = _mm512_maskz_loadu_epi32(q0 + q < k2 ? m : 0, a + r0 + (q0 + q) * acs);
        transpose16x16(v);
        for (int64_t l = 0; l < 16; ++l) _mm512_store_si512(out + (r0 + l) * kq + q0, v[l]);
      }
    }
    return;
  }
  for (int64_t r = 0; r < kR; ++r) {
    uint32_t* o = out + r * kq;
    int64_t q = 0;
    if (r < rows && acs == 1) {
      std::memcpy(o, a + r * ars, size_t(k2) * 4);
      q = k2;
    } else if (r < rows) {
      for (; q < k2; ++q) o[q] = a[r * ars + q * acs];
    }
    std::memset(o + q, 0, size_t(kq - q) * 4);
  }
}

struct AmxTiles {
  static constexpr int64_t kTileRows = kR;

  // The product interface of attention_bf16_loops.h, on words (bf16 pairs).
  static void gemm(int64_t m, int64_t n, int64_t k2, const uint16_t* a16, int64_t ars, int64_t acs,
                   const uint16_t* b16, int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
    static thread_local Scratch<uint32_t> a_buf;
    alignas(64) uint32_t b_tail[kQ * kR];
    alignas(64) float block[kR * kR];
    const auto* a = reinterpret_cast<const uint32_t*>(a16);
    const auto* b = reinterpret_cast<const uint32_t*>(b16);
    const int64_t kq = (k2 + kQ - 1) / kQ * kQ;
    uint32_t* packed = a_buf.get(kR * (kq > 0 ? kq : 1));
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t i0 = 0; i0 < m; i0 += kR) {
      const int64_t rows = std::min<int64_t>(kR, m - i0);
      const bool in_place = acs == 1 && rows == kR && k2 % kQ == 0;
      if (!in_place) pack_a(rows, k2, kq, a + i0 * ars, ars, acs, packed);
      const uint32_t* ai = in_place ? a + i0 * ars : packed;
      const int64_t a_bytes = (in_place ? ars : kq) * 4;
      for (int64_t j0 = 0; j0 < n; j0 += kR) {
        const int64_t cols = std::min<int64_t>(kR, n - j0);  // 16 or 32: n is a multiple of 16
        // A whole block with alpha 1 sums in the tiles from c itself (or zero) and is stored
        // straight back; the others go through `block` for alpha and the edges.
        float* cb = c + i0 * ldc + j0;
        const bool direct = alpha == 1.f && rows == kR && cols == kR;
        memory_barrier();
        if (direct && accumulate) {
          _tile_loadd(0, cb, ldc * 4);
          _tile_loadd(1, cb + 16, ldc * 4);
          _tile_loadd(2, cb + 16 * ldc, ldc * 4);
          _tile_loadd(3, cb + 16 * ldc + 16, ldc * 4);
        } else {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        }
        for (int64_t q0 = 0; q0 < kq; q0 += kQ) {
          const uint32_t* bq = b + q0 * ldb + j0;
          int64_t b_bytes = ldb * 4;
          if (q0 + kQ > k2) {  // the last, partial step: its pair rows and zeros
            for (int64_t q = 0; q < kQ; ++q)
              for (int64_t j = 0; j < cols; j += 16)
                _mm512_store_si512(b_tail + q * kR + j, q0 + q < k2 ? _mm512_loadu_si512(bq + q * ldb + j)
                                                                    : _mm512_setzero_si512());
            bq = b_tail, b_bytes = kR * 4;
            memory_barrier();
          }
          _tile_loadd(4, ai + q0, a_bytes);
          _tile_loadd(5, ai + 16 * (a_bytes / 4) + q0, a_bytes);
          _tile_loadd(6, bq, b_bytes);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(2, 5, 6);
          if (cols > 16) {
            _tile_loadd(7, bq + 16, b_bytes);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        float* out = direct ? cb : block;
        const int64_t ld = direct ? ldc : kR;
        _tile_stored(0, out, ld * 4);
        _tile_stored(1, out + 16, ld * 4);
        _tile_stored(2, out + 16 * ld, ld * 4);
        _tile_stored(3, out + 16 * ld + 16, ld * 4);
        memory_barrier();
        if (direct) continue;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < cols; j += 16) {
            float* cp = c + (i0 + r) * ldc + j0 + j;
            __m512 out = _mm512_mul_ps(va, _mm512_load_ps(block + r * kR + j));
            if (accumulate) out = _mm512_add_ps(out, _mm512_loadu_ps(cp));
            _mm512_storeu_ps(cp, out);
          }
      }
    }
  }

  // Each thread loads the tile configuration once for its products and releases the tile state after them.
  struct Thread {
    Thread() {
      static const TileConfig config;
      _tile_loadconfig(&config);
    }
    ~Thread() { _tile_release(); }
    Thread(const Thread&) = delete;
    Thread& operator=(const Thread&) = delete;
  };
};

}  // namespace

void attention_forward_amx(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out, float* lse,
                           char* workspace) {
  forward_loops<AmxTiles>(d, q, k, v, out, lse, workspace);
}

void attention_backward_amx(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                            HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv,
                            char* workspace) {
  backward_loops<AmxTiles>(d, grad, q, k, v, out, lse, dq, dk, dv, workspace);
}

}  // namespace weft::kernels::cpu
