// matmul_gguf_avx2.cpp — y[n, rows] = x[n, cols]·Wᵀ for GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K,
// Q5_K, IQ4_XS weights, AVX2, on one kernel over the unpackers of cpu/common/gguf_unpack.h.
//
// Activations are quantized once per matmul into int8 blocks of 32 (act_quant.h). A weight unit
// (block or super-block) is unpacked once per tile into signed bytes w with a scale s and bias c
// per 16-element half, and every token of the tile reuses it. Per 32 weights, row and token:
//   p = maddubs(|w|, sign(q_x, w))        (|w| <= 127: pair sums <= 2·127·127 < 2^15, exact)
//   i = madd(p, 1)                        (8 int32 lanes; lanes 0..3 are elements 0..15 = half 0)
//   acc += cvt(i) · (s_lane · d_x)        (s_lane: the half's scale, expanded per lane)
//   acc += c_lane · h_lane                (bias formats: h = d_x·Σ_half q_x / 4 per lane, so the
//                                          four lanes of a half add up to c·d_x·Σ q_x)
// so Σ_lanes acc = Σ (s·w + c)·x̂ exactly up to f32 rounding. The per-lane scale/bias arrays are
// built per unit and row (kElems/4 floats each), the per-lane activation arrays (d_x, h) once per
// matmul, so the inner loop is loads, 6–7 vector ops and no shuffles.
//
// Decode streams each weight byte once for up to 4 tokens (matmul_driver.h); with many tokens the
// same tiles run 4 tokens at a time (no token-lane GEMM for these formats on AVX2 yet).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/gguf_unpack.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

template <class U>
struct GgufKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  static constexpr int kLanes = U::kElems / 4;  // int32 lanes per unit (4 elements each)

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
    __m256 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    alignas(32) int8_t wb[R][U::kElems];
    alignas(32) float sl[R][kLanes], cl[R][kLanes];
    for (int64_t u = 0; u < units; ++u) {
      prefetch_ahead(wr[0], R * row_bytes, u * U::kBytes * R, static_cast<int>(U::kBytes * R));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        float s[U::kElems / 16], c[U::kElems / 16];
        U::unpack(wr[r] + u * U::kBytes, wb[r], s, c);
        for (int i = 0; i < U::kElems / 16; ++i) {
          _mm_store_ps(sl[r] + 4 * i, _mm_set1_ps(s[i]));
          if constexpr (U::kBias) _mm_store_ps(cl[r] + 4 * i, _mm_set1_ps(c[i]));
        }
      }
      for (int j = 0; j < U::kElems / 32; ++j) {
        const int64_t b = u * (U::kElems / 32) + j;  // activation block
        __m256i wv[R], aw[R];
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb[r] + 32 * j));
          aw[r] = _mm256_abs_epi8(wv[r]);
        }
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(la.a.token_blocks(t0 + t) + 32 * b));
          const __m256 dx = _mm256_loadu_ps(la.dx + (t0 + t) * la.nl + 8 * b);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wv[r]));
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc[r][t] = _mm256_fmadd_ps(f, _mm256_mul_ps(_mm256_load_ps(sl[r] + 8 * j), dx), acc[r][t]);
            if constexpr (U::kBias) {
              acc[r][t] = _mm256_fmadd_ps(_mm256_load_ps(cl[r] + 8 * j), _mm256_loadu_ps(la.h + (t0 + t) * la.nl + 8 * b),
                                          acc[r][t]);
            }
          }
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum(acc[r][t]);
  }
};

template <class U>
void matmul_gguf(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const LaneActs la = prepare_lane_acts(x, n, w.cols, U::kBias);
  const GgufKernel<U> k{w.data, w.row_bytes(), w.rows, w.cols / U::kElems, la, y};
  run_matmul_tiles(k, w.rows, n, w.cols * 3);
}


