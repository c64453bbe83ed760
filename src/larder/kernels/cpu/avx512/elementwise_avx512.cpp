// elementwise_avx512.cpp — gelu_tanh·mul (GeGLU, Gemma) on 16 lanes.
//
// Same formula as the AVX2 kernel (elementwise_avx2.cpp): gelu_tanh(g)·u = g·u / (1 + e^(−2z)),
// z = √(2/π)(g + 0.044715 g³), with a 16-lane exp of the same construction as simd::exp_ps
// (clamp to [−87.3, 88.3], Cody–Waite with a two-constant ln2, degree-7 Taylor, 2^k through the
// exponent bits; vscalefps does the 2^k). The MLP of a Gemma layer applies it to tokens × ffn
// floats; split over the pool like the AVX2 elementwise ops.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/avx512/simd_exp_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"

namespace larder::kernels::cpu::avx512 {

namespace {

void gelu_tanh_mul_range(const float* g, const float* u, float* out, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // √(2/π)
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 c1 = _mm512_set1_ps(-2.0f * kC), c3 = _mm512_set1_ps(-2.0f * kC * 0.044715f);
  int64_t i = 0;
  for (; i < n; i += 16) {
    // The ragged tail runs masked: lanes past n load zeros and are not stored.
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 t = _mm512_mul_ps(gv, _mm512_fmadd_ps(_mm512_mul_ps(gv, gv), c3, c1));  // −2z
    _mm512_mask_storeu_ps(out + i, m, _mm512_div_ps(_mm512_mul_ps(gv, uv), _mm512_add_ps(one, exp16(t))));
  }
}

}  // namespace

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr int64_t kMinParallel = 32 * 1024;
  ThreadPool& pool = default_pool();
  if (n <= 0) return;
  if (n < kMinParallel || pool.n_threads() <= 1) {
    gelu_tanh_mul_range(gate, up, out, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(4 * pool.n_threads(), std::max<int64_t>(1, n / 4096));
  pool.parallel_for(chunks, [&](int64_t c, int) {
    const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    gelu_tanh_mul_range(gate + b, up + b, out + b, e - b);
  });
}

}  // namespace larder::kernels::cpu::avx512
