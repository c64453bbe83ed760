// gguf_blocks.h — byte layouts of the GGUF block quantization formats, one struct per format.
//
// The single place the kernels take block sizes and field offsets from: every kernel uses
// sizeof(Block...) / offsetof(...) instead of bare byte counts, and the static_asserts below tie
// each struct to the size core/dtype.cpp (and ggml's GGUF type table) gives the format.
//
// Fields are stored little-endian as in the file; `uint16_t d` fields are IEEE half floats.
// The structs describe layout only: mapped tensor data carries no alignment promise beyond the
// GGUF alignment of the tensor start, so kernels read multi-byte fields with memcpy (or unaligned
// vector loads) at these offsets rather than dereferencing a Block pointer into the mapping.
//
// Element order within a block (what the scalar references in kernels/ref/ implement, bit for
// bit like gguf-py's numpy dequantizer):
//   Q4_0, Q4_1, IQ4_NL  (32): element j < 16 is the low nibble of qs[j], j >= 16 the high nibble
//                             of qs[j − 16].
//   Q5_0, Q5_1          (32): as Q4_x for the low four bits; bit 4 of element j is bit j of the
//                             little-endian uint32 qh.
//   Q8_0                (32): qs[j].
//   Q2_K               (256): element e = 128h + 32s + l takes bits 2s..2s+1 of qs[32h + l];
//                             sub-block e/16 has scale scales[e/16] & 15 and min scales[e/16] >> 4.
//   Q3_K               (256): low two bits as Q2_K; bit 2 is set when bit (e/32) of hmask[e%32]
//                             is *clear* (value q − 4); sixteen 6-bit signed scales (− 32) packed
//                             into 12 bytes (see ref/kquant.cpp).
//   Q4_K, Q5_K, Q6_K   (256): see ref/kquant.cpp.
//   IQ4_XS             (256): eight sub-blocks of 32, each laid out like one IQ4_NL block's codes
//                             (qs[16j .. 16j+15]); 6-bit signed scales (− 32): low four bits in
//                             scales_l, high two in scales_h.
// IQ4_NL and IQ4_XS codes index the non-linear codebook kIq4Values instead of being linear.
#pragma once

#include <cstddef>
#include <cstdint>

namespace larder::kernels {

constexpr int kQK = 32;    // elements per block of the 32-element formats
constexpr int kQKK = 256;  // elements per K-quant / IQ4_XS super-block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d, m;  // value = d·q + m
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;  // value = d·(q − 16)
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;  // value = d·q + m
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble scale, high nibble min, per 16 elements
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(offsetof(BlockQ5_0, qs) == 6 && offsetof(BlockQ5_1, qs) == 8);
static_assert(offsetof(BlockQ2_K, d) == 80 && offsetof(BlockQ3_K, d) == 108 && offsetof(BlockQ6_K, d) == 208);
static_assert(offsetof(BlockQ4_K, qs) == 16 && offsetof(BlockQ5_K, qh) == 16 && offsetof(BlockQ5_K, qs) == 48);
static_assert(offsetof(BlockIQ4_XS, qs) == 8);

// The IQ4_NL / IQ4_XS codebook: code c (0..15) means kIq4Values[c] · scale.
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

}  // namespace larder::kernels
