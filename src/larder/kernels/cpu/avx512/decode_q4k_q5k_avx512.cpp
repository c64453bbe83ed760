// decode_q4k_q5k_avx512.cpp — GGUF Q4_K and Q5_K decode (n < kGemm16MinTokens) on the AVX-512 tier,
// with integer super-block accumulation over the super-block activations (act_quant.h,
// QuantizedActsK: one f32 scale d_x per 256 values, int16 sums per 16).
//
// Per (row, token) and super-block, with u the 4-bit (Q4_K) or 5-bit (Q5_K) code and q the int8
// activation (value = d·sc_j·u − dmin·m_j over sub-block j of 32, layout: ref/kquant.cpp):
//   Σ w·x̂ = d·d_x·[ Σ_j sc_j·Σ_{i∈j} u_i·q_i ]  −  dmin·d_x·[ Σ_j m_j·Σ_{i∈j} q_i ]
// Both brackets are integers. The first is built per 64 weights by vpmaddubsw (u, q → int16 pair
// sums, |2·31·127| = 7874 < 2^15: no saturation) and vpdpwssd with the sub-block scale as the int16
// multiplier (pairs again into int32 and adds, one op); lanes stay below 4·2·7874·63 < 2^22, so
// the conversion is exact. The second is one vpmaddwd of the m_j (each twice, int16) with the 16
// activation sums of 16. So per 256 weights and token: 4 maddubs + 4 dpwssd + 1 madd, and one
// cvt + FMA for each bracket (against 4 dpbusd + 4 cvt + 4 mul + 5 FMA over 32-blocks before).
//
// A super-block's 128 code bytes are two zmm loads: the low nibbles of chunks 0 and 1 are
// sub-blocks 0 and 2, their high nibbles sub-blocks 1 and 3 (chunks 2, 3 likewise 4/6 and 5/7).
// The activations are permuted once per matmul (in place, 32-byte chunks) into that order
// ([b0 b2][b1 b3][b4 b6][b5 b7] per super-block), so each zmm of codes meets one zmm of
// activations, and each 256-bit half of a dpwssd belongs to one sub-block: its multiplier is one
// vpshufb of the 16 scale/min bytes (broadcast to the four 128-bit lanes). Q5_K's fifth bit of
// element 32j + l is bit j of qh[l]: the 32 qh bytes are broadcast to both halves, and vptestmb
// with the bit of each half's sub-block gives the byte mask that adds 16 to the code.
//
// Tiles: each row's super-block is unpacked into registers once and reused by every token of the
// tile; R = 4 rows for one token (4 independent dpwssd chains), 2 rows × up to 4 tokens otherwise.
//
// Batch-invariant mode (batch_invariant_decode(), LARDER_BATCH_INVARIANT=1; issue 41): the
// default keeps the brackets' lanes as f32 sums across super-blocks and adds the lanes at the
// end, an order the prefill GEMM (one token per lane, gemm16_avx512.h tile_super) cannot follow.
// The activations are already the GEMM's (per-256 quantizer, bit-identical), so tile_inv computes
// each super-block's two brackets exactly as integers per (row, token) — all of a tile's lane
// vectors reduced in one pair-sum tree (lane_sums) — and then the GEMM's three f32 steps,
// t = S·d − M·dmin, acc += t·d_x, in a scalar chain over the super-blocks: the row equals the
// GEMM's bit for bit. The reduction costs ~1.3× tile_fast's time (bench/RESULTS.md, session 37).
#include <immintrin.h>

#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/kquant_scales.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// Sub-blocks in the two 256-bit halves of zmm i (see the header).
constexpr int kHalfA[4] = {0, 1, 4, 5};
constexpr int kHalfB[4] = {2, 3, 6, 7};

