// Reference decoding and matmul of the GGUF K-quants (Q4_K, Q5_K, Q6_K).
//
// Oracles: gguf-py's own numpy dequantizer over quantized and random-byte blocks (fixture
// kquant_ref, tests/ref/kquant_reference.py), bit-identical; hand-built blocks exercising the
// packed 6-bit scale/min layout and the Q6_K ql/qh split; a double loop over the decoded weights
// for the matmul.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

TEST(RefKQuant, DTypeTable) {
  EXPECT_EQ(dtype_info(DType::kQ4_K).block_elems, 256u);
  EXPECT_EQ(dtype_info(DType::kQ4_K).block_bytes, 144u);
  EXPECT_EQ(dtype_info(DType::kQ5_K).block_bytes, 176u);
  EXPECT_EQ(dtype_info(DType::kQ6_K).block_bytes, 210u);
  for (DType d : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_NE(ref_table().matmul[static_cast<int>(d)], nullptr) << dtype_name(d);
    EXPECT_NE(ref_table().dequant_row[static_cast<int>(d)], nullptr) << dtype_name(d);
    EXPECT_TRUE(weight_supported(WeightView{d, 2, 512, nullptr})) << dtype_name(d);
  }
}

TEST(RefKQuant, HandBuiltQ4_KScalesAndNibbles) {
  // 6-bit scales/mins including 63 and values >= 16 in the upper four (bits 4..5 live elsewhere).
  const int sc[8] = {1, 63, 17, 40, 5, 33, 48, 62}, mn[8] = {0, 7, 63, 21, 60, 16, 3, 47};
  uint8_t blk[144] = {};
  put_u16(blk, f32_to_f16(0.5f));
  put_u16(blk + 2, f32_to_f16(0.25f));
  uint8_t* s = blk + 4;
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int j = 0; j < 8; ++j) {
    int a, b;
    ref::kquant_scale_min(s, j, &a, &b);
    EXPECT_EQ(a, sc[j]) << j;
    EXPECT_EQ(b, mn[j]) << j;
  }
  for (int e = 0; e < 256; ++e) {  // code of element e: (e * 7) % 16
    const int c = e / 64, l = e % 32, hi = (e % 64) / 32;
    blk[16 + 32 * c + l] |= static_cast<uint8_t>(((e * 7) % 16) << (4 * hi));
  }
  float out[256];
  ref::dequant_q4_k(blk, 1, out);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    EXPECT_EQ(out[e], 0.5f * sc[j] * ((e * 7) % 16) - 0.25f * mn[j]) << e;
  }
}

TEST(RefKQuant, HandBuiltQ6_K) {
  uint8_t blk[210] = {};
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 11) % 64;  // stored code, value code − 32
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    blk[64 * h + 32 * (k % 2) + l] |= static_cast<uint8_t>((q[e] & 15) << (4 * (k / 2)));
    blk[128 + 32 * h + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * k));
  }
  for (int s = 0; s < 16; ++s) blk[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s * 17 - 128));
  put_u16(blk + 208, f32_to_f16(0.125f));
  float out[256];
  ref::dequant_q6_k(blk, 1, out);
  for (int e = 0; e < 256; ++e)
    EXPECT_EQ(out[e], 0.125f * static_cast<float>((e / 16) * 17 - 128) * static_cast<float>(q[e] - 32)) << e;
}

TEST(RefKQuant, DequantMatchesGgufPyExactly) {
  auto cases = testing::quant_cases("kquant", "kquant_ref");
  ASSERT_EQ(cases.size(), 24u);
  for (const testing::QuantCase& k : cases) {
    ASSERT_EQ(k.blocks.size(), dtype_bytes(k.dtype, k.rows * k.cols)) << k.stem;
    ASSERT_EQ(k.deq.size(), static_cast<size_t>(k.rows * k.cols)) << k.stem;
    WeightView w{k.dtype, k.rows, k.cols, k.blocks.data()};
    std::vector<float> row(static_cast<size_t>(k.cols));
    for (int64_t r = 0; r < k.rows; ++r) {
      ref_table().dequant_row[static_cast<int>(k.dtype)](w, r, row.data());
      for (int64_t c = 0; c < k.cols; ++c) ASSERT_EQ(row[c], k.deq[r * k.cols + c]) << k.stem << " at " << r << "," << c;
    }
  }
}

// The ref accumulates in double over the decoded weights: only the final rounding differs.
TEST(RefKQuant, MatmulAgainstDoubleLoop) {
  std::mt19937_64 rng(14);
  auto cases = testing::quant_cases("kquant", "kquant_ref");
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
