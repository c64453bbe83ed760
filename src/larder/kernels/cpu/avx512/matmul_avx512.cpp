// matmul_avx512.cpp — the AVX-512 (F/BW/VL/DQ + VNNI + BF16) tier: Q8_0, Q4_0 and BF16 matmul.
// Compiled with the AVX-512 flags (src/larder/CMakeLists.txt); called only after
// cpu_features().has_avx512_tier() (common/register.cpp). F16/F32 stay on the AVX2 tier.
//
// Prefill (Q4_0 from 9 tokens, Q8_0 from 8: gemm16_avx512.h kGemm16MinTokens) runs the
// 16-token-lane VNNI GEMM (gemm16_avx512.h). Decode (fewer tokens):
// - Q8_0: four blocks per step, two per zmm (Q8_0Quad): the weight flipped to u = w + 128 is
//   vpdpbusd's unsigned operand against the int8 activations, the +128 folded out by a −128·Σq
//   seed precomputed per token.
// - Q4_0: two blocks per zmm (Q4_0Decode); the AVX2 row-pair kernel for odd block counts.
//
// BF16: activations are rounded to bf16 once per matmul; vdpbf16ps (zmm, 32 pairs per
// instruction, f32 accumulation) gives twice the FP32 FMA rate on Zen 4 (performance.md §2.1).
// The extra error is the activation rounding, ≤ 2^-9 relative per element.
#include <immintrin.h>

#include <type_traits>
#include <vector>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "larder/core/cpuid.h"
#include "larder/core/dtype.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/avx512/quad18_avx512.h"
#include "larder/kernels/cpu/avx512/simd_transpose_avx512.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// Prefill (n >= kGemm16MinTokens, Q8_0 kGemm16MinTokensQ8_0): the 16-token-lane VNNI GEMM of
// gemm16_avx512.h. Both formats become unsigned byte codes with a per-block scale and a constant zero point: Q4_0 codes are its
// nibbles (w = d·(u − 8)); Q8_0 bytes get their sign bit flipped, u = q + 128 ∈ [0, 255]
// (w = d·(u − 128)), so signed weights need no sign trick and no per-block Σw: the zero point
// folds out with the activation block sums like Q4_0's.
struct Q4_0Rows : PackedRows {
  static constexpr int kZero = 8;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const float* f16 = f16_table();
    const uint8_t* p = packed(row);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + b * sizeof(BlockQ4_0);
      scale[b] = f16[load_u16(blk)];
      // Byte j: element j in the low nibble, j + 16 in the high one.
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + stride * b), _mm_and_si128(v, m4));
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + stride * b + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    }
  }
};

struct Q8_0Rows : PackedRows {
  static constexpr int kZero = 128;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const float* f16 = f16_table();
    const uint8_t* p = packed(row);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + b * sizeof(BlockQ8_0);
      scale[b] = f16[load_u16(blk)];
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + stride * b), _mm256_xor_si256(v, flip));
    }
  }
};

template <class F>
void matmul_gemm(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemm16(ws, ys, count, x, n, [](const WeightView& w) { return F{{w.data, w.row_bytes(), w.cols / 32}}; });
}
// Batch-invariant decode of Q4_0 / Q8_0 (batch_invariant_decode()): Gemv16's arithmetic — the
// GEMM's per-token chain acc = fma(fmsub(S, d_x, kZero·bs), d_w, acc) over the blocks in order,
// 16 rows in the lanes — without its unpack to memory: the codes of two rows of a block are
// loaded straight into zmm (Q8_0: [row 2j | row 2j+1] flipped to u = q + 128; Q4_0: the code
// bytes of rows 4j..4j+3, nibbles split by masks) against the token's activations arranged to match,
// and the 16 rows' f16 scales of a block come in one gather. S is the same integer whatever the
// lane arrangement, the f32 steps are the GEMM's, so the bits are the GEMM's (tests:
// batch_invariance_test.cpp).
// Q4_1 (kKind 2: SmolLM2) the same way in the GEMM's group mode (matmul_gguf_avx512.cpp GgufRows:
// u = q + 128, scale d, bias m − 128·d; acc = fma(S·d_x, d, acc), then fma(bias, Σ bs, acc)), its
// S = Σ q·x + 128·Σ x from the nibbles' sum and the activation block's integer sum.
template <int kKind>  // 0: Q8_0, 1: Q4_0, 2: Q4_1
struct ZeroPointGemv {
  static constexpr bool kQ4 = kKind != 0, kMin = kKind == 2;
  static constexpr int kZero = kKind == 1 ? 8 : 128;
  static constexpr int64_t kBlockBytes = kKind == 0 ? 34 : kKind == 1 ? 18 : 20;
  static constexpr int64_t kCodeOffset = kMin ? 4 : 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb, n_pad;
  const uint8_t* xa;  // [n][nb][64 (Q8_0) or 128 (Q4_x)]: the token's codes as the code vectors need them
  const float* d;     // Acts16 d and bs: [nb][n_pad]
  const float* bs;
  const int32_t* qsum;  // Q4_1: [n][nb] Σ q of the activation block
  float* y;

  static LARDER_GEMM_INLINE __m512i pair_sums(__m512i A, __m512i B) {
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(A, ev, B), _mm512_permutex2var_epi32(A, od, B));
  }
  // Code vectors per block: Q8_0 two rows each ([row 2j | row 2j+1], 8 partial sums per row),
  // Q4_0 four ([4j | 4j+1 | 4j+2 | 4j+3], each row's 16 code bytes, 4 partial sums per row).
  static constexpr int kVecs = kQ4 ? 4 : 8;
  // The 16 rows' block sums from the code vectors' products (exact integer adds in any order).
  static LARDER_GEMM_INLINE __m512i row_sums(const __m512i (&v)[kVecs]) {
    if constexpr (!kQ4) {
      const __m512i x0 = pair_sums(pair_sums(v[0], v[1]), pair_sums(v[2], v[3]));
      const __m512i x1 = pair_sums(pair_sums(v[4], v[5]), pair_sums(v[6], v[7]));
      return pair_sums(x0, x1);  // x0: rows 0–7 × (k4 0–3, 4–7); x1: rows 8–15
    } else {
      return pair_sums(pair_sums(v[0], v[1]), pair_sums(v[2], v[3]));
    }
  }

  template <int T>
  void tile(int64_t r0, int64_t t0) const {
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    const __m512i ridx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
    const __m512i m4 = _mm512_set1_epi8(0x0f), mh = _mm512_set1_epi8(static_cast<char>(0xf0));
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512 zero_pt = _mm512_set1_ps(static_cast<float>(kZero));
    __m512 acc[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    // The next tile's 16 rows (one contiguous range) prefetched into L1 a share per block: the
    // tile reads 16 rows side by side, which the hardware prefetchers do not follow as one stream.
    const char* pf = reinterpret_cast<const char*>(base + 16 * row_bytes);
    const char* pf_end = reinterpret_cast<const char*>(w + static_cast<uint64_t>(rows) * row_bytes);
    const int64_t pf_step = (static_cast<int64_t>(16 * row_bytes) / 64 + nb - 1) / nb * 64;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* pb = base + b * kBlockBytes;
      for (int64_t o = 0; o < pf_step && pf + o < pf_end; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
      pf += pf_step;
      // Q4_0: lo = codes & 0x0F (elements 0–15), hi = codes & 0xF0 = 16·(elements 16–31); per
      // token dpbusd(16·dpbusd(0, lo, x 0–15), hi, x 16–31) = 16·S (Q4_0Quad's chaining).
      __m512i c[kVecs], h[kQ4 ? kVecs : 1];
      LARDER_UNROLL
      for (int j = 0; j < kVecs; ++j) {
        if constexpr (kQ4) {
          const uint8_t* p0 = pb + 4 * j * row_bytes + kCodeOffset;
          __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0)));
          v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + row_bytes)), 1);
          v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 2 * row_bytes)), 2);
          v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + 3 * row_bytes)), 3);
          c[j] = _mm512_and_si512(v, m4);
          h[j] = _mm512_and_si512(v, mh);
        } else {
          const uint8_t* p0 = pb + 2 * j * row_bytes + 2;
          const __m512i v = _mm512_inserti64x4(
              _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + row_bytes)), 1);
          c[j] = _mm512_xor_si512(v, flip);
        }
      }
      const __m512i g = _mm512_i32gather_epi32(ridx, pb, 1);
      const __m512 sc = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));  // exact, as f16_table
      __m512 bias = _mm512_setzero_ps();
      if constexpr (kMin) {  // m − 128·d, as GgufRows::unpack
        const __m512 mn = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
        bias = _mm512_sub_ps(mn, _mm512_mul_ps(_mm512_set1_ps(128.0f), sc));
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        __m512i v[kVecs];
        __m512i s;
        if constexpr (kQ4) {
          const __m512i xl = _mm512_load_si512(xa + ((t0 + t) * nb + b) * 128);
          const __m512i xh = _mm512_load_si512(xa + ((t0 + t) * nb + b) * 128 + 64);
          LARDER_UNROLL
          for (int j = 0; j < kVecs; ++j)
            v[j] = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c[j], xl), 4), h[j], xh);
          s = _mm512_srai_epi32(row_sums(v), 4);  // exact: the sums are 16·S
        } else {
          const __m512i xv = _mm512_load_si512(xa + ((t0 + t) * nb + b) * 64);
          LARDER_UNROLL
          for (int j = 0; j < kVecs; ++j) v[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c[j], xv);
          s = row_sums(v);
        }
        const __m512 dx = _mm512_set1_ps(d[b * n_pad + t0 + t]);
        if constexpr (kMin) {  // Gemm16::group1
          s = _mm512_add_epi32(s, _mm512_set1_epi32(128 * qsum[(t0 + t) * nb + b]));
          const __m512 accg = _mm512_mul_ps(_mm512_cvtepi32_ps(s), dx);
          acc[t] = _mm512_fmadd_ps(accg, sc, acc[t]);
          acc[t] = _mm512_fmadd_ps(bias, _mm512_set1_ps(0.0f + bs[b * n_pad + t0 + t]), acc[t]);
        } else {
          const __m512 zb = _mm512_mul_ps(_mm512_set1_ps(bs[b * n_pad + t0 + t]), zero_pt);
          acc[t] = _mm512_fmadd_ps(_mm512_fmsub_ps(_mm512_cvtepi32_ps(s), dx, zb), sc, acc[t]);
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * rows + r0, acc[t]);
  }
};

