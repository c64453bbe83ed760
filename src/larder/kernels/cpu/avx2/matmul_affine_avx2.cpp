// matmul_affine_avx2.cpp — y[n, rows] = x[n, cols]·Wᵀ for MLX affine weights, AVX2 + FMA.
//
// Math. Group k of a row has scale s, bias b and codes u_i; its contribution to one output is
//   Σ_i (s·u_i + b)·x_i = s·Σ_i u_i·x_i + b·Σ_i x_i.
// Activations are quantized once per matmul into 32-element int8 blocks (act_quant.h, the same
// quantizer as the Q4_0/Q8_0 kernels: x̂ = d_x·q), so Σ u·x̂ = Σ_blocks d_x·Σ u·q is an integer
// dot product per 32 codes (vpmaddubsw + vpmaddwd), and the group sums Σ x̂ are precomputed once
// per matmul from the activation block sums (bsum = d_x·Σ q). What the kernel computes is exactly
//   Σ_g [ s_g·Σ_{i∈g} u_i·x̂_i + b_g·Σ_{i∈g} x̂_i ] = Σ_i ŵ_i·x̂_i
// up to f32 rounding (tests/unit/kernels_fast replays it). Using Σ x̂ rather than the exact Σ x
// for the bias term makes the activation-rounding error Σ ŵ_i·(x̂_i − x_i), proportional to the
// weight values (as for Q4_0/Q8_0), instead of Σ s·u_i·(x̂_i − x_i): mlx's quantizer puts the
// bias at one end of the group's range, so |s·u| is up to twice |ŵ| (FastAffine's worst
// |err|/Σ|w·x| dropped ≈ 1.6× with this choice).
//
// Groups (32/64/128) are whole 32-element blocks, and a block of any width starts on a byte
// (32·bits bits = 4·bits bytes), so every format is "unpack 32 codes → 32 bytes, then the int8 dot":
// - 4 bits: 16 bytes, element 2j in the low nibble of byte j, 2j+1 in the high nibble. One
//   vbroadcasti128 + vpsrlvd + vpand gives the even elements in the low lane and the odd ones in
//   the high lane; the activation blocks are permuted once per matmul into that order (the dot
//   product does not care about order), so unpacking costs 2 ALU ops per block, as for Q4_0.
// - 8 bits: codes u ∈ [0, 255] would overflow vpmaddubsw's int16 pair sums (2·255·127), so the
//   kernel uses u − 128 (one vpxor) as a signed weight with the Q8_0 |w|/sign(x, w) trick and
//   adds 128·s·Σ x̂ back with the bias term.
// - 2, 3, 5, 6 bits (generic, ShufN): 8 codes of B bits are B whole bytes; a shuffle + per-lane
//   multiply + shift spreads them into bytes (≈ 10 ops per 32 codes, see ShufN). Codes <= 63 are
//   unsigned operands like 4 bits.
//
// Tiling and threading are the shared decode/prefill driver's (matmul_driver.h): R×T tiles, each
// weight block loaded once per tile and used for all T tokens (decode n <= 8: each weight byte
// comes from DRAM once), chunks spread over the default pool. Scales/biases are converted to
// f32 8 groups at a time per row (F32/F16/BF16 storage, a template parameter).
// Prefill (n >= 8) of 4 and 8 bits runs a token-lane GEMM instead (AffineGemm).
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/kernels/cpu/avx2/token_lane_avx2.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

#define LARDER_INLINE inline __attribute__((always_inline))

// Scale/bias storage, resolved at compile time (no per-group branch).
enum class Sd { kBF16, kF16, kF32 };

template <Sd S>
inline float load_scale(const uint8_t* base, int64_t i) {
  if constexpr (S == Sd::kBF16) {
    return bf16_to_f32(load_u16(base + 2 * i));
  } else if constexpr (S == Sd::kF16) {
    return f16_table()[load_u16(base + 2 * i)];
  } else {
    float f;
    std::memcpy(&f, base + 4 * i, 4);
    return f;
  }
}

// How the activation bytes of each 32-element block are reordered (once per matmul) to match the
// order in which an unpacker delivers the codes.
enum class Perm { kNone, kEvenOdd, kQuads };

