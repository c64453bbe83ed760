// gemm16_avx512.h — the AVX-512 VNNI prefill GEMM shared by every integer weight format
// (Q4_0, Q8_0, MLX affine 2–8 bits). Included only by translation units compiled with the
// AVX-512 tier's flags; everything here has internal linkage so no AVX-512 code can be picked by
// the linker for an AVX2 caller.
//
// Why this shape. The AVX2 GEMMs put 8 tokens in the lanes of a ymm register and broadcast 4
// weight bytes against them. Here the lanes are 16 tokens (one zmm), and vpdpbusd does the
// 4-way u8×s8 dot and the int32 accumulation in one instruction: one instruction per 64 MACs
// (AVX2: maddubs + add per 32). On cores with full-width 512-bit integer units (Zen 5, Intel
// server cores) that is 2× the ymm rate; on Zen 4 it costs the same as two ymm ops.
//
// Every format is reduced to one computation: unsigned codes u (one byte per weight, natural
// element order) with a per-block scale s and bias c, w = s·u + c, so for token t
//   Σ_block w·x̂ = s·d_x·Σ u·q + c·(d_x·Σ q) = s·d_x·S + c·bs
// (x̂ = d_x·q, the int8 activation blocks of act_quant.h; bs = d_x·Σ q is the block sum).
// Q4_0: u = nibble, s = d, c = −8d. Q8_0: u = q ^ 0x80, s = d, c = −128d. MLX affine: u = code,
// s and c are the group's scale and bias (constant over the group's blocks, so they are applied
// once per group to a group accumulator). Q4_K, Q5_K and IQ4_XS, whose s and c are integers
// under a super-block's f32 scales, keep a super-block's sums in integers instead (kSuperBlocks,
// over activations quantized per 256 values).
//
// Weights are unpacked once per (row block, chunk of up to 512 tokens) into a per-thread buffer
// of plain bytes ([nb][R][32] per tile) plus f32 scales/biases, then every 16-token group runs
// over the unpacked bytes: per block and row, 8 broadcast loads + 8 vpdpbusd against the 8
// activation vectors of the block (shared by the R rows), then 2–3 f32 ops fold in d_x, s and c.
// The unpacking is thus amortized over all token groups of the chunk, and the format's own bit
// layout never appears in the inner loop.
//
// Activations: quantize_acts16 writes the int8 blocks directly in the token-lane layout
//   q[g][b][k4][lane][4] = x_q[16g + lane][32b + 4k4 .. +3]   (512 bytes per group and block)
// with the same quantizer as quantize_acts_ref (bit-identical bytes and scales), on the pool.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu::avx512 {
namespace {

#define LARDER_GEMM_INLINE inline __attribute__((always_inline))

struct Acts16 {
  int64_t n = 0, nb = 0, n_pad = 0;  // n_pad = round_up(n, 16)
  uint8_t* q = nullptr;               // [n_pad/16][nb][8][16][4] int8
  float* d = nullptr;                 // [nb][n_pad] activation block scale d_x (0 for padding tokens)
  float* bs = nullptr;                // [nb][n_pad] d_x·Σ q
  float* bs16 = nullptr;              // [2·nb][n_pad] d_x·Σ q per 16-element half (when asked for)
  int32_t* qs16 = nullptr;            // [2·nb][n_pad] Σ q per 16-element half (with bs16)
  // quantize_acts16_super (one scale per 256 values; d, bs and the half sums then stay null):
  float* dk = nullptr;                // [nb/8][n_pad] the super-block's scale d_x
  int32_t* qp = nullptr;              // [nb/8][4][n_pad] (Σq of block 2i, Σq of block 2i+1) as int16 pairs
  const uint8_t* block(int64_t g, int64_t b) const { return q + (g * nb + b) * 512; }
};

// Sum of 16 lanes. Own reduction: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its own
// header (the zero-masked extract does not).
inline float hsum16(__m512 v) {
  return simd::hsum(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}

// AMX (Sapphire Rapids and later Xeons): the block dot products S[r][t] = Σ_k u[r][k]·q[t][k] of
// a 16-row tile and a 16-token group are exactly one TDPBUSD (u8 × s8, int32 accumulation, like
// vpdpbusd) of the unpacked codes, [16 rows][32 B] = tile A, and the activation block as the GEMM
// already lays it out, q[k4][lane][4] = tile B (8 rows of 64 B). One instruction then does the
// work of 128 vpdpbusd (16 rows × 8), and what is left on the vector units is the per-block f32
// fold of the scales. Each block's sums must leave the tiles (a 1 KiB store per 8192 MACs, read
// back by the fold): Q4_0 8192x2048, n = 512, 1 thread, Emerald Rapids spent ~60 % of its time
// in the tile products and stores, ~30 % in the fold, ~8 % unpacking — not overlapped, which is
// where this path has room left. Exact integer sums: the results are bit-identical to the
// vpdpbusd path's (tests run both).
// Formats with a scale per 16 elements (kZero < 0: Q6_K, Q2_K, Q3_K) stay on vpdpbusd: two
// half-K products and stores per block made their AMX path slower (kernel_bench 8192x2048,
// n = 512, 1 thread, Emerald Rapids, ms AMX / vpdpbusd: Q6_K 51–58 / 44–46, Q2_K 51 / 44, Q3_K
// 52 / 46; Q5_K 30 / 38, IQ4_XS 30 / 38).
// Tile registers (palette 1), loaded per thread by amx_configure_thread:
//   0, 3, 6, 7: C, 16 rows × 16 int32 (row half × token group)
//   1, 4: A, 16 rows × 32 B of codes — rows 0–15 and 16–31 of a 32-row chunk
//   2, 5: B, 8 rows × 64 B of one activation block — groups g and g + 1
// Blocks whose sums one pass of AMX writes before the fold reads them (4 C tiles × 4 blocks ×
// 1 KiB = 16 KiB: in L1 beside the chunk's codes and the activation blocks).
constexpr int64_t kAmxBatchBlocks = 4;
// A chunk of the AMX path: 32 rows (two A tiles) × 2 token groups per pass.
constexpr int64_t kAmxRows = 32;
constexpr int kAmxGroups = 2;
// int32 sums one batch leaves for the fold: blocks × groups × row halves × a 16 × 16 tile.
constexpr int64_t kAmxBatchSums = kAmxBatchBlocks * kAmxGroups * 2 * 256;
// Fewer token groups stay on vpdpbusd: with one or two groups each tile register is reloaded
// before the products reading it finish, and the unit idles on the chain. kernel_bench
// 8192x2048, 2 threads, Emerald Rapids, µs AMX / vpdpbusd: n = 16: Q4_0 2027 / 1474, Q4_K 1709 /
// 1378; n = 32: 2276 / 1989, 1973 / 2250; n = 64: 3243 / 3655, 2864 / 3464; n = 128: 5039 / 5790,
// 4871 / 6092.
constexpr int64_t kAmxMinGroups = 4;

// From this many tokens on the integer formats run the GEMM below; fewer take the per-format
// decode kernels, which stream the weights once per 4-token tile. The GEMM works in
// 16-token groups, so 9..16 tokens cost it the same as 16, while two 4-token decode tiles cost
// twice one: at 8 tokens the other path was the faster for every format but Q8_0 (kernel_bench
// 8192x2048, n = 8, 2 threads, Zen 4, µs other path / this GEMM: Q4_0 958 / 1553, Q4_K 1428 /
// 1920, Q5_K 1728 / 2252, Q6_K 1725 / 2475, Q2_K 1100 / 2233, Q3_K 1480 / 2711, IQ4_XS 1099 /
// 1987, IQ4_NL 1055 / 2481, MLX q4 1298 / 2309, Q4_1 996 / 2550, Q5_0 1008 / 2608, Q5_1 1110 /
// 3056 (their LowBitQuad kernels; the AVX2 ones they replaced: 2121, 2427, 2576); Q8_0 2358 /
// 1873, hence kGemm16MinTokensQ8_0). At 12 tokens the GEMM won or tied for
// most. Eight concurrent decode streams are one 8-token batch (issue 14 item 4).
constexpr int64_t kGemm16MinTokens = 9;
constexpr int64_t kGemm16MinTokensQ8_0 = 8;


// Decode tiles (R rows × T tokens of 16-lane partial sums): zero the accumulators, and store
// each one's lane sum to y[t0 + t][r0 + r].
template <int R, int T>
LARDER_GEMM_INLINE void zero_acc(__m512 (&acc)[R][T]) {
  LARDER_UNROLL
  for (int r = 0; r < R; ++r)
    LARDER_UNROLL
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
}
template <int R, int T>
LARDER_GEMM_INLINE void store_acc(const __m512 (&acc)[R][T], float* y, int64_t rows, int64_t r0, int64_t t0) {
  LARDER_UNROLL
  for (int t = 0; t < T; ++t)
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum16(acc[r][t]);
}

// Decode in the GEMM's order (issue 41): the exact int32 sums of each of N vectors' 16 lanes, to
// out[0..N) — one pair-sum tree over all N at once (P = N rounded up to a power of two: P − 1
// pair sums, then log2(16/P) more inside the one vector left), ~3 ops per vector. Integer adds
// are exact, so any tree gives the sums the GEMM's per-token int32 chains give.
inline __m512i pair_sums16(__m512i A, __m512i B) {
  const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(A, ev, B), _mm512_permutex2var_epi32(A, od, B));
}
template <int N>
LARDER_GEMM_INLINE void lane_sums(const __m512i (&v)[N], int32_t* out) {
  static_assert(N >= 1 && N <= 16);
  constexpr int P = N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 : N <= 8 ? 8 : 16;
  __m512i w[P];
  LARDER_UNROLL
  for (int i = 0; i < P; ++i) w[i] = i < N ? v[i] : _mm512_setzero_si512();
  LARDER_UNROLL
  for (int m = P; m > 1; m /= 2)
    LARDER_UNROLL
    for (int i = 0; i < m / 2; ++i) w[i] = pair_sums16(w[2 * i], w[2 * i + 1]);
  // w[0]: P segments of 16/P lanes, segment i from v[i]; halve the segments down to one lane.
  LARDER_UNROLL
  for (int width = 16 / P; width > 1; width /= 2) w[0] = pair_sums16(w[0], w[0]);
  alignas(64) int32_t buf[16];
  _mm512_store_si512(buf, w[0]);
  LARDER_UNROLL
  for (int i = 0; i < N; ++i) out[i] = buf[i];
}

// Super-block decode in the GEMM's order (Q4_K, Q5_K, IQ4_XS; issue 41), eight (row, token,
// super-block) items at a time. Item k has two exact integer brackets: S_k = Σ_j sc_j·Σ u·q over
// 16 int32 lanes and M_k = Σ_j m_j·Σq over 8, the latter given in pairs (mp[j] = [M_2j | M_2j+1]).
// super_sums8 adds each bracket's lanes up exactly; each step below halves two vectors' segments
// into one with one blend, one add and one shuffle (fold32: two shifts) — where the pair-sum tree
// (pair_sums16) took two two-source permutes a step, and decode is short of shuffle throughput
// (the codes' nibble and scale shuffles share those ports).
// fold256: [A.lo + A.hi | B.hi + B.lo] — A's 16 lanes to 8 in the low half, B's in the high one.
LARDER_GEMM_INLINE __m512i fold256(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_mask_blend_epi64(0xf0, a, b), _mm512_shuffle_i64x2(a, b, 0x4e));
}
// fold128: 128-bit lanes [X0 X1 X2 X3], [Y0 Y1 Y2 Y3] → [X0 + X1, Y0 + Y1, X2 + X3, Y2 + Y3].
LARDER_GEMM_INLINE __m512i fold128(__m512i x, __m512i y) {
  const __m512i idx = _mm512_setr_epi64(2, 3, 8, 9, 6, 7, 12, 13);  // [X1 Y0 X3 Y2]
  return _mm512_add_epi32(_mm512_mask_blend_epi64(0xcc, x, y), _mm512_permutex2var_epi64(x, idx, y));
}
// fold64: per 128-bit lane, 64-bit halves [P0 P1], [Q0 Q1] → [P0 + P1, Q0 + Q1].
LARDER_GEMM_INLINE __m512i fold64(__m512i p, __m512i q) {
  return _mm512_add_epi32(_mm512_mask_blend_epi64(0xaa, p, q), _mm512_alignr_epi8(q, p, 8));
}
// fold32: per 64-bit element, 32-bit halves [P0 P1], [Q0 Q1] → [P0 + P1, Q0 + Q1].
LARDER_GEMM_INLINE __m512i fold32(__m512i p, __m512i q) {
  return _mm512_mask_blend_epi32(0xaaaa, _mm512_add_epi32(p, _mm512_srli_epi64(p, 32)),
                                 _mm512_add_epi32(q, _mm512_slli_epi64(q, 32)));
}
// One pair's segments: 128-bit lanes [S_2j, M_2j, S_2j+1, M_2j+1] (4 lanes each).
LARDER_GEMM_INLINE __m512i super_pair(__m512i s_a, __m512i s_b, __m512i mp) { return fold128(fold256(s_a, s_b), mp); }
// Four pairs' segments to one vector: 128-bit lane 0 = S of items 0, 4, 2, 6; lane 1 = their M;
// lane 2 = S of items 1, 5, 3, 7; lane 3 = their M (super_lane).
LARDER_GEMM_INLINE __m512i super_sums8(const __m512i (&z)[4]) { return fold32(fold64(z[0], z[1]), fold64(z[2], z[3])); }
// The lane of item k's S in super_sums8's result (its M: 4 lanes up), and where its scale word
// goes in super_scales8's input.
constexpr int super_lane(int k) { return 8 * (k % 2) + 2 * ((k / 2) % 2) + k / 4; }
constexpr int super_word(int k) { return 4 * (k % 2) + 2 * ((k / 2) % 2) + k / 4; }

