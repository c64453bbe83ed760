// kquant_scales.h — the packed 6-bit sub-block scales and mins of a Q4_K super-block (layout:
// ref/kquant.cpp), unpacked four at a time with word operations: byte j of sc_lo/m_lo is
// sub-block j (0..3), byte j of sc_hi/m_hi sub-block 4 + j. Shared by the AVX2 and AVX-512
// K-quant kernels; internal linkage, because each tier's translation unit compiles it with its own
// ISA flags and the linker must not hand one tier's copy to the other.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace larder::kernels::cpu {
namespace {

struct Q4KScaleBytes {
  uint32_t sc_lo, sc_hi, m_lo, m_hi;
  // Sub-block j's (0..7) scale and min.
  uint32_t sc(int j) const { return ((j < 4 ? sc_lo : sc_hi) >> (8 * (j % 4))) & 0xff; }
  uint32_t m(int j) const { return ((j < 4 ? m_lo : m_hi) >> (8 * (j % 4))) & 0xff; }
};

inline Q4KScaleBytes q4k_scale_bytes(const uint8_t* s) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  // For j < 4: sc_j = s[j] & 63, m_j = s[j+4] & 63; for j >= 4 the low 4 bits come from
  // s[j+4] (scale: low nibble, min: high nibble) and bits 4..5 from the top bits of s[j-4] / s[j].
  return {a & 0x3f3f3f3fu, (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u), b & 0x3f3f3f3fu,
          ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)};
}

// The same unpacking in one xmm (for the integer decode kernels, which want the 16 bytes in a
// vector anyway): bytes 0..7 = sc_0..sc_7, bytes 8..15 = m_0..m_7. Reads 16 bytes at s (the 12
// scale bytes and 4 bytes of what follows them in the block, unused).
inline __m128i q4k_scales_xmm(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));  // dwords a b c ·
  // Low parts [a & 3f, c & 0f, b & 3f, (c >> 4) & 0f], high parts [0, (a >> 2) & 30, 0, (b >> 2) & 30].
  const __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));
  const __m128i hi = _mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), 2);
  return _mm_or_si128(_mm_and_si128(lo, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f)),
                      _mm_and_si128(hi, _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}

}  // namespace
}  // namespace larder::kernels::cpu
