// matmul_kquant_avx512.cpp — GGUF Q4_K and Q6_K on the AVX-512 tier (Q4_K_M files mix the two).
//
// Prefill (n >= 9, kGemm16MinTokens) runs the 16-token-lane VNNI GEMM (gemm16_avx512.h). A Q4_K
// sub-block of 32 is exactly one activation block, and its value is d·sc_j·q − dmin·m_j: an
// unsigned 4-bit code with integer sub-block scales and mins under two f32 super-block scales,
// which the GEMM's super-block path keeps in integers over per-256 activations (gemm_multi_super;
// where AMX computes the block sums, the per-block float form of Q4_KRows). Unpacking a row turns
// every super-block into 8 × 32 code bytes (chunk c's 32 bytes give sub-block 2c from the low
// nibbles and 2c + 1 from the high ones, already in element order) plus its scales; it runs once
// per (8-row tile, chunk of token groups), off the inner loop. Q4_K decode (n <= 8) is
// in decode_q4k_q5k_avx512.cpp. Q6_K (16-element sub-block scales) runs the GEMM's half-block
// step, see Q6_KRows.
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

struct Q4_KRows {
  static constexpr int kZero = 0;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nsb;  // super-blocks per row

  int64_t groups() const { return 8 * nsb; }
  int64_t blocks_per_group() const { return 1; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = p + sb * sizeof(BlockQ4_K);
      const float d = f16[load_u16(blk)], dmin = f16[load_u16(blk + 2)];
      const Q4KScaleBytes sm = q4k_scale_bytes(blk + 4);
      for (int j = 0; j < 8; ++j) {
        scale[8 * sb + j] = d * static_cast<float>(sm.sc(j));
        bias[8 * sb + j] = -(dmin * static_cast<float>(sm.m(j)));
      }
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
        uint8_t* dst = codes + (8 * sb + 2 * c) * stride;
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst), _mm256_and_si256(v, m4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + stride), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      }
    }
  }
};

// Q6_K: value = (d·sc_s)·(u − 32), u = 4 low bits from ql | 2 high bits from qh, an int8 scale per
// 16 elements. A 32-block holds two such halves, so it runs the GEMM's half-block step (kZero < 0):
// scale d·sc and bias −32·d·sc per half. Unpacking follows ref/kquant.cpp: block j = 4h + k of a
// super-block takes its low nibbles from ql[64h + 32(k mod 2) ..] (shifted by 4 for k >= 2) and
// bits 2k..2k+1 of qh[32h ..] as bits 4..5.
struct Q6_KRows {
  static constexpr int kZero = -1;
  static constexpr int kHalfZero = 32;  // bias = −32·scale: folded in the integer sums (Gemm16::halves)
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nsb;

  int64_t groups() const { return 16 * nsb; }  // 16-element halves
  int64_t blocks_per_group() const { return 1; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = p + sb * sizeof(BlockQ6_K);
      const uint8_t* ql = blk;
      const uint8_t* qh = blk + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6_K, scales));
      const float d = f16[load_u16(blk + offsetof(BlockQ6_K, d))];
      for (int i = 0; i < 16; ++i) {
        const float ds = d * static_cast<float>(sc[i]);
        scale[16 * sb + i] = ds;
        bias[16 * sb + i] = -32.0f * ds;
      }
      for (int j = 0; j < 8; ++j) {
        const int h = j / 4, k = j % 4;
        __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32 * (k % 2)));
        if (k >= 2) lo = _mm256_srli_epi16(lo, 4);
        lo = _mm256_and_si256(lo, m4);
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * k)), m2);
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (8 * sb + j) * stride),
                           _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
      }
    }
  }
};


// The Q6_K decode tiles' constants, built in one place (each tile builds them once, into registers).
struct Q6KConsts {
  __m512i m4, m30;
  // Bits (0,1 | 2,3) of qh to bits 4..5: left by 4 | 2; bits (4,5 | 6,7): right by 0 | 2.
  __m512i sh_lo, sh_hi;
  LARDER_GEMM_INLINE Q6KConsts()
      : m4(_mm512_set1_epi8(0x0f)),
        m30(_mm512_set1_epi8(0x30)),
        sh_lo(_mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2)),
        sh_hi(_mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)) {}
};