// The f16 words (d | dmin << 16) of eight items, item k at w[super_word(k)], as f32 in
// super_sums8's layout: d of item k at super_lane(k), its dmin 4 lanes up (vcvtph2ps is exact, as
// the f16 table the GEMM's unpacking reads).
LARDER_GEMM_INLINE __m512 super_scales8(const uint32_t* w) {
  // Per 128-bit lane: [d_a dm_a d_b dm_b d_c dm_c d_d dm_d] → [d_a d_b d_c d_d dm_a dm_b dm_c dm_d].
  const __m256i ctl = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2,
                                       3, 6, 7, 10, 11, 14, 15);
  return _mm512_cvtph_ps(_mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), ctl));
}

// Gemm16::tile_super's t = S·d − M·dmin (a product, then one fnmadd: the same two roundings) of
// the eight items, item k's at super_lane(k): super_sums8 against super_scales8.
LARDER_GEMM_INLINE __m512 super_t8(__m512i sums, __m512 dd) {
  const __m512 f = _mm512_cvtepi32_ps(sums);
  // 0xf5: 128-bit lanes 1 and 3 onto 0 and 2 — each M and dmin onto its S and d.
  return _mm512_fnmadd_ps(_mm512_shuffle_f32x4(f, f, 0xf5), _mm512_shuffle_f32x4(dd, dd, 0xf5), _mm512_mul_ps(f, dd));
}

// One token's 32 values v0|v1 quantized with 1/d = vid into int32 codes i0|i1 (cvtps2dq rounds to
// nearest even, the default MXCSR mode, as nearbyint does) and stored as int8 into lane `lane` of
// the 16-token block blk (4 bytes per 64-byte step): the shared step of both quantizers below.
LARDER_GEMM_INLINE void quantize_lane16(__m512 v0, __m512 v1, __m512 vid, uint8_t* blk, int64_t lane, __m512i& i0,
                                        __m512i& i1) {
  i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
  i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
  const __m256i q = _mm256_set_m128i(_mm512_cvtepi32_epi8(i1), _mm512_cvtepi32_epi8(i0));
  alignas(32) uint32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), q);
  for (int k4 = 0; k4 < 8; ++k4) std::memcpy(blk + 64 * k4 + 4 * lane, &w[k4], 4);
}
// A padding token's lane of blk: zero codes.
LARDER_GEMM_INLINE void zero_lane16(uint8_t* blk, int64_t lane) {
  for (int k4 = 0; k4 < 8; ++k4) std::memset(blk + 64 * k4 + 4 * lane, 0, 4);
}

