// Qwen3-MoE (routed experts) vs mlx-lm: tiny random checkpoints made by
// tests/ref/qwen3_moe_reference.py with mlx-lm's own qwen3_moe classes — HF per-expert tensors with a
// dense layer (mlp_only_layers), decoder_sparse_step 2 without renormalisation, MLX 4-bit with the
// experts stacked (switch_mlp), GGUF `qwen3moe` Q8_0 with llama.cpp's names — teacher-forced over
// 64 tokens; and the MoE variant of Qwen3.5 (mlx-lm qwen3_5_moe: hybrid layers, routed experts
// plus a sigmoid-gated shared expert) as HF (fused experts.gate_up_proj), MLX 4-bit and GGUF
// `qwen35moe`. Beyond parity: the layers it declares, decode after prefill and any prefill cut equal
// to all-at-once, a batch of sequences routed to different experts equal to each alone, and a
// decode step that never touches the experts its token is not routed to.
//
// Bounds as qwen3_5_test.cpp: f32 max |diff| ≤ 1e-4 · max|logit|, top-1 identical; the quantized
// cases on a fast table (int8-quantized activations) against mlx-lm on int8-rounded activations
// ("int8acts") within arch_parity_test's 3e-2 and its margin rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "larder/kernels/dispatch.h"
#include "larder/models/model.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

using test::run_chunks;
using test::with_table;
using Ref = test::RefLogits;

const test::FamilyFixture kFixture{"qwen3_moe_ref"};
const std::string& kRoot = test::kModelFixtures;

TEST(Qwen3Moe, DeclaresRoutedAndDenseLayers) {
  struct Case {
    const char* dir;
    std::vector<bool> routed;
    int E, k;
    bool tied;
  };
  const Case cases[] = {{"qwen3_moe_f32", {true, true, false, true}, 8, 2, false},
                        {"qwen3_moe_mlx4", {true, true, false, true}, 8, 2, false},
                        {"qwen3_moe_step2_f32", {false, true, false, true}, 6, 3, true},
                        {"qwen3_moe_q8_0", {true, true, true, true}, 8, 2, false}};
  for (const Case& c : cases) {
    test::LoadedModel l = test::load_model(kFixture.model_path(c.dir));
    ASSERT_NE(l.model, nullptr) << c.dir;
    const Model& m = *l.model;
    const ModelInfo& i = m.info();
    EXPECT_EQ(i.tied_embeddings, c.tied) << c.dir;
    EXPECT_EQ(i.n_experts, c.E) << c.dir;
    EXPECT_EQ(i.n_experts_used, c.k) << c.dir;
    const auto layers = m.layers();
    ASSERT_EQ(layers.size(), 4u);
    int64_t routed = 0;
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_EQ(layers[j].ffn, c.routed[j] ? FfnKind::kRoutedExperts : FfnKind::kDense) << c.dir << " layer " << j;
      EXPECT_EQ(layers[j].kind, LayerKind::kFull);
      EXPECT_TRUE(layers[j].norms.qk);
      if (c.routed[j]) {
        ++routed;
        EXPECT_EQ(layers[j].experts.n_experts, c.E);
        EXPECT_EQ(layers[j].experts.k, c.k);
        EXPECT_EQ(layers[j].experts.ffn, 32);
      }
    }
    // Every expert's gate/up/down is counted once; a token reads k of E of them.
    ASSERT_GT(i.expert_bytes, 0u) << c.dir;
    EXPECT_EQ(i.active_expert_bytes, i.expert_bytes / static_cast<uint64_t>(c.E) * static_cast<uint64_t>(c.k)) << c.dir;
    if (std::string(c.dir).find("f32") != std::string::npos) {
      EXPECT_EQ(i.expert_bytes, static_cast<uint64_t>(routed * c.E * 3 * 32 * 64 * 4)) << c.dir;
    }
  }
}

TEST(Qwen3Moe, TightAgainstMlxLm) {
  for (const char* dir_name : {"qwen3_moe_f32", "qwen3_moe_step2_f32", "qwen3_moe_mlx4", "qwen3_moe_q8_0",
                               "qwen3_5_moe_f32", "qwen3_5_moe_mlx4", "qwen3_5_moe_q8_0"}) {
    kFixture.expect_tight_against_oracle(
        dir_name, {{64}, {1, 2, 3, 58}, {5, 7, 11, 13, 17, 11}, test::decode_after_prefill(40, 64)});
  }
}

// Four sequences at different offsets (prefilled alone to 9, 16, 23, 30 tokens), then stepped
// together in one forward_batch with different chunk sizes per step — the last step large enough
// that some experts get more than 8 rows in the batch (the grouped kernel's GEMM path) while each
// sequence alone stays on the decode path. Each equals what it gives alone, bit for bit, on the
// reference table and on the active one (f32 weights: row-invariant kernels).
TEST(Qwen3Moe, BatchedEqualsAloneExactly) {
  const std::string dir = kRoot + "qwen3_moe_f32";
  const Ref ref = kFixture.ref(dir);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const std::vector<int32_t>& toks = ref.tokens;
  // The sequences' rows of each step are routed to different experts (mlx-lm's choice, layer 0):
  // the batch really mixes expert groups.
  {
    const auto& r0 = ref.meta["routes"]["0"];
    std::set<std::vector<int>> firsts;
    for (int i = 0; i < 4; ++i) firsts.insert(r0[static_cast<size_t>(9 + 7 * i)].get<std::vector<int>>());
    ASSERT_GE(firsts.size(), 3u) << "the fixture's sequences should start on different experts";
  }
  test::expect_batched_equals_alone(m, toks, {{{1, 3, 1, 5}, {4, 1, 2, 1}, {1, 1, 1, 1}, {7, 2, 3, 1}, {6, 7, 7, 8}}},
                                    "qwen3_moe");
}

