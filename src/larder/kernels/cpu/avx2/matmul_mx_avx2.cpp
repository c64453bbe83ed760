// matmul_mx_avx2.cpp — the microscaling float formats on the AVX2 tier (kernels/microscaling.h):
// GGUF MXFP4 and MLX mxfp4 / nvfp4 on int8 dot products, MLX mxfp8 in f32.
//
// fp4: tiles of 2 rows × up to 4 tokens decode each block's codes once per tile (cpu/common/
// mx_unpack.h: int8 codes, a scale per 16) and dot them with the tokens' int8 activation blocks
// (act_quant.h): per block one maddubs of
// |w| against sign(q_x, w) (|w| <= 12, pair sums exact), madd to 8 int32 lanes (lanes 0–3 = the
// first 16 elements), and one FMA with the halves' s·d_x. mxfp8: e4m3 → f16 by a shift (the e4m3
// bits with the exponent rebased: ×2^8 is exact; the NaN code 0x7f, which mlx's quantizer never
// writes, reads as 480), widened to f32 with the row's group scales, then
// an 8-lane FMA dot per token.
//
// A (row, token) result is one chain over the blocks in order, whatever the call's token count or
// thread split, so decode and prefill give the same bits (kernels/batch_invariance.h).
#include <immintrin.h>

#include <cstdint>

#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/mx_unpack.h"
#include "larder/kernels/cpu/common/parallel_split.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {

namespace {

// The fp4 layouts as a block decoder: the 32 signed codes of block b of row r, and the scales of its
// halves as one vector (lanes 0–3: elements 0–15, lanes 4–7: 16–31, as madd leaves the sums).
struct GgufMxfp4 {
  const uint8_t* w;
  uint64_t rb;
  const float* half = mx::e8m0_half_table();
  explicit GgufMxfp4(const WeightView& v) : w(v.data), rb(v.row_bytes()) {}
  __m256i codes(int64_t r, int64_t b) const { return mx::gguf_codes_bcast(w + r * rb + 17 * b + 1); }
  __m256 scales(int64_t r, int64_t b) const { return _mm256_broadcast_ss(half + w[r * rb + 17 * b]); }
};
// MLX's fp4 layouts: the codes, and a row of scale bytes per weight row that `half` maps to half
// the scale (e8m0 for mxfp4, e4m3 for nvfp4).
struct MlxFp4 {
  const uint8_t* w;
  const uint8_t* sc;
  uint64_t rb, sb;
  const float* half;
  MlxFp4(const WeightView& v, const float* half_table)
      : w(v.data), sc(v.scales), rb(v.row_bytes()), sb(v.scale_row_bytes()), half(half_table) {}
  __m256i codes(int64_t r, int64_t b) const { return mx::mlx_codes(w + r * rb + 16 * b); }
};
struct MlxMxfp4 : MlxFp4 {
  explicit MlxMxfp4(const WeightView& v) : MlxFp4(v, mx::mlx_e8m0_half_table()) {}
  __m256 scales(int64_t r, int64_t b) const { return _mm256_broadcast_ss(half + sc[r * sb + b]); }
};
struct MlxNvfp4 : MlxFp4 {
  explicit MlxNvfp4(const WeightView& v) : MlxFp4(v, mx::e4m3_half_table()) {}
  __m256 scales(int64_t r, int64_t b) const {
    const uint8_t* s = sc + r * sb + 2 * b;
    return _mm256_set_m128(_mm_set1_ps(half[s[1]]), _mm_set1_ps(half[s[0]]));
  }
};

// R rows × T tokens from (r0, t0): per (row, token) one chain over the blocks in order —
// acc += cvt(Σ w·q per 4 elements)·(s·d_x) — then the lane sum. The chain's operations and their
// order do not depend on R, T, the call's token count or the thread split, so every tile shape
// gives a (row, token) the same bits (batch invariance).
template <int R, int T, class D>
__attribute__((always_inline)) inline void tile(const D& d, const QuantizedActs& a, int64_t nb, int64_t rows,
                                                int64_t r0, int64_t t0, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][T];
  LARDER_UNROLL
  for (int r = 0; r < R; ++r)
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wa[R], ws[R];
    __m256 sv[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i w = d.codes(r0 + r, b);
      wa[r] = _mm256_abs_epi8(w);
      ws[r] = w;
      sv[r] = d.scales(r0 + r, b);
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.token_blocks(t0 + t) + 32 * b));
      const __m256 dx = _mm256_set1_ps(a.scales(b)[t0 + t]);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(x, ws[r])), ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sv[r], dx), acc[r][t]);
      }
    }
  }
  LARDER_UNROLL
  for (int r = 0; r < R; ++r)
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) y[(t0 + t) * rows + r0 + r] = simd::hsum(acc[r][t]);
}

template <int R, class D>
inline void rows_tile(const D& d, const QuantizedActs& a, int64_t nb, int64_t rows, int64_t r0, int64_t n, float* y) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) tile<R, 4>(d, a, nb, rows, r0, t, y);
  switch (n - t) {
    case 3: tile<R, 3>(d, a, nb, rows, r0, t, y); break;
    case 2: tile<R, 2>(d, a, nb, rows, r0, t, y); break;
    case 1: tile<R, 1>(d, a, nb, rows, r0, t, y); break;
    default: break;
  }
}

template <class D>
void matmul_fp4(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const QuantizedActs a = quantize_acts_scratch(x, n, w.cols);
  const int64_t nb = w.cols / 32, rows = w.rows;
  const D d(w);
  // Row pairs over the pool (the codes of a pair are decoded once per 4 tokens).
  parallel_split((rows + 1) / 2, 4, 2 * w.cols * n, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r = 2 * p;
      if (r + 2 <= rows) rows_tile<2>(d, a, nb, rows, r, n, y);
      else rows_tile<1>(d, a, nb, rows, r, n, y);
    }
  });
}

}  // namespace

void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) { matmul_fp4<GgufMxfp4>(w, x, n, y); }
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) { matmul_fp4<MlxMxfp4>(w, x, n, y); }
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y) { matmul_fp4<MlxNvfp4>(w, x, n, y); }

void matmul_mlx_mxfp8(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t cols = w.cols, rows = w.rows;
  parallel_split(rows, 4, cols * n, [&](int64_t r0, int64_t r1) {
    auto* wf = static_cast<float*>(thread_scratch(static_cast<size_t>(cols) * sizeof(float) + 64, 4));
    const __m128i sign = _mm_set1_epi16(static_cast<short>(0x8000)), mag = _mm_set1_epi16(0x7f);
    const __m256 k256 = _mm256_set1_ps(256.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* p = w.data + static_cast<uint64_t>(r) * w.row_bytes();
      const uint8_t* sc = w.scales + static_cast<uint64_t>(r) * w.scale_row_bytes();
      for (int64_t c = 0; c < cols; c += 8) {
        const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c)));
        // f16 bits: the sign to bit 15, exponent and mantissa shifted up by 7 (f16 bias 15 vs 7,
        // so the f16 value is the e4m3 value / 2^8; e4m3 subnormals land on f16 subnormals).
        const __m128i h = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(b, 8), sign), _mm_slli_epi16(_mm_and_si128(b, mag), 7));
        const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), k256);
        _mm256_storeu_ps(wf + c, _mm256_mul_ps(v, _mm256_set1_ps(e8m0_to_f32(sc[c / 32]))));
      }
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * cols;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < cols; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wf + c), _mm256_loadu_ps(xt + c), acc);
        y[t * rows + r] = simd::hsum(acc);
      }
    }
  });
}


}  // namespace larder::kernels::cpu::avx2