// Quantizes x[n, cols] into `scratch` slot 0 of the calling thread (act_quant.h's quantizer:
// amax/127, 1/d, round to nearest even; bit-identical to quantize_acts_ref).
// half_sums: also the per-16 block sums (formats with 16-element sub-block scales, Q6_K).
inline Acts16 quantize_acts16(const float* x, int64_t n, int64_t cols, bool half_sums = false) {
  Acts16 a;
  a.n = n;
  a.nb = cols / 32;
  a.n_pad = (n + 15) / 16 * 16;
  const size_t qbytes = round_up64(static_cast<size_t>(a.n_pad * a.nb) * 32);
  const size_t fbytes = round_up64(static_cast<size_t>(a.nb * a.n_pad) * sizeof(float));
  auto* base = static_cast<uint8_t*>(thread_scratch(qbytes + (half_sums ? 6 : 2) * fbytes + 64, 0));
  a.q = base;
  a.d = reinterpret_cast<float*>(base + qbytes);
  a.bs = reinterpret_cast<float*>(base + qbytes + fbytes);
  if (half_sums) {
    a.bs16 = reinterpret_cast<float*>(base + qbytes + 2 * fbytes);
    a.qs16 = reinterpret_cast<int32_t*>(base + qbytes + 4 * fbytes);
  }
  const int64_t groups = a.n_pad / 16;
  const Acts16 out = a;
  // One chunk per 16-token group: each writes only its own 512-byte blocks and scale lanes. Block
  // outer, token inner: the 16 tokens' 4-byte pieces fill a block's 8 lines while they are in L1
  // (token outer revisited every line once per token: 16 × nb × 512 B, 128 KiB at K = 8192).
  default_pool().parallel_for(groups, [&](int64_t g, int) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const int64_t lanes = std::min<int64_t>(16, n - 16 * g);
    for (int64_t b = 0; b < out.nb; ++b) {
      uint8_t* blk = out.q + (g * out.nb + b) * 512;
      float* d_out = out.d + b * out.n_pad + 16 * g;
      float* bs_out = out.bs + b * out.n_pad + 16 * g;
      for (int64_t lane = 0; lane < lanes; ++lane) {
        const float* xt = x + (16 * g + lane) * cols + 32 * b;
        const __m512 v0 = _mm512_loadu_ps(xt), v1 = _mm512_loadu_ps(xt + 16);
        const __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
        __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512i i0, i1;
        quantize_lane16(v0, v1, _mm512_set1_ps(id), blk, lane, i0, i1);
        d_out[lane] = d;
        if (out.bs16) {
          const int sum0 = _mm512_reduce_add_epi32(i0), sum1 = _mm512_reduce_add_epi32(i1);
          bs_out[lane] = d * static_cast<float>(sum0 + sum1);
          out.bs16[2 * b * out.n_pad + 16 * g + lane] = d * static_cast<float>(sum0);
          out.bs16[(2 * b + 1) * out.n_pad + 16 * g + lane] = d * static_cast<float>(sum1);
          out.qs16[2 * b * out.n_pad + 16 * g + lane] = sum0;
          out.qs16[(2 * b + 1) * out.n_pad + 16 * g + lane] = sum1;
        } else {
          bs_out[lane] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)));
        }
      }
      // Padding tokens: zero codes, scales and sums.
      for (int64_t lane = lanes; lane < 16; ++lane) {
        zero_lane16(blk, lane);
        d_out[lane] = 0.0f;
        bs_out[lane] = 0.0f;
        if (out.bs16) {
          out.bs16[2 * b * out.n_pad + 16 * g + lane] = out.bs16[(2 * b + 1) * out.n_pad + 16 * g + lane] = 0.0f;
          out.qs16[2 * b * out.n_pad + 16 * g + lane] = out.qs16[(2 * b + 1) * out.n_pad + 16 * g + lane] = 0;
        }
      }
    }
  });
  return a;
}

// The same token-lane blocks quantized per 256-element super-block (act_quant.h's
// quantize_acts_k_ref: d = amax/127 over the 256 values, bit-identical q), for formats whose
// sub-block scales are integers (kSuperBlocks below). Besides the codes: d_x per super-block and
// the exact Σq of each 32-block, two blocks' sums packed as the int16 halves of one int32 lane
// (|Σq| <= 32·127 < 2^15), the operand layout of vpdpwssd against the weights' packed mins.
inline Acts16 quantize_acts16_super(const float* x, int64_t n, int64_t cols) {
  Acts16 a;
  a.n = n;
  a.nb = cols / 32;
  a.n_pad = (n + 15) / 16 * 16;
  const int64_t nsb = cols / 256;
  const size_t qbytes = round_up64(static_cast<size_t>(a.n_pad * a.nb) * 32);
  const size_t dbytes = round_up64(static_cast<size_t>(nsb * a.n_pad) * sizeof(float));
  auto* base = static_cast<uint8_t*>(thread_scratch(qbytes + 5 * dbytes + 64, 0));
  a.q = base;
  a.dk = reinterpret_cast<float*>(base + qbytes);
  a.qp = reinterpret_cast<int32_t*>(base + qbytes + dbytes);
  const Acts16 out = a;
  default_pool().parallel_for(a.n_pad / 16, [&](int64_t g, int) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const int64_t lanes = std::min<int64_t>(16, n - 16 * g);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      float* d_out = out.dk + sb * out.n_pad + 16 * g;
      int32_t* qp_out = out.qp + sb * 4 * out.n_pad + 16 * g;
      for (int64_t lane = 0; lane < lanes; ++lane) {
        const float* xt = x + (16 * g + lane) * cols + 256 * sb;
        __m512 m = _mm512_setzero_ps();
        LARDER_UNROLL
        for (int i = 0; i < 16; ++i) m = _mm512_max_ps(m, _mm512_andnot_ps(sign, _mm512_loadu_ps(xt + 16 * i)));
        const float d = _mm512_reduce_max_ps(m) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        int32_t sums[8];
        for (int j = 0; j < 8; ++j) {
          __m512i i0, i1;
          quantize_lane16(_mm512_loadu_ps(xt + 32 * j), _mm512_loadu_ps(xt + 32 * j + 16), vid,
                          out.q + (g * out.nb + 8 * sb + j) * 512, lane, i0, i1);
          sums[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        }
        d_out[lane] = d;
        for (int i = 0; i < 4; ++i) qp_out[i * out.n_pad + lane] = pack_i16_pair(sums[2 * i], sums[2 * i + 1]);
      }
      // Padding tokens: zero codes, scales and sums.
      for (int64_t lane = lanes; lane < 16; ++lane) {
        for (int j = 0; j < 8; ++j) zero_lane16(out.q + (g * out.nb + 8 * sb + j) * 512, lane);
        d_out[lane] = 0.0f;
        for (int i = 0; i < 4; ++i) qp_out[i * out.n_pad + lane] = 0;
      }
    }
  });
  return a;
}

// What a weight format gives the GEMM for one row (see the header comment):
//   static constexpr int kZero: > 0 for one scale per block with c = −kZero·s (Q4_0: 8,
//     Q8_0: 128) — the bias then folds into the block step as (S·d_x − kZero·bs)·s;
//     0 for group-wise scale and bias (MLX affine), kept per group;
//     −1 for a scale and bias per 16-element half block (Q6_K): groups() = 2·nb halves, and the
//     block step keeps two int32 sums (k4 0–3 and 4–7) and folds each half's bias with the
//     activation half sums (quantize_acts16(..., half_sums = true)). Optional
//     static constexpr int kHalfZero: the bias is −kHalfZero·scale (Q6_K: 32), and the block step
//     subtracts kHalfZero·Σq from the int32 sums instead.
//   int64_t groups() const, blocks_per_group() const
//   members const uint8_t* w and uint64_t row_bytes: the packed rows (prefetched ahead of unpack)
//   void unpack(int64_t row, uint8_t* codes /* block b at codes + b·stride, 32 bytes */, int64_t stride,
//               float* scale /* per group */, float* bias /* per group, kZero == 0 only */) const
// or, for super-block formats with integer sub-block scales (Q4_K: w = d·sc_j·u − dmin·m_j over
// 32-block j of a 256-element super-block, sc_j and m_j 6-bit integers):
//   static constexpr bool kSuperBlocks = true; groups() = super-blocks, blocks_per_group() = 8;
//   void unpack_super(int64_t row, uint8_t* codes, int64_t stride, int16_t* sc /* per block */,
//                     int16_t* mn /* per block */, float* d /* per super-block */, float* dmin) const
//   The activations are then quantized per super-block (quantize_acts16_super), so a super-block's
//   dot product stays an integer until its end: Σ_j sc_j·S_j (one vpmulld + add per block and row
//   in place of the per-block chain merge, cvt, mul and two FMAs) and the mins' Σ_j m_j·Σq_j (4
//   vpdpwssd per super-block), then 5 f32 ops per super-block. Per 8 blocks of a row that is 64
//   vpdpbusd + 25 other ops instead of 64 + 40 — the trade llama.cpp makes with its Q8_K
//   activations (a coarser activation grid: d_x from the amax of 256 values, not 32).
//
// Gemm16 runs tiles of R rows × one 16-token group × one K slice over the unpacked rows.
//
// Blocking (as Bf16Gemm in matmul_avx512.cpp). A chunk is a row block (gemm_block_rows rows) × up to
// kMaxGroups token groups. It unpacks its rows once, whole, into a per-thread buffer, then walks
// K in slices of blocks: per slice, every tile of the row block runs over every group of the
// chunk, so the chunk's activation slices (≤ kActBudget) stay in L2 across its tiles and a tile's
// unpacked slice (8 rows × ≤ 32 blocks × 32 B) stays in L1 across the groups. Partial sums go
// through a per-chunk f32 buffer between slices (one load and store per accumulator per slice,
// against 8 vpdpbusd per block and row); they are summed in the same block order as one pass, so
// the result is bit-identical to it. Before this, a chunk held whole-K activation rows of ≤ 512
// KiB, so an 8-row tile was unpacked once per 16 groups at K = 2048 and once per 4 at K = 8192,
// and the unpacking (with its weight-stream stalls) was 7 % of Q4_0 pp512 and 11 % of Q4_K_M's.
template <class F>
constexpr bool kSuperBlockFormat = requires { F::kSuperBlocks; };

// What the row adapters of the block formats share: the packed rows (w, row_bytes), nb blocks per
// row, one block per scale group. A format derives from it and adds kZero, groups() and unpack.
struct PackedRows {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nb;
  int64_t blocks_per_group() const { return 1; }
  const uint8_t* packed(int64_t r) const { return w + static_cast<uint64_t>(r) * row_bytes; }
};

template <class F>
struct Gemm16 {
  const F& f;
  const Acts16& a;
  const float* gsum;  // kZero == 0: [ng][n_pad] Σ of bs over each group's blocks
  int64_t rows;
  float* y;

