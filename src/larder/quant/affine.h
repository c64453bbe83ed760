// affine.h — MLX affine quantization (mode "affine"), byte-identical to MLX's CPU quantizer.
//
// Rules (docs: shared/design/quantization.md §2): groups of `group_size` consecutive elements
// along the last axis share one (scale, bias); per group, in f32:
//   lo/hi = min/max, s = max((hi - lo) / n, 1e-7) with n = 2^bits - 1, the extreme of larger
//   magnitude is the "edge" (ties go to hi, which flips the sign of s), q0 = rint(edge / s);
//   if q0 != 0: s = edge / q0, bias = edge, else bias = 0; codes = clamp(rint((w - bias) / s), 0, n)
//   with the f32 s and bias; scale and bias are then stored in the weight's dtype.
// Packing: a row's codes form a little-endian bit stream, element e at bits [e*bits, e*bits+bits).
#pragma once

#include <cstdint>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::quant {

// bits in {2,3,4,5,6,8}, group_size in {32,64,128}, cols % group_size == 0.
Status check_affine_params(int bits, int group_size, int64_t cols);

inline int64_t affine_words_per_row(int64_t cols, int bits) { return cols * bits / 32; }
inline int64_t affine_groups_per_row(int64_t cols, int group_size) { return cols / group_size; }

// Quantizes a row-major [rows, cols] matrix of `dtype` (kF32, kF16 or kBF16).
// packed: rows * affine_words_per_row(cols, bits) words; scales / biases: rows * cols / group_size
// elements of `dtype` each (raw storage: 2 bytes for f16/bf16, 4 for f32).
Status quantize_affine(const void* src, DType dtype, int64_t rows, int64_t cols, int bits,
                       int group_size, uint32_t* packed, void* scales, void* biases);

// Dequantizes to f32: w = scale * q + bias (scales/biases in `dtype`).
Status dequantize_affine(const uint32_t* packed, const void* scales, const void* biases, DType dtype,
                         int64_t rows, int64_t cols, int bits, int group_size, float* out);

// quantize → dequantize (the weights a quantized module computes with), as f32, rows split over
// `threads` (0: all cores). The sensitivity probes and the weight-error proxy both start here.
Status fake_quantize_affine(const void* src, DType dtype, int64_t rows, int64_t cols, int bits, int group_size,
                            int threads, float* out);

// Helpers for the stored dtypes.
float load_float(const void* p, DType dtype, int64_t i);
void store_float(void* p, DType dtype, int64_t i, float v);

}  // namespace larder::quant
