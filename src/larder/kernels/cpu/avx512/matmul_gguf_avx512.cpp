// matmul_gguf_avx512.cpp — GGUF Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS on the AVX-512
// tier, over the unpackers of cpu/common/gguf_unpack.h (value = s·w + c per 16-element half).
//
// Prefill (n >= kGemm16MinTokens): the shared VNNI token-lane GEMM (gemm16_avx512.h): codes
// u = w ^ 0x80 = w + 128 (unsigned operand of vpdpbusd), scale s and bias c − 128·s per block
// (group mode) or per half (half-block mode, Q2_K and Q3_K); see GgufRows.
//
// Decode (fewer tokens) runs the AVX2 kernels (matmul_gguf_avx2.cpp), except Q5_K, Q3_K and Q2_K
// (integer super-block kernels of their own, decode_q4k_q5k_avx512.cpp and
// decode_q2k_q3k_q6k_avx512.cpp), IQ4_NL and IQ4_XS (their own codebook kernels,
// decode_iq4_avx512.cpp). A zmm decode kernel over
// the same unpackers (two 32-blocks per vpdpbusd, per-lane scale/bias arrays) measured slower on
// Zen 4 at 8192x2048, n = 1, 1 thread CPU time: Q4_1 2966 vs 962 µs, Q5_K 2071 vs 1611, Q3_K
// 2831 vs 1648 (bench/RESULTS.md) — the unpack-to-stack and per-lane arrays cost more than the
// wider dot saves — so it was removed rather than kept as a slower path.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "larder/core/dtype.h"
#include "larder/core/status.h"
#include "larder/kernels/cpu/avx512/gemm16_avx512.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/cpu/common/gguf_unpack.h"

namespace larder::kernels::cpu::avx512 {

namespace {

using namespace simd;

// GEMM adapter: one row unpacked to codes [nb][32] (at stride) with a scale and bias per scale
// unit. Formats whose two halves of a 32-block share s and c (all but Q2_K and Q3_K,
// kScaleElems == 32) run the GEMM's group mode with one block per group (kZero == 0: one int32
// sum per row and block, then s and c − 128·s against the block sum: 4 f32 ops per row and block);
// Q2_K and Q3_K its half-block mode (kZero < 0: two int32 sums, a scale and bias per half,
// 7 f32 ops). The half-block mode for every format ran Q4_1 at 227 GOP/s against Q4_0's 310
// (1 thread, 2048×2048, n = 128).
template <class U>
struct GgufRows {
  static constexpr bool kPerBlock = U::kScaleElems == 32;
  static constexpr int kZero = kPerBlock ? 0 : -1;
  static constexpr int kPerUnit = U::kElems / U::kScaleElems;  // scale units per unpacker unit
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t units;

  int64_t groups() const { return units * kPerUnit; }
  int64_t blocks_per_group() const { return 1; }

  void unpack(int64_t row, uint8_t* codes, int64_t stride, float* scale, float* bias) const {
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    alignas(32) int8_t wb[U::kElems];
    float s[U::kElems / 16], c[U::kElems / 16];
    for (int64_t u = 0; u < units; ++u) {
      U::unpack(p + u * U::kBytes, wb, s, c);
      for (int j = 0; j < U::kElems / 32; ++j) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (u * (U::kElems / 32) + j) * stride),
                           _mm256_xor_si256(v, flip));
      }
      constexpr int kStep = U::kScaleElems / 16;  // s and c entries per scale unit
      for (int i = 0; i < kPerUnit; ++i) {
        scale[u * kPerUnit + i] = s[kStep * i];
        bias[u * kPerUnit + i] = c[kStep * i] - 128.0f * s[kStep * i];
      }
    }
  }
};

// GEMM adapter for the super-block formats with integer sub-block scales (Q4_K, Q5_K, IQ4_XS): the
// GEMM's super-block path (gemm16_avx512.h kSuperBlocks), codes u = w + U::kSuperCodeOffset.
template <class U>
struct GgufSuperRows {
  static constexpr int kZero = 0;
  static constexpr bool kSuperBlocks = true;
  const uint8_t* w;
  uint64_t row_bytes;
  int64_t nsb;