  // One tile's unpacked rows, inside the chunk's buffers. Codes, scales and biases are all
  // block-major, so one pointer plus constant offsets addresses all R rows: the scales then
  // reach the FMAs as embedded-broadcast memory operands. (Row-major [R][ng] scales took one
  // base register per row, and GCC loaded and broadcast each into a register instead: 8 more
  // shuffle ops per block beside the 64 vpdpbusd.)
  struct Unpacked {
    const uint8_t* codes;  // [nb][R][32]
    const float* scale;    // [ng][R] (super-block formats: d)
    const float* bias;     // [ng][R] (super-block formats: dmin)
    const int32_t* isc = nullptr;  // super-block formats: [nb][R] sc_j
    const int32_t* imn = nullptr;  // super-block formats: [ng][4][R] (m_2i, m_2i+1) as int16 pairs
  };

  // Scale words (4 bytes) per unpacked row: f32 scale + bias per group, or for super-block
  // formats d, dmin, 8 sc_j and 4 packed min pairs per super-block.
  static constexpr int64_t unit_words(int64_t ng) { return kSuperBlockFormat<F> ? 14 * ng : 2 * ng; }

  // tmp: 2·ng floats of scratch for one row's scales and biases. valid < R (Gemv16's last tile
  // of a row range): rows from `valid` on are zero codes, scales and biases (they add nothing).
  template <int R>
  Unpacked unpack(int64_t r0, uint8_t* codes, float* sc, float* tmp, int valid = R) const {
    const int64_t ng = f.groups();
    if (valid < R) {
      std::memset(codes, 0, static_cast<size_t>(a.nb * R * 32));
      std::memset(sc, 0, static_cast<size_t>(unit_words(ng) * R) * sizeof(float));
    }
    if constexpr (kSuperBlockFormat<F>) {
      const int64_t nb = 8 * ng;
      float* d = sc;
      float* dmin = sc + R * ng;
      auto* isc = reinterpret_cast<int32_t*>(sc + 2 * R * ng);  // [nb][R]
      int32_t* imn = isc + R * nb;                               // [ng][4][R]
      auto* sc16 = reinterpret_cast<int16_t*>(tmp);
      int16_t* mn16 = sc16 + nb;
      float* td = tmp + nb;  // after 2·nb int16
      for (int r = 0; r < valid; ++r) {
        f.unpack_super(r0 + r, codes + r * 32, R * 32, sc16, mn16, td, td + ng);
        for (int64_t s = 0; s < ng; ++s) {
          d[s * R + r] = td[s];
          dmin[s * R + r] = td[ng + s];
          for (int i = 0; i < 4; ++i) imn[(4 * s + i) * R + r] = pack_i16_pair(mn16[8 * s + 2 * i], mn16[8 * s + 2 * i + 1]);
        }
        for (int64_t b = 0; b < nb; ++b) isc[b * R + r] = sc16[b];
      }
      return {codes, d, dmin, isc, imn};
    } else {
      float* scale = sc;
      float* bias = sc + R * ng;
      for (int r = 0; r < valid; ++r) {
        f.unpack(r0 + r, codes + r * 32, R * 32, tmp, tmp + ng);
        for (int64_t gi = 0; gi < ng; ++gi) {
          scale[gi * R + r] = tmp[gi];
          bias[gi * R + r] = tmp[ng + gi];
        }
      }
      return {codes, scale, bias};
    }
  }

  // R rows × group g over blocks [b0, b1) (whole scale groups). c: this tile's [R][16] partial
  // sums, read unless `first`; written unless `last`, which stores y instead.
  template <int R>
  void tile(const Unpacked& u, int64_t r0, int64_t g, int64_t b0, int64_t b1, float* c, bool first, bool last) const {
    if constexpr (kSuperBlockFormat<F>) {
      tile_super<R>(u, r0, g, b0, b1, c, first, last);
      return;
    } else {
      tile_other<R>(u, r0, g, b0, b1, c, first, last);
    }
  }
  template <int R>
  LARDER_GEMM_INLINE void tile_other(const Unpacked& u, int64_t r0, int64_t g, int64_t b0, int64_t b1, float* c,
                                     bool first, bool last) const {
    // MLX groups of 64 and 128 elements with their block count as a constant: the group loop
    // unrolls and the bookkeeping of a runtime count (two divisions per call, ~60 scalar ops per
    // group beside its 128 vpdpbusd, GPRs spilled to the stack) goes. MLX q4 g64, kernel_bench
    // 2 threads, Zen 5, 4 alternating pairs: 8192x2048 12.0–13.4 → 11.4–12.7 ms, 2048x2048
    // 3.06–3.08 → 2.94–2.98 ms, 2048x8192 0–2 %.
    if constexpr (requires { F::kGroups; }) {
      if (f.blocks_per_group() == 2) return tile_bpg<R, 2>(u, r0, g, b0, b1, c, first, last);
      if (f.blocks_per_group() == 4) return tile_bpg<R, 4>(u, r0, g, b0, b1, c, first, last);
    }
    tile_bpg<R, 0>(u, r0, g, b0, b1, c, first, last);
  }

