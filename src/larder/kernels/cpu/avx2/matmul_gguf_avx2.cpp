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
// Decode streams each weight byte once for up to 4 tokens (matmul_driver.h); prefill (n >= 8) runs
// the token-lane GEMM at the end of this file (GgufGemm), Q5_K the super-block one of
// gemm_super_avx2.h.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx2/gemm_super_avx2.h"
#include "larder/kernels/cpu/avx2/token_lane_avx2.h"
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

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m256 acc[R][T];
    zero_acc(acc);
    const __m256i ones = _mm256_set1_epi16(1);
    alignas(32) int8_t wb[R][U::kElems];
    alignas(32) float sl[R][kLanes], cl[R][kLanes];
    for (int64_t u = 0; u < units; ++u) {
      prefetch_rows<kPf>(wr[0], R, row_bytes, u * U::kBytes, U::kBytes);
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
    store_acc(acc, y, rows, r0, t0);
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
// B: the GGUF block; kFifth: codes carry a fifth bit in qh (Q5_0, Q5_1); kMin: c is the block's
// f16 m (Q4_1, Q5_1), else the zero point 16 (Q5_0).
template <class B, bool kFifth, bool kMin>
struct LinLowBit {
  static constexpr bool kSigned = false;
  static constexpr size_t kBytes = sizeof(B);
  static __m256i codes(const uint8_t* blk) {
    const __m256i lo = gu::nibbles32(blk + offsetof(B, qs));
    if constexpr (kFifth) return _mm256_or_si256(lo, gu::fifth_bits(blk + offsetof(B, qh)));
    return lo;
  }
  static void scales(const uint8_t* blk, const float* f16, float* d, float* c) {
    *d = f16[load_u16(blk + offsetof(B, d))];
    if constexpr (kMin) *c = f16[load_u16(blk + offsetof(B, m))];
    else *c = -16.0f * *d;
  }
};
using LinQ4_1 = LinLowBit<BlockQ4_1, false, true>;
using LinQ5_1 = LinLowBit<BlockQ5_1, true, true>;
using LinQ5_0 = LinLowBit<BlockQ5_0, true, false>;
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

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m256 acc[R][T];
    zero_acc(acc);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_rows<kPf>(wr[0], R, row_bytes, b * L::kBytes, L::kBytes);
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
    store_acc(acc, y, rows, r0, t0);
  }
};

// The LinearKernel for w with its activations quantized (slots 0 and 3 of the calling thread);
// matmul_multi_linear reuses them for every weight of a fused group.
template <class L>
LinearKernel<L> prepare_linear(const WeightView& w, const float* x, int64_t n, float* y) {
  QuantizedActs a = quantize_acts_scratch(x, n, w.cols);
  const int64_t nb = w.cols / 32;
  auto* bs8 = static_cast<float*>(thread_scratch(static_cast<size_t>(nb * a.n_pad) * sizeof(float) + 64, 3));
  for (int64_t i = 0; i < nb * a.n_pad; ++i) bs8[i] = a.bsum[i] * 0.125f;
  return LinearKernel<L>{w.data, w.row_bytes(), w.rows, nb, a, bs8, y};
}

template <class L>
void matmul_linear(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const LinearKernel<L> k = prepare_linear<L>(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, w.cols + 8 * (w.cols / 32));
}

// Fused decode (kernels::matmul_multi): one quantization and one pool job for the group.
template <class L>
void matmul_multi_linear(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(prepare_linear<L>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + 8 * (ws[0].cols / 32));
}

