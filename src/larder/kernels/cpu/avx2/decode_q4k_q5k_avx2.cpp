// decode_q4k_q5k_avx2.cpp — GGUF Q4_K and Q5_K decode (n < 8) on the AVX2 tier, with integer
// super-block accumulation over the super-block activations (act_quant.h, QuantizedActsK: one f32
// scale d_x per 256 values, int16 sums per 16). The ymm form of decode_q4k_q5k_avx512.cpp:
//   Σ w·x̂ = d·d_x·[ Σ_j sc_j·Σ_{i∈j} u_i·q_i ]  −  dmin·d_x·[ Σ_j m_j·Σ_{i∈j} q_i ]
// Per sub-block j of 32 (one ymm of codes, already in element order: chunk c's low nibbles are
// sub-block 2c, its high nibbles 2c + 1): vpmaddubsw (u, q → int16 pair sums, |2·31·127| < 2^15)
// and vpmaddwd by sc_j broadcast as int16 (into int32; lanes < 8·2·7874·63 < 2^23, exact in f32),
// added into one int32 vector per (row, token) over the super-block. The mins bracket is one
// vpmaddwd of the m_j (each twice) with the 16 sums of 16. Then one cvt + FMA per bracket, both into
// the same 8-lane float accumulator. Per 256 weights and token: 8 maddubs + 8 madd + 8 add + 1
// madd + 2 cvt + 2 FMA (the 32-block kernel before: 8 × (maddubs + madd + cvt + FMA) + 2 FMA, and
// its codes went through the stack).
//
// Tiles: for each of the 4 chunks (64 weights) the R rows' codes are unpacked in registers and
// used by the T tokens; int32 sums live across the chunks, so the unpack is done once per row and
// super-block. R = 3 rows for one token, 1 row × up to 4 tokens otherwise (16 ymm registers).
// Q5_K's fifth bit of element 32j + l is bit j of qh[l]: shifted to bit 4 and or-ed into the code.
#include <immintrin.h>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/kquant_scales.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

// Bit j of each qh byte moved to bit 4 (the fifth code bit), other bits cleared.
template <int J>
inline __m256i q5_high(__m256i qh) {
  const __m256i b4 = _mm256_set1_epi8(0x10);
  if constexpr (J < 4) return _mm256_and_si256(_mm256_slli_epi16(qh, 4 - J), b4);
  else if constexpr (J == 4) return _mm256_and_si256(qh, b4);
  else return _mm256_and_si256(_mm256_srli_epi16(qh, J - 4), b4);
}

template <bool kQ5>
struct Q45KDecode {
  static constexpr int kRows1 = 3;
  static constexpr int kRowsN = 1;
  static constexpr uint64_t kBlockBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr int kQsOffset = kQ5 ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs);
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  QuantizedActsK a;
  float* y;

  template <int C, int R, int T>
  __attribute__((always_inline)) void chunk(const uint8_t* const (&blk)[R], const __m256i (&scb)[R], __m256i (&isum)[R][T],
                                  const int8_t* const (&xq)[T]) const {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + kQsOffset + 32 * C));
      __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kQ5) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[r] + offsetof(BlockQ5_K, qh)));
        lo = _mm256_or_si256(lo, q5_high<2 * C>(qh));
        hi = _mm256_or_si256(hi, q5_high<2 * C + 1>(qh));
      }
      // sc_j as int16 in every lane: vpshufb picks byte j of the broadcast scales, 0x80 zeroes the high byte.
      const __m256i sa = _mm256_shuffle_epi8(scb[r], _mm256_set1_epi16(static_cast<int16_t>(0x8000 | (2 * C))));
      const __m256i sb = _mm256_shuffle_epi8(scb[r], _mm256_set1_epi16(static_cast<int16_t>(0x8000 | (2 * C + 1))));
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i xa = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[t] + 64 * C));
        const __m256i xb = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[t] + 64 * C + 32));
        const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xa), sa);
        const __m256i pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xb), sb);
        isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_add_epi32(pa, pb));
      }
    }
  }

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m256 acc[R][T];
    zero_acc(acc);
    // m_j at int16 positions 2j and 2j + 1 of the broadcast [sc_0..sc_7 | m_0..m_7] (sums come per 16).
    const __m256i ctlm = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128,
                                          12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * kBlockBytes, kBlockBytes);
      const uint8_t* blk[R];
      __m256i scb[R];
      __m256i isum[R][T];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        blk[r] = base + r * row_bytes + sb * kBlockBytes;
        scb[r] = _mm256_broadcastsi128_si256(q4k_scales_xmm(blk[r] + 4));
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) isum[r][t] = _mm256_setzero_si256();
      }
      const int8_t* xq[T];
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) xq[t] = a.token(t0 + t) + sb * 256;
      chunk<0>(blk, scb, isum, xq);
      chunk<1>(blk, scb, isum, xq);
      chunk<2>(blk, scb, isum, xq);
      chunk<3>(blk, scb, isum, xq);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const float d = f16[load_u16(blk[r])], dmin = f16[load_u16(blk[r] + 2)];
        const __m256i mm = _mm256_shuffle_epi8(scb[r], ctlm);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const float dx = a.scales(t0 + t)[sb];
          const __m256i ms = _mm256_madd_epi16(
              mm, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.sums16(t0 + t) + sb * 16)));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(d * dx), acc[r][t]);
          acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * dx), acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

}  // namespace

void decode_q4_k(const WeightView& w, const float* x, int64_t n, float* y) {
  super_decode<Q45KDecode<false>>(w, x, n, y);
}
void decode_q5_k(const WeightView& w, const float* x, int64_t n, float* y) {
  super_decode<Q45KDecode<true>>(w, x, n, y);
}

void matmul_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  super_matmul_multi<Q45KDecode<false>, matmul_q4_k>(ws, ys, count, x, n);
}
void matmul_multi_q5_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  super_matmul_multi<Q45KDecode<true>, matmul_q5_k>(ws, ys, count, x, n);
}

}  // namespace larder::kernels::cpu::avx2
