// WeightBinder::experts (models/weights.h): routed experts bound in place from a GGUF's stacked
// `ffn_*_exps`, an MLX checkpoint's stacked (and affine-quantized) `switch_mlp.*`, and an HF
// checkpoint's one tensor per expert — each expert's rows against the writing tool's own
// dequantization (fixture tests/ref/moe_experts_reference.py: gguf-py, mlx, safetensors layout) —
// and the errors for shapes that disagree with the config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "larder/formats/model_files.h"
#include "larder/kernels/moe.h"
#include "larder/kernels/ops.h"
#include "larder/models/weights.h"

namespace larder::models {
namespace {

const std::string kDir = std::string(LARDER_TEST_DATA_DIR) + "/moe_experts/";
constexpr int E = 4;
constexpr int64_t H = 256, I = 64;

std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path << " (fixture moe_experts_ref did not run?)";
  std::vector<char> b{std::istreambuf_iterator<char>(f), {}};
  std::vector<float> v(b.size() / 4);
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// The TensorNames an MoE architecture would declare: HF's stacked MLX names → GGUF's.
TensorNames moe_names() {
  TensorNames n;
  n.layer = {{"mlp.switch_mlp.gate_proj.weight", "ffn_gate_exps.weight"},
             {"mlp.switch_mlp.up_proj.weight", "ffn_up_exps.weight"},
             {"mlp.switch_mlp.down_proj.weight", "ffn_down_exps.weight"}};
  return n;
}

std::string stacked(const std::string& proj) { return "model.layers.0.mlp.switch_mlp." + proj + ".weight"; }
std::string per_expert(const std::string& proj) { return "model.layers.0.mlp.experts.{i}." + proj + ".weight"; }

WeightBinder::ExpertsSpec spec(const std::string& stacked, const std::string& per_expert, int n, int64_t rows,
                               int64_t cols) {
  WeightBinder::ExpertsSpec s;
  s.stacked = stacked;
  s.per_expert = per_expert;
  s.n_experts = n;
  s.rows = rows;
  s.cols = cols;
  return s;
}

// Every row of every expert, dequantized through the bound view, equals the oracle's [E, rows, cols].
void expect_experts(const std::vector<kernels::WeightView>& ws, const std::string& oracle, int64_t rows, int64_t cols,
                    double tol) {
  const std::vector<float> want = read_f32(oracle);
  ASSERT_EQ(ws.size(), static_cast<size_t>(E));
  ASSERT_EQ(want.size(), static_cast<size_t>(E * rows * cols)) << oracle;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(ws[e].rows, rows);
    EXPECT_EQ(ws[e].cols, cols);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::dequant_row(ws[e], r, row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const float w = want[static_cast<size_t>((e * rows + r) * cols + c)];
        ASSERT_LE(std::fabs(row[static_cast<size_t>(c)] - w), tol * (1 + std::fabs(w)))
            << oracle << " expert " << e << " row " << r << " col " << c;
      }
    }
  }
}

struct Opened {
  formats::ModelFiles files;
  TensorNames names = moe_names();
};

