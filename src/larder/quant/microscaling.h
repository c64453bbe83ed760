// microscaling.h — MLX's microscaling float quantizers (modes "mxfp4", "nvfp4", "mxfp8"; layouts in
// kernels/microscaling.h), byte-identical to mlx's CPU `mx.quantize(w, mode=…)`
// (tests/unit/quant/microscaling_quant_test.cpp against mlx itself). Per group, in f32:
//   amax = max |w|;
//   mxfp4 / mxfp8: the e8m0 scale is the smallest power of two 2^(e−127) >= amax / M (M = 6 for
//     e2m1, 448 for e4m3; amax = 0 → e = 127);
//   nvfp4: the e4m3 scale is amax / 6 rounded to nearest-even e4m3;
//   y = w / scale (f32 division; a zero scale gives y = 0);
//   e2m1 code: the number of the midpoints {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} that |y| exceeds
//     strictly (ties go toward zero), the sign bit only on a nonzero magnitude;
//   e4m3 code: |y| rounded to nearest-even e4m3 (subnormals included), the sign of y kept (−0 → 0x80).
#pragma once

#include <cstdint>

#include "larder/core/dtype.h"
#include "larder/core/status.h"

namespace larder::quant {

// Quantizes a row-major [rows, cols] matrix of `dtype` (F32, F16, BF16) into `fmt`
// (DType::kMlxMXFP4 / kMlxNVFP4 / kMlxMXFP8): codes = rows · cols·bits/8 bytes (mlx's U32 words'
// bytes), scales = rows · cols/group bytes. cols must be a multiple of the mode's group.
Status quantize_microscaling(const void* src, DType dtype, int64_t rows, int64_t cols, DType fmt, uint8_t* codes,
                             uint8_t* scales);

// The e2m1 code of y and the e4m3 code of y as described above (shared with tests).
uint8_t e2m1_code(float y);
uint8_t e4m3_code(float y);

}  // namespace larder::quant
