// runtime/fit.h on models whose layers differ (the real-model checks are tests/fit/fit_test.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
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

}  // namespace
}  // namespace larder::runtime