using GemvFn = void (*)(const WeightView*, float* const*, int, const float*, int64_t);

// Decode in the GEMM's arithmetic (batch_invariant_decode()) on ZeroPointGemv<kKind>; the last
// rows of each weight (fewer than 16) on `rest` (Gemv16 with the format's GEMM adapter: the same
// arithmetic).
template <int kKind>
void zero_point_gemv(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, GemvFn rest) {
  constexpr bool kQ4 = kKind != 0;
  if (n <= 0) return;
  const int64_t cols = ws[0].cols, nb = cols / 32;
  const Acts16 a = quantize_acts16(x, n, cols);
  const int8_t* q = token_major_codes(a);
  // Per token and block the activation bytes the code vectors meet, then Σ q per block (slot 3).
  constexpr int64_t kActBytes = kQ4 ? 128 : 64;
  const size_t xa_bytes = round_up64(static_cast<size_t>(n * nb) * kActBytes);
  auto* xa = static_cast<uint8_t*>(thread_scratch(xa_bytes + static_cast<size_t>(n * nb) * 4, 3));
  auto* qsum = reinterpret_cast<int32_t*>(xa + xa_bytes);
  for (int64_t i = 0; i < n * nb; ++i) {
    const int8_t* src = q + 32 * i;
    uint8_t* dst = xa + kActBytes * i;
    if constexpr (kQ4) {  // [x 0–15 ×4 | x 16–31 ×4]
      for (int k = 0; k < 4; ++k) {
        std::memcpy(dst + 16 * k, src, 16);
        std::memcpy(dst + 64 + 16 * k, src + 16, 16);
      }
    } else {  // [x | x]
      std::memcpy(dst, src, 32);
      std::memcpy(dst + 32, src, 32);
    }
    int sum = 0;
    for (int e = 0; e < 32; ++e) sum += src[e];
    qsum[i] = sum;
  }
  for (int i = 0; i < count; ++i) {
    const WeightView& w = ws[i];
    const ZeroPointGemv<kKind> k{w.data, w.row_bytes(), w.rows, nb, a.n_pad, xa, a.d, a.bs, qsum, ys[i]};
    gemv_regions(w.rows / 16 * 16, [&](int64_t r0, int) {
      for (int64_t t = 0; t < n; t += 4) {  // groups of up to 4 tokens: 4 accumulators beside the codes
        switch (std::min<int64_t>(4, n - t)) {
          case 1: k.template tile<1>(r0, t); break;
          case 2: k.template tile<2>(r0, t); break;
          case 3: k.template tile<3>(r0, t); break;
          default: k.template tile<4>(r0, t); break;
        }
      }
    });
  }
  // After every full tile: `rest` quantizes x again into the scratch slots read above.
  for (int i = 0; i < count; ++i) {
    const WeightView& w = ws[i];
    const int64_t full = w.rows / 16 * 16;
    if (full == w.rows) continue;
    WeightView tail = w;
    tail.data = w.data + static_cast<uint64_t>(full) * w.row_bytes();
    tail.rows = w.rows - full;
    // rest writes y[t·tail.rows + r]; a separate buffer keeps the row stride right.
    std::vector<float> tmp(static_cast<size_t>(n * tail.rows));
    float* tp = tmp.data();
    rest(&tail, &tp, 1, x, n);
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(ys[i] + t * w.rows + full, tp + t * tail.rows, static_cast<size_t>(tail.rows) * sizeof(float));
  }
}

template <class F>
void gemv16_rows(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemv16(ws, ys, count, x, n, [](const WeightView& w) { return F{{w.data, w.row_bytes(), w.cols / 32}}; });
}

template <class F>
void matmul_gemv(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if constexpr (std::is_same_v<F, Q4_0Rows>) zero_point_gemv<1>(ws, ys, count, x, n, gemv16_rows<F>);
  else zero_point_gemv<0>(ws, ys, count, x, n, gemv16_rows<F>);
}

}  // namespace

void gemv_q4_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  zero_point_gemv<2>(ws, ys, count, x, n, gemv_q4_1_rows);
}

namespace {

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

struct BF16Kernel {
  static constexpr int kRows1 = 4;
  // matmul_driver.h rows1, Zen 5: 1B BF16 tg64, 8 alternating triples, medians generic (4 rows) 22.2,
  // 2 rows 21.9, 1 row 23.9 tok/s (1 row ahead of generic in 7 of 8). Zen 4 takes the same set
  // and so this row count too (session 33, 1B BF16 tg32, 6 alternating pairs with prefetch: level
  // under load, 95.4 vs 95.6 % of the probe; idle 72.8 vs 76.5 % over 3 runs each).
  static constexpr int kRows1Zen = 1;
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
    zero_acc(acc);
    // Software prefetch: per-row streams (prefetch_rows' long regime) at any width — a bf16 row
    // is 4 KiB at 2048 columns. The old whole-tile sweep two tiles (32–128 KiB) ahead into L1:
    // 1B BF16 tg64, 2 threads, Zen 4, alternating: 14.7 → 20.3 tok/s (medians of 4), 14.8 → 16.2
    // (of 5, another hour); the AVX2 kernel 15.1 → 20.0 (of 3).
    // None for a one-row tile of a row up to 8 KiB (the zen tile set's decode, up to 4096
    // columns): consecutive rows are one linear stream per core, which the hardware prefetchers
    // follow on their own at one vdpbf16ps per 64 bytes, and prefetching every line into L2 as
    // well held it below the idle host's bandwidth (session 33, Zen 4, kernel_bench 2 threads in
    // idle windows, GB/s with → without: 8192x2048 52–57 → 63–65, 4096x4096 52–56 → 60–65; 1B BF16
    // decode in bench/RESULTS.md). Longer rows keep it: 2048x8192 (16 KiB rows, whose 16 KiB of
    // activations no longer stay in L1 beside the stream) 48–57 → 44–45.
    const bool pf = R > 1 || long_rows(1, row_bytes);
    auto step = [&](int64_t c, __mmask32 m) {
      if (pf) prefetch_rows<true>(wr[0], R, row_bytes, 2 * c, 64);
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
    store_acc(acc, y, rows, r0, t0);
  }
};

// F16 decode (n <= 8) with x in f32: the calls whose activations F16HalfKernel (below) cannot
// round to f16, |x| > 65504. 16 halves widened per vcvtph2ps (exact), one FMA per 16 weights. The
// AVX2 kernel it replaced on the AVX-512 tier widens 8 per instruction and was compute-bound on
// Zen 4 at about half of one core's DRAM stream (kernel_bench --hot, 1 thread, 128x2048: 16–17
// GB/s); this one 45–48 GB/s. Tiles and prefetch as BF16Kernel's, rows per tile below.
struct F16Kernel {
  // Four rows per tile with the zen tile set too. Unlike BF16's, its activations are f32 (16 KiB
  // per token at 4096 columns, 32 KiB at 8192) and one-row tiles streamed slower: session 33, Zen
  // 4, 1B F16 tg32 at 2 threads, 8 alternating rounds, % of the probe beside each run, idle |
  // loaded: 4 rows 73.2 | 94.8, one row 66.0 | 87.5, one row with every line prefetched 70.8 |
  // 92.7 (the AVX2 kernel before: 73.7 | 93.5).
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 4;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, cols;
  const float* x;  // [n][cols]
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    // Independent sums per output for tiles of one or two outputs (a region's last rows): one
    // row and one token in a single FMA chain waits its 4-cycle latency per 32 bytes of weights,
    // ~30 GB/s at 3.7 GHz, one Zen 4 core's DRAM stream (kernel_bench --hot 128x2048, 1 thread,
    // one-row tiles: 30 → 45 GB/s with four sums).
    constexpr int kC = R * T == 1 ? 4 : R * T == 2 ? 2 : 1;
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m512 acc[kC][R][T];
    LARDER_UNROLL
    for (int k = 0; k < kC; ++k) zero_acc(acc[k]);
    const bool pf = R > 1 || long_rows(1, row_bytes);  // BF16Kernel's rule
    auto step = [&](int64_t c, __mmask16 m, __m512 (&a)[R][T]) __attribute__((always_inline)) {
      if (pf && c % 32 == 0) prefetch_rows<true>(wr[0], R, row_bytes, 2 * c, 64);
      __m512 wv[R];
      // Masked on the tail: the last row may end at the end of the mapping.
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, wr[r] + 2 * c));
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + (t0 + t) * cols + c);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
      }
    };
    int64_t c = 0;
    for (; c + 16 * kC <= cols; c += 16 * kC) {
      LARDER_UNROLL
      for (int k = 0; k < kC; ++k) step(c + 16 * k, 0xffff, acc[k]);
    }
    for (; c + 16 <= cols; c += 16) step(c, 0xffff, acc[0]);
    if (c < cols) step(c, static_cast<__mmask16>((1u << (cols - c)) - 1), acc[0]);
    LARDER_UNROLL
    for (int k = 1; k < kC; ++k) {
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) acc[0][r][t] = _mm512_add_ps(acc[0][r][t], acc[k][r][t]);
      }
    }
    store_acc(acc[0], y, rows, r0, t0);
  }
};

