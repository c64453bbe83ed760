// decode_q2k_q3k_avx2.cpp — GGUF Q2_K and Q3_K decode (n < 8) on the AVX2 tier, with integer
// super-block accumulation over the super-block activations (act_quant.h, QuantizedActsK: one f32
// scale d_x per 256 values, int16 sums per 16). The ymm form of decode_q2k_q3k_q6k_avx512.cpp:
//   Q2_K:  y += d·d_x·[Σ_j sc_j·Σ_{i∈j} u_i·q_i] − dmin·d_x·[Σ_j m_j·Σ_{i∈j} q_i]   u ∈ 0..3
//   Q3_K:  y += d·d_x·[Σ_j sc_j·Σ_{i∈j} u_i·q_i − Σ_j 4·sc_j·Σ_{i∈j} q_i]          u ∈ 0..7, sc ∈ −32..31
// Why: the generic unpacker kernel (matmul_gguf_avx2.cpp) took these through bytes on the stack
// and a float step per 16 elements, and consumed 3.0 (Q2_K) and 4.7 (Q3_K) GB/s per core on Zen 4
// (kernel_bench --hot, 8192x2048): decode on an AVX2-only CPU ran far below its bandwidth.
//
// Both formats keep four codes per byte: byte 32h + l of qs holds elements 128h + 32s + l at bits
// 2s..2s+1 (s = 0..3), so one 32-byte load shifted by 2s and masked gives the 32 codes of elements
// 128h + 32s + 0..31 — natural order, the activations' own: sub-blocks j = 8h + 2s (low 128-bit
// lane of the vpmaddubsw result) and j + 1 (high lane). Per chunk: vpmaddubsw (|2·7·127| < 2^15)
// and vpmaddwd by [sc_j ×8 | sc_{j+1} ×8] as int16 (vpshufb of the scales' 128-bit half broadcast
// to both lanes), added into one int32 vector per (row, token). Q3_K's high bit of element
// 128h + 32s + l is bit 4h + s of hmask[l]: shifted to bit 2 and or-ed into the code. The Q2_K
// mins and the Q3_K zero point are one vpmaddwd of 16 int16 multipliers with the 16 sums of 16.
// Per 256 weights and token: 8 maddubs + 8 madd + 8 add + 1 madd + 2 cvt + 2 FMA (Q3_K: 1 sub,
// 1 cvt, 1 FMA instead of the second pair).
#include <immintrin.h>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

// One row's super-block scales: the 16 sub-block multipliers as int16, each 128-bit half
// broadcast to both lanes (half h serves chunks 8h..8h+7), and the 16 multipliers of the sums.
struct Scales {
  __m256i half[2];
  __m256i zmul;  // Q2_K: m_j; Q3_K: 4·sc_j (subtracted)
  float d, dmin;
};

// Q2_K (84 B): scales[16] (low nibble sc, high nibble m) | qs[64] | f16 d | f16 dmin.
struct Q2K {
  static constexpr uint64_t kBlockBytes = sizeof(BlockQ2_K);
  static constexpr bool kMins = true;
  static Scales scales(const uint8_t* blk, const float* f16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ2_K, scales)));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i sc = _mm256_cvtepu8_epi16(_mm_and_si128(b, m4));
    return {{_mm256_permute2x128_si256(sc, sc, 0x00), _mm256_permute2x128_si256(sc, sc, 0x11)},
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4)),
            f16[load_u16(blk + offsetof(BlockQ2_K, d))],
            f16[load_u16(blk + offsetof(BlockQ2_K, dmin))]};
  }
  template <int S>
  static __m256i codes(const uint8_t* blk, int h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ2_K, qs) + 32 * h));
    return _mm256_and_si256(S == 0 ? v : _mm256_srli_epi16(v, 2 * S), _mm256_set1_epi8(3));
  }
};

