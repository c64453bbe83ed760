// matmul_avx2.cpp — y[n, rows] = x[n, cols]·Wᵀ for Q8_0, Q4_0, BF16, F16, F32 weights, AVX2 + FMA.
//
// Integer formats (Q8_0, Q4_0). Activations are quantized once per matmul (act_quant.h), then
// each (weight block, token block) pair is an int8·int8 dot product of 32 values:
//   aw = |w|, s = sign(x, w)            (vpabsb once per weight block, vpsignb per pair)
//   p  = maddubs(aw, s)                 (u8×s8 → 16 × i16; |p| <= 2·128·127 < 2^15, no saturation)
//   i  = madd(p, 1)                     (→ 8 × i32)
//   acc += cvt(i) · (d_w·d_x)           (f32 FMA; the scale differs per block, so it is applied
//                                        per block instead of accumulating int32 across blocks)
// ≈ 5 vector ops per pair, 3 of them on Zen 3's two multiply pipes, i.e. ≈ 1.5–2 cycles per 32 MACs.
// Without AVX-VNNI there is no single-instruction u8·s8→i32 dot; the AVX-512 tier uses vpdpbusd.
// Q4_0 instead feeds its unsigned codes to maddubs directly (see Q4_0Kernel): 4 ops per pair.
//
// Decode is DRAM-bound: Q4_0 at 18 B/32 weights and ≈ 12–15 GB/s per core means one block per
// ≈ 4 cycles; a block costs ≈ 3 (unpack) + 5 ops, inside that budget at 4 ops/cycle, so one token
// saturates memory with one core and 2–4 tokens cost little more (each weight register feeds all
// T tokens of the tile).
//
// Tile shapes, from the 16 ymm registers: a tile keeps R signed weights + R |w| + R·T accumulators
// live. R=4, T=1 (decode: 4 independent FMA chains hide the 4-cycle FMA latency behind the
// 8-op pair) = 12 + 2 temps; R=2, T=4 = 4 + 8 + 2 temps.
//
// Float formats (BF16, F16, F32): weights widened to f32 in registers (bf16: zero-extend + shift
// 16; f16: vcvtph2ps), activations stay f32, one FMA per 8 MACs. R=3, T=4: 12 accumulators
// (≥ FMA latency 4 × 2 FMA pipes) + 3 weights + 1 activation = all 16 ymm; each widened weight
// feeds 4 FMAs. Hot BF16 384×2048, n=128, 1 thread CPU time: 2×4 ≈ 34 GOP/s, 3×4 ≈ 40–49.
#include <immintrin.h>

#include <cmath>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx2/token_lane_avx2.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

// From this many tokens on, Q4_0 and Q8_0 use the token-lane GEMMs (one full 8-token group).
constexpr int64_t kGemmMinTokens = 8;

struct Q8_0Block {
  static constexpr int kBytes = sizeof(BlockQ8_0);
  static __m256i load(const uint8_t* blk) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  }
};

template <class WB>
struct IntKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb;
  QuantizedActs a;
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const int8_t* xq[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xq[t] = a.token_blocks(t0 + t);
    __m256 acc[R][T];
    zero_acc(acc);
    const __m256i ones = _mm256_set1_epi16(1);
    float sc[R * 4];  // scale products d_w·d_x, [row][token]
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wv[R], aw[R];
      // Scales of 4 consecutive tokens of this block: one load (block-major layout, padded).
      const __m128 dx = _mm_loadu_ps(a.scales(b) + t0);
      prefetch_rows<kPf>(wr[0], R, row_bytes, b * WB::kBytes, WB::kBytes);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = wr[r] + b * WB::kBytes;
        wv[r] = WB::load(blk);
        aw[r] = _mm256_abs_epi8(wv[r]);
        _mm_storeu_ps(sc + 4 * r, _mm_mul_ps(f16_bcast4(blk), dx));
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wv[r]));
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
          acc[r][t] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(sc + 4 * r + t), acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// Q4_0 takes the other operand order: its codes u = q + 8 ∈ [0, 15] are already unsigned, so they
