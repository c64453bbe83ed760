// matmul_kquant_avx2.cpp — y[n, rows] = x[n, cols]·Wᵀ for GGUF Q4_K and Q6_K weights, AVX2.
// (Q4_K decode, n < 8, runs decode_q4k_q5k_avx2.cpp's integer super-block kernel and its prefill
// the super-block GEMM of gemm_super_avx2.h; what follows serves Q6_K — the Q4_K lines record the
// per-32 form those replaced.)
//
// Block layouts: ref/kquant.cpp. Activations are quantized once per matmul into the same 32-wide
// int8 blocks as Q4_0/Q8_0 (act_quant.h), which line up with the K-quant sub-blocks: a Q4_K
// sub-block of 32 is exactly one activation block, a Q6_K pair of 16-element sub-blocks too.
//
// Per (row, token) and 256-element super-block, with x̂ = d_x,j·q_x over activation block j:
//   Q4_K:  Σ_j [ d·sc_j·d_x,j·Σ u·q_x  −  dmin·m_j·(d_x,j·Σ q_x) ]         (u = 4-bit code)
//   Q6_K:  Σ_j d·d_x,j·[ Σ_s∈j sc_s·Σ u·q_x − 32·Σ_s∈j sc_s·Σ q_x ]        (u = q + 32 ∈ 0..63)
// The integer sub-block scale rides in the int16 multiplier of vpmaddwd (maddubs(u, q_x) gives
// int16 pair sums, madd(·, sc) multiplies by the scale and pairs again into int32 — the same op
// count as Q4_0's madd by ones): per (row, token, 32 values) maddubs + madd + cvt + FMA by the
// broadcast d_x,j into a per-super-block float accumulator, which is then scaled by d once
// (FMA) and has the min/zero-point term folded in with one more vector op. Bounds: Q4_K pair
// sums <= 2·15·127 = 3810, ×63 ×2 < 2^19; Q6_K <= 2·63·127 = 16002 (no int16 saturation),
// ×128 ×2 < 2^23; the Q6_K zero-point term Σ sc_s·Σ_16 q_x <= 2·128·2032 < 2^20: no overflow.
//
// The Q6_K kernels need the activation scales token-major (8 consecutive blocks of one token in
// one load) and int16 sums of q_x per 16 values for the zero point: prepare_kacts builds both once
// per matmul (n·cols/16 adds, negligible next to the matmul).
//
// Tiles: the codes of a row's super-block are unpacked once (to 8 × 32 bytes on the stack, a
// handful of ops per 64 weights) and reused by every token of the tile, so decode streams each
// weight byte from DRAM once for up to 4 tokens. R = 3 rows for one token (3 + 3 accumulators
// + temps in 16 ymm), R = 1 row × T <= 4 tokens otherwise (8 accumulators). Q6_K prefill
// (n >= 8) instead runs the token-lane GEMM Q6KGemm below.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx2/gemm_super_avx2.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/gguf_unpack.h"
#include "larder/kernels/cpu/common/kquant_scales.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/gguf_blocks.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

// Token-major views of the quantized activations for the K-quant kernels.
struct KActs {
  QuantizedActs a;
  int64_t nb32 = 0;
  const float* dx = nullptr;     // [n][nb32]: d_x per activation block
  const int16_t* s16 = nullptr;  // [n][nb32·2]: Σ q_x per 16 values
};

