// decode_q2k_q3k_q6k_avx512.cpp — GGUF Q6_K, Q3_K and Q2_K decode (n < kGemm16MinTokens) on the
// AVX-512 tier: integer super-block accumulation over QuantizedActsK (act_quant.h).
// Q3_K and Q2_K are registered (matmul_gguf_avx512.cpp calls them); Q6_K's is not yet: with it the
// gemma-3-270m greedy parity test (tests/goldens/greedy_test.py) takes a token the exact model
// rejects by 0.33 nats — ffn_down's activations have outliers that one scale per 256 values
// coarsens for the rest (kernel tests pass; the error is the quantizer's, not the kernel's).
//
// With one activation scale d_x per 256 values (the weight super-block), a super-block's dot
// product is one integer per (row, token):
//   Q6_K:  Σ_s sc_s·[Σ u·q_x − 32·Σ_16 q_x]           u = q + 32 ∈ 0..63, sc_s int8
//   Q3_K:  Σ_s sc_s·[Σ u·q_x −  4·Σ_16 q_x]           u = low2 | hbit << 2 ∈ 0..7, sc_s ∈ −32..31
//   Q2_K:  Σ_s sc_s·Σ u·q_x   and   Σ_s m_s·Σ_16 q_x  u ∈ 0..3, sc_s, m_s ∈ 0..15 (two integers:
//                                                     the mins have their own f16 scale dmin)
// scaled once: y += d_x·d·I (− d_x·dmin·M). Per 64 weights and token: vpmaddubsw(u, q_x) gives
// int16 pair sums, vpdpwssd multiplies them by the sub-block scale as an int16 multiplier (each
// 128-bit lane of a chunk is one 16-element sub-block, the scales are spread into that pattern
// once per row by vpermw) and adds into int32. The zero point is one more vpmaddwd of the 16
// scales (times 32 or 4) against the negated int16 activation sums per 16, at the head of the
// chain; the Q2_K mins the same against m_s. Per 256 weights and token: 4 maddubs + 4 dpwssd +
// 1 madd + 1 add + cvt + 2 f32 ops, against the float-per-64 kernel's 4 × (dpbusd, sub, cvt, mul,
// FMA) before.
// Bounds (no saturation, no overflow): maddubs pairs <= 2·63·127 = 16002 (Q6_K), 2·7·127 (Q3_K),
// 2·3·127 (Q2_K) < 2^15; a dpwssd lane adds 2·16002·128 per chunk, four chunks < 2^24; the zero
// point |32·sc·Σ_16 q_x| <= 32·128·2032 < 2^24; the 16 lanes of one super-block < 2^29.
//
// Element order: Q6_K unpacks in natural order (half h of a super-block = one 64-byte ql load and
// its 32 qh bytes broadcast to both 256-bit halves: chunk 2h = elements 128h + 0..63, chunk
// 2h + 1 = 128h + 64..127), so it reads the quantizer's int8 values as they are. Q2_K and Q3_K
// keep 4 codes per byte: byte 32h + l holds elements 128h + 32s + l (s = 0..3, bits 2s..2s+1), so
// one 64-byte load shifted by 2s gives chunk s = [elements 32s..32s+31 | 128+32s..128+32s+31];
// their activations are permuted into that order once per matmul.
#include <immintrin.h>

#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// vpermw index: 128-bit lane L of the result holds int16 scale idx[L] in all 8 lanes.
inline __m512i lane_pattern(int a, int b, int c, int d) {
  const int v[4] = {a, b, c, d};
  alignas(64) int16_t p[32];
  for (int i = 0; i < 32; ++i) p[i] = static_cast<int16_t>(v[i / 8]);
  return _mm512_load_si512(p);
}

// One row's super-block, unpacked into registers: codes per 64-element chunk, the matching int16
// scale multipliers, the zero-point / min multipliers per 16, and the f16 scales.
struct Unpacked {
  __m512i u[4];
  __m512i mul[4];
  __m256i zmul;   // scales × zero point (Q6_K: 32·sc, Q3_K: 4·sc; Q2_K: m) against −Σ_16 q_x
  float d, dmin;  // dmin: Q2_K only
};