// F16 decode over activations rounded to f16 — what llama.cpp computes for F16 weights (ggml
// converts the activations to the weights' vec_dot type, F16) — so a step is one 64-byte load of
// 32 weights and one of 32 activations, each widened in two vcvtph2ps, and two FMAs. Why: on Zen
// 4 a decode stream reaches the read probe only with the hardware prefetchers following one linear
// stream per core whose demand loads come densely (session 34, bench/RESULTS.md); F16Kernel's f32
// activations take two loads per 16 weights, and its four-row tiles (four interleaved streams)
// need software prefetch of every line. 1B F16 tg16 (bench/decode_ab.py, % of the probe beside
// each run, 15 runs each): 1 thread 76.0 → 84.1, 2 threads idle 78.0 → 84.8 (a test build with
// four rows per tile and f16 activations: 1 thread 78.8).
// The rounding costs at most 2^-11 relative per activation (the test's bound); an activation past
// f16's range (|x| > 65504) would become inf, so such a call keeps F16Kernel's f32 activations.
// Tiles and prefetch as BF16Kernel's: one row per tile on the zen set, no software prefetch for a
// one-row tile of rows up to 8 KiB.
struct F16HalfKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 1;
  static constexpr int kRowsN = 4;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, cols, cols32;
  const uint16_t* xh;  // [n][cols32] f16, zero-padded
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    // One or two outputs: the low and high 16 weights of a step go to two sums, so no single FMA
    // chain waits its latency per 64 bytes (F16Kernel's reason for its independent sums).
    constexpr int kC = R * T <= 2 ? 2 : 1;
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const uint16_t* xt[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xt[t] = xh + (t0 + t) * cols32;
    __m512 acc[kC][R][T];
    LARDER_UNROLL
    for (int k = 0; k < kC; ++k) zero_acc(acc[k]);
    const bool pf = R > 1 || long_rows(1, row_bytes);  // BF16Kernel's rule
    auto step = [&](int64_t c, __mmask32 m) __attribute__((always_inline)) {
      if (pf) prefetch_rows<true>(wr[0], R, row_bytes, 2 * c, 64);
      __m512 lo[R], hi[R];
      // Masked on the tail: the last row may end at the end of the mapping.
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i v = _mm512_maskz_loadu_epi16(m, wr[r] + 2 * c);
        lo[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
        hi[r] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_load_si512(xt[t] + c);
        const __m512 xl = _mm512_cvtph_ps(_mm512_castsi512_si256(xv));
        const __m512 xu = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(xv, 1));
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          acc[0][r][t] = _mm512_fmadd_ps(lo[r], xl, acc[0][r][t]);
          acc[kC - 1][r][t] = _mm512_fmadd_ps(hi[r], xu, acc[kC - 1][r][t]);
        }
      }
    };
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) step(c, ~__mmask32{0});
    if (c < cols) step(c, static_cast<__mmask32>((uint64_t{1} << (cols - c)) - 1));
    if constexpr (kC == 2) {
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) acc[0][r][t] = _mm512_add_ps(acc[0][r][t], acc[1][r][t]);
      }
    }
    store_acc(acc[0], y, rows, r0, t0);
  }
};

// BF16 prefill (n >= 16, even cols): token lanes, like the integer GEMM. The activations are
// rounded to bf16 (as in BF16Kernel) and laid out as xl[g][k][lane] = the bf16 pair (x[2k],
// x[2k+1]) of token 16g + lane, 64 bytes per (group, pair); a weight pair (4 bytes) is broadcast
// against it, so one vdpbf16ps does 32 multiply-adds for 16 tokens of one row. A tile is 8 rows ×
// 2 token groups (16 accumulators, ≥ the 6-cycle latency × 1 per cycle of Zen 4's zmm
// vdpbf16ps); per pair 2 activation loads + 8 broadcast loads feed 16 vdpbf16ps.
//
// Blocking (BLIS-like). The weight rows are packed pair-major ([k][8] u32) so the inner loop
// addresses 8 rows from one pointer: rows 4–16 KiB apart would share L1 sets. The packing must be
// amortized over many token groups, but one group's activations are 64 bytes × K/2 (256 KiB at
// K = 8192), so without blocking over K only 2 groups fit the L2 at the down projection and the
// packing (plus its stalls on the weight stream) cost it ~20 % against the 2048-column shapes.
// So K is cut into slices of kKc pairs: per slice, a tile's packed rows (8 × kKc × 4 B = 16 KiB)
// stay in L1 while every group of the chunk streams its activation slice (kKc × 64 B) from L2,
// and the chunk's activation slices (≤ ~512 KiB) stay in L2 across its row tiles. Partial sums
// between slices go through a per-thread f32 buffer (one load + store per accumulator per
// slice); the last slice writes y. While a tile computes, the next tile's weight slice is
// prefetched into L2, a share before each group pair.
struct Bf16Gemm {
  static constexpr int R = 8;
  static constexpr int64_t kKc = 512;  // pairs per K slice
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, kp, n;  // kp = cols / 2
  const uint32_t* xl;   // [n_pad/16][kp][16]
  float* y;

