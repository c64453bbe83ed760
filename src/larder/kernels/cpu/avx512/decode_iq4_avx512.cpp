// decode_iq4_avx512.cpp — GGUF IQ4_XS and IQ4_NL decode (n < kGemm16MinTokens) on the AVX-512 tier.
//
// Both formats store 4-bit indices into the signed codebook kIq4Values (−127..113). The codebook
// is looked up with one vpshufb per 64 codes (16 entries = one 128-bit lane, broadcast to all four;
// vpermb would save the nibble mask but needs VBMI, which the tier does not require), and the table
// holds v + 128 (1..241) so the looked-up byte is directly the UNSIGNED operand of vpdpbusd against
// the signed int8 activations. The +128 is folded out in the integer domain: IQ4_NL seeds each
// accumulator lane with −128·Σq over the lane's activations (precomputed per token, once per
// matmul):  seed + Σ (v + 128)·q = Σ v·q, exact in int32 (IQ4XSDecodeInv keeps it as the GEMM's
// mins term instead).
//
// Why vpdpbusd and not vpmaddubsw + vpdpwssd (the Q4_K/Q5_K kernels' route): maddubs cannot take
// v + 128 (pair sums up to 2·241·127 saturate int16), so it would need |v| as the unsigned operand
// and the sign moved onto the activations — per 64 weights and token a vptestmb-derived masked
// negate of q (the tier has no vpsignb), maddubs, and dpwssd: 3 ops, 12 per 256 plus cvt + FMA.
// vpdpbusd does 64 multiply-adds into int32 in one op: 4 per 256, plus the float scaling below
// (2 cvt + 1 mul + 2 FMA), i.e. 9 ops per 256 weights and token; on Zen 4, where every zmm op is
// two 256-bit halves, the op count is what bounds decode.
//
// IQ4_XS (value = d·(ls_j − 32)·v over sub-block j of 32, 6-bit ls_j; one activation scale per 256,
// act_quant.h QuantizedActsK): a super-block's 128 code bytes are two zmm loads, A (sub-blocks
// 0–3) and B (4–7); 128-bit lane k of A holds sub-block k's 16 bytes, whose low nibbles are its
// elements 0–15 and high nibbles 16–31. The activations are permuted once per matmul into the
// same order (xA_lo, xA_hi, xB_lo, xB_hi: 16-byte pieces), so the two dpbusd of A chain into one
// int32 vector whose lanes 4k..4k+3 all belong to sub-block k (likewise B for 4–7). An int32 lane
// sums 8 products (|Σ| < 2^17, exact in f32), so per super-block and token: cvt(A)·(d·ls pattern)
// + cvt(B)·(pattern) and one FMA by d_x — the sub-block scales cannot ride as integers (the int32
// sums do not fit the int16 operand of vpmaddwd), and this costs fewer ops than vpmulld would.
// The 8 scales are decoded once per row and super-block in one ymm (variable shifts of the packed
// scales_l / scales_h) and spread into the two 16-lane patterns by vpermps.
// IQ4XSDecodeInv (batch_invariant_decode()): to be batch-invariant (issue 41) it computes what the
// prefill GEMM's super-block path does per
// token (gemm16_avx512.h tile_super, UnpackIQ4_XS::unpack_super: codes v + 128, sc_j = ls_j,
// m_j = 128·ls_j, dmin = d): S = Σ_j ls_j·Σ (v + 128)·q and M = Σ_j 128·ls_j·Σq, both exact
// int32, then t = S·d − M·d and acc += t·d_x, one f32 chain per (row, token) over the super-blocks.
// Per token: one pair-sum step folds A and B into two lanes per sub-block, one vpmulld by the ls
// pattern, one vpmulld of the token's −128·Σq per sub-block by it, and both vectors join the
// tile's exact lane-sum tree (lane_sums) — ~1.4× IQ4XSDecode's time (bench/RESULTS.md, session 37).
//
// IQ4_NL (value = d·v over blocks of 32 with an f16 d each; 32-element activation blocks): Q4_0's
// four-block step (matmul_avx512.cpp, Q4_0Quad: the blocks have the same 18-byte layout, so the
// same two word permutes cut codes and scales apart) with the codebook lookup in place of the
// implicit −8: per 128 weights and token 2 dpbusd + cvt + mul + FMA.
//
// Tiles: R = 4 rows for one token (4 independent accumulator chains), 2 rows × up to 4 tokens
// otherwise; each row's codes are unpacked into registers once and reused by every token.
#include <immintrin.h>