// Q3_K (110 B): hmask[32] | qs[64] | 12 B scales | f16 d; u = low2 + 4·hbit, value d·sc·(u − 4).
struct Q3K {
  static constexpr uint64_t kBlockBytes = sizeof(BlockQ3_K);
  static constexpr bool kMins = false;
  static Scales scales(const uint8_t* blk, const float* f16) {
    // Sixteen 6-bit scales (ref/kquant.cpp q3_k_scale), as decode_q2k_q3k_q6k_avx512.cpp unpacks
    // them: low nibbles from bytes 0..7 (i < 8) and their high nibbles (i >= 8); bits 4..5 are
    // bits 2(i/4).. of byte 8 + i % 4. The 16-byte load ends at the block's last byte.
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ3_K, scales) - 2));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i a = _mm_srli_si128(w, 2);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4));
    const __m128i hb = _mm_shuffle_epi8(w, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(hb, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
    return {{_mm256_permute2x128_si256(sc, sc, 0x00), _mm256_permute2x128_si256(sc, sc, 0x11)},
            _mm256_slli_epi16(sc, 2), f16[load_u16(blk + offsetof(BlockQ3_K, d))], 0.0f};
  }
  template <int S>
  static __m256i codes(const uint8_t* blk, int h) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ3_K, qs) + 32 * h));
    const __m256i lo = _mm256_and_si256(S == 0 ? v : _mm256_srli_epi16(v, 2 * S), _mm256_set1_epi8(3));
    // Bit 4h + S of each hmask byte to bit 2 (16-bit shifts: what crosses into a byte from its
    // neighbour lands outside bit 2, or comes from above bit 15 as zeros).
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ3_K, hmask)));
    const int k = 4 * h + S;
    const __m256i hb = k >= 2 ? _mm256_srl_epi16(hm, _mm_cvtsi32_si128(k - 2)) : _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - k));
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
  }
};

template <class F>
struct TwoBitDecode {
  static constexpr int kRows1 = 3;
  static constexpr int kRowsN = 1;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  QuantizedActsK a;
  float* y;

  // Chunk s of half h (elements 128h + 32s + 0..31) of the R rows against the T tokens.
  template <int S, int R, int T>
  __attribute__((always_inline)) void chunk(int h, const uint8_t* const (&blk)[R], const Scales (&sc)[R],
                                            __m256i (&isum)[R][T], const int8_t* const (&xq)[T]) const {
    // int16 lanes 0..7 ← sub-block 8h + 2S, 8..15 ← 8h + 2S + 1 (each half holds 8 scales).
    const __m256i ctl = _mm256_setr_epi8(4 * S, 4 * S + 1, 4 * S, 4 * S + 1, 4 * S, 4 * S + 1, 4 * S, 4 * S + 1, 4 * S,
                                         4 * S + 1, 4 * S, 4 * S + 1, 4 * S, 4 * S + 1, 4 * S, 4 * S + 1, 4 * S + 2,
                                         4 * S + 3, 4 * S + 2, 4 * S + 3, 4 * S + 2, 4 * S + 3, 4 * S + 2, 4 * S + 3,
                                         4 * S + 2, 4 * S + 3, 4 * S + 2, 4 * S + 3, 4 * S + 2, 4 * S + 3, 4 * S + 2,
                                         4 * S + 3);
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i u = F::template codes<S>(blk[r], h);
      const __m256i m = _mm256_shuffle_epi8(sc[r].half[h], ctl);
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[t] + 128 * h + 32 * S));
        isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), m));
      }
    }
  }

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m256 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * F::kBlockBytes, F::kBlockBytes);
      const uint8_t* blk[R];
      Scales sc[R];
      __m256i isum[R][T];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        blk[r] = base + r * row_bytes + sb * F::kBlockBytes;
        sc[r] = F::scales(blk[r], f16);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) isum[r][t] = _mm256_setzero_si256();
      }
      const int8_t* xq[T];
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) xq[t] = a.token(t0 + t) + sb * 256;
      for (int h = 0; h < 2; ++h) {
        chunk<0>(h, blk, sc, isum, xq);
        chunk<1>(h, blk, sc, isum, xq);
        chunk<2>(h, blk, sc, isum, xq);
        chunk<3>(h, blk, sc, isum, xq);
      }
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const float dx = a.scales(t0 + t)[sb];
          const __m256i zs = _mm256_madd_epi16(
              sc[r].zmul, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.sums16(t0 + t) + sb * 16)));
          if constexpr (F::kMins) {
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(sc[r].d * dx), acc[r][t]);
            acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(zs), _mm256_set1_ps(sc[r].dmin * dx), acc[r][t]);
          } else {
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[r][t], zs)),
                                        _mm256_set1_ps(sc[r].d * dx), acc[r][t]);
          }
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

}  // namespace

void decode_q2_k(const WeightView& w, const float* x, int64_t n, float* y) {
  super_decode<TwoBitDecode<Q2K>>(w, x, n, y);
}
void decode_q3_k(const WeightView& w, const float* x, int64_t n, float* y) {
  super_decode<TwoBitDecode<Q3K>>(w, x, n, y);
}

void matmul_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  super_matmul_multi<TwoBitDecode<Q2K>, matmul_q2_k>(ws, ys, count, x, n);
}
void matmul_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  super_matmul_multi<TwoBitDecode<Q3K>, matmul_q3_k>(ws, ys, count, x, n);
}

}  // namespace larder::kernels::cpu::avx2
