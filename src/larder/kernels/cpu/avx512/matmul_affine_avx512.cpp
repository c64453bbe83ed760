// matmul_affine_avx512.cpp — MLX affine weights (2, 3, 4, 5, 6, 8 bits; groups 32/64/128;
// bf16/f16/f32 scales and biases) on the AVX-512 tier.
//
// Prefill (n >= 9, kGemm16MinTokens) runs the 16-token-lane VNNI GEMM (gemm16_avx512.h): MLX
// codes are already unsigned, so they are vpdpbusd's u8 operand as they are, and each group's
// scale and bias are applied once per group: Σ_g [s_g·Σ_{b∈g} d_x,b·S_b + c_g·Σ_{b∈g} bs_b].
// Decode (n <= 8) of 4- and 8-bit weights in groups of a multiple of 64 runs AffineDecode; the
// other widths and group sizes run the AVX2 kernel up to 7 tokens and the GEMM from 8
// (kAvx2DecodeMaxTokens).
//
// Unpacking. A row is a little-endian bit stream (element i at bits [i·B, i·B + B)), so 8
// consecutive codes are B whole bytes, and BMI2's pdep with a mask of the low B bits of every
// byte deposits them into 8 bytes in natural order — one instruction for every width. 4 and 8
// bits (the common widths) unpack with vectors instead: the scalar pdep loop was ~5 % of the MLX
// q4 GEMM (kernel_bench 3072x2048 and 8192x2048, n = 512, 1 thread, hot, Zen 5: 11.1 → 10.5 ms
// and 29.0 → 27.5 ms with the unpacking skipped), though it runs only once per (16-row chunk,
// 32 token groups). Only the bytes that hold the codes are read: the last row may end at the end
// of the mapping.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// Scale/bias storage, resolved at compile time (no per-group branch).
enum class Sd { kBF16, kF16, kF32 };

template <int B>
struct AffineRows {
  static constexpr int kZero = 0;
  static constexpr bool kGroups = true;  // groups of several blocks (Gemm16::tile)
  static constexpr uint64_t kDeposit = (0x0101010101010101ull * ((1u << B) - 1u)) & ~uint64_t{0};

  const uint8_t* w;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  DType scale_dtype;
  int64_t ng, bpg;

  int64_t groups() const { return ng; }
  int64_t blocks_per_group() const { return bpg; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    unpack_scales(row, scale, bias);
    const int64_t nb = ng * bpg;
    if constexpr (B == 4) {
      // 64 codes (two blocks) per 32-byte load: low and high nibbles interleaved back into
      // element order. unpack{lo,hi}_epi8 work within 128-bit lanes, so lane 0 of lo/hi holds
      // elements 0–15 / 16–31 and lane 1 elements 32–47 / 48–63; the two permutes regroup them
      // into the blocks. Every block count here is even (groups of a multiple of 64, or of 32 with
      // K a multiple of 64), and an odd tail takes the 16-byte path.
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      int64_t b = 0;
      for (; b + 2 <= nb; b += 2) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * b));
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i e0 = _mm256_unpacklo_epi8(lo, hi), e1 = _mm256_unpackhi_epi8(lo, hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b * stride), _mm256_permute2x128_si256(e0, e1, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + (b + 1) * stride),
                            _mm256_permute2x128_si256(e0, e1, 0x31));
      }
      for (; b < nb; ++b) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * b));
        const __m128i lo = _mm_and_si128(v, _mm256_castsi256_si128(m4));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(m4));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b * stride),
                            _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));
      }
      return;
    } else if constexpr (B == 8) {
      for (int64_t b = 0; b < nb; ++b)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b * stride),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * b)));
      return;
    }
    const int64_t n8 = nb * 4;  // 8-code chunks in the row
    // 8-byte loads while they stay inside the row, then exact B-byte copies for the last chunks.
    const int64_t n8_wide = B == 8 ? n8 : std::max<int64_t>(0, n8 - (8 + B - 1) / B);
    int64_t j = 0;
    for (; j < n8_wide; ++j) {
      uint64_t v;
      std::memcpy(&v, p + j * B, 8);
      const uint64_t c = B == 8 ? v : _pdep_u64(v, kDeposit);
      std::memcpy(codes + (j / 4) * stride + 8 * (j % 4), &c, 8);
    }
    for (; j < n8; ++j) {
      uint64_t v = 0;
      std::memcpy(&v, p + j * B, B);
      const uint64_t c = _pdep_u64(v, kDeposit);
      std::memcpy(codes + (j / 4) * stride + 8 * (j % 4), &c, 8);
    }
  }

  // The row's group scales and biases as f32, 16 groups per conversion.
  void unpack_scales(int64_t row, float* scale, float* bias) const {
    const uint64_t esz = scale_dtype == DType::kF32 ? 4 : 2;
    const uint8_t* sr = scales + static_cast<uint64_t>(row) * ng * esz;
    const uint8_t* br = biases + static_cast<uint64_t>(row) * ng * esz;
    for (int64_t g = 0; g < ng; g += 16) {
      const __mmask16 m = ng - g >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (ng - g)) - 1);
      _mm512_mask_storeu_ps(scale + g, m, to_f32x16(sr, g, m));
      _mm512_mask_storeu_ps(bias + g, m, to_f32x16(br, g, m));
    }
  }

  __m512 to_f32x16(const uint8_t* base, int64_t g, __mmask16 m) const {
    switch (scale_dtype) {
      case DType::kBF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, base + 2 * g)), 16));
      case DType::kF16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, base + 2 * g));
      default: return _mm512_maskz_loadu_ps(m, base + 4 * g);
    }
  }
};


