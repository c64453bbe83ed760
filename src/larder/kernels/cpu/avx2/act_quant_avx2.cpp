// act_quant_avx2.cpp — the activation quantizer of act_quant.h, 8 lanes at a time.
// Cost is ~15 instructions per 32 values, once per matmul: for decode (one 2048-wide row) ~0.1 µs
// against ≥ 20 µs of weight streaming, so it is not worth threading.
#include <immintrin.h>

#include "larder/kernels/cpu/common/act_quant.h"

namespace larder::kernels::cpu {

void quantize_acts_avx2(const float* x, int64_t n, int64_t cols, bool offset128, QuantizedActs& out) {
  const int64_t nb = cols / 32;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + t * cols + b * 32;
      __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
      __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
      __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      // Scalar d and id, exactly as quantize_acts_ref computes them (same IEEE ops).
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      // cvtps rounds with MXCSR (nearest-even) = std::nearbyint in the default mode.
      __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
      __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
      __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
      __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
      // Σq from the int32 lanes (exact), for the zero-point fold (act_quant.h, bsum).
      __m256i isum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      const int sum = _mm_cvtsi128_si32(s4);
      // packs work within 128-bit lanes; the final permute restores element order.
      i0 = _mm256_packs_epi32(i0, i1);
      i2 = _mm256_packs_epi32(i2, i3);
      i0 = _mm256_packs_epi16(i0, i2);
      i0 = _mm256_permutevar8x32_epi32(i0, perm);
      if (offset128) i0 = _mm256_xor_si256(i0, flip);  // q + 128 as u8 == q ^ 0x80
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + (t * nb + b) * 32), i0);
      out.d[b * out.n_pad + t] = d;
      out.bsum[b * out.n_pad + t] = d * static_cast<float>(sum);
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = n; t < out.n_pad; ++t) out.d[b * out.n_pad + t] = out.bsum[b * out.n_pad + t] = 0.0f;
  }
}

// Super-block version (act_quant.h, QuantizedActsK): amax over 256 values, then 8 groups of 32
// through the same convert/pack sequence, with the two 16-value sums of each group.
void quantize_acts_k_avx2(const float* x, int64_t n, int64_t cols, QuantizedActsK& out) {
  const int64_t nsb = cols / 256;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const float* xb = x + t * cols + sb * 256;
      __m256 m = _mm256_setzero_ps();
      for (int j = 0; j < 256; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      const float d = amax / 127.0f;  // scalar, as quantize_acts_k_ref computes it
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      int8_t* q = out.qs + t * cols + sb * 256;
      int16_t* s16 = out.bsum + t * (cols / 16) + sb * 16;
      for (int g = 0; g < 8; ++g) {
        const float* xg = xb + 32 * g;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg), vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 8), vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 16), vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 24), vid));
        // Sums of values 0..15 (i0 + i1) and 16..31 (i2 + i3), exact in int32.
        const __m256i a = _mm256_add_epi32(i0, i1), b = _mm256_add_epi32(i2, i3);
        __m256i h = _mm256_hadd_epi32(a, b);  // per 128-bit lane: a0+a1, a2+a3, b0+b1, b2+b3
        h = _mm256_hadd_epi32(h, h);          // lane: a(lo4), b(lo4), ...
        const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        s16[2 * g] = static_cast<int16_t>(_mm_cvtsi128_si32(s));
        s16[2 * g + 1] = static_cast<int16_t>(_mm_extract_epi32(s, 1));
        i0 = _mm256_packs_epi32(i0, i1);
        i2 = _mm256_packs_epi32(i2, i3);
        i0 = _mm256_packs_epi16(i0, i2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * g), _mm256_permutevar8x32_epi32(i0, perm));
      }
      out.d[t * nsb + sb] = d;
    }
  }
}

QuantizedActs quantize_acts_scratch(const float* x, int64_t n, int64_t cols, bool offset128) {
  QuantizedActs a = quantized_acts_view(thread_scratch(quantized_acts_bytes(n, cols)), n, cols);
  quantize_acts_avx2(x, n, cols, offset128, a);
  return a;
}

QuantizedActsK quantize_acts_k_scratch(const float* x, int64_t n, int64_t cols) {
  QuantizedActsK a = quantized_acts_k_view(thread_scratch(quantized_acts_k_bytes(n, cols)), n, cols);
  quantize_acts_k_avx2(x, n, cols, a);
  return a;
}

}  // namespace larder::kernels::cpu