// The 32-element formats (Q4_1, Q5_0, Q5_1; IQ4_NL below) skip the generic lane arrays: their codes are
// unsigned (u <= 31, value = d·u + c with one d and c per block; Q5_0: u = q + 16, c = −16·d), so
// they feed maddubs as they are (pair sums <= 2·31·127, exact) and the scales are broadcasts:
//   acc += cvt(madd(maddubs(u, q_x), 1))·(d·d_x) + c·(bs/8)       (bs = d_x·Σ q_x; 8 lanes)
// 6 vector ops per (row, token, 32 weights) against the generic kernel's 8 plus its per-block
// lane-array stores — decode of these formats is compute-bound on one core otherwise.
struct LinQ4_1 {
  static constexpr bool kSigned = false;
  static constexpr size_t kBytes = sizeof(BlockQ4_1);
  static __m256i codes(const uint8_t* blk) { return gu::nibbles32(blk + offsetof(BlockQ4_1, qs)); }
  static void scales(const uint8_t* blk, const float* f16, float* d, float* c) {
    *d = f16[load_u16(blk + offsetof(BlockQ4_1, d))];
    *c = f16[load_u16(blk + offsetof(BlockQ4_1, m))];
  }
};
struct LinQ5_1 {
  static constexpr bool kSigned = false;
  static constexpr size_t kBytes = sizeof(BlockQ5_1);
  static __m256i codes(const uint8_t* blk) {
    return _mm256_or_si256(gu::nibbles32(blk + offsetof(BlockQ5_1, qs)), gu::fifth_bits(blk + offsetof(BlockQ5_1, qh)));
  }
  static void scales(const uint8_t* blk, const float* f16, float* d, float* c) {
    *d = f16[load_u16(blk + offsetof(BlockQ5_1, d))];
    *c = f16[load_u16(blk + offsetof(BlockQ5_1, m))];
  }
};
struct LinQ5_0 {
  static constexpr bool kSigned = false;
  static constexpr size_t kBytes = sizeof(BlockQ5_0);
  static __m256i codes(const uint8_t* blk) {
    return _mm256_or_si256(gu::nibbles32(blk + offsetof(BlockQ5_0, qs)), gu::fifth_bits(blk + offsetof(BlockQ5_0, qh)));
  }
  static void scales(const uint8_t* blk, const float* f16, float* d, float* c) {
    *d = f16[load_u16(blk + offsetof(BlockQ5_0, d))];
    *c = -16.0f * *d;
  }
};
// IQ4_NL: signed codebook values (−127..113, no bias): maddubs takes |w| and sign(q_x, w), as the
// Q8_0 decode kernel does.
struct LinIQ4_NL {
  static constexpr bool kSigned = true;
  static constexpr size_t kBytes = sizeof(BlockIQ4_NL);
  static __m256i codes(const uint8_t* blk) { return gu::iq4_lookup(gu::nibbles32(blk + offsetof(BlockIQ4_NL, qs))); }
  static void scales(const uint8_t* blk, const float* f16, float* d, float* c) {
    *d = f16[load_u16(blk + offsetof(BlockIQ4_NL, d))];
    *c = 0.0f;
  }
};

template <class L>
struct LinearKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb;
  QuantizedActs a;
  const float* bs8;  // [nb][n_pad]: d_x·Σ q_x / 8
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m256 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(wr[0], R * row_bytes, b * L::kBytes * R, static_cast<int>(L::kBytes * R));
      __m256i u[R];
      float d[R], c[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = wr[r] + b * L::kBytes;
        u[r] = L::codes(blk);
        L::scales(blk, f16, &d[r], &c[r]);
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.token_blocks(t0 + t) + 32 * b));
        const float dx = a.scales(b)[t0 + t];
        const __m256 bs = _mm256_broadcast_ss(bs8 + b * a.n_pad + t0 + t);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256i p = L::kSigned ? _mm256_maddubs_epi16(_mm256_abs_epi8(u[r]), _mm256_sign_epi8(xv, u[r]))
                                       : _mm256_maddubs_epi16(u[r], xv);
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
          acc[r][t] = _mm256_fmadd_ps(f, _mm256_set1_ps(d[r] * dx), acc[r][t]);
          if constexpr (!L::kSigned) acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(c[r]), bs, acc[r][t]);
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum(acc[r][t]);
  }
};

template <class L>
void matmul_linear(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  QuantizedActs a = quantized_acts_view(thread_scratch(quantized_acts_bytes(n, w.cols)), n, w.cols);
  quantize_acts_avx2(x, n, w.cols, /*offset128=*/false, a);
  const int64_t nb = w.cols / 32;
  auto* bs8 = static_cast<float*>(thread_scratch(static_cast<size_t>(nb * a.n_pad) * sizeof(float) + 64, 3));
  for (int64_t i = 0; i < nb * a.n_pad; ++i) bs8[i] = a.bsum[i] * 0.125f;
  const LinearKernel<L> k{w.data, w.row_bytes(), w.rows, nb, a, bs8, y};
  run_matmul_tiles(k, w.rows, n, w.cols + 8 * nb);
}

}  // namespace

void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_linear<LinQ4_1>(w, x, n, y); }
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y) { matmul_linear<LinQ5_0>(w, x, n, y); }
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_linear<LinQ5_1>(w, x, n, y); }
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) { matmul_linear<LinIQ4_NL>(w, x, n, y); }
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ2_K>(w, x, n, y); }
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ3_K>(w, x, n, y); }
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackQ5_K>(w, x, n, y); }
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf<UnpackIQ4_XS>(w, x, n, y); }

}  // namespace larder::kernels::cpu::avx2