  // Rows r0..r0+RR-1, pairs [k0, k0 + kc) → pk[k][RR].
  template <int RR>
  void pack(int64_t r0, int64_t k0, int64_t kc, uint32_t* pk) const {
    const uint8_t* src[RR];
    for (int r = 0; r < RR; ++r) src[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes + 4 * k0;
    int64_t k = 0;
    if constexpr (RR == 8) {
      // 8 rows × 8 pairs per step: an 8×8 transpose of 32-bit pairs (unpack 32, unpack 64, swap
      // 128-bit halves).
      for (; k + 8 <= kc; k += 8) {
        __m256i v[8], t[8], u[8];
        for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[r] + 4 * k));
        for (int r = 0; r < 8; r += 2) {
          t[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);
          t[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);
        }
        for (int h = 0; h < 8; h += 4) {
          u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
          u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
          u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
          u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
        }
        auto* dst = reinterpret_cast<__m256i*>(pk + k * 8);
        for (int i = 0; i < 4; ++i) {
          _mm256_store_si256(dst + i, _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
          _mm256_store_si256(dst + i + 4, _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
        }
      }
    }
    for (; k < kc; ++k)
      for (int r = 0; r < RR; ++r) std::memcpy(pk + k * RR + r, src[r] + 4 * k, 4);
  }

  // RR rows × G groups (g, g+1, ...) over pairs [k0, k0 + kc). c: this tile's partial sums,
  // [G][RR][16] f32 — read unless `first`, written unless `last` (which stores y instead).
  template <int RR, int G>
  void tile(const uint32_t* pk, int64_t r0, int64_t g, int64_t k0, int64_t kc, float* c, bool first, bool last) const {
    __m512 acc[RR][G];
    LARDER_UNROLL
    for (int r = 0; r < RR; ++r)
      LARDER_UNROLL
      for (int j = 0; j < G; ++j) acc[r][j] = first ? _mm512_setzero_ps() : _mm512_load_ps(c + (j * RR + r) * 16);
    const uint32_t* xg[G];
    LARDER_UNROLL
    for (int j = 0; j < G; ++j) xg[j] = xl + ((g + j) * kp + k0) * 16;
    for (int64_t k = 0; k < kc; ++k) {
      __m512i xa[G];
      LARDER_UNROLL
      for (int j = 0; j < G; ++j) xa[j] = _mm512_load_si512(xg[j] + 16 * k);
      LARDER_UNROLL
      for (int r = 0; r < RR; ++r) {
        const __m512i wv = _mm512_set1_epi32(static_cast<int>(pk[k * RR + r]));
        LARDER_UNROLL
        for (int j = 0; j < G; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(wv), as_bh(xa[j]));
      }
    }
    if (!last) {
      LARDER_UNROLL
      for (int r = 0; r < RR; ++r)
        LARDER_UNROLL
        for (int j = 0; j < G; ++j) _mm512_store_ps(c + (j * RR + r) * 16, acc[r][j]);
      return;
    }
    LARDER_UNROLL
    for (int j = 0; j < G; ++j) {
      alignas(64) float out[RR][16];
      LARDER_UNROLL
      for (int r = 0; r < RR; ++r) _mm512_store_ps(out[r], acc[r][j]);
      const int64_t t0 = 16 * (g + j), nt = std::min<int64_t>(16, n - t0);
      for (int64_t t = 0; t < nt; ++t)
        for (int r = 0; r < RR; ++r) y[(t0 + t) * rows + r0 + r] = out[r][t];
    }
  }

  // One K slice of RR rows against groups [g0, g1); c: [g1 - g0][RR][16] partial sums.
  // next/next_bytes: the next tile's weight slice (one range per row), prefetched to L2.
  template <int RR>
  void rows_x_groups(int64_t r0, int64_t g0, int64_t g1, int64_t k0, int64_t kc, float* c, const uint8_t* next,
                     int next_rows) const {
    auto* pk = static_cast<uint32_t*>(thread_scratch(static_cast<size_t>(RR * kKc) * 4, 4));
    pack<RR>(r0, k0, kc, pk);
    const bool first = k0 == 0, last = k0 + kc == kp;
    const int64_t lines = (4 * kc + 63) / 64, pairs = (g1 - g0 + 1) / 2;
    const int64_t per_pair = next ? (lines * next_rows + pairs - 1) / pairs : 0;
    int64_t pf = 0;
    auto prefetch = [&] {
      for (int64_t e = pf + per_pair; pf < e && pf < lines * next_rows; ++pf) {
        const uint8_t* p = next + static_cast<uint64_t>(pf / lines) * row_bytes + 64 * (pf % lines);
        _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
      }
    };
    int64_t g = g0;
    for (; g + 2 <= g1; g += 2) {
      if (next) prefetch();
      tile<RR, 2>(pk, r0, g, k0, kc, c + (g - g0) * RR * 16, first, last);
    }
    if (g < g1) {
      if (next) prefetch();
      tile<RR, 1>(pk, r0, g, k0, kc, c + (g - g0) * RR * 16, first, last);
    }
  }

  // Rows [r0, r1) × groups [g0, g1), slice by slice.
  void chunk(int64_t r0, int64_t r1, int64_t g0, int64_t g1) const {
    const int64_t ng = g1 - g0;
    float* c = kp > kKc ? static_cast<float*>(thread_scratch(static_cast<size_t>((r1 - r0) * ng * 16) * 4, 5)) : nullptr;
    for (int64_t k0 = 0; k0 < kp; k0 += kKc) {
      const int64_t kc = std::min(kKc, kp - k0);
      // The slice after (r, k0): the next tile of this slice, else the first tile of the next one.
      auto next_of = [&](int64_t r, int rr, int& nrows) -> const uint8_t* {
        int64_t nr = r + rr, nk = k0;
        if (nr >= r1) {
          nr = r0;
          nk = k0 + kKc;
          if (nk >= kp) return nullptr;
        }
        nrows = static_cast<int>(std::min<int64_t>(R, r1 - nr));
        return w + static_cast<uint64_t>(nr) * row_bytes + 4 * nk;
      };
      int64_t r = r0;
      int nrows = 0;
      for (; r + R <= r1; r += R) {
        const uint8_t* nx = next_of(r, R, nrows);
        rows_x_groups<R>(r, g0, g1, k0, kc, c ? c + (r - r0) * ng * 16 : nullptr, nx, nrows);
      }
      for (; r + 4 <= r1; r += 4) {
        const uint8_t* nx = next_of(r, 4, nrows);
        rows_x_groups<4>(r, g0, g1, k0, kc, c ? c + (r - r0) * ng * 16 : nullptr, nx, nrows);
      }
      for (; r < r1; ++r) {
        const uint8_t* nx = next_of(r, 1, nrows);
        rows_x_groups<1>(r, g0, g1, k0, kc, c ? c + (r - r0) * ng * 16 : nullptr, nx, nrows);
      }
    }
  }
};

// x[n, cols] (cols even) → Bf16Gemm's token-lane activations (slot 1 of the calling thread):
// rounded to bf16 (cvtne2ps2bf16: nearest even, as BF16Kernel), padding tokens and pairs zero.
// Per 16 tokens × 16 pairs: 16 row loads, one 16×16 transpose, 16 full-line stores. (Scattering
// each token's pairs with 4-byte stores 64 bytes apart cost 9–28 % of the GEMM: every store
// missed L1 once a group's 64 B × K/2 outgrew it.)
const uint32_t* bf16_token_lanes(const float* x, int64_t n, int64_t cols) {
  const int64_t kp = cols / 2, groups = (n + 15) / 16;
  auto* xl = static_cast<uint32_t*>(thread_scratch(static_cast<size_t>(groups * 16 * kp) * 4, 1));
  default_pool().parallel_for(groups, [&](int64_t g, int) {
    const int64_t lanes = std::min<int64_t>(16, n - 16 * g);
    for (int64_t p0 = 0; p0 < kp; p0 += 16) {
      const int64_t c = 2 * p0, left = cols - c;
      const __mmask16 m0 = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
      const __mmask16 m1 = left >= 32 ? 0xffff : left <= 16 ? 0 : static_cast<__mmask16>((1u << (left - 16)) - 1);
      __m512i r[16];
      for (int l = 0; l < 16; ++l) {
        if (l >= lanes) {
          r[l] = _mm512_setzero_si512();
          continue;
        }
        const float* xt = x + (16 * g + l) * cols + c;
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, xt + 16), _mm512_maskz_loadu_ps(m0, xt));
        r[l] = reinterpret_cast<const __m512i&>(v);
      }
      transpose16x16(r);
      uint32_t* dst = xl + (g * kp + p0) * 16;
      const int64_t np = std::min<int64_t>(16, kp - p0);
      for (int64_t k = 0; k < np; ++k) _mm512_store_si512(dst + 16 * k, r[k]);
    }
  });
  return xl;
}

// Chunks of the BF16 GEMM: 64 rows × token groups whose activation slices fit ~512 KiB of L2
// (16 groups with 512-pair slices: one or two chunks of groups at n = 512).
struct Bf16Plan {
  int64_t groups, gb, n_gb, rb = 8 * Bf16Gemm::R;
  Bf16Plan(int64_t n, int64_t kp) {
    groups = (n + 15) / 16;
    const int64_t slice = std::min(kp, Bf16Gemm::kKc);
    gb = std::max<int64_t>(2, std::min<int64_t>(groups, (512 * 1024) / (slice * 64)));
    n_gb = (groups + gb - 1) / gb;
  }
  int64_t row_blocks(int64_t rows) const { return (rows + rb - 1) / rb; }
  void run(const Bf16Gemm& k, int64_t ib, int64_t ig) const {
    const int64_t g0 = ig * gb;
    k.chunk(ib * rb, std::min(k.rows, (ib + 1) * rb), g0, std::min(groups, g0 + gb));
  }
};

// AMX BF16 prefill (gemm_uses_amx(), cols % 32 == 0). TDPBF16PS multiplies a 16-row × 32-element
// bf16 tile A by a tile B of 16 pair rows × 16 tokens and accumulates in f32 in the C tile itself
// — there is no per-block scale, so C stays in its tile over a whole K slice. A comes straight
// from the weight rows (tile loads take a row stride: no packing), B is Bf16Gemm's token-lane
// layout as it is (xl[g][k][lane]: 16 pairs × 64 B per step). A chunk is 32 rows × up to 32 token
// groups; per K slice (kKc pairs) and pair of groups, four C tiles (2 row halves × 2 groups) take
// 2 A + 2 B loads per 16 pairs for 4 products. Partial sums go through a per-chunk buffer
// between slices (tile load / store); the last slice's tiles are scattered to y. Rows past the
// last multiple of 32 run on Bf16Gemm. The sums are f32 like vdpbf16ps's but in the tile unit's
// order, so the bits differ from the AVX-512 path (both are checked against the reference).
// Tiles (amx_configure_thread(AmxTiles::kBf16)): C 0, 3, 6, 7; A 1, 4; B 2, 5 — all 16 × 64 B.
struct Bf16Amx {
  static constexpr int64_t kRows = 32;
  const Bf16Gemm& k;

  // Rows [r0, r0 + 32) × groups [g0, g1), slice by slice.
  void chunk(int64_t r0, int64_t g0, int64_t g1) const {
    const int64_t ng = g1 - g0;
    // [group][32 rows][16] partial sums (the C tiles' rows are weight rows, lanes tokens).
    auto* part = static_cast<float*>(thread_scratch(static_cast<size_t>(ng * kRows * 16) * 4, 5));
    const uint64_t rb = k.row_bytes;
    const uint8_t* a0 = k.w + static_cast<uint64_t>(r0) * rb;
    const uint8_t* a1 = a0 + 16 * rb;
    for (int64_t k0 = 0; k0 < k.kp; k0 += Bf16Gemm::kKc) {
      const int64_t kc = std::min(Bf16Gemm::kKc, k.kp - k0);
      const bool first = k0 == 0, last = k0 + kc == k.kp;
      for (int64_t g = g0; g < g1; g += 2) {
        const bool two = g + 1 < g1;
        float* c0 = part + (g - g0) * kRows * 16;  // group g: rows 0–15, then 16–31
        float* c1 = c0 + kRows * 16;                // group g + 1
        if (first) {
          _tile_zero(0);
          _tile_zero(3);
          _tile_zero(6);
          _tile_zero(7);
        } else {
          _tile_loadd(0, c0, 64);
          _tile_loadd(3, c0 + 256, 64);
          if (two) {
            _tile_loadd(6, c1, 64);
            _tile_loadd(7, c1 + 256, 64);
          }
        }
        const uint32_t* x0 = k.xl + (g * k.kp + k0) * 16;
        const uint32_t* x1 = two ? x0 + k.kp * 16 : x0;
        for (int64_t p = 0; p < kc; p += 16) {
          _tile_loadd(1, a0 + 4 * (k0 + p), rb);
          _tile_loadd(2, x0 + 16 * p, 64);
          _tile_dpbf16ps(0, 1, 2);
          _tile_loadd(4, a1 + 4 * (k0 + p), rb);
          _tile_dpbf16ps(3, 4, 2);
          if (two) {
            _tile_loadd(5, x1 + 16 * p, 64);
            _tile_dpbf16ps(6, 1, 5);
            _tile_dpbf16ps(7, 4, 5);
          }
        }
        _tile_stored(0, c0, 64);
        _tile_stored(3, c0 + 256, 64);
        if (two) {
          _tile_stored(6, c1, 64);
          _tile_stored(7, c1 + 256, 64);
        }
        if (last) {
          store_y(c0, r0, g);
          if (two) store_y(c1, r0, g + 1);
        }
      }
    }
  }

