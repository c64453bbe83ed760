// kquant.cpp — reference decoding of the GGUF "K-quant" super-block formats (256 elements per
// block). Written from the format description (ggml's GGUF type table; quantization.md §9):
//
// Q4_K (144 B): f16 d | f16 dmin | 12 B scales | 128 B quants. Eight sub-blocks of 32, each with
//   a 6-bit scale sc_j and a 6-bit min m_j packed into the 12 bytes: for j < 4, sc_j = s[j] & 63
//   and m_j = s[j+4] & 63; for j >= 4, sc_j = (s[j+4] & 15) | (s[j-4] >> 6) << 4 and
//   m_j = (s[j+4] >> 4) | (s[j] >> 6) << 4 (the top bits of bytes 0..7 carry bits 4..5 of the
//   upper four). Quants: 64-element chunk c uses bytes 32c..32c+31; element 64c+l is the low
//   nibble of byte 32c+l (sub-block 2c), element 64c+32+l its high nibble (sub-block 2c+1).
//   value = (d·sc_j)·q − (dmin·m_j).
// Q5_K (176 B): as Q4_K with 32 B of high bits between scales and quants: bit g of byte l is the
//   fifth bit of element 32g+l.
// Q6_K (210 B): 128 B ql | 64 B qh | 16 int8 scales | f16 d. Sixteen sub-blocks of 16, scale
//   scales[e/16] for element e. Half h (elements 128h..128h+127) uses ql[64h..], qh[32h..]; for
//   l < 32 the four elements 128h + 32k + l (k = 0..3) take low bits from ql[64h + l] (k=0: low
//   nibble, k=2: high nibble) and ql[64h + 32 + l] (k=1: low, k=3: high), and their two high
//   bits from qh[32h + l] bits 2k..2k+1. value = (d·scale)·(q − 32), q in 0..63.
// Q2_K (84 B): 16 B scales | 64 B quants | f16 d | f16 dmin. Sixteen sub-blocks of 16: scale
//   scales[i] & 15, min scales[i] >> 4. Element e = 128h + 32s + l is bits 2s..2s+1 of
//   qs[32h + l]; value = (d·sc)·q − (dmin·m).
// Q3_K (110 B): 32 B hmask | 64 B quants | 12 B scales | f16 d. Low two bits as Q2_K; the third
//   bit is bit e/32 of hmask[e % 32], and a *clear* bit subtracts 4 (q = low − 4·(1 − bit), so
//   −4..3). Sixteen 6-bit scales: low four bits from byte i (i < 8, low nibble) or byte i − 8
//   (high nibble), high two bits are bits 2(i/4)..2(i/4)+1 of byte 8 + i % 4; the scale is that
//   minus 32. value = (d·scale)·q.
// IQ4_XS (136 B): f16 d | u16 scales_h | 4 B scales_l | 128 B codes. Eight sub-blocks of 32 laid
//   out like IQ4_NL blocks (bytes 16j..16j+15; element l < 16 low nibble, else high nibble of
//   byte l − 16); scale j = (low nibble j of scales_l | two bits 2j of scales_h << 4) − 32;
//   value = (d·scale)·kIq4Values[code].
// Q8_K is not a weight format in practice (ggml uses it for activations) and stays refused.
//
// The float expressions are evaluated in f32 in exactly this order (no contraction: the build
// is ISO C++, -ffp-contract=off), which is how gguf-py's numpy dequantizer computes them, so the
// decoded values are bit-identical to it (tests/ref/kquant_reference.py).
#include <cstring>

#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ref/ref_ops.h"

namespace larder::kernels::ref {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

const uint8_t* row_ptr(const WeightView& w, int64_t row) {
  return w.data + static_cast<uint64_t>(row) * w.row_bytes();
}

}  // namespace

void kquant_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequant_q4_k(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ4_K);
    const float d = f16_to_f32(load_u16(blk));
    const float dmin = f16_to_f32(load_u16(blk + 2));
    const uint8_t* s = blk + 4;
    const uint8_t* qs = blk + 16;
    float* o = out + b * 256;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      kquant_scale_min(s, j, &sc, &m);
      const float ds = d * static_cast<float>(sc);
      const float dm = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const float v = ds * static_cast<float>((q[l] >> shift) & 15);
        o[32 * j + l] = v - dm;
      }
    }
  }
}

void dequant_q5_k(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ5_K);
    const float d = f16_to_f32(load_u16(blk));
    const float dmin = f16_to_f32(load_u16(blk + 2));
    const uint8_t* s = blk + 4;
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + 48;
    float* o = out + b * 256;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      kquant_scale_min(s, j, &sc, &m);
      const float ds = d * static_cast<float>(sc);
      const float dm = dmin * static_cast<float>(m);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int code = ((q[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
        const float v = ds * static_cast<float>(code);
        o[32 * j + l] = v - dm;
      }
    }
  }
}