// ---------------------------------------------------------------------------------------------
// Prefill (n >= kGemmMinTokens): a token-lane GEMM over the same unpackers, the layout of the Q4_0
// GEMM (matmul_avx2.cpp): act8 puts 8 tokens in the lanes, 4 weight codes of a row are broadcast
// against them, maddubs sums 4 products per token lane.
//
// Unpack once, reuse across the token groups and K slices (run_gemm_sliced, as the AVX-512 gemm16
// does): each 4-row tile of a chunk is unpacked once into per-thread scratch — codes block-major
// [nb][4][32], s and c per scale unit — so the format's bit layout and the f16/scale decoding
// cost once per (row, chunk) instead of once per (row, group).
//
// Codes (gguf_unpack.h kCodeOffset / kMaxCode / kScaleElems):
// - unsigned formats: u = w + kCodeOffset ∈ [0, kMaxCode] in maddubs' unsigned operand, bias
//   c' = c − kCodeOffset·s folded with the activation sums: Σ (s·u + c')·x̂ = s·d_x·Σ u·q + c'·d_x·Σ q.
//   int16 lanes of maddubs accumulate 8 steps (a whole block) when kMaxCode <= 15 (8·2·15·127 =
//   30480 < 2^15), else 4 steps = one 16-element half (4·2·31·127 = 31496) before vpmaddwd widens
//   them. Per row, block and 8 tokens: 16 ops in the k loop + madd(s), cvt, mul, FMA (+ bias FMA)
//   ≈ 21–23 ops (Q4_0's GEMM: 20); per-16 scales (Q2_K, Q3_K) take the tail once per half
//   against the activation half sums.
// - signed codebook formats (IQ4_NL, IQ4_XS, −127..113): |w| broadcast into maddubs against the
//   activations with w's sign applied, one vpmaddwd per step (a pair sum reaches 2·127·127), as the
//   Q8_0 GEMM: 4 ops per step.
template <class U>
struct GgufGemm {
  static constexpr bool kSigned = U::kCodeOffset < 0;
  static constexpr int kOff = kSigned ? 0 : U::kCodeOffset;
  static constexpr bool kHalves = U::kScaleElems == 16;
  static constexpr bool kBias = U::kBias || kOff > 0;
  static constexpr bool kOneChain = !kSigned && U::kMaxCode <= 15;
  static_assert(kSigned || U::kMaxCode <= 31, "int16 accumulation bound");

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb, n, units;
  const uint8_t* act8;  // [n_pad/8][nb][8][32]
  QuantizedActs a;
  const float* bs16;  // kHalves: [2·nb][n_pad] d_x·Σ_half q_x
  float* y;

  static constexpr int64_t kSpb = kHalves ? 2 : 1;  // scale units per 32-block
  struct Tile {
    const uint8_t* codes;  // [nb][R][32] u (unsigned) or w (signed)
    const uint8_t* mags;   // signed: [nb][R][32] |w|
    const float* s;        // [nb·kSpb][R]
    const float* c;        // [nb·kSpb][R] c − kOff·s
  };

  int64_t slice_align() const { return U::kElems / 32; }  // whole unpack units (super-blocks)
  size_t tile_bytes(int R) const {
    return (kSigned ? 2 : 1) * round_up64(static_cast<size_t>(nb * R) * 32) +
           round_up64(static_cast<size_t>(2 * nb * kSpb * R) * sizeof(float));
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    const size_t cb = round_up64(static_cast<size_t>(nb * R) * 32);
    uint8_t* codes = buf;
    auto* sc = reinterpret_cast<float*>(buf + (kSigned ? 2 : 1) * cb);
    uint8_t* mags = codes + cb;
    float* cc = sc + nb * kSpb * R;
    const __m256i off = _mm256_set1_epi8(static_cast<char>(kOff));
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      alignas(32) int8_t wb[U::kElems];
      float s[U::kElems / 16], c[U::kElems / 16];
      for (int64_t u = 0; u < units; ++u) {
        U::unpack(p + u * U::kBytes, wb, s, c);
        for (int j = 0; j < U::kElems / 32; ++j) {
          const int64_t b = u * (U::kElems / 32) + j;
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
          auto* dst = reinterpret_cast<__m256i*>(codes + (b * R + r) * 32);
          if constexpr (kSigned) {
            _mm256_store_si256(dst, v);
            _mm256_store_si256(reinterpret_cast<__m256i*>(mags + (b * R + r) * 32), _mm256_abs_epi8(v));
          } else {
            _mm256_store_si256(dst, _mm256_add_epi8(v, off));
          }
          for (int h = 0; h < kSpb; ++h) {
            const float sv = s[2 * j + h];
            sc[(b * kSpb + h) * R + r] = sv;
            cc[(b * kSpb + h) * R + r] = c[2 * j + h] - static_cast<float>(kOff) * sv;
          }
        }
      }
    }
    return {codes, mags, sc, cc};
  }

  // Inlined into matmul_driver.h's out-of-line gemm_whole_tile / gemm_slice_tile, each a small
  // function of its own (register allocation).
  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* ag = act8 + static_cast<uint64_t>(g) * nb * 256;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* ab = ag + b * 256;
      const uint8_t* cb = tl.codes + b * R * 32;
      const __m256 dx = _mm256_loadu_ps(a.scales(b) + 8 * g);
      if constexpr (kSigned) {
        __m256i i[R];
        s8_block<R>(cb, tl.mags + b * R * 32, ab, i);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r)
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r]), _mm256_mul_ps(dx, _mm256_broadcast_ss(tl.s + b * R + r)), acc[r]);
      } else if constexpr (kHalves) {
        LARDER_UNROLL
        for (int h = 0; h < 2; ++h) {
          __m256i p[R];
          u8_chain<R, 4>(cb + 16 * h, ab + 128 * h, p);
          const int64_t k = (2 * b + h) * R;
          const __m256 hs = _mm256_loadu_ps(bs16 + (2 * b + h) * a.n_pad + 8 * g);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p[r], ones));
            acc[r] = _mm256_fmadd_ps(f, _mm256_mul_ps(dx, _mm256_broadcast_ss(tl.s + k + r)), acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(tl.c + k + r), hs, acc[r]);
          }
        }
      } else {
        __m256i i[R];
        constexpr int kSteps = kOneChain ? 8 : 4;
        LARDER_UNROLL
        for (int h = 0; h < 8 / kSteps; ++h) {
          __m256i p[R];
          u8_chain<R, kSteps>(cb + 4 * kSteps * h, ab + 32 * kSteps * h, p);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256i m = _mm256_madd_epi16(p[r], ones);
            i[r] = h == 0 ? m : _mm256_add_epi32(i[r], m);
          }
        }
        const __m256 bs = _mm256_loadu_ps(a.sums(b) + 8 * g);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i[r]), _mm256_mul_ps(dx, _mm256_broadcast_ss(tl.s + b * R + r)), acc[r]);
          if constexpr (kBias) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(tl.c + b * R + r), bs, acc[r]);
        }
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g);
  }
};

