#include "larder/core/dtype.h"

namespace larder {

const DTypeInfo& dtype_info(DType t) {
  static constexpr DTypeInfo kInfo[] = {
      {"F32", 1, 4},     {"F16", 1, 2},     {"BF16", 1, 2},    {"I8", 1, 1},
      {"U8", 1, 1},      {"I16", 1, 2},     {"I32", 1, 4},     {"U32", 1, 4},
      {"I64", 1, 8},     {"F64", 1, 8},     {"BOOL", 1, 1},    {"Q8_0", 32, 34},
      {"Q4_0", 32, 18},  {"Q4_1", 32, 20},  {"Q5_0", 32, 22},  {"Q5_1", 32, 24},
      {"Q2_K", 256, 84}, {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176},
      {"Q6_K", 256, 210}, {"Q8_K", 256, 292}, {"IQ4_NL", 32, 18}, {"IQ4_XS", 256, 136},
      {"MXFP4", 32, 17}, {"MLX_MXFP4", 2, 1}, {"MLX_NVFP4", 2, 1}, {"MLX_MXFP8", 1, 1},
      {"UNKNOWN", 1, 0},
  };
  static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == static_cast<size_t>(DType::kUnknown) + 1,
                "one entry per DType");
  return kInfo[static_cast<int>(t)];
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    // value = m * 2^(e-150); the half subnormal ulp is 2^-24, so q = m >> (126 - e), rounded
    // to nearest even on the bits shifted out.
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // normal: rebias exponent and round mantissa to 10 bits (nearest even)
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace larder