// ---------------------------------------------------------------------------------------------
// Decode (n <= 8) of 4- and 8-bit weights, groups a multiple of 64.
//
// 4 bits: a row's 64 codes of a chunk are 32 bytes (element 2j in the low nibble of byte j, 2j+1 in
// the high one). A step takes two chunks, one 64-byte load: e = v & 0x0F holds the even elements
// of both chunks and o = (v >> 4) & 0x0F the odd ones, and the activations are laid out once per
// matmul in the same order (xe, xo: [chunk c | chunk c+1] of evens, of odds). Two chained
// vpdpbusd then sum 8 products per int32 lane, lane l belonging to one 32-block (lanes 0–3 block
// A of chunk c, 4–7 its block B, 8–15 likewise chunk c+1), so the float work (cvt, the d_x lane
// pattern, the group scale) is done once per 128 weights and token: per 128 weights and row 2
// vpdpbusd + cvt + mul + FMA and 3 unpack ops. The previous kernel (one chunk per zmm:
// vbroadcasti64x4 + vpsrlvq to put the odd nibbles in the upper half, one vpdpbusd) did the float
// work per 64 weights and ran compute-bound on Zen 4 (AVX-512 as two 256-bit halves: vpdpbusd,
// FMA and mul share one zmm per cycle there): kernel_bench --hot, 1 thread, 512x2048 and
// 8192x2048 n = 1, 21–22 GB/s per core against a per-core DRAM share of ~31 GB/s.
// 8 bits: the 64 code bytes of a chunk are one load; per token one vpdpbusd (u8 codes × s8
// activations → 16 int32 lanes, [A×8 B×8]), cvt, the lane-wise d_x times the group scale with one
// multiply and one FMA. Scales and biases are converted 16 groups at a time per row; the bias term
// b·Σx̂ is one FMA per 16 groups and token against the group sums.
// Group size 32 (two scales inside a chunk) stays on the AVX2 kernel, as do 4-bit groups of an odd
// number of chunks above one (192, ...: a pair would straddle two groups; MLX writes 32, 64, 128).
template <int B, Sd S>
struct AffineDecode {
  // Measured (kernel_bench decode, Zen 5, 1 thread): 4 bits stream best with 8 rows per tile at
  // n = 1 (101–103 % of the read probe, 4 rows: 85 %), 8 bits with 4 (94 %; 8 rows: 72–77 %).
  static constexpr int kRows1 = B == 4 ? 8 : 4;
  // Zen 4 (matmul_driver.h rows1): 1B MLX q4 g64 decode 37.1 → 43.8 tok/s with 2 rows.
  static constexpr int kRows1Zen = B == 4 ? 2 : kRows1;
  static constexpr int kRowsN = B == 4 ? 4 : 2;  // × up to 4 tokens: <= 16 accumulators
  static constexpr int kChunkBytes = 8 * B;

  const uint8_t* w;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  uint64_t srow_bytes;
  int64_t rows, ng, nc, cpg;  // groups, 64-chunks per row, chunks per group
  // Activations in the kernel's order (prepare_decode). 4 bits: [n][np][128] int8, xe | xo per
  // chunk pair (np = ceil(nc / 2); an odd row's last pair is padded with zeros), and dxp
  // [n][np][16] per-lane d_x. 8 bits: [n][nc][64] (the quantizer's own blocks) and [n][nc][16].
  const uint8_t* acts;
  const float* dxp;
  const float* gq;  // [n][ng16] Σ x̂ per group, zero-padded to ng16 = round_up(ng, 16)
  int64_t ng16;
  float* y;