  // tile() with kBpg blocks per scale group known at compile time (0: f.blocks_per_group()).
  template <int R, int kBpg>
  LARDER_GEMM_INLINE void tile_bpg(const Unpacked& u, int64_t r0, int64_t g, int64_t b0, int64_t b1, float* c, bool first,
                                   bool last) const {
    const int64_t bpg = kBpg ? kBpg : f.blocks_per_group();
    const uint8_t* cr = u.codes;  // block b, row r at cr + (b·R + r)·32
    __m512 acc[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) acc[r] = first ? _mm512_setzero_ps() : _mm512_load_ps(c + 16 * r);
    // kZero < 0: one step per block (its two halves are the "groups" of the scale arrays).
    const int64_t s0 = F::kZero < 0 ? b0 : b0 / bpg, s1 = F::kZero < 0 ? b1 : b1 / bpg;
    for (int64_t gi = s0; gi < s1; ++gi) {
      __m512 accg[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) accg[r] = _mm512_setzero_ps();
      if constexpr (F::kZero < 0) {
        halves<R>(u, g, gi, cr, acc);
        continue;
      }
      if constexpr (F::kZero == 0) {
        if (bpg == 1) {
          group1<R>(u, g, gi, cr, acc);
          continue;
        }
      }
      for (int64_t b = gi * bpg; b < (gi + 1) * bpg; ++b) {
        const uint8_t* ab = a.block(g, b);
        // Two chains per row (block_dots) for kZero > 0. kZero == 0 reaches this loop only with
        // groups of two or more blocks (MLX g64/g128; one-block groups take group1) and keeps one
        // chain: beside its R group accumulators a second one spills (MLX q4 g64 within ±3 %), and
        // the alternatives measured slower — the running sums kept in c (5–15 %), 6-row tiles
        // with two chains (5–8 %).
        __m512i s[R];
        block_dots<R, (F::kZero > 0 ? 2 : 1)>(ab, cr, b, s);
        const __m512 dx = _mm512_loadu_ps(a.d + b * a.n_pad + 16 * g);
        if constexpr (F::kZero > 0) {
          const __m512 zb = _mm512_mul_ps(_mm512_loadu_ps(a.bs + b * a.n_pad + 16 * g),
                                          _mm512_set1_ps(static_cast<float>(F::kZero)));
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(s[r]), dx, zb);
            acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(u.scale[gi * R + r]), acc[r]);
          }
        } else {
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) accg[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), dx, accg[r]);
        }
      }
      if constexpr (F::kZero == 0) {
        const __m512 gq = _mm512_loadu_ps(gsum + gi * a.n_pad + 16 * g);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          acc[r] = _mm512_fmadd_ps(accg[r], _mm512_set1_ps(u.scale[gi * R + r]), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(u.bias[gi * R + r]), gq, acc[r]);
        }
      }
    }
    finish<R>(acc, c, last, g, r0);
  }

  // tile() for super-block formats over whole super-blocks [b0/8, b1/8): per block, one int32
  // chain of 8 vpdpbusd per row (8 independent rows cover vpdpbusd's latency at one per cycle),
  // scaled by sc_j in integers; per super-block, the mins against the activations' packed block
  // sums, then t = d·S − dmin·M and acc += t·d_x. Exact until the cvt of each super-block's sums.
  template <int R>
  LARDER_GEMM_INLINE void tile_super(const Unpacked& u, int64_t r0, int64_t g, int64_t b0, int64_t b1, float* c,
                                     bool first, bool last) const {
    const uint8_t* cr = u.codes;
    __m512 acc[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) acc[r] = first ? _mm512_setzero_ps() : _mm512_load_ps(c + 16 * r);
    for (int64_t sb = b0 / 8; sb < b1 / 8; ++sb) {
      __m512i sacc[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) sacc[r] = _mm512_setzero_si512();
      for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
        __m512i s[R];
        block_dots<R, 1>(a.block(g, b), cr, b, s);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r)
          sacc[r] = _mm512_add_epi32(sacc[r], _mm512_mullo_epi32(s[r], _mm512_set1_epi32(u.isc[b * R + r])));
      }
      const int32_t* qp = a.qp + sb * 4 * a.n_pad + 16 * g;
      const __m512i q0 = _mm512_loadu_si512(qp), q1 = _mm512_loadu_si512(qp + a.n_pad);
      const __m512i q2 = _mm512_loadu_si512(qp + 2 * a.n_pad), q3 = _mm512_loadu_si512(qp + 3 * a.n_pad);
      const __m512 dx = _mm512_loadu_ps(a.dk + sb * a.n_pad + 16 * g);
      const int32_t* mn = u.imn + 4 * sb * R;
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q0, _mm512_set1_epi32(mn[r]));
        m = _mm512_dpwssd_epi32(m, q1, _mm512_set1_epi32(mn[R + r]));
        m = _mm512_dpwssd_epi32(m, q2, _mm512_set1_epi32(mn[2 * R + r]));
        m = _mm512_dpwssd_epi32(m, q3, _mm512_set1_epi32(mn[3 * R + r]));
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sacc[r]), _mm512_set1_ps(u.scale[sb * R + r]));
        t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(u.bias[sb * R + r]), t);
        acc[r] = _mm512_fmadd_ps(t, dx, acc[r]);
      }
    }
    finish<R>(acc, c, last, g, r0);
  }

  // A tile's accumulators (R rows × the 16 tokens of group g): to its partial sums c, or when
  // `last` to y rows r0.. (the group's real tokens only).
  template <int R>
  LARDER_GEMM_INLINE void finish(const __m512 (&acc)[R], float* c, bool last, int64_t g, int64_t r0) const {
    if (!last) {
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) _mm512_store_ps(c + 16 * r, acc[r]);
      return;
    }
    const int64_t t0 = 16 * g, nt = std::min<int64_t>(16, a.n - t0);
    alignas(64) float out[R][16];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) _mm512_store_ps(out[r], acc[r]);
    for (int64_t t = 0; t < nt; ++t)
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = out[r][t];
  }

  // s[r] = Σ u·q over block b of the R rows (codes cr, [nb][R][32]) against activation block ab.
  // kChains int32 chains per row (k4 mod kChains), summed at the end: exact, so the bits do not
  // depend on it. One chain per row is R dependent vpdpbusd chains of 8, and R = 8 chains do not
  // cover a full-width unit (2 per cycle × its latency): two made Q4_0 8192x2048 n = 512 ~8 %
  // faster on Zen 5 (kernel_bench, 1 thread, 3 alternating runs: 25.5–27.1 → 23.3–25.1 ms).
  template <int R, int kChains>
  static LARDER_GEMM_INLINE void block_dots(const uint8_t* ab, const uint8_t* cr, int64_t b, __m512i (&s)[R]) {
    static_assert(kChains == 1 || kChains == 2);
    __m512i c[kChains][R];
    LARDER_UNROLL
    for (int j = 0; j < kChains; ++j)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) c[j][r] = _mm512_setzero_si512();
    LARDER_UNROLL
    for (int k4 = 0; k4 < 8; ++k4) {
      const __m512i xa = _mm512_load_si512(ab + 64 * k4);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        int32_t w4;
        std::memcpy(&w4, cr + (b * R + r) * 32 + 4 * k4, 4);
        c[k4 % kChains][r] = _mm512_dpbusd_epi32(c[k4 % kChains][r], _mm512_set1_epi32(w4), xa);
      }
    }
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) s[r] = kChains == 2 ? _mm512_add_epi32(c[0][r], c[kChains - 1][r]) : c[0][r];
  }

  // Scale group gi of one block (kZero == 0 with bpg == 1: K-quants, IQ4, Q4_1/Q5_x, MLX affine
  // g32) with two int32 chains per row as for kZero > 0 (block_dots), and the arithmetic of the
  // loop in tile() (fma(x, y, 0) rounds as x·y), so the bits are the same. The group
  // accumulator is a temporary here, which leaves the 32 zmm for the 2R chains: kernel_bench
  // 8192x2048, n = 512, 1 thread, Zen 5, 3 alternating runs: Q4_K 27.1–27.7 → 25.5–26.0 ms, Q5_K
  // 27.6–28.6 → 25.9–26.9, IQ4_XS 27.3–28.3 → 25.9–26.2, Q4_1 unchanged. Two-block groups (MLX
  // g64) interleaving their blocks' chains instead measured ~6 % slower, so they and longer
  // groups stay on that loop.
  template <int R>
  LARDER_GEMM_INLINE void group1(const Unpacked& u, int64_t g, int64_t b, const uint8_t* cr, __m512 (&acc)[R]) const {
    __m512i s[R];
    block_dots<R, 2>(a.block(g, b), cr, b, s);
    const __m512 dx = _mm512_loadu_ps(a.d + b * a.n_pad + 16 * g);
    const __m512 gq = _mm512_loadu_ps(gsum + b * a.n_pad + 16 * g);
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 accg = _mm512_mul_ps(_mm512_cvtepi32_ps(s[r]), dx);
      acc[r] = _mm512_fmadd_ps(accg, _mm512_set1_ps(u.scale[b * R + r]), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(u.bias[b * R + r]), gq, acc[r]);
    }
  }

  // Q6_K-style block b = gi (kZero < 0): two int32 sums per row, one per 16-element half, each
  // scaled by its own s and with its own bias against the activation half sums.
  template <int R>
  LARDER_GEMM_INLINE void halves(const Unpacked& u, int64_t g, int64_t b, const uint8_t* cr, __m512 (&acc)[R]) const {
    const uint8_t* ab = a.block(g, b);
    __m512i lo[R], hi[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    LARDER_UNROLL
    for (int k4 = 0; k4 < 8; ++k4) {
      const __m512i xa = _mm512_load_si512(ab + 64 * k4);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        int32_t w4;
        std::memcpy(&w4, cr + (b * R + r) * 32 + 4 * k4, 4);
        if (k4 < 4) {
          lo[r] = _mm512_dpbusd_epi32(lo[r], _mm512_set1_epi32(w4), xa);
        } else {
          hi[r] = _mm512_dpbusd_epi32(hi[r], _mm512_set1_epi32(w4), xa);
        }
      }
    }
    const __m512 dx = _mm512_loadu_ps(a.d + b * a.n_pad + 16 * g);
    if constexpr (requires { F::kHalfZero; }) {
      // The bias is −kHalfZero·s per half: subtract kHalfZero·Σ q from each half's int32 sum
      // (exact) instead of folding two bias terms in f32 — 3 f32 ops per row and block instead
      // of 5, beside its 8 vpdpbusd.
      const __m512i z = _mm512_set1_epi32(F::kHalfZero);
      const __m512i zq0 = _mm512_mullo_epi32(_mm512_loadu_si512(a.qs16 + 2 * b * a.n_pad + 16 * g), z);
      const __m512i zq1 = _mm512_mullo_epi32(_mm512_loadu_si512(a.qs16 + (2 * b + 1) * a.n_pad + 16 * g), z);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const float* sc = u.scale + 2 * b * R + r;
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo[r], zq0)), _mm512_set1_ps(sc[0]));
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi[r], zq1)), _mm512_set1_ps(sc[R]), t);
        acc[r] = _mm512_fmadd_ps(t, dx, acc[r]);
      }
      return;
    }
    const __m512 b0 = _mm512_loadu_ps(a.bs16 + 2 * b * a.n_pad + 16 * g);
    const __m512 b1 = _mm512_loadu_ps(a.bs16 + (2 * b + 1) * a.n_pad + 16 * g);
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) {
      const float* sc = u.scale + 2 * b * R + r;  // half 0 at sc[0], half 1 at sc[R]
      const float* bi = u.bias + 2 * b * R + r;
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(lo[r]), _mm512_set1_ps(sc[0]));
      t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[r]), _mm512_set1_ps(sc[R]), t);
      acc[r] = _mm512_fmadd_ps(t, dx, acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(bi[0]), b0, acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(bi[R]), b1, acc[r]);
    }
  }

  // The int32 sums of blocks [b0, b1) (≤ kAmxBatchBlocks) of a 32-row chunk (codes [nb][32][32])
  // on AMX: row halves h (A tiles 1, 4) × groups g, g+1 (B tiles 2, 5; gc ≤ 2) into
  // out[j][b − b0][h][256]. Four independent products per block, each B tile serving both row
  // halves (one B load per two products: half the L2 traffic of one A tile against four
  // groups), and every store overlapping the next product.
  void amx_sums(const uint8_t* codes, int64_t g, int gc, int64_t b0, int64_t b1, int32_t* out) const {
    const int64_t nbb = b1 - b0;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* cb = codes + b * kAmxRows * 32;
      const int64_t ob = b - b0;
      const uint8_t* ab = a.block(g, b);
      auto o = [&](int j, int h) { return out + ((j * nbb + ob) * 2 + h) * 256; };
      _tile_loadd(1, cb, 32);
      _tile_loadd(2, ab, 64);
      _tile_zero(0);
      _tile_dpbusd(0, 1, 2);
      _tile_loadd(4, cb + 16 * 32, 32);
      _tile_zero(6);
      _tile_dpbusd(6, 4, 2);
      if (gc > 1) {
        _tile_loadd(5, a.block(g + 1, b), 64);
        _tile_zero(3);
        _tile_dpbusd(3, 1, 5);
        _tile_zero(7);
        _tile_dpbusd(7, 4, 5);
      }
      _tile_stored(0, o(0, 0), 64);
      _tile_stored(6, o(0, 1), 64);
      if (gc > 1) {
        _tile_stored(3, o(1, 0), 64);
        _tile_stored(7, o(1, 1), 64);
      }
    }
  }

  // A 32-row chunk (u: codes [nb][32][32], scales and biases [ng][32]) × groups g .. g+gc−1 over
  // blocks [b0, b1), the block sums from AMX (amx_sums, into `sums`: 2 × 16 KiB); c: the
  // chunk's partial sums, [group][32 rows][16]. The fold is tile()'s arithmetic in the same
  // order, so the bits are the same.
  void tile_amx(const Unpacked& u, int64_t r0, int64_t g, int gc, int64_t b0, int64_t b1, float* c, bool first,
                bool last, int32_t* sums) const {
    static_assert(F::kZero >= 0, "formats with 16-element scales stay on vpdpbusd (see run_gemm16)");
    const int64_t bpg = f.blocks_per_group();
    // Batches of whole scale groups (bpg divides kAmxBatchBlocks: 1, 2 or 4).
    const int64_t batch = std::max<int64_t>(kAmxBatchBlocks / bpg, 1) * bpg;
    // Software-pipelined: the tile unit computes batch k + 1 while the vector units fold batch k
    // (two buffers). In program order the fold of a batch comes long after its stores, so the
    // next batch's tile instructions need not wait behind a whole fold in the reorder window.
    amx_sums(u.codes, g, gc, b0, std::min(b1, b0 + batch), sums);
    for (int64_t bb = b0, k = 0; bb < b1; bb += batch, ++k) {
      const int64_t be = std::min(b1, bb + batch), nbb = be - bb;
      if (be < b1) amx_sums(u.codes, g, gc, be, std::min(b1, be + batch), sums + ((k + 1) & 1) * kAmxBatchSums);
      const int32_t* sk = sums + (k & 1) * kAmxBatchSums;
      const bool init = first && bb == b0, store_y = last && be == b1;
      for (int j = 0; j < gc; ++j) {
        for (int h = 0; h < 2; ++h) {
          // Sums of (group j, row half h): [block][h][16 rows][16 tokens].
          fold(u, h, g + j, bb, be, sk + (j * nbb * 2 + h) * 256, 512, c + (j * kAmxRows + 16 * h) * 16, init,
               store_y, r0 + 16 * h);
        }
      }
    }
  }

  // Folds the block sums of row half h (rows 16h..16h+15 of the 32-row chunk u) for group g,
  // blocks [bb, be) — s + (b − bb)·ss = [16 rows][16 tokens] — into the partial sums c (zero
  // when init) and stores them back, or y (rows r0..) when store_y.
  void fold(const Unpacked& u, int h, int64_t g, int64_t bb, int64_t be, const int32_t* s, int64_t ss, float* c,
            bool init, bool store_y, int64_t r0) const {
    constexpr int R = 16;
    constexpr int RS = kAmxRows;  // the scale arrays' row stride
    const float* scale = u.scale + 16 * h;
    const float* bias = u.bias + 16 * h;
    const int64_t bpg = f.blocks_per_group();
    __m512 acc[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) acc[r] = init ? _mm512_setzero_ps() : _mm512_load_ps(c + 16 * r);
    for (int64_t b = bb; b < be; b += bpg) {
      const int64_t gi = b / bpg;
      if constexpr (F::kZero > 0) {
        const int32_t* sb = s + (b - bb) * ss;
        const __m512 dx = _mm512_loadu_ps(a.d + b * a.n_pad + 16 * g);
        const __m512 zb = _mm512_mul_ps(_mm512_loadu_ps(a.bs + b * a.n_pad + 16 * g),
                                        _mm512_set1_ps(static_cast<float>(F::kZero)));
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          const __m512 t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sb + 16 * r)), dx, zb);
          acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(scale[gi * RS + r]), acc[r]);
        }
      } else {
        const __m512 gq = _mm512_loadu_ps(gsum + gi * a.n_pad + 16 * g);
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          __m512 accg = _mm512_setzero_ps();
          for (int64_t j = 0; j < bpg; ++j) {
            const __m512 dx = _mm512_loadu_ps(a.d + (b + j) * a.n_pad + 16 * g);
            accg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(s + (b + j - bb) * ss + 16 * r)), dx, accg);
          }
          acc[r] = _mm512_fmadd_ps(accg, _mm512_set1_ps(scale[gi * RS + r]), acc[r]);
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(bias[gi * RS + r]), gq, acc[r]);
        }
      }
    }
    finish<R>(acc, c, store_y, g, r0);
  }
};