// One row's super-block codes in registers (see Q6KDecode): u[2h] elements 128h + 0..63, u[2h + 1]
// elements 128h + 64..127, unsigned 6-bit.
LARDER_GEMM_INLINE void unpack_q6_codes(const uint8_t* blk, const Q6KConsts& c, __m512i (&u)[4]) {
  LARDER_UNROLL
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
    const __m512i hl = _mm512_and_si512(_mm512_sllv_epi64(qh, c.sh_lo), c.m30);
    const __m512i hh = _mm512_and_si512(_mm512_srlv_epi64(qh, c.sh_hi), c.m30);
    // 0xca: bit-select, m4 ? nibble : high bits.
    u[2 * h] = _mm512_ternarylogic_epi32(c.m4, ql, hl, 0xca);
    u[2 * h + 1] = _mm512_ternarylogic_epi32(c.m4, _mm512_srli_epi16(ql, 4), hh, 0xca);
  }
}

// s = d·sc of the super-block's 16 halves (Q6_KRows::unpack's product), f32.
LARDER_GEMM_INLINE __m512 q6_half_scales(const uint8_t* blk, float d) {
  return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                              reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales))))));
}

// Q6_K decode (n <= 8): 64 codes per zmm, in natural element order. Half h of a super-block
// (elements 128h..128h+127) is one 64-byte ql load [ql A | ql B] and its 32 qh bytes broadcast to
// both 256-bit halves: low nibbles | bits (0 | 2) of qh give elements 128h + 0..63, high nibbles
// | bits (4 | 6) give 128h + 64..127. A per-64-bit-lane shift (vpsllvq/vpsrlvq) moves each half's
// qh bit pair to bits 4..5 of its byte, and one vpternlogd bit-select merges them with the
// nibble. Each int32 lane of a vpdpbusd covers 4 elements of one 16-element sub-block, so the
// scale pattern is 4 lanes per sub-block (vpermps of the 16 scales), the d_x pattern 8 lanes per
// activation block. The zero point −32 is one FMA per super-block: the accumulator's lanes are
// summed at the end anyway, so the 16 scales times the token's precomputed −32·d_x·Σq of each
// sub-block can go into any 16 lanes of it. Per row and super-block: 14 vector ops to unpack, and
// per token 17 for the dots and the zero point (were 22 and 20, the zero point subtracted per
// int32 lane); kernel_bench 2048x2048 n = 1 cache-resident, 1 thread, Zen 4: 156 → 119–155 µs.
struct Q6KDecode {
  static constexpr int kRows1 = 4;
  // Zen 4 (matmul_driver.h rows1): with four interleaved rows the kernel read 11–12 GB/s from
  // DRAM, with two 21–23 (kernel_bench 8192x2048, n = 1, 1 thread: 1230–1580 → 650–890 µs; the
  // same 530 µs cache-resident either way); 1B Q6_K decode 29.7 → 32.2 tok/s (2 threads).
  static constexpr int kRows1Zen = 2;
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const int8_t* acts;    // [n][nsb][256] int8, natural order (the quantizer's own layout)
  const float* dxp;      // [n][nsb][4][16] per-lane d_x
  const float* zs;       // [n][nsb][16] −32·d_x·Σq of each 16-element sub-block
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m512 acc[R][T];
    zero_acc(acc);
    const Q6KConsts c;
    __m512i pat[4];
    LARDER_UNROLL
    for (int j = 0; j < 4; ++j) {
      pat[j] = _mm512_setr_epi32(4 * j, 4 * j, 4 * j, 4 * j, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 2,
                                 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3);
    }
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * sizeof(BlockQ6_K), sizeof(BlockQ6_K));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * sizeof(BlockQ6_K);
        const __m512 sc = q6_half_scales(blk, f16[load_u16(blk + offsetof(BlockQ6_K, d))]);
        __m512i u[4];
        unpack_q6_codes(blk, c, u);
        __m512 scp[4];
        LARDER_UNROLL
        for (int j = 0; j < 4; ++j) scp[j] = _mm512_permutexvar_ps(pat[j], sc);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t at = (t0 + t) * nsb + sb;
          const int8_t* xa = acts + at * 256;
          __m512 sum = _mm512_fmadd_ps(sc, _mm512_load_ps(zs + at * 16), acc[r][t]);
          LARDER_UNROLL
          for (int j = 0; j < 4; ++j) {
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[j], _mm512_load_si512(xa + 64 * j));
            sum = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_load_ps(dxp + at * 64 + 16 * j)), scp[j], sum);
          }
          acc[r][t] = sum;
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// The decode kernel for w with its activation patterns prepared (the calling thread's scratch
// slots 0 and 1); matmul_multi_q6_k reuses them for every weight of the group.
Q6KDecode prepare_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, nsb = cols / 256;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const size_t dxp_bytes = static_cast<size_t>(n * nsb) * 256;  // [n][nsb][4][16] of 4 bytes
  const size_t zs_bytes = static_cast<size_t>(n * nsb) * 64;    // [n][nsb][16] of 4 bytes
  auto* buf = static_cast<uint8_t*>(thread_scratch(dxp_bytes + zs_bytes + 64, 1));
  auto* dxp = reinterpret_cast<float*>(buf);
  auto* zs = reinterpret_cast<float*>(buf + dxp_bytes);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t b = 0; b < nb; ++b) {
      float* dp = dxp + t * nsb * 64 + b * 8;  // 8 lanes per activation block, blocks in order
      const float dx = a.scales(b)[t];
      for (int l = 0; l < 8; ++l) dp[l] = dx;
      for (int s = 0; s < 2; ++s) {  // the block's two 16-element sub-blocks
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[32 * b + 16 * s + i];
        zs[t * nsb * 16 + 2 * b + s] = -32.0f * dx * static_cast<float>(sum);
      }
    }
  }
  return Q6KDecode{w.data, w.row_bytes(), w.rows, nsb, a.qs, dxp, zs, y};
}

