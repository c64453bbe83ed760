// matmul_kquant_avx512.cpp — GGUF Q4_K and Q6_K on the AVX-512 tier (Q4_K_M files mix the two).
//
// Prefill (n >= 8) runs the 16-token-lane VNNI GEMM (gemm16_avx512.h). A Q4_K sub-block of 32 is
// exactly one activation block, and its value is (d·sc_j)·q − (dmin·m_j): an unsigned 4-bit code
// with a per-block scale and bias, i.e. MLX affine with groups of one block. Unpacking a row turns
// every super-block into 8 × 32 code bytes (chunk c's 32 bytes give sub-block 2c from the low
// nibbles and 2c + 1 from the high ones, already in element order) plus 8 scales and biases;
// it runs once per (8-row tile, chunk of token groups), off the inner loop. Decode (n < 8) stays on
// the AVX2 kernel. Q6_K (16-element sub-block scales) runs the GEMM's half-block step, see Q6_KRows.
#include <immintrin.h>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/simd_avx2.h"
#include "larder/kernels/ref/ref_ops.h"

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
  const uint8_t* row_data(int64_t row) const { return w + static_cast<uint64_t>(row) * row_bytes; }
  uint64_t row_stride() const { return row_bytes; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = p + sb * 144;
      const float d = f16[load_u16(blk)], dmin = f16[load_u16(blk + 2)];
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        ref::kquant_scale_min(blk + 4, j, &sc, &m);
        scale[8 * sb + j] = d * static_cast<float>(sc);
        bias[8 * sb + j] = -(dmin * static_cast<float>(m));
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
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nsb;

  int64_t groups() const { return 16 * nsb; }  // 16-element halves
  int64_t blocks_per_group() const { return 1; }
  const uint8_t* row_data(int64_t row) const { return w + static_cast<uint64_t>(row) * row_bytes; }
  uint64_t row_stride() const { return row_bytes; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const float* f16 = f16_table();
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = p + sb * 210;
      const uint8_t* ql = blk;
      const uint8_t* qh = blk + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const float d = f16[load_u16(blk + 208)];
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

constexpr int64_t kGemmMinTokens = 8;

}  // namespace

void matmul_q6_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (n < kGemmMinTokens) {
    avx2::matmul_q6_k(w, x, n, y);
    return;
  }
  const Acts16 a = quantize_acts16(x, n, w.cols, /*half_sums=*/true);
  const Q6_KRows f{w.data, w.row_bytes(), w.cols / 256};
  run_gemm16(f, a, w.rows, y);
}

void matmul_q4_k(const WeightView& w, const float* x, int64_t n, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  if (n < kGemmMinTokens) {
    avx2::matmul_q4_k(w, x, n, y);
    return;
  }
  const Acts16 a = quantize_acts16(x, n, w.cols);
  const Q4_KRows f{w.data, w.row_bytes(), w.cols / 256};
  run_gemm16(f, a, w.rows, y);
}

}  // namespace larder::kernels::cpu::avx512