template <bool kQ5, bool kInv>
struct Q45KDecode {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 2;  // matmul_driver.h rows1: 1B Q5_K_M 27.8 → 34.4 tok/s
  static constexpr int kRowsN = 2;
  static constexpr uint64_t kBlockBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr int kQsOffset = kQ5 ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs);
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  QuantizedActsK a;  // qs permuted per super-block (prepare_q45k)
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    if constexpr (kInv) {
      tile_inv<R, T, kPf>(r0, t0);
    } else {
      tile_fast<R, T, kPf>(r0, t0);
    }
  }

  // Per-lane f32 sums across super-blocks, the lanes added at the end (the default: fastest).
  template <int R, int T, int kPf>
  void tile_fast(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m512 acc[R][T];
    __m256 accm[R][T];
    zero_acc(acc);
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) accm[r][t] = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // vpshufb controls over the broadcast [sc_0..sc_7 | m_0..m_7]: zmm i's multiplier holds sc of
    // kHalfA[i] zero-extended to int16 in its low 256 bits and sc of kHalfB[i] in the high ones;
    // the min multiplier holds m_j at int16 positions 2j and 2j + 1 (the sums come per 16).
    __m512i ctl[4];
    LARDER_UNROLL
    for (int i = 0; i < 4; ++i) {
      // (blends, not 256-bit inserts: GCC 12 warns about the inserts' undefined pass-through)
      ctl[i] = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(static_cast<int16_t>(0x8000 | kHalfA[i])),
                                       _mm512_set1_epi16(static_cast<int16_t>(0x8000 | kHalfB[i])));
    }
    const __m256i ctlm = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128,
                                          12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
    __m512i hbit[4];
    if constexpr (kQ5) {
      LARDER_UNROLL
      for (int i = 0; i < 4; ++i)
        hbit[i] = _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8(static_cast<char>(1 << kHalfA[i])),
                                         _mm512_set1_epi8(static_cast<char>(1 << kHalfB[i])));
    }
    const __m512i c16 = _mm512_set1_epi8(16);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * kBlockBytes, kBlockBytes);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * kBlockBytes;
        const float d = f16[load_u16(blk)], dmin = f16[load_u16(blk + 2)];
        const __m512i sm = _mm512_broadcast_i32x4(q4k_scales_xmm(blk + 4));
        __m512i mul[4];
        LARDER_UNROLL
        for (int i = 0; i < 4; ++i) mul[i] = _mm512_shuffle_epi8(sm, ctl[i]);
        const __m256i mm = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm), ctlm);
        const __m512i v01 = _mm512_loadu_si512(blk + kQsOffset), v23 = _mm512_loadu_si512(blk + kQsOffset + 64);
        __m512i u[4] = {_mm512_and_si512(v01, m4), _mm512_and_si512(_mm512_srli_epi16(v01, 4), m4),
                        _mm512_and_si512(v23, m4), _mm512_and_si512(_mm512_srli_epi16(v23, 4), m4)};
        if constexpr (kQ5) {
          const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
          LARDER_UNROLL
          for (int i = 0; i < 4; ++i) u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(qh, hbit[i]), u[i], c16);
        }
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t tok = t0 + t;
          const int8_t* xq = a.token(tok) + sb * 256;
          __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(u[0], _mm512_load_si512(xq)), mul[0]);
          LARDER_UNROLL
          for (int i = 1; i < 4; ++i)
            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[i], _mm512_load_si512(xq + 64 * i)), mul[i]);
          const __m256i ms = _mm256_madd_epi16(
              mm, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.sums16(tok) + sb * 16)));
          const float dx = a.scales(tok)[sb];
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(d * dx), acc[r][t]);
          accm[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * dx), accm[r][t]);
        }
      }
    }
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_add_ps(acc[r][t], _mm512_insertf32x8(_mm512_setzero_ps(), accm[r][t], 0));
    store_acc(acc, y, rows, r0, t0);
  }

  // Batch-invariant (batch_invariant_decode()): each super-block's two integers reduced exactly
  // per (row, token), then Gemm16::tile_super's f32 steps in its order (see the header).
  template <int R, int T, int kPf>
  void tile_inv(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    // One f32 chain per (row, token), in the prefill GEMM's order (see the header).
    __m128 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    // vpshufb controls over the broadcast [sc_0..sc_7 | m_0..m_7]: zmm i's multiplier holds sc of
    // kHalfA[i] zero-extended to int16 in its low 256 bits and sc of kHalfB[i] in the high ones;
    // the min multiplier holds m_j at int16 positions 2j and 2j + 1 (the sums come per 16).
    __m512i ctl[4];
    LARDER_UNROLL
    for (int i = 0; i < 4; ++i) {
      // (blends, not 256-bit inserts: GCC 12 warns about the inserts' undefined pass-through)
      ctl[i] = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(static_cast<int16_t>(0x8000 | kHalfA[i])),
                                       _mm512_set1_epi16(static_cast<int16_t>(0x8000 | kHalfB[i])));
    }
    const __m256i ctlm = _mm256_setr_epi8(8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128,
                                          12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128);
    __m512i hbit[4];
    if constexpr (kQ5) {
      LARDER_UNROLL
      for (int i = 0; i < 4; ++i)
        hbit[i] = _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8(static_cast<char>(1 << kHalfA[i])),
                                         _mm512_set1_epi8(static_cast<char>(1 << kHalfB[i])));
    }
    const __m512i c16 = _mm512_set1_epi8(16);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * kBlockBytes, kBlockBytes);
      // Per (row, token): the lanes of Σ_j sc_j·Σ u·q (sums[r·T + t]) and of Σ_j m_j·Σq
      // (sums[R·T + r·T + t]), reduced exactly after the rows.
      __m512i sums[2 * R * T];
      float d[R], dmin[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * kBlockBytes;
        d[r] = f16[load_u16(blk)];
        dmin[r] = f16[load_u16(blk + 2)];
        const __m512i sm = _mm512_broadcast_i32x4(q4k_scales_xmm(blk + 4));
        __m512i mul[4];
        LARDER_UNROLL
        for (int i = 0; i < 4; ++i) mul[i] = _mm512_shuffle_epi8(sm, ctl[i]);
        const __m256i mm = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm), ctlm);
        const __m512i v01 = _mm512_loadu_si512(blk + kQsOffset), v23 = _mm512_loadu_si512(blk + kQsOffset + 64);
        __m512i u[4] = {_mm512_and_si512(v01, m4), _mm512_and_si512(_mm512_srli_epi16(v01, 4), m4),
                        _mm512_and_si512(v23, m4), _mm512_and_si512(_mm512_srli_epi16(v23, 4), m4)};
        if constexpr (kQ5) {
          const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
          LARDER_UNROLL
          for (int i = 0; i < 4; ++i) u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(qh, hbit[i]), u[i], c16);
        }
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t tok = t0 + t;
          const int8_t* xq = a.token(tok) + sb * 256;
          __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(u[0], _mm512_load_si512(xq)), mul[0]);
          LARDER_UNROLL
          for (int i = 1; i < 4; ++i)
            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u[i], _mm512_load_si512(xq + 64 * i)), mul[i]);
          sums[r * T + t] = s;
          sums[R * T + r * T + t] = _mm512_zextsi256_si512(_mm256_madd_epi16(
              mm, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.sums16(tok) + sb * 16))));
        }
      }
      int32_t is[2 * R * T];
      lane_sums(sums, is);
      // Gemm16::tile_super's f32 steps: t = S·d − M·dmin, acc += t·d_x (scalar, same roundings).
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m128 z = _mm_setzero_ps();
          __m128 tt = _mm_mul_ss(_mm_cvtsi32_ss(z, is[r * T + t]), _mm_set_ss(d[r]));
          tt = _mm_fnmadd_ss(_mm_cvtsi32_ss(z, is[R * T + r * T + t]), _mm_set_ss(dmin[r]), tt);
          acc[r][t] = _mm_fmadd_ss(tt, _mm_set_ss(a.scales(t0 + t)[sb]), acc[r][t]);
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = _mm_cvtss_f32(acc[r][t]);
  }
};

