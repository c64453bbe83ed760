// Reference decoding and matmul of the GGUF formats Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, IQ4_XS.
//
// Oracles: gguf-py's own numpy dequantizer over random-byte blocks (every bit pattern) and
// gguf-py-quantized data (fixture gguf_quants_ref, tests/ref/gguf_quants_reference.py),
// bit-identical; hand-built blocks for the bit orders; a double loop over the decoded weights for
// the matmul; and the dispatch entry points a model uses (kernels::dequant_row for the token
// embedding lookup, weight_supported at load).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/kernels/gguf_blocks.h"
#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

constexpr DType kNewFormats[] = {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL,
                                 DType::kQ2_K, DType::kQ3_K, DType::kIQ4_XS};

TEST(RefGgufQuants, DTypeTableMatchesBlockStructs) {
  const struct {
    DType d;
    uint32_t elems;
    size_t bytes;
  } want[] = {{DType::kQ4_0, 32, sizeof(BlockQ4_0)},   {DType::kQ4_1, 32, sizeof(BlockQ4_1)},
              {DType::kQ5_0, 32, sizeof(BlockQ5_0)},   {DType::kQ5_1, 32, sizeof(BlockQ5_1)},
              {DType::kQ8_0, 32, sizeof(BlockQ8_0)},   {DType::kIQ4_NL, 32, sizeof(BlockIQ4_NL)},
              {DType::kQ2_K, 256, sizeof(BlockQ2_K)},  {DType::kQ3_K, 256, sizeof(BlockQ3_K)},
              {DType::kQ4_K, 256, sizeof(BlockQ4_K)},  {DType::kQ5_K, 256, sizeof(BlockQ5_K)},
              {DType::kQ6_K, 256, sizeof(BlockQ6_K)},  {DType::kIQ4_XS, 256, sizeof(BlockIQ4_XS)}};
  for (const auto& w : want) {
    EXPECT_EQ(dtype_info(w.d).block_elems, w.elems) << dtype_name(w.d);
    EXPECT_EQ(dtype_info(w.d).block_bytes, w.bytes) << dtype_name(w.d);
  }
  EXPECT_STREQ(dtype_name(DType::kIQ4_NL), "IQ4_NL");
  EXPECT_STREQ(dtype_name(DType::kIQ4_XS), "IQ4_XS");
}

// Every new format is executable on the active table (whatever tier) and on the reference.
TEST(RefGgufQuants, SupportedEverywhere) {
  for (DType d : kNewFormats) {
    const int64_t cols = dtype_info(d).block_elems == 256 ? 512 : 64;
    EXPECT_NE(ref_table().matmul[static_cast<int>(d)], nullptr) << dtype_name(d);
    EXPECT_NE(ref_table().dequant_row[static_cast<int>(d)], nullptr) << dtype_name(d);
    EXPECT_TRUE(weight_supported(WeightView{d, 2, cols, nullptr})) << dtype_name(d);
    // A row that is not a whole number of blocks is refused at load, not decoded short.
    EXPECT_FALSE(weight_supported(WeightView{d, 2, cols + 16, nullptr})) << dtype_name(d);
  }
}

TEST(RefGgufQuants, HandBuiltQ4_1AndQ5_1) {
  BlockQ4_1 b4{};
  b4.d = f32_to_f16(0.5f);
  b4.m = f32_to_f16(-3.0f);
  for (int j = 0; j < 16; ++j) b4.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  ref::dequant_q4_1(reinterpret_cast<const uint8_t*>(&b4), 1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 3.0f) << j;
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 3.0f) << j;
  }
  BlockQ5_1 b5{};
  b5.d = f32_to_f16(0.25f);
  b5.m = f32_to_f16(1.0f);
  const uint32_t qh = 0xA5C3F00Fu;  // bit j = fifth bit of element j
  std::memcpy(b5.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b5.qs[j] = static_cast<uint8_t>(((3 * j) & 15) | (((5 * j + 1) & 15) << 4));
  ref::dequant_q5_1(reinterpret_cast<const uint8_t*>(&b5), 1, out);
  for (int j = 0; j < 32; ++j) {
    const int lo = j < 16 ? (3 * j) & 15 : (5 * (j - 16) + 1) & 15;
    const int q = lo | static_cast<int>((qh >> j) & 1u) << 4;
    EXPECT_EQ(out[j], 0.25f * q + 1.0f) << j;
  }
}