  // c: [32 rows][16 tokens] of group g → y[t][r0 + r].
  void store_y(const float* c, int64_t r0, int64_t g) const {
    const int64_t t0 = 16 * g, nt = std::min<int64_t>(16, k.n - t0);
    for (int64_t t = 0; t < nt; ++t)
      for (int r = 0; r < kRows; ++r) k.y[(t0 + t) * k.rows + r0 + r] = c[r * 16 + t];
  }
};

// The chunks of one BF16 weight: on AMX, 32-row blocks × ≤ 32 token groups, the remainder rows
// on Bf16Gemm; otherwise Bf16Plan's chunks.
struct Bf16Chunks {
  const Bf16Gemm& k;
  const Bf16Plan& plan;
  bool amx;
  int64_t amx_blocks, gb, n_gb;
  Bf16Chunks(const Bf16Gemm& k_, const Bf16Plan& p, bool use_amx) : k(k_), plan(p) {
    amx = use_amx && k.kp % 16 == 0;
    amx_blocks = amx ? k.rows / Bf16Amx::kRows : 0;
    gb = amx ? std::min<int64_t>(plan.groups, 32) : plan.gb;
    n_gb = (plan.groups + gb - 1) / gb;
  }
  // Row blocks per group chunk: the AMX blocks, then one Bf16Gemm chunk of the rows left.
  int64_t row_blocks() const {
    return amx ? amx_blocks + (k.rows % Bf16Amx::kRows != 0) : plan.row_blocks(k.rows);
  }
  void run(int64_t ib, int64_t ig) const {
    if (!amx) return plan.run(k, ib, ig);
    const int64_t g0 = ig * gb, g1 = std::min(plan.groups, g0 + gb);
    if (ib < amx_blocks) {
      amx_configure_thread(AmxTiles::kBf16);
      Bf16Amx{k}.chunk(ib * Bf16Amx::kRows, g0, g1);
    } else {
      k.chunk(amx_blocks * Bf16Amx::kRows, k.rows, g0, g1);
    }
  }
};

void gemm_bf16(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t kp = w.cols / 2;
  const Bf16Gemm k{w.data, w.row_bytes(), w.rows, kp, n, bf16_token_lanes(x, n, w.cols), y};
  const Bf16Plan plan(n, kp);
  const Bf16Chunks chunks(k, plan, bf16_gemm_uses_amx());
  const int64_t n_rb = chunks.row_blocks();
  // Group block outermost: consecutive chunks share their activation slices.
  default_pool().parallel_for(n_rb * chunks.n_gb, [&](int64_t c, int) { chunks.run(c % n_rb, c / n_rb); });
}

constexpr int64_t kBf16GemmMinTokens = 16;

// Q4_0 decode (n <= 8): two blocks of a row per zmm. The 16 code bytes of blocks b and b+1 (18
// bytes apart) are loaded into one ymm, doubled into a zmm, and vpsrlvq + vpand leave
// [b lo nibbles | b+1 lo | b hi | b+1 hi] = elements [0..15 | 0..15 | 16..31 | 16..31] of the two
// blocks; the activations are permuted once per matmul to match. One vpdpbusd per 64 weights and
// token; lanes 0–3 and 8–11 belong to block b, 4–7 and 12–15 to b+1, so d_x and the zero-point
// term (each lane subtracts its block's d_x·Σq: 8 lanes × that = the 8 of the zero point) are
// per-lane patterns precomputed per token, and the two weight scales one mask blend per row.
struct Q4_0Decode {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, np;    // block pairs per row
  const uint8_t* acts;  // [n][np][64]
  const float* dxp;     // [n][np][16]
  const float* bsp;     // [n][np][16]
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    __m512 acc[R][T];
    zero_acc(acc);
    const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    for (int64_t p = 0; p < np; ++p) {
      prefetch_rows<kPf>(base, R, row_bytes, p * 36, 36);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* b0 = base + r * row_bytes + 36 * p;
        const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(b0 + 20),
                                              reinterpret_cast<const __m128i*>(b0 + 2));
        const __m512i u =
            _mm512_and_si512(_mm512_srlv_epi64(_mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1), shift), m4);
        const __m512 dw = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(f16[load_u16(b0)]),
                                               _mm512_set1_ps(f16[load_u16(b0 + sizeof(BlockQ4_0))]));
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const int64_t at = (t0 + t) * np + p;
          const __m512 f =
              _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_load_si512(acts + at * 64)));
          const __m512 z = _mm512_fmsub_ps(f, _mm512_load_ps(dxp + at * 16), _mm512_load_ps(bsp + at * 16));
          acc[r][t] = _mm512_fmadd_ps(z, dw, acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

void decode_q4_0(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, np = nb / 2;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const size_t pat = static_cast<size_t>(n * np) * 64;
  auto* buf = static_cast<uint8_t*>(thread_scratch(3 * pat + 64, 1));
  auto* acts = buf;
  auto* dxp = reinterpret_cast<float*>(buf + pat);
  auto* bsp = reinterpret_cast<float*>(buf + 2 * pat);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t p = 0; p < np; ++p) {
      uint8_t* dst = acts + (t * np + p) * 64;
      const int8_t* s0 = q + 64 * p;
      std::memcpy(dst, s0, 16);
      std::memcpy(dst + 16, s0 + 32, 16);
      std::memcpy(dst + 32, s0 + 16, 16);
      std::memcpy(dst + 48, s0 + 48, 16);
      float* dp = dxp + (t * np + p) * 16;
      float* bp = bsp + (t * np + p) * 16;
      for (int l = 0; l < 16; ++l) {
        const int64_t blk = 2 * p + (l / 4) % 2;
        dp[l] = a.scales(blk)[t];
        bp[l] = a.sums(blk)[t];
      }
    }
  }
  const Q4_0Decode k{w.data, w.row_bytes(), w.rows, np, acts, dxp, bsp, y};
  run_matmul_tiles(k, w.rows, n, cols + 4 * nb);
}

// Q4_0 decode (n <= 8), four blocks of a row per step (Q4_0Quad). quad18_avx512.h cuts the 72
// bytes of four blocks apart with two AVX-512BW word permutes, no VBMI:
//   codes: vpermt2w over the first 64 bytes and the last 8 → [b0 codes | b1 | b2 | b3] (zmm)
//   scales: vpermw → lane l holds block l/4's f16 scale → vcvtph2ps
// The nibbles are split without a shift: lo = codes & 0x0F (elements 0–15 of each block) and
// hi16 = codes & 0xF0 = 16·(elements 16–31), and the two vpdpbusd are chained through a ×16:
//   A = dpbusd(16·dpbusd(seed, lo, x_lo), hi16, x_hi) = 16·(seed + Σ u·q)
// where the per-lane seed = −8·Σ q over the lane's 8 elements folds the zero point (u − 8) into
// the integer sum, so per 128 weights and row the float work is one cvt, one mul (d_w·d_x/16,
// both lane patterns) and one FMA — the previous two-block kernel spent cvt + FMSUB + FMA and a
// scale blend per 64 weights, and ran compute-bound on Zen 4 (AVX-512 as two 256-bit halves).
// A row tail of 1–3 blocks is one more masked step: the masked-out bytes load as zeros (codes
// 0, scale 0) and meet zero activations, seeds and d_x, so they add exactly 0.
// Activations: per token and 4-block group, x_lo/x_hi [64] int8 (the blocks' first/second
// halves), the seed [16] int32 and d_x/16 [16] f32 — 256 B, built once per matmul.
struct Q4_0Quad {
  static constexpr int kRows1 = 4;
  // matmul_driver.h rows1. Zen 5 (session 22, one binary alternating LARDER_DECODE_TILES, a
  // neighbour loading memory): 1B Q4_0 tg64 at 2 threads, 5 pairs, 71.0 → 72.9 tok/s (2 rows
  // ahead in all 5); kernel_bench 8192x2048 n = 1, 1 thread, 4 pairs, 258 → 234 µs (down
  // 2048x8192 level).
  static constexpr int kRows1Zen = 2;
  // Zen 4 keeps the four rows (session 30, 1B Q4_0 tg64 at 2 threads, one binary alternating
  // LARDER_DECODE_TILES generic/zen, 45 pairs): in windows where the host's memory was idle (read
  // probe >= 50 GB/s) 4 rows decoded 74.0 tok/s (median of 10; 71.2–84.0) against 71.2 (of 13;
  // 64.6–76.9), paired 1.05× [0.99–1.09]; with the neighbour loading memory 51.9 vs 53.2 (paired
  // 0.985× over 25); 1 thread 41.6–43.5 vs 35.4–42.1. Session 17 had measured no gain from fewer
  // rows here either; the target is the idle host. Session 34 again (% of the idle probe):
  // one row 66.9 vs 75.0; a repacked layout's row-interleaved stream (llama.cpp's Q4_0 repack),
  // emulated with and without this step's permutes, 72–78 vs 77–80 — not worth a private copy.
  static constexpr int kRows1Zen4 = kRows1;
  static constexpr int kRowsN = 2;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, ng, nb;  // 4-block groups per row (the last may be partial), blocks per row
  const uint8_t* acts;   // [n][ng][256]: x_lo[64], x_hi[64], seed[16] i32, dx16[16] f32
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const __m512i m_lo = _mm512_set1_epi8(0x0f), m_hi = _mm512_set1_epi8(static_cast<char>(0xf0));
    __m512 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    const int64_t full = nb / 4;
    auto step = [&](int64_t g, bool tail) {
      prefetch_rows<kPf>(base, R, row_bytes, g * 72, tail ? row_bytes - g * 72 : 72);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const Quad18 q = load_quad18(base + r * row_bytes + 72 * g, tail, nb - 4 * g);
        const __m512i lo = _mm512_and_si512(q.codes, m_lo), hi = _mm512_and_si512(q.codes, m_hi);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const uint8_t* a = acts + ((t0 + t) * ng + g) * 256;
          const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(a + 128), lo, _mm512_load_si512(a));
          const __m512i v = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 4), hi, _mm512_load_si512(a + 64));
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