// go straight into maddubs' u8 operand against the signed activations — no vpsignb per pair, no
// vpabsb per block — and the zero point is folded out per (row, block) with the activation block
// sums:  Σ (u − 8)·x_q = Σ u·x_q − 8·Σ x_q.  The fold is one 4-token FMA per weight block
// (corr[r] += d_w · bsum[b][t0..t0+3]), so a pair costs 4 ops: maddubs, madd, cvt, FMA.
// (|u·x| pair sums <= 2·15·127 — far from int16 saturation.)
struct Q4_0Kernel {
  // Per (row, block, token): vbroadcasti128 + vpsrlvd + vpand (codes, shared by the T tokens),
  // maddubs, madd, cvt, then one FMSUB folding in the zero point (f·d_x − 8·bsum) and one FMA by
  // d_w; d_w comes from the f16 table (a scalar load + vbroadcastss, no vector ALU op). Measured
  // standalone, hot in L2, 1 thread: 1.6 → 1.4 ns per (row, block) for n = 1 versus the first
  // version (vcvtph2ps per block + a separate correction accumulator).
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb;
  QuantizedActs a;
  float* y;

  static __m256i load_codes(const uint8_t* blk) {
    // Byte j holds element j (low nibble) and j+16 (high nibble): the low 128-bit lane takes
    // the low nibbles, the high lane the bytes shifted right by 4; one AND clears both. The
    // 16 bytes are loaded into both lanes by vbroadcasti128 (a pure load on Zen) and the high
    // lane is shifted by a per-lane vpsrlvd: 2 vector ops instead of shift + insert + and.
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    const __m256i sh = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(sh, _mm256_set1_epi8(0x0f));
  }

