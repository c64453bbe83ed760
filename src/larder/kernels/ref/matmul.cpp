// matmul.cpp — reference y = x·Wᵀ and per-format row dequantization.
//
// The matmul dequantizes one weight row at a time into f32 and takes its dot product with every
// token of the batch, so each weight byte is decoded once per call whatever n is. Block layouts
// follow ggml (quantization.md §9): Q8_0 = f16 d + 32 int8, value d·q; Q4_0 = f16 d + 16 bytes,
// element j in the low nibble of byte j and element j+16 in the high nibble, value d·(q − 8).
#include <cstring>
#include <vector>

#include "larder/core/status.h"
#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::ref {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // unaligned-safe; the mapping gives no alignment promise per row
  return v;
}

const uint8_t* row_ptr(const WeightView& w, int64_t row) {
  return w.data + static_cast<uint64_t>(row) * w.row_bytes();
}

}  // namespace

void dequant_q8_0(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ8_0);
    const float d = f16_to_f32(load_u16(blk));
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  }
}

void dequant_q4_0(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ4_0);
    const float d = f16_to_f32(load_u16(blk));
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = blk[2 + j];
      out[b * 32 + j] = d * static_cast<float>(static_cast<int>(byte & 0x0f) - 8);
      out[b * 32 + j + 16] = d * static_cast<float>(static_cast<int>(byte >> 4) - 8);
    }
  }
}

void dequant_row_f32(const WeightView& w, int64_t row, float* out) {
  std::memcpy(out, row_ptr(w, row), static_cast<size_t>(w.cols) * sizeof(float));
}

void dequant_row_f16(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = row_ptr(w, row);
  for (int64_t c = 0; c < w.cols; ++c) out[c] = f16_to_f32(load_u16(p + 2 * c));
}

void dequant_row_bf16(const WeightView& w, int64_t row, float* out) {
  const uint8_t* p = row_ptr(w, row);
  for (int64_t c = 0; c < w.cols; ++c) out[c] = bf16_to_f32(load_u16(p + 2 * c));
}

void dequant_row_q8_0(const WeightView& w, int64_t row, float* out) {
  dequant_q8_0(row_ptr(w, row), w.cols / 32, out);
}

void dequant_row_q4_0(const WeightView& w, int64_t row, float* out) {
  dequant_q4_0(row_ptr(w, row), w.cols / 32, out);
}

void matmul(const WeightView& w, const float* x, int64_t n, float* y) {
  const DequantRowFn deq = ref_table().dequant_row[static_cast<int>(w.dtype)];
  LARDER_CHECK(deq != nullptr && !w.is_affine(), "[kernels] ref matmul: no kernel for %s", dtype_name(w.dtype));
  matmul_rows(w, deq, x, n, y);
}

void matmul_rows(const WeightView& w, DequantRowFn deq, const float* x, int64_t n, float* y) {
  std::vector<float> wrow(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    deq(w, r, wrow.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(wrow[c]) * xt[c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace larder::kernels::ref
