// matmul_affine_avx2.cpp — y[n, rows] = x[n, cols]·Wᵀ for MLX affine weights, AVX2 + FMA (+ BMI2).
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
// bias at one end of the group's range, so |s·u| is up to twice |ŵ| and about 2× the error.
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
// - 2, 3, 5, 6 bits (generic): 8 codes of B bits are B bytes; BMI2 pdep spreads them into 8
//   bytes (4 pdep per block). Codes <= 63 are unsigned operands like 4 bits. (pdep is fast on
//   Intel and Zen 3+; Zen 1/2 microcode it — a known slow path for these rarer widths.)
//
// Tiling and threading are the shared decode/prefill driver's (matmul_driver.h): R×T tiles, each
// weight block loaded once per tile and used for all T tokens (decode n <= 8: each weight byte
// comes from DRAM once), chunks spread over the default pool. Scales/biases are read once per
// (row, group) and converted to f32 (F32/F16/BF16 storage).
#include <immintrin.h>

#include <algorithm>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/matmul_driver.h"
#include "larder/kernels/cpu/common/simd_avx2.h"

namespace larder::kernels::cpu::avx2 {

namespace {

using namespace simd;

inline float load_scale(const uint8_t* base, int64_t i, DType dt) {
  switch (dt) {
    case DType::kBF16: return bf16_to_f32(load_u16(base + 2 * i));
    case DType::kF16: return f16_table()[load_u16(base + 2 * i)];
    default: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
  }
}

// Code unpackers: 32 codes of one block → 32 bytes.
struct Nib4 {
  static constexpr int kBits = 4;
  static constexpr bool kPermuted = true;  // low lane: even elements, high lane: odd elements
  static constexpr bool kSigned = false;
  static __m256i load(const uint8_t* p) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i sh = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(sh, _mm256_set1_epi8(0x0f));
  }
};

struct Byte8 {
  static constexpr int kBits = 8;
  static constexpr bool kPermuted = false;
  static constexpr bool kSigned = true;  // u − 128 as int8
  static __m256i load(const uint8_t* p) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

template <int B>
struct PdepN {
  static constexpr int kBits = B;
  static constexpr bool kPermuted = false;
  static constexpr bool kSigned = false;
  static __m256i load(const uint8_t* p) {
    constexpr uint64_t mask = 0x0101010101010101ull * ((1ull << B) - 1);
    uint64_t c[4];
    LARDER_UNROLL
    for (int k = 0; k < 4; ++k) {
      uint64_t v = 0;
      std::memcpy(&v, p + k * B, B);  // exactly B bytes: never reads past the row (or the mapping)
      c[k] = _pdep_u64(v, mask);
    }
    return _mm256_setr_epi64x(static_cast<long long>(c[0]), static_cast<long long>(c[1]),
                              static_cast<long long>(c[2]), static_cast<long long>(c[3]));
  }
};

template <class C>
struct AffineKernel {
  static constexpr int kRows1 = 4;
  static constexpr int kRowsN = 2;
  static constexpr int kBlockBytes = 4 * C::kBits;

  const uint8_t* w;
  uint64_t row_bytes;
  const uint8_t* scales;
  const uint8_t* biases;
  DType sdt;
  uint64_t srow_bytes;  // bytes of one row of scales
  int64_t rows, ng, bpg;
  QuantizedActs a;
  const float* gqsum;  // [ng][n_pad] Σ x̂ over the group (from bsum)
  float* y;