// The Q4_0Quad / Q5_0Quad activation patterns for x[n, cols] (slot 1 of the calling thread's
// scratch): seed = −zero·Σq per lane (zero = 2^zero_log2: 8 or 16; zero_log2 < 0: seed 0), d_x
// times dx_mul.
// with_sums: also d_x·Σq per lane (f32, after dx), for formats with a per-block min; the stride
// is then 320 bytes.
const uint8_t* quad_acts(const QuantizedActs& a, int64_t n, int64_t ng, int zero_log2, float dx_mul,
                         bool with_sums = false) {
  const int64_t stride = with_sums ? 320 : 256;
  auto* out = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n * ng * stride) + 64, 1));
  const int64_t nb = a.nb;
  const __m512i ones = _mm512_set1_epi8(1);
  // Full groups: the 4 blocks' 128 bytes are two zmm of 16-byte halves, [b lo | b hi] per block,
  // so one qword permute each gathers the lo and the hi halves; the block scales are strided by
  // n_pad (block-major) and broadcast to their 4 lanes. Same bytes and floats as the tail's copy.
  const __m512i lo_idx = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), hi_idx = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
  const __m512i dx_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t g = 0; g < ng; ++g) {
      uint8_t* dst = out + (t * ng + g) * stride;
      __m512i xl, xh;
      __m512 vdx;
      if (4 * g + 4 <= nb) {
        const __m512i z0 = _mm512_loadu_si512(q + 128 * g), z1 = _mm512_loadu_si512(q + 128 * g + 64);
        xl = _mm512_permutex2var_epi64(z0, lo_idx, z1);
        xh = _mm512_permutex2var_epi64(z0, hi_idx, z1);
        const __m128 d4 = _mm_setr_ps(a.scales(4 * g)[t], a.scales(4 * g + 1)[t], a.scales(4 * g + 2)[t],
                                      a.scales(4 * g + 3)[t]);
        vdx = _mm512_mul_ps(_mm512_permutexvar_ps(dx_idx, _mm512_castps128_ps512(d4)), _mm512_set1_ps(dx_mul));
      } else {
        alignas(64) uint8_t lo[64] = {}, hi[64] = {};
        alignas(64) float dx[16] = {};
        for (int k = 0; 4 * g + k < nb; ++k) {
          const int64_t b = 4 * g + k;
          std::memcpy(lo + 16 * k, q + 32 * b, 16);
          std::memcpy(hi + 16 * k, q + 32 * b + 16, 16);
          for (int l = 0; l < 4; ++l) dx[4 * k + l] = a.scales(b)[t] * dx_mul;
        }
        xl = _mm512_load_si512(lo);
        xh = _mm512_load_si512(hi);
        vdx = _mm512_load_ps(dx);
      }
      // Σ q per lane over its 4 lo and 4 hi elements (u8 ones · s8 q), times −zero.
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xl), ones, xh);
      _mm512_store_si512(dst, xl);
      _mm512_store_si512(dst + 64, xh);
      _mm512_store_si512(dst + 128, zero_log2 < 0 ? _mm512_setzero_si512()
                                                  : _mm512_sub_epi32(_mm512_setzero_si512(),
                                                                     _mm512_sll_epi32(sum, _mm_cvtsi32_si128(zero_log2))));
      _mm512_store_ps(reinterpret_cast<float*>(dst + 192), vdx);
      if (with_sums)
        _mm512_store_ps(reinterpret_cast<float*>(dst + 256),
                        _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(vdx, _mm512_set1_ps(1.0f / dx_mul))));
    }
  }
  return out;
}

void decode_q4_0_quad(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, ng = (nb + 3) / 4;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const Q4_0Quad k{w.data, w.row_bytes(), w.rows, ng, nb, quad_acts(a, n, ng, 3, 1.0f / 16.0f), y};
  run_matmul_tiles(k, w.rows, n, cols + 4 * nb);
}

// Q5_0, Q4_1 and Q5_1 decode (n <= 8), four blocks of a row per step (LowBitQuad): Q4_0Quad's
// design for the other 32-element blocks, d [| m] [| qh[4]] | qs[16] (22, 20, 24 bytes). The four
// blocks are 80–96 contiguous bytes with every field 16-bit aligned, so word permutes over the
// first 64 bytes and the rest cut out [b0 codes | b1 | b2 | b3], the scales (and mins) as lane
// patterns, and for the 5-bit formats the four qh words twice: low halves (the fifth bits of
// elements 0–15) as one 64-bit lane, high halves (elements 16–31) as the next — exactly the byte
// masks of lo and hi, one bit per code byte, so one masked byte add each puts the +16 in place.
// Q4_0Quad's ×16 chaining does not fit 5-bit codes in a byte, so hi is shifted down instead.
// Per 128 weights and row ~11 zmm ops; per token two vpdpbusd, a cvt, a mul and an FMA, plus one
// FMA of the mins against the activations' lane sums (Q4_1, Q5_1) — Q5_0's zero point 16 folds
// into the seed instead. The AVX2 kernels these replace consumed 11 (Q5_0) and 15 (Q4_1) GB/s per
// core on Zen 4, compute-bound (gemma-3-270m's 640-column FFN weights are Q5_0 in its Q4_K_M file,
// SmolLM2-135M's are Q4_1).
struct LowBitLayout {
  int bytes, min, qh, codes;  // block size; word offsets of m, qh and the codes (−1: absent)
  int zero_log2;              // the zero point 2^zero_log2 folded into the seed (−1: none)
};
constexpr LowBitLayout kQ5_0Layout{22, -1, 1, 3, 4};
constexpr LowBitLayout kQ4_1Layout{20, 1, -1, 2, -1};
constexpr LowBitLayout kQ5_1Layout{24, 1, 2, 4, -1};
static_assert(sizeof(BlockQ5_0) == 22 && offsetof(BlockQ5_0, qh) == 2 && offsetof(BlockQ5_0, qs) == 6);
static_assert(sizeof(BlockQ4_1) == 20 && offsetof(BlockQ4_1, qs) == 4);
static_assert(sizeof(BlockQ5_1) == 24 && offsetof(BlockQ5_1, qh) == 4 && offsetof(BlockQ5_1, qs) == 8);

// Word indices (into the 4-block group) for LowBitQuad's permutes.
struct LowBitIdx {
  alignas(64) uint16_t codes[32], scale[32], min[32], qh[32];
};
constexpr LowBitIdx low_bit_idx(LowBitLayout l) {
  LowBitIdx x{};
  const int w = l.bytes / 2;
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 8; ++j) x.codes[8 * k + j] = static_cast<uint16_t>(w * k + l.codes + j);
    for (int j = 0; j < 4; ++j) {
      x.scale[4 * k + j] = static_cast<uint16_t>(w * k);
      x.min[4 * k + j] = static_cast<uint16_t>(w * k + (l.min >= 0 ? l.min : 0));
    }
    x.qh[k] = static_cast<uint16_t>(w * k + (l.qh >= 0 ? l.qh : 0));
    x.qh[4 + k] = static_cast<uint16_t>(w * k + (l.qh >= 0 ? l.qh : 0) + 1);
  }
  return x;
}