#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/avx512/quad18_avx512.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// kIq4Values + 128 in each 128-bit lane (vpshufb looks up within lanes). A 64-byte constant, not
// vbroadcasti32x4 (GCC 12 warns about that intrinsic's undefined pass-through operand).
__m512i iq4_table_u8() {
  alignas(64) static constexpr uint8_t kTable[64] = {
      1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
      1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
      1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241,
      1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
  static_assert([] {
    for (int i = 0; i < 64; ++i)
      if (kTable[i] != kIq4Values[i % 16] + 128) return false;
    return true;
  }());
  return _mm512_load_si512(kTable);
}

// −128·(Σ of each int32 lane's 4 bytes of lo + 4 bytes of hi): the seed that removes the +128.
__m512i seed128(__m512i lo, __m512i hi) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo), ones, hi);
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7));
}

// ---------------------------------------------------------------------------------------------
// IQ4_XS

// The IQ4_XS tiles' constants, built in one place (each tile builds them once, into registers).
struct IQ4XSConsts {
  __m512i tbl, m4;
  __m256i sh_l, sh_h, m15, m48, k32;
  LARDER_GEMM_INLINE IQ4XSConsts()
      : tbl(iq4_table_u8()),
        m4(_mm512_set1_epi8(0x0f)),
        sh_l(_mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
        sh_h(_mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
        m15(_mm256_set1_epi32(15)),
        m48(_mm256_set1_epi32(48)),
        k32(_mm256_set1_epi32(32)) {}
};

// One row's super-block in registers: ls_j (j = 0..7, int32) and the codes v + 128 of A's and B's
// low and high nibbles (see the header).
struct IQ4XSRow {
  __m256i ls;
  __m512i ua_lo, ua_hi, ub_lo, ub_hi;
};

LARDER_GEMM_INLINE IQ4XSRow unpack_iq4xs_row(const uint8_t* blk, const IQ4XSConsts& c) {
  IQ4XSRow w;
  // ls_j = (scales_l nibble j | scales_h bits 2j..2j+1 << 4) − 32, j = 0..7 in one ymm.
  uint32_t sl;
  std::memcpy(&sl, blk + offsetof(BlockIQ4_XS, scales_l), 4);
  const uint32_t sh = load_u16(blk + offsetof(BlockIQ4_XS, scales_h));
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sl)), c.sh_l), c.m15);
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sh << 4)), c.sh_h), c.m48);
  w.ls = _mm256_sub_epi32(_mm256_or_si256(lo, hi), c.k32);
  const __m512i va = _mm512_loadu_si512(blk + offsetof(BlockIQ4_XS, qs));
  const __m512i vb = _mm512_loadu_si512(blk + offsetof(BlockIQ4_XS, qs) + 64);
  w.ua_lo = _mm512_shuffle_epi8(c.tbl, _mm512_and_si512(va, c.m4));
  w.ua_hi = _mm512_shuffle_epi8(c.tbl, _mm512_and_si512(_mm512_srli_epi16(va, 4), c.m4));
  w.ub_lo = _mm512_shuffle_epi8(c.tbl, _mm512_and_si512(vb, c.m4));
  w.ub_hi = _mm512_shuffle_epi8(c.tbl, _mm512_and_si512(_mm512_srli_epi16(vb, 4), c.m4));
  return w;
}