  static __m512 load16(const uint8_t* base, int64_t g0, int64_t count) {
    const __mmask16 m = count >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << count) - 1);
    if constexpr (S == Sd::kF32) {
      return _mm512_maskz_loadu_ps(m, base + 4 * g0);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(m, base + 2 * g0);
      if constexpr (S == Sd::kBF16) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      } else {
        return _mm512_cvtph_ps(h);
      }
    }
  }

  template <int R, int T, int kPf>
  void tile_rows(int64_t r0, int64_t t0) const {
    const uint8_t* wr[R];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r) wr[r] = w + static_cast<uint64_t>(r0 + r) * row_bytes;
    __m512 acc[R][T];
    zero_acc(acc);
    alignas(64) float sv[R][16];
    // The scales and biases of the tile two ahead (the codes are prefetched per chunk below):
    // separate tensors, so the hardware sees them as short streams that restart every tile.
    {
      const uint64_t ahead = static_cast<uint64_t>(r0 + 2 * R) * srow_bytes, len = R * srow_bytes;
      for (uint64_t off = 0; off < len; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(scales + ahead + off), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(biases + ahead + off), _MM_HINT_T0);
      }
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const int64_t np = (nc + 1) / 2;
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
      const int64_t gc = std::min<int64_t>(16, ng - g0);
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        const uint64_t ro = static_cast<uint64_t>(r0 + r) * srow_bytes;
        _mm512_store_ps(sv[r], load16(scales + ro, g0, gc));
        const __m512 b16 = load16(biases + ro, g0, gc);
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(b16, _mm512_loadu_ps(gq + (t0 + t) * ng16 + g0), acc[r][t]);
      }
      if constexpr (B == 4) {
        // Chunk pairs of this batch of groups (cpg is 1 or even, so a pair never straddles two
        // batches; only a row's last pair can be half past its end).
        const int64_t c_end = std::min(nc, (g0 + gc) * cpg);
        for (int64_t c = g0 * cpg; c < c_end; c += 2) {
          const bool half = c + 1 == nc;
          prefetch_rows<kPf>(wr[0], R, row_bytes, c * kChunkBytes, half ? kChunkBytes : 2 * kChunkBytes);
          const int64_t gi = c / cpg - g0;
          __m512i e[R], o[R];
          __m512 sp[R];
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            // The last row may end at the end of the mapping: a half pair reads only its 32 bytes.
            const __m512i v = half ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + 32 * c)))
                                   : _mm512_loadu_si512(wr[r] + 32 * c);
            e[r] = _mm512_and_si512(v, m4);
            o[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            // Groups of one chunk: the pair's two scales, one per 256-bit half (gi is even; past a
            // row's end sv holds zero, which meets zero activations).
            sp[r] = cpg == 1 ? _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(sv[r][gi]), _mm512_set1_ps(sv[r][gi + 1]))
                             : _mm512_set1_ps(sv[r][gi]);
          }
          LARDER_UNROLL
          for (int t = 0; t < T; ++t) {
            const uint8_t* xa = acts + ((t0 + t) * np + c / 2) * 128;
            const __m512i xe = _mm512_load_si512(xa), xo = _mm512_load_si512(xa + 64);
            const __m512 dx = _mm512_load_ps(dxp + ((t0 + t) * np + c / 2) * 16);
            LARDER_UNROLL
            for (int r = 0; r < R; ++r) {
              const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), e[r], xe), o[r], xo);
              acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), dx), sp[r], acc[r][t]);
            }
          }
        }
      } else {
        for (int64_t gi = 0; gi < gc; ++gi) {
          for (int64_t c = (g0 + gi) * cpg; c < (g0 + gi + 1) * cpg; ++c) {
            prefetch_rows<kPf>(wr[0], R, row_bytes, c * kChunkBytes, kChunkBytes);
            __m512i u[R];
            LARDER_UNROLL
            for (int r = 0; r < R; ++r) u[r] = _mm512_loadu_si512(wr[r] + 64 * c);
            LARDER_UNROLL
            for (int t = 0; t < T; ++t) {
              const __m512i xa = _mm512_load_si512(acts + ((t0 + t) * nc + c) * 64);
              const __m512 dx = _mm512_load_ps(dxp + ((t0 + t) * nc + c) * 16);
              LARDER_UNROLL
              for (int r = 0; r < R; ++r) {
                const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[r], xa));
                acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(f, dx), _mm512_set1_ps(sv[r][gi]), acc[r][t]);
              }
            }
          }
        }
      }
    }
    store_acc(acc, y, rows, r0, t0);
  }
};

