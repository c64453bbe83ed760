// rope.h — per-pair rotary frequencies for the rope kernel (plain, linear- and llama3-scaled).
#pragma once

#include <vector>

#include "larder/models/config.h"

namespace larder::models {

// inv_freq[rope_dim/2]: theta_i = position * inv_freq[i].
//   plain:  inv_freq[i] = theta^(−2i/rope_dim)
//   linear: inv_freq[i] / factor
//   llama3: HF `_compute_llama3_parameters` (Llama 3.1/3.2): wavelengths longer than
//           original_max_position/low_freq_factor are slowed by `factor`, shorter than
//           original/high_freq_factor kept, and the band between interpolated smoothly.
// Computed in double and rounded once to float (mlx-lm and HF compute in f32: differences are
// ~1 ulp, far below the parity tolerances).
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace larder::models