// Code unpackers: 32 codes of one block → 32 bytes. `end` is the end of the codes tensor (loads
// must not run past it: the mapping may end there).
struct Nib4 {
  static constexpr int kBits = 4;
  static constexpr Perm kPerm = Perm::kEvenOdd;  // low lane: even elements, high lane: odd elements
  static constexpr bool kSigned = false;
  static constexpr int kRows1 = 4;
  template <bool Checked = false>
  static __m256i load(const uint8_t* p, const uint8_t*) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sh = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(sh, _mm256_set1_epi8(0x0f));
  }
};

struct Byte8 {
  static constexpr int kBits = 8;
  static constexpr Perm kPerm = Perm::kNone;
  static constexpr bool kSigned = true;  // u − 128 as int8
  static constexpr int kRows1 = 4;
  template <bool Checked = false>
  static __m256i load(const uint8_t* p, const uint8_t*) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// 2, 3, 5, 6 bits. 8 consecutive codes are B whole bytes (chunk j of the block at byte B·j). Each
// 128-bit lane takes one chunk (16-byte load at its start); vpshufb puts the two bytes holding
// code m into 16-bit lane m; a per-lane vpmullw by 2^(8 − (B·m mod 8)) moves the code's low bit to
// bit 8 (AVX2 has no per-16-bit shift), vpsrlw 8 brings it down; vpackuswb joins two such
// vectors (chunks 0,1 and 2,3) into bytes ordered by chunk 0, 2, 1, 3 (Perm::kQuads), and one
// vpand clears the bits above the code. ≈ 10 vector ops per 32 codes. (A first version spread
// each 8-code chunk with BMI2 pdep and rebuilt the vector from 4 GPRs: 1.3 GOP/s hot on the Zen 3
// dev host, ~10× slower than this — cause not investigated; pdep is also microcoded on Zen 1/2.)
template <int B>
struct ShufN {
  static constexpr int kBits = B;
  static constexpr Perm kPerm = Perm::kQuads;
  static constexpr bool kSigned = false;
  static constexpr int kRows1 = 4;
  static __m256i half(const uint8_t* p, const __m256i& ctl, const __m256i& mul) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + B)), 1);
    return _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, ctl), mul), 8);
  }
  // Checked: the block may be among the tensor's last (its 16-byte loads would run past `end`,
  // where the mapping may end); only the tile holding the last row pays for the test.
  template <bool Checked = false>
  static __m256i load(const uint8_t* p, const uint8_t* end) {
    alignas(32) uint8_t bounce[64];
    if (Checked && p + 3 * B + 16 > end) {
      std::memset(bounce, 0, sizeof bounce);
      std::memcpy(bounce, p, 4 * B);
      p = bounce;
    }
#define LARDER_B0(m) static_cast<char>((B * (m)) / 8)
#define LARDER_B1(m) static_cast<char>((B * (m)) / 8 + 1)
#define LARDER_CTL(m) LARDER_B0(m), LARDER_B1(m)
    const __m256i ctl = _mm256_setr_epi8(LARDER_CTL(0), LARDER_CTL(1), LARDER_CTL(2), LARDER_CTL(3), LARDER_CTL(4),
                                         LARDER_CTL(5), LARDER_CTL(6), LARDER_CTL(7), LARDER_CTL(0), LARDER_CTL(1),
                                         LARDER_CTL(2), LARDER_CTL(3), LARDER_CTL(4), LARDER_CTL(5), LARDER_CTL(6),
                                         LARDER_CTL(7));
#undef LARDER_CTL
#undef LARDER_B1
#undef LARDER_B0
#define LARDER_MUL(m) static_cast<short>(1 << (8 - (B * (m)) % 8))
    const __m256i mul = _mm256_setr_epi16(LARDER_MUL(0), LARDER_MUL(1), LARDER_MUL(2), LARDER_MUL(3), LARDER_MUL(4),
                                          LARDER_MUL(5), LARDER_MUL(6), LARDER_MUL(7), LARDER_MUL(0), LARDER_MUL(1),
                                          LARDER_MUL(2), LARDER_MUL(3), LARDER_MUL(4), LARDER_MUL(5), LARDER_MUL(6),
                                          LARDER_MUL(7));
#undef LARDER_MUL
    const __m256i lo = half(p, ctl, mul), hi = half(p + 2 * B, ctl, mul);
    return _mm256_and_si256(_mm256_packus_epi16(lo, hi), _mm256_set1_epi8(static_cast<char>((1 << B) - 1)));
  }
};