// Q6_K (210 B): ql[128] | qh[64] | int8 scales[16] | f16 d; chunk j = elements 64j..64j+63.
struct Q6K {
  static constexpr int kBlockBytes = sizeof(BlockQ6_K);
  static constexpr bool kMins = false;
  static constexpr bool kPermuted = false;
  __m512i pat[4];
  Q6K() {
    for (int j = 0; j < 4; ++j) pat[j] = lane_pattern(4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3);
  }
  LARDER_GEMM_INLINE void unpack(const uint8_t* blk, const float* f16, Unpacked& o) const {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    // Bits 2k..2k+1 of qh to bits 4..5: k = 0 | 1 (low | high 256 bits) by a left shift of 4 | 2,
    // k = 2 | 3 by a right shift of 0 | 2 (64-bit lanes; the 0x30 mask drops what crosses bytes).
    const __m512i shl = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), shr = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    LARDER_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
      const __m512i ha = _mm512_and_si512(_mm512_sllv_epi64(qh, shl), m30);
      const __m512i hb = _mm512_and_si512(_mm512_srlv_epi64(qh, shr), m30);
      // (A & C) | B with C = 0x0f: the nibble, or-ed with its two high bits.
      o.u[2 * h] = _mm512_ternarylogic_epi32(ql, ha, m4, 0xEC);
      o.u[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), hb, m4, 0xEC);
    }
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales))));
    const __m512i sz = _mm512_zextsi256_si512(sc);
    LARDER_UNROLL
    for (int j = 0; j < 4; ++j) o.mul[j] = _mm512_permutexvar_epi16(pat[j], sz);
    o.zmul = _mm256_slli_epi16(sc, 5);
    o.d = f16[load_u16(blk + offsetof(BlockQ6_K, d))];
  }
};

// The chunk order shared by Q2_K and Q3_K: chunk s = sub-blocks [2s, 2s+1, 8+2s, 9+2s].
inline void two_bit_patterns(__m512i (&pat)[4]) {
  for (int s = 0; s < 4; ++s) pat[s] = lane_pattern(2 * s, 2 * s + 1, 8 + 2 * s, 9 + 2 * s);
}

// Q2_K (84 B): scales[16] (low nibble sc, high nibble m) | qs[64] | f16 d | f16 dmin.
struct Q2K {
  static constexpr int kBlockBytes = sizeof(BlockQ2_K);
  static constexpr bool kMins = true;
  static constexpr bool kPermuted = true;
  __m512i pat[4];
  Q2K() { two_bit_patterns(pat); }
  LARDER_GEMM_INLINE void unpack(const uint8_t* blk, const float* f16, Unpacked& o) const {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i v = _mm512_loadu_si512(blk + offsetof(BlockQ2_K, qs));
    o.u[0] = _mm512_and_si512(v, m3);
    o.u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 2), m3);
    o.u[2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m3);
    o.u[3] = _mm512_and_si512(_mm512_srli_epi16(v, 6), m3);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ2_K, scales)));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m512i sz = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(b, m4)));
    LARDER_UNROLL
    for (int s = 0; s < 4; ++s) o.mul[s] = _mm512_permutexvar_epi16(pat[s], sz);
    o.zmul = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
    o.d = f16[load_u16(blk + offsetof(BlockQ2_K, d))];
    o.dmin = f16[load_u16(blk + offsetof(BlockQ2_K, dmin))];
  }
};

// Q3_K (110 B): hmask[32] | qs[64] | 12 B scales | f16 d. u = low2 + 4·hbit (q = u − 4): the
// hmask bit of element 128h + 32s + l is bit 4h + s of hmask[l], so with hmask broadcast to both
// 256-bit halves, chunk s tests bit s (low half) and 4 + s (high half) of each byte.
struct Q3K {
  static constexpr int kBlockBytes = sizeof(BlockQ3_K);
  static constexpr bool kMins = false;
  static constexpr bool kPermuted = true;
  __m512i pat[4];
  __m512i hbit[4];
  Q3K() {
    two_bit_patterns(pat);
    for (int s = 0; s < 4; ++s) {
      alignas(64) uint8_t b[64];
      for (int i = 0; i < 64; ++i) b[i] = static_cast<uint8_t>(1u << (i < 32 ? s : 4 + s));
      hbit[s] = _mm512_load_si512(b);
    }
  }
  LARDER_GEMM_INLINE void unpack(const uint8_t* blk, const float* f16, Unpacked& o) const {
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i v = _mm512_loadu_si512(blk + offsetof(BlockQ3_K, qs));
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ3_K, hmask))));
    LARDER_UNROLL
    for (int s = 0; s < 4; ++s) {
      const __m512i lo = _mm512_and_si512(s == 0 ? v : _mm512_srli_epi16(v, 2 * s), m3);
      o.u[s] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, hbit[s]), lo, four);
    }
    // Sixteen 6-bit scales (ref/kquant.cpp q3_k_scale): low nibbles from bytes 0..7 (i < 8) and
    // their high nibbles (i >= 8); bits 4..5 are bits 2(i/4).. of byte 8 + i % 4. A 16-byte load
    // ending at the block's last byte (offset 94: 2 bytes of qs, the 12 scale bytes, d) stays
    // inside the row.
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ3_K, scales) - 2));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i a = _mm_srli_si128(w, 2);  // bytes 0..7 = scale bytes 0..7
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4));
    const __m128i hb = _mm_shuffle_epi8(w, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(hb, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    const __m128i sc8 = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    const __m256i sc = _mm256_cvtepi8_epi16(sc8);
    const __m512i sz = _mm512_zextsi256_si512(sc);
    LARDER_UNROLL
    for (int s = 0; s < 4; ++s) o.mul[s] = _mm512_permutexvar_epi16(pat[s], sz);
    o.zmul = _mm256_slli_epi16(sc, 2);
    o.d = f16[load_u16(blk + offsetof(BlockQ3_K, d))];
  }
};

