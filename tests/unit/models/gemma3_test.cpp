// Gemma 3 beyond logit parity (arch_parity_test.cpp has that): the layers it declares, the
// per-sequence state they get (a ring of the window for sliding layers, whatever the context),
// and batching sequences whose rings sit at different offsets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/models/model.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

const std::string& kRoot = test::kModelFixtures;

TEST(Gemma3, DeclaresSlidingAndGlobalLayers) {
  struct { const char* dir; const char* file; int64_t window; } cases[] = {
      {"gemma3_text_f32", "", 8}, {"gemma3_ltypes_f32", "", 13}, {"gemma3_mm", "", 8}, {"gemma3_q8_0", "/model.gguf", 8}};
  for (const auto& c : cases) {
    test::LoadedModel l = test::load_model(kRoot + c.dir + c.file);
    ASSERT_NE(l.model, nullptr) << c.dir;
    const auto layers = l.model->layers();
    ASSERT_EQ(layers.size(), 6u);
    for (size_t i = 0; i < layers.size(); ++i) {
      // Pattern 3 (HF: sliding_window_pattern / layer_types). The GGUF carries no pattern key:
      // llama.cpp's default of 6 applies, so only layer 5 is global there.
      const bool global = std::string(c.file).empty() ? (i + 1) % 3 == 0 : i == 5;
      EXPECT_EQ(layers[i].kind, global ? LayerKind::kFull : LayerKind::kSliding) << c.dir << " layer " << i;
      EXPECT_EQ(layers[i].rope, global ? 0 : 1) << c.dir;
      EXPECT_TRUE(layers[i].norms.qk && layers[i].norms.post_attn && layers[i].norms.post_ffn);
    }
    EXPECT_EQ(l.model->info().sliding_window, c.window) << c.dir;
    EXPECT_TRUE(l.model->info().tied_embeddings);
  }
}

// A sliding layer's state holds its window, not the context: after 64 tokens each ring is
// window × kv_row × (K + V) floats, while the global layers' plain KV holds all 64 tokens.
TEST(Gemma3, SlidingStateStaysAtItsWindow) {
  const std::string dir = kRoot + "gemma3_text_f32";
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const std::vector<int32_t> toks = test::ref_tokens(dir, "gemma3_ref");
  ASSERT_EQ(toks.size(), 64u);
  memory::SequenceState st = m.new_state(m.info().max_context);
  std::vector<float> logits(static_cast<size_t>(m.info().vocab));
  ASSERT_EQ(st.layers.size(), 4u);  // four sliding layers of six
  const size_t ring_bytes = 8 * m.info().n_kv_heads * m.info().head_dim * 2 * sizeof(float);
  for (size_t at = 0; at < toks.size(); at += 16) {
    ASSERT_TRUE(m.forward(toks.data() + at, 16, st, logits.data(), false).is_ok());
    for (const auto& r : st.layers) {
      EXPECT_EQ(r->kind(), memory::StateKind::kRing);
      EXPECT_EQ(r->offset(), static_cast<int64_t>(at + 16));
      EXPECT_EQ(r->resident_bytes(), ring_bytes);
    }
  }
  EXPECT_EQ(st.kv.layout().n_layers, 2);
  EXPECT_EQ(st.length(), 64);
  EXPECT_FALSE(st.layers[0]->trimmable()) << "a wrapped ring cannot forget tokens";
  EXPECT_FALSE(st.trim(40).is_ok());
  // A state of another model's schema is refused before anything runs.
  memory::SequenceState plain(memory::KvLayout{6, 1, 16}, 128);
  EXPECT_FALSE(m.forward(toks.data(), 1, plain, logits.data(), false).is_ok());
}

// Two sequences in one forward_batch, their rings at different offsets and wrap points, give
// what each gives alone.
TEST(Gemma3, BatchedEqualsAlone) {
  const std::string dir = kRoot + "gemma3_ltypes_f32";
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const std::vector<int32_t> toks = test::ref_tokens(dir, "gemma3_ref");
  ASSERT_EQ(toks.size(), 64u);
  const int64_t V = m.info().vocab;
  memory::SequenceState a = m.new_state(128), b = m.new_state(128), a1 = m.new_state(128), b1 = m.new_state(128);
  std::vector<float> la(V), lb(V), la1(V), lb1(V);
  ASSERT_TRUE(m.forward(toks.data(), 7, a, la.data(), false).is_ok());
  ASSERT_TRUE(m.forward(toks.data(), 7, a1, la1.data(), false).is_ok());
  float worst = 0, scale = 0;
  int64_t pa = 7, pb = 0;
  for (int step = 0; step < 12; ++step) {
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
  EXPECT_LE(worst, 1e-4f * scale);
}

}  // namespace
}  // namespace larder::models