template <int B>
bool decode_fits(const WeightView& w) {
  // 4 bits: a chunk pair must not straddle two groups, so one chunk per group or an even count.
  if constexpr (B == 4) return w.group_size == 64 || w.group_size % 128 == 0;
  return B == 8 && w.group_size % 64 == 0;
}

// Quantizes x and lays out the decode activations for weights shaped like w (bits, group size,
// scale dtype); the returned kernel is w's, and matmul_multi_affine reuses its activations for
// every weight of the group.
template <int B, Sd S>
AffineDecode<B, S> prepare_decode(const WeightView& w, const float* x, int64_t n, float* y) {
  const int64_t cols = w.cols, nc = cols / 64, np = (nc + 1) / 2, ng = cols / w.group_size;
  const int64_t ng16 = (ng + 15) / 16 * 16;
  QuantizedActs a = quantize_acts_scratch(x, n, cols);
  // acts + dxp (16 f32 per chunk, 8 bits, or per chunk pair, 4 bits) + gq [n][ng16] f32, one
  // scratch slot; 4 bits: acts [n][np][128], a padded odd pair included.
  const size_t acts_bytes = static_cast<size_t>(n * np) * 128, dxp_bytes = static_cast<size_t>(n * nc) * 64;
  auto* buf = static_cast<uint8_t*>(thread_scratch(acts_bytes + dxp_bytes + static_cast<size_t>(n * ng16) * 4 + 64, 1));
  auto* acts = B == 4 ? buf : reinterpret_cast<uint8_t*>(a.qs);
  auto* dxp = reinterpret_cast<float*>(buf + acts_bytes);
  auto* gq = reinterpret_cast<float*>(buf + acts_bytes + dxp_bytes);
  const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                              0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < (B == 4 ? 2 * np : nc); ++c) {
      const bool pad = c >= nc;
      const float da = pad ? 0.0f : a.scales(2 * c)[t], db = pad ? 0.0f : a.scales(2 * c + 1)[t];
      if constexpr (B == 4) {
        // Chunk c is half h of pair c / 2: its evens [A | B] at xe + 32h, its odds at xo + 32h, and
        // d_x for its lanes 8h .. 8h + 7 ([A×4 B×4]).
        uint8_t* dst = acts + (t * np + c / 2) * 128 + 32 * (c % 2);
        float* d = dxp + (t * np + c / 2) * 16 + 8 * (c % 2);
        for (int l = 0; l < 8; ++l) d[l] = l < 4 ? da : db;
        if (pad) {
          std::memset(dst, 0, 32);
          std::memset(dst + 64, 0, 32);
          continue;
        }
        // [evens of A | evens of B] and [odds of A | odds of B] (A, B: the chunk's two 32-blocks).
        const int8_t* src = a.token_blocks(t) + 64 * c;
        const __m256i qa = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), evens_odds), 0xD8);
        const __m256i qb = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32)), evens_odds), 0xD8);
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute2x128_si256(qa, qb, 0x20));
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 64), _mm256_permute2x128_si256(qa, qb, 0x31));
      } else {
        float* d = dxp + (t * nc + c) * 16;
        for (int l = 0; l < 16; ++l) d[l] = l < 8 ? da : db;
      }
    }
    const int64_t bpg = w.group_size / 32;
    for (int64_t g = 0; g < ng16; ++g) {
      float q = 0;
      if (g < ng)
        for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) q += a.sums(b)[t];
      gq[t * ng16 + g] = q;
    }
  }
  const uint64_t esz = S == Sd::kF32 ? 4 : 2;
  return AffineDecode<B, S>{w.data, w.row_bytes(), w.scales, w.biases, static_cast<uint64_t>(ng) * esz, w.rows,
                            ng,     nc,            w.group_size / 64, acts, dxp, gq, ng16, y};
}

template <int B, Sd S>
void run_decode(const WeightView& w, const float* x, int64_t n, float* y) {
  const AffineDecode<B, S> k = prepare_decode<B, S>(w, x, n, y);
  run_matmul_tiles(k, w.rows, n, w.cols + 4 * (w.cols / 32));
}

// Fused decode: one quantization and one pool job for q/k/v or gate/up (kernels::matmul_multi
// groups weights of equal bits, group size and scale dtype).
template <int B, Sd S>
void run_decode_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  run_multi_decode(prepare_decode<B, S>(ws[0], x, n, ys[0]), ws, ys, count, n, ws[0].cols + 4 * (ws[0].cols / 32));
}

template <int B>
void decode_affine_multi(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].scale_dtype) {
    case DType::kBF16: run_decode_multi<B, Sd::kBF16>(ws, ys, count, x, n); break;
    case DType::kF16: run_decode_multi<B, Sd::kF16>(ws, ys, count, x, n); break;
    default: run_decode_multi<B, Sd::kF32>(ws, ys, count, x, n); break;
  }
}

