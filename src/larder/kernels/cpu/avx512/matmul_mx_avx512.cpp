// matmul_mx_avx512.cpp — GGUF MXFP4 and MLX mxfp4 / nvfp4 on the AVX-512 VNNI tier: row adapters of
// the shared token-lane GEMM (gemm16_avx512.h) over the codes of cpu/common/mx_unpack.h, made
// unsigned for vpdpbusd (u = w + 128). mxfp4 (one power-of-two scale per 32-block) is the GEMM's
// zero-point mode, kZero = 128 — Q8_0's arithmetic with the e8m0 scale in place of the f16 one;
// nvfp4 (an e4m3 scale per 16) its half-block mode with the zero folded into the integer sums
// (kHalfZero = 128, as Q6_K's 32).
//
// Decode (n < kGemm16MinTokens): MLX mxfp4 and nvfp4 on their own 512-bit VNNI kernel
// (mlx_fp4_decode below: ~2× the AVX2 tile kernel's speed, bench/RESULTS.md session 39); GGUF MXFP4
// on the AVX2 tile kernel (matmul_mx_avx2.cpp). Gemv16, the GEMM's arithmetic with rows in the lanes, measured
// 394 µs CPU against the AVX2 kernel's ~1/3 of that at 2048x2048, n = 1, so it serves only
// batch_invariant_decode(), where a token's row must be the same bits in decode and prefill
// (kernels/batch_invariance.h). mxfp8 has no
// AVX-512 kernel: e4m3 values are not int8 under one scale; the tier runs the AVX2 f32 one.
#include <immintrin.h>

#include <algorithm>

#include "larder/core/status.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/mx_unpack.h"
#include "larder/kernels/cpu/common/parallel_split.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx512 {

namespace {

// u = w + 128 (no namespace-scope vector constant: its initializer would run on any CPU).
inline __m256i flip(__m256i v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }

struct Mxfp4GgufRows : PackedRows {
  static constexpr int kZero = 128;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const uint8_t* p = packed(row);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = p + 17 * b;
      scale[b] = e8m0_half_to_f32(blk[0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::gguf_codes(blk + 1)));
    }
  }
  static Mxfp4GgufRows of(const WeightView& v) { return {{v.data, v.row_bytes(), v.cols / 32}}; }
};

// MLX's fp4 layouts: the codes' rows and, beside them, a row of scale bytes per weight row.
struct MlxFp4Rows : PackedRows {
  const uint8_t* sc;
  uint64_t sc_row_bytes;
  const uint8_t* scales(int64_t r) const { return sc + static_cast<uint64_t>(r) * sc_row_bytes; }
  static MlxFp4Rows of(const WeightView& v) {
    return {{v.data, v.row_bytes(), v.cols / 32}, v.scales, v.scale_row_bytes()};
  }
};

struct MlxMxfp4Rows : MlxFp4Rows {
  static constexpr int kZero = 128;
  int64_t groups() const { return nb; }
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float*) const {
    const uint8_t* p = packed(row);
    const uint8_t* s = scales(row);
    for (int64_t b = 0; b < nb; ++b) {
      scale[b] = 0.5f * e8m0_to_f32(s[b]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::mlx_codes(p + 16 * b)));
    }
  }
  static MlxMxfp4Rows of(const WeightView& v) { return {MlxFp4Rows::of(v)}; }
};

struct MlxNvfp4Rows : MlxFp4Rows {
  static constexpr int kZero = -1;
  static constexpr int kHalfZero = 128;  // bias = −128·scale, folded into the integer half sums
  int64_t groups() const { return 2 * nb; }  // 16-element halves
  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const uint8_t* p = packed(row);
    const uint8_t* s = scales(row);
    const float* h = mx::e4m3_half_table();
    for (int64_t b = 0; b < nb; ++b) {
      for (int i = 0; i < 2; ++i) {
        scale[2 * b + i] = h[s[2 * b + i]];
        bias[2 * b + i] = -128.0f * scale[2 * b + i];
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes + b * stride), flip(mx::mlx_codes(p + 16 * b)));
    }
  }
  static MlxNvfp4Rows of(const WeightView& v) { return {MlxFp4Rows::of(v)}; }
};

// MLX mxfp4 / nvfp4 decode (n < kGemm16MinTokens) on 512-bit VNNI. A row's two blocks 2p, 2p+1 are 32 bytes
// v; [v | v >> 4] & 0x0f gives in one shift their low nibbles (even elements) then high nibbles (odd
// elements) as 16-byte chunks [b0 even, b1 even, b0 odd, b1 odd], so no unpack or lane crossing
// per row: the activations are permuted once per call into that order instead (DecodeActs). Per
// 64 elements: broadcast load, shift, and, pshufb to int8 codes, abs + sign mask, one vpdpbusd per
// token of |w| against x negated where w < 0 (each lane the sum of 4 products of one block's half,
// |w| ≤ 12, |x| ≤ 127), and one FMA by the lanes' s·d_x (Mxfp4Scales / Nvfp4Scales). An odd last
// block runs the same in 256 bits.
struct DecodeActs {
  const int8_t* q;   // [n][npair·64 + tail·32] permuted int8 activations
  const float* dx;   // [n][npair·16 + tail·8] d_x per lane of the dot vectors
  int64_t npair, tail, stride_q, stride_d;
};