struct IQ4XSDecode {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 1;  // matmul_driver.h rows1: 1B IQ4_XS decode 41.7 → 47.9 tok/s
  static constexpr int kRowsN = 2;
  static constexpr int kActBytes = 384;  // per token and super-block: xA_lo, xA_hi, xB_lo, xB_hi, seedA, seedB
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const uint8_t* acts;  // [n][nsb][384]
  const float* dx;      // [n][nsb] (QuantizedActsK::d)
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m512 acc[R][T];
    zero_acc(acc);
    const IQ4XSConsts c;
    const __m512i pat_a = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i pat_b = _mm512_add_epi32(pat_a, _mm512_set1_epi32(4));
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * sizeof(BlockIQ4_XS), sizeof(BlockIQ4_XS));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * sizeof(BlockIQ4_XS);
        const IQ4XSRow wr = unpack_iq4xs_row(blk, c);
        const __m512 sc16 = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(f16[load_u16(blk)]), _mm256_cvtepi32_ps(wr.ls)));
        const __m512 sca = _mm512_permutexvar_ps(pat_a, sc16), scb = _mm512_permutexvar_ps(pat_b, sc16);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t at = (t0 + t) * nsb + sb;
          const uint8_t* x = acts + at * kActBytes;
          const __m512i da = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_load_si512(x + 256), wr.ua_lo, _mm512_load_si512(x)), wr.ua_hi,
              _mm512_load_si512(x + 64));
          const __m512i db = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_load_si512(x + 320), wr.ub_lo, _mm512_load_si512(x + 128)), wr.ub_hi,
              _mm512_load_si512(x + 192));
          const __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(db), scb, _mm512_mul_ps(_mm512_cvtepi32_ps(da), sca));
          acc[r][t] = _mm512_fmadd_ps(s, _mm512_set1_ps(dx[at]), acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// Quantizes x per super-block (QuantizedActsK, slot 0) and lays out the IQ4XSDecode activations
// (slot 1) for w; matmul_multi reuses them for every weight of the group.
IQ4XSDecode prepare_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nsb = cols / 256;
  QuantizedActsK a = quantize_acts_k_scratch(x, n, cols);
  auto* acts = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n * nsb) * IQ4XSDecode::kActBytes + 64, 1));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const int8_t* q = a.token(t) + sb * 256;
      uint8_t* dst = acts + (t * nsb + sb) * IQ4XSDecode::kActBytes;
      for (int h = 0; h < 2; ++h) {      // A: sub-blocks 0–3, B: 4–7
        for (int k = 0; k < 4; ++k) {
          const int8_t* sub = q + 32 * (4 * h + k);
          std::memcpy(dst + 128 * h + 16 * k, sub, 16);
          std::memcpy(dst + 128 * h + 64 + 16 * k, sub + 16, 16);
        }
        _mm512_store_si512(dst + 256 + 64 * h, seed128(_mm512_load_si512(dst + 128 * h), _mm512_load_si512(dst + 128 * h + 64)));
      }
    }
  }
  return IQ4XSDecode{w.data, w.row_bytes(), w.rows, nsb, acts, a.d, y};
}