template <LowBitLayout L>
struct LowBitQuad {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  static constexpr bool kMin = L.min >= 0, kQh = L.qh >= 0;
  static constexpr int kGroupBytes = 4 * L.bytes;  // 80, 88 or 96
  static constexpr int kActBytes = kMin ? 320 : 256;
  static constexpr LowBitIdx kIdx = low_bit_idx(L);
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, ng, nb;  // 4-block groups per row (the last may be partial), blocks per row
  const uint8_t* acts;   // [n][ng][kActBytes]: x_lo[64], x_hi[64], seed[16] i32, dx[16] f32 [, bsl[16] f32]
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const __m512i code_idx = _mm512_load_si512(kIdx.codes), scale_idx = _mm512_load_si512(kIdx.scale);
    const __m512i min_idx = _mm512_load_si512(kIdx.min), qh_idx = _mm512_load_si512(kIdx.qh);
    const __m512i m_lo = _mm512_set1_epi8(0x0f), b16 = _mm512_set1_epi8(16);
    __m512 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    const int64_t full = nb / 4;
    auto step = [&](int64_t g, bool tail) {
      prefetch_rows<kPf>(base, R, row_bytes, g * kGroupBytes, tail ? row_bytes - g * kGroupBytes : kGroupBytes);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = base + r * row_bytes + kGroupBytes * g;
        // Absent blocks of a tail load as zeros (codes, scales, mins 0) and meet zero
        // activations, seeds, d_x and sums, so they add exactly 0.
        const int64_t bytes = tail ? L.bytes * (nb - 4 * g) : kGroupBytes;
        const __m512i z0 = _mm512_maskz_loadu_epi8(bytes >= 64 ? ~uint64_t{0} : (uint64_t{1} << bytes) - 1, p);
        const __m512i z1 = _mm512_castsi256_si512(
            _mm256_maskz_loadu_epi8(bytes > 64 ? static_cast<__mmask32>((uint64_t{1} << (bytes - 64)) - 1) : 0, p + 64));
        const __m512i codes = _mm512_permutex2var_epi16(z0, code_idx, z1);
        __m512i lo = _mm512_and_si512(codes, m_lo);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m_lo);
        if constexpr (kQh) {
          const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(z0, qh_idx, z1));
          lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(qh))), lo, b16);
          hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(static_cast<uint64_t>(_mm_extract_epi64(qh, 1))), hi, b16);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, scale_idx, z1)));
        __m512 mw;
        if constexpr (kMin) mw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, min_idx, z1)));
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const uint8_t* a = acts + ((t0 + t) * ng + g) * kActBytes;
          const __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(a + 128), lo, _mm512_load_si512(a));
          const __m512i v = _mm512_dpbusd_epi32(s, hi, _mm512_load_si512(a + 64));
          const __m512 sc = _mm512_mul_ps(dw, _mm512_load_ps(reinterpret_cast<const float*>(a + 192)));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), sc, acc[r][t]);
          if constexpr (kMin)
            acc[r][t] = _mm512_fmadd_ps(mw, _mm512_load_ps(reinterpret_cast<const float*>(a + 256)), acc[r][t]);
        }
      }
    };
    for (int64_t g = 0; g < full; ++g) step(g, false);
    if (full < ng) step(full, true);
    store_acc(acc, y, rows, r0, t0);
  }
};

// Q8_0 decode (n < 8), four 34-byte blocks of a row per step, two per zmm (Q8_0Quad). The
// previous kernel (IntKernel, removed: one ymm block per vpdpbusd, R = 8) ran at ~15 GB/s per core on Zen 4,
// compute-bound: per 32 weights and row it spent a vpdpbusd + negate for the −128·Σw seed, an f16
// scale through movzx/vpbroadcastw/vcvtph2ps, a d_w·d_x multiply stored to the stack and
// re-broadcast per token, then vpdpbusd, cvt and FMA — ~9 vector ops per 34 bytes. Here, per 128
// weights and row: two ymm loads + two 256-bit inserts (blocks b, b+1 and b+2, b+3 side by side),
// two vpxor (u = w ^ 0x80 = w + 128: the weight becomes vpdpbusd's unsigned operand, so the +128
// folds out with a seed −128·Σq precomputed per token, not per row), four scale broadcasts and two
// blends; per token two vpdpbusd, two cvt, two mul (d_w·d_x lane patterns) and two FMA — about
// 3.5 zmm ops per 34 bytes at n = 1. A row tail of 1–3 blocks loads zeros for the absent blocks,
// whose activations, seeds and d_x are zero too.
// Activations: per token and 4-block group, x01/x23 [64] int8, seed01/seed23 [16] int32 and
// dx01/dx23 [16] f32 (8 lanes per block) — 384 B, built once per matmul.
// Measured (kernel_bench --hot, 1 thread, CPU µs, Zen 4 under load ~9, 3 alternating runs):
// 2048x2048 (L3-resident, the compute side) 118–121 → 98–105; gate/up 8192x2048 and down, which
// stream from DRAM, medians unchanged within the host's noise (1505 vs 1519, 754 vs 1147 / 579
// vs 542), best-of-30 522 → 423 and 494 → 423.
struct Q8_0Quad {
  static constexpr int kRows1 = 4;
  static constexpr int kRows1Zen = 1;  // matmul_driver.h rows1: 1B Q8_0 decode 16.8 → 21.1 tok/s
  static constexpr int kRowsN = 2;
  static constexpr int kActBytes = 384;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, ng, nb;  // 4-block groups per row (the last may be partial), blocks per row
  const uint8_t* acts;   // [n][ng][384]
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[R][T];
    zero_acc(acc);
    const uint8_t* base = w + static_cast<uint64_t>(r0) * row_bytes;
    const int64_t full = nb / 4;
    constexpr int kB = sizeof(BlockQ8_0);
    auto step = [&](int64_t g, bool tail) {
      prefetch_rows<kPf>(base, R, row_bytes, g * 4 * kB, tail ? row_bytes - g * 4 * kB : 4 * kB);
      const int present = tail ? static_cast<int>(nb - 4 * g) : 4;
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = base + r * row_bytes + 4 * kB * g;
        auto codes = [&](int k) {
          return k < present ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kB * k + 2))
                             : _mm256_setzero_si256();
        };
        auto scale = [&](int k) { return _mm512_set1_ps(k < present ? f16[load_u16(p + kB * k)] : 0.0f); };
        const __m512i u01 = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(codes(0)), codes(1), 1), flip);
        const __m512i u23 = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(codes(2)), codes(3), 1), flip);
        const __m512 dw01 = _mm512_mask_blend_ps(0xFF00, scale(0), scale(1));
        const __m512 dw23 = _mm512_mask_blend_ps(0xFF00, scale(2), scale(3));
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const uint8_t* a = acts + ((t0 + t) * ng + g) * kActBytes;
          const __m512i d01 = _mm512_dpbusd_epi32(_mm512_load_si512(a + 128), u01, _mm512_load_si512(a));
          const __m512i d23 = _mm512_dpbusd_epi32(_mm512_load_si512(a + 192), u23, _mm512_load_si512(a + 64));
          const __m512 s01 = _mm512_mul_ps(dw01, _mm512_load_ps(reinterpret_cast<const float*>(a + 256)));
          const __m512 s23 = _mm512_mul_ps(dw23, _mm512_load_ps(reinterpret_cast<const float*>(a + 320)));
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d23), s23, _mm512_fmadd_ps(_mm512_cvtepi32_ps(d01), s01, acc[r][t]));
        }
      }
    };
    for (int64_t g = 0; g < full; ++g) step(g, false);
    if (full < ng) step(full, true);
    store_acc(acc, y, rows, r0, t0);
  }
};

// The Q8_0Quad activation patterns for x[n, cols] (slot 1 of the calling thread's scratch).
const uint8_t* q8_0_quad_acts(const QuantizedActs& a, int64_t n, int64_t ng) {
  auto* out = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(n * ng) * Q8_0Quad::kActBytes + 64, 1));
  const int64_t nb = a.nb;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* q = a.token_blocks(t);
    for (int64_t g = 0; g < ng; ++g) {
      uint8_t* dst = out + (t * ng + g) * Q8_0Quad::kActBytes;
      alignas(64) uint8_t xq[128] = {};
      alignas(64) float dx[32] = {};
      for (int k = 0; k < 4 && 4 * g + k < nb; ++k) {
        const int64_t b = 4 * g + k;
        std::memcpy(xq + 32 * k, q + 32 * b, 32);
        for (int l = 0; l < 8; ++l) dx[8 * k + l] = a.scales(b)[t];
      }
      for (int h = 0; h < 2; ++h) {
        const __m512i xv = _mm512_load_si512(xq + 64 * h);
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xv);
        _mm512_store_si512(dst + 64 * h, xv);
        _mm512_store_si512(dst + 128 + 64 * h, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
        _mm512_store_ps(reinterpret_cast<float*>(dst + 256 + 64 * h), _mm512_load_ps(dx + 16 * h));
      }
    }
  }
  return out;
}

Q8_0Quad prepare_q8_0(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nb = cols / 32, ng = (nb + 3) / 4;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  return Q8_0Quad{w.data, w.row_bytes(), w.rows, ng, nb, q8_0_quad_acts(a, n, ng), y};
}

bool q4_0_pair_decode() {
  static const bool pair = [] {
    const char* e = std::getenv("LARDER_Q4_0_DECODE");
    return e && std::strcmp(e, "pair") == 0;
  }();
  return pair;
}

}  // namespace

void matmul_q8_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (gemv_invariant(n, kGemm16MinTokensQ8_0)) return matmul_gemv<Q8_0Rows>(&w, &y, 1, x, n);
  if (n >= kGemm16MinTokensQ8_0) {
    matmul_gemm<Q8_0Rows>(&w, &y, 1, x, n);
  } else {
    if (n <= 0 || w.rows <= 0) return;
    const Q8_0Quad k = prepare_q8_0(w, x, n, y);
    run_matmul_tiles(k, w.rows, n, w.cols + 4 * (w.cols / 32));
  }
}
void matmul_q4_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (gemv_invariant(n)) return matmul_gemv<Q4_0Rows>(&w, &y, 1, x, n);
  if (n >= kGemm16MinTokens) {
    matmul_gemm<Q4_0Rows>(&w, &y, 1, x, n);
  } else {
    // Two blocks per zmm: 35–36 GB/s per core at n = 1 against the AVX2 row-pair kernel's 32–33,
    // 1.7× at n = 4 (kernel_bench, Zen 5, 1 thread). An odd block count keeps the AVX2 kernel.
    if (!q4_0_pair_decode()) {
      decode_q4_0_quad(w, x, n, y);
    } else if ((w.cols / 32) % 2) {
      avx2::matmul_q4_0(w, x, n, y);
    } else {
      decode_q4_0(w, x, n, y);
    }
  }
}

