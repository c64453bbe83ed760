// microscaling.cpp — see microscaling.h.
#include "larder/quant/microscaling.h"

#include <cmath>
#include <vector>

#include "larder/kernels/microscaling.h"
#include "larder/quant/affine.h"

namespace larder::quant {

uint8_t e2m1_code(float y) {
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float a = std::fabs(y);
  uint8_t q = 0;
  for (float m : kMid) q = static_cast<uint8_t>(q + (a > m ? 1 : 0));
  return static_cast<uint8_t>(q | (y < 0 && q > 0 ? 8 : 0));
}

uint8_t e4m3_code(float y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const float a = std::fabs(y);
  if (!(a < 448.0f)) return static_cast<uint8_t>(sign | 0x7e);  // saturate (the scale keeps |y| <= 448)
  int code;
  if (a < 0.015625f) {
    // Subnormals m·2^-9; m = 8 is the smallest normal's code, so rounding up carries correctly.
    code = static_cast<int>(std::nearbyint(a * 512.0f));
  } else {
    int k;
    (void)std::frexp(a, &k);  // a = f·2^k, f in [0.5, 1): the exponent is k − 1
    // (8 + mantissa) = a·2^(4−k) exactly, rounded to nearest-even; a carry bumps the exponent.
    const int m8 = static_cast<int>(std::nearbyint(std::ldexp(a, 4 - k)));
    code = ((k - 1 + 7) << 3) + (m8 - 8);
  }
  return static_cast<uint8_t>(sign | code);
}

namespace {

// The e8m0 exponent of the smallest power of two >= x (x > 0), clamped to mlx's range.
uint8_t e8m0_ceil(float x) {
  int k;
  const float f = std::frexp(x, &k);  // x = f·2^k
  const int e = (f == 0.5f ? k - 1 : k) + 127;
  return static_cast<uint8_t>(e < 0 ? 0 : e > 254 ? 254 : e);
}

}  // namespace

Status quantize_microscaling(const void* src, DType dtype, int64_t rows, int64_t cols, DType fmt, uint8_t* codes,
                             uint8_t* scales) {
  const int group = kernels::mlx_microscaling_group(fmt);
  if (group == 0) return invalid_argument(strfmt("[quantize] %s is not a microscaling format", dtype_name(fmt)));
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
    return unsupported(strfmt("[quantize] cannot quantize %s weights (F32, F16, BF16)", dtype_name(dtype)));
  if (cols % group != 0)
    return invalid_argument(strfmt("[quantize] %lld columns are not a multiple of mode %s's group of %d",
                                   (long long)cols, kernels::mlx_mode_name(fmt), group));
  const bool fp8 = fmt == DType::kMlxMXFP8;
  const float max_value = fp8 ? 448.0f : 6.0f;
  std::vector<float> w(static_cast<size_t>(group));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* crow = codes + r * (fp8 ? cols : cols / 2);
    for (int64_t g = 0; g < cols / group; ++g) {
      float amax = 0.0f;
      for (int j = 0; j < group; ++j) {
        w[static_cast<size_t>(j)] = load_float(src, dtype, r * cols + g * group + j);
        amax = std::fmax(amax, std::fabs(w[static_cast<size_t>(j)]));
      }
      uint8_t s;
      float sv;
      if (fmt == DType::kMlxNVFP4) {
        s = e4m3_code(amax / max_value);
        sv = kernels::e4m3_to_f32(s);
      } else {
        s = amax > 0.0f ? e8m0_ceil(amax / max_value) : uint8_t{127};
        sv = kernels::e8m0_to_f32(s);
      }
      scales[r * (cols / group) + g] = s;
      for (int j = 0; j < group; ++j) {
        const float y = sv == 0.0f ? 0.0f : w[static_cast<size_t>(j)] / sv;
        const int64_t e = g * group + j;
        if (fp8) {
          crow[e] = e4m3_code(y);
        } else {
          const uint8_t q = e2m1_code(y);
          if (e % 2 == 0) crow[e / 2] = q;
          else crow[e / 2] = static_cast<uint8_t>(crow[e / 2] | (q << 4));
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace larder::quant