// The prefill GEMM's super-block arithmetic (see the header), as Q45KDecode::tile_inv: kG
// super-blocks a pass, so that a pass holds eight (row, token, super-block) items, both brackets
// of all of them summed exactly (super_pair, super_sums8), t for all of them in a few vector ops
// (super_t8), then each (row, token)'s chain acc += t·d_x in super-block order.
struct IQ4XSDecodeInv {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 1;  // matmul_driver.h rows1: 1B IQ4_XS decode 41.7 → 47.9 tok/s
  static constexpr int kRowsN = 2;
  static constexpr int kActBytes = 320;  // per token and super-block: xA_lo, xA_hi, xB_lo, xB_hi, −128·Σq per sub-block
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const uint8_t* acts;  // [n][nsb][320]
  const float* dx;      // [n][nsb] (QuantizedActsK::d)
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    constexpr int kRT = R * T;  // 1, 2, 3, 4, 6 or 8 (matmul_driver.h tiles)
    constexpr int kG = kRT == 1 ? 8 : kRT == 2 ? 4 : kRT <= 4 ? 2 : 1;
    __m128 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm_setzero_ps();
    const IQ4XSConsts c;
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    int64_t sb = 0;
    for (; sb + kG <= nsb; sb += kG) pass<R, T, kG, kPf>(c, base, t0, sb, acc);
    if constexpr (kG >= 8) if (sb + 4 <= nsb) { pass<R, T, 4, kPf>(c, base, t0, sb, acc); sb += 4; }
    if constexpr (kG >= 4) if (sb + 2 <= nsb) { pass<R, T, 2, kPf>(c, base, t0, sb, acc); sb += 2; }
    if constexpr (kG >= 2) if (sb < nsb) pass<R, T, 1, kPf>(c, base, t0, sb, acc);
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = _mm_cvtss_f32(acc[r][t]);
  }

  // Item k = (g·R + r)·T + t. S = Σ_j ls_j·Σ (v + 128)·q, and in place of M (the GEMM's
  // Σ_j 128·ls_j·Σq with dmin = d) its negation −M against −d: the same product, exactly.
  template <int R, int T, int G, int kPf>
  LARDER_GEMM_INLINE void pass(const IQ4XSConsts& c, const uint8_t* base, int64_t t0, int64_t sb0,
                               __m128 (&acc)[R][T]) const {
    constexpr int kItems = G * R * T;
    // ls_j on the two lanes of sub-block j after pair_sums16(A lanes, B lanes).
    const __m512i pat = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512i z[4];
    LARDER_UNROLL
    for (int j = (kItems + 1) / 2; j < 4; ++j) z[j] = _mm512_setzero_si512();
    alignas(32) uint32_t dw[8] = {};  // the items' (d, −d) f16 words, at super_word(k)
    __m512i s_prev = _mm512_setzero_si512();
    __m256i m_prev = _mm256_setzero_si256();
    LARDER_UNROLL
    for (int g = 0; g < G; ++g) {
      const int64_t sb = sb0 + g;
      prefetch_rows<kPf>(base, R, row_bytes, sb * sizeof(BlockIQ4_XS), sizeof(BlockIQ4_XS));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * sizeof(BlockIQ4_XS);
        const IQ4XSRow wr = unpack_iq4xs_row(blk, c);
        const __m512i ls2 = _mm512_permutexvar_epi32(pat, _mm512_zextsi256_si512(wr.ls));
        const uint32_t d16 = load_u16(blk);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int k = (g * R + r) * T + t;
          const uint8_t* x = acts + ((t0 + t) * nsb + sb) * kActBytes;
          // Σ u·q with u = v + 128 (no seed: the GEMM keeps the +128 in its mins term).
          const __m512i da = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wr.ua_lo, _mm512_load_si512(x)), wr.ua_hi,
              _mm512_load_si512(x + 64));
          const __m512i db = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wr.ub_lo, _mm512_load_si512(x + 128)), wr.ub_hi,
              _mm512_load_si512(x + 192));
          const __m512i sk = _mm512_mullo_epi32(pair_sums16(da, db), ls2);
          const __m256i mk = _mm256_mullo_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + 256)), wr.ls);
          dw[super_word(k)] = d16 | (d16 ^ 0x8000u) << 16;  // (d, −d): the sign bit flipped
          if (k % 2 == 0) {
            s_prev = sk;
            m_prev = mk;
            continue;
          }
          z[k / 2] = super_pair(s_prev, sk, _mm512_inserti64x4(_mm512_zextsi256_si512(m_prev), mk, 1));
        }
      }
    }
    if constexpr (kItems % 2 == 1) z[kItems / 2] = super_pair(s_prev, _mm512_setzero_si512(), _mm512_zextsi256_si512(m_prev));
    alignas(64) float tv[16];
    _mm512_store_ps(tv, super_t8(super_sums8(z), super_scales8(dw)));
    LARDER_UNROLL
    for (int g = 0; g < G; ++g)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r)
        LARDER_UNROLL
        for (int t = 0; t < T; ++t)
          acc[r][t] = _mm_fmadd_ss(_mm_load_ss(tv + super_lane((g * R + r) * T + t)),
                                   _mm_load_ss(dx + (t0 + t) * nsb + sb0 + g), acc[r][t]);
  }
};

// As prepare_iq4_xs, the activations laid out for IQ4XSDecodeInv.
IQ4XSDecodeInv prepare_iq4_xs_inv(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nsb = cols / 256;
  QuantizedActsK a = quantize_acts_k_scratch(x, n, cols);
  auto* acts = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n * nsb) * IQ4XSDecodeInv::kActBytes + 64, 1));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const int8_t* q = a.token(t) + sb * 256;
      uint8_t* dst = acts + (t * nsb + sb) * IQ4XSDecodeInv::kActBytes;
      for (int h = 0; h < 2; ++h) {      // A: sub-blocks 0–3, B: 4–7
        for (int k = 0; k < 4; ++k) {
          const int8_t* sub = q + 32 * (4 * h + k);
          std::memcpy(dst + 128 * h + 16 * k, sub, 16);
          std::memcpy(dst + 128 * h + 64 + 16 * k, sub + 16, 16);
        }
      }
      // −128·Σq of sub-block j at int32 j (the rest of the 64 bytes zero): the GEMM's mins term,
      // negated, to be scaled by ls_j lane-wise.
      alignas(64) int32_t m[16] = {};
      for (int j = 0; j < 8; ++j) {
        int sum = 0;
        for (int i = 0; i < 32; ++i) sum += q[32 * j + i];
        m[j] = -128 * sum;
      }
      std::memcpy(dst + 256, m, 64);
    }
  }
  return IQ4XSDecodeInv{w.data, w.row_bytes(), w.rows, nsb, acts, a.d, y};
}