// Fused decode (kernels::matmul_multi): one activation quantization, one MultiKernel job.
void matmul_multi_q4_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return matmul_gemm<Q4_0Rows>(ws, ys, count, x, n);
  if (gemv_invariant(n)) return matmul_gemv<Q4_0Rows>(ws, ys, count, x, n);
  if (q4_0_pair_decode()) {
    for (int i = 0; i < count; ++i) matmul_q4_0(ws[i], x, n, ys[i]);
    return;
  }
  const int64_t cols = ws[0].cols, nb = cols / 32, ng = (nb + 3) / 4;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const uint8_t* acts = quad_acts(a, n, ng, 3, 1.0f / 16.0f);
  MultiKernel<Q4_0Quad> mk;
  for (int i = 0; i < count; ++i) mk.add(Q4_0Quad{ws[i].data, ws[i].row_bytes(), ws[i].rows, ng, nb, acts, ys[i]}, ws[i].rows);
  run_matmul_tiles(mk, mk.rows(), n, cols + 4 * nb);
}

namespace {

// Decode of count weights in one LowBitQuad format (count 1: a plain matmul): one activation
// quantization, one pool job.
template <LowBitLayout L>
void decode_low_bit(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  using K = LowBitQuad<L>;
  const int64_t cols = ws[0].cols, nb = cols / 32, ng = (nb + 3) / 4;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  const uint8_t* acts = quad_acts(a, n, ng, L.zero_log2, 1.0f, K::kMin);
  if (count == 1) return run_matmul_tiles(K{ws[0].data, ws[0].row_bytes(), ws[0].rows, ng, nb, acts, ys[0]}, ws[0].rows, n, cols + 4 * nb);
  MultiKernel<K> mk;
  for (int i = 0; i < count; ++i) mk.add(K{ws[i].data, ws[i].row_bytes(), ws[i].rows, ng, nb, acts, ys[i]}, ws[i].rows);
  run_matmul_tiles(mk, mk.rows(), n, cols + 4 * nb);
}

}  // namespace

void decode_q5_0(const WeightView& w, const float* x, int64_t n, float* y) { decode_low_bit<kQ5_0Layout>(&w, &y, 1, x, n); }
void decode_q4_1(const WeightView& w, const float* x, int64_t n, float* y) { decode_low_bit<kQ4_1Layout>(&w, &y, 1, x, n); }
void decode_q5_1(const WeightView& w, const float* x, int64_t n, float* y) { decode_low_bit<kQ5_1Layout>(&w, &y, 1, x, n); }

// Fused decode; prefill shares the activation quantization (matmul_gguf_avx512.cpp's GEMM).
void matmul_multi_q5_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  decode_low_bit<kQ5_0Layout>(ws, ys, count, x, n);
}
void matmul_multi_q4_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  decode_low_bit<kQ4_1Layout>(ws, ys, count, x, n);
}
void matmul_multi_q5_1(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_multi_gguf(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_multi_gguf(ws, ys, count, x, n);
  decode_low_bit<kQ5_1Layout>(ws, ys, count, x, n);
}

void matmul_multi_q8_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokensQ8_0) return matmul_gemm<Q8_0Rows>(ws, ys, count, x, n);
  if (gemv_invariant(n, kGemm16MinTokensQ8_0)) return matmul_gemv<Q8_0Rows>(ws, ys, count, x, n);
  const int64_t cols = ws[0].cols;
  run_multi_decode(prepare_q8_0(ws[0], x, n, ys[0]), ws, ys, count, n, cols + 4 * (cols / 32));
}

namespace {

// The decode kernel over x rounded to bf16 (slot 1 of the calling thread's scratch), for w and
// every weight of its matmul_multi group (same cols).
BF16Kernel prepare_bf16_decode(const WeightView& w, const float* x, int64_t n, float* y) {
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
  return BF16Kernel{w.data, w.row_bytes(), w.rows, cols, cols32, xb, y};
}

}  // namespace

void matmul_bf16(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (n >= kBf16GemmMinTokens && w.cols > 0 && w.cols % 2 == 0) {
    gemm_bf16(w, x, n, y);
    return;
  }
  const BF16Kernel k = prepare_bf16_decode(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, k.cols32 * 2);
}

// Fused q/k/v and gate/up: the activations are converted once, and the weights run as one pool
// job — decode (n < 16) as one set of decode regions across the weights (run_multi_decode),
// prefill as the chunks of every weight's GEMM.
void matmul_multi_bf16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  constexpr int kMax = 4;  // kernels::kMaxMultiMatmul
  if (count <= 0 || n <= 0) return;
  const int64_t cols = ws[0].cols;
  if (n < kBf16GemmMinTokens) {
    const BF16Kernel k = prepare_bf16_decode(ws[0], x, n, ys[0]);
    run_multi_decode(k, ws, ys, count, n, k.cols32 * 2);
    return;
  }
  if (cols <= 0 || cols % 2 != 0 || count > kMax) {
    for (int i = 0; i < count; ++i) matmul_bf16(ws[i], x, n, ys[i]);
    return;
  }
  const int64_t kp = cols / 2;
  const uint32_t* xl = bf16_token_lanes(x, n, cols);
  const Bf16Plan plan(n, kp);
  const bool amx = bf16_gemm_uses_amx();
  Bf16Gemm ks[kMax];
  std::optional<Bf16Chunks> chunks[kMax];
  int64_t first_rb[kMax + 1] = {0};
  for (int i = 0; i < count; ++i) {
    ks[i] = Bf16Gemm{ws[i].data, ws[i].row_bytes(), ws[i].rows, kp, n, xl, ys[i]};
    chunks[i].emplace(ks[i], plan, amx);
    first_rb[i + 1] = first_rb[i] + chunks[i]->row_blocks();
  }
  const int64_t n_rb = first_rb[count], n_gb = chunks[0]->n_gb;  // the same for every weight
  default_pool().parallel_for(n_rb * n_gb, [&](int64_t c, int) {
    const int64_t ib = c % n_rb;
    int i = 0;
    while (ib >= first_rb[i + 1]) ++i;
    chunks[i]->run(ib - first_rb[i], c / n_rb);
  });
}

namespace {

// x rounded to f16 (nearest even; slot 1 of the calling thread's scratch) for F16HalfKernel over w
// and every weight of its matmul_multi group (same cols); false when some |x| > 65504 (f16's
// largest finite value), which the caller then runs on F16Kernel's f32 activations.
bool prepare_f16_decode(const WeightView& w, const float* x, int64_t n, float* y, F16HalfKernel* k) {
  const int64_t cols = w.cols, cols32 = (cols + 31) / 32 * 32;
  auto* xh = static_cast<uint16_t*>(thread_scratch(static_cast<size_t>(n * cols32) * 2, 1));
  const __m512 lim = _mm512_set1_ps(65504.0f);
  __mmask16 big = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    for (int64_t c = 0; c < cols32; c += 16) {
      const int64_t left = cols - c;
      const __mmask16 m = left >= 16 ? 0xffff : static_cast<__mmask16>((1u << std::max<int64_t>(left, 0)) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(m, xt + c);
      big |= _mm512_cmp_ps_mask(_mm512_abs_ps(v), lim, _CMP_GT_OQ);
      _mm256_store_si256(reinterpret_cast<__m256i*>(xh + t * cols32 + c),
                         _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  if (big) return false;
  *k = F16HalfKernel{w.data, w.row_bytes(), w.rows, cols, cols32, xh, y};
  return true;
}

}  // namespace

// F16: decode on F16HalfKernel (F16Kernel when an activation is past f16's range), the weights
// of a matmul_multi group as one job; prefill (n > 8) stays on the AVX2 kernel.
void matmul_f16(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n > 8) return avx2::matmul_f16(w, x, n, y);
  if (n <= 0 || w.rows <= 0) return;
  F16HalfKernel kh;
  if (prepare_f16_decode(w, x, n, y, &kh)) return run_matmul_tiles(kh, w.rows, n, kh.cols32 * 2);
  const F16Kernel k{w.data, w.row_bytes(), w.rows, w.cols, x, y};
  run_matmul_tiles(k, w.rows, n, w.cols * 4);
}
void matmul_multi_f16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n > 8) {
    for (int i = 0; i < count; ++i) avx2::matmul_f16(ws[i], x, n, ys[i]);
    return;
  }
  if (count <= 0 || n <= 0) return;
  F16HalfKernel kh;
  if (prepare_f16_decode(ws[0], x, n, ys[0], &kh)) return run_multi_decode(kh, ws, ys, count, n, kh.cols32 * 2);
  const F16Kernel k{ws[0].data, ws[0].row_bytes(), ws[0].rows, ws[0].cols, x, ys[0]};
  run_multi_decode(k, ws, ys, count, n, ws[0].cols * 4);
}

}  // namespace larder::kernels::cpu::avx512