  // Decode (one token): two rows share each vector. A row's block is 16 code bytes, so one
  // 256-bit register holds the blocks of rows a (low lane) and b (high lane); the low nibbles
  // (elements 0..15) of both meet x[0..15] broadcast to both lanes and the high nibbles x[16..31],
  // and the two maddubs add in int16 (<= 2·2·15·128, no saturation) before one madd. Per row
  // and block that is 2.5 multiply-pipe ops (maddubs, madd, FMAs) instead of 4, and half the
  // cvt/FMA work; the price is building [d_a ×4 | d_b ×4] with one vinsertf128. Each row's sum
  // is spread over its lane's 4 floats, so each lane folds out 2·bsum (4 lanes × 2 = the 8 of
  // the zero point).
  template <int P, int kPf>
  void tile_pairs(int64_t r0, int64_t t) const {
    const float* f16 = f16_table();
    const uint8_t* wr[2 * P];
    LARDER_UNROLL
    for (int r = 0; r < 2 * P; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const int8_t* xq = a.token_blocks(t);
    __m256 acc[P];
    LARDER_UNROLL
    for (int p = 0; p < P; ++p) acc[p] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
      // Short rows: the tile four ahead in one sweep; long rows: each row's own stream
      // (simd::prefetch_rows, with the hint chosen per CPU). This kernel used to prefetch short
      // rows itself with one prefetcht0 line per block step (64 of the 72 bytes a 4-row step
      // consumes, into L1): on Zen 4 (32 KiB L1D) its gate/up and q/k/v read 20–21 GB/s against
      // the down projection's 31 (prefetch_rows' long-row stream); 1B Q4_0 decode under
      // LARDER_ISA=avx2, 2 threads, alternating: 36.9–40.7 → 51.3–60.0 tok/s.
      prefetch_rows<kPf>(wr[0], 2 * P, row_bytes, b * sizeof(BlockQ4_0), sizeof(BlockQ4_0));
      const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + b * 32)));
      const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + b * 32 + 16)));
      const __m256 dx = _mm256_broadcast_ss(a.scales(b) + t);
      const __m256 bs = _mm256_broadcast_ss(a.sums(b) + t);
      const __m256 c2 = _mm256_add_ps(bs, bs);
      LARDER_UNROLL
      for (int p = 0; p < P; ++p) {
        const uint8_t* ba = wr[2 * p] + b * sizeof(BlockQ4_0);
        const uint8_t* bb = wr[2 * p + 1] + b * sizeof(BlockQ4_0);
        const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(bb + 2), reinterpret_cast<const __m128i*>(ba + 2));
        const __m256i lo = _mm256_and_si256(v, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        const __m256 dw = _mm256_set_m128(_mm_broadcast_ss(f16 + load_u16(bb)), _mm_broadcast_ss(f16 + load_u16(ba)));
        acc[p] = _mm256_fmadd_ps(_mm256_fmsub_ps(f, dx, c2), dw, acc[p]);
      }
    }
    LARDER_UNROLL
    for (int p = 0; p < P; ++p) {
      __m128 lo = _mm256_castps256_ps128(acc[p]), hi = _mm256_extractf128_ps(acc[p], 1);
      lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
      hi = _mm_add_ps(hi, _mm_movehl_ps(hi, hi));
      lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
      hi = _mm_add_ss(hi, _mm_movehdup_ps(hi));
      y[t * rows + r0 + 2 * p] = _mm_cvtss_f32(lo);
      y[t * rows + r0 + 2 * p + 1] = _mm_cvtss_f32(hi);
    }
  }

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    if constexpr (T == 1 && R % 2 == 0) {
      tile_pairs<R / 2, kPf>(r0, t0);
      return;
    }
    const float* f16 = f16_table();
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const int8_t* xq[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xq[t] = a.token_blocks(t0 + t);
    __m256 acc[R][T];
    zero_acc(acc);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
      __m256i u[R];
      __m256 dw[R];
      // As tile_pairs: simd::prefetch_rows (rows are short, 1152 B at 2048 columns, so R
      // interleaved 18-line streams end before the hardware stream prefetcher has ramped up).
      prefetch_rows<kPf>(wr[0], R, row_bytes, b * sizeof(BlockQ4_0), sizeof(BlockQ4_0));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = wr[r] + b * sizeof(BlockQ4_0);
        u[r] = load_codes(blk);
        dw[r] = _mm256_broadcast_ss(f16 + load_u16(blk));
      }
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
        const __m256 dxt = _mm256_broadcast_ss(a.scales(b) + t0 + t);
        // Each of the 8 lanes subtracts bsum once: the lanes sum to Σ u·x·d_x − 8·bsum.
        const __m256 bst = _mm256_broadcast_ss(a.sums(b) + t0 + t);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u[r], xv), ones));
          acc[r][t] = _mm256_fmadd_ps(_mm256_fmsub_ps(f, dxt, bst), dw[r], acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// ---------------------------------------------------------------------------------------------
// Q4_0 GEMM for n >= 8 tokens: token lanes instead of k lanes.
//
// The decode tiles above put 8 k-positions in the 8 lanes, so every (block, token) pair ends with
// its own madd + cvt + scale FMA: ≈ 5 ops per 32 MACs. Here the 8 lanes are 8 *tokens*:
//   act8[g][b][k4] = 32 bytes = for tokens t = 8g..8g+7: x_q[t][32b + 4k4 .. 32b + 4k4 + 3]
// (re-laid out once per matmul), and the 4 weight codes u[4k4..4k4+3] of a row are broadcast to
// all lanes (vpbroadcastd from the tile's unpacked codes, run_gemm_sliced), so
//   p16[r] += maddubs(bcast(u[r][k4]), act8[k4])         (lane t: Σ of 4 products for token t)
// is 2 ops per 32 MACs. The int16 sums cannot overflow over a whole block: per maddubs lane
// |u0·x0 + u1·x1| <= 2·15·127 = 3810, times 8 steps = 30480 < 2^15. Only then, once per (row,
// block) for all 8 tokens: madd → cvt → (· d_x[t] − 8·bsum[t]) → FMA by d_w. Per 4-row × 8-token
// tile and block: 64 ops in the k loop + ≈ 40 of unpack/scale ≈ 10 MACs per op, vs ≈ 6 above.
// Zen 3 retires 2 maddubs per cycle, so the k loop alone could run 64 MAC/cycle; the unpack and
// per-block scale work is what the 4-row tile amortizes (R = 4: 4 float + 4 int16 accumulators,
// activations, scales and constants fit the 16 ymm registers).
struct Q4_0Gemm {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb, n;
  const uint8_t* act8;  // [n_pad/8][nb][8][32]
  QuantizedActs a;
  float* y;

  // A tile's rows unpacked once per chunk (run_gemm_sliced): codes [nb][R][32] and f32 scales
  // [nb][R], so the nibble unpack and the f16 scale conversion cost once per row for up to 512
  // tokens instead of once per (row, group) — they were ~a quarter of a tile's vector ops.
  struct Tile {
    const uint8_t* codes;
    const float* dws;
  };

  int64_t slice_align() const { return 1; }
  size_t tile_bytes(int R) const {
    return round_up64(static_cast<size_t>(nb * R) * 32) + round_up64(static_cast<size_t>(nb * R) * sizeof(float));
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    uint8_t* codes = buf;
    auto* dws = reinterpret_cast<float*>(buf + round_up64(static_cast<size_t>(nb * R) * 32));
    const float* f16 = f16_table();
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = wr + b * sizeof(BlockQ4_0);
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (b * R + r) * 32), Q4_0Kernel::load_codes(blk));
        dws[b * R + r] = f16[load_u16(blk)];
      }
    }
    return Tile{codes, dws};
  }

  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 eight = _mm256_set1_ps(8.0f);
    const uint8_t* ag = act8 + static_cast<uint64_t>(g) * nb * 256;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* cb = tl.codes + b * R * 32;
      __m256i p[R];
      u8_chain<R, 8>(cb, ag + b * 256, p);
      const __m256 dx = _mm256_loadu_ps(a.scales(b) + 8 * g);
      const __m256 bs = _mm256_mul_ps(_mm256_loadu_ps(a.sums(b) + 8 * g), eight);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p[r], ones));
        acc[r] = _mm256_fmadd_ps(_mm256_fmsub_ps(f, dx, bs), _mm256_broadcast_ss(tl.dws + b * R + r), acc[r]);
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g);
  }
};

