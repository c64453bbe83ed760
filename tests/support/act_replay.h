// act_replay.h — the int8 activations a fast integer matmul computed with, replayed by the
// scalar quantizers of act_quant.h, per element: x̂[t][c] = d[t][c]·q[t][c]. The kernel tests'
// tight checks compute Σ w·x̂ exactly in double from these, so they must replay the quantizer the
// kernel really used: the 32-element blocks (quantize_acts_ref) or, for the decode kernels that
// accumulate whole super-blocks in integers, the 256-element super-blocks (quantize_acts_k_ref).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/kernels/cpu/common/act_quant.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"

namespace larder::test {

struct ActReplay {
  int64_t cols = 0;
  std::vector<double> q, d;  // [n][cols]: the int8 value and its block's scale
  double qv(int64_t t, int64_t c) const { return q[static_cast<size_t>(t * cols + c)]; }
  double dv(int64_t t, int64_t c) const { return d[static_cast<size_t>(t * cols + c)]; }
};

// Whether the fast kernel of (tier "avx2"/"avx512", format) quantizes n tokens of activations per
// 256-element super-block (QuantizedActsK: the integer super-block decode kernels) rather than per
// 32-element block. One line per format as the kernels move over.
inline bool super_block_acts(const char* tier, DType dt, int64_t n) {
  const bool avx512 = std::strcmp(tier, "avx512") == 0;
  // From here on the prefill GEMMs run, which quantize 32-element blocks (the AVX-512 decode
  // kernels take up to 8 tokens: gemm16_avx512.h kGemm16MinTokens) — but for the AVX-512 GEMM's
  // super-block path; and the AVX2 Q4_K, Q5_K and IQ4_XS GEMMs (avx2/gemm_super_avx2.h).
  // Batch-invariant decode (cpu::batch_invariant_decode()) runs the AVX-512 GEMM's arithmetic at
  // every n, so its quantizer too.
  if (n >= (avx512 ? 9 : 8) || (avx512 && kernels::cpu::batch_invariant_decode()))
    return avx512 ? kernels::cpu::avx512::gemm_super_blocks(dt, n)
                  : dt == DType::kQ4_K || dt == DType::kQ5_K || dt == DType::kIQ4_XS;
  switch (dt) {
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kIQ4_XS:
    case DType::kQ2_K:
    case DType::kQ3_K: return true;  // both tiers
    default: return false;
  }
}

// super_blocks: replay quantize_acts_k_ref (cols a multiple of 256) instead of quantize_acts_ref.
inline ActReplay replay_acts(const float* x, int64_t n, int64_t cols, bool super_blocks) {
  ActReplay r;
  r.cols = cols;
  r.q.resize(static_cast<size_t>(n * cols));
  r.d.resize(r.q.size());
  if (super_blocks) {
    std::vector<uint8_t> buf(kernels::cpu::quantized_acts_k_bytes(n, cols) + 64);
    kernels::cpu::QuantizedActsK a = kernels::cpu::quantized_acts_k_view(buf.data(), n, cols);
    kernels::cpu::quantize_acts_k_ref(x, n, cols, a);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        r.q[t * cols + c] = a.token(t)[c];
        r.d[t * cols + c] = a.scales(t)[c / 256];
      }
  } else {
    std::vector<uint8_t> buf(kernels::cpu::quantized_acts_bytes(n, cols) + 64);
    kernels::cpu::QuantizedActs a = kernels::cpu::quantized_acts_view(buf.data(), n, cols);
    kernels::cpu::quantize_acts_ref(x, n, cols, /*offset128=*/false, a);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < cols; ++c) {
        r.q[t * cols + c] = a.token_blocks(t)[c];
        r.d[t * cols + c] = a.scales(c / 32)[t];
      }
  }
  return r;
}

}  // namespace larder::test