// 8 consecutive groups' scales (or biases) of one row as f32; `count` < 8 at a row's end reads
// only what exists (the tensor may end there) and zero-fills the rest.
template <Sd S>
inline __m256 load_scales8(const uint8_t* row, int64_t g0, int count) {
  constexpr int esz = S == Sd::kF32 ? 4 : 2;
  const uint8_t* p = row + g0 * esz;
  alignas(32) uint8_t bounce[32];
  if (count < 8) {
    std::memset(bounce, 0, sizeof bounce);
    std::memcpy(bounce, p, static_cast<size_t>(count) * esz);
    p = bounce;
  }
  if constexpr (S == Sd::kBF16) {
    return bf16x8_to_f32(p);
  } else if constexpr (S == Sd::kF16) {
    return f16x8_to_f32(p);
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
}

// Per group: the integer dots of its blocks are scaled by each block's d_x into a group
// accumulator (one FMA per block and pair, d_x broadcast once per block and token, shared by the
// rows), which is scaled by s once per group (one FMA per group and pair). Scales and biases are
// converted 8 groups at a time per row (one vector conversion, s kept on the stack for the
// per-group broadcast), and the bias terms of those 8 groups are one FMA per (row, token) against
// the 8 group sums Σ x̂ — accumulated into the same vector as the dots (its lanes are summed at
// the end anyway). Accumulators: 2·R·T vectors, so R·T <= 4 (kRows1 = 4 for one token,
// kRowsN = 1 for 4-token groups: each weight block is still unpacked once for all 4 tokens). Hot in cache, 1 thread, 1024×2048, n = 1: q4 g64
// 58 GOP/s, q8 g64 30 (Q4_0: 41, Q8_0: 21 on the same machine).
template <class C, Sd S>
struct AffineKernel {
  static constexpr int kRows1 = C::kRows1;
  static constexpr int kRowsN = 1;
  static constexpr int kBlockBytes = 4 * C::kBits;

  const uint8_t* w;
  const uint8_t* wend;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  uint64_t srow_bytes;  // bytes of one row of scales
  int64_t rows, ng, bpg;
  QuantizedActs a;
  const float* gq;  // [n_pad][ng_pad] Σ x̂ per (token, group), zero-padded to ng_pad = round_up(ng, 8)
  int64_t ng_pad;
  float* y;

  // One block b for all R×T pairs; First: starts the group accumulators.
  template <int R, int T, bool First, bool Checked, int kPf>
  LARDER_INLINE void block(int64_t b, const uint8_t* const* wr, const int8_t* const* xq, int64_t t0,
                           __m256 (&accg)[R][T]) const {
    const __m256i ones = _mm256_set1_epi16(1);
    prefetch_rows<kPf>(wr[0], R, row_bytes, b * kBlockBytes, kBlockBytes);
    __m256i u[R], aw[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      u[r] = C::template load<Checked>(wr[r] + b * kBlockBytes, wend);
      if constexpr (C::kSigned) aw[r] = _mm256_abs_epi8(u[r]);
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
      const __m256 dxt = _mm256_broadcast_ss(a.scales(b) + t0 + t);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        __m256i p;
        if constexpr (C::kSigned) {
          p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, u[r]));
        } else {
          p = _mm256_maddubs_epi16(u[r], xv);
        }
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        if constexpr (First) {
          accg[r][t] = _mm256_mul_ps(f, dxt);
        } else {
          accg[r][t] = _mm256_fmadd_ps(f, dxt, accg[r][t]);
        }
      }
    }
  }

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
    const bool lr = long_rows(R, row_bytes);
    if (r0 + R == rows) {
      if (lr) tile_impl<R, T, true, true>(r0, t0);
      else tile_impl<R, T, true, false>(r0, t0);
    } else {
      if (lr) tile_impl<R, T, false, true>(r0, t0);
      else tile_impl<R, T, false, false>(r0, t0);
    }
  }

  template <int R, int T, bool Checked, int kPf>
  void tile_impl(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    const uint8_t* sr[R];
    const uint8_t* br[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      sr[r] = scales + static_cast<uint64_t>(r0 + r) * srow_bytes;
      br[r] = biases + static_cast<uint64_t>(r0 + r) * srow_bytes;
    }
    const int8_t* xq[T];
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) xq[t] = a.token_blocks(t0 + t);
    __m256 acc[R][T];
    zero_acc(acc);
    // Scales and biases of the tile two ahead: separate tensors whose per-tile runs are too short
    // for the hardware prefetcher (the codes are prefetched per block). Without this, decode
    // stalled on them: 77–79 % → see bench/RESULTS.md for the measured gain.
    {
      const uint64_t ahead = static_cast<uint64_t>(r0 + 2 * R) * srow_bytes, len = R * srow_bytes;
      for (uint64_t off = 0; off < len; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(scales + ahead + off), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(biases + ahead + off), _MM_HINT_T0);
      }
    }
    alignas(32) float sv[R][8];
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {
      const int gc = static_cast<int>(std::min<int64_t>(8, ng - g0));
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 s8 = load_scales8<S>(sr[r], g0, gc);
        __m256 b8 = load_scales8<S>(br[r], g0, gc);
        // 8 bits: the dots sum s·(u − 128)·x̂, so the bias term takes the 128·s back.
        if constexpr (C::kSigned) b8 = _mm256_fmadd_ps(s8, _mm256_set1_ps(128.0f), b8);
        _mm256_store_ps(sv[r], s8);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t)
          acc[r][t] = _mm256_fmadd_ps(b8, _mm256_loadu_ps(gq + (t0 + t) * ng_pad + g0), acc[r][t]);
      }
      for (int gi = 0; gi < gc; ++gi) {
        const int64_t b0 = (g0 + gi) * bpg;
        __m256 accg[R][T];
        block<R, T, true, Checked, kPf>(b0, wr, xq, t0, accg);
        for (int64_t b = b0 + 1; b < b0 + bpg; ++b) block<R, T, false, Checked, kPf>(b, wr, xq, t0, accg);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256 sg = _mm256_broadcast_ss(&sv[r][gi]);
          LARDER_UNROLL
          for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(accg[r][t], sg, acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

// ---------------------------------------------------------------------------------------------
// Prefill (n >= 8) for 4 and 8 bits: token lanes, as Q4_0Gemm/Q8_0Gemm in matmul_avx2.cpp. The
// activations are re-laid out once per matmul (build_act8: act8[g][b][k4] = for tokens 8g..8g+7
// the 4 bytes x_q[t][32b + 4k4 ..]), each row's 32 codes of a block are unpacked once per chunk
// (run_gemm_sliced) and broadcast 4 at a time against all 8 tokens:
// - 4 bits: p16 += maddubs(bcast(u[4k4..]), act8[k4]), 2 ops per 32 MACs; int16 cannot overflow
//   over a block (per lane 8 steps of a pair sum <= 2·15·127: 30480 < 2^15).
// - 8 bits: the signed u − 128 with |w|/sign(x, w), then madd into int32 every step (a pair sum
//   reaches 2·128·127), 4 ops per 32 MACs.
// Per (row, block): madd/cvt, one FMA by the 8 tokens' d_x into the group accumulator; per
// (row, group): one FMA by s and one by the bias against the 8 tokens' Σ x̂ (gqb, [ng][n_pad]).
// 2, 3, 5, 6 bits keep the decode tiles for prefill (int16 would overflow at 5/6 bits).
// n = 128, 1 thread: q4 g64 2048×8192 37 → 88 GOP/s (Q4_0 GEMM: 95), q8 g64 35 → 54 (Q8_0: 42–61).
template <class C, Sd S>
struct AffineGemm {
  static_assert(std::is_same_v<C, Nib4> || std::is_same_v<C, Byte8>);
  static constexpr int kBlockBytes = 4 * C::kBits;

  const uint8_t* w;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  uint64_t srow_bytes;
  int64_t rows, ng, bpg, nb, n;
  const uint8_t* act8;  // [n_pad/8][nb][8][32]
  QuantizedActs a;
  const float* gqb;  // [ng][n_pad] Σ x̂ per (group, token)
  float* y;

  // A tile's rows unpacked once per chunk (run_gemm_sliced): the codes (and for 8 bits their
  // magnitudes) into [nb][R][32], the scales and biases (the latter with the signed codes'
  // +128·s folded in) into [ng][R] f32. Slices cut at whole quantization groups.
  struct Tile {
    const uint8_t* wq;
    const uint8_t* wa;
    const float* sc;
    const float* bi;
  };

  int64_t slice_align() const { return bpg; }
  size_t tile_bytes(int R) const {
    return (C::kSigned ? 2 : 1) * round_up64(static_cast<size_t>(nb * R) * 32) +
           round_up64(static_cast<size_t>(2 * ng * R) * sizeof(float));
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    const size_t cb = round_up64(static_cast<size_t>(nb * R) * 32);
    uint8_t* wq = buf;
    uint8_t* wa = buf + cb;
    auto* sc = reinterpret_cast<float*>(buf + (C::kSigned ? 2 : 1) * cb);
    float* bi = sc + ng * R;
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      const uint8_t* sr = scales + static_cast<uint64_t>(r0 + r) * srow_bytes;
      const uint8_t* br = biases + static_cast<uint64_t>(r0 + r) * srow_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const __m256i u = C::template load<false>(wr + b * kBlockBytes, nullptr);
        _mm256_store_si256(reinterpret_cast<__m256i*>(wq + (b * R + r) * 32), u);
        if constexpr (C::kSigned) _mm256_store_si256(reinterpret_cast<__m256i*>(wa + (b * R + r) * 32), _mm256_abs_epi8(u));
      }
      for (int64_t g = 0; g < ng; ++g) {
        const float s = load_scale<S>(sr, g);
        float bias = load_scale<S>(br, g);
        if constexpr (C::kSigned) bias += 128.0f * s;
        sc[g * R + r] = s;
        bi[g * R + r] = bias;
      }
    }
    return Tile{wq, wa, sc, bi};
  }

  // Token group g8 over the blocks [b0, b1) (whole quantization groups).
  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g8, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* ag = act8 + static_cast<uint64_t>(g8) * nb * 256;
    for (int64_t g = b0 / bpg; g < b1 / bpg; ++g) {
      __m256 accg[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) accg[r] = _mm256_setzero_ps();
      for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) {
        const uint8_t* qb = tl.wq + b * R * 32;
        const uint8_t* mb = tl.wa + b * R * 32;
        __m256i p[R];
        if constexpr (C::kSigned) s8_block<R>(qb, mb, ag + b * 256, p);
        else u8_chain<R, 8>(qb, ag + b * 256, p);
        const __m256 dx = _mm256_loadu_ps(a.scales(b) + 8 * g8);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m256 f = C::kSigned ? _mm256_cvtepi32_ps(p[r]) : _mm256_cvtepi32_ps(_mm256_madd_epi16(p[r], ones));
          accg[r] = _mm256_fmadd_ps(f, dx, accg[r]);
        }
      }
      const __m256 gqv = _mm256_loadu_ps(gqb + g * a.n_pad + 8 * g8);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(accg[r], _mm256_broadcast_ss(tl.sc + g * R + r), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(tl.bi + g * R + r), gqv, acc[r]);
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g8);
  }
};

