// runtime/fit.h on models whose layers differ (the real-model checks are tests/fit/fit_test.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/memory/sequence_state.h"
#include "larder/models/model.h"
#include "larder/runtime/fit.h"

namespace larder::runtime {
namespace {

const std::string kRoot = std::string(LARDER_TEST_DATA_DIR) + "/models/";

// The memory estimate counts what the layers hold, from config.json: a global layer grows per
// token at the global head size, a sliding layer is a ring of its window, a KV-sharing layer
// holds nothing (n_layers x KV heads x head_dim over-counted the shared layers and used the
// sliding head size for the global ones).
TEST(Fit, Gemma4CountsWhatTheLayersHold) {
  const std::string dir = kRoot + "gemma4_text_f32";
  auto files = formats::open_model_files(dir);
  ASSERT_TRUE(files.is_ok()) << files.status().to_string() << " (fixture gemma4_ref)";
  auto model = models::Model::load(*files);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  std::ifstream f(dir + "/config.json");
  ASSERT_TRUE(f.good());
  const auto c = nlohmann::json::parse(f);
  const int owned = c["num_hidden_layers"].get<int>() - c["num_kv_shared_layers"].get<int>();
  const uint64_t kvh = c["num_key_value_heads"].get<uint64_t>();
  uint64_t per_token = 0, fixed = 0;
  for (int i = 0; i < owned; ++i) {
    if (c["layer_types"][i] == "full_attention")
      per_token += 2 * kvh * c["global_head_dim"].get<uint64_t>() * sizeof(float);
    else
      fixed += c["sliding_window"].get<uint64_t>() * 2 * kvh * c["head_dim"].get<uint64_t>() * sizeof(float);
  }
  FitRequest req;
  req.ctx = 300;
  req.parallel = 3;
  const FitEstimate e = estimate_fit(**model, 0, req);
  EXPECT_EQ(e.kv_per_token, per_token);
  EXPECT_EQ(e.kv_fixed, fixed);
  EXPECT_EQ(e.kv, 3 * (300 * per_token + fixed));
}

// Qwen3.5 (issue 40 item 4): the recurrent state is the fixed size the state really allocates
// (conv window + d_k x d_v per value head, whatever the context), only the full-attention layers
// grow per token, and the scratch holds the gated DeltaNet's per-row buffers (q|k|v before and
// after the conv, z, y, four gates per value head, q/k per value head for tiled GGUF heads).
TEST(Fit, Qwen35CountsRecurrentStateAndDeltaScratch) {
  const std::string dir = kRoot + "qwen3_5_text_f32";
  auto files = formats::open_model_files(dir);
  ASSERT_TRUE(files.is_ok()) << files.status().to_string() << " (fixture qwen3_5_ref)";
  auto model = models::Model::load(*files);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  std::ifstream f(dir + "/config.json");
  ASSERT_TRUE(f.good());
  const auto c = nlohmann::json::parse(f);
  uint64_t per_token = 0, full = 0;
  for (const auto& t : c["layer_types"]) {
    if (t == "full_attention") {
      per_token += 2 * c["num_key_value_heads"].get<uint64_t>() * c["head_dim"].get<uint64_t>() * sizeof(float);
      ++full;
    }
  }
  // What a sequence's state holds outside the KV cache, measured on the state itself.
  const memory::SequenceState st = (*model)->new_state(64);
  uint64_t held = 0;
  for (const auto& l : st.layers)
    for (const memory::StateTensor& t : l->tensors()) held += t.bytes;
  const uint64_t Hv = c["linear_num_value_heads"].get<uint64_t>(), dk = c["linear_key_head_dim"].get<uint64_t>();
  const uint64_t V = Hv * c["linear_value_head_dim"].get<uint64_t>();
  const uint64_t C = 2 * c["linear_num_key_heads"].get<uint64_t>() * dk + V;
  const uint64_t delta_row = (2 * C + 2 * V + 4 * Hv + 2 * Hv * dk + V) * sizeof(float);

  FitRequest req;
  req.ctx = 300;
  req.parallel = 2;
  req.prefill_rows = 32;
  const FitEstimate e = estimate_fit(**model, 0, req);
  EXPECT_EQ(e.kv_per_token, per_token);
  EXPECT_GT(held, 0u);
  EXPECT_EQ(e.kv_fixed, held) << "the recurrent state is counted as the fixed size it is";
  EXPECT_EQ(e.kv, 2 * (300 * per_token + held));
  EXPECT_EQ(full, 2u);
  // Per prefill row: the decoder's and attention's buffers (f32, + a byte per element of the
  // int8-quantized activations) and, on top, the DeltaNet's.
  const uint64_t h = c["hidden_size"].get<uint64_t>(), ffn = c["intermediate_size"].get<uint64_t>();
  const uint64_t hd = c["head_dim"].get<uint64_t>();
  const uint64_t attn_row = (3 * h + 2 * c["num_attention_heads"].get<uint64_t>() * hd +
                             2 * c["num_key_value_heads"].get<uint64_t>() * hd + 2 * ffn) * sizeof(float) +
                            std::max(h, ffn);
  FitRequest one = req;
  one.prefill_rows = 1;
  EXPECT_EQ(e.scratch - estimate_fit(**model, 0, one).scratch, 31 * (attn_row + delta_row))
      << "scratch per prefill row must hold the gated DeltaNet buffers";
}

}  // namespace
}  // namespace larder::runtime
