// kernels::lora_delta on AVX2 + FMA + F16C: lora.h's 16 lanes as two 8-lane halves.
#include <immintrin.h>

#include <cstring>

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/lora_tiles.h"

namespace larder::kernels::cpu::avx2 {

namespace {

struct Ops {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int kKA = 2, kXA = 2, kXB = 4;  // 8 / 8 accumulator registers
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V loadx(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static __m256 widen_bf16(const uint8_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  template <DType D>
  static V load(const void* base, int64_t i) {
    const auto* b = static_cast<const uint8_t*>(base);
    if constexpr (D == DType::kF32) {
      const float* p = reinterpret_cast<const float*>(b + i * 4);
      return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    } else if constexpr (D == DType::kBF16) {
      return {widen_bf16(b + i * 2), widen_bf16(b + i * 2 + 16)};
    } else {
      return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i * 2))),
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i * 2 + 16)))};
    }
  }
  static V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static V bcast(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static float reduce(V a) {
    const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
  static void store(float* p, V a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + 8, a.hi);
  }
  static void store_n(float* p, V a, int n) {
    alignas(32) float v[16];
    store(v, a);
    std::memcpy(p, v, static_cast<size_t>(n) * sizeof(float));
  }
};

}  // namespace

void lora_delta(const LoraFactors& f, const float* const* xs, int64_t nx, float* t, float* const* us) {
  lora_tiles::lora_delta<Ops>(f, xs, nx, t, us);
}

}  // namespace larder::kernels::cpu::avx2
