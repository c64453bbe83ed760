// gpt-oss vs mlx-lm: tiny random checkpoints made by tests/ref/gpt_oss_reference.py with mlx-lm's own
// gpt_oss classes — mlx-lm's layout (stacked experts with biases), transformers' layout (interleaved
// gate_up_proj, in × out), other layer_types without rope scaling, MLX 4-bit, GGUF `gpt-oss` Q8_0 with
// llama.cpp's names — teacher-forced over 64 tokens: attention sinks, sliding windows of 8 and 5, yarn
// RoPE and its attention factor, biased router, clamped-SwiGLU experts with biases. Beyond parity:
// the layers it declares, decode after prefill and any prefill cut equal to all-at-once (the rings of
// the sliding layers crossed many times), a batch of sequences equal to each alone, yarn's inv_freq
// with transformers' truncate=false, GGUF MXFP4 experts, and OpenAI's own HF layout
// (gpt_oss_openai_mxfp4: `experts.*_blocks`/`_scales` quantized by mx.quantize(mode="mxfp4"), gate/up
// rows interleaved; the oracle is mlx-lm loading that very directory through its sanitize).
//
// Bounds as qwen3_moe_test.cpp: f32 max |diff| ≤ 1e-4 · max|logit|, top-1 identical; the quantized
// cases on a fast table against mlx-lm on int8-rounded activations ("int8acts") within 3e-2 and the
// margin rule. OpenAI's layout is held to the same pair as the GGUF MXFP4 case: on the reference
// table its experts are the exact e2m1 · 2^(e−127) values mlx dequantizes, so only f32 summation
// order differs (1e-4); the fast MLX mxfp4 kernels round the experts' inputs to int8 per 32-block,
// which the int8acts oracle does too, leaving accumulation order and rounding ties (3e-2).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/models/blocks/rope.h"
#include "larder/models/model.h"
#include "larder/models/registry.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

using test::run_chunks;
using test::with_table;
using Ref = test::RefLogits;

const test::FamilyFixture kFixture{"gpt_oss_ref"};
const std::string& kRoot = test::kModelFixtures;

TEST(GptOss, DeclaresSlidingAndFullLayersWithRoutedExperts) {
  struct Case {
    const char* dir;
    std::vector<bool> sliding;
    int64_t window;
  };
  const Case cases[] = {{"gpt_oss_f32", {true, false, true, false}, 8},
                        {"gpt_oss_openai_mxfp4", {true, false, true, false}, 8},
                        {"gpt_oss_hf_f32", {true, false, true, false}, 8},
                        {"gpt_oss_mlx4", {true, false, true, false}, 8},
                        {"gpt_oss_q8_0", {true, false, true, false}, 8},
                        {"gpt_oss_mxfp4_q8_0", {true, false, true, false}, 8},
                        {"gpt_oss_gguf_f32", {true, false, true, false}, 8},
                        {"gpt_oss_gguf_f16", {true, false, true, false}, 8},
                        {"gpt_oss_layers_f32", {false, true, true, false}, 5}};
  for (const Case& c : cases) {
    test::LoadedModel l = test::load_model(kFixture.model_path(c.dir));
    ASSERT_NE(l.model, nullptr) << c.dir;
    const Model& m = *l.model;
    EXPECT_FALSE(m.info().tied_embeddings) << c.dir;
    EXPECT_EQ(m.info().n_experts, 8) << c.dir;
    EXPECT_EQ(m.info().n_experts_used, 2) << c.dir;
    const auto layers = m.layers();
    ASSERT_EQ(layers.size(), 4u) << c.dir;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(layers[i].kind, c.sliding[i] ? LayerKind::kSliding : LayerKind::kFull) << c.dir << " layer " << i;
      if (c.sliding[i]) EXPECT_EQ(layers[i].window, c.window) << c.dir;
      EXPECT_EQ(layers[i].ffn, FfnKind::kRoutedExperts);
      EXPECT_EQ(layers[i].experts.ffn, 32);
    }
    EXPECT_GT(m.info().active_expert_bytes, 0u);
    EXPECT_EQ(m.info().active_expert_bytes, m.info().expert_bytes / 4) << c.dir;  // 2 of 8
  }
}

