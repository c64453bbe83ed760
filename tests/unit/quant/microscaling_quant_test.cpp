// The microscaling float quantizers (quant/microscaling.h) against mlx's own `mx.quantize(w,
// mode=…)` on mlx's CPU: the codes and scales must be byte-identical (fixture microscaling_ref,
// tests/ref/microscaling_reference.py: rows over many octaves, an outlier, a zero row with signed
// zeros, a constant row); and the code functions at their rounding boundaries (measured against mlx:
// e2m1 ties go toward zero, e4m3 ties to even, −0 keeps its sign in e4m3 only).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "larder/kernels/microscaling.h"
#include "larder/quant/microscaling.h"

namespace larder::quant {
namespace {

std::vector<uint8_t> bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path << " (fixture microscaling_ref did not run?)";
  return {std::istreambuf_iterator<char>(f), {}};
}

TEST(MicroscalingQuant, ByteIdenticalToMlx) {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/microscaling/";
  std::ifstream f(dir + "index.json");
  ASSERT_TRUE(f.good()) << "fixture microscaling_ref did not run";
  int n = 0;
  for (const auto& c : nlohmann::json::parse(f)) {
    if (c["kind"] != "q" || c["format"] == "MXFP4") continue;
    const std::string stem = dir + c["stem"].get<std::string>();
    SCOPED_TRACE(stem);
    DType fmt = DType::kUnknown;
    for (DType d : {DType::kMlxMXFP4, DType::kMlxNVFP4, DType::kMlxMXFP8})
      if (c["format"] == dtype_name(d)) fmt = d;
    ASSERT_NE(fmt, DType::kUnknown);
    const int64_t rows = c["rows"], cols = c["cols"];
    const std::vector<uint8_t> w = bytes(stem + ".w"), want_codes = bytes(stem + ".codes"),
                               want_scales = bytes(stem + ".scales");
    std::vector<uint8_t> codes(want_codes.size()), scales(want_scales.size());
    ASSERT_EQ(w.size(), static_cast<size_t>(rows * cols * 4));
    ASSERT_TRUE(quantize_microscaling(w.data(), DType::kF32, rows, cols, fmt, codes.data(), scales.data()).is_ok());
    EXPECT_EQ(scales, want_scales);
    EXPECT_EQ(codes, want_codes);
    ++n;
  }
  EXPECT_EQ(n, 12);
}

TEST(MicroscalingQuant, CodeBoundaries) {
  // e2m1: ties toward zero; a magnitude that rounds to zero has no sign.
  EXPECT_EQ(e2m1_code(0.25f), 0);
  EXPECT_EQ(e2m1_code(0.2501f), 1);
  EXPECT_EQ(e2m1_code(1.75f), 3);
  EXPECT_EQ(e2m1_code(5.0f), 6);
  EXPECT_EQ(e2m1_code(5.01f), 7);
  EXPECT_EQ(e2m1_code(100.0f), 7);
  EXPECT_EQ(e2m1_code(-0.2f), 0);
  EXPECT_EQ(e2m1_code(-0.0f), 0);
  EXPECT_EQ(e2m1_code(-3.0f), 0x8 | 5);
  // e4m3: nearest-even, subnormals, saturation, signed zero.
  EXPECT_EQ(e4m3_code(448.0f), 0x7e);
  EXPECT_EQ(e4m3_code(1.0f), 0x38);
  EXPECT_EQ(e4m3_code(-0.0f), 0x80);
  EXPECT_EQ(e4m3_code(-1e-9f), 0x80);
  EXPECT_EQ(e4m3_code(0.00098f), 0x01);                 // above half the smallest subnormal 2^-9
  EXPECT_EQ(e4m3_code(-0.0029296875f), 0x82);           // 1.5·2^-9: tie → even (2)
  EXPECT_EQ(e4m3_code(1.0625f), 0x38);                  // 1 + 1/16: tie → even mantissa (1.0)
  EXPECT_EQ(e4m3_code(1.1875f), 0x3a);                  // 1 + 3/16: tie → even (1.25)
  EXPECT_EQ(e4m3_code(0.015625f * 0.9375f), 0x08);      // rounds up into the smallest normal
  for (int b = 0; b < 0x7f; ++b)                         // every finite code round-trips
    EXPECT_EQ(e4m3_code(kernels::e4m3_to_f32(static_cast<uint8_t>(b))), b) << b;
}

TEST(MicroscalingQuant, RefusesWhatMlxRefuses) {
  std::vector<float> w(48, 1.0f);
  std::vector<uint8_t> c(48), s(3);
  EXPECT_FALSE(quantize_microscaling(w.data(), DType::kF32, 1, 48, DType::kMlxMXFP4, c.data(), s.data()).is_ok());
  EXPECT_TRUE(quantize_microscaling(w.data(), DType::kF32, 1, 48, DType::kMlxNVFP4, c.data(), s.data()).is_ok());
  EXPECT_FALSE(quantize_microscaling(w.data(), DType::kF32, 1, 48, DType::kQ4_0, c.data(), s.data()).is_ok());
}

}  // namespace
}  // namespace larder::quant