// Quantizes x into the calling thread's scratch slot 0 and permutes each super-block's 32-byte
// chunks into the code order [0 2 1 3 4 6 5 7] (swap chunks 1↔2 and 5↔6, in place; the sums
// stay in element order, which is what the min multiplier expects).
template <bool kQ5, bool kInv>
Q45KDecode<kQ5, kInv> prepare_q45k(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nsb = cols / 256;
  QuantizedActsK a = quantize_acts_k_scratch(x, n, cols);
  for (int64_t c = 0; c < n * nsb; ++c) {
    int8_t* q = a.qs + c * 256;
    for (int h = 0; h < 2; ++h) {
      auto* p1 = reinterpret_cast<__m256i*>(q + 128 * h + 32);
      auto* p2 = reinterpret_cast<__m256i*>(q + 128 * h + 64);
      const __m256i v1 = _mm256_load_si256(p1), v2 = _mm256_load_si256(p2);
      _mm256_store_si256(p1, v2);
      _mm256_store_si256(p2, v1);
    }
  }
  return Q45KDecode<kQ5, kInv>{w.data, w.row_bytes(), w.rows, nsb, a, y};
}

// Fused decode (kernels::matmul_multi): the first weight's prepared activations serve them all.
template <bool kQ5>
void decode_multi_q45k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (batch_invariant_decode())
    return run_multi_decode(prepare_q45k<kQ5, true>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols);
  run_multi_decode(prepare_q45k<kQ5, false>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols);
}

template <bool kQ5>
void decode_q45k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (batch_invariant_decode()) return run_matmul_tiles(prepare_q45k<kQ5, true>(w, x, n, y), w.rows, n, w.cols);
  run_matmul_tiles(prepare_q45k<kQ5, false>(w, x, n, y), w.rows, n, w.cols);
}

}  // namespace

void decode_q4_k(const WeightView& w, const float* x, int64_t n, float* y) { decode_q45k<false>(w, x, n, y); }
void decode_q5_k(const WeightView& w, const float* x, int64_t n, float* y) { decode_q45k<true>(w, x, n, y); }

void matmul_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_q4_k(ws, ys, count, x, n);
  if (gemv_invariant_amx(n)) return gemv_q4_k(ws, ys, count, x, n);
  decode_multi_q45k<false>(ws, ys, count, x, n);
}
void matmul_multi_q5_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant_amx(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  decode_multi_q45k<true>(ws, ys, count, x, n);
}

}  // namespace larder::kernels::cpu::avx512