TEST(GptOss, TightAgainstMlxLm) {
  for (const char* dir_name : {"gpt_oss_f32", "gpt_oss_hf_f32", "gpt_oss_layers_f32", "gpt_oss_mlx4", "gpt_oss_q8_0",
                               "gpt_oss_mxfp4_q8_0", "gpt_oss_openai_mxfp4", "gpt_oss_gguf_f32", "gpt_oss_gguf_f16"}) {
    const std::string dir = kRoot + dir_name;
    const bool affine = std::string(dir_name).find("mlx4") != std::string::npos;
    const bool gguf = kFixture.model_path(dir_name).find(".gguf") != std::string::npos;
    const bool q8 = std::string(dir_name).find("q8_0") != std::string::npos;
    const Ref f32_ref = kFixture.ref(dir, gguf ? "deq" : "f32");
    ASSERT_EQ(f32_ref.tokens.size(), 64u);
    test::LoadedModel l = test::load_model(kFixture.model_path(dir_name));
    ASSERT_NE(l.model, nullptr);
    Model& m = *l.model;
    ASSERT_EQ(m.info().vocab, f32_ref.vocab);
    const kernels::KernelTable active = kernels::active_table();
    const bool loose_affine = affine && (active.matmul_affine[4] != kernels::ref_table().matmul_affine[4] ||
                                         active.matmul_affine[8] != kernels::ref_table().matmul_affine[8]);
    const bool loose_gguf = q8 && (active.matmul[static_cast<int>(DType::kQ8_0)] !=
                                       kernels::ref_table().matmul[static_cast<int>(DType::kQ8_0)] ||
                                   active.matmul[static_cast<int>(DType::kMXFP4)] !=
                                       kernels::ref_table().matmul[static_cast<int>(DType::kMXFP4)]);
    // F16 weights: the AVX-512 decode kernel rounds activations to f16 (kernels/batch_invariance.cpp),
    // so there the fast table is held to the quantized cases' bound and margin rule, without exact cuts.
    const bool f16 = std::string(dir_name).find("f16") != std::string::npos;
    const bool loose_f16 = f16 && active.matmul[static_cast<int>(DType::kF16)] !=
                                      kernels::ref_table().matmul[static_cast<int>(DType::kF16)];
    // OpenAI's MXFP4 experts run MLX mxfp4 kernels: on a fast table int8 activations per 32-block.
    const bool openai = std::string(dir_name).find("openai") != std::string::npos;
    const bool loose_mx = openai && active.matmul[static_cast<int>(DType::kMlxMXFP4)] !=
                                        kernels::ref_table().matmul[static_cast<int>(DType::kMlxMXFP4)];
    const bool loose = loose_affine || loose_gguf || loose_mx;
    const Ref int8_ref = loose ? kFixture.ref(dir, "int8acts") : Ref{};
    const std::vector<test::ParityRun> runs = {
        {"ref", &kernels::ref_table(), 1e-4f, &f32_ref, true},
        {active.name, &active, loose || loose_f16 ? 3e-2f : 1e-4f, loose ? &int8_ref : &f32_ref,
         !affine && !q8 && !loose_f16 && !loose_mx}};
    // Cuts inside and across the sliding window (8): each ring absorbs chunks longer and shorter than
    // its window.
    test::expect_parity_over_chunkings(m, dir_name, runs,
                                       {{64}, {1, 2, 3, 58}, {5, 7, 11, 13, 17, 11}, {9, 20, 3, 32}, test::decode_after_prefill(40, 64)});
  }
}

// Four sequences at different offsets stepped together: rings, sinks and routing are per row.
TEST(GptOss, BatchedEqualsAloneExactly) {
  for (const char* dir_name : {"gpt_oss_f32", "gpt_oss_layers_f32"}) {
    kFixture.expect_batched_equals_alone(dir_name,
                                         {{{1, 3, 1, 5}, {4, 1, 2, 1}, {1, 1, 1, 1}, {7, 2, 3, 1}, {6, 7, 7, 8}}});
  }
}

// The real gpt-oss rope_scaling (truncate false) gives transformers' inv_freq, not the truncated one
// mlx-lm and llama.cpp compute.
TEST(GptOss, YarnInvFreqMatchesTransformersWithoutTruncation) {
  const Ref ref = kFixture.ref(kRoot + "gpt_oss_f32");
  const auto& y = ref.meta["yarn_no_truncate"];
  ModelConfig c;
  c.head_dim = c.rope_dim = y["head_dim"].get<int64_t>();
  c.rope_theta = y["rope_theta"].get<double>();
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = y["factor"].get<double>();
  c.rope_scaling.original_max_position = y["original_max_position_embeddings"].get<int64_t>();
  c.rope_scaling.beta_fast = y["beta_fast"].get<double>();
  c.rope_scaling.beta_slow = y["beta_slow"].get<double>();
  c.rope_scaling.truncate = false;
  const std::vector<double> want = y["inv_freq"].get<std::vector<double>>();
  const std::vector<float> got = rope_inv_freq(c);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-7 * want[i]) << "pair " << i;
  // Truncated, the ramp moves from [8.09, 17.4] to [8, 18]: pair 12 by 3 %.
  c.rope_scaling.truncate = true;
  EXPECT_GT(std::abs(rope_inv_freq(c)[12] - got[12]), 1e-2 * got[12]);
  EXPECT_NEAR(rope_attention_factor(c), 1.0 + 0.1 * std::log(32.0), 1e-12);
}