DecodeActs permute_decode_acts(const QuantizedActs& a, int64_t n, int64_t nb) {
  DecodeActs d;
  d.npair = nb / 2;
  d.tail = nb % 2;
  d.stride_q = d.npair * 64 + d.tail * 32;
  d.stride_d = d.npair * 16 + d.tail * 8;
  const size_t qb = round_up64(static_cast<size_t>(n * d.stride_q));
  auto* buf = static_cast<uint8_t*>(thread_scratch(qb + static_cast<size_t>(n * d.stride_d) * sizeof(float) + 64, 1));
  auto* q = reinterpret_cast<int8_t*>(buf);
  auto* dx = reinterpret_cast<float*>(buf + qb);
  // Within each 16-byte lane: even elements, then odd ones; then the lanes' halves regrouped.
  const __m256i idx = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1,
                                       3, 5, 7, 9, 11, 13, 15);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* src = a.token_blocks(t);
    int8_t* qt = q + t * d.stride_q;
    float* dt = dx + t * d.stride_d;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * b));
      const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, idx), _MM_SHUFFLE(3, 1, 2, 0));
      const float s = a.scales(b)[t];
      if (b / 2 < d.npair) {  // pair p = b/2: [b0 even, b1 even, b0 odd, b1 odd]
        int8_t* o = qt + 64 * (b / 2) + 16 * (b % 2);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(eo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm256_extracti128_si256(eo, 1));
        float* l = dt + 16 * (b / 2) + 4 * (b % 2);
        for (int i = 0; i < 4; ++i) l[i] = l[i + 8] = s;
      } else {  // the odd last block: [even, odd]
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + 64 * d.npair), eo);
        for (int i = 0; i < 8; ++i) dt[16 * d.npair + i] = s;
      }
    }
  }
  d.q = q;
  d.dx = dx;
  return d;
}

// The scales of the dot lanes. mxfp4: one e8m0 per block — a pair's lanes [b0 ×4, b1 ×4, b0 ×4,
// b1 ×4]. nvfp4: an e4m3 per 16 elements, and in the even/odd order a chunk's first two lanes
// (bytes 0–7: elements 0–15) read half 0, the next two half 1 — [b0h0 ×2, b0h1 ×2, b1h0 ×2, b1h1 ×2]
// twice. Both tables hold the scale halved (the codes are doubled e2m1 values).
struct Mxfp4Scales {
  const float* half = mx::mlx_e8m0_half_table();
  __m512 pair(const uint8_t* sc, int64_t p) const {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    const __m128 s01 = _mm_unpacklo_ps(_mm_load_ss(half + sc[2 * p]), _mm_load_ss(half + sc[2 * p + 1]));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s01));
  }
  __m256 tail(const uint8_t* sc, int64_t b) const { return _mm256_set1_ps(half[sc[b]]); }
};
struct Nvfp4Scales {
  const float* half = mx::e4m3_half_table();
  __m512 pair(const uint8_t* sc, int64_t p) const {
    const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3);
    const uint8_t* s = sc + 4 * p;
    const __m128 v = _mm_setr_ps(half[s[0]], half[s[1]], half[s[2]], half[s[3]]);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
  }
  __m256 tail(const uint8_t* sc, int64_t b) const {
    const float h0 = half[sc[2 * b]], h1 = half[sc[2 * b + 1]];
    return _mm256_setr_ps(h0, h0, h1, h1, h0, h0, h1, h1);
  }
};

