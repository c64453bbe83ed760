// gemm_super_avx2.h — the AVX2 token-lane prefill GEMM for super-block formats with integer
// sub-block scales (Q4_K, Q5_K: w = d·sc_j·u − dmin·m_j over 32-block j of a 256-element
// super-block, u unsigned, sc_j and m_j 6-bit). Included only by AVX2-tier translation units;
// internal linkage, like gemm16_avx512.h.
//
// The layout of the Q4_0 GEMM (matmul_avx2.cpp, act8 of act_quant.h) over activations quantized
// per 256 values (act_quant.h quantize_acts_k_avx2, ggml's Q8_K trade: a coarser activation grid
// than per 32). Lane t of an int16 accumulator sums token t's products: broadcast-code maddubs
// steps, 8 per chain when u <= 15 (|sum| <= 8·2·15·127 = 30480 < 2^15), 4 when u <= 31 (4·2·31·127
// = 31496). Each chain is widened by vpmaddwd with sc_j|sc_j as multiplier (exact: < 2^21) and
// added into the super-block's int32 sum — where activations quantized per 32 took madd by ones,
// cvt, ·d_x[t], an FMA by d·sc_j and one more for the min. Once per (row, super-block): the mins
// as 4 vpmaddwd against the activations' block sums packed as int16 pairs, 2 cvt, 3 float ops.
// Zen 4 (AVX2 tier), Q4_K: see bench/RESULTS.md session 31.
//
// IQ4_XS (codebook values −127..113 under a signed 6-bit scale ls_j, no min) keeps its codes
// signed: the unsigned +128 form of the AVX-512 path would overflow maddubs' int16 pair sums
// (2·241·127). Each step is maddubs(|w|, sign(x, w)) widened at once by vpmaddwd — with ls_j|ls_j
// as multiplier where the per-32 GEMM took ones, so the block's sum lands scaled in the
// super-block's int32 sum (|Σ| <= 8 blocks · 8 steps · 2 · 32258 · 32 < 2^31) — and the float
// work, without a min term, runs once per super-block.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "larder/kernels/cpu/avx2/token_lane_avx2.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu::avx2 {
namespace {

// S: a gguf_unpack.h unpacker with kBytes, kMaxCode and
//   unpack_super(blk, int8_t* w /* 256 codes */, int16_t* sc, int16_t* mn, float& d, float& dmin):
// unsigned codes u <= 31 (Q4_K, Q5_K), or signed codes without a min (IQ4_XS: those the AVX-512
// path makes unsigned by a kSuperCodeOffset).
template <class S>
struct SuperGemm {
  static constexpr bool kSigned = S::kSuperCodeOffset != 0;
  static_assert(kSigned || S::kMaxCode <= 31, "int16 accumulation bound");
  static constexpr int kSteps = S::kMaxCode <= 15 ? 8 : 4;  // maddubs steps per int16 chain (unsigned)
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb, n;
  const uint8_t* act8;  // the token-lane int8 blocks (build_act8) of the per-256 activations
  const float* dk;      // [nsb][n_pad]: d_x of each super-block
  const int32_t* qp;    // [nsb][4][n_pad]: (Σq of block 2i, Σq of block 2i+1) as int16 pairs
  int64_t n_pad;
  float* y;

  // A tile's rows unpacked once per chunk (run_gemm_sliced): codes [nb][R][32]; per (block, row)
  // the vpmaddwd multiplier sc_j|sc_j; per (super-block, row) d and, unsigned, the packed min
  // pairs [4] and dmin.
  struct Tile {
    const uint8_t* codes;
    const uint8_t* mags;  // kSigned: [nb][R][32] |w|
    const int32_t* scm;   // [nb][R]
    const float* d;       // [nsb][R]
    const int32_t* mnp;   // unsigned: [nsb][4][R]
    const float* dmin;    // unsigned: [nsb][R]
  };

  // int32/f32 words per (super-block, row) after the codes: 8 multipliers and d, then (unsigned)
  // 4 min pairs and dmin.
  static constexpr int kSideWords = kSigned ? 9 : 14;

