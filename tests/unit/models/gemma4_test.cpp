// Gemma 4 beyond logit parity (arch_parity_test.cpp has that, against mlx-lm): the per-layer
// shapes it declares (head_dim and KV heads per layer kind, KV-sharing layers without state),
// the state they get, batching sequences whose shared rings sit at different offsets, and the
// refusal of the variants it does not run or configs it cannot read (gemma4_moe_test.cpp has the
// mixture-of-experts variant).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/models/model.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

const std::string& kRoot = test::kModelFixtures;

// gemma4_text: layers [s s F s s F], head_dim 16 / global 32, layers 4 and 5 share the K/V of
// layers 3 (sliding) and 2 (global). gemma4_keqv: [s F s s F], global layers k_eq_v with 2 KV
// heads and head_dim 16, sliding 1 KV head of 24.
TEST(Gemma4, DeclaresPerLayerShapes) {
  for (const char* dir : {"gemma4_text_f32", "gemma4_mm"}) {
    test::LoadedModel l = test::load_model(kRoot + dir);
    ASSERT_NE(l.model, nullptr) << dir;
    const auto layers = l.model->layers();
    ASSERT_EQ(layers.size(), 6u);
    const int src[] = {-1, -1, -1, -1, 3, 2};
    for (size_t i = 0; i < 6; ++i) {
      const bool global = i % 3 == 2;
      EXPECT_EQ(layers[i].kind, global ? LayerKind::kFull : LayerKind::kSliding) << dir << " layer " << i;
      EXPECT_EQ(layers[i].head_dim, global ? 32 : 16) << dir << " layer " << i;
      EXPECT_EQ(layers[i].rope, global ? 0 : 1);
      EXPECT_EQ(layers[i].kv_source, src[i]) << dir << " layer " << i;
      EXPECT_EQ(layers[i].attn_scale, 1.0f);
      EXPECT_TRUE(layers[i].norms.qk && layers[i].norms.v && layers[i].norms.post_attn && layers[i].norms.post_ffn);
      EXPECT_FALSE(layers[i].k_eq_v);
    }
    // State for the four layers that own it: three rings (0, 1, 3) and one plain global layer.
    const memory::StateSchema& s = l.model->state_schema();
    ASSERT_EQ(s.layers.size(), 4u) << dir;
    EXPECT_EQ(s.plain_layout().n_layers, 1);
    EXPECT_EQ(s.plain_layout().head_dim, 32);
    memory::SequenceState st = l.model->new_state(128);
    EXPECT_EQ(st.layers.size(), 3u);
    EXPECT_EQ(l.model->info().sliding_window, 8);
  }
  test::LoadedModel k = test::load_model(kRoot + "gemma4_keqv_f32");
  ASSERT_NE(k.model, nullptr);
  const auto layers = k.model->layers();
  ASSERT_EQ(layers.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const bool global = i == 1 || i == 4;
    EXPECT_EQ(layers[i].k_eq_v, global) << i;
    EXPECT_EQ(layers[i].n_kv_heads, global ? 2 : 1) << i;
    EXPECT_EQ(layers[i].head_dim, global ? 16 : 24) << i;
    EXPECT_EQ(layers[i].kv_source, -1);
  }
  EXPECT_FALSE(k.model->info().tied_embeddings);
}

// Two sequences in one forward_batch — their rings (and the copies the KV-sharing layers read)
// at different offsets and wrap points — give what each gives alone.
TEST(Gemma4, BatchedEqualsAlone) {
  const std::string dir = kRoot + "gemma4_text_f32";
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const std::vector<int32_t> toks = test::ref_tokens(dir, "gemma4_ref");
  ASSERT_EQ(toks.size(), 64u);
  const int64_t V = m.info().vocab;
  memory::SequenceState a = m.new_state(128), b = m.new_state(128), a1 = m.new_state(128), b1 = m.new_state(128);
  std::vector<float> la(V), lb(V), la1(V), lb1(V);
  ASSERT_TRUE(m.forward(toks.data(), 7, a, la.data(), false).is_ok());
  ASSERT_TRUE(m.forward(toks.data(), 7, a1, la1.data(), false).is_ok());
  float worst = 0, scale = 0;
  int64_t pa = 7, pb = 0;
  for (int step = 0; step < 10; ++step) {
    const int64_t na = 1 + step % 3, nb = 5;
    std::vector<BatchItem> items = {{toks.data() + pa, na, &a, la.data(), false},
                                    {toks.data() + 3 + pb, nb, &b, lb.data(), false}};
    ASSERT_TRUE(m.forward_batch(items).is_ok());
    ASSERT_TRUE(m.forward(toks.data() + pa, na, a1, la1.data(), false).is_ok());
    ASSERT_TRUE(m.forward(toks.data() + 3 + pb, nb, b1, lb1.data(), false).is_ok());
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max({worst, std::abs(la[v] - la1[v]), std::abs(lb[v] - lb1[v])});
      scale = std::max({scale, std::abs(la1[v]), std::abs(lb1[v])});
    }
    pa += na;
    pb += nb;
  }
  EXPECT_GT(scale, 0.0f);
  EXPECT_LE(worst, 1e-4f * scale);
}