// In place, per 32-byte activation block, into the code order of the unpacker.
void permute_acts(QuantizedActs& a, int64_t n, Perm perm) {
  if (perm == Perm::kNone) return;
  // kEvenOdd: [x0 .. x31] → [x0 x2 .. x30 x1 x3 .. x31]: within each lane evens then odds, then
  // quads [l0 even, l0 odd, l1 even, l1 odd] → [l0 even, l1 even, l0 odd, l1 odd].
  // kQuads: quads (8 bytes) 0, 1, 2, 3 → 0, 2, 1, 3.
  const __m256i shuf = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t i = 0; i < n * a.nb; ++i) {
    auto* p = reinterpret_cast<__m256i*>(a.qs + i * 32);
    __m256i v = _mm256_loadu_si256(p);
    if (perm == Perm::kEvenOdd) v = _mm256_shuffle_epi8(v, shuf);
    _mm256_storeu_si256(p, _mm256_permute4x64_epi64(v, 0xD8));
  }
}

template <class C, Sd S>
AffineKernel<C, S> affine_kernel(const WeightView& w, const QuantizedActs& a, const float* gq, int64_t ng, int64_t ng_pad,
                                 float* y) {
  const uint64_t esz = S == Sd::kF32 ? 4 : 2;
  return AffineKernel<C, S>{w.data,
                             w.data + static_cast<uint64_t>(w.rows) * w.row_bytes(),
                             w.row_bytes(),
                             w.scales,
                             w.biases,
                             static_cast<uint64_t>(ng) * esz,
                             w.rows,
                             ng,
                             w.group_size / 32,
                             a,
                             gq,
                             ng_pad,
                             y};
}

