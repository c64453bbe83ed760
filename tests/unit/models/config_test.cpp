// Hyper-parameter parsing (config.json variants) and RoPE frequency tables.
#include <gtest/gtest.h>

#include <cmath>

#include "larder/models/blocks/rope.h"
#include "larder/models/config.h"

namespace larder::models {
namespace {

using nlohmann::ordered_json;

Result<ModelConfig> parse(const ordered_json& cfg, const ordered_json& gen = nullptr) {
  formats::ModelFiles f;
  f.path = "/m";
  f.config = cfg;
  f.generation_config = gen;
  return config_from_hf(f);
}

ordered_json base() {
  return {{"model_type", "llama"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"intermediate_size", 96},
          {"num_attention_heads", 8}, {"vocab_size", 100}};
}

TEST(Config, DefaultsAndNulls) {
  auto c = base();
  c["head_dim"] = nullptr;  // HF writes null for "derive it"
  auto r = parse(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->n_kv_heads, 8);  // absent: MHA
  EXPECT_EQ(r->head_dim, 8);
  EXPECT_EQ(r->rope_dim, 8);
  EXPECT_EQ(r->rope_theta, 10000.0);
  EXPECT_FALSE(r->tied_embeddings.has_value());  // the architecture decides
  EXPECT_TRUE(r->rope_scaling.type.empty());
}

TEST(Config, EosFromConfigAndGenerationConfig) {
  auto c = base();
  c["eos_token_id"] = {128001, 128009};
  c["bos_token_id"] = 128000;
  auto r = parse(c, {{"eos_token_id", {128009, 128008}}});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->eos_ids, (std::vector<int32_t>{128001, 128009, 128008}));
  EXPECT_EQ(r->bos_id, 128000);
}

TEST(Config, RopeVariants) {
  auto c = base();
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // pre-"rope_type" spelling
  c["partial_rotary_factor"] = 0.5;
  auto r = parse(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->rope_scaling.type, "linear");
  EXPECT_EQ(r->rope_dim, 4);
  auto t = base();
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};  // transformers >= 5
  auto r2 = parse(t);
  ASSERT_TRUE(r2.is_ok());
  EXPECT_EQ(r2->rope_theta, 1e6);
  EXPECT_TRUE(r2->rope_scaling.type.empty());
}

TEST(Config, Rejections) {
  auto c = base();
  c["num_attention_heads"] = 0;
  EXPECT_FALSE(parse(c).is_ok());
  c = base();
  c["vocab_size"] = "many";
  auto r = parse(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'vocab_size' must be an integer"), std::string::npos);
  c = base();
  c["head_dim"] = 7;
  EXPECT_FALSE(parse(c).is_ok());  // odd rotary dims
}

TEST(Rope, PlainAndLinear) {
  ModelConfig c;
  c.rope_dim = 8;
  c.rope_theta = 10000;
  auto f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f[i], static_cast<float>(std::pow(10000.0, -2.0 * i / 8)));
  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4;
  auto g = rope_inv_freq(c);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(g[i], f[i] / 4);
}

// Llama 3.1 8B's table (theta 5e5, factor 8, low 1, high 4, original 8192, head_dim 128): the
// three bands by wavelength λ = 2π/inv_freq.
TEST(Rope, Llama3Bands) {
  ModelConfig c;
  c.rope_dim = 128;
  c.rope_theta = 500000;
  auto plain = rope_inv_freq(c);
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  auto s = rope_inv_freq(c);
  int hi = 0, lo = 0, mid = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double wl = 2 * M_PI / plain[i];
    if (wl < 8192 / 4.0) {
      EXPECT_EQ(s[i], plain[i]);
      ++hi;
    } else if (wl > 8192 / 1.0) {
      EXPECT_FLOAT_EQ(s[i], plain[i] / 8);
      ++lo;
    } else {
      const double sm = (8192 / wl - 1) / (4 - 1);
      EXPECT_NEAR(s[i], (1 - sm) * plain[i] / 8 + sm * plain[i], 1e-6 * plain[i]);
      EXPECT_LT(s[i], plain[i]);
      EXPECT_GT(s[i], plain[i] / 8);
      ++mid;
    }
  }
  EXPECT_GT(hi, 0);
  EXPECT_GT(lo, 0);
  EXPECT_GT(mid, 0);
}

