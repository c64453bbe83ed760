// kquant_scales.h — the packed 6-bit sub-block scales and mins of a Q4_K super-block (layout:
// ref/kquant.cpp), unpacked four at a time with word operations: byte j of sc_lo/m_lo is
// sub-block j (0..3), byte j of sc_hi/m_hi sub-block 4 + j. Shared by the AVX2 and AVX-512
// K-quant kernels; internal linkage, because each tier's translation unit compiles it with its own
// ISA flags and the linker must not hand one tier's copy to the other.
#pragma once

#include <cstdint>
#include <cstring>

namespace larder::kernels::cpu {
namespace {

struct Q4KScaleBytes {
  uint32_t sc_lo, sc_hi, m_lo, m_hi;
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

}  // namespace
}  // namespace larder::kernels::cpu
