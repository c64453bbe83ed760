// MLX affine quantizer: hand-derived vectors (design doc §11 TV-1, TV-2, TV-4) and byte parity
// with mx.quantize on the MLX CPU backend (fixture quant_ref: tests/ref/quant_reference.py).
#include "larder/quant/affine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace larder::quant {
namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Affine, Tv1RampBf16) {
  std::vector<uint16_t> w(32);
  for (int i = 0; i < 32; ++i) w[i] = f32_to_bf16(static_cast<float>(i) / 31.0f);
  std::vector<uint32_t> q(4);
  uint16_t s = 0, b = 0;
  ASSERT_TRUE(quantize_affine(w.data(), DType::kBF16, 1, 32, 4, 32, q.data(), &s, &b));
  EXPECT_EQ(q, (std::vector<uint32_t>{0xccddeeffu, 0x8899aabbu, 0x44556677u, 0x00112233u}));
  EXPECT_EQ(s, 0xbd89);
  EXPECT_EQ(bf16_to_f32(b), 1.0f);
}

TEST(Affine, Tv2PackingAllWidths) {
  // Codes i mod 2^bits come out of an integer ramp 0..2^bits-1 repeated (exact codes).
  struct V { int bits; std::vector<uint32_t> words; };
  const std::vector<V> vs = {
      {2, {0xe4e4e4e4u, 0xe4e4e4e4u}},
      {3, {0x88fac688u, 0xc688fac6u, 0xfac688fau}},
      {5, {0x8a418820u, 0xc5a92839u, 0xca307b9au, 0x38bdab49u, 0xffbbcdebu}},
      {6, {0x440c2040u, 0xa2481c61u, 0x3ce34c2cu, 0x544d2450u, 0xa6585d65u, 0x7de75c6du}},
  };
  for (const V& v : vs) {
    const int n = (1 << v.bits) - 1;
    // w = code - n over 64 elements (the whole code range occurs): lo = -n is the edge, the scale
    // is exactly +1 and the bias -n, so the codes are i mod 2^bits; the first 32 are checked.
    std::vector<float> w(64);
    for (int i = 0; i < 64; ++i) w[i] = static_cast<float>(i % (n + 1)) - static_cast<float>(n);
    std::vector<uint32_t> q(static_cast<size_t>(2 * v.bits));
    float s = 0, b = 0;
    ASSERT_TRUE(quantize_affine(w.data(), DType::kF32, 1, 64, v.bits, 64, q.data(), &s, &b));
    EXPECT_EQ(s, 1.0f) << v.bits;
    q.resize(v.words.size());
    EXPECT_EQ(q, v.words) << "bits " << v.bits;
  }
}

TEST(Affine, Tv4ConstantAndZeroGroups) {
  for (float c : {0.5f, -0.5f, 0.0f}) {
    std::vector<uint16_t> w(32, f32_to_bf16(c));
    std::vector<uint32_t> q(4, 0xffffffffu);
    uint16_t s, b;
    ASSERT_TRUE(quantize_affine(w.data(), DType::kBF16, 1, 32, 4, 32, q.data(), &s, &b));
    for (uint32_t x : q) EXPECT_EQ(x, 0u);
    EXPECT_EQ(bf16_to_f32(b), c);
    EXPECT_NEAR(bf16_to_f32(s), -1.0011718e-07f, 1e-12f);
    std::vector<uint16_t> wf(32, f32_to_f16(c));
    ASSERT_TRUE(quantize_affine(wf.data(), DType::kF16, 1, 32, 4, 32, q.data(), &s, &b));
    EXPECT_EQ(f16_to_f32(s), -1.1920929e-07f);  // fp16 subnormal
  }
}

