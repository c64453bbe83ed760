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
//   yarn:   transformers `_compute_yarn_parameters` / mlx-lm `YarnRoPE`: pairs below the
//           correction range (fast rotations) keep their frequency, pairs above it are divided by
//           `factor`, and a linear ramp blends the band between (RopeScaling says how it is cut).
// Computed in double and rounded once to float (mlx-lm and HF compute in f32: differences are
// ~1 ulp, far below the parity tolerances).
std::vector<float> rope_inv_freq(const ModelConfig& c);

// The factor yarn multiplies cos/sin by (transformers; mlx-lm scales q and k): q·k grows by its
// square, so a family multiplies its softmax scale by rope_attention_factor(c)². 1 for every
// other scaling.
double rope_attention_factor(const ModelConfig& c);

}  // namespace larder::models
