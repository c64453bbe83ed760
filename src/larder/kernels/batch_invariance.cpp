#include "larder/kernels/batch_invariance.h"

#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"

namespace larder::kernels {

namespace {
constexpr const char* kAvx2Int =
    "decode kernels (n < 8) keep per-lane f32 sums across blocks and add the lanes at the end; the token-lane "
    "GEMM (n >= 8) chains each token's blocks in order in one lane";
constexpr const char* kAvx512Int =
    "decode kernels (n < 9; Q8_0 n < 8) keep per-lane f32 sums across blocks (and Q2_K/Q3_K quantize per 256 "
    "values where the GEMM does per 32); the GEMM chains each token's blocks in order in one lane";
constexpr const char* kAvx512Fp4 =
    "decode (n < 9) runs the AVX2 tile kernel (per-lane f32 sums of maddubs products); the GEMM chains each "
    "token's blocks in order in one lane";
constexpr const char* kAvx512F16 =
    "decode (n <= 8) rounds the activations to f16 (F16HalfKernel); prefill is the AVX2 f32 kernel";
constexpr const char* kAvx512Bf16 =
    "decode (n < 16) sums 16 lanes of vdpbf16ps per row; the GEMM (n >= 16) one token per lane in pair order";

constexpr VarianceGap kGaps[] = {
    {"avx2", "Q8_0", kAvx2Int},         {"avx2", "Q4_0", kAvx2Int},         {"avx2", "Q4_1", kAvx2Int},
    {"avx2", "Q5_0", kAvx2Int},         {"avx2", "Q5_1", kAvx2Int},         {"avx2", "IQ4_NL", kAvx2Int},
    {"avx2", "Q2_K", kAvx2Int},         {"avx2", "Q3_K", kAvx2Int},         {"avx2", "Q4_K", kAvx2Int},
    {"avx2", "Q5_K", kAvx2Int},         {"avx2", "Q6_K", kAvx2Int},         {"avx2", "IQ4_XS", kAvx2Int},
    {"avx2", "affine4g", kAvx2Int},     {"avx2", "affine8g", kAvx2Int},     {"avx512", "Q8_0", kAvx512Int},
    {"avx512", "Q4_0", kAvx512Int},     {"avx512", "Q4_1", kAvx512Int},     {"avx512", "Q5_0", kAvx512Int},
    {"avx512", "Q5_1", kAvx512Int},     {"avx512", "IQ4_NL", kAvx512Int},   {"avx512", "Q2_K", kAvx512Int},
    {"avx512", "Q3_K", kAvx512Int},     {"avx512", "Q4_K", kAvx512Int},     {"avx512", "Q5_K", kAvx512Int},
    {"avx512", "Q6_K", kAvx512Int},     {"avx512", "IQ4_XS", kAvx512Int},   {"avx512", "affine", kAvx512Int},
    {"avx512", "F16", kAvx512F16},      {"avx512", "BF16", kAvx512Bf16},    {"avx512inv", "F16", kAvx512F16},
    {"avx512inv", "BF16", kAvx512Bf16}, {"avx512", "MXFP4", kAvx512Fp4}, {"avx512", "MLX_MXFP4", kAvx512Fp4},
    {"avx512", "MLX_NVFP4", kAvx512Fp4},
};
}  // namespace

std::span<const VarianceGap> batch_variance_gaps() { return kGaps; }

const char* batch_variance(std::string_view mode, std::string_view format) {
  for (const VarianceGap& g : kGaps)
    if (mode == g.mode && format.starts_with(g.format)) return g.why;
  return nullptr;
}

std::string active_decode_mode() {
  const std::string tier = active_table().name;
  return tier == "avx512" && cpu::batch_invariant_decode() ? "avx512inv" : tier;
}

}  // namespace larder::kernels
