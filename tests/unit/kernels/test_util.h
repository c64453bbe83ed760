// test_util.h — small helpers shared by the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace larder::kernels::testing {

inline std::vector<float> randn(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace larder::kernels::testing