template <class U>
void matmul_gguf_gemm(const WeightView& w, const float* x, int64_t n, float* y) {
  using G = GgufGemm<U>;
  const int64_t nb = w.cols / 32;
  QuantizedActs a = quantize_acts_scratch(x, n, w.cols);
  auto* act8 = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(a.n_pad) * nb * 32, 2));
  build_act8(a, n, act8);
  float* bs16 = nullptr;
  if constexpr (G::kHalves) {
    // d_x·Σ q_x per 16-element half, block-major like a.bsum (padding tokens: zero).
    bs16 = static_cast<float*>(thread_scratch(static_cast<size_t>(2 * nb * a.n_pad) * sizeof(float) + 64, 1));
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t t = 0; t < a.n_pad; ++t) {
        float h0 = 0.0f, h1 = 0.0f;
        if (t < n) {
          const int8_t* q = a.token_blocks(t) + 32 * b;
          int s0 = 0, s1 = 0;
          for (int j = 0; j < 16; ++j) {
            s0 += q[j];
            s1 += q[16 + j];
          }
          const float d = a.scales(b)[t];
          h0 = d * static_cast<float>(s0);
          h1 = d * static_cast<float>(s1);
        }
        bs16[2 * b * a.n_pad + t] = h0;
        bs16[(2 * b + 1) * a.n_pad + t] = h1;
      }
    }
  }
  const G k{w.data, w.row_bytes(), w.rows, nb, n, w.cols / U::kElems, act8, a, bs16, y};
  run_gemm_sliced(k, w.rows, a.n_pad / 8, nb);
}

// From this many tokens on (one full 8-token group) the GEMM above; fewer: the decode kernels.
constexpr int64_t kGemmMinTokens = 8;

template <class U, class L>
void matmul_gguf_or_linear(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gguf_gemm<U>(w, x, n, y);
  } else {
    matmul_linear<L>(w, x, n, y);
  }
}
template <class U>
void matmul_gguf_any(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gguf_gemm<U>(w, x, n, y);
  } else {
    matmul_gguf<U>(w, x, n, y);
  }
}

}  // namespace

void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf_or_linear<UnpackQ4_1, LinQ4_1>(w, x, n, y); }
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf_or_linear<UnpackQ5_0, LinQ5_0>(w, x, n, y); }
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf_or_linear<UnpackQ5_1, LinQ5_1>(w, x, n, y); }
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) { matmul_gguf_or_linear<UnpackIQ4_NL, LinIQ4_NL>(w, x, n, y); }
void matmul_multi_iq4_nl(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemmMinTokens) {
    for (int i = 0; i < count; ++i) matmul_iq4_nl(ws[i], x, n, ys[i]);
    return;
  }
  matmul_multi_linear<LinIQ4_NL>(ws, ys, count, x, n);
}
// Q2_K / Q3_K decode: integer super-block accumulation (decode_q2k_q3k_avx2.cpp).
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gguf_gemm<UnpackQ2_K>(w, x, n, y);
  } else {
    decode_q2_k(w, x, n, y);
  }
}
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gguf_gemm<UnpackQ3_K>(w, x, n, y);
  } else {
    decode_q3_k(w, x, n, y);
  }
}
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    gemm_super<UnpackQ5_K>(w, x, n, y);  // gemm_super_avx2.h: integer sub-block scales
  } else {
    decode_q5_k(w, x, n, y);  // decode_q4k_q5k_avx2.cpp
  }
}
// IQ4_XS decode: integer super-block accumulation (decode_iq4_avx2.cpp).
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    gemm_super<UnpackIQ4_XS>(w, x, n, y);  // gemm_super_avx2.h: signed codes, integer sub-block scales
  } else {
    decode_iq4_xs(w, x, n, y);
  }
}

}  // namespace larder::kernels::cpu::avx2
