// matmul_mx_avx2.cpp — the microscaling float formats on the AVX2 tier (kernels/microscaling.h):
// GGUF MXFP4 and MLX mxfp4 / nvfp4 on int8 dot products, MLX mxfp8 in f32.
//
// fp4: each row is unpacked once per call (cpu/common/mx_unpack.h: int8 codes, a scale per 16),
// then dotted with every token's int8 activation blocks (act_quant.h): per block one maddubs of
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

inline float dot_fp4(const int8_t* wq, const float* s, const QuantizedActs& a, int64_t t, int64_t nb) {
  const int8_t* xq = a.token_blocks(t);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32 * b));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * b));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), ones);
    const __m256 sd = _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(s[2 * b + 1]), _mm_set1_ps(s[2 * b])),
                                    _mm256_set1_ps(a.scales(b)[t]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sd, acc);
  }
  return simd::hsum(acc);
}

template <void (*Row)(const WeightView&, int64_t, int8_t*, float*)>
void matmul_fp4(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const QuantizedActs a = quantize_acts_scratch(x, n, w.cols);
  const int64_t nb = w.cols / 32, rows = w.rows;
  parallel_split(rows, 4, w.cols * n, [&](int64_t r0, int64_t r1) {
    auto* buf = static_cast<uint8_t*>(thread_scratch(round_up64(static_cast<size_t>(w.cols)) + 8 * nb * sizeof(float), 4));
    auto* q = reinterpret_cast<int8_t*>(buf);
    auto* s = reinterpret_cast<float*>(buf + round_up64(static_cast<size_t>(w.cols)));
    for (int64_t r = r0; r < r1; ++r) {
      Row(w, r, q, s);
      for (int64_t t = 0; t < n; ++t) y[t * rows + r] = dot_fp4(q, s, a, t, nb);
    }
  });
}

}  // namespace

void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) { matmul_fp4<mx::row_mxfp4>(w, x, n, y); }
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_fp4<mx::row_mlx_mxfp4>(w, x, n, y);
}
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_fp4<mx::row_mlx_nvfp4>(w, x, n, y);
}

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
