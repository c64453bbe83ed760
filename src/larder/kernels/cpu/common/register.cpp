// register.cpp — puts the fast tiers into a KernelTable. Compiled with the baseline (AVX2) flags:
// it may reference the AVX-512 functions but calls nothing from that tier itself.
#include <cstdlib>
#include <cstring>

#include "larder/core/cpuid.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"

namespace larder::kernels::cpu {

namespace {
void set(KernelTable& t, DType d, MatmulFn f) {
  if (f) t.matmul[static_cast<int>(d)] = f;
}
constexpr DType kFormats[] = {DType::kQ8_0, DType::kQ4_0, DType::kBF16, DType::kF16, DType::kF32};

bool is_int8_act(DType d) { return d == DType::kQ8_0 || d == DType::kQ4_0; }
}  // namespace

MatmulFn fast_matmul(const char* tier, DType dtype) {
  if (std::strcmp(tier, "avx2") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx2::matmul_q8_0;
      case DType::kQ4_0: return avx2::matmul_q4_0;
      case DType::kBF16: return avx2::matmul_bf16;
      case DType::kF16: return avx2::matmul_f16;
      case DType::kF32: return avx2::matmul_f32;
      default: return nullptr;
    }
  }
  if (std::strcmp(tier, "avx512") == 0) {
    switch (dtype) {
      case DType::kQ8_0: return avx512::matmul_q8_0;
      case DType::kQ4_0: return avx512::matmul_q4_0;
      case DType::kBF16: return avx512::matmul_bf16;
      default: return nullptr;
    }
  }
  return nullptr;
}

void register_fast_kernels(KernelTable& t) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return;
  // LARDER_ISA=ref keeps the scalar reference everywhere (debugging a numerical difference).
  const char* isa = std::getenv("LARDER_ISA");
  if (isa && std::strcmp(isa, "ref") == 0) return;
  // The Q8_0/Q4_0 kernels quantize activations to int8 (like llama.cpp), so their results differ
  // from the exact-dequantization reference by ~1 % of Σ|w·x| (bound: tests/unit/kernels_fast;
  // model-level: tests/unit/models ArchParity runs both tables). LARDER_QUANT_ACT=0 keeps the
  // reference for those two formats (debugging a numerical difference).
  const char* qa = std::getenv("LARDER_QUANT_ACT");
  const bool int8_act = !(qa && std::strcmp(qa, "0") == 0);
  for (DType d : kFormats) {
    if (!is_int8_act(d) || int8_act) set(t, d, fast_matmul("avx2", d));
  }
  t.name = "avx2";
  if (f.has_avx512_tier()) {
    for (DType d : kFormats) {
      if (!is_int8_act(d) || int8_act) set(t, d, fast_matmul("avx512", d));
    }
    t.name = "avx512";
  }
}

}  // namespace larder::kernels::cpu
