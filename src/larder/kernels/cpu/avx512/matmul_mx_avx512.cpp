// matmul_mx_avx512.cpp — GGUF MXFP4 and MLX mxfp4 / nvfp4 on the AVX-512 VNNI tier: row adapters of
// the shared token-lane GEMM (gemm16_avx512.h) over the codes of cpu/common/mx_unpack.h, made
// unsigned for vpdpbusd (u = w + 128). mxfp4 (one power-of-two scale per 32-block) is the GEMM's
// zero-point mode, kZero = 128 — Q8_0's arithmetic with the e8m0 scale in place of the f16 one;
// nvfp4 (an e4m3 scale per 16) its half-block mode with the zero folded into the integer sums
// (kHalfZero = 128, as Q6_K's 32).
//
// Decode (n < kGemm16MinTokens) runs the AVX2 tile kernel (matmul_mx_avx2.cpp): Gemv16, the GEMM's
// arithmetic with rows in the lanes, measured 394 µs CPU against the AVX2 kernel's ~1/3 of that at
// 2048x2048, n = 1 (bench/RESULTS.md), so it serves only batch_invariant_decode(), where a token's
// row must be the same bits in decode and prefill (kernels/batch_invariance.h). mxfp8 has no
// AVX-512 kernel: e4m3 values are not int8 under one scale; the tier runs the AVX2 f32 one.
#include <immintrin.h>

#include "larder/core/status.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/mx_unpack.h"

namespace larder::kernels::cpu::avx512 {

namespace {

// u = w + 128 (no namespace-scope vector constant: its initializer would run on any CPU).
inline __m256i flip(__m256i v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }

struct Mxfp4GgufRows : PackedRows {
  static constexpr int kZero = 128;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const uint8_t* p = packed(row);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + 17 * b;
      scale[b] = e8m0_half_to_f32(blk[0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::gguf_codes(blk + 1)));
    }
  }
  static Mxfp4GgufRows of(const WeightView& v) { return {{v.data, v.row_bytes(), v.cols / 32}}; }
};

// MLX's fp4 layouts: the codes' rows and, beside them, a row of scale bytes per weight row.
struct MlxFp4Rows : PackedRows {
  const uint8_t* sc;
  uint64_t sc_row_bytes;
  const uint8_t* scales(int64_t r) const { return sc + static_cast<uint64_t>(r) * sc_row_bytes; }
  static MlxFp4Rows of(const WeightView& v) {
    return {{v.data, v.row_bytes(), v.cols / 32}, v.scales, v.scale_row_bytes()};
  }
};

struct MlxMxfp4Rows : MlxFp4Rows {
  static constexpr int kZero = 128;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const uint8_t* p = packed(row);
    const uint8_t* s = scales(row);
    for (int64_t b = 0; b < nb; ++b) {
      scale[b] = 0.5f * e8m0_to_f32(s[b]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::mlx_codes(p + 16 * b)));
    }
  }
  static MlxMxfp4Rows of(const WeightView& v) { return {MlxFp4Rows::of(v)}; }
};

struct MlxNvfp4Rows : MlxFp4Rows {
  static constexpr int kZero = -1;
  static constexpr int kHalfZero = 128;  // bias = −128·scale, folded into the integer half sums
  int64_t groups() const { return 2 * nb; }  // 16-element halves
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const uint8_t* p = packed(row);
    const uint8_t* s = scales(row);
    const float* h = mx::e4m3_half_table();
    for (int64_t b = 0; b < nb; ++b) {
      for (int i = 0; i < 2; ++i) {
        scale[2 * b + i] = h[s[2 * b + i]];
        bias[2 * b + i] = -128.0f * scale[2 * b + i];
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::mlx_codes(p + 16 * b)));
    }
  }
  static MlxNvfp4Rows of(const WeightView& v) { return {MlxFp4Rows::of(v)}; }
};

template <class R>
void run(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, MatmulFn decode) {
  if (n <= 0) return;
  const auto make = [](const WeightView& v) { return R::of(v); };
  if (n >= kGemm16MinTokens) return gemm16(ws, ys, count, x, n, make);
  if (batch_invariant_decode()) return gemv16(ws, ys, count, x, n, make);
  for (int i = 0; i < count; ++i) decode(ws[i], x, n, ys[i]);
}

}  // namespace

void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<Mxfp4GgufRows>(&w, &y, 1, x, n, avx2::matmul_mxfp4);
}
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<MlxMxfp4Rows>(&w, &y, 1, x, n, avx2::matmul_mlx_mxfp4);
}
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<MlxNvfp4Rows>(&w, &y, 1, x, n, avx2::matmul_mlx_nvfp4);
}
void matmul_multi_mx(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].dtype) {
    case DType::kMXFP4: return run<Mxfp4GgufRows>(ws, ys, count, x, n, avx2::matmul_mxfp4);
    case DType::kMlxMXFP4: return run<MlxMxfp4Rows>(ws, ys, count, x, n, avx2::matmul_mlx_mxfp4);
    case DType::kMlxNVFP4: return run<MlxNvfp4Rows>(ws, ys, count, x, n, avx2::matmul_mlx_nvfp4);
    default: LARDER_CHECK(false, "[kernels] avx512 matmul_multi_mx: %s", dtype_name(ws[0].dtype));
  }
}

}  // namespace larder::kernels::cpu::avx512