// Batch-invariant Q6_K decode (batch_invariant_decode(), LARDER_BATCH_INVARIANT=1): the prefill
// GEMM's arithmetic, so a token's row is bit-identical whatever the call's size (issue 41): per
// 32-block b, Gemm16::halves computes for each token
//   t_b = fma(cvt(H_b), s_hi, cvt(L_b)·s_lo),   acc = fma(t_b, d_x(b), acc)   (blocks in order)
// with L_b, H_b = Σ u·q − 32·Σq over the block's two 16-element halves (exact int32) and
// s = d·sc (f32). The codes are Q6KDecode's (unpack_q6_codes). Per token, the four vpdpbusd leave
// 4 int32 lanes per 16-element half; three pair-sum steps (exact) give one vector of the
// super-block's 16 half sums in order, then L, H and the scales meet lane-wise (odd lanes shifted
// onto even ones), and the eight t_b enter the token's f32 chain one by one — the GEMM's order.
// The reduction and the chain are what this costs over Q6KDecode's per-lane sums (bench/RESULTS.md,
// session 37: ~1.3–1.5× its time). Tried in session 38 and dropped: 8-row tiles whose rows'
// chains ran as one ymm chain (each row's t_b stored, 8×8 transposed, 4 super-blocks at a time):
// the row-chunked order broke the weight stream (down 2048x8192 535 → 738 µs CPU).
struct Q6KDecodeInv {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 2;  // Q6KDecode's tiles (the same weight stream)
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const int8_t* acts;    // [n][nsb][256] int8, natural order (the quantizer's own layout)
  const int32_t* zq;     // [n][nsb][16] 32·Σq of each 16-element half
  const float* dx;       // [n][nsb·8] d_x per activation block, token-major
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m128 acc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) acc[r][t] = _mm_setzero_ps();
    const Q6KConsts c;
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * sizeof(BlockQ6_K), sizeof(BlockQ6_K));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = base + r * row_bytes + sb * sizeof(BlockQ6_K);
        // s = d·sc per half, and the odd halves' on the even lanes.
        const __m512 sc = q6_half_scales(blk, f16[load_u16(blk + offsetof(BlockQ6_K, d))]);
        const __m512 sc_hi = _mm512_castsi512_ps(_mm512_srli_epi64(_mm512_castps_si512(sc), 32));
        __m512i u[4];
        unpack_q6_codes(blk, c, u);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t at = (t0 + t) * nsb + sb;
          const int8_t* xa = acts + at * 256;
          __m512i p[4];
          LARDER_UNROLL
          for (int j = 0; j < 4; ++j) p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[j], _mm512_load_si512(xa + 64 * j));
          const __m512i half = _mm512_sub_epi32(pair_sums16(pair_sums16(p[0], p[1]), pair_sums16(p[2], p[3])),
                                                _mm512_load_si512(zq + at * 16));
          const __m512 f = _mm512_cvtepi32_ps(half);
          const __m512 f_hi = _mm512_castsi512_ps(_mm512_srli_epi64(_mm512_castps_si512(f), 32));
          alignas(64) float tb[16];  // t_b at lane 2b
          _mm512_store_ps(tb, _mm512_fmadd_ps(f_hi, sc_hi, _mm512_mul_ps(f, sc)));
          const float* dxb = dx + at * 8;
          LARDER_UNROLL
          for (int b = 0; b < 8; ++b) acc[r][t] = _mm_fmadd_ss(_mm_load_ss(tb + 2 * b), _mm_load_ss(dxb + b), acc[r][t]);
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = _mm_cvtss_f32(acc[r][t]);
  }
};