// Q8_0 GEMM for n >= 8 tokens, same token-lane layout. The weights are signed, so maddubs takes
// |w| (broadcast) as its unsigned operand and the activations with w's sign applied (vpsignb);
// a pair sum reaches 2·128·127 = 32512, so int16 cannot accumulate two steps and each maddubs is
// followed by a madd into int32: 4 vector ops per 32 MACs (sign, maddubs, madd, add) instead of
// Q4_0's 2, and ≈ 5 plus a broadcast in the k-lane tiles.
struct Q8_0Gemm {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nb, n;
  const uint8_t* act8;
  QuantizedActs a;
  float* y;

  // As Q4_0Gemm: the tile's signed bytes, their magnitudes ([nb][R][32] each) and f32 scales
  // ([nb][R]) unpacked once per chunk.
  struct Tile {
    const uint8_t* wq;
    const uint8_t* wa;
    const float* dws;
  };

  int64_t slice_align() const { return 1; }
  size_t tile_bytes(int R) const {
    return 2 * round_up64(static_cast<size_t>(nb * R) * 32) + round_up64(static_cast<size_t>(nb * R) * sizeof(float));
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    const size_t cb = round_up64(static_cast<size_t>(nb * R) * 32);
    uint8_t* wq = buf;
    uint8_t* wa = buf + cb;
    auto* dws = reinterpret_cast<float*>(buf + 2 * cb);
    const float* f16 = f16_table();
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = wr + b * sizeof(BlockQ8_0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ8_0, qs)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(wq + (b * R + r) * 32), v);
        _mm256_store_si256(reinterpret_cast<__m256i*>(wa + (b * R + r) * 32), _mm256_abs_epi8(v));
        dws[b * R + r] = f16[load_u16(blk)];
      }
    }
    return Tile{wq, wa, dws};
  }

  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const uint8_t* ag = act8 + static_cast<uint64_t>(g) * nb * 256;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* qb = tl.wq + b * R * 32;
      const uint8_t* mb = tl.wa + b * R * 32;
      __m256i s[R];
      s8_block<R>(qb, mb, ag + b * 256, s);
      const __m256 dx = _mm256_loadu_ps(a.scales(b) + 8 * g);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 dw = _mm256_broadcast_ss(tl.dws + b * R + r);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(dx, dw), acc[r]);
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g);
  }
};

template <class G>
void matmul_gemm(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t nb = w.cols / 32;
  void* scratch = thread_scratch(quantized_acts_bytes(n, w.cols));
  QuantizedActs a = quantized_acts_view(scratch, n, w.cols);
  quantize_acts_avx2(x, n, w.cols, /*offset128=*/false, a);
  auto* act8 = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(a.n_pad) * nb * 32, 2));
  build_act8(a, n, act8);
  const G k{w.data, w.row_bytes(), w.rows, nb, n, act8, a, y};
  run_gemm_sliced(k, w.rows, a.n_pad / 8, nb);
}

