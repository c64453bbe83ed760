// Qwen3-Next vs mlx-lm: tiny random checkpoints made by tests/ref/qwen3_next_reference.py with
// mlx-lm's own qwen3_next classes — HF layout (fused in_proj_qkvz / in_proj_ba per key head, γ − 1
// gains, per-expert tensors, a dense layer from mlp_only_layers), decoder_sparse_step 2 without
// renormalisation and tied, MLX 4-bit, GGUF `qwen3next` Q8_0 as llama.cpp's converter writes it
// (attn_qkv + attn_gate, ssm_ba, grouped value heads; with its MTP block) and as older converters
// did (ssm_in) —
// teacher-forced over 64 tokens. Beyond parity: the layers it declares, any prefill cut and decode
// after prefill equal to all-at-once, a batch equal to each sequence alone, and a KV-store
// checkpoint continuing exactly as the cold computation.
//
// Bounds as qwen3_moe_test.cpp: f32 max |diff| ≤ 1e-4 · max|logit|, top-1 identical; the quantized
// cases on a fast table (int8-quantized activations) against mlx-lm on int8-rounded activations
// ("int8acts") within arch_parity_test's 3e-2 and its margin rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/memory/store/kv_store.h"
#include "larder/models/model.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

using test::run_chunks;
using test::with_table;
using Ref = test::RefLogits;

const test::FamilyFixture kFixture{"qwen3_next_ref"};
const std::string& kRoot = test::kModelFixtures;

TEST(Qwen3Next, DeclaresHybridLayersAndTheirExperts) {
  struct Case {
    const char* dir;
    std::vector<bool> routed;
    int E, k;
    bool tied;
  };
  const Case cases[] = {{"qwen3_next_f32", {true, true, false, true}, 8, 2, false},
                        {"qwen3_next_mlx4", {true, true, false, true}, 8, 2, false},
                        {"qwen3_next_step2_f32", {false, true, false, true}, 6, 3, true},
                        {"qwen3_next_q8_0", {true, true, true, true}, 8, 2, false},
                        {"qwen3_next_ssm_in_q8_0", {true, true, true, true}, 8, 2, false},
                        {"qwen3_next_mtp_q8_0", {true, true, true, true}, 8, 2, false}};
  for (const Case& c : cases) {
    test::LoadedModel l = test::load_model(kFixture.model_path(c.dir));
    ASSERT_NE(l.model, nullptr) << c.dir;
    const Model& m = *l.model;
    EXPECT_EQ(m.info().tied_embeddings, c.tied) << c.dir;
    EXPECT_EQ(m.info().n_experts, c.E) << c.dir;
    EXPECT_EQ(m.info().n_experts_used, c.k) << c.dir;
    const auto layers = m.layers();
    ASSERT_EQ(layers.size(), 4u);
    const memory::StateSchema& schema = m.state_schema();
    for (size_t i = 0; i < 4; ++i) {
      const bool full = (i + 1) % 2 == 0;
      EXPECT_EQ(layers[i].kind, full ? LayerKind::kFull : LayerKind::kGatedDelta) << c.dir << " layer " << i;
      EXPECT_EQ(schema.layers[i], layers[i].state) << c.dir << " layer " << i;
      if (full) {
        EXPECT_TRUE(layers[i].attn_gate && layers[i].norms.qk);
        EXPECT_EQ(layers[i].rope_dim, 4);  // partial_rotary_factor 0.25 of head_dim 16
      } else {
        EXPECT_EQ(schema.layers[i].conv_dim, 2 * 2 * 16 + 4 * 8);
        EXPECT_EQ(schema.layers[i].dv, 8);
        // Qwen3-Next's value heads stay grouped by key head, in its GGUF too.
        EXPECT_FALSE(layers[i].delta.tiled_v_heads) << c.dir;
      }
      EXPECT_EQ(layers[i].ffn, c.routed[i] ? FfnKind::kRoutedExperts : FfnKind::kDense) << c.dir << " layer " << i;
      if (c.routed[i]) {
        EXPECT_EQ(layers[i].experts.n_experts, c.E);
        EXPECT_EQ(layers[i].experts.k, c.k);
        EXPECT_EQ(layers[i].experts.ffn, 32);
        EXPECT_EQ(layers[i].experts.shared_ffn, 64);
      }
    }
  }
}

TEST(Qwen3Next, TightAgainstMlxLm) {
  for (const char* dir_name : {"qwen3_next_f32", "qwen3_next_step2_f32", "qwen3_next_mlx4", "qwen3_next_q8_0"}) {
    // Cuts inside the conv window (K − 1 = 3 rows of state), decode after a prefill.
    kFixture.expect_tight_against_oracle(
        dir_name, {{64}, {1, 2, 3, 58}, {5, 7, 11, 13, 17, 11}, test::decode_after_prefill(40, 64)});
  }
}