  int64_t groups() const { return nsb; }
  int64_t blocks_per_group() const { return 8; }

  void unpack_super(int64_t row, uint8_t* codes, int64_t stride, int16_t* sc, int16_t* mn, float* d,
                    float* dmin) const {
    const uint8_t* p = w + static_cast<uint64_t>(row) * row_bytes;
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(U::kSuperCodeOffset));
    alignas(32) int8_t wb[256];
    for (int64_t sb = 0; sb < nsb; ++sb) {
      U::unpack_super(p + sb * U::kBytes, wb, sc + 8 * sb, mn + 8 * sb, d[sb], dmin[sb]);
      for (int j = 0; j < 8; ++j) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 32 * j));
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes + (8 * sb + j) * stride), _mm256_add_epi8(v, offset));
      }
    }
  }
};

template <class U>
void gemm_gguf_super(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemm16(ws, ys, count, x, n, [](const WeightView& w) { return GgufSuperRows<U>{w.data, w.row_bytes(), w.cols / 256}; });
}

template <class U>
void gemm_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if constexpr (requires { U::kSuperCodeOffset; }) {
    if (gemm_super_blocks(ws[0].dtype, n)) return gemm_gguf_super<U>(ws, ys, count, x, n);
  }
  gemm16(ws, ys, count, x, n, [](const WeightView& w) { return GgufRows<U>{w.data, w.row_bytes(), w.cols / U::kElems}; });
}

// Decode in the GEMM's arithmetic (batch_invariant_decode()): the adapter gemm_gguf would take.
template <class U>
void gemv_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if constexpr (std::is_same_v<U, UnpackQ4_1>) return gemv_q4_1(ws, ys, count, x, n);  // matmul_avx512.cpp
  if constexpr (requires { U::kSuperCodeOffset; }) {
    if (gemm_super_blocks(ws[0].dtype, kGemm16MinTokens))
      return gemv16(ws, ys, count, x, n, [](const WeightView& w) { return GgufSuperRows<U>{w.data, w.row_bytes(), w.cols / 256}; });
  }
  gemv16(ws, ys, count, x, n, [](const WeightView& w) { return GgufRows<U>{w.data, w.row_bytes(), w.cols / U::kElems}; });
}

template <class U>
void matmul_gguf(const WeightView& w, const float* x, int64_t n, float* y, MatmulFn decode) {
  if (n <= 0 || w.rows <= 0) return;
  // Q5_K's and IQ4_XS's decode kernels follow the GEMM's super-block arithmetic; only where AMX
  // moves the GEMM off it does the flag need the GEMM's own decode.
  const bool invariant_decode = std::is_same_v<U, UnpackQ5_K> || std::is_same_v<U, UnpackIQ4_XS>;
  if (invariant_decode ? gemv_invariant_amx(n) : gemv_invariant(n)) return gemv_gguf<U>(&w, &y, 1, x, n);
  if (n < kGemm16MinTokens) {
    decode(w, x, n, y);
    return;
  }
  gemm_gguf<U>(&w, &y, 1, x, n);
}

}  // namespace

void matmul_q4_1(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ4_1>(w, x, n, y, decode_q4_1);  // matmul_avx512.cpp
}
void matmul_q5_0(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ5_0>(w, x, n, y, decode_q5_0);  // matmul_avx512.cpp
}
void matmul_q5_1(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ5_1>(w, x, n, y, decode_q5_1);  // matmul_avx512.cpp
}
void matmul_iq4_nl(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackIQ4_NL>(w, x, n, y, decode_iq4_nl);  // decode_iq4_avx512.cpp
}
void matmul_q2_k(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ2_K>(w, x, n, y, decode_q2_k);  // decode_q2k_q3k_q6k_avx512.cpp
}
void matmul_multi_q2_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_gguf<UnpackQ2_K>(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_gguf<UnpackQ2_K>(ws, ys, count, x, n);
  decode_multi_q2_k(ws, ys, count, x, n);
}
void matmul_q3_k(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ3_K>(w, x, n, y, decode_q3_k);  // decode_q2k_q3k_q6k_avx512.cpp
}
void matmul_multi_q3_k(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  if (n >= kGemm16MinTokens) return gemm_gguf<UnpackQ3_K>(ws, ys, count, x, n);
  if (gemv_invariant(n)) return gemv_gguf<UnpackQ3_K>(ws, ys, count, x, n);
  decode_multi_q3_k(ws, ys, count, x, n);
}
void matmul_q5_k(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackQ5_K>(w, x, n, y, decode_q5_k);  // decode_q4k_q5k_avx512.cpp
}
void matmul_iq4_xs(const WeightView& w, const float* x, int64_t n, float* y) {
  matmul_gguf<UnpackIQ4_XS>(w, x, n, y, decode_iq4_xs);  // decode_iq4_avx512.cpp
}

