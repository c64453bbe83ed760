#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <random>

#include "larder/core/dtype.h"

namespace larder {
namespace {

// Oracle: the F16C hardware conversion (IEEE round-to-nearest-even), independent of our code.
TEST(DTypeTest, F16RoundTripMatchesHardware) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float ours = f16_to_f32(static_cast<uint16_t>(h));
    float hw = _cvtsh_ss(static_cast<unsigned short>(h));
    if (std::isnan(hw)) {
      EXPECT_TRUE(std::isnan(ours)) << h;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &ours, 4);
    std::memcpy(&b, &hw, 4);
    ASSERT_EQ(a, b) << "half 0x" << std::hex << h;
  }
}

TEST(DTypeTest, F32ToF16MatchesHardwareOnRandomAndEdgeValues) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values = {0.f, -0.f, 65504.f, 65520.f, 65519.99f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                               1e-10f, INFINITY, -INFINITY, 1.0009765625f, 1.00048828125f};
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    values.push_back(f);
  }
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_f16(f) & 0x7c00, 0x7c00);
      continue;
    }
    uint16_t hw = _cvtss_sh(f, 0);
    ASSERT_EQ(f32_to_f16(f), hw) << f;
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  float f;
  uint32_t u = 0x3f808000;  // exactly halfway between 0x3f80 and 0x3f81 -> even (0x3f80)
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(f32_to_bf16(f), 0x3f80);
  u = 0x3f818000;  // halfway, odd below -> rounds up to 0x3f82
  std::memcpy(&f, &u, 4);
  EXPECT_EQ(f32_to_bf16(f), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(DTypeTest, BlockSizes) {
  EXPECT_EQ(dtype_bytes(DType::kQ4_0, 64), 36u);
  EXPECT_EQ(dtype_bytes(DType::kQ8_0, 32), 34u);
  EXPECT_EQ(dtype_bytes(DType::kQ4_K, 256), 144u);
  EXPECT_EQ(dtype_bytes(DType::kQ6_K, 512), 420u);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 10), 20u);
}

}  // namespace
}  // namespace larder
