#include "larder/models/blocks/rope.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace larder::models {

namespace {

// yarn's correction range [low, high] in pair indices (transformers `find_correction_range`).
std::pair<double, double> yarn_range(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const double dim = static_cast<double>(c.rope_dim);
  auto corr = [&](double rotations) {
    return dim * std::log(static_cast<double>(rs.original_max_position) / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(c.rope_theta));
  };
  double low = corr(rs.beta_fast), high = corr(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  return {std::max(low, 0.0), std::min(high, dim - 1)};
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

double rope_attention_factor(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type != "yarn") return 1.0;
  if (rs.attention_factor) return *rs.attention_factor;
  if (rs.mscale && rs.mscale_all_dim && *rs.mscale != 0 && *rs.mscale_all_dim != 0)
    return yarn_mscale(rs.factor, *rs.mscale) / yarn_mscale(rs.factor, *rs.mscale_all_dim);
  return yarn_mscale(rs.factor, 1.0);
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.rope_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const RopeScaling& rs = c.rope_scaling;
  const auto [low, high] = rs.type == "yarn" ? yarn_range(c) : std::pair<double, double>{0, 0};
  for (int64_t i = 0; i < half; ++i) {
    double inv = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.rope_dim));
    if (rs.type == "yarn") {
      // ramp 0 below the range (extrapolate: keep inv), 1 above it (interpolate: inv / factor).
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high == low ? 0.001 : high - low), 0.0, 1.0);
      inv = inv / rs.factor * ramp + inv * (1.0 - ramp);
    } else if (rs.type == "linear") {
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