void gemm_multi_super(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].dtype) {
    case DType::kQ4_K: return gemm_gguf_super<UnpackQ4_K>(ws, ys, count, x, n);
    case DType::kQ5_K: return gemm_gguf_super<UnpackQ5_K>(ws, ys, count, x, n);
    case DType::kIQ4_XS: return gemm_gguf_super<UnpackIQ4_XS>(ws, ys, count, x, n);
    default: LARDER_CHECK(false, "[kernels] avx512 gemm_multi_super: %s", dtype_name(ws[0].dtype));
  }
}

void gemv_q4_1_rows(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  gemv16(ws, ys, count, x, n, [](const WeightView& w) { return GgufRows<UnpackQ4_1>{w.data, w.row_bytes(), w.cols / 32}; });
}

void gemv_multi_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].dtype) {
    case DType::kQ4_1: return gemv_gguf<UnpackQ4_1>(ws, ys, count, x, n);
    case DType::kQ5_0: return gemv_gguf<UnpackQ5_0>(ws, ys, count, x, n);
    case DType::kQ5_1: return gemv_gguf<UnpackQ5_1>(ws, ys, count, x, n);
    case DType::kQ2_K: return gemv_gguf<UnpackQ2_K>(ws, ys, count, x, n);
    case DType::kQ3_K: return gemv_gguf<UnpackQ3_K>(ws, ys, count, x, n);
    case DType::kQ4_K:  // its super-block path only (matmul_kquant_avx512.cpp decides)
      return gemv16(ws, ys, count, x, n,
                    [](const WeightView& w) { return GgufSuperRows<UnpackQ4_K>{w.data, w.row_bytes(), w.cols / 256}; });
    case DType::kQ5_K: return gemv_gguf<UnpackQ5_K>(ws, ys, count, x, n);
    case DType::kIQ4_XS: return gemv_gguf<UnpackIQ4_XS>(ws, ys, count, x, n);
    case DType::kIQ4_NL: return gemv_gguf<UnpackIQ4_NL>(ws, ys, count, x, n);
    default: LARDER_CHECK(false, "[kernels] avx512 gemv_multi_gguf: %s", dtype_name(ws[0].dtype));
  }
}

void gemm_multi_gguf(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n) {
  switch (ws[0].dtype) {
    case DType::kQ4_1: return gemm_gguf<UnpackQ4_1>(ws, ys, count, x, n);
    case DType::kQ5_0: return gemm_gguf<UnpackQ5_0>(ws, ys, count, x, n);
    case DType::kQ5_1: return gemm_gguf<UnpackQ5_1>(ws, ys, count, x, n);
    case DType::kQ5_K: return gemm_gguf<UnpackQ5_K>(ws, ys, count, x, n);
    case DType::kIQ4_XS: return gemm_gguf<UnpackIQ4_XS>(ws, ys, count, x, n);
    case DType::kIQ4_NL: return gemm_gguf<UnpackIQ4_NL>(ws, ys, count, x, n);
    default: LARDER_CHECK(false, "[kernels] avx512 gemm_multi_gguf: %s", dtype_name(ws[0].dtype));
  }
}

}  // namespace larder::kernels::cpu::avx512