void dequant_q6_k(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ6_K);
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6_K, scales));
    const float d = f16_to_f32(load_u16(blk + offsetof(BlockQ6_K, d)));
    float* o = out + b * 256;
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t lo_byte = ql[64 * h + 32 * (k % 2) + l];
      const int lo = (lo_byte >> (4 * (k / 2))) & 15;
      const int hi = (qh[32 * h + l] >> (2 * k)) & 3;
      const int q = (lo | (hi << 4)) - 32;
      const float ds = d * static_cast<float>(sc[e / 16]);
      o[e] = ds * static_cast<float>(q);
    }
  }
}

void q3_k_scale(const uint8_t* s, int i, int* scale) {
  const int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  *scale = (lo | (hi << 4)) - 32;
}

void dequant_q2_k(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ2_K);
    const uint8_t* sc = blk + offsetof(BlockQ2_K, scales);
    const uint8_t* qs = blk + offsetof(BlockQ2_K, qs);
    const float d = f16_to_f32(load_u16(blk + offsetof(BlockQ2_K, d)));
    const float dmin = f16_to_f32(load_u16(blk + offsetof(BlockQ2_K, dmin)));
    float* o = out + b * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int q = (qs[32 * h + l] >> (2 * s)) & 3;
      const float dl = d * static_cast<float>(sc[e / 16] & 15);
      const float ml = dmin * static_cast<float>(sc[e / 16] >> 4);
      const float v = dl * static_cast<float>(q);
      o[e] = v - ml;
    }
  }
}

void dequant_q3_k(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockQ3_K);
    const uint8_t* hm = blk + offsetof(BlockQ3_K, hmask);
    const uint8_t* qs = blk + offsetof(BlockQ3_K, qs);
    const uint8_t* sc = blk + offsetof(BlockQ3_K, scales);
    const float d = f16_to_f32(load_u16(blk + offsetof(BlockQ3_K, d)));
    float* o = out + b * kQKK;
    for (int e = 0; e < kQKK; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int lo = (qs[32 * h + l] >> (2 * s)) & 3;
      const int bit = (hm[l] >> (e / 32)) & 1;
      const int q = lo - 4 * (1 - bit);
      int scale;
      q3_k_scale(sc, e / 16, &scale);
      const float dl = d * static_cast<float>(scale);
      o[e] = dl * static_cast<float>(q);
    }
  }
}

void dequant_iq4_xs(const uint8_t* src, int64_t blocks, float* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * sizeof(BlockIQ4_XS);
    const float d = f16_to_f32(load_u16(blk + offsetof(BlockIQ4_XS, d)));
    const int sh = load_u16(blk + offsetof(BlockIQ4_XS, scales_h));
    const uint8_t* sl = blk + offsetof(BlockIQ4_XS, scales_l);
    const uint8_t* qs = blk + offsetof(BlockIQ4_XS, qs);
    float* o = out + b * kQKK;
    for (int j = 0; j < 8; ++j) {
      const int ls = (((sl[j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
      const float dl = d * static_cast<float>(ls);
      const uint8_t* q = qs + 16 * j;
      for (int l = 0; l < 32; ++l) {
        const int code = l < 16 ? (q[l] & 15) : (q[l - 16] >> 4);
        o[32 * j + l] = dl * static_cast<float>(kIq4Values[code]);
      }
    }
  }
}

void dequant_row_q2_k(const WeightView& w, int64_t row, float* out) { dequant_q2_k(row_ptr(w, row), w.cols / 256, out); }
void dequant_row_q3_k(const WeightView& w, int64_t row, float* out) { dequant_q3_k(row_ptr(w, row), w.cols / 256, out); }
void dequant_row_iq4_xs(const WeightView& w, int64_t row, float* out) {
  dequant_iq4_xs(row_ptr(w, row), w.cols / 256, out);
}
void dequant_row_q4_k(const WeightView& w, int64_t row, float* out) { dequant_q4_k(row_ptr(w, row), w.cols / 256, out); }
void dequant_row_q5_k(const WeightView& w, int64_t row, float* out) { dequant_q5_k(row_ptr(w, row), w.cols / 256, out); }
void dequant_row_q6_k(const WeightView& w, int64_t row, float* out) { dequant_q6_k(row_ptr(w, row), w.cols / 256, out); }

}  // namespace larder::kernels::ref