// Tile rows: 8 rows × 16 tokens = 8 int32 + 8 f32 accumulators (+ group accumulators for MLX
// affine), well inside 32 zmm; each activation vector feeds 8 vpdpbusd.
constexpr int kGemmRows = 8;
// Rows per chunk (gemm_block_rows). A chunk walks K slice by slice, and each slice of activations
// (up to kActBudget) comes into L2 from L3 once per chunk, then serves the chunk's other tiles
// from L2: at two tiles a chunk, half the activation reads of every tile-group came from L3 —
// with both cores doing it, enough to cost Q4_0 8192x2048 n = 512 ~10 % against 8 tiles
// (kernel_bench, 2 threads, Zen 5, 4 alternating runs: 12.6–13.9 → 11.5–12.2 ms; MLX q4 and
// Q4_K 6–7 %; 1B pp512 +7–12 %, SmolLM2 +12 %, gemma-3-270m +23 %). Bounded by the chunk's
// unpacked rows with their f32 scales and biases (≤ kCodesBudget beside the slice in L2: 48 rows
// of Q4_0 at K = 2048, 16 at 8192 — a 256 KiB budget gave 32 there and Q4_K 2048x8192 lost 5 %)
// and by balance (≥ 8 chunks per thread, so a core a neighbour slows claims fewer), never under
// two tiles.
constexpr int64_t kMinBlockRows = 2 * kGemmRows;
constexpr int64_t kMaxBlockRows = 8 * kGemmRows;
constexpr int64_t kCodesBudget = 128 * 1024;
inline int64_t gemm_block_rows(int64_t rows, int64_t row_bytes, int64_t token_blocks, int64_t threads) {
  const int64_t by_l2 = kCodesBudget / std::max<int64_t>(row_bytes, 1);
  const int64_t by_balance = rows * token_blocks / std::max<int64_t>(8 * threads, 1);
  const int64_t r = std::min(by_l2, by_balance) / kGemmRows * kGemmRows;
  return std::clamp(r, kMinBlockRows, kMaxBlockRows);
}
// Token groups per chunk: 512 tokens in one chunk, so a prompt of up to 512 tokens unpacks every
// weight row once.
constexpr int64_t kMaxGroups = 32;
// L2 budget for a chunk's activation slices (Zen 4/5 and Intel server cores have ≥ 1 MiB of L2).
constexpr int64_t kActBudget = 512 * 1024;

// Calls fn.template operator()<R>(r) for the tiles of rows [r0, r1): 8-row tiles, then 4, then 1.
template <class Fn>
LARDER_GEMM_INLINE void for_each_tile(int64_t r0, int64_t r1, Fn&& fn) {
  int64_t r = r0;
  for (; r + kGemmRows <= r1; r += kGemmRows) fn.template operator()<kGemmRows>(r);
  for (; r + 4 <= r1; r += 4) fn.template operator()<4>(r);
  for (; r < r1; ++r) fn.template operator()<1>(r);
}

