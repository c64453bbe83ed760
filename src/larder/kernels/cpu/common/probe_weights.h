// probe_weights.h — deterministic small weights for checks that run kernels at startup.
#pragma once

#include <cstdint>
#include <vector>

#include "larder/core/dtype.h"

namespace larder::kernels::cpu {

// Weights of rows × cols in a GGUF block dtype, BF16 or F16 (small random codes, f16 scales
// ~0.01): the AVX-512 self-check's problems (register.cpp) and the numerics fingerprint's
// (kernels/numerics.h).
std::vector<uint8_t> self_check_weights(DType dtype, int64_t rows, int64_t cols, uint32_t seed);

}  // namespace larder::kernels::cpu