TEST(RefGgufQuants, HandBuiltQ5_0Signed) {
  BlockQ5_0 b{};
  b.d = f32_to_f16(2.0f);
  const uint32_t qh = 0xFFFF0000u;  // elements 16..31 get bit 4
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (j << 4));
  float out[32];
  ref::dequant_q5_0(reinterpret_cast<const uint8_t*>(&b), 1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 16)) << j;       // 0..15 − 16: negative half
    EXPECT_EQ(out[j + 16], 2.0f * j) << j;         // 16..31 − 16
  }
}

TEST(RefGgufQuants, HandBuiltIq4Codebook) {
  BlockIQ4_NL b{};
  b.d = f32_to_f16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  ref::dequant_iq4_nl(reinterpret_cast<const uint8_t*>(&b), 1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * kIq4Values[j]) << j;
    EXPECT_EQ(out[j + 16], 0.5f * kIq4Values[15 - j]) << j;
  }
  EXPECT_EQ(out[0], -63.5f);
  EXPECT_EQ(out[15], 56.5f);
}

TEST(RefGgufQuants, HandBuiltQ3_KScales) {
  // Sixteen 6-bit scales covering 0, 31, 32, 63 (signed −32, −1, 0, 31 after the offset).
  const int raw[16] = {0, 31, 32, 63, 1, 17, 48, 5, 62, 33, 16, 47, 2, 60, 9, 40};
  uint8_t s[12] = {};
  for (int i = 0; i < 16; ++i) {
    if (i < 8) s[i] |= static_cast<uint8_t>(raw[i] & 15);
    else s[i - 8] |= static_cast<uint8_t>((raw[i] & 15) << 4);
    s[8 + i % 4] |= static_cast<uint8_t>((raw[i] >> 4) << (2 * (i / 4)));
  }
  for (int i = 0; i < 16; ++i) {
    int sc;
    ref::q3_k_scale(s, i, &sc);
    EXPECT_EQ(sc, raw[i] - 32) << i;
  }
}

TEST(RefGgufQuants, DequantMatchesGgufPyExactly) {
  auto cases = testing::quant_cases("gguf_quants", "gguf_quants_ref");
  ASSERT_EQ(cases.size(), 40u);
  for (const testing::QuantCase& k : cases) {
    ASSERT_EQ(k.blocks.size(), dtype_bytes(k.dtype, k.rows * k.cols)) << k.stem;
    ASSERT_EQ(k.deq.size(), static_cast<size_t>(k.rows * k.cols)) << k.stem;
    WeightView w{k.dtype, k.rows, k.cols, k.blocks.data()};
    std::vector<float> row(static_cast<size_t>(k.cols)), via_ops(row.size());
    for (int64_t r = 0; r < k.rows; ++r) {
      ref_table().dequant_row[static_cast<int>(k.dtype)](w, r, row.data());
      dequant_row(w, r, via_ops.data());  // the embedding lookup a model runs (active table)
      for (int64_t c = 0; c < k.cols; ++c) {
        // Bitwise: -0.0 vs 0.0 would be a different decode order.
        ASSERT_EQ(std::memcmp(&row[c], &k.deq[r * k.cols + c], 4), 0)
            << k.stem << " at " << r << "," << c << ": " << row[c] << " vs " << k.deq[r * k.cols + c];
        ASSERT_EQ(std::memcmp(&via_ops[c], &row[c], 4), 0) << k.stem << " active-table row lookup at " << r << "," << c;
      }
    }
  }
}

// The ref accumulates in double over the decoded weights: only the final rounding differs.
TEST(RefGgufQuants, MatmulAgainstDoubleLoop) {
  std::mt19937_64 rng(15);
  auto cases = testing::quant_cases("gguf_quants", "gguf_quants_ref");
  ASSERT_FALSE(cases.empty());
  for (const testing::QuantCase& k : cases) {
    WeightView w{k.dtype, k.rows, k.cols, k.blocks.data()};
    for (int64_t n : {1, 3, 9}) {
      auto x = testing::randn(static_cast<size_t>(n * k.cols), rng);
      std::vector<float> y(static_cast<size_t>(n * k.rows), NAN);
      ref_table().matmul[static_cast<int>(k.dtype)](w, x.data(), n, y.data());
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < k.rows; ++r) {
          double s = 0, mag = 0;
          for (int64_t c = 0; c < k.cols; ++c) {
            s += double(k.deq[r * k.cols + c]) * x[t * k.cols + c];
            mag += std::abs(double(k.deq[r * k.cols + c]) * x[t * k.cols + c]);
          }
          ASSERT_NEAR(y[t * k.rows + r], s, 1e-6 * mag + 1e-30) << k.stem << " n=" << n << " at " << t << "," << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace larder::kernels