// y[n, rows] for a format F: chunks of (gemm_block_rows rows × ≤ kMaxGroups token groups), each run
// slice by slice over K (see Gemm16).
template <class F>
void run_gemm16(const F& f, const Acts16& a, int64_t rows, float* y) {
  if (a.nb <= 0 || rows <= 0 || a.n <= 0) return;
  const int64_t groups = a.n_pad / 16, nb = a.nb, ng = f.groups(), bpg = f.blocks_per_group();
  float* gsum = nullptr;
  if constexpr (F::kZero == 0 && !kSuperBlockFormat<F>) {
    gsum = static_cast<float*>(thread_scratch(static_cast<size_t>(ng * a.n_pad) * sizeof(float) + 64, 1));
    for (int64_t gi = 0; gi < ng; ++gi) {
      float* dst = gsum + gi * a.n_pad;
      for (int64_t t = 0; t < a.n_pad; t += 16) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t b = gi * bpg; b < (gi + 1) * bpg; ++b) s = _mm512_add_ps(s, _mm512_loadu_ps(a.bs + b * a.n_pad + t));
        _mm512_storeu_ps(dst + t, s);
      }
    }
  }
  const Gemm16<F> k{f, a, gsum, rows, y};
  const int64_t gb = std::min(groups, kMaxGroups);
  const int64_t n_gb = (groups + gb - 1) / gb;
  // Blocks per K slice: what fits the budget for gb groups, in whole scale groups.
  const int64_t kc = std::min(nb, std::max<int64_t>(1, kActBudget / (gb * 512) / bpg) * bpg);
  // AMX (where usable for this format): 32-row chunks, the last ragged one on the vpdpbusd tiles.
  const bool amx = F::kZero >= 0 && !kSuperBlockFormat<F> && gemm_uses_amx() && bpg <= kAmxBatchBlocks &&
                   groups >= kAmxMinGroups;
  const int64_t unit = Gemm16<F>::unit_words(ng);  // scale words per row
  const int64_t unpacked_row_bytes = nb * 32 + unit * 4;   // codes, scales, biases
  const int64_t crows = amx ? kAmxRows : gemm_block_rows(rows, unpacked_row_bytes, n_gb, default_pool().n_threads());
  const int64_t n_rb = (rows + crows - 1) / crows;
  default_pool().parallel_for(n_rb * n_gb, [&](int64_t c, int) {
    const int64_t ib = c % n_rb, ig = c / n_rb;
    const int64_t r0 = ib * crows, r1 = std::min(rows, r0 + crows);
    const int64_t g0 = ig * gb, g1 = std::min(groups, g0 + gb);
    const int64_t nr = r1 - r0, ngc = g1 - g0;
    auto* codes = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(nr * nb) * 32, 4));
    const size_t sc_floats = round_up64(static_cast<size_t>((nr + 1) * unit) * sizeof(float)) / sizeof(float);
    auto* sc = static_cast<float*>(
        thread_scratch((sc_floats + static_cast<size_t>(ngc * nr * 16)) * sizeof(float), 5));
    float* tmp = sc + nr * unit;   // one row's scales and biases
    float* part = sc + sc_floats;  // [ngc][nr][16]
    if constexpr (F::kZero >= 0 && !kSuperBlockFormat<F>) {
      if (amx && nr == kAmxRows) {
        amx_configure_thread(AmxTiles::kBlocks);
        alignas(64) int32_t sums[2 * kAmxBatchSums];
        const typename Gemm16<F>::Unpacked u32 = k.template unpack<kAmxRows>(r0, codes, sc, tmp);
        for (int64_t b0 = 0; b0 < nb; b0 += kc) {
          const int64_t b1 = std::min(nb, b0 + kc);
          for (int64_t g = g0; g < g1; g += kAmxGroups) {
            const int gc = static_cast<int>(std::min<int64_t>(kAmxGroups, g1 - g));
            k.tile_amx(u32, r0, g, gc, b0, b1, part + (g - g0) * nr * 16, b0 == 0, b1 == nb, sums);
          }
        }
        return;
      }
    }
    // Tile i of the row block (rows r..r+R) unpacks to codes + (r − r0)·nb·32 and sc + (r − r0)·unit.
    typename Gemm16<F>::Unpacked u[std::max(kMaxBlockRows, kAmxRows)];
    for_each_tile(r0, r1, [&]<int R>(int64_t r) {
      u[r - r0] = k.template unpack<R>(r, codes + (r - r0) * nb * 32, sc + (r - r0) * unit, tmp);
    });
    for (int64_t b0 = 0; b0 < nb; b0 += kc) {
      const int64_t b1 = std::min(nb, b0 + kc);
      const bool first = b0 == 0, last = b1 == nb;
      for_each_tile(r0, r1, [&]<int R>(int64_t r) {
        for (int64_t g = g0; g < g1; ++g)
          k.template tile<R>(u[r - r0], r, g, b0, b1, part + ((g - g0) * nr + (r - r0)) * 16, first, last);
      });
    }
  });
}

// y_i = x · W_iᵀ for count weights of one format against the same x — kernels::matmul_multi's
// q/k/v and gate/up, or one weight — with one activation quantization for all of them (it was
// 2.5 % of Q4_0 pp512, once per weight). make(w) returns weight w's format adapter.
template <class Make>
void gemm16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, Make make) {
  using F = decltype(make(ws[0]));
  const Acts16 a = kSuperBlockFormat<F> ? quantize_acts16_super(x, n, ws[0].cols)
                                        : quantize_acts16(x, n, ws[0].cols, /*half_sums=*/F::kZero < 0);
  for (int i = 0; i < count; ++i) run_gemm16(make(ws[i]), a, ws[i].rows, ys[i]);
}

// Batch-invariant decode (issue 41; batch_invariant_decode()): the GEMM's arithmetic for each
// token, with rows in the lanes instead of tokens. In Gemm16 a token is one lane, and its output is
// a chain over the blocks in order — per block the exact int32 sum S = Σ u·q, then the same f32
// steps (for Q4_0: acc = fma(fmsub(S, d_x, kZero·bs), s, acc)). A token's result therefore does
// not depend on which tokens share its group, so the GEMM is batch-invariant by construction, and
// a decode call (n < kGemm16MinTokens) that computes the same chain gives the same bits for the
// token as a prefill call would. Here a tile is 16 weight rows unpacked exactly as the GEMM unpacks
// them (Gemm16::unpack<16>: codes [nb][16][32], scales [ng][16]); per token and block, one
// vpdpbusd per two rows against the token's 32 activation bytes (broadcast to both halves) leaves
// 8 partial sums per row, and a tree of even/odd permutes and adds (exact, integers) turns the 8
// vectors into one vector of the 16 rows' S; the f32 steps are then Gemm16's with the per-token
// values broadcast and the per-row values loaded — lane for lane the same operations on the
// same operands, so the same bits. Activations come from the GEMM's own quantizer
// (quantize_acts16 / quantize_acts16_super), their codes copied to token-major order.
//
// Cost against the dedicated decode kernels: the codes pass through an L1/L2 buffer (the unpack)
// and every block pays the integer reduction; see bench/RESULTS.md (issue 41) for what it costs.
template <class F>
struct Gemv16 {
  const Gemm16<F>& k;
  const int8_t* q;  // [n][nb][32] token-major activation codes
  int64_t n;