template <class C, Sd S>
void run_affine(const WeightView& w, const QuantizedActs& a, const float* gq, int64_t ng, int64_t ng_pad, float* y) {
  run_matmul_tiles(affine_kernel<C, S>(w, a, gq, ng, ng_pad, y), w.rows, a.n, w.cols + 4 * (w.cols / 32));
}

// Fused decode (kernels::matmul_multi: equal width, group size and scale dtype): the weights share
// the quantized activations and one pool job.
template <class C, Sd S>
void run_affine_multi(const WeightView* ws, float* const* ys, int count, const QuantizedActs& a, const float* gq,
                      int64_t ng, int64_t ng_pad) {
  MultiKernel<AffineKernel<C, S>> mk;
  for (int i = 0; i < count; ++i) mk.add(affine_kernel<C, S>(ws[i], a, gq, ng, ng_pad, ys[i]), ws[i].rows);
  run_matmul_tiles(mk, mk.rows(), a.n, ws[0].cols + 4 * (ws[0].cols / 32));
}

template <class C, Sd S>
void run_affine_gemm(const WeightView& w, const QuantizedActs& a, const uint8_t* act8, const float* gqb, int64_t ng,
                     float* y) {
  const uint64_t esz = S == Sd::kF32 ? 4 : 2;
  const AffineGemm<C, S> k{w.data, w.row_bytes(), w.scales, w.biases, static_cast<uint64_t>(ng) * esz,
                           w.rows, ng,           w.group_size / 32, a.nb, a.n,  act8, a, gqb, y};
  run_gemm_sliced(k, w.rows, a.n_pad / 8, a.nb);
}