template <class F>
struct KDecode {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  F fmt;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  const int8_t* acts;    // [n][nsb][256] int8 (natural order, or the chunk order for Q2_K/Q3_K)
  const int16_t* nsum;   // [n][nsb][16] −Σ q_x per 16 values (natural order)
  const float* dx;       // [n][nsb]
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m512 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(base, R, row_bytes, sb * F::kBlockBytes, F::kBlockBytes);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        Unpacked u;
        fmt.unpack(base + r * row_bytes + sb * F::kBlockBytes, f16, u);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t at = (t0 + t) * nsb + sb;
          const int8_t* xa = acts + at * 256;
          const __m256i ns = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nsum + at * 16));
          // Two chains of two dpwssd each (latency), the zero point at the head of the second.
          __m512i p0 = _mm512_madd_epi16(_mm512_maddubs_epi16(u.u[0], _mm512_load_si512(xa)), u.mul[0]);
          __m512i p1;
          if constexpr (F::kMins) {
            p1 = _mm512_madd_epi16(_mm512_maddubs_epi16(u.u[2], _mm512_load_si512(xa + 128)), u.mul[2]);
          } else {
            p1 = _mm512_zextsi256_si512(_mm256_madd_epi16(u.zmul, ns));
            p1 = _mm512_dpwssd_epi32(p1, _mm512_maddubs_epi16(u.u[2], _mm512_load_si512(xa + 128)), u.mul[2]);
          }
          p0 = _mm512_dpwssd_epi32(p0, _mm512_maddubs_epi16(u.u[1], _mm512_load_si512(xa + 64)), u.mul[1]);
          p1 = _mm512_dpwssd_epi32(p1, _mm512_maddubs_epi16(u.u[3], _mm512_load_si512(xa + 192)), u.mul[3]);
          const float sx = dx[at];
          __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)), _mm512_set1_ps(u.d * sx));
          if constexpr (F::kMins) {
            // −Σ m_s·Σ_16 q_x, scaled by dmin (8 lanes).
            const __m256 mf = _mm256_cvtepi32_ps(_mm256_madd_epi16(u.zmul, ns));
            f = _mm512_add_ps(f, _mm512_zextps256_ps512(_mm256_mul_ps(mf, _mm256_set1_ps(u.dmin * sx))));
          }
          acc[r][t] = _mm512_add_ps(acc[r][t], f);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// Quantizes x per super-block (slot 0 of the calling thread) and derives the negated sums per 16
// and, for the two-bit formats, the permuted activations (slot 1).
template <class F>
KDecode<F> prepare(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nsb = cols / 256;
  QuantizedActsK a = quantize_acts_k_scratch(x, n, cols);
  const size_t act_bytes = F::kPermuted ? static_cast<size_t>(n * cols) : 0;
  auto* buf = static_cast<uint8_t*>(thread_scratch(act_bytes + static_cast<size_t>(n * nsb) * 32 + 64, 1));
  auto* nsum = reinterpret_cast<int16_t*>(buf + act_bytes);
  const int64_t ns = n * nsb * 16;
  for (int64_t i = 0; i < ns; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsum + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(nsum + i), _mm256_sub_epi16(_mm256_setzero_si256(), v));
  }
  const int8_t* acts = a.qs;
  if constexpr (F::kPermuted) {
    auto* p = reinterpret_cast<int8_t*>(buf);
    for (int64_t b = 0; b < n * nsb; ++b) {
      const int8_t* src = a.qs + b * 256;  // tokens are contiguous: [n][nsb][256]
      int8_t* dst = p + b * 256;
      for (int s = 0; s < 4; ++s) {
        std::memcpy(dst + 64 * s, src + 32 * s, 32);
        std::memcpy(dst + 64 * s + 32, src + 128 + 32 * s, 32);
      }
    }
    acts = p;
  }
  return KDecode<F>{F(), w.data, w.row_bytes(), w.rows, nsb, acts, nsum, a.d, y};
}

template <class F>
void decode(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const KDecode<F> k = prepare<F>(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, w.cols + w.cols / 8);
}

// Fused decode (kernels::matmul_multi): the first weight's prepared activations serve them all.
template <class F>
void decode_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(prepare<F>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + ws[0].cols / 8);
}

}  // namespace

void decode_q6_k_superblock(const WeightView& w, const float* x, int64_t n, float* y) { decode<Q6K>(w, x, n, y); }
void decode_q3_k(const WeightView& w, const float* x, int64_t n, float* y) { decode<Q3K>(w, x, n, y); }
void decode_q2_k(const WeightView& w, const float* x, int64_t n, float* y) { decode<Q2K>(w, x, n, y); }

void decode_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  decode_multi<Q3K>(ws, ys, count, x, n);
}
void decode_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  decode_multi<Q2K>(ws, ys, count, x, n);
}

}  // namespace larder::kernels::cpu::avx512
