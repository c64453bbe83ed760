// decode_iq4_avx2.cpp — GGUF IQ4_XS decode (n < 8) on the AVX2 tier (Zen 3's path), with integer
// super-block accumulation over the super-block activations (act_quant.h QuantizedActsK: one f32
// d_x per 256 values).
//
// Value = d·(ls_j − 32)·v over sub-block j of 32, v = kIq4Values[code] (signed, −127..113, never
// 0). AVX2 has no vpdpbusd, so the dot runs on vpmaddubsw, which needs an unsigned operand and
// saturates int16 pair sums: v + 128 would overflow (2·241·127), so the codebook is looked up as
// v (one vpshufb per 32 codes), |v| goes to the unsigned operand (vpabsb) and sign(v) onto the
// activations (vpsignb: v is never 0, so no activation is zeroed); pair sums stay within
// 2·127·127 < 2^15. vpmaddwd with the sub-block scale ls_j − 32 (int16, per 128-bit lane) turns
// the pairs into int32, and a super-block's whole dot stays one int32 vector per (row, token)
// (|lane| <= 8·2·127·127·32 < 2^24, exact in f32): one cvt and one FMA by d·d_x per 256 weights,
// against a cvt + FMA per 32-block and an unpack through the stack in the generic kernel.
// Per 64 weights and token: 2 vpsignb + 2 vpmaddubsw + 2 vpmaddwd + 2 vpaddd.
//
// Layout: 32 code bytes c (c = 0..3) of a super-block hold sub-blocks 2c (low 128-bit lane) and
// 2c + 1 (high lane), elements 0–15 in the low nibbles and 16–31 in the high ones; the activations
// are permuted once per matmul to match ([2c lo | 2c+1 lo], [2c hi | 2c+1 hi]), and the scale
// multiplier of step c is ls_2c in the low lane, ls_2c+1 in the high one (one vpshufb of the 8
// scales decoded per row and super-block).
#include <immintrin.h>

#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

struct IQ4XSDecode {
  static constexpr int kRows1 = 2;
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const int8_t* acts;  // [n][nsb][256], permuted (see the header)
  const float* dx;     // [n][nsb]
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m256 acc[R][T];
    zero_acc(acc);
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i sh_l = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), sh_h = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i m15 = _mm256_set1_epi32(15), m48 = _mm256_set1_epi32(48), k32 = _mm256_set1_epi32(32);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * sizeof(BlockIQ4_XS), sizeof(BlockIQ4_XS));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * sizeof(BlockIQ4_XS);
        uint32_t sl;
        std::memcpy(&sl, blk + offsetof(BlockIQ4_XS, scales_l), 4);
        const uint32_t sh = load_u16(blk + offsetof(BlockIQ4_XS, scales_h));
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)), sh_l), m15);
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sh << 4)), sh_h), m48);
        const __m256i ls32 = _mm256_sub_epi32(_mm256_or_si256(lo, hi), k32);
        // int16 ls_0..ls_7 in both 128-bit lanes (packs interleaves per lane: [0..3 0..3 | 4..7 4..7]).
        const __m256i ls16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ls32, ls32), 0x88);
        const float d = f16[load_u16(blk)];
        __m256i isum[T];
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
        LARDER_UNROLL
        for (int c = 0; c < 4; ++c) {
          // word 2c in the low lane, word 2c + 1 in the high lane
          const __m256i sc = _mm256_shuffle_epi8(
              ls16, _mm256_setr_epi8(4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c,
                                     4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3,
                                     4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3,
                                     4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3));
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockIQ4_XS, qs) + 32 * c));
          const __m256i vlo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, m4));
          const __m256i vhi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
          const __m256i alo = _mm256_abs_epi8(vlo), ahi = _mm256_abs_epi8(vhi);
          LARDER_UNROLL
          for (int t = 0; t < T; ++t) {
            const int8_t* x = acts + ((t0 + t) * nsb + sb) * 256 + 64 * c;
            const __m256i plo = _mm256_maddubs_epi16(
                alo, _mm256_sign_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(x)), vlo));
            const __m256i phi = _mm256_maddubs_epi16(
                ahi, _mm256_sign_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32)), vhi));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(plo, sc), _mm256_madd_epi16(phi, sc)));
          }
        }
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const float s = d * dx[(t0 + t) * nsb + sb];
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(s), acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// Quantizes x per super-block (QuantizedActsK, slot 0) and permutes it for IQ4XSDecode (slot 1);
// matmul_multi reuses the result for every weight of the group.
IQ4XSDecode prepare_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nsb = cols / 256;
  QuantizedActsK a = quantize_acts_k_scratch(x, n, cols);
  auto* acts = static_cast<int8_t*>(thread_scratch(static_cast<size_t>(n * nsb) * 256 + 64, 1));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const int8_t* q = a.token(t) + sb * 256;
      int8_t* dst = acts + (t * nsb + sb) * 256;
      for (int c = 0; c < 4; ++c) {
        std::memcpy(dst + 64 * c, q + 64 * c, 16);            // sub-block 2c, elements 0–15
        std::memcpy(dst + 64 * c + 16, q + 64 * c + 32, 16);  // sub-block 2c + 1, elements 0–15
        std::memcpy(dst + 64 * c + 32, q + 64 * c + 16, 16);  // sub-block 2c, elements 16–31
        std::memcpy(dst + 64 * c + 48, q + 64 * c + 48, 16);  // sub-block 2c + 1, elements 16–31
      }
    }
  }
  return IQ4XSDecode{w.data, w.row_bytes(), w.rows, nsb, acts, a.d, y};
}

}  // namespace

void decode_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const IQ4XSDecode k = prepare_iq4_xs(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, w.cols + w.cols / 8);
}

void matmul_multi_iq4_xs(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= 8) {
    for (int i = 0; i < count; ++i) matmul_iq4_xs(ws[i], x, n, ys[i]);
    return;
  }
  run_multi_decode(prepare_iq4_xs(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + ws[0].cols / 8);
}

}  // namespace larder::kernels::cpu::avx2
