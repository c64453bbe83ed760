// quant32.cpp — reference decoding of the 32-element GGUF block formats beyond Q8_0/Q4_0:
// Q4_1, Q5_0, Q5_1 (linear codes) and IQ4_NL (codes index the kIq4Values codebook). Layouts
// and element order: kernels/gguf_blocks.h.
//
// Each value is computed in f32 in the order gguf-py's numpy dequantizer uses (d·q, then + m),
// with no contraction (the build is ISO C++, -ffp-contract=off), so the decoded rows are
// bit-identical to gguf.quants.dequantize (tests/ref/gguf_quants_reference.py).
#include <cstring>

#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {

template <class B>
B load_block(const uint8_t* p) {
  B b;
  std::memcpy(&b, p, sizeof(B));  // the mapping promises no alignment per block
  return b;
}

// Low four bits of element j of a 32-element block: j < 16 low nibble of qs[j], else high
// nibble of qs[j − 16].
int nibble(const uint8_t* qs, int j) { return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4); }

int fifth_bit(const uint8_t* qh, int j) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return static_cast<int>((h >> j) & 1u);
}

const uint8_t* row_ptr(const WeightView& w, int64_t row) {
  return w.data + static_cast<uint64_t>(row) * w.row_bytes();
}

}  // namespace

void dequant_q4_1(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const auto blk = load_block<BlockQ4_1>(src + b * sizeof(BlockQ4_1));
    const float d = f16_to_f32(blk.d), m = f16_to_f32(blk.m);
    for (int j = 0; j < kQK; ++j) {
      const float v = d * static_cast<float>(nibble(blk.qs, j));
      out[b * kQK + j] = v + m;
    }
  }
}

void dequant_q5_0(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const auto blk = load_block<BlockQ5_0>(src + b * sizeof(BlockQ5_0));
    const float d = f16_to_f32(blk.d);
    for (int j = 0; j < kQK; ++j) {
      const int q = (nibble(blk.qs, j) | (fifth_bit(blk.qh, j) << 4)) - 16;
      out[b * kQK + j] = d * static_cast<float>(q);
    }
  }
}

void dequant_q5_1(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const auto blk = load_block<BlockQ5_1>(src + b * sizeof(BlockQ5_1));
    const float d = f16_to_f32(blk.d), m = f16_to_f32(blk.m);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(blk.qs, j) | (fifth_bit(blk.qh, j) << 4);
      const float v = d * static_cast<float>(q);
      out[b * kQK + j] = v + m;
    }
  }
}

void dequant_iq4_nl(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const auto blk = load_block<BlockIQ4_NL>(src + b * sizeof(BlockIQ4_NL));
    const float d = f16_to_f32(blk.d);
    for (int j = 0; j < kQK; ++j) out[b * kQK + j] = d * static_cast<float>(kIq4Values[nibble(blk.qs, j)]);
  }
}

void dequant_row_q4_1(const WeightView& w, int64_t row, float* out) { dequant_q4_1(row_ptr(w, row), w.cols / kQK, out); }
void dequant_row_q5_0(const WeightView& w, int64_t row, float* out) { dequant_q5_0(row_ptr(w, row), w.cols / kQK, out); }
void dequant_row_q5_1(const WeightView& w, int64_t row, float* out) { dequant_q5_1(row_ptr(w, row), w.cols / kQK, out); }
void dequant_row_iq4_nl(const WeightView& w, int64_t row, float* out) {
  dequant_iq4_nl(row_ptr(w, row), w.cols / kQK, out);
}

}  // namespace larder::kernels::ref