std::unique_ptr<Opened> open(const std::string& path) {
  auto o = std::make_unique<Opened>();
  auto f = formats::open_model_files(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (f.is_ok()) o->files = std::move(f.value());
  return o;
}

// GGUF block and plain formats decode bit-exactly like gguf-py (kernels/ref): exact.
TEST(ExpertsBinder, GgufStackedExps) {
  auto o = open(kDir + "gguf/experts.gguf");
  WeightBinder b(o->files, o->names);
  for (const auto& [proj, file, rows, cols] : {std::tuple{"gate_proj", "ffn_gate_exps", I, H},
                                               std::tuple{"up_proj", "ffn_up_exps", I, H},
                                               std::tuple{"down_proj", "ffn_down_exps", H, I}}) {
    auto ws = b.experts(spec(stacked(proj), "", E, rows, cols), "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    expect_experts(ws.value(), kDir + "gguf/" + file + ".f32", rows, cols, 0.0);
  }
  EXPECT_TRUE(b.unbound().empty());
  EXPECT_EQ(b.weight_dtypes(), "F16+Q4_0+Q4_K");
  EXPECT_EQ(b.n_params(), 3 * E * H * I);
}

// MLX affine: mlx dequantizes as scale·q + bias in f32 (the reference may fuse it): within 1 ulp.
TEST(ExpertsBinder, MlxStackedSwitchMlp) {
  auto o = open(kDir + "mlx");
  WeightBinder b(o->files, o->names);
  for (const auto& [proj, rows, cols] : {std::tuple{"gate_proj", I, H}, std::tuple{"up_proj", I, H},
                                         std::tuple{"down_proj", H, I}}) {
    auto ws = b.experts(spec(stacked(proj), per_expert(proj), E, rows, cols), "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    expect_experts(ws.value(), kDir + "mlx/" + proj + ".f32", rows, cols, 2e-7);
  }
  auto gate = b.experts(spec(stacked("gate_proj"), "", E, I, H), "test");
  ASSERT_TRUE(gate.is_ok());
  EXPECT_EQ(gate.value()[0].bits, 4);
  EXPECT_EQ(gate.value()[0].group_size, 64);
  auto up = b.experts(spec(stacked("up_proj"), "", E, I, H), "test");
  ASSERT_TRUE(up.is_ok());
  EXPECT_EQ(up.value()[0].bits, 8);  // the per-module entry of config.json
  EXPECT_EQ(up.value()[0].group_size, 32);
  EXPECT_TRUE(b.unbound().empty());
}

// MLX microscaling modes (gpt-oss's MLX experts are mxfp4): the top-level mode, a per-module
// nvfp4 entry, and an mxfp8 module inferred from its U8 scales; every value is exact in f32, so the
// rows equal mlx's dequantization.
TEST(ExpertsBinder, MlxMicroscalingSwitchMlp) {
  auto o = open(kDir + "mlx_fp");
  WeightBinder b(o->files, o->names);
  const struct {
    const char* proj;
    int64_t rows, cols;
    DType dtype;
  } cases[] = {{"gate_proj", I, H, DType::kMlxMXFP4}, {"up_proj", I, H, DType::kMlxNVFP4}, {"down_proj", H, I, DType::kMlxMXFP8}};
  for (const auto& c : cases) {
    auto ws = b.experts(spec(stacked(c.proj), per_expert(c.proj), E, c.rows, c.cols), "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    EXPECT_EQ(ws.value()[0].dtype, c.dtype) << c.proj;
    EXPECT_EQ(ws.value()[0].biases, nullptr) << c.proj;
    expect_experts(ws.value(), kDir + "mlx_fp/" + c.proj + ".f32", c.rows, c.cols, 0.0);
  }
  EXPECT_TRUE(b.unbound().empty());
  EXPECT_EQ(b.weight_dtypes(), "MLX_MXFP4+MLX_MXFP8+MLX_NVFP4");
}

// GGUF MXFP4 (ggml type 39): a block type like any other, decoded exactly like gguf-py.
TEST(ExpertsBinder, GgufMxfp4Exps) {
  auto o = open(kDir + "gguf_mxfp4/experts.gguf");
  WeightBinder b(o->files, o->names);
  for (const auto& [proj, file, rows, cols] : {std::tuple{"gate_proj", "ffn_gate_exps", I, H},
                                               std::tuple{"up_proj", "ffn_up_exps", I, H},
                                               std::tuple{"down_proj", "ffn_down_exps", H, I}}) {
    auto ws = b.experts(spec(stacked(proj), "", E, rows, cols), "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    EXPECT_EQ(ws.value()[0].dtype, DType::kMXFP4);
    expect_experts(ws.value(), kDir + "gguf_mxfp4/" + file + ".f32", rows, cols, 0.0);
  }
  EXPECT_EQ(b.weight_dtypes(), "MXFP4");
}

// HF: one BF16 tensor per expert, bound in place (the views point into the mapping).
TEST(ExpertsBinder, HfPerExpertTensors) {
  auto o = open(kDir + "hf");
  WeightBinder b(o->files, o->names);
  for (const auto& [proj, rows, cols] : {std::tuple{"gate_proj", I, H}, std::tuple{"up_proj", I, H},
                                         std::tuple{"down_proj", H, I}}) {
    auto ws = b.experts(spec(stacked(proj), per_expert(proj), E, rows, cols), "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    expect_experts(ws.value(), kDir + "hf/" + proj + ".f32", rows, cols, 0.0);
    const formats::TensorInfo* t = o->files.tensors().find("model.layers.0.mlp.experts.2." + std::string(proj) + ".weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(ws.value()[2].data, t->data);
  }
  EXPECT_TRUE(b.unbound().empty());
}

// Gemma 4's HF experts: gate and up fused along rows in one [E, 2·I, H] tensor, bound as two
// parts in place (mlx-lm splits it with mx.split: gate = the first I rows of each expert).
TEST(ExpertsBinder, Gemma4FusedGateUp) {
  auto o = open(kDir + "gemma4");
  WeightBinder b(o->files, o->names);
  const std::string gu = "model.layers.0.experts.gate_up_proj";
  const formats::TensorInfo* t = o->files.tensors().find(gu);
  ASSERT_NE(t, nullptr);
  for (int part : {0, 1}) {
    auto s = spec(gu, "", E, I, H);
    s.part = part;
    s.parts = 2;
    auto ws = b.experts(s, "test");
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    expect_experts(ws.value(), kDir + "gemma4/" + (part ? "up_proj" : "gate_proj") + ".f32", I, H, 0.0);
    EXPECT_EQ(ws.value()[1].data, t->data + (2 * I + part * I) * H * 2);  // in place
  }
  auto dn = b.experts(spec("model.layers.0.experts.down_proj", "", E, H, I), "test");
  ASSERT_TRUE(dn.is_ok()) << dn.status().to_string();
  expect_experts(dn.value(), kDir + "gemma4/down_proj.f32", H, I, 0.0);
  EXPECT_TRUE(b.unbound().empty());
  EXPECT_EQ(b.n_params(), 3 * E * H * I);
  auto bad = spec(gu, "", E, I, H);
  bad.parts = 3;  // the tensor holds two
  auto r = b.experts(bad, "test");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("expected [4, 192, 256]"), std::string::npos) << r.status().message();
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(ExpertsBinder, ShapeErrorsNameTensorAndShapes) {
  {
    auto o = open(kDir + "gguf/experts.gguf");
    WeightBinder b(o->files, o->names);
    auto r = b.experts(spec(stacked("gate_proj"), "", 8, I, H), "num_experts 8");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(r.status().message(), "blk.0.ffn_gate_exps.weight");
    EXPECT_HAS(r.status().message(), "[4, 64, 256]");
    EXPECT_HAS(r.status().message(), "expected [8, 64, 256]");
    EXPECT_HAS(r.status().message(), "num_experts 8");
    auto m = b.experts(spec("model.layers.1.mlp.switch_mlp.gate_proj.weight", "", E, I, H), "test");
    ASSERT_FALSE(m.is_ok());
    EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
    EXPECT_HAS(m.status().message(), "blk.1.ffn_gate_exps.weight");
  }
  {
    auto o = open(kDir + "mlx");
    WeightBinder b(o->files, o->names);
    auto r = b.experts(spec(stacked("gate_proj"), "", E, I + 8, H), "moe_intermediate_size 72");
    ASSERT_FALSE(r.is_ok());
    EXPECT_HAS(r.status().message(), "model.layers.0.mlp.switch_mlp.gate_proj.weight");
    EXPECT_HAS(r.status().message(), "has shape [4, 64, 32], expected [4, 72, 32]");
    auto d = b.experts(spec(stacked("down_proj"), "", E, H, I * 2), "test");
    ASSERT_FALSE(d.is_ok());
    EXPECT_HAS(d.status().message(), "has shape [4, 256, 64], expected [4, 256, 128]");
  }
  {
    auto o = open(kDir + "hf");
    WeightBinder b(o->files, o->names);
    auto r = b.experts(spec(stacked("gate_proj"), per_expert("gate_proj"), E + 1, I, H), "num_experts 5");
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_HAS(r.status().message(), "model.layers.0.mlp.experts.4.gate_proj.weight");
    auto s = b.experts(spec(stacked("gate_proj"), per_expert("gate_proj"), E, I, H * 2), "hidden_size 512");
    ASSERT_FALSE(s.is_ok());
    EXPECT_HAS(s.status().message(), "model.layers.0.mlp.experts.0.gate_proj.weight");
    EXPECT_HAS(s.status().message(), "expected [64, 512]");
  }
}

}  // namespace
}  // namespace larder::models