// From this many tokens on, 4- and 8-bit use the token-lane GEMM (one full 8-token group).
constexpr int64_t kGemmMinTokens = 8;

// The activations every affine kernel of width C reads: int8 blocks in C's order, and Σ x̂ per
// (token, group), token-major so 8 groups are one load.
struct AffineActs {
  QuantizedActs a;
  float* gq;
  int64_t ng, ng_pad;
};

template <class C>
AffineActs prepare_affine_acts(const float* x, int64_t n, int64_t cols, int64_t gs) {
  AffineActs p;
  p.ng = cols / gs;
  p.ng_pad = (p.ng + 7) / 8 * 8;
  void* scratch = thread_scratch(quantized_acts_bytes(n, cols));
  p.a = quantized_acts_view(scratch, n, cols);
  quantize_acts_avx2(x, n, cols, /*offset128=*/false, p.a);
  permute_acts(p.a, n, C::kPerm);
  p.gq = static_cast<float*>(thread_scratch(static_cast<size_t>(n * p.ng_pad) * sizeof(float), 1));
  const int64_t bpg = gs / 32;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < p.ng_pad; ++g) {
      float q = 0;
      if (g < p.ng)
        for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) q += p.a.sums(b)[t];
      p.gq[t * p.ng_pad + g] = q;
    }
  }
  return p;
}

