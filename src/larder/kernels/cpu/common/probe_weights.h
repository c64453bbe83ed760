// probe_weights.h — deterministic small weights for checks that run kernels at startup.
#pragma once

#include <cstdint>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/kernels/ops.h"

namespace larder::kernels::cpu {

// Weights of rows × cols in a GGUF block dtype, BF16 or F16 (small random codes, f16 scales
// ~0.01): the AVX-512 self-check's problems (register.cpp) and the numerics fingerprint's
// (kernels/numerics.h).
std::vector<uint8_t> self_check_weights(DType dtype, int64_t rows, int64_t cols, uint32_t seed);

// Weights of any block or float matmul dtype as a view, with what the format keeps beside its codes
// (MLX microscaling: U8 scales of realistic size; GGUF MXFP4's e8m0 bytes likewise). Owns its
// buffers; view points into them (do not copy a ProbeWeights whose view is in use).
struct ProbeWeights {
  std::vector<uint8_t> data, scales;
  WeightView view;
};
ProbeWeights probe_weights(DType dtype, int64_t rows, int64_t cols, uint32_t seed);

// MLX affine weights of rows × cols: random codes, scales ~0.01 and biases ~−2^(bits−1)·scale
// (mlx's quantizer centres the codes), scales and biases in `scale_dtype` (F32/F16/BF16), groups
// of `group_size`. Owns its buffers; view() points into them.
struct AffineProbe {
  int64_t rows = 0, cols = 0;
  int bits = 0, group_size = 0;
  DType scale_dtype = DType::kBF16;
  std::vector<uint8_t> codes, scales, biases;
  WeightView view() const;
};
AffineProbe affine_probe_weights(int bits, int64_t rows, int64_t cols, int64_t group_size, DType scale_dtype);

}  // namespace larder::kernels::cpu