TEST(Affine, RejectsBadParams) {
  float w[64] = {};
  uint32_t q[64];
  float s[4], b[4];
  EXPECT_FALSE(quantize_affine(w, DType::kF32, 1, 64, 7, 32, q, s, b));
  EXPECT_FALSE(quantize_affine(w, DType::kF32, 1, 64, 4, 48, q, s, b));
  EXPECT_FALSE(quantize_affine(w, DType::kF32, 1, 48, 4, 32, q, s, b));
  EXPECT_FALSE(quantize_affine(w, DType::kI32, 1, 64, 4, 32, q, s, b));
}

TEST(Affine, DequantizeRoundTripWithinOneStep) {
  std::vector<float> w(4 * 128);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * 0.1f;
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    std::vector<uint32_t> q(static_cast<size_t>(4 * 128 * bits / 32));
    std::vector<float> s(4 * 2), b(4 * 2), d(w.size());
    ASSERT_TRUE(quantize_affine(w.data(), DType::kF32, 4, 128, bits, 64, q.data(), s.data(), b.data()));
    ASSERT_TRUE(dequantize_affine(q.data(), s.data(), b.data(), DType::kF32, 4, 128, bits, 64, d.data()));
    const float step = 0.2f / static_cast<float>((1 << bits) - 1);
    for (size_t i = 0; i < w.size(); ++i) EXPECT_LE(std::fabs(d[i] - w[i]), step * 1.01f) << bits;
  }
}

TEST(AffineMlxParity, ByteIdenticalToMxQuantize) {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/quant/";
  std::ifstream f(dir + "cases.json");
  ASSERT_TRUE(f.good()) << "fixture missing: " << dir << "cases.json (run ctest, fixture quant_ref)";
  const nlohmann::json j = nlohmann::json::parse(f);
  int n = 0;
  for (const auto& c : j["cases"]) {
    const std::string name = c["name"];
    const std::string dt = c["dtype"];
    const DType dtype = dt == "bf16" ? DType::kBF16 : dt == "f16" ? DType::kF16 : DType::kF32;
    const int bits = c["bits"], g = c["group_size"];
    const int64_t rows = c["rows"], cols = c["cols"];
    const std::vector<uint8_t> in = read_bytes(dir + name + ".in");
    const std::vector<uint8_t> eq = read_bytes(dir + name + ".q");
    const std::vector<uint8_t> es = read_bytes(dir + name + ".s");
    const std::vector<uint8_t> eb = read_bytes(dir + name + ".b");
    const size_t esz = dtype == DType::kF32 ? 4 : 2;
    ASSERT_EQ(in.size(), static_cast<size_t>(rows * cols) * esz) << name;
    std::vector<uint8_t> q(static_cast<size_t>(rows * affine_words_per_row(cols, bits) * 4));
    std::vector<uint8_t> s(static_cast<size_t>(rows * cols / g) * esz), b(s.size());
    ASSERT_TRUE(quantize_affine(in.data(), dtype, rows, cols, bits, g, reinterpret_cast<uint32_t*>(q.data()),
                                s.data(), b.data()));
    ASSERT_EQ(q.size(), eq.size()) << name;
    ASSERT_EQ(s.size(), es.size()) << name;
    size_t first = q.size();
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] != eq[i]) { first = i; break; }
    EXPECT_EQ(first, q.size()) << name << ": packed codes differ first at byte " << first << " (row "
                               << first / (q.size() / rows) << ")";
    for (size_t i = 0; i < s.size(); i += esz)
      if (std::memcmp(&s[i], &es[i], esz) != 0) {
        ADD_FAILURE() << name << ": scale " << i / esz << " (row " << i / esz / (cols / g) << ") differs: larder "
                      << load_float(s.data(), dtype, static_cast<int64_t>(i / esz)) << " mlx "
                      << load_float(es.data(), dtype, static_cast<int64_t>(i / esz));
        break;
      }
    EXPECT_TRUE(b == eb) << name << ": biases differ";
    ++n;
  }
  EXPECT_GE(n, 60);
}

}  // namespace
}  // namespace larder::quant