// Bad configs and MXFP4 experts are refused naming what is wrong.
TEST(GptOss, BadConfigsAndMxfp4AreRefusedByName) {
  const std::string src = kRoot + "gpt_oss_f32";
  nlohmann::ordered_json base;
  {
    std::ifstream f(src + "/config.json");
    ASSERT_TRUE(f.good());
    base = nlohmann::ordered_json::parse(f);
  }
  struct Bad { const char* key; nlohmann::ordered_json value; const char* says; };
  const Bad bads[] = {{"num_experts_per_tok", 9, "num_experts_per_tok"},
                      {"num_local_experts", nullptr, "num_local_experts"},
                      {"sliding_window", 0, "sliding_window"},
                      {"layer_types", nlohmann::ordered_json::array({"full_attention"}), "layer_types"},
                      {"layer_types", nlohmann::ordered_json::array({"a", "b", "c", "d"}), "layer type"},
                      {"swiglu_limit", -1, "swiglu_limit"},
                      {"attention_bias", false, "attention_bias"},
                      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"truncate", "no"}}, "truncate"}};
  for (const Bad& b : bads) {
    auto files = formats::open_model_files(src);
    ASSERT_TRUE(files.is_ok());
    files->config = base;
    files->config[b.key] = b.value;
    auto m = Model::load(*files);
    ASSERT_FALSE(m.is_ok()) << b.key;
    EXPECT_NE(m.status().message().find(b.says), std::string::npos) << m.status().to_string();
  }
}

// yarn on the llama-family graph (qwen3): its inv_freq and the square of its attention factor on the
// softmax scale, as mlx-lm's YarnRoPE scales q and k.
TEST(GptOss, YarnOnTheLlamaFamilyMatchesMlxLm) {
  const std::string dir = kRoot + "qwen3_yarn_f32";
  const Ref ref = kFixture.ref(dir);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  with_table(kernels::ref_table(), [&] {
    const test::LogitDiff d = test::compare_logits(run_chunks(*l.model, ref.tokens, {64}), ref.logits, ref.vocab, 0);
    EXPECT_LE(d.max_abs, 1e-4f * d.max_ref);
    EXPECT_EQ(d.top1_mismatch, 0);
  });
}

// A copy of gpt_oss_openai_mxfp4 whose safetensors header gives `tensor` the shape `shape` (same
// bytes, so only the binder's shape check can object), and `config` as its config.json.
std::string openai_copy(const std::string& tag, const std::string& tensor, const std::vector<int64_t>& shape,
                        const nlohmann::ordered_json& config) {
  namespace fs = std::filesystem;
  const std::string src = kRoot + "gpt_oss_openai_mxfp4";
  const fs::path dst = fs::path(testing::TempDir()) / ("gpt_oss_openai_bad_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  std::ifstream in(src + "/model.safetensors", std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string hs(len, ' ');
  in.read(hs.data(), static_cast<std::streamsize>(len));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json h = nlohmann::ordered_json::parse(hs);
  if (!tensor.empty()) h[tensor]["shape"] = shape;
  hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  len = hs.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  std::ofstream(dst / "config.json") << config.dump(1);
  return dst.string();
}

// OpenAI's layout with a broken expert tensor or without its quantization_config: refused naming the
// tensor (or the config key) and the shape it should have.
TEST(GptOss, OpenAiMxfp4BadInputIsRefusedNamingTheTensor) {
  nlohmann::ordered_json config;
  {
    std::ifstream f(kRoot + "gpt_oss_openai_mxfp4/config.json");
    ASSERT_TRUE(f.good());
    config = nlohmann::ordered_json::parse(f);
  }
  nlohmann::ordered_json unquantized = config;
  unquantized.erase("quantization_config");
  struct Bad {
    const char* tag;
    std::string tensor;
    std::vector<int64_t> shape;
    nlohmann::ordered_json config;
    std::vector<std::string> says;
  };
  const std::string gu = "model.layers.1.mlp.experts.gate_up_proj_blocks";
  const Bad bads[] = {
      // The 16 bytes of a block flattened away: right bytes, wrong rank.
      {"rank", gu, {8, 64, 32}, config, {gu, "expected U8 [8, 64, 2, 16]"}},
      // gate and up as if not fused: half the rows, twice the blocks.
      {"rows", gu, {8, 32, 4, 16}, config, {gu, "expected U8 [8, 64, 2, 16]"}},
      {"scales", "model.layers.2.mlp.experts.down_proj_scales", {8, 32, 2}, config,
       {"model.layers.2.mlp.experts.down_proj_scales", "expected U8 [8, 64, 1]"}},
      {"noquant", "", {}, unquantized, {"model.layers.0.mlp.experts.gate_up_proj_blocks", "quant_method"}}};
  for (const Bad& b : bads) {
    const std::string dir = openai_copy(b.tag, b.tensor, b.shape, b.config);
    auto files = formats::open_model_files(dir);
    ASSERT_TRUE(files.is_ok()) << b.tag << ": " << files.status().to_string();
    auto m = Model::load(*files);
    ASSERT_FALSE(m.is_ok()) << b.tag;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().to_string();
    for (const std::string& say : b.says)
      EXPECT_NE(m.status().message().find(say), std::string::npos) << b.tag << ": " << m.status().to_string();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace larder::models
