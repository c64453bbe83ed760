// Reference row decoding and matmul per weight format.
//
// Oracles: hand-built GGUF blocks; gguf-py's own dequantize of gguf-py-quantized data (fixture
// kernels_ref, tests/ref/kernels_reference.py); a double-precision loop over the decoded weights;
// for MLX affine weights mlx's own mx.quantize / mx.dequantize / mx.quantized_matmul (same fixture)
// and a bit-by-bit packer written from the format description (quantization.md §2.2).
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

using testing::randn;

std::vector<uint8_t> read_bytes(const std::string& path) { return testing::read_bytes(path, "kernels_ref"); }

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

TEST(RefDequant, HandBuiltQ8_0) {
  uint8_t blk[34];
  put_u16(blk, f32_to_f16(0.25f));
  for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 127));
  float out[32];
  ref::dequant_q8_0(blk, 1, out);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.25f * static_cast<float>(j * 8 - 127)) << j;
}

TEST(RefDequant, HandBuiltQ4_0) {
  // Element j lives in the low nibble of byte j, element j+16 in its high nibble; value d·(q−8).
  uint8_t blk[18];
  put_u16(blk, f32_to_f16(-1.5f));
  for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float out[32];
  ref::dequant_q4_0(blk, 1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], -1.5f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(out[j + 16], -1.5f * static_cast<float>(15 - j - 8)) << j + 16;
  }
}

TEST(RefDequant, MatchesGgufPyExactly) {
  auto cases = testing::quant_cases("kernels", "kernels_ref");
  ASSERT_EQ(cases.size(), 12u);
  for (const testing::QuantCase& q : cases) {
    ASSERT_EQ(q.blocks.size(), dtype_bytes(q.dtype, q.rows * q.cols));
    ASSERT_EQ(q.deq.size(), static_cast<size_t>(q.rows * q.cols));
    WeightView w{q.dtype, q.rows, q.cols, q.blocks.data()};
    std::vector<float> row(static_cast<size_t>(q.cols));
    for (int64_t r = 0; r < q.rows; ++r) {
      ref_table().dequant_row[static_cast<int>(q.dtype)](w, r, row.data());
      for (int64_t c = 0; c < q.cols; ++c)
        ASSERT_EQ(row[c], q.deq[r * q.cols + c]) << dtype_name(q.dtype) << " " << q.rows << "x" << q.cols << " at " << r
                                                 << "," << c;
    }
  }
}

// y = x·Wᵀ in double over the decoded weights; the ref accumulates in double too, so the only
// difference is the final rounding: |err| ≤ 1e-6 · Σ|w·x| is generous.
void expect_matmul(const WeightView& w, const std::vector<float>& wf, int64_t n, std::mt19937_64& rng) {
  auto x = randn(static_cast<size_t>(n * w.cols), rng);
  std::vector<float> y(static_cast<size_t>(n * w.rows), NAN);
  if (w.is_affine()) {
    ref::matmul_affine(w, x.data(), n, y.data());
  } else {
    ref::matmul(w, x.data(), n, y.data());
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0, mag = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        s += double(wf[r * w.cols + c]) * x[t * w.cols + c];
        mag += std::abs(double(wf[r * w.cols + c]) * x[t * w.cols + c]);
      }
      ASSERT_NEAR(y[t * w.rows + r], s, 1e-6 * mag + 1e-30)
          << dtype_name(w.dtype) << " " << w.rows << "x" << w.cols << " n=" << n << " at " << t << "," << r;
    }
  }
}

TEST(RefMatmul, PlainDtypesRaggedShapes) {
  std::mt19937_64 rng(11);
  for (int64_t rows : {1, 5, 37}) {
    for (int64_t cols : {1, 7, 33, 100}) {
      auto wf = randn(static_cast<size_t>(rows * cols), rng);
      std::vector<uint16_t> h(wf.size()), b(wf.size());
      std::vector<float> hf(wf.size()), bf(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) {
        h[i] = f32_to_f16(wf[i]);
        hf[i] = f16_to_f32(h[i]);
        b[i] = f32_to_bf16(wf[i]);
        bf[i] = bf16_to_f32(b[i]);
      }
      for (int64_t n : {1, 3, 17}) {
        expect_matmul({DType::kF32, rows, cols, reinterpret_cast<const uint8_t*>(wf.data())}, wf, n, rng);
        expect_matmul({DType::kF16, rows, cols, reinterpret_cast<const uint8_t*>(h.data())}, hf, n, rng);
        expect_matmul({DType::kBF16, rows, cols, reinterpret_cast<const uint8_t*>(b.data())}, bf, n, rng);
      }
    }
  }
}

