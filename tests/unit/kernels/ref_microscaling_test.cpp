// Reference decoding of the microscaling float formats (kernels/microscaling.h, ref/microscaling.cpp).
//
// Oracles: mlx's own mx.dequantize over mx.quantize's output and over random codes and scales (MLX
// mxfp4 / nvfp4 / mxfp8), and gguf-py's MXFP4 decoding over random and gguf-py-quantized blocks
// (fixture microscaling_ref, tests/ref/microscaling_reference.py) — value for value equal (every
// decoded value is exact in f32, so there is no rounding to allow for); hand-built rows for the
// element orders; the dispatch entry points a model uses (dequant_row, weight_supported).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/kernels/microscaling.h"
#include "larder/kernels/ref/ref_ops.h"
#include "test_util.h"

namespace larder::kernels {
namespace {

struct MxCase {
  DType dtype;
  int64_t rows, cols;
  std::string stem, kind;
};

std::vector<MxCase> mx_cases() {
  const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/microscaling/";
  std::ifstream f(dir + "index.json");
  EXPECT_TRUE(f.good()) << "fixture microscaling_ref did not run";
  std::vector<MxCase> out;
  if (!f.good()) return out;
  for (const auto& c : nlohmann::json::parse(f))
    out.push_back({testing::dtype_named(c["format"]), c["rows"], c["cols"], dir + c["stem"].get<std::string>(), c["kind"]});
  return out;
}

std::vector<float> floats(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

TEST(RefMicroscaling, DTypeTable) {
  EXPECT_STREQ(dtype_name(DType::kMXFP4), "MXFP4");
  EXPECT_EQ(dtype_info(DType::kMXFP4).block_elems, 32u);
  EXPECT_EQ(dtype_info(DType::kMXFP4).block_bytes, 17u);
  EXPECT_EQ(dtype_bytes(DType::kMlxMXFP4, 64), 32u);
  EXPECT_EQ(dtype_bytes(DType::kMlxNVFP4, 64), 32u);
  EXPECT_EQ(dtype_bytes(DType::kMlxMXFP8, 64), 64u);
  EXPECT_EQ(mlx_microscaling_group(DType::kMlxNVFP4), 16);
  EXPECT_EQ(mlx_microscaling_group(DType::kMlxMXFP8), 32);
  EXPECT_EQ(mlx_microscaling_group(DType::kMXFP4), 0);  // GGUF: scales inside the blocks
}

TEST(RefMicroscaling, ScaleDecoders) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isinf(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_half_to_f32(128), 1.0f);
  EXPECT_EQ(e8m0_half_to_f32(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_half_to_f32(255), std::ldexp(1.0f, 127));
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
}

// Element order by hand: MLX packs element j into nibble j % 2 of byte j / 2; GGUF MXFP4 puts
// element j < 16 in the low nibble of byte j and j + 16 in its high nibble.
TEST(RefMicroscaling, HandBuiltOrders) {
  std::vector<uint8_t> codes(16), sc = {127};
  codes[0] = 0x72;  // element 0: code 2 (1.0), element 1: code 7 (6.0)
  codes[15] = 0x9f;  // element 30: code 15 (−6), element 31: code 9 (−0.5)
  WeightView w{DType::kMlxMXFP4, 1, 32, codes.data(), sc.data(), nullptr, DType::kU8, 0, 32};
  std::vector<float> out(32);
  ref::dequant_row_mlx_mxfp4(w, 0, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[30], -6.0f);
  EXPECT_EQ(out[31], -0.5f);
  std::vector<uint8_t> blk(17);
  blk[0] = 129;     // 2^(129−128) = 2
  blk[1] = 0x72;    // element 0: code 2 → 2·2 = 4; element 16: code 7 → 12·2 = 24
  blk[16] = 0x9f;   // element 15: code 15 → −24; element 31: code 9 → −2
  ref::dequant_mxfp4(blk.data(), 1, out.data());
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[16], 24.0f);
  EXPECT_EQ(out[15], -24.0f);
  EXPECT_EQ(out[31], -2.0f);
}

TEST(RefMicroscaling, DecodesLikeMlxAndGgufPy) {
  const std::vector<MxCase> cases = mx_cases();
  ASSERT_FALSE(cases.empty());
  for (const MxCase& c : cases) {
    SCOPED_TRACE(c.stem);
    const std::vector<float> want = floats(testing::read_bytes(c.stem + ".f32", "microscaling_ref"));
    ASSERT_EQ(static_cast<int64_t>(want.size()), c.rows * c.cols);
    std::vector<uint8_t> data, scales;
    WeightView w;
    w.dtype = c.dtype;
    w.rows = c.rows;
    w.cols = c.cols;
    if (c.dtype == DType::kMXFP4) {
      data = testing::read_bytes(c.stem + ".bin", "microscaling_ref");
    } else {
      data = testing::read_bytes(c.stem + ".codes", "microscaling_ref");
      scales = testing::read_bytes(c.stem + ".scales", "microscaling_ref");
      w.scales = scales.data();
      w.scale_dtype = DType::kU8;
      w.group_size = mlx_microscaling_group(c.dtype);
    }
    w.data = data.data();
    ASSERT_EQ(data.size(), c.rows * w.row_bytes());
    ASSERT_TRUE(weight_supported(w));
    std::vector<float> row(static_cast<size_t>(c.cols));
    int64_t bad = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      kernels::dequant_row(w, r, row.data());  // the active table's row lookup (embedding path)
      std::vector<float> ref_row(row.size());
      ref_table().dequant_row[static_cast<int>(c.dtype)](w, r, ref_row.data());
      for (int64_t j = 0; j < c.cols; ++j) {
        const float g = want[static_cast<size_t>(r * c.cols + j)];
        if (!(ref_row[static_cast<size_t>(j)] == g || (std::isinf(g) && ref_row[static_cast<size_t>(j)] == g))) ++bad;
        if (row[static_cast<size_t>(j)] != ref_row[static_cast<size_t>(j)]) ++bad;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// The reference matmul over these rows is the generic one (a double dot over the decoded row).
TEST(RefMicroscaling, MatmulIsTheDecodedDot) {
  for (const MxCase& c : mx_cases()) {
    if (c.kind != "raw" || c.rows < 3) continue;
    SCOPED_TRACE(c.stem);
    std::vector<uint8_t> data = testing::read_bytes(c.stem + (c.dtype == DType::kMXFP4 ? ".bin" : ".codes"), "microscaling_ref");
    std::vector<uint8_t> scales;
    WeightView w{c.dtype, c.rows, c.cols, data.data()};
    if (c.dtype != DType::kMXFP4) {
      scales = testing::read_bytes(c.stem + ".scales", "microscaling_ref");
      w.scales = scales.data();
      w.scale_dtype = DType::kU8;
      w.group_size = mlx_microscaling_group(c.dtype);
    }
    const std::vector<float> want = floats(testing::read_bytes(c.stem + ".f32", "microscaling_ref"));
    std::mt19937_64 rng(7);
    const int64_t n = 3;
    const std::vector<float> x = testing::randn(static_cast<size_t>(n * c.cols), rng);
    std::vector<float> y(static_cast<size_t>(n * c.rows));
    ref_table().matmul[static_cast<int>(c.dtype)](w, x.data(), n, y.data());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < c.rows; ++r) {
        double acc = 0;
        for (int64_t j = 0; j < c.cols; ++j) acc += double(want[static_cast<size_t>(r * c.cols + j)]) * x[static_cast<size_t>(t * c.cols + j)];
        EXPECT_EQ(y[static_cast<size_t>(t * c.rows + r)], static_cast<float>(acc)) << "t " << t << " r " << r;
      }
  }
}

// A view the kernels cannot run is refused at load: no scales, a wrong group, a ragged row.
TEST(RefMicroscaling, WeightSupportedChecksTheView) {
  uint8_t s[4] = {};
  EXPECT_TRUE(weight_supported(WeightView{DType::kMlxMXFP4, 1, 64, s, s, nullptr, DType::kU8, 0, 32}));
  EXPECT_FALSE(weight_supported(WeightView{DType::kMlxMXFP4, 1, 64, s, nullptr, nullptr, DType::kU8, 0, 32}));
  EXPECT_FALSE(weight_supported(WeightView{DType::kMlxMXFP4, 1, 64, s, s, nullptr, DType::kU8, 0, 16}));
  EXPECT_FALSE(weight_supported(WeightView{DType::kMlxNVFP4, 1, 48, s, s, nullptr, DType::kU8, 0, 16}));
  EXPECT_FALSE(weight_supported(WeightView{DType::kMlxMXFP8, 1, 64, s, s, nullptr, DType::kF16, 0, 32}));
  EXPECT_TRUE(weight_supported(WeightView{DType::kMXFP4, 1, 64, s}));
  EXPECT_FALSE(weight_supported(WeightView{DType::kMXFP4, 1, 48, s}));
}

}  // namespace
}  // namespace larder::kernels