template <int B>
void decode_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  switch (w.scale_dtype) {
    case DType::kBF16: run_decode<B, Sd::kBF16>(w, x, n, y); break;
    case DType::kF16: run_decode<B, Sd::kF16>(w, x, n, y); break;
    default: run_decode<B, Sd::kF32>(w, x, n, y); break;
  }
}

template <int B>
void gemm_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemm16(ws, ys, count, x, n, [](const WeightView& w) {
    return AffineRows<B>{w.data, w.row_bytes(), w.scales, w.biases, w.scale_dtype, w.cols / w.group_size,
                         w.group_size / 32};
  });
}

template <int B>
void gemv_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemv16(ws, ys, count, x, n, [](const WeightView& w) {
    return AffineRows<B>{w.data, w.row_bytes(), w.scales, w.biases, w.scale_dtype, w.cols / w.group_size,
                         w.group_size / 32};
  });
}

// Decode in the GEMM's arithmetic (batch_invariant_decode()), any width.
void gemv_affine_bits(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].bits) {
    case 2: gemv_affine<2>(ws, ys, count, x, n); break;
    case 3: gemv_affine<3>(ws, ys, count, x, n); break;
    case 4: gemv_affine<4>(ws, ys, count, x, n); break;
    case 5: gemv_affine<5>(ws, ys, count, x, n); break;
    case 6: gemv_affine<6>(ws, ys, count, x, n); break;
    case 8: gemv_affine<8>(ws, ys, count, x, n); break;
    default: LARDER_CHECK(false, "[kernels] avx512 matmul_affine: bits %d", ws[0].bits);
  }
}

// The GEMM for weights of one width (prefill; matmul_multi_affine's weights share it).
void gemm_affine_bits(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].bits) {
    case 2: gemm_affine<2>(ws, ys, count, x, n); break;
    case 3: gemm_affine<3>(ws, ys, count, x, n); break;
    case 4: gemm_affine<4>(ws, ys, count, x, n); break;
    case 5: gemm_affine<5>(ws, ys, count, x, n); break;
    case 6: gemm_affine<6>(ws, ys, count, x, n); break;
    case 8: gemm_affine<8>(ws, ys, count, x, n); break;
    default: LARDER_CHECK(false, "[kernels] avx512 matmul_affine: bits %d", ws[0].bits);
  }
}

// The AVX2 decode kernel (the other widths and group sizes) up to 7 tokens only: at 8 the GEMM
// was faster (kernel_bench 8192x2048, n = 8, 2 threads, Zen 4: 2-bit g64 2004 µs GEMM / 4011
// AVX2, 3-bit 2672 / 2812), unlike the AVX-512 4- and 8-bit decode kernels (q4 g128 2693 / 1873,
// q8 g64 2680 / 1362).
constexpr int64_t kAvx2DecodeMaxTokens = 7;

}  // namespace

void matmul_multi_affine(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  // The caller groups equal bits, group size and scale dtype, so ws[0] speaks for all.
  if (gemv_invariant(n)) return gemv_affine_bits(ws, ys, count, x, n);
  const bool fused = n > 0 && n < kGemm16MinTokens &&
                     ((ws[0].bits == 4 && decode_fits<4>(ws[0])) || (ws[0].bits == 8 && decode_fits<8>(ws[0])));
  if (!fused) {
    // Decode of the other widths and group sizes runs the AVX2 kernel (as matmul_affine does), fused there.
    if (n > 0 && n <= kAvx2DecodeMaxTokens) return avx2::matmul_multi_affine(ws, ys, count, x, n);
    if (n <= 0) return;
    return gemm_affine_bits(ws, ys, count, x, n);
  }
  if (ws[0].bits == 4) decode_affine_multi<4>(ws, ys, count, x, n);
  else decode_affine_multi<8>(ws, ys, count, x, n);
}

void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (gemv_invariant(n)) return gemv_affine_bits(&w, &y, 1, x, n);
  if (n < kGemm16MinTokens) {
    if (w.bits == 4 && decode_fits<4>(w)) return decode_affine<4>(w, x, n, y);
    if (w.bits == 8 && decode_fits<8>(w)) return decode_affine<8>(w, x, n, y);
    if (n <= kAvx2DecodeMaxTokens) {
      avx2::matmul_affine(w, x, n, y);
      return;
    }
  }
  gemm_affine_bits(&w, &y, 1, x, n);
}

}  // namespace larder::kernels::cpu::avx512
