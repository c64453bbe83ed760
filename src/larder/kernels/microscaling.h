// microscaling.h — the microscaling float weight formats: small floats sharing one scale per group
// (OCP MX v1.0: mxfp4 = e2m1 values × e8m0 scale per 32, mxfp8 = e4m3 values × e8m0 per 32;
// NVIDIA nvfp4 = e2m1 values × e4m3 scale per 16).
//
// Stored forms larder runs, all straight from the mapping:
//   DType::kMXFP4     GGUF (ggml type MXFP4, gpt-oss's experts): blocks of 32 = one e8m0 byte then
//                     16 bytes of nibbles, element j < 16 in the low nibble of byte j, element
//                     j + 16 in its high nibble (IQ4_NL's order); value = kFp4Values[q]·2^(e−128)
//                     (ggml's GGML_E8M0_TO_FP32_HALF with the values doubled, as gguf-py's quants).
//   DType::kMlxMXFP4  MLX mode "mxfp4" (mx.quantize): `data` = codes [rows, cols/2] bytes (the U32
//                     tensor's bytes: element j in nibble j%2 of byte j/2, low first), `scales` =
//                     U8 e8m0 [rows, cols/32]; value = e2m1(q)·2^(e−127), e = 255 → inf (as mlx).
//   DType::kMlxNVFP4  MLX mode "nvfp4": codes as mxfp4, `scales` = U8 e4m3 [rows, cols/16];
//                     value = e2m1(q)·e4m3(s). (mlx-lm's optional per-tensor `global_scale` of
//                     switch layers is refused at load.)
//   DType::kMlxMXFP8  MLX mode "mxfp8": `data` = e4m3 codes [rows, cols] bytes, `scales` = U8 e8m0
//                     [rows, cols/32]; value = e4m3(q)·2^(e−127).
// No biases in any of them. The e2m1 values doubled are the integers in kFp4Values (|v| <= 12), so
// an fp4 group is exactly int8 codes × one power-of-two (or e4m3) scale: the fast tiers run them on
// the int8 dot products of the other integer formats (activations quantized per 32-block).
// e4m3 values are not int8 under one scale, so mxfp8 runs in f32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "larder/core/dtype.h"

namespace larder::kernels {

// e2m1 code → value × 2 (sign bit 3; 0, 0.5, 1, 1.5, 2, 3, 4, 6 doubled).
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e − 127), MLX's e8m0 (e = 0 → 2^−127, a subnormal; e = 255 → +inf).
inline float e8m0_to_f32(uint8_t e) {
  const uint32_t u = e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 2^(e − 128): ggml's GGML_E8M0_TO_FP32_HALF (e = 0, 1 subnormal; e = 255 → 2^127).
inline float e8m0_half_to_f32(uint8_t e) {
  const uint32_t u = e < 2 ? (0x00200000u << e) : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// OCP e4m3 ("e4m3fn": bias 7, no infinities, S.1111.111 = NaN), exact in f32.
inline float e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -9);
  else v = std::ldexp(static_cast<float>(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

// The MLX microscaling dtypes (codes with a separate U8 scale tensor).
inline bool is_mlx_microscaling(DType d) {
  return d == DType::kMlxMXFP4 || d == DType::kMlxNVFP4 || d == DType::kMlxMXFP8;
}
// Elements per scale of an MLX microscaling dtype (0 for any other dtype).
inline int mlx_microscaling_group(DType d) {
  return d == DType::kMlxNVFP4 ? 16 : (d == DType::kMlxMXFP4 || d == DType::kMlxMXFP8) ? 32 : 0;
}
// The mlx mode name ("mxfp4", "nvfp4", "mxfp8") and its bits; nullptr / 0 for other dtypes.
inline const char* mlx_mode_name(DType d) {
  return d == DType::kMlxMXFP4 ? "mxfp4" : d == DType::kMlxNVFP4 ? "nvfp4" : d == DType::kMlxMXFP8 ? "mxfp8" : nullptr;
}
inline int mlx_mode_bits(DType d) { return d == DType::kMlxMXFP8 ? 8 : is_mlx_microscaling(d) ? 4 : 0; }

}  // namespace larder::kernels