KActs prepare_kacts(const float* x, int64_t n, int64_t cols) {
  KActs k;
  void* scratch = thread_scratch(quantized_acts_bytes(n, cols));
  k.a = quantized_acts_view(scratch, n, cols);
  quantize_acts_avx2(x, n, cols, /*offset128=*/false, k.a);
  const int64_t nb = cols / 32;
  k.nb32 = nb;
  const size_t fl = static_cast<size_t>(n * nb);
  auto* buf = static_cast<uint8_t*>(thread_scratch(fl * sizeof(float) + fl * 2 * sizeof(int16_t) + 64, 3));
  auto* dx = reinterpret_cast<float*>(buf);
  for (int64_t b = 0; b < nb; ++b) {
    const float* d = k.a.scales(b);
    for (int64_t t = 0; t < n; ++t) dx[t * nb + b] = d[t];
  }
  k.dx = dx;
  {
    auto* s16 = reinterpret_cast<int16_t*>(dx + fl);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* q = k.a.token_blocks(t);
      for (int64_t b = 0; b < nb; ++b) {
        // maddubs(1, q) sums byte pairs into int16, madd(·, 1) pairs again: 8 sums of 4;
        // two more horizontal steps give the two sums of 16.
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + b * 32));
        const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
        alignas(32) int32_t p[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(p), s4);
        s16[t * nb * 2 + 2 * b] = static_cast<int16_t>(p[0] + p[1] + p[2] + p[3]);
        s16[t * nb * 2 + 2 * b + 1] = static_cast<int16_t>(p[4] + p[5] + p[6] + p[7]);
      }
    }
    k.s16 = s16;
  }
  return k;
}

// Q6_K: codes u = q + 32 per 32-value chunk, the chunk's two int16 scales (low lane: sub-block
// 2k, high lane: 2k+1) as vpmaddwd multipliers, and all 16 scales as int16 for the zero point.
struct Q6KUnpacked {
  alignas(32) uint8_t codes[8][32];
  alignas(32) int16_t sc16[16];
  float d;
};

inline void unpack_q6k(const uint8_t* blk, const float* f16, Q6KUnpacked& u) {
  u.d = f16[load_u16(blk + offsetof(BlockQ6_K, d))];
  _mm256_store_si256(reinterpret_cast<__m256i*>(u.sc16),
                     _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales)))));
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m2 = _mm256_set1_epi8(0x30);
  LARDER_UNROLL
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    // High bits 2k..2k+1 of qh move to bits 4..5 (epi16 shifts; the masks drop what crosses bytes).
    const __m256i u0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
    const __m256i u1 = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
    const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2));
    const __m256i u3 =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
    _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[4 * h + 0]), u0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[4 * h + 1]), u1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[4 * h + 2]), u2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(u.codes[4 * h + 3]), u3);
  }
}

// The vpmaddwd multiplier of Q6_K chunk k: int16 sc[2k] in the low 128-bit lane, sc[2k+1] high.
inline __m256i q6k_chunk_scale(const Q6KUnpacked& u, int k) {
  int32_t pair;
  std::memcpy(&pair, u.sc16 + 2 * k, 4);
  const __m256i ctl = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                       2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(_mm256_set1_epi32(pair), ctl);
}

// Q6_K decode (n < 8). (Q4_K decode has its own integer super-block kernel, see the header.)
struct Q6KDecode {
  static constexpr int kRows1 = 3;
  static constexpr int kRowsN = 1;
  static constexpr int kBlockBytes = sizeof(BlockQ6_K);

  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb;
  KActs k;
  float* y;

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const float* f16 = f16_table();
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m256 acc[R][T];
    zero_acc(acc);
    const int64_t nb = k.nb32;
    Q6KUnpacked u[R];
    for (int64_t sb = 0; sb < nsb; ++sb) {
      prefetch_rows<kPf>(wr[0], R, row_bytes, sb * kBlockBytes, kBlockBytes);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) unpack_q6k(wr[r] + sb * kBlockBytes, f16, u[r]);
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        const int64_t tok = t0 + t;
        const int8_t* xq = k.a.token_blocks(tok) + sb * 256;
        const float* dxt = k.dx + tok * nb + sb * 8;
        __m256 s[R];
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_ps();
        LARDER_UNROLL
        for (int j = 0; j < 8; ++j) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * j));
          const __m256 dxj = _mm256_broadcast_ss(dxt + j);
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            const __m256i cv = _mm256_load_si256(reinterpret_cast<const __m256i*>(u[r].codes[j]));
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(cv, xv), q6k_chunk_scale(u[r], j));
            s[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dxj, s[r]);
          }
        }
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          // Zero point: 32·Σ_j d_x,j·Σ_s∈j sc_s·Σ_16 q_x (lane j of the madd is chunk j).
          const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(u[r].sc16));
          const __m256i sx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.s16 + tok * nb * 2 + sb * 16));
          const __m256 z = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sc, sx)), _mm256_loadu_ps(dxt));
          s[r] = _mm256_fnmadd_ps(z, _mm256_set1_ps(32.0f), s[r]);
          acc[r][t] = _mm256_fmadd_ps(s[r], _mm256_set1_ps(u[r].d), acc[r][t]);
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

