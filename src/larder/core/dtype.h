// dtype.h — element types of stored tensors, and scalar fp16/bf16 conversions.
//
// Quantized GGUF types are block types: `block_elems` elements share one scale (see
// ggml's docs/gguf.md); their byte size is per block (layouts: kernels/gguf_blocks.h). MLX affine weights are not a dtype of
// their own: they are a packed uint32 tensor plus scales/biases tensors (formats/, quant/). MLX's
// microscaling modes (mxfp4, nvfp4, mxfp8) are: their code stream has a dtype of its own here, so
// the kernels dispatch on it, with the scales beside it (kernels/microscaling.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace larder {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI8,
  kU8,
  kI16,
  kI32,
  kU32,
  kI64,
  kF64,
  kBool,
  kQ8_0,  // GGUF: 32 elems, f16 scale + 32 x int8 = 34 bytes
  kQ4_0,  // GGUF: 32 elems, f16 scale + 16 bytes of nibbles = 18 bytes
  kQ4_1,  // GGUF: 32 elems, f16 d + f16 m + 16 bytes of nibbles = 20 bytes
  kQ5_0,  // GGUF: 32 elems, 22 bytes
  kQ5_1,  // GGUF: 32 elems, 24 bytes
  kQ2_K,  // GGUF: 256 elems, 84 bytes
  kQ3_K,  // GGUF: 256 elems, 110 bytes
  kQ4_K,  // GGUF: 256 elems, 144 bytes
  kQ5_K,  // GGUF: 256 elems, 176 bytes
  kQ6_K,  // GGUF: 256 elems, 210 bytes
  kQ8_K,
  kIQ4_NL,  // GGUF: 32 elems, f16 d + 16 bytes of codebook nibbles = 18 bytes
  kIQ4_XS,  // GGUF: 256 elems, 136 bytes
  // Microscaling floats (kernels/microscaling.h). GGUF MXFP4: 32 elems, e8m0 byte + 16 bytes of
  // e2m1 nibbles = 17 bytes. The MLX modes are codes only — the per-group uint8 scales are a
  // tensor of their own (WeightView::scales) — so their "block" is what one byte holds.
  kMXFP4,      // GGUF (ggml type 39)
  kMlxMXFP4,   // MLX mode "mxfp4": e2m1 codes, 2 per byte (scales: e8m0 per 32)
  kMlxNVFP4,   // MLX mode "nvfp4": e2m1 codes, 2 per byte (scales: e4m3 per 16)
  kMlxMXFP8,   // MLX mode "mxfp8": e4m3 codes, 1 per byte (scales: e8m0 per 32)
  kUnknown,
};

struct DTypeInfo {
  const char* name;
  uint32_t block_elems;  // 1 for plain types
  uint32_t block_bytes;  // bytes per block (= element size for plain types)
};

const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
inline bool dtype_is_block(DType t) { return dtype_info(t).block_elems > 1; }
// Bytes for n elements; n must be a multiple of the block size for block types.
inline uint64_t dtype_bytes(DType t, uint64_t n) {
  const DTypeInfo& i = dtype_info(t);
  return n / i.block_elems * i.block_bytes;
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN stays NaN (as torch / MLX convert).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE half <-> float, scalar (the reference; F16C is used by the fast kernels).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace larder