template <class S, int R, int T>
__attribute__((always_inline)) inline void mlx_fp4_decode_tile(const WeightView& w, const DecodeActs& a, int64_t rows,
                                                               int64_t r0, int64_t t0, float* y) {
  const S scales;
  const __m128i t128 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kFp4Values));
  const __m512i lut = _mm512_broadcast_i32x4(t128);
  const __m512i shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const uint64_t rb = w.row_bytes(), sb = w.scale_row_bytes();
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < a.npair; ++p) {
    __m512i wa[R];
    __mmask64 neg[R];
    __m512 sv[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w.data + static_cast<uint64_t>(r0 + r) * rb + 32 * p;
      const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
      const __m512i c = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi64(v, shift), m4));
      wa[r] = _mm512_abs_epi8(c);
      neg[r] = _mm512_movepi8_mask(c);
      sv[r] = scales.pair(w.scales + static_cast<uint64_t>(r0 + r) * sb, p);
    }
    for (int t = 0; t < T; ++t) {
      const __m512i x = _mm512_loadu_si512(a.q + (t0 + t) * a.stride_q + 64 * p);
      const __m512 dx = _mm512_loadu_ps(a.dx + (t0 + t) * a.stride_d + 16 * p);
      for (int r = 0; r < R; ++r) {
        const __m512i xs = _mm512_mask_sub_epi8(x, neg[r], _mm512_setzero_si512(), x);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa[r], xs);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sv[r], dx), acc[r][t]);
      }
    }
  }
  float tail[R][T] = {};
  if (a.tail) {
    const int64_t b = 2 * a.npair;
    const __m256i shift8 = _mm256_setr_epi64x(0, 0, 4, 4);
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w.data + static_cast<uint64_t>(r0 + r) * rb + 16 * b;
      const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
      const __m256i c = _mm256_shuffle_epi8(_mm512_castsi512_si256(lut),
                                            _mm256_and_si256(_mm256_srlv_epi64(v, shift8), _mm512_castsi512_si256(m4)));
      const __m256i wa8 = _mm256_abs_epi8(c);
      const __mmask32 ng = _mm256_movepi8_mask(c);
      const __m256 s = scales.tail(w.scales + static_cast<uint64_t>(r0 + r) * sb, b);
      for (int t = 0; t < T; ++t) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * a.stride_q + 64 * a.npair));
        const __m256 dx = _mm256_loadu_ps(a.dx + (t0 + t) * a.stride_d + 16 * a.npair);
        const __m256i xs = _mm256_mask_sub_epi8(x, ng, _mm256_setzero_si256(), x);
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa8, xs);
        tail[r][t] = simd::hsum(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s, dx)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[(t0 + t) * rows + r0 + r] = hsum16(acc[r][t]) + tail[r][t];
}

template <class S, int R>
void mlx_fp4_decode_rows(const WeightView& w, const DecodeActs& a, int64_t rows, int64_t r0, int64_t n, float* y) {
  int64_t t = 0;
  for (; t + 2 <= n; t += 2) mlx_fp4_decode_tile<S, R, 2>(w, a, rows, r0, t, y);
  if (t < n) mlx_fp4_decode_tile<S, R, 1>(w, a, rows, r0, t, y);
}

template <class S>
void mlx_fp4_decode(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const QuantizedActs qa = quantize_acts_scratch(x, n, w.cols);
  const DecodeActs a = permute_decode_acts(qa, n, w.cols / 32);
  const int64_t rows = w.rows;
  parallel_split((rows + 3) / 4, 4, 4 * w.cols * n, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r = 4 * g;
      switch (std::min<int64_t>(4, rows - r)) {
        case 4: mlx_fp4_decode_rows<S, 4>(w, a, rows, r, n, y); break;
        case 3: mlx_fp4_decode_rows<S, 3>(w, a, rows, r, n, y); break;
        case 2: mlx_fp4_decode_rows<S, 2>(w, a, rows, r, n, y); break;
        default: mlx_fp4_decode_rows<S, 1>(w, a, rows, r, n, y); break;
      }
    }
  });
}

template <class R>
void run(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, MatmulFn decode) {
  if (n <= 0) return;
  const auto make = [](const WeightView& v) { return R::of(v); };
  if (n >= kGemm16MinTokens) return gemm16(ws, ys, count, x, n, make);
  if (batch_invariant_decode()) return gemv16(ws, ys, count, x, n, make);
  for (int i = 0; i < count; ++i) decode(ws[i], x, n, ys[i]);
}

}  // namespace

void matmul_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<Mxfp4GgufRows>(&w, &y, 1, x, n, avx2::matmul_mxfp4);
}
void matmul_mlx_mxfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<MlxMxfp4Rows>(&w, &y, 1, x, n, mlx_fp4_decode<Mxfp4Scales>);
}
void matmul_mlx_nvfp4(const WeightView& w, const float* x, int64_t n, float* y) {
  run<MlxNvfp4Rows>(&w, &y, 1, x, n, mlx_fp4_decode<Nvfp4Scales>);
}
void matmul_multi_mx(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].dtype) {
    case DType::kMXFP4: return run<Mxfp4GgufRows>(ws, ys, count, x, n, avx2::matmul_mxfp4);
    case DType::kMlxMXFP4: return run<MlxMxfp4Rows>(ws, ys, count, x, n, mlx_fp4_decode<Mxfp4Scales>);
    case DType::kMlxNVFP4: return run<MlxNvfp4Rows>(ws, ys, count, x, n, mlx_fp4_decode<Nvfp4Scales>);
    default: LARDER_CHECK(false, "[kernels] avx512 matmul_multi_mx: %s", dtype_name(ws[0].dtype));
  }
}

}  // namespace larder::kernels::cpu::avx512
