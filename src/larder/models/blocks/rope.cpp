#include "larder/models/blocks/rope.h"

#include <cmath>

namespace larder::models {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.rope_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const RopeScaling& rs = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.rope_dim));
    if (rs.type == "linear") {
      inv /= rs.factor;
    } else if (rs.type == "llama3") {
      const double old_ctx = static_cast<double>(rs.original_max_position);
      const double low_wavelen = old_ctx / rs.low_freq_factor;
      const double high_wavelen = old_ctx / rs.high_freq_factor;
      const double wavelen = 2.0 * M_PI / inv;
      if (wavelen > low_wavelen) {
        inv /= rs.factor;  // low frequencies: fully interpolated
      } else if (wavelen >= high_wavelen) {
        // Medium band: blend between interpolated and original by how far the wavelength sits
        // inside the band (smooth = 0 at the low-frequency edge, 1 at the high-frequency edge).
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        inv = (1.0 - smooth) * inv / rs.factor + smooth * inv;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return out;
}

}  // namespace larder::models