  template <int R, int T>
  void tile(int64_t r0, int64_t t0) const {
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
    float bacc[R][T];
    LARDER_UNROLL
    for (int r = 0; r < R; ++r)
      LARDER_UNROLL
      for (int t = 0; t < T; ++t) {
        acc[r][t] = _mm256_setzero_ps();
        bacc[r][t] = 0.0f;
      }
    const __m256i ones = _mm256_set1_epi16(1);
    float sc[R * 4];  // s_r·d_x[t] for the current block, [row][token]
    for (int64_t g = 0; g < ng; ++g) {
      float s[R];
      __m128 s4[R];
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) {
        s[r] = load_scale(sr[r], g, sdt);
        s4[r] = _mm_set1_ps(s[r]);
        // 8 bits: the vector part sums s·(u − 128)·x̂, so the bias term takes the 128·s back.
        float bias = load_scale(br[r], g, sdt);
        if constexpr (C::kSigned) bias += 128.0f * s[r];
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) bacc[r][t] += bias * gqsum[g * a.n_pad + t0 + t];
      }
      for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) {
        const __m128 dx = _mm_loadu_ps(a.scales(b) + t0);  // 4 consecutive tokens (padded)
        prefetch_ahead(wr[0], R * row_bytes, b * kBlockBytes * R, kBlockBytes * R);
        __m256i u[R], aw[R];
        LARDER_UNROLL
        for (int r = 0; r < R; ++r) {
          u[r] = C::load(wr[r] + b * kBlockBytes);
          if constexpr (C::kSigned) aw[r] = _mm256_abs_epi8(u[r]);
          _mm_storeu_ps(sc + 4 * r, _mm_mul_ps(s4[r], dx));
        }
        LARDER_UNROLL
        for (int t = 0; t < T; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
          LARDER_UNROLL
          for (int r = 0; r < R; ++r) {
            __m256i p;
            if constexpr (C::kSigned) {
              p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, u[r]));
            } else {
              p = _mm256_maddubs_epi16(u[r], xv);
            }
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc[r][t] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(sc + 4 * r + t), acc[r][t]);
          }
        }
      }
    }
    LARDER_UNROLL
    for (int t = 0; t < T; ++t)
      LARDER_UNROLL
      for (int r = 0; r < R; ++r) y[(t0 + t) * rows + r0 + r] = hsum(acc[r][t]) + bacc[r][t];
  }
};

// In place: each 32-byte block [x0 .. x31] → [x0 x2 .. x30 x1 x3 .. x31] (Nib4's code order).
void permute_even_odd(QuantizedActs& a, int64_t n) {
  const __m256i shuf = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t i = 0; i < n * a.nb; ++i) {
    auto* p = reinterpret_cast<__m256i*>(a.qs + i * 32);
    const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256(p), shuf);
    // quads: [lane0 even, lane0 odd, lane1 even, lane1 odd] → [l0 even, l1 even, l0 odd, l1 odd]
    _mm256_storeu_si256(p, _mm256_permute4x64_epi64(v, 0xD8));
  }
}

template <class C>
void matmul_affine_impl(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const int64_t cols = w.cols, nb = cols / 32, gs = w.group_size, ng = cols / gs;
  void* scratch = thread_scratch(quantized_acts_bytes(n, cols));
  QuantizedActs a = quantized_acts_view(scratch, n, cols);
  quantize_acts_avx2(x, n, cols, /*offset128=*/false, a);
  if constexpr (C::kPermuted) permute_even_odd(a, n);
  auto* gqsum = static_cast<float*>(thread_scratch(static_cast<size_t>(ng * a.n_pad) * sizeof(float), 1));
  const int64_t bpg = gs / 32;
  for (int64_t g = 0; g < ng; ++g) {
    for (int64_t t = 0; t < a.n_pad; ++t) {  // padding tokens: bsum is 0 there
      float q = 0;
      for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) q += a.sums(b)[t];
      gqsum[g * a.n_pad + t] = q;
    }
  }
  const uint64_t srow = static_cast<uint64_t>(ng) * dtype_info(w.scale_dtype).block_bytes;
  const AffineKernel<C> k{w.data, w.row_bytes(), w.scales, w.biases, w.scale_dtype, srow,
                          w.rows,  ng,          bpg,      a,        gqsum,         y};
  run_matmul_tiles(k, w.rows, n, cols + 4 * nb);
}

}  // namespace

void matmul_affine(const WeightView& w, const float* x, int64_t n, float* y) {
  switch (w.bits) {
    case 2: matmul_affine_impl<PdepN<2>>(w, x, n, y); break;
    case 3: matmul_affine_impl<PdepN<3>>(w, x, n, y); break;
    case 4: matmul_affine_impl<Nib4>(w, x, n, y); break;
    case 5: matmul_affine_impl<PdepN<5>>(w, x, n, y); break;
    case 6: matmul_affine_impl<PdepN<6>>(w, x, n, y); break;
    case 8: matmul_affine_impl<Byte8>(w, x, n, y); break;
    default: LARDER_CHECK(false, "[kernels] avx2 matmul_affine: bits %d", w.bits);
  }
}

}  // namespace larder::kernels::cpu::avx2
