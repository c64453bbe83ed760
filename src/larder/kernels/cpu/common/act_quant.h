// act_quant.h — activations quantized once per matmul into int8 blocks (performance.md §4 rule 1).
//
// Every integer matmul (Q8_0, Q4_0 weights) first turns x[n, cols] into 32-element int8 blocks
// with one f32 scale each, then does int8·int8 dot products against the weight blocks. One pass
// over x per matmul, reused by every weight row.
//
// Quantizer (identical in the scalar reference below and in the SIMD versions, so tests can
// reproduce the kernel's integer inputs bit for bit):
//   amax = max |x_i| over the block;  d = amax / 127;  id = d ? 1/d : 0;  q_i = nearbyint(x_i·id)
// so |q_i| <= 127 and |x_i − d·q_i| <= d/2. Unlike ggml's Q8_0 activation blocks the scale stays
// f32 (not f16): no second rounding, and the error bound in the tests is exactly d/2 per element.
//
// Layout (chosen for the kernels' loads, not for storage):
//   qs    [n][nb][32] int8 — one 32-byte load per (token, block).
//   d     [nb][n_pad] f32  — block-major, so the scales of 4 consecutive tokens of one block are
//                            one 16-byte load; n_pad = round_up(n, 8), padding zeroed.
//   bsum  [nb][n_pad] f32  — d·Σq per (block, token), same layout. Kernels that feed an unsigned
//                            weight code u = q_w + z to the unsigned operand fold the zero point
//                            out with it: Σ (u − z)·q = Σ u·q − z·Σ q.
// offset128: store q + 128 as uint8 instead (the AVX-512 VNNI path feeds activations to
// vpdpbusd's unsigned operand).
#pragma once

#include <cstddef>
#include <cstdint>

namespace larder::kernels::cpu {

struct QuantizedActs {
  int64_t n = 0, nb = 0, n_pad = 0;
  int8_t* qs = nullptr;
  float* d = nullptr;
  float* bsum = nullptr;

  const int8_t* token_blocks(int64_t t) const { return qs + t * nb * 32; }
  const float* scales(int64_t b) const { return d + b * n_pad; }
  const float* sums(int64_t b) const { return bsum + b * n_pad; }
};

// Bytes of scratch quantize needs for n tokens of cols (a multiple of 32) columns.
size_t quantized_acts_bytes(int64_t n, int64_t cols);

// Lays out a QuantizedActs inside `scratch` (64-byte aligned, quantized_acts_bytes() long).
QuantizedActs quantized_acts_view(void* scratch, int64_t n, int64_t cols);

// Scalar reference of the quantizer (the SIMD tiers must produce the same bytes).
void quantize_acts_ref(const float* x, int64_t n, int64_t cols, bool offset128, QuantizedActs& out);

// The same quantizer in AVX2 (kernels/cpu/avx2/act_quant_avx2.cpp); byte-identical output.
void quantize_acts_avx2(const float* x, int64_t n, int64_t cols, bool offset128, QuantizedActs& out);

// Token-lane layout for the GEMMs (n >= 8): act8[g][b][k4] = 32 bytes holding, for the 8 tokens
// t = 8g..8g+7, the 4 activation bytes x_q[t][32b + 4k4 .. +3]; tokens past n are zero bytes.
// act8 must hold n_pad·nb·32 bytes (64-byte aligned). Bytes are copied as stored (offset128 too).
void build_act8(const QuantizedActs& a, int64_t n, uint8_t* act8);

// Super-block activations for the K-quant and IQ4_XS decode kernels (n <= 8), like ggml's Q8_K:
// one f32 scale per 256 values (the quantizer above, over 256 instead of 32: d = amax/127,
// q = nearbyint(x/d)) and the int16 sums of q over each 16 values. With one activation scale per
// weight super-block the whole super-block's dot product is one integer (the weight sub-block
// scales ride in vpmaddwd/vpdpwssd multipliers), converted and scaled once per 256 weights
// instead of once per 32: the float work of the decode inner loop goes away. The price is a
// coarser activation grid (|x − d·q| <= d/2 with d from the amax of 256 values, not 32) — the
// same trade llama.cpp makes for these formats. Layout, token-major for the decode tiles:
//   qs    [n][cols]      int8, element order
//   d     [n][cols/256]  f32
//   bsum  [n][cols/16]   int16 (|Σ| <= 16·127, exact)
struct QuantizedActsK {
  int64_t n = 0, nsb = 0;
  int8_t* qs = nullptr;
  float* d = nullptr;
  int16_t* bsum = nullptr;

  const int8_t* token(int64_t t) const { return qs + t * nsb * 256; }
  const float* scales(int64_t t) const { return d + t * nsb; }
  const int16_t* sums16(int64_t t) const { return bsum + t * nsb * 16; }
};

// Two int16 values as one int32 lane, lo in the low half: the operand layout of vpmaddwd /
// vpdpwssd, with which the super-block GEMMs multiply packed block sums by packed scales or mins.
constexpr int32_t pack_i16_pair(int lo, int hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16) | static_cast<uint16_t>(lo));
}

// Bytes of scratch for n tokens of cols (a multiple of 256) columns, and the view inside it.
size_t quantized_acts_k_bytes(int64_t n, int64_t cols);
QuantizedActsK quantized_acts_k_view(void* scratch, int64_t n, int64_t cols);

// Scalar reference and AVX2 version (byte-identical output).
void quantize_acts_k_ref(const float* x, int64_t n, int64_t cols, QuantizedActsK& out);
void quantize_acts_k_avx2(const float* x, int64_t n, int64_t cols, QuantizedActsK& out);

// x quantized by the AVX2 quantizers above into the calling thread's scratch slot 0: the first
// step of every integer matmul of the AVX2 and AVX-512 tiers (act_quant_avx2.cpp). Kernels then
// derive their own per-token layouts (act8, permutations, sums) into the other slots.
QuantizedActs quantize_acts_scratch(const float* x, int64_t n, int64_t cols, bool offset128 = false);
QuantizedActsK quantize_acts_k_scratch(const float* x, int64_t n, int64_t cols);

// A thread-local, 64-byte-aligned, grow-only scratch buffer: kernels must not own long-lived
// memory (system.md §3), and reallocating per matmul would cost a page fault per 4 KiB.
// Slots 0–3 hold per-matmul data prepared by the calling thread (which also runs chunks of the
// pool's jobs); slots 4–5 are for per-chunk data inside pool chunks, so they never alias them.
constexpr int kScratchSlots = 6;
void* thread_scratch(size_t bytes, int slot = 0);

// Bytes rounded up to whole 64-byte lines: how kernels cut one scratch buffer into aligned parts.
inline size_t round_up64(size_t v) { return (v + 63) / 64 * 64; }

}  // namespace larder::kernels::cpu
