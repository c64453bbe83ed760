// matmul_avx512.cpp — the AVX-512 (F/BW/VL/DQ + VNNI + BF16) tier: Q8_0, Q4_0 and BF16 matmul.
// Compiled with the AVX-512 flags (src/larder/CMakeLists.txt); called only after
// cpu_features().has_avx512_tier() (common/register.cpp). F16/F32 stay on the AVX2 tier.
//
// Prefill (n >= 8) of Q8_0 and Q4_0 runs the 16-token-lane VNNI GEMM (gemm16_avx512.h).
// Decode (n < 8):
// - Q8_0: vpdpbusd (u8 × s8, 4-way sum into i32) replaces AVX2's sign/maddubs/madd triple with
//   one instruction per 32-value pair. The unsigned operand is the activation stored as q + 128
//   (act_quant.h, offset128), the signed operand the weight, and the +128 bias is folded out per
//   weight block by seeding the accumulator with −128·Σw (one extra vpdpbusd per weight block,
//   shared by all T tokens):   Σ (q+128)·w − 128·Σ w = Σ q·w. Both operands stay in their natural
//   32-byte blocks (ymm, AVX512VL); R=8, T=1 tiles for one token, R=4, T=4 otherwise. Measured
//   at ≈ 100 % of one core's read bandwidth (Zen 5).
// - Q4_0: the AVX2 row-pair kernel (see matmul_q4_0 below).
//
// BF16: activations are rounded to bf16 once per matmul; vdpbf16ps (zmm, 32 pairs per
// instruction, f32 accumulation) gives twice the FP32 FMA rate on Zen 4 (performance.md §2.1).
// The extra error is the activation rounding, ≤ 2^-9 relative per element.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

struct Q8_0Block {
  static constexpr int kBytes = 34;
  static __m256i load(const uint8_t* blk) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  }
};

template <class WB>
struct IntKernel {
  static constexpr int kRows1 = 8;
  static constexpr int kRowsN = 4;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb;
  QuantizedActs a;  // offset128: q + 128 as u8
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const int8_t* xq[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xq[t] = a.token_blocks(t0 + t);
    __m256 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const __m256i k128 = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i zero = _mm256_setzero_si256();
    float sc[R * 4];  // scale products d_w·d_x, [row][token]
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wv[R], seed[R];
      const __m128 dx = _mm_loadu_ps(a.scales(b) + t0);
      prefetch_ahead(wr[0], R * row_bytes, b * WB::kBytes * R, WB::kBytes * R);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = wr[r] + b * WB::kBytes;
        wv[r] = WB::load(blk);
        seed[r] = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, k128, wv[r]));
        _mm_storeu_ps(sc + 4 * r, _mm_mul_ps(f16_bcast4(blk), dx));
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256 f = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed[r], xv, wv[r]));
          acc[r][t] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(sc + 4 * r + t), acc[r][t]);
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum(acc[r][t]);
  }
};

template <class WB>
void matmul_int(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  void* scratch = thread_scratch(quantized_acts_bytes(n, w.cols));
  QuantizedActs a = quantized_acts_view(scratch, n, w.cols);
  quantize_acts_avx2(x, n, w.cols, /*offset128=*/true, a);
  IntKernel<WB> k{w.data, w.row_bytes(), w.rows, w.cols / 32, a, y};
  run_matmul_tiles(k, w.rows, n, w.cols + 4 * (w.cols / 32));
}

// Prefill (n >= 8): the 16-token-lane VNNI GEMM of gemm16_avx512.h. Both formats become
// unsigned byte codes with a per-block scale and a constant zero point: Q4_0 codes are its
// nibbles (w = d·(u − 8)); Q8_0 bytes get their sign bit flipped, u = q + 128 ∈ [0, 255]
// (w = d·(u − 128)), so signed weights need no sign trick and no per-block Σw: the zero point
// folds out with the activation block sums like Q4_0's.
struct Q4_0Rows {
  static constexpr int kZero = 8;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nb;
  int64_t groups() const { return nb; }
  int64_t blocks_per_group() const { return 1; }
  const uint8_t* row_data(int64_t row) const { return w + static_cast<uint64_t>(row) * row_bytes; }
  uint64_t row_stride() const { return row_bytes; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + b * 18;
      scale[b] = f16[load_u16(blk)];
      // Byte j: element j in the low nibble, j + 16 in the high one.
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + stride * b), _mm_and_si128(v, m4));
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + stride * b + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    }
  }
};