template <class C>
void matmul_affine_impl(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const AffineActs p = prepare_affine_acts<C>(x, n, w.cols, w.group_size);
  const QuantizedActs& a = p.a;
  const float* gq = p.gq;
  const int64_t ng = p.ng, ng_pad = p.ng_pad;
  if constexpr (std::is_same_v<C, Nib4> || std::is_same_v<C, Byte8>) {
    if (n >= kGemmMinTokens) {
      // Σ x̂ group-major for the token-lane GEMM (8 tokens = one load); padding tokens are 0.
      auto* gqb = static_cast<float*>(thread_scratch(static_cast<size_t>(ng * a.n_pad) * sizeof(float), 3));
      for (int64_t g = 0; g < ng; ++g)
        for (int64_t t = 0; t < a.n_pad; ++t) gqb[g * a.n_pad + t] = t < n ? gq[t * ng_pad + g] : 0.0f;
      auto* act8 = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(a.n_pad) * a.nb * 32, 2));
      build_act8(a, n, act8);
      switch (w.scale_dtype) {
        case DType::kBF16: run_affine_gemm<C, Sd::kBF16>(w, a, act8, gqb, ng, y); break;
        case DType::kF16: run_affine_gemm<C, Sd::kF16>(w, a, act8, gqb, ng, y); break;
        default: run_affine_gemm<C, Sd::kF32>(w, a, act8, gqb, ng, y); break;
      }
      return;
    }
  }
  switch (w.scale_dtype) {
    case DType::kBF16: run_affine<C, Sd::kBF16>(w, a, gq, ng, ng_pad, y); break;
    case DType::kF16: run_affine<C, Sd::kF16>(w, a, gq, ng, ng_pad, y); break;
    default: run_affine<C, Sd::kF32>(w, a, gq, ng, ng_pad, y); break;
  }
}

template <class C>
void matmul_multi_affine_impl(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  constexpr bool kHasGemm = std::is_same_v<C, Nib4> || std::is_same_v<C, Byte8>;
  if (n <= 0 || (kHasGemm && n >= kGemmMinTokens)) {
    for (int i = 0; i < count; ++i) matmul_affine_impl<C>(ws[i], x, n, ys[i]);
    return;
  }
  const AffineActs p = prepare_affine_acts<C>(x, n, ws[0].cols, ws[0].group_size);
  switch (ws[0].scale_dtype) {
    case DType::kBF16: run_affine_multi<C, Sd::kBF16>(ws, ys, count, p.a, p.gq, p.ng, p.ng_pad); break;
    case DType::kF16: run_affine_multi<C, Sd::kF16>(ws, ys, count, p.a, p.gq, p.ng, p.ng_pad); break;
    default: run_affine_multi<C, Sd::kF32>(ws, ys, count, p.a, p.gq, p.ng, p.ng_pad); break;
  }
}

}  // namespace

void matmul_multi_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].bits) {
    case 2: matmul_multi_affine_impl<ShufN<2>>(ws, ys, count, x, n); break;
    case 3: matmul_multi_affine_impl<ShufN<3>>(ws, ys, count, x, n); break;
    case 4: matmul_multi_affine_impl<Nib4>(ws, ys, count, x, n); break;
    case 5: matmul_multi_affine_impl<ShufN<5>>(ws, ys, count, x, n); break;
    case 6: matmul_multi_affine_impl<ShufN<6>>(ws, ys, count, x, n); break;
    case 8: matmul_multi_affine_impl<Byte8>(ws, ys, count, x, n); break;
    default: LARDER_CHECK(false, "[kernels] avx2 matmul_multi_affine: bits %d", ws[0].bits);
  }
}

void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  switch (w.bits) {
    case 2: matmul_affine_impl<ShufN<2>>(w, x, n, y); break;
    case 3: matmul_affine_impl<ShufN<3>>(w, x, n, y); break;
    case 4: matmul_affine_impl<Nib4>(w, x, n, y); break;
    case 5: matmul_affine_impl<ShufN<5>>(w, x, n, y); break;
    case 6: matmul_affine_impl<ShufN<6>>(w, x, n, y); break;
    case 8: matmul_affine_impl<Byte8>(w, x, n, y); break;
    default: LARDER_CHECK(false, "[kernels] avx2 matmul_affine: bits %d", w.bits);
  }
}

}  // namespace larder::kernels::cpu::avx2
