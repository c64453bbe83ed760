// mx_unpack.h — the microscaling formats (kernels/microscaling.h) reduced to what the integer kernels
// run: signed int8 codes in natural element order (the e2m1 values doubled, |w| <= 12) and one f32
// scale per 16-element half, value_e = s[e/16]·w_e. Every fp4 value of a group is thus an int8
// times the group's scale exactly (e8m0 scales are powers of two; the nvfp4 e4m3 scale times the
// halved e2m1 value is exact too), so the only approximation of the fast kernels is the int8
// activations, as for the GGUF integer formats.
//
// Internal linkage: compiled into each tier's translation unit with that tier's flags.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>

#include "larder/kernels/microscaling.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu {
namespace {
namespace mx {

// kFp4Values indexed by a nibble (pshufb table, both 128-bit lanes).
inline __m256i fp4_lookup(__m256i nibbles) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kFp4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles);
}

// 16 bytes of a GGUF MXFP4 block → its 32 codes: element j < 16 the low nibble of byte j, j + 16
// the high one.
inline __m256i gguf_codes(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return fp4_lookup(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m)));
}

// 16 bytes of an MLX fp4 row → 32 codes: element j in nibble j % 2 of byte j / 2 (low first).
inline __m256i mlx_codes(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  return fp4_lookup(_mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));
}

// 16 bytes of a GGUF MXFP4 block → its 32 codes, the load broadcast to both lanes and the high
// lane shifted by 4 (no cross-lane insert: one load, shift, and, shuffle).
inline __m256i gguf_codes_bcast(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i n = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
  return fp4_lookup(n);
}

// Scale tables by byte (one broadcast load per block in the kernels), built once:
// GGUF 2^(e−128) (e8m0_half_to_f32), MLX mxfp4's 2^(e−127)/2 (e = 255 → inf).
inline const float* e8m0_half_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) a[b] = e8m0_half_to_f32(static_cast<uint8_t>(b));
    return a;
  }();
  return t.data();
}
inline const float* mlx_e8m0_half_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) a[b] = 0.5f * e8m0_to_f32(static_cast<uint8_t>(b));
    return a;
  }();
  return t.data();
}

// e4m3 / 2 for every byte (nvfp4's scale of the doubled e2m1 codes), built once.
inline const float* e4m3_half_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) a[b] = 0.5f * e4m3_to_f32(static_cast<uint8_t>(b));
    return a;
  }();
  return t.data();
}

}  // namespace mx
}  // namespace
}  // namespace larder::kernels::cpu