template <class K>
void matmul_int(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  void* scratch = thread_scratch(quantized_acts_bytes(n, w.cols));
  QuantizedActs a = quantized_acts_view(scratch, n, w.cols);
  quantize_acts_avx2(x, n, w.cols, /*offset128=*/false, a);
  K k{w.data, w.row_bytes(), w.rows, w.cols / 32, a, y};
  run_matmul_tiles(k, w.rows, n, w.cols + 4 * (w.cols / 32));
}

// Fused decode (kernels::matmul_multi): one activation quantization, one MultiKernel job.
template <class K>
void matmul_int_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n <= 0) return;
  const int64_t cols = ws[0].cols;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  MultiKernel<K> mk;
  for (int i = 0; i < count; ++i) mk.add(K{ws[i].data, ws[i].row_bytes(), ws[i].rows, cols / 32, a, ys[i]}, ws[i].rows);
  run_matmul_tiles(mk, mk.rows(), n, cols + 4 * (cols / 32));
}

struct F32Row {
  static constexpr int kElemBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static float scalar(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
};
struct F16Row {
  static constexpr int kElemBytes = 2;
  static __m256 load8(const uint8_t* p) { return f16x8_to_f32(p); }
  static float scalar(const uint8_t* p) { return f16_to_f32(load_u16(p)); }
};
struct BF16Row {
  static constexpr int kElemBytes = 2;
  static __m256 load8(const uint8_t* p) { return bf16x8_to_f32(p); }
  static float scalar(const uint8_t* p) { return bf16_to_f32(load_u16(p)); }
};

template <class WF>
struct FloatKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 3;

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, cols;
  const float* x;
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    const float* xt[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xt[t] = x + (t0 + t) * cols;
    __m256 acc[R][T];
    zero_acc(acc);
    const int64_t c8 = cols & ~int64_t{7};
    for (int64_t c = 0; c < c8; c += 8) {
      // Per-row streams, as the AVX-512 BF16 kernel (one cache line per row per prefetch).
      if ((c * WF::kElemBytes) % 64 == 0) prefetch_rows<true>(wr[0], R, row_bytes, c * WF::kElemBytes, 64);
      __m256 wv[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) wv[r] = WF::load8(wr[r] + c * WF::kElemBytes);
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(xt[t] + c);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) {
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        float s = hsum(acc[r][t]);
        // The column tail in explicit FMAs: left to -ffp-contract, GCC fused some of the tile shapes'
        // multiply-adds and not others, so a row's bits depended on the tile it ran in (R, T).
        for (int64_t c = c8; c < cols; ++c) s = std::fma(WF::scalar(wr[r] + c * WF::kElemBytes), xt[t][c], s);
        y[(t0 + t) * rows + r0 + r] = s;
      }
    }
  }
};

template <class WF>
void matmul_float(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  FloatKernel<WF> k{w.data, w.row_bytes(), w.rows, w.cols, x, y};
  run_matmul_tiles(k, w.rows, n, w.cols * 4);
}

}  // namespace

void matmul_q8_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gemm<Q8_0Gemm>(w, x, n, y);
  } else {
    matmul_int<IntKernel<Q8_0Block>>(w, x, n, y);
  }
}
void matmul_q4_0(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= kGemmMinTokens) {
    matmul_gemm<Q4_0Gemm>(w, x, n, y);
  } else {
    matmul_int<Q4_0Kernel>(w, x, n, y);
  }
}
void matmul_multi_q8_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemmMinTokens) {
    for (int i = 0; i < count; ++i) matmul_q8_0(ws[i], x, n, ys[i]);
  } else {
    matmul_int_multi<IntKernel<Q8_0Block>>(ws, ys, count, x, n);
  }
}
void matmul_multi_q4_0(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemmMinTokens) {
    for (int i = 0; i < count; ++i) matmul_q4_0(ws[i], x, n, ys[i]);
  } else {
    matmul_int_multi<Q4_0Kernel>(ws, ys, count, x, n);
  }
}
void matmul_bf16(const WeightView& w, const float* x, int64_t n, float* y) { matmul_float<BF16Row>(w, x, n, y); }
void matmul_f16(const WeightView& w, const float* x, int64_t n, float* y) { matmul_float<F16Row>(w, x, n, y); }
void matmul_f32(const WeightView& w, const float* x, int64_t n, float* y) { matmul_float<F32Row>(w, x, n, y); }

}  // namespace larder::kernels::cpu::avx2