// A decode step reads only the experts its token is routed to: with every other expert's weights
// NaN (qwen3_moe_poisoned, the experts mlx-lm's router does not pick for token 63 in each layer),
// decoding token 63 after a clean prefill of 0..62 gives the clean model's logits bit for bit — a
// NaN read by any matmul would reach them.
TEST(Qwen3Moe, DecodeTouchesOnlyTheSelectedExperts) {
  const Ref ref = kFixture.ref(kRoot + "qwen3_moe_f32");
  test::LoadedModel clean = test::load_model(kRoot + "qwen3_moe_f32");
  test::LoadedModel poisoned = test::load_model(kRoot + "qwen3_moe_poisoned");
  ASSERT_NE(clean.model, nullptr);
  ASSERT_NE(poisoned.model, nullptr);
  const int64_t V = clean.model->info().vocab;
  for (const kernels::KernelTable* table : {&kernels::ref_table(), &kernels::active_table()}) {
    const kernels::KernelTable t = *table;
    with_table(t, [&] {
      std::vector<float> lg(static_cast<size_t>(V)), want(static_cast<size_t>(V)), got(static_cast<size_t>(V));
      memory::SequenceState a = clean.model->new_state(128), b = clean.model->new_state(128);
      ASSERT_TRUE(clean.model->forward(ref.tokens.data(), 63, a, lg.data(), false).is_ok());
      ASSERT_TRUE(clean.model->forward(ref.tokens.data(), 63, b, lg.data(), false).is_ok());
      ASSERT_TRUE(clean.model->forward(ref.tokens.data() + 63, 1, a, want.data(), false).is_ok());
      ASSERT_TRUE(poisoned.model->forward(ref.tokens.data() + 63, 1, b, got.data(), false).is_ok());
      EXPECT_EQ(got, want) << t.name;
      // And the poison is live: a token routed elsewhere does see it.
      memory::SequenceState c = poisoned.model->new_state(128);
      ASSERT_TRUE(poisoned.model->forward(ref.tokens.data(), 63, c, lg.data(), false).is_ok());
      EXPECT_TRUE(std::any_of(lg.begin(), lg.end(), [](float v) { return std::isnan(v); })) << t.name;
    });
  }
}

// The MoE variant of Qwen3.5: hybrid mixers (gated DeltaNet / gated attention) as the dense
// family, every FFN routed experts plus the shared expert.
TEST(Qwen35Moe, DeclaresHybridLayersWithRoutedAndSharedExperts) {
  for (const char* dir : {"qwen3_5_moe_f32", "qwen3_5_moe_mlx4", "qwen3_5_moe_q8_0"}) {
    test::LoadedModel l = test::load_model(kFixture.model_path(dir));
    ASSERT_NE(l.model, nullptr) << dir;
    const Model& m = *l.model;
    EXPECT_EQ(m.info().n_experts, 8) << dir;
    EXPECT_EQ(m.info().n_experts_used, 2) << dir;
    const auto layers = m.layers();
    ASSERT_EQ(layers.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(layers[i].kind, (i + 1) % 2 == 0 ? LayerKind::kFull : LayerKind::kGatedDelta) << dir << " " << i;
      EXPECT_EQ(layers[i].ffn, FfnKind::kRoutedExperts) << dir << " " << i;
      EXPECT_EQ(layers[i].experts.n_experts, 8);
      EXPECT_EQ(layers[i].experts.k, 2);
      EXPECT_EQ(layers[i].experts.ffn, 32);
      EXPECT_EQ(layers[i].experts.shared_ffn, 64);
    }
  }
}

// Batched == alone for the hybrid MoE too: the recurrent state, the routing and the shared expert
// are per row.
TEST(Qwen35Moe, BatchedEqualsAloneExactly) {
  kFixture.expect_batched_equals_alone("qwen3_5_moe_f32", {{{1, 3, 1, 5}, {4, 1, 2, 1}, {6, 7, 7, 8}}});
}

TEST(Qwen3Moe, BadConfigsAreRefusedNamingTheKey) {
  // Checked through the config parser on the f32 fixture's config with one key changed.
  const std::string src = kRoot + "qwen3_moe_f32";
  nlohmann::ordered_json base;
  {
    std::ifstream f(src + "/config.json");
    ASSERT_TRUE(f.good());
    base = nlohmann::ordered_json::parse(f);
  }
  struct Bad { const char* key; nlohmann::ordered_json value; const char* says; };
  const Bad bads[] = {{"num_experts_per_tok", 9, "num_experts_per_tok 9"},
                      {"num_experts_per_tok", nullptr, "num_experts_per_tok"},
                      {"moe_intermediate_size", 0, "moe_intermediate_size"},
                      {"mlp_only_layers", nlohmann::ordered_json::array({4}), "mlp_only_layers"},
                      {"decoder_sparse_step", 0, "decoder_sparse_step"},
                      {"norm_topk_prob", "yes", "norm_topk_prob"}};
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

}  // namespace
}  // namespace larder::models