TEST(RefMatmul, GgufBlockFormats) {
  std::mt19937_64 rng(12);
  auto cases = testing::quant_cases("kernels", "kernels_ref");
  ASSERT_FALSE(cases.empty());
  for (const testing::QuantCase& q : cases) {
    for (int64_t n : {1, 4, 13}) expect_matmul({q.dtype, q.rows, q.cols, q.blocks.data()}, q.deq, n, rng);
  }
}

TEST(RefMatmul, ThroughOpsEntryPoint) {
  // ops.h's matmul/dequant_row route through the active table; against the ref on one case.
  std::mt19937_64 rng(13);
  auto wf = randn(6 * 64, rng);
  WeightView w{DType::kF32, 6, 64, reinterpret_cast<const uint8_t*>(wf.data())};
  auto x = randn(2 * 64, rng);
  std::vector<float> a(12), b(12);
  matmul(w, x.data(), 2, a.data());
  ref::matmul(w, x.data(), 2, b.data());
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(a[i], b[i], 1e-5f * (1 + std::abs(b[i])));
  std::vector<float> row(64);
  dequant_row(w, 4, row.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(row[i], wf[4 * 64 + i]);
}

// ---- MLX affine ------------------------------------------------------------------------------

// Packs codes as the format describes it, one bit at a time: element j's bit k is stream bit
// j·bits + k, stream bit i is bit (i % 8) of byte i / 8.
std::vector<uint8_t> pack_bits(const std::vector<uint32_t>& codes, int bits) {
  std::vector<uint8_t> out((codes.size() * bits + 7) / 8, 0);
  for (size_t j = 0; j < codes.size(); ++j)
    for (int k = 0; k < bits; ++k)
      if ((codes[j] >> k) & 1u) out[(j * bits + k) / 8] |= static_cast<uint8_t>(1u << ((j * bits + k) % 8));
  return out;
}

TEST(RefAffine, CodesFollowTheLittleEndianBitStream) {
  std::mt19937_64 rng(21);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    std::vector<uint32_t> codes(256);
    for (auto& c : codes) c = static_cast<uint32_t>(rng() & ((1u << bits) - 1));
    codes[0] = (1u << bits) - 1;  // all ones at both ends: a straddling code must keep every bit
    codes[255] = (1u << bits) - 1;
    const std::vector<uint8_t> packed = pack_bits(codes, bits);
    ASSERT_EQ(packed.size(), 256u * bits / 8);
    for (int64_t j = 0; j < 256; ++j) ASSERT_EQ(ref::affine_code(packed.data(), j, bits), codes[j]) << bits << " " << j;
  }
  // 4 bits: element 2j in the low nibble of byte j (not GGUF Q4_0's j / j+16 split).
  const uint8_t b4[4] = {0x21, 0x43, 0x65, 0x87};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(ref::affine_code(b4, j, 4), static_cast<uint32_t>(j + 1));
}

TEST(RefAffine, HandBuiltGroupValues) {
  // 1 row, 64 columns, g = 32, f32 scales: value = scale·code + bias, per group.
  std::vector<uint32_t> codes(64);
  for (int j = 0; j < 64; ++j) codes[j] = static_cast<uint32_t>(j % 16);
  const std::vector<uint8_t> packed = pack_bits(codes, 4);
  const float scales[2] = {0.5f, -0.25f}, biases[2] = {-1.0f, 2.0f};
  WeightView w;
  w.dtype = DType::kU32;
  w.rows = 1;
  w.cols = 64;
  w.data = packed.data();
  w.scales = reinterpret_cast<const uint8_t*>(scales);
  w.biases = reinterpret_cast<const uint8_t*>(biases);
  w.scale_dtype = DType::kF32;
  w.bits = 4;
  w.group_size = 32;
  std::vector<float> row(64);
  ref::dequant_row_affine(w, 0, row.data());
  for (int j = 0; j < 64; ++j) EXPECT_EQ(row[j], scales[j / 32] * static_cast<float>(j % 16) + biases[j / 32]) << j;
}

