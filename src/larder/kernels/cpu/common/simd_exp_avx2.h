// simd_exp_avx2.h — an 8-lane f32 exp for the AVX2 kernels that need one (attention's softmax,
// silu).
#pragma once

#include <immintrin.h>

namespace larder::kernels::cpu::simd {

// e^x, 8 lanes, for x in [-87.3, 88.3] (clamped outside: e^x saturates to ~1e-38 / ~2e38 rather than
// producing denormals or inf): x = k·ln2 + r with |r| <= ln2/2 (Cody–Waite, two-constant ln2 so r is
// exact to f32), e^r by the degree-7 Taylor polynomial (truncation < 1e-8 relative), 2^k through the
// exponent bits. Within ~1 ulp of a double exp (tests/unit/kernels_fast).
inline __m256 exp_ps(__m256 x) {
  // The bounds keep k in [-126, 127], a normal exponent field.
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace larder::kernels::cpu::simd
