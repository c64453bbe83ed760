// kernels::lora_delta on AVX-512: lora.h's 16 lanes in one zmm, 16-bit factors widened on load.
#include <immintrin.h>

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/lora_tiles.h"

namespace larder::kernels::cpu::avx512 {

namespace {

struct Ops {
  using V = __m512;
  static constexpr int kKA = 4, kXA = 4, kXB = 8;  // 16 / 8 accumulator registers
  static V zero() { return _mm512_setzero_ps(); }
  static V loadx(const float* p) { return _mm512_loadu_ps(p); }
  template <DType D>
  static V load(const void* base, int64_t i) {
    const auto* b = static_cast<const uint8_t*>(base);
    if constexpr (D == DType::kF32) {
      return _mm512_loadu_ps(b + i * 4);
    } else if constexpr (D == DType::kBF16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * 2)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    } else {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i * 2)));
    }
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V bcast(float v) { return _mm512_set1_ps(v); }
  static float reduce(V a) {  // lora.h's order, not _mm512_reduce_add_ps's
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
  static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  static void store_n(float* p, V a, int n) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), a); }
};

}  // namespace

void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  lora_tiles::lora_delta<Ops>(f, xs, nx, t, us);
}

}  // namespace larder::kernels::cpu::avx512