  int64_t slice_align() const { return 8; }  // whole super-blocks
  size_t tile_bytes(int R) const {
    return (kSigned ? 2 : 1) * round_up64(static_cast<size_t>(nsb * 8 * R) * 32) +
           round_up64(static_cast<size_t>(nsb * R) * kSideWords * 4);
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    const int64_t nb = nsb * 8;
    const size_t cbytes = round_up64(static_cast<size_t>(nb * R) * 32);
    uint8_t* codes = buf;
    uint8_t* mags = buf + cbytes;
    auto* scm = reinterpret_cast<int32_t*>(buf + (kSigned ? 2 : 1) * cbytes);
    auto* d = reinterpret_cast<float*>(scm + nb * R);
    auto* mnp = reinterpret_cast<int32_t*>(d + nsb * R);
    auto* dmin = reinterpret_cast<float*>(mnp + 4 * nsb * R);
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        alignas(32) int8_t wb[256];
        int16_t sc[8], mn[8];
        float dm;  // signed: the unpacker's d again (its min form for the AVX-512 path), unused
        S::unpack_super(wr + sb * S::kBytes, wb, sc, mn, d[sb * R + r], dm);
        if constexpr (!kSigned) {
          dmin[sb * R + r] = dm;
          for (int i = 0; i < 4; ++i) mnp[(4 * sb + i) * R + r] = pack_i16_pair(mn[2 * i], mn[2 * i + 1]);
        }
        for (int j = 0; j < 8; ++j) {
          const int64_t b = sb * 8 + j;
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
          _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (b * R + r) * 32), v);
          if constexpr (kSigned)
            _mm256_store_si256(reinterpret_cast<__m256i*>(mags + (b * R + r) * 32), _mm256_abs_epi8(v));
          scm[b * R + r] = pack_i16_pair(sc[j], sc[j]);
        }
      }
    }
    return Tile{codes, mags, scm, d, mnp, dmin};
  }

  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const int64_t nb = nsb * 8;
    const uint8_t* ag = act8 + static_cast<uint64_t>(g) * nb * 256;
    for (int64_t sb = b0 / 8; sb < b1 / 8; ++sb) {
      __m256i sacc[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) sacc[r] = _mm256_setzero_si256();
      for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
        const uint8_t* cb = tl.codes + b * R * 32;
        const uint8_t* ab = ag + b * 256;
        if constexpr (kSigned) {
          __m256i sc[R], p[R];
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) sc[r] = _mm256_set1_epi32(tl.scm[b * R + r]);
          s8_block<R>(cb, tl.mags + b * R * 32, ab, p, sc);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) sacc[r] = _mm256_add_epi32(sacc[r], p[r]);
        } else {
          LARDER_UNROLL
          for (int h = 0; h < 8 / kSteps; ++h) {
            __m256i p[R];
            u8_chain<R, kSteps>(cb + 4 * kSteps * h, ab + 32 * kSteps * h, p);
            LARDER_UNROLL
            for (int r = 0; r < R; ++r)
              sacc[r] = _mm256_add_epi32(sacc[r], _mm256_madd_epi16(p[r], _mm256_set1_epi32(tl.scm[b * R + r])));
          }
        }
      }
      const __m256 dx = _mm256_loadu_ps(dk + sb * n_pad + 8 * g);
      if constexpr (kSigned) {
        LARDER_UNROLL
        for (int r = 0; r < R; ++r)
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sacc[r]), _mm256_broadcast_ss(tl.d + sb * R + r)),
                                   dx, acc[r]);
      } else {
        const int32_t* q = qp + sb * 4 * n_pad + 8 * g;
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const int32_t* mn = tl.mnp + 4 * sb * R + r;
          __m256i m;
          LARDER_UNROLL
          for (int i = 0; i < 4; ++i) {
            const __m256i qi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i * n_pad));
            const __m256i mi = _mm256_madd_epi16(qi, _mm256_set1_epi32(mn[i * R]));
            m = i == 0 ? mi : _mm256_add_epi32(m, mi);
          }
          __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(sacc[r]), _mm256_broadcast_ss(tl.d + sb * R + r));
          t = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_broadcast_ss(tl.dmin + sb * R + r), t);
          acc[r] = _mm256_fmadd_ps(t, dx, acc[r]);
        }
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g);
  }
};

// y[n, rows] = x·Wᵀ for n >= 8 tokens of a super-block format S.
template <class S>
void gemm_super(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t nb = w.cols / 32, nsb = w.cols / 256;
  QuantizedActsK ak = quantize_acts_k_scratch(x, n, w.cols);
  QuantizedActs a;  // the same bytes as 32-blocks, for build_act8
  a.n = n;
  a.nb = nb;
  a.n_pad = (n + 7) / 8 * 8;
  a.qs = ak.qs;
  auto* act8 = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(a.n_pad) * nb * 32, 2));
  build_act8(a, n, act8);
  const size_t lanes = static_cast<size_t>(nsb * a.n_pad);
  auto* side = static_cast<uint8_t*>(thread_scratch(5 * lanes * 4 + 64, 3));
  auto* dk = reinterpret_cast<float*>(side);
  auto* qp = reinterpret_cast<int32_t*>(side + lanes * 4);
  for (int64_t sb = 0; sb < nsb; ++sb)
    for (int64_t t = 0; t < a.n_pad; ++t) dk[sb * a.n_pad + t] = t < n ? ak.scales(t)[sb] : 0.0f;
  if constexpr (!SuperGemm<S>::kSigned) {  // the mins' activation sums (padding tokens: zero)
    for (int64_t sb = 0; sb < nsb; ++sb)
      for (int64_t t = 0; t < a.n_pad; ++t)
        for (int i = 0; i < 4; ++i) {
          const int16_t* s16 = t < n ? ak.sums16(t) + 16 * sb + 4 * i : nullptr;  // blocks 2i, 2i + 1
          qp[(sb * 4 + i) * a.n_pad + t] = s16 ? pack_i16_pair(s16[0] + s16[1], s16[2] + s16[3]) : 0;
        }
  }
  const SuperGemm<S> k{w.data, w.row_bytes(), w.rows, nsb, n, act8, dk, qp, a.n_pad, y};
  run_gemm_sliced(k, w.rows, a.n_pad / 8, nb);
}

}  // namespace
}  // namespace larder::kernels::cpu::avx2