void decode_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const KActs k = prepare_kacts(x, n, w.cols);
  const Q6KDecode kern{w.data, w.row_bytes(), w.rows, w.cols / 256, k, y};
  run_matmul_tiles(kern, w.rows, n, w.cols + 8 * (w.cols / 32) + w.cols / 8);
}

// Q6_K GEMM for n >= 8 tokens, same token-lane layout. Codes u = q + 32 reach 63, so a maddubs
// lane reaches 2·63·127 = 16002 and int16 holds only two steps: each pair of steps is summed in
// int16 and widened by vpmaddwd with the 16-value sub-block's scale as multiplier (steps 0..3 are
// values 0..15 of the block = sub-block 2j, steps 4..7 sub-block 2j+1): |lane| <= 4·2·2·16002·128
// < 2^25. The zero point (u − 32) is one more vpmaddwd per (row, block), in integers: the
// token-lane int16 sums of q_x over each 16 values (zs: lane pair t = Σ_lo, Σ_hi of token t,
// built once per matmul) times the dword (−32·sc_a, −32·sc_b) (|32·128| fits int16), so the
// block's integer total is exact and converted once. Every multiplier is a dword broadcast
// straight from memory (a load, no shuffle): the scale dwords hold sc in both int16 halves.
// Per (row, block) that leaves 20 ALU ops in the k loop and 5 after it for 256 MACs; the float
// zero-point fold this replaced cost 10 after it, a third of Q4_K's whole per-block budget.
struct Q6KGemm {
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t rows, nsb, n;
  const uint8_t* act8;
  const int16_t* zs;  // [groups][nb][8 tokens][2]
  QuantizedActs a;
  float* y;

  // A tile's rows unpacked once per chunk (run_gemm_sliced): the codes [nb][R][32] and per
  // (block, row) four dwords: sc_a|sc_a, sc_b|sc_b, −32·sc_a|−32·sc_b (int16 pairs), d (f32).
  // Sliced because the 6-bit unpack is a large share of a row's cost: at K = 8192 the older
  // chunking (whole-K activations of 4 groups) unpacked each row 16 times for 512 tokens.
  struct Tile {
    const uint8_t* codes;
    const int32_t* mul;
  };