// Variants this file does not run are refused at load, naming the feature.
TEST(Gemma4, RefusesIncompleteMoeAndUnknownRope) {
  namespace fs = std::filesystem;
  const std::string src = kRoot + "gemma4_text_f32";
  std::ifstream cf(src + "/config.json");
  ASSERT_TRUE(cf.good()) << "fixture gemma4_ref did not run";
  const nlohmann::json base = nlohmann::json::parse(cf);
  struct { const char* name; nlohmann::json patch; const char* want; } cases[] = {
      // enable_moe_block without moe_intermediate_size (mlx-lm has no default for it).
      {"moe", {{"enable_moe_block", true}, {"num_experts", 4}, {"top_k_experts", 2}}, "moe_intermediate_size"},
      {"moe_topk",
       {{"enable_moe_block", true}, {"num_experts", 4}, {"top_k_experts", 5}, {"moe_intermediate_size", 8}},
       "top_k_experts <= num_experts"},
      {"rope", {{"rope_parameters", {{"sliding_attention", {{"rope_type", "yarn"}, {"rope_theta", 1e4}}},
                                     {"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}}}}},
       "rope_type 'yarn'"},
      {"bidir", {{"use_bidirectional_attention", "all"}}, "use_bidirectional_attention"},
  };
  for (const auto& c : cases) {
    const fs::path d = fs::path(::testing::TempDir()) / (std::string("gemma4_refuse_") + c.name);
    fs::create_directories(d);
    nlohmann::json cfg = base;
    cfg.update(c.patch);
    std::ofstream(d / "config.json") << cfg.dump();
    fs::remove(d / "model.safetensors");
    fs::create_symlink(fs::path(src) / "model.safetensors", d / "model.safetensors");
    auto f = formats::open_model_files(d.string());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto m = Model::load(f.value());
    ASSERT_FALSE(m.is_ok()) << c.name;
    EXPECT_NE(m.status().to_string().find(c.want), std::string::npos) << m.status().to_string();
  }
}

// Issue 47 item 14: gemma4_keqv_f32 carries its own lm_head (config: tie_word_embeddings false).
// With the key removed (Gemma 4's default is tied) or set to true, the head is still the one
// used — transformers 5 keeps a checkpoint's head that differs from the embedding — so the
// logits stay mlx-lm's for the untied checkpoint.
TEST(Gemma4, CheckpointHeadIsUsedWhateverTheTieDefault) {
  namespace fs = std::filesystem;
  const std::string src = kRoot + "gemma4_keqv_f32";
  std::ifstream cf(src + "/config.json"), rf(src + "/ref.json");
  ASSERT_TRUE(cf.good() && rf.good()) << "fixture gemma4_ref did not run";
  const nlohmann::json base = nlohmann::json::parse(cf), ref = nlohmann::json::parse(rf);
  ASSERT_EQ(base.value("tie_word_embeddings", true), false);
  const std::vector<int32_t> toks = ref["tokens"].get<std::vector<int32_t>>();
  const int64_t V = ref["vocab"].get<int64_t>();
  std::vector<float> want(toks.size() * static_cast<size_t>(V));
  std::ifstream lf(src + "/" + ref["logits"]["f32"].get<std::string>(), std::ios::binary);
  lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * sizeof(float)));
  ASSERT_TRUE(lf.good());
  for (const char* variant : {"absent", "true"}) {
    const fs::path d = fs::path(::testing::TempDir()) / (std::string("gemma4_head_") + variant);
    fs::create_directories(d);
    nlohmann::json cfg = base;
    if (std::string(variant) == "absent") cfg.erase("tie_word_embeddings");
    else cfg["tie_word_embeddings"] = true;
    std::ofstream(d / "config.json") << cfg.dump();
    fs::remove(d / "model.safetensors");
    fs::create_symlink(fs::path(src) / "model.safetensors", d / "model.safetensors");
    test::LoadedModel l = test::load_model(d.string());
    ASSERT_NE(l.model, nullptr) << variant;
    EXPECT_FALSE(l.model->info().tied_embeddings) << variant;
    memory::SequenceState st = l.model->new_state(l.model->info().max_context);
    std::vector<float> got(want.size());
    ASSERT_TRUE(l.model->forward(toks.data(), static_cast<int64_t>(toks.size()), st, got.data(), true).is_ok());
    float worst = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    EXPECT_LE(worst, 1e-4f * scale) << variant;
    fs::remove_all(d);
  }
}

}  // namespace
}  // namespace larder::models