// Q6KDecodeInv for w with its activations prepared (scratch slots 0 and 1), as prepare_q6_k.
Q6KDecodeInv prepare_q6_k_inv(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, nsb = cols / 256;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const size_t zq_bytes = static_cast<size_t>(n * nsb) * 64;  // [n][nsb][16] of 4 bytes
  const size_t dx_bytes = static_cast<size_t>(n * nb) * 4;
  auto* buf = static_cast<uint8_t*>(thread_scratch(zq_bytes + dx_bytes + 64, 1));
  auto* zq = reinterpret_cast<int32_t*>(buf);
  auto* dx = reinterpret_cast<float*>(buf + zq_bytes);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t b = 0; b < nb; ++b) {
      dx[t * nb + b] = a.scales(b)[t];
      for (int s = 0; s < 2; ++s) {  // the block's two 16-element halves
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[32 * b + 16 * s + i];
        zq[t * nb * 2 + 2 * b + s] = 32 * sum;
      }
    }
  }
  return Q6KDecodeInv{w.data, w.row_bytes(), w.rows, nsb, a.qs, zq, dx, y};
}

void decode_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (batch_invariant_decode()) return run_matmul_tiles(prepare_q6_k_inv(w, x, n, y), w.rows, n, w.cols + w.cols / 8);
  run_matmul_tiles(prepare_q6_k(w, x, n, y), w.rows, n, w.cols + w.cols / 8);
}

// Fused decode (kernels::matmul_multi): the first weight's prepared activations serve them all.
template <class K>
void decode_multi(K (*prepare)(const WeightView&, const float*, int64_t, float*), const WeightView* ws,
                  float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(prepare(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + ws[0].cols / 8);
}

void gemm_q6_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemm16(ws, ys, count, x, n, [](const WeightView& w) { return Q6_KRows{w.data, w.row_bytes(), w.cols / 256}; });
}

}  // namespace

void matmul_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (n < kGemm16MinTokens) {  // batch_invariant_decode(): Q6KDecodeInv, the GEMM's arithmetic
    decode_q6_k(w, x, n, y);
    return;
  }
  gemm_q6_k(&w, &y, 1, x, n);
}

void matmul_multi_q6_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_q6_k(ws, ys, count, x, n);
  if (batch_invariant_decode()) return decode_multi(prepare_q6_k_inv, ws, ys, count, x, n);
  decode_multi(prepare_q6_k, ws, ys, count, x, n);
}

void matmul_q4_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (gemv_invariant_amx(n)) return gemv_q4_k(&w, &y, 1, x, n);
  if (n < kGemm16MinTokens) {
    decode_q4_k(w, x, n, y);  // decode_q4k_q5k_avx512.cpp
    return;
  }
  gemm_multi_q4_k(&w, &y, 1, x, n);
}

bool gemm_super_blocks(DType dtype, int64_t n) {
  const bool super = dtype == DType::kQ4_K || dtype == DType::kQ5_K || dtype == DType::kIQ4_XS;
  // Batch-invariant: one path for every n (the AMX one where AMX is used), so a token's
  // activations are quantized the same way whatever the call's size.
  if (batch_invariant_decode()) return super && !gemm_uses_amx();
  return super && n >= kGemm16MinTokens && !(gemm_uses_amx() && (n + 15) / 16 >= kAmxMinGroups);
}

// The super-block path (matmul_gguf_avx512.cpp gemm_multi_super) unless AMX computes the block
// sums, which keeps the per-block float form. Zen 4, 1 thread, kernel_bench n = 512, 3
// alternating pairs, ms: 8192x2048 58.4–60.2 → 54.4–54.6, 2048x8192 57.3–61.4 → 53.5–54.9,
// 2048x2048 14.4–14.7 → 13.5–13.8; 1B Q4_K_M pp512, 2 threads, 5 pairs: 1.04–1.17× (median 1.075×).
void gemm_multi_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (gemm_super_blocks(DType::kQ4_K, n)) return gemm_multi_super(ws, ys, count, x, n);
  gemm16(ws, ys, count, x, n, [](const WeightView& w) { return Q4_KRows{w.data, w.row_bytes(), w.cols / 256}; });
}

void gemv_q4_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (gemm_super_blocks(DType::kQ4_K, kGemm16MinTokens)) return gemv_multi_gguf(ws, ys, count, x, n);
  gemv16(ws, ys, count, x, n, [](const WeightView& w) { return Q4_KRows{w.data, w.row_bytes(), w.cols / 256}; });
}

}  // namespace larder::kernels::cpu::avx512
