// matmul_gguf_avx512.cpp — GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS on the AVX-512
// tier, over the unpackers of cpu/common/gguf_unpack.h (value = s·w + c per 16-element half).
//
// Prefill (n >= kGemm16MinTokens): the shared VNNI token-lane GEMM (gemm16_avx512.h) in its
// half-block mode (kZero < 0): codes u = w ^ 0x80 = w + 128 (unsigned operand of vpdpbusd), scale
// s and bias c − 128·s per half.
//
// Decode: 64 weights (two 32-blocks) per zmm. Per row and unit the unpacked bytes become
// u = w + 128 with per-lane (4 elements) scale s and bias c' = c − 128·s; per token
//   i   = vpdpbusd(0, u, q_x)          (16 int32 lanes = 4-element dots, exact)
//   acc += cvt(i)·(s_lane·d_x,lane) + c'_lane·h_lane
// with the lane arrays of LaneActs (h = d_x·Σ_half q_x / 4, so a half's 4 lanes add to c'·d_x·Σ q_x).
// The 32-element formats unpack two blocks per step; an odd last block runs with the upper half
// of the vector masked off.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/gguf_unpack.h"
#include "larder/kernels/cpu/common/matmul_driver.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// GEMM adapter: one row unpacked to codes [nb][32] (at stride), scale/bias per 16-element half.
template <class U>
struct GgufRows {
  static constexpr int kZero = -1;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t units;

  int64_t groups() const { return units * (U::kElems / 16); }
  int64_t blocks_per_group() const { return 1; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    alignas(32) int8_t wb[U::kElems];
    float s[U::kElems / 16], c[U::kElems / 16];
    for (int64_t u = 0; u < units; ++u) {
      U::unpack(p + u * U::kBytes, wb, s, c);
      for (int j = 0; j < U::kElems / 32; ++j) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (u * (U::kElems / 32) + j) * stride),
                           _mm256_xor_si256(v, flip));
      }
      for (int i = 0; i < U::kElems / 16; ++i) {
        scale[u * (U::kElems / 16) + i] = s[i];
        bias[u * (U::kElems / 16) + i] = c[i] - 128.0f * s[i];
      }
    }
  }
};

template <class U>
struct GgufDecode {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  // Weights per step: a K-quant super-block, or two 32-element blocks.
  static constexpr int kStep = U::kElems >= 64 ? U::kElems : 64;
  static constexpr int kUnitsPerStep = kStep / U::kElems;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, units;
  LaneActs la;
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m512 acc[R][T];
    zero_acc(acc);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    alignas(64) int8_t wb[R][kStep];
    alignas(64) float sl[R][kStep / 4], cl[R][kStep / 4];
    for (int64_t u0 = 0; u0 < units; u0 += kUnitsPerStep) {
      const int nu = static_cast<int>(std::min<int64_t>(kUnitsPerStep, units - u0));
      prefetch_ahead(wr[0], R * row_bytes, u0 * U::kBytes * R, static_cast<int>(kStep / U::kElems * U::kBytes * R));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        for (int k = 0; k < kUnitsPerStep; ++k) {
          float s[U::kElems / 16], c[U::kElems / 16];
          if (k < nu) {
            U::unpack(wr[r] + (u0 + k) * U::kBytes, wb[r] + k * U::kElems, s, c);
          } else {  // odd last 32-block: zero scale and bias, codes never loaded
            std::memset(wb[r] + k * U::kElems, 0, U::kElems);
            for (int i = 0; i < U::kElems / 16; ++i) s[i] = c[i] = 0.0f;
          }
          for (int i = 0; i < U::kElems / 16; ++i) {
            _mm_store_ps(sl[r] + k * (U::kElems / 4) + 4 * i, _mm_set1_ps(s[i]));
            _mm_store_ps(cl[r] + k * (U::kElems / 4) + 4 * i, _mm_set1_ps(c[i] - 128.0f * s[i]));
          }
        }
      }
      const int64_t e0 = u0 * U::kElems;  // first element of the step
      const int steps = (nu * U::kElems + 63) / 64;
      for (int j = 0; j < steps; ++j) {
        const int64_t e = e0 + 64 * j;
        // A half-filled last step (odd 32-block count): load only the 32 valid activation bytes.
        const __mmask64 m = (nu * U::kElems - 64 * j) >= 64 ? ~__mmask64{0} : __mmask64{0xffffffffull};
        __m512i uv[R];
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) uv[r] = _mm512_xor_si512(_mm512_load_si512(wb[r] + 64 * j), flip);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_maskz_loadu_epi8(m, la.a.token_blocks(t0 + t) + e);
          const int64_t lane = (t0 + t) * la.nl + e / 4;
          const __m512 dx = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m == ~__mmask64{0} ? 0xffff : 0x00ff), la.dx + lane);
          const __m512 h = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m == ~__mmask64{0} ? 0xffff : 0x00ff), la.h + lane);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), uv[r], xv));
            acc[r][t] = _mm512_fmadd_ps(f, _mm512_mul_ps(_mm512_load_ps(sl[r] + 16 * j), dx), acc[r][t]);
            acc[r][t] = _mm512_fmadd_ps(_mm512_load_ps(cl[r] + 16 * j), h, acc[r][t]);
          }
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

template <class U>
void matmul_gguf(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t units = w.cols / U::kElems;
  if (n < kGemm16MinTokens) {
    const LaneActs la = prepare_lane_acts(x, n, w.cols, /*need_h=*/true);
    const GgufDecode<U> k{w.data, w.row_bytes(), w.rows, units, la, y};
    run_matmul_tiles(k, w.rows, n, w.cols * 3);
    return;
  }
  const Acts16 a = quantize_acts16(x, n, w.cols, /*half_sums=*/true);
  const GgufRows<U> f{w.data, w.row_bytes(), units};
  run_gemm16(f, a, w.rows, y);
}

}  // namespace

void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ4_1>(w, x, n, y); }
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ5_0>(w, x, n, y); }
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ5_1>(w, x, n, y); }
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackIQ4_NL>(w, x, n, y); }
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ2_K>(w, x, n, y); }
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ3_K>(w, x, n, y); }
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ5_K>(w, x, n, y); }
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackIQ4_XS>(w, x, n, y); }

}  // namespace larder::kernels::cpu::avx512
