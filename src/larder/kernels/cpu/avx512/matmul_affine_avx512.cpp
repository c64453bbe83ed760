// matmul_affine_avx512.cpp — MLX affine weights (2, 3, 4, 5, 6, 8 bits; groups 32/64/128;
// bf16/f16/f32 scales and biases) on the AVX-512 tier.
//
// Prefill (n >= 8) runs the 16-token-lane VNNI GEMM (gemm16_avx512.h): MLX codes are already
// unsigned, so they are vpdpbusd's u8 operand as they are, and each group's scale and bias are
// applied once per group: Σ_g [s_g·Σ_{b∈g} d_x,b·S_b + c_g·Σ_{b∈g} bs_b]. Decode (n < 8) stays on
// the AVX2 kernel, which already streams the weights at ≈ 85 % of one core's read bandwidth.
//
// Unpacking. A row is a little-endian bit stream (element i at bits [i·B, i·B + B)), so 8
// consecutive codes are B whole bytes, and BMI2's pdep with a mask of the low B bits of every
// byte deposits them into 8 bytes in natural order — one instruction for every width. The
// unpacking runs once per (8-row tile, chunk of token groups), not in the inner loop, so a scalar
// pdep per 8 codes costs little next to the chunk's vpdpbusd work. Only the B bytes that hold the
// codes are read: the last row may end at the end of the mapping.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

template <int B>
struct AffineRows {
  static constexpr int kZero = 0;
  static constexpr uint64_t kDeposit = (0x0101010101010101ull * ((1u << B) - 1u)) & ~uint64_t{0};

  const uint8_t* w;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  DType scale_dtype;
  int64_t ng, bpg;

  int64_t groups() const { return ng; }
  int64_t blocks_per_group() const { return bpg; }

  float scalar(const uint8_t* base, int64_t i) const {
    switch (scale_dtype) {
      case DType::kBF16: return bf16_to_f32(load_u16(base + 2 * i));
      case DType::kF16: return f16_table()[load_u16(base + 2 * i)];
      default: {
        float f;
        std::memcpy(&f, base + 4 * i, 4);
        return f;
      }
    }
  }

  void unpack(int64_t row, uint8_t* codes, float* scale, float* bias) const {
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const int64_t n8 = ng * bpg * 4;  // 8-code chunks in the row
    // 8-byte loads while they stay inside the row, then exact B-byte copies for the last chunks.
    const int64_t n8_wide = B == 8 ? n8 : std::max<int64_t>(0, n8 - (8 + B - 1) / B);
    int64_t j = 0;
    for (; j < n8_wide; ++j) {
      uint64_t v;
      std::memcpy(&v, p + j * B, 8);
      const uint64_t c = B == 8 ? v : _pdep_u64(v, kDeposit);
      std::memcpy(codes + 8 * j, &c, 8);
    }
    for (; j < n8; ++j) {
      uint64_t v = 0;
      std::memcpy(&v, p + j * B, B);
      const uint64_t c = _pdep_u64(v, kDeposit);
      std::memcpy(codes + 8 * j, &c, 8);
    }
    const uint64_t esz = scale_dtype == DType::kF32 ? 4 : 2;
    const uint8_t* sr = scales + static_cast<uint64_t>(row) * ng * esz;
    const uint8_t* br = biases + static_cast<uint64_t>(row) * ng * esz;
    for (int64_t g = 0; g < ng; ++g) {
      scale[g] = scalar(sr, g);
      bias[g] = scalar(br, g);
    }
  }
};

constexpr int64_t kGemmMinTokens = 8;

template <int B>
void gemm_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  const Acts16 a = quantize_acts16(x, n, w.cols);
  const AffineRows<B> f{w.data, w.row_bytes(), w.scales, w.biases, w.scale_dtype, w.cols / w.group_size,
                        w.group_size / 32};
  run_gemm16(f, a, w.rows, y);
}

}  // namespace

void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (n < kGemmMinTokens) {
    avx2::matmul_affine(w, x, n, y);
    return;
  }
  switch (w.bits) {
    case 2: gemm_affine<2>(w, x, n, y); break;
    case 3: gemm_affine<3>(w, x, n, y); break;
    case 4: gemm_affine<4>(w, x, n, y); break;
    case 5: gemm_affine<5>(w, x, n, y); break;
    case 6: gemm_affine<6>(w, x, n, y); break;
    case 8: gemm_affine<8>(w, x, n, y); break;
    default: LARDER_CHECK(false, "[kernels] avx512 matmul_affine: bits %d", w.bits);
  }
}

}  // namespace larder::kernels::cpu::avx512