struct AffineCase {
  WeightView w;
  std::string stem;
  int64_t n = 0;
  std::vector<uint8_t> codes, scales, biases;
  std::vector<float> deq, x, y;
};

std::vector<float> read_f32(const std::string& path) {
  auto b = read_bytes(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

DType dtype_named(const std::string& s) { return s == "BF16" ? DType::kBF16 : s == "F16" ? DType::kF16 : DType::kF32; }

std::vector<AffineCase> affine_cases() {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/kernels/affine/";
  std::ifstream f(dir + "affine.json");
  EXPECT_TRUE(f.good()) << "fixture kernels_ref did not write affine cases";
  std::vector<AffineCase> out;
  if (!f.good()) return out;
  for (const auto& c : nlohmann::json::parse(f)) {
    AffineCase a;
    a.stem = c["stem"];
    const std::string base = dir + a.stem;
    a.codes = read_bytes(base + ".codes");
    a.scales = read_bytes(base + ".scales");
    a.biases = read_bytes(base + ".biases");
    a.deq = read_f32(base + ".deq");
    a.x = read_f32(base + ".x");
    a.y = read_f32(base + ".y");
    a.n = c["n"];
    a.w.dtype = DType::kU32;
    a.w.rows = c["rows"];
    a.w.cols = c["cols"];
    a.w.bits = c["bits"];
    a.w.group_size = c["group_size"];
    a.w.scale_dtype = dtype_named(c["scale_dtype"]);
    out.push_back(std::move(a));
  }
  for (auto& a : out) {  // pointers after the vector stopped moving
    a.w.data = a.codes.data();
    a.w.scales = a.scales.data();
    a.w.biases = a.biases.data();
  }
  return out;
}

TEST(RefAffine, DequantMatchesMlxExactly) {
  auto cases = affine_cases();
  ASSERT_EQ(cases.size(), 18u);  // 6 widths x 3 group sizes
  for (const AffineCase& a : cases) {
    const WeightView& w = a.w;
    ASSERT_EQ(a.codes.size(), static_cast<size_t>(w.rows) * w.row_bytes()) << a.stem;
    ASSERT_EQ(a.scales.size(), dtype_bytes(w.scale_dtype, w.rows * (w.cols / w.group_size))) << a.stem;
    ASSERT_EQ(a.deq.size(), static_cast<size_t>(w.rows * w.cols)) << a.stem;
    ASSERT_TRUE(weight_supported(w)) << a.stem;
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      ref_table().dequant_row_affine[w.bits](w, r, row.data());
      for (int64_t c = 0; c < w.cols; ++c)
        ASSERT_EQ(row[c], a.deq[r * w.cols + c]) << a.stem << " at " << r << "," << c;
    }
  }
}

// mx.quantized_matmul accumulates in f32 (cols <= 384 terms): |err| <= γ_cols·Σ|ŵ·x| on its side,
// ≈ nothing on ours (double); 2·cols·2^-24·Σ|ŵ·x| covers it.
TEST(RefAffine, MatmulMatchesMlxQuantizedMatmul) {
  auto cases = affine_cases();
  ASSERT_FALSE(cases.empty());
  for (const AffineCase& a : cases) {
    const WeightView& w = a.w;
    std::vector<float> y(static_cast<size_t>(a.n * w.rows), NAN);
    ref_table().matmul_affine[w.bits](w, a.x.data(), a.n, y.data());
    for (int64_t t = 0; t < a.n; ++t) {
      for (int64_t r = 0; r < w.rows; ++r) {
        double mag = 0;
        for (int64_t c = 0; c < w.cols; ++c) mag += std::abs(double(a.deq[r * w.cols + c]) * a.x[t * w.cols + c]);
        ASSERT_NEAR(y[t * w.rows + r], a.y[t * w.rows + r], 2.0 * w.cols * std::ldexp(1.0, -24) * mag + 1e-30)
            << a.stem << " at " << t << "," << r;
      }
    }
    std::mt19937_64 rng(31);
    for (int64_t n : {1, 5}) expect_matmul(w, a.deq, n, rng);  // vs the double loop over mlx's values
  }
}

}  // namespace
}  // namespace larder::kernels