// MLX `quantization` block (quantization.md §3.2–3.3).
TEST(Config, QuantizationBlockShapes) {
  auto c = base();
  auto r = parse(c);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(r->quantization.present);
  c["quantization"] = {{"group_size", 32},
                       {"bits", 3},  // pre-2025 files: no "mode"
                       {"model.layers.0.mlp.down_proj", {{"bits", 8}, {"group_size", 128}, {"mode", "affine"}}},
                       {"model.layers.0.mlp.up_proj", false},
                       {"model.layers.1.mlp.up_proj", true},
                       {"lm_head", {{"bits", 6}, {"group_size", nullptr}}}};  // null: mlx-lm's default 64
  r = parse(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const QuantizationConfig& q = r->quantization;
  EXPECT_TRUE(q.present);
  EXPECT_EQ(q.global.bits, 3);
  EXPECT_EQ(q.global.group_size, 32);
  ASSERT_EQ(q.modules.size(), 4u);
  EXPECT_EQ(q.modules.at("model.layers.0.mlp.down_proj")->bits, 8);
  EXPECT_EQ(q.modules.at("model.layers.0.mlp.down_proj")->group_size, 128);
  EXPECT_FALSE(q.modules.at("model.layers.0.mlp.up_proj").has_value());
  EXPECT_EQ(q.modules.at("model.layers.1.mlp.up_proj")->bits, 3);  // true: the top-level params
  EXPECT_EQ(q.modules.at("lm_head")->bits, 6);
  EXPECT_EQ(q.modules.at("lm_head")->group_size, 64);
  // The HF-style twin alone is read the same way; `quantization` wins when both exist.
  auto t = base();
  t["quantization_config"] = {{"group_size", 128}, {"bits", 8}};
  r = parse(t);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->quantization.global.bits, 8);
  t["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
  r = parse(t);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->quantization.global.bits, 4);
}

// The microscaling float modes, globally and per module, as mlx-lm writes and reads them: an
// entry's dict is to_quantized(**entry), so a missing mode is affine and missing bits/group_size
// are the entry's mode's defaults.
TEST(Config, QuantizationModes) {
  auto c = base();
  c["quantization"] = {{"group_size", 32},
                       {"bits", 4},
                       {"mode", "mxfp4"},
                       {"model.layers.0.mlp.down_proj", {{"mode", "mxfp8"}}},
                       {"model.layers.0.mlp.up_proj", {{"group_size", 16}, {"bits", 4}, {"mode", "nvfp4"}}},
                       {"model.layers.0.self_attn.q_proj", {{"bits", 8}, {"group_size", 64}}},
                       {"model.layers.1.mlp.up_proj", true}};
  auto r = parse(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const QuantizationConfig& q = r->quantization;
  EXPECT_EQ(q.global, (AffineParams{4, 32, QuantMode::kMxfp4}));
  EXPECT_EQ(*q.modules.at("model.layers.0.mlp.down_proj"), (AffineParams{8, 32, QuantMode::kMxfp8}));
  EXPECT_EQ(*q.modules.at("model.layers.0.mlp.up_proj"), (AffineParams{4, 16, QuantMode::kNvfp4}));
  EXPECT_EQ(*q.modules.at("model.layers.0.self_attn.q_proj"), (AffineParams{8, 64, QuantMode::kAffine}));
  EXPECT_EQ(*q.modules.at("model.layers.1.mlp.up_proj"), q.global);
  EXPECT_STREQ(quant_mode_name(QuantMode::kNvfp4), "nvfp4");
  EXPECT_EQ(quant_mode_from_name("mxfp8"), QuantMode::kMxfp8);
  EXPECT_FALSE(quant_mode_from_name("fp8").has_value());
}

TEST(Config, QuantizationBlockErrors) {
  const std::pair<ordered_json, const char*> bads[] = {
      {{{"bits", 4}}, "needs top-level 'bits' and 'group_size'"},
      {{{"group_size", 64}, {"bits", 4}, {"mode", "nvfp4"}}, "mode 'nvfp4' with bits 4, group_size 64 is not supported"},
      {{{"group_size", 32}, {"bits", 4}, {"mode", "fp6"}}, "mode 'fp6' is not supported"},
      {{{"group_size", 16}, {"bits", 4}, {"mode", "nvfp4"}, {"lm_head", {{"mode", "nvfp4"}, {"global_scale", true}}}},
       "'quantization.lm_head' has 'global_scale'"},
      {{{"group_size", 48}, {"bits", 4}}, "group_size 48 is not supported (supported: 32, 64, 128)"},
      {{{"group_size", 64}, {"bits", 1}}, "bits 1 is not supported (supported: 2, 3, 4, 5, 6, 8)"},
      {{{"group_size", 64}, {"bits", 4}, {"lm_head", {{"bits", 4}, {"mode", "mxfp8"}}}},
       "'quantization.lm_head' mode 'mxfp8' with bits 4, group_size 32 is not supported (mxfp8 is bits 8, group_size 32)"},
      {{{"group_size", 64}, {"bits", "four"}}, "key 'bits' must be an integer"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}, "quant_method \"awq\" is not supported"},
  };
  for (const auto& [block, says] : bads) {
    auto c = base();
    c["quantization"] = block;
    auto r = parse(c);
    ASSERT_FALSE(r.is_ok()) << block.dump();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("/m/config.json"), std::string::npos) << r.status().message();
  }
  auto c = base();
  c["quantization"] = 4;
  EXPECT_FALSE(parse(c).is_ok());
}

}  // namespace
}  // namespace larder::models