struct Q8_0Rows {
  static constexpr int kZero = 128;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nb;
  int64_t groups() const { return nb; }
  int64_t blocks_per_group() const { return 1; }
  const uint8_t* row_data(int64_t row) const { return w + static_cast<uint64_t>(row) * row_bytes; }
  uint64_t row_stride() const { return row_bytes; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + b * 34;
      scale[b] = f16[load_u16(blk)];
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + stride * b), _mm256_xor_si256(v, flip));
    }
  }
};

template <class F>
void matmul_gemm(const WeightView& w, const float* x, int64_t n, float* y) {
  const Acts16 a = quantize_acts16(x, n, w.cols);
  const F f{w.data, w.row_bytes(), w.cols / 32};
  run_gemm16(f, a, w.rows, y);
}

constexpr int64_t kGemmMinTokens = 8;

// Own reduction: GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized in its own header.
inline float hsum512(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

struct BF16Kernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 4;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, cols, cols32;
  const uint16_t* xb;  // [n][cols32] bf16, zero-padded
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const uint16_t* xt[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xt[t] = xb + (t0 + t) * cols32;
    __m512 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    auto step = [&](int64_t c, __mmask32 m) {
      prefetch_ahead(wr[0], R * row_bytes, 64 * c / 32 * R, 64 * R);
      __m512i wv[R];
      // Masked on the tail: the last row may end at the end of the mapping.
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(m, wr[r] + 2 * c);
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_load_si512(xt[t] + c);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(wv[r]), as_bh(xv));
      }
    };
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) step(c, ~__mmask32{0});
    if (c < cols) step(c, static_cast<__mmask32>((uint64_t{1} << (cols - c)) - 1));
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum512(acc[r][t]);
  }
};

}  // namespace

void matmul_q8_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gemm<Q8_0Rows>(w, x, n, y);
  } else {
    matmul_int<Q8_0Block>(w, x, n, y);
  }
}
void matmul_q4_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gemm<Q4_0Rows>(w, x, n, y);
  } else {
    // The AVX2 row-pair kernel streams Q4_0 at ≈ 90 % of a core's read bandwidth (Zen 5); the
    // 8-row vpdpbusd tile here reached 47–59 % (kernel_bench decode, 1 thread).
    avx2::matmul_q4_0(w, x, n, y);
  }
}

void matmul_bf16(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t cols = w.cols, cols32 = (cols + 31) / 32 * 32;
  auto* xb = static_cast<uint16_t*>(thread_scratch(static_cast<size_t>(n * cols32) * 2, 1));
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    for (int64_t c = 0; c < cols32; c += 32) {
      const int64_t left = cols - c;
      const __mmask16 m0 = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << std::max<int64_t>(left, 0)) - 1);
      const __mmask16 m1 = left >= 32 ? 0xffff : static_cast<__mmask16>((1u << std::max<int64_t>(left - 16, 0)) - 1);
      const __m512 lo = _mm512_maskz_loadu_ps(m0, xt + c);
      const __m512 hi = _mm512_maskz_loadu_ps(m1, xt + c + 16);
      __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);  // low half from `lo` (elements c..c+15)
      _mm512_store_si512(xb + t * cols32 + c, reinterpret_cast<__m512i&>(v));
    }
  }
  BF16Kernel k{w.data, w.row_bytes(), w.rows, cols, cols32, xb, y};
  run_matmul_tiles(k, w.rows, n, cols32 * 2);
}

}  // namespace larder::kernels::cpu::avx512