// ---------------------------------------------------------------------------------------------
// IQ4_NL: four 18-byte blocks (72 bytes, every field 16-bit aligned) per step, as Q4_0Quad.
struct IQ4NLQuad {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, ng, nb;  // 4-block groups per row (the last may be partial), blocks per row
  const uint8_t* acts;   // [n][ng][256]: x_lo[64], x_hi[64], seed[16] i32, d_x[16] f32
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const __m512i tbl = iq4_table_u8(), m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    const int64_t full = nb / 4;
    auto step = [&](int64_t g, bool tail) {
      prefetch_rows<kPf>(base, R, row_bytes, g * 72, tail ? row_bytes - g * 72 : 72);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const Quad18 q = load_quad18(base + r * row_bytes + 72 * g, tail, nb - 4 * g);
        const __m512i lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(q.codes, m4));
        const __m512i hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(q.codes, 4), m4));
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const uint8_t* a = acts + ((t0 + t) * ng + g) * 256;
          const __m512i v = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_load_si512(a + 128), lo, _mm512_load_si512(a)), hi, _mm512_load_si512(a + 64));
          const __m512 sc = _mm512_mul_ps(q.d, _mm512_load_ps(reinterpret_cast<const float*>(a + 192)));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), sc, acc[r][t]);
        }
      }
    };
    for (int64_t g = 0; g < full; ++g) step(g, false);
    if (full < ng) step(full, true);
    store_acc(acc, y, rows, r0, t0);
  }
};

IQ4NLQuad prepare_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, ng = (nb + 3) / 4;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  auto* out = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n * ng) * 256 + 64, 1));
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t g = 0; g < ng; ++g) {
      uint8_t* dst = out + (t * ng + g) * 256;
      alignas(64) uint8_t lo[64] = {}, hi[64] = {};
      alignas(64) float dx[16] = {};
      for (int k = 0; k < 4 && 4 * g + k < nb; ++k) {
        const int64_t b = 4 * g + k;
        std::memcpy(lo + 16 * k, q + 32 * b, 16);
        std::memcpy(hi + 16 * k, q + 32 * b + 16, 16);
        for (int l = 0; l < 4; ++l) dx[4 * k + l] = a.scales(b)[t];
      }
      const __m512i xl = _mm512_load_si512(lo), xh = _mm512_load_si512(hi);
      _mm512_store_si512(dst, xl);
      _mm512_store_si512(dst + 64, xh);
      _mm512_store_si512(dst + 128, seed128(xl, xh));
      _mm512_store_ps(reinterpret_cast<float*>(dst + 192), _mm512_load_ps(dx));
    }
  }
  return IQ4NLQuad{w.data, w.row_bytes(), w.rows, ng, nb, out, y};
}

// Fused decode (kernels::matmul_multi): the first weight's prepared activations serve them all.
template <class K>
void decode_multi(K (*prepare)(const WeightView&, const float*, int64_t, float*), const WeightView* ws,
                  float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(prepare(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + ws[0].cols / 8);
}

template <class K>
void decode_one(K (*prepare)(const WeightView&, const float*, int64_t, float*), const WeightView& w, const float* x,
                int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const K k = prepare(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, w.cols + w.cols / 8);
}

}  // namespace

void decode_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  if (batch_invariant_decode()) return decode_one(prepare_iq4_xs_inv, w, x, n, y);
  decode_one(prepare_iq4_xs, w, x, n, y);
}
void decode_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) { decode_one(prepare_iq4_nl, w, x, n, y); }

void matmul_multi_iq4_xs(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant_amx(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  if (batch_invariant_decode()) return decode_multi(prepare_iq4_xs_inv, ws, ys, count, x, n);
  decode_multi(prepare_iq4_xs, ws, ys, count, x, n);
}
void matmul_multi_iq4_nl(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  decode_multi(prepare_iq4_nl, ws, ys, count, x, n);
}

}  // namespace larder::kernels::cpu::avx512