// Other GGUF layouts of the same weights give qwen3_next_q8_0's logits bit for bit on the
// reference table (each output row computed alone):
// - ssm_in: the older converters' single in_proj_qkvz holds the same Q8_0 rows as attn_qkv +
//   attn_gate; its layer pattern is only in attention.recurrent_layers (its
//   full_attention_interval says 4, which would make layer 1 a DeltaNet layer without tensors);
// - mtp: the current converter's multi-token-prediction block after the trunk (block_count 5,
//   nextn_predict_layers 1) is skipped, not run and not refused as an unused tensor.
TEST(Qwen3Next, OtherGgufLayoutsEqualTheSplitOne) {
  const Ref ref = kFixture.ref(kRoot + "qwen3_next_q8_0", "deq");
  test::LoadedModel split = test::load_model(kFixture.model_path("qwen3_next_q8_0"));
  ASSERT_NE(split.model, nullptr);
  for (const char* dir : {"qwen3_next_ssm_in_q8_0", "qwen3_next_mtp_q8_0"}) {
    test::LoadedModel other = test::load_model(kFixture.model_path(dir));
    ASSERT_NE(other.model, nullptr) << dir;
    EXPECT_EQ(other.model->info().n_layers, 4) << dir;
    with_table(kernels::ref_table(), [&] {
      EXPECT_EQ(run_chunks(*other.model, ref.tokens, {64}), run_chunks(*split.model, ref.tokens, {64})) << dir;
    });
  }
}

TEST(Qwen3Next, BatchedEqualsAlone) {
  kFixture.expect_batched_equals_alone("qwen3_next_f32", {{{1, 3, 1, 5}, {4, 1, 2, 1}, {1, 1, 1, 1}, {6, 7, 7, 8}}});
}

// A KV-store entry of a 40-token prefix (attention KV + the recurrent conv window and matrix at
// token 40) continues exactly as the cold computation with the same cut, and like mlx-lm.
TEST(Qwen3Next, CheckpointContinuesAsCold) {
  const std::string dir = kRoot + "qwen3_next_f32";
  const Ref ref = kFixture.ref(dir);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  const int64_t V = m.info().vocab;
  memory::KvStoreConfig cfg;
  cfg.ram_cap_bytes = 64ull << 20;
  cfg.identity.weights_id = "qwen3_next-test";
  cfg.identity.kv_scheme = "f32";
  auto store = memory::KvStore::open(cfg);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const std::vector<int32_t>& toks = ref.tokens;
  for (const kernels::KernelTable* table : {&kernels::ref_table(), &kernels::active_table()}) {
    with_table(*table, [&] {
      const std::string ns = std::string("t-") + table->name;
      {
        memory::SequenceState st = m.new_state(m.info().max_context);
        std::vector<float> lg(static_cast<size_t>(V));
        ASSERT_TRUE(m.forward(toks.data(), 40, st, lg.data(), false).is_ok());
        ASSERT_TRUE((*store)->put(std::span<const int32_t>(toks.data(), 40), std::move(st), ns).is_ok());
      }
      memory::TakeResult t = (*store)->take(toks, ns);
      ASSERT_TRUE(t.hit.has_value()) << t.report.reason;
      EXPECT_EQ(t.hit->tokens, 40);
      auto st = std::move(*t.hit).into_state(m.state_schema(), m.info().max_context);
      ASSERT_TRUE(st.is_ok()) << st.status().to_string();
      std::vector<float> got(static_cast<size_t>(24 * V));
      ASSERT_TRUE(m.forward(toks.data() + 40, 24, *st, got.data(), true).is_ok());
      const std::vector<float> cold = run_chunks(m, toks, {40, 24});
      EXPECT_EQ(got, std::vector<float>(cold.begin() + 40 * V, cold.end())) << table->name;
      const std::vector<float> want(ref.logits.begin() + 40 * V, ref.logits.end());
      const test::LogitDiff d = test::compare_logits(got, want, V);
      EXPECT_LE(d.max_abs, 1e-4f * d.max_ref) << table->name;
      EXPECT_EQ(d.top1_mismatch, 0) << table->name;
    });
  }
}

TEST(Qwen3Next, BadConfigsAreRefusedNamingTheKey) {
  const std::string src = kRoot + "qwen3_next_f32";
  nlohmann::ordered_json base;
  {
    std::ifstream f(src + "/config.json");
    ASSERT_TRUE(f.good());
    base = nlohmann::ordered_json::parse(f);
  }
  struct Bad { const char* key; nlohmann::ordered_json value; const char* says; };
  const Bad bads[] = {{"num_experts_per_tok", 9, "num_experts_per_tok 9"},
                      {"shared_expert_intermediate_size", nullptr, "shared_expert_intermediate_size"},
                      {"mlp_only_layers", nlohmann::ordered_json::array({4}), "mlp_only_layers"},
                      {"mlp_only_layers", "2", "mlp_only_layers"},
                      {"decoder_sparse_step", 0, "decoder_sparse_step"},
                      {"norm_topk_prob", "yes", "norm_topk_prob"},
                      {"linear_num_value_heads", 3, "linear_num_value_heads 3"}};
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
