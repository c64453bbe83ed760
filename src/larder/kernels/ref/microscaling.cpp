// microscaling.cpp — reference decoding of the microscaling float formats (layouts and value
// conventions: kernels/microscaling.h). Every value is a product of a small float and a scale whose
// mantissas fit f32 together, so it is exact: these rows equal gguf-py's and mlx's dequantization
// bit for bit (tests/unit/kernels/ref_microscaling_test.cpp).
#include <cstring>

#include "larder/kernels/microscaling.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {
const uint8_t* row_ptr(const WeightView& w, int64_t row) {
  return w.data + static_cast<uint64_t>(row) * w.row_bytes();
}
const uint8_t* scale_row(const WeightView& w, int64_t row) {
  return w.scales + static_cast<uint64_t>(row) * w.scale_row_bytes();
}
// Element j of an MLX fp4 row: nibble j % 2 of byte j / 2.
int mlx_nibble(const uint8_t* p, int64_t j) { return (p[j / 2] >> (4 * (j % 2))) & 15; }
}  // namespace

void dequant_mxfp4(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * 17;
    const float d = e8m0_half_to_f32(blk[0]);
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + j] = static_cast<float>(kFp4Values[blk[1 + j] & 15]) * d;
      out[b * 32 + j + 16] = static_cast<float>(kFp4Values[blk[1 + j] >> 4]) * d;
    }
  }
}

void dequant_row_mxfp4(const WeightView& w, int64_t row, float* out) { dequant_mxfp4(row_ptr(w, row), w.cols / 32, out); }

void dequant_row_mlx_mxfp4(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = row_ptr(w, row);
  const uint8_t* s = scale_row(w, row);
  for (int64_t j = 0; j < w.cols; ++j)
    out[j] = 0.5f * static_cast<float>(kFp4Values[mlx_nibble(p, j)]) * e8m0_to_f32(s[j / 32]);
}

void dequant_row_mlx_nvfp4(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = row_ptr(w, row);
  const uint8_t* s = scale_row(w, row);
  for (int64_t j = 0; j < w.cols; ++j)
    out[j] = 0.5f * static_cast<float>(kFp4Values[mlx_nibble(p, j)]) * e4m3_to_f32(s[j / 16]);
}

void dequant_row_mlx_mxfp8(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = row_ptr(w, row);
  const uint8_t* s = scale_row(w, row);
  for (int64_t j = 0; j < w.cols; ++j) out[j] = e4m3_to_f32(p[j]) * e8m0_to_f32(s[j / 32]);
}

}  // namespace larder::kernels::ref