  // Pair sums of two vectors' adjacent lanes: [A0+A1, A2+A3, .., A14+A15, B0+B1, .., B14+B15].
  static LARDER_GEMM_INLINE __m512i pair_sums(__m512i A, __m512i B) {
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(A, ev, B), _mm512_permutex2var_epi32(A, od, B));
  }

  // Block b of the tile's 16 rows against one token's codes xb: the 16 rows' sums over k4 0..3
  // (lo) and 4..7 (hi) as two vectors (halves), or their total.
  static LARDER_GEMM_INLINE void dots(const uint8_t* cb, const int8_t* xb, __m512i* lo, __m512i* hi, __m512i* all) {
    const __m512i xa = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb)));
    __m512i v[8];
    LARDER_UNROLL
    for (int j = 0; j < 8; ++j)
      v[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(cb + 64 * j), xa);
    // v[j]: row 2j's 8 partials (k4 0..7), then row 2j+1's.
    const __m512i w0 = pair_sums(v[0], v[1]), w1 = pair_sums(v[2], v[3]);
    const __m512i w2 = pair_sums(v[4], v[5]), w3 = pair_sums(v[6], v[7]);
    const __m512i x0 = pair_sums(w0, w1), x1 = pair_sums(w2, w3);  // rows 0–7, 8–15: (lo, hi) each
    if (all) {
      *all = pair_sums(x0, x1);
      return;
    }
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    *lo = _mm512_permutex2var_epi32(x0, ev, x1);
    *hi = _mm512_permutex2var_epi32(x0, od, x1);
  }

  // Token t (lane-of-GEMM values at index b·n_pad + t) over the tile u: the 16 rows' outputs.
  __m512 token(const typename Gemm16<F>::Unpacked& u, int64_t t) const {
    const Acts16& a = k.a;
    const int64_t nb = a.nb, np = a.n_pad;
    constexpr int R = 16;
    const int8_t* xt = q + t * nb * 32;
    const uint8_t* cr = u.codes;
    __m512 acc = _mm512_setzero_ps();
    if constexpr (kSuperBlockFormat<F>) {
      for (int64_t sb = 0; sb < nb / 8; ++sb) {
        __m512i sacc = _mm512_setzero_si512();
        for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
          __m512i s;
          dots(cr + b * R * 32, xt + 32 * b, nullptr, nullptr, &s);
          sacc = _mm512_add_epi32(sacc, _mm512_mullo_epi32(s, _mm512_load_si512(u.isc + b * R)));
        }
        const int32_t* qp = a.qp + sb * 4 * np + t;
        const int32_t* mn = u.imn + 4 * sb * R;
        __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(qp[0]), _mm512_load_si512(mn));
        m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32(qp[np]), _mm512_load_si512(mn + R));
        m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32(qp[2 * np]), _mm512_load_si512(mn + 2 * R));
        m = _mm512_dpwssd_epi32(m, _mm512_set1_epi32(qp[3 * np]), _mm512_load_si512(mn + 3 * R));
        __m512 tt = _mm512_mul_ps(_mm512_cvtepi32_ps(sacc), _mm512_load_ps(u.scale + sb * R));
        tt = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_load_ps(u.bias + sb * R), tt);
        acc = _mm512_fmadd_ps(tt, _mm512_set1_ps(a.dk[sb * np + t]), acc);
      }
      return acc;
    } else if constexpr (F::kZero < 0) {
      for (int64_t b = 0; b < nb; ++b) {
        __m512i lo, hi;
        dots(cr + b * R * 32, xt + 32 * b, &lo, &hi, nullptr);
        const __m512 dx = _mm512_set1_ps(a.d[b * np + t]);
        const float* sc = u.scale + 2 * b * R;
        if constexpr (requires { F::kHalfZero; }) {
          const __m512i zq0 = _mm512_set1_epi32(a.qs16[2 * b * np + t] * F::kHalfZero);
          const __m512i zq1 = _mm512_set1_epi32(a.qs16[(2 * b + 1) * np + t] * F::kHalfZero);
          __m512 tt = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, zq0)), _mm512_load_ps(sc));
          tt = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, zq1)), _mm512_load_ps(sc + R), tt);
          acc = _mm512_fmadd_ps(tt, dx, acc);
        } else {
          const float* bi = u.bias + 2 * b * R;
          __m512 tt = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_load_ps(sc));
          tt = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_load_ps(sc + R), tt);
          acc = _mm512_fmadd_ps(tt, dx, acc);
          acc = _mm512_fmadd_ps(_mm512_load_ps(bi), _mm512_set1_ps(a.bs16[2 * b * np + t]), acc);
          acc = _mm512_fmadd_ps(_mm512_load_ps(bi + R), _mm512_set1_ps(a.bs16[(2 * b + 1) * np + t]), acc);
        }
      }
      return acc;
    } else {
      const int64_t bpg = k.f.blocks_per_group();
      for (int64_t gi = 0; gi < nb / bpg; ++gi) {
        if constexpr (F::kZero > 0) {
          for (int64_t b = gi * bpg; b < (gi + 1) * bpg; ++b) {
            __m512i s;
            dots(cr + b * R * 32, xt + 32 * b, nullptr, nullptr, &s);
            const __m512 dx = _mm512_set1_ps(a.d[b * np + t]);
            const __m512 zb = _mm512_mul_ps(_mm512_set1_ps(a.bs[b * np + t]), _mm512_set1_ps(static_cast<float>(F::kZero)));
            const __m512 tt = _mm512_fmsub_ps(_mm512_cvtepi32_ps(s), dx, zb);
            acc = _mm512_fmadd_ps(tt, _mm512_load_ps(u.scale + gi * R), acc);
          }
        } else {
          __m512 accg;
          if (bpg == 1) {  // Gemm16::group1
            __m512i s;
            dots(cr + gi * R * 32, xt + 32 * gi, nullptr, nullptr, &s);
            accg = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a.d[gi * np + t]));
          } else {
            accg = _mm512_setzero_ps();
            for (int64_t b = gi * bpg; b < (gi + 1) * bpg; ++b) {
              __m512i s;
              dots(cr + b * R * 32, xt + 32 * b, nullptr, nullptr, &s);
              accg = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(a.d[b * np + t]), accg);
            }
          }
          acc = _mm512_fmadd_ps(accg, _mm512_load_ps(u.scale + gi * R), acc);
          acc = _mm512_fmadd_ps(_mm512_load_ps(u.bias + gi * R), _mm512_set1_ps(k.gsum[gi * np + t]), acc);
        }
      }
      return acc;
    }
  }

  // Rows [r0, r0 + nr), nr <= 16, every token; codes/sc: this thread's unpack buffers.
  void tile(int64_t r0, int nr, uint8_t* codes, float* sc, float* tmp) const {
    const typename Gemm16<F>::Unpacked u = k.template unpack<16>(r0, codes, sc, tmp, nr);
    const __mmask16 m = static_cast<__mmask16>((1u << nr) - 1);
    for (int64_t t = 0; t < n; ++t) _mm512_mask_storeu_ps(k.y + t * k.rows + r0, m, token(u, t));
  }
};

// Whether a call of n tokens below the GEMM's threshold min_gemm takes gemv16 (batch_invariant_decode()).
inline bool gemv_invariant(int64_t n, int64_t min_gemm = kGemm16MinTokens) {
  return n > 0 && n < min_gemm && batch_invariant_decode();
}

// The same for the formats whose decode kernels follow the GEMM's super-block arithmetic already
// (Q4_K, Q5_K, IQ4_XS): they need gemv16 only where AMX moves the GEMM off it (gemm_super_blocks).
inline bool gemv_invariant_amx(int64_t n) { return gemv_invariant(n) && gemm_uses_amx(); }

// The GEMM's activation codes in token-major order (slot 2): 32 bytes per (token, block).
inline const int8_t* token_major_codes(const Acts16& a) {
  auto* q = static_cast<int8_t*>(thread_scratch(static_cast<size_t>(a.n * a.nb * 32), 2));
  for (int64_t t = 0; t < a.n; ++t)
    for (int64_t b = 0; b < a.nb; ++b)
      for (int k4 = 0; k4 < 8; ++k4)
        std::memcpy(q + (t * a.nb + b) * 32 + 4 * k4, a.block(t / 16, b) + 64 * k4 + 4 * (t % 16), 4);
  return q;
}

// Runs fn(r0, nr) over 16-row tiles of rows [0, rows) (nr < 16 only for the last): each thread
// streams one contiguous region of tiles (as run_decode_regions: one linear weight stream per
// core), then takes what is left of the others'.
template <class Fn>
void gemv_regions(int64_t rows, Fn&& fn) {
  constexpr int kMaxRegions = 256;
  const int64_t tiles = (rows + 15) / 16;
  const int regions = static_cast<int>(std::min<int64_t>({default_pool().n_threads(), tiles, kMaxRegions}));
  if (regions <= 0) return;
  const int64_t per = (tiles + regions - 1) / regions;  // tiles per region
  std::atomic<int64_t> next[kMaxRegions];
  for (int r = 0; r < regions; ++r) next[r].store(0, std::memory_order_relaxed);
  default_pool().parallel_for(regions, [&](int64_t home, int) {
    for (int j = 0; j < regions; ++j) {
      const int64_t reg = (home + j) % regions;
      const int64_t t_begin = reg * per, len = std::min(tiles, t_begin + per) - t_begin;
      for (int64_t h = next[reg].fetch_add(1, std::memory_order_relaxed); h < len;
           h = next[reg].fetch_add(1, std::memory_order_relaxed)) {
        const int64_t r0 = (t_begin + h) * 16;
        fn(r0, static_cast<int>(std::min<int64_t>(16, rows - r0)));
      }
    }
  });
}

// Decode (n < kGemm16MinTokens) of count weights of one format in the GEMM's arithmetic (Gemv16),
// one activation quantization for all. Each thread streams one contiguous region of rows in
// 16-row tiles (as run_decode_regions: a linear weight stream per core), then helps the others.
template <class Make>
void gemv16(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, Make make) {
  using F = decltype(make(ws[0]));
  if (n <= 0) return;
  const Acts16 a = kSuperBlockFormat<F> ? quantize_acts16_super(x, n, ws[0].cols)
                                        : quantize_acts16(x, n, ws[0].cols, /*half_sums=*/F::kZero < 0);
  const int64_t nb = a.nb;
  const int8_t* q = token_major_codes(a);
  for (int i = 0; i < count; ++i) {
    const F f = make(ws[i]);
    const int64_t rows = ws[i].rows, ng = f.groups(), bpg = f.blocks_per_group();
    if (rows <= 0) continue;
    float* gsum = nullptr;
    if constexpr (F::kZero == 0 && !kSuperBlockFormat<F>) {  // run_gemm16's, the same sums
      gsum = static_cast<float*>(thread_scratch(static_cast<size_t>(ng * a.n_pad) * sizeof(float) + 64, 1));
      for (int64_t gi = 0; gi < ng; ++gi) {
        float* dst = gsum + gi * a.n_pad;
        for (int64_t t = 0; t < a.n_pad; t += 16) {
          __m512 s = _mm512_setzero_ps();
          for (int64_t b = gi * bpg; b < (gi + 1) * bpg; ++b) s = _mm512_add_ps(s, _mm512_loadu_ps(a.bs + b * a.n_pad + t));
          _mm512_storeu_ps(dst + t, s);
        }
      }
    }
    const Gemm16<F> k{f, a, gsum, rows, ys[i]};
    const Gemv16<F> v{k, q, n};
    const int64_t unit = Gemm16<F>::unit_words(ng);
    gemv_regions(rows, [&](int64_t r0, int nr) {
      auto* codes = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(nb * 16 * 32), 4));
      auto* sc = static_cast<float*>(thread_scratch(static_cast<size_t>((17 * unit) + 2 * ng + 64) * sizeof(float), 5));
      v.tile(r0, nr, codes, sc, sc + 16 * unit);
    });
  }
}

}  // namespace
}  // namespace larder::kernels::cpu::avx512