  int64_t slice_align() const { return 1; }  // every 32-block carries its own scales
  size_t tile_bytes(int R) const {
    return round_up64(static_cast<size_t>(nsb * 8 * R) * 32) + round_up64(static_cast<size_t>(nsb * 8 * R) * 16);
  }
  template <int R>
  Tile unpack(int64_t r0, uint8_t* buf) const {
    const int64_t nb = nsb * 8;
    uint8_t* codes = buf;
    auto* mul = reinterpret_cast<int32_t*>(buf + round_up64(static_cast<size_t>(nb * R) * 32));
    const float* f16 = f16_table();
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + static_cast<uint64_t>(r0 + r) * row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        Q6KUnpacked u;
        unpack_q6k(wr + sb * sizeof(BlockQ6_K), f16, u);
        for (int j = 0; j < 8; ++j) {
          const int64_t b = sb * 8 + j;
          _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (b * R + r) * 32),
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(u.codes[j])));
          const auto lo = static_cast<uint16_t>(u.sc16[2 * j]), hi = static_cast<uint16_t>(u.sc16[2 * j + 1]);
          const auto zlo = static_cast<uint16_t>(-32 * u.sc16[2 * j]), zhi = static_cast<uint16_t>(-32 * u.sc16[2 * j + 1]);
          int32_t* m = mul + (b * R + r) * 4;
          m[0] = static_cast<int32_t>(lo | (static_cast<uint32_t>(lo) << 16));
          m[1] = static_cast<int32_t>(hi | (static_cast<uint32_t>(hi) << 16));
          m[2] = static_cast<int32_t>(zlo | (static_cast<uint32_t>(zhi) << 16));
          std::memcpy(m + 3, &u.d, sizeof(float));
        }
      }
    }
    return Tile{codes, mul};
  }

  template <int R, bool kFirst, bool kLast>
  __attribute__((always_inline)) void tile(const Tile& tl, int64_t r0, int64_t g, int64_t b0, int64_t b1,
                                           float* part) const {
    __m256 acc[R];
    gemm_sums_start<R, kFirst>(acc, part);
    const int64_t nb = nsb * 8;
    const uint8_t* ag = act8 + static_cast<uint64_t>(g) * nb * 256;
    const int16_t* zg = zs + static_cast<uint64_t>(g) * nb * 16;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* cb = tl.codes + b * R * 32;
      const int32_t* mb = tl.mul + b * R * 4;
      const uint8_t* ab = ag + b * 256;
      __m256i p[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) p[r] = _mm256_setzero_si256();
      LARDER_UNROLL
      for (int k2 = 0; k2 < 4; ++k2) {
        const __m256i xa0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab + 64 * k2));
        const __m256i xa1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab + 64 * k2 + 32));
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          int32_t u0, u1;
          std::memcpy(&u0, cb + r * 32 + 8 * k2, 4);
          std::memcpy(&u1, cb + r * 32 + 8 * k2 + 4, 4);
          const __m256i q2 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(u0), xa0),
                                              _mm256_maddubs_epi16(_mm256_set1_epi32(u1), xa1));
          p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(q2, _mm256_set1_epi32(mb[r * 4 + k2 / 2])));
          __asm__("" : "+x"(p[r]));
        }
      }
      const __m256i zv = _mm256_load_si256(reinterpret_cast<const __m256i*>(zg + b * 16));
      const __m256 dx = _mm256_loadu_ps(a.scales(b) + 8 * g);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256i t = _mm256_add_epi32(p[r], _mm256_madd_epi16(zv, _mm256_set1_epi32(mb[r * 4 + 2])));
        const __m256 d = _mm256_castsi256_ps(_mm256_set1_epi32(mb[r * 4 + 3]));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(t), dx), d, acc[r]);
      }
    }
    gemm_sums_finish<R, kLast>(acc, part, y, rows, n, r0, g);
  }
};

void matmul_q6_k_gemm(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t nb = w.cols / 32;
  const KActs k = prepare_kacts(x, n, w.cols);
  const QuantizedActs& a = k.a;
  auto* act8 = static_cast<uint8_t*>(thread_scratch(static_cast<size_t>(a.n_pad) * nb * 32, 2));
  build_act8(a, n, act8);
  const int64_t groups = a.n_pad / 8;
  auto* zs = static_cast<int16_t*>(thread_scratch(static_cast<size_t>(groups * nb * 16) * sizeof(int16_t), 1));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < nb; ++b)
      for (int t = 0; t < 8; ++t)
        for (int h = 0; h < 2; ++h) {
          const int64_t tok = 8 * g + t;
          zs[((g * nb + b) * 8 + t) * 2 + h] = tok < n ? k.s16[tok * nb * 2 + 2 * b + h] : int16_t{0};
        }
  const Q6KGemm kern{w.data, w.row_bytes(), w.rows, w.cols / 256, n, act8, zs, a, y};
  run_gemm_sliced(kern, w.rows, groups, nb);
}

}  // namespace

void matmul_q4_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= 8) {
    gemm_super<UnpackQ4_K>(w, x, n, y);  // gemm_super_avx2.h
  } else {
    decode_q4_k(w, x, n, y);  // decode_q4k_q5k_avx2.cpp
  }
}
void matmul_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n >= 8) {
    matmul_q6_k_gemm(w, x, n, y);
  } else {
    decode_q6_k(w, x, n, y);
  }
}

}  // namespace larder::kernels::cpu::avx2
