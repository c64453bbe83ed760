// affine.cpp — reference MLX affine group-quantized weights (quantization.md §2).
//
// A row of `cols` codes is a little-endian bit stream: element j occupies stream bits
// [j·bits, (j+1)·bits), least significant bit first, byte i holding stream bits 8i..8i+7 (the
// uint32 words of the file are a reinterpretation of those bytes). For bits ∈ {2, 4, 8} every
// code sits inside one byte; for 3, 5, 6 a code may straddle two bytes, never more (bits <= 8).
// Group k of a row (elements [k·g, (k+1)·g)) has one scale s and one bias b, stored in
// `scale_dtype`; the weight value is s·code + b, computed in f32 (mul then add, as mlx's CPU
// dequantize does).
#include <cstring>
#include <vector>

#include "larder/core/status.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {

float load_scale(const uint8_t* p, DType dt) {
  uint16_t h;
  switch (dt) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16: std::memcpy(&h, p, 2); return f16_to_f32(h);
    case DType::kBF16: std::memcpy(&h, p, 2); return bf16_to_f32(h);
    default: LARDER_CHECK(false, "[kernels] affine scales must be F32/F16/BF16, got %s", dtype_name(dt));
  }
  return 0;
}

}  // namespace

uint32_t affine_code(const uint8_t* row, int64_t j, int bits) {
  const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const uint64_t byte = bit >> 3;
  const unsigned shift = static_cast<unsigned>(bit & 7);
  uint32_t v = row[byte];
  if (shift + static_cast<unsigned>(bits) > 8) v |= static_cast<uint32_t>(row[byte + 1]) << 8;  // straddles
  return (v >> shift) & ((1u << bits) - 1u);
}

float affine_scale(const WeightView& w, int64_t row, int64_t group, bool bias) {
  const int64_t ng = w.cols / w.group_size;
  const uint64_t esz = dtype_info(w.scale_dtype).block_bytes;
  const uint8_t* base = bias ? w.biases : w.scales;
  return load_scale(base + static_cast<uint64_t>(row * ng + group) * esz, w.scale_dtype);
}

void dequant_row_affine(const WeightView& w, int64_t row, float* out) {
  LARDER_DCHECK(w.is_affine() && w.group_size > 0 && w.cols % w.group_size == 0, "affine view");
  const uint8_t* p = w.data + static_cast<uint64_t>(row) * w.row_bytes();
  const int64_t ng = w.cols / w.group_size;
  for (int64_t g = 0; g < ng; ++g) {
    const float s = affine_scale(w, row, g, false), b = affine_scale(w, row, g, true);
    for (int64_t j = g * w.group_size; j < (g + 1) * w.group_size; ++j) {
      const float q = static_cast<float>(affine_code(p, j, w.bits));
      // Two roundings, no FMA: the value mlx's dequantize produces. GCC contracts a*b + c into an
      // FMA in C++ (-ffp-contract=fast is its default outside ISO C) even across statements; the
      // empty asm makes the rounded product opaque to it.
      float sq = s * q;
      __asm__("" : "+x"(sq));
      out[j] = sq + b;
    }
  }
}

void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  LARDER_CHECK(w.is_affine(), "[kernels] ref matmul_affine on a non-affine view (%s)", dtype_name(w.dtype));
  matmul_rows(w, dequant_row_affine, x, n, y);
}

}  // namespace larder::kernels::ref
