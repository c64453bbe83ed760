// LoRA adapters through the projection hook (issue 45 item 2): an adapter loaded from any of its
// three file formats, bound to the model's projection table (models::bind_lora), gives the logits
// mlx-lm gave with it (the fixture tests/ref/lora_reference.py wrote them: <adapter>/logits.f32,
// teacher-forced over ref.json's tokens); rows of one batch under different adapters and none each
// equal their forward alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/models/lora.h"
#include "../../support/model_fixture.h"

namespace larder {
namespace {

using models::AdapterUse;
using models::BoundLora;
using models::LoraAdapter;
using models::LoraUse;

const std::string kRoot = std::string(LARDER_TEST_DATA_DIR) + "/lora/";

nlohmann::json ref() {
  std::ifstream f(kRoot + "ref.json");
  EXPECT_TRUE(f.good()) << kRoot << "ref.json: fixture lora_ref did not run";
  return f.good() ? nlohmann::json::parse(f) : nlohmann::json::object();
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f.good()) << path;
  std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

std::shared_ptr<const BoundLora> bind_file(models::Model& m, const std::string& path) {
  auto a = LoraAdapter::load(path);
  EXPECT_TRUE(a.is_ok()) << path << ": " << a.status().to_string();
  if (!a.is_ok()) return nullptr;
  auto b = models::bind_lora(a.value(), m.projections());
  EXPECT_TRUE(b.is_ok()) << path << ": " << b.status().to_string();
  return b.is_ok() ? b.value() : nullptr;
}

// Teacher-forced logits [n, V] of `tokens` with `uses` (one forward, logits_all).
std::vector<float> logits_with(models::Model& m, const std::vector<int32_t>& tokens,
                               std::span<const AdapterUse> uses) {
  memory::SequenceState st = m.new_state(static_cast<int64_t>(tokens.size()));
  std::vector<float> out(tokens.size() * static_cast<size_t>(m.info().vocab));
  const Status s = m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, out.data(), true, uses);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

// Every fixture adapter, in every format it was written in: logits within 1e-4 × max|logit| of
// mlx-lm's, the argmax at every position identical; the base without adapters equals mlx-lm's
// base logits likewise (so the tolerance measures the adapter, not the base).
TEST(LoraForward, LogitsEqualMlxLmReference) {
  const nlohmann::json r = ref();
  ASSERT_TRUE(r.contains("adapters"));
  test::LoadedModel l = test::load_model(kRoot + "base");
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  const std::vector<int32_t> tokens = r["tokens"].get<std::vector<int32_t>>();
  const int64_t V = r["vocab"].get<int64_t>();
  ASSERT_EQ(m.info().vocab, V);
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(want[i])));
      max_err = std::max(max_err, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LE(max_err, 1e-4 * max_abs) << what << ": max |Δ logit| " << max_err << ", max |logit| " << max_abs;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* g = got.data() + t * static_cast<size_t>(V);
      const float* w = want.data() + t * static_cast<size_t>(V);
      EXPECT_EQ(std::max_element(g, g + V) - g, std::max_element(w, w + V) - w) << what << " top-1 at " << t;
    }
    std::printf("[lora] %-28s max |Δ| %.3g  (%.3g × max |logit| %.3g)\n", what.c_str(), max_err,
                max_err / max_abs, max_abs);
  };
  const std::vector<float> base_ref = read_f32(kRoot + r["base_logits"].get<std::string>());
  compare(logits_with(m, tokens, {}), base_ref, "base");
  int checked = 0;
  for (const auto& [name, a] : r["adapters"].items()) {
    const std::vector<float> want = read_f32(kRoot + a["logits"].get<std::string>());
    for (const auto& fmt : a["formats"]) {
      const std::string f = fmt.get<std::string>();
      const std::string path = kRoot + name + "/" + (f == "gguf" ? "lora.gguf" : f);
      auto b = bind_file(m, path);
      ASSERT_TRUE(b) << path;
      const AdapterUse use[] = {{&b->adapter, 1.0f}};
      const std::vector<float> got = logits_with(m, tokens, use);
      compare(got, want, name + "/" + f);
      // the adapter's effect is there (the fixture made each change the logits by > 0.1)
      double change = 0;
      for (size_t i = 0; i < got.size(); ++i) change = std::max(change, std::abs(static_cast<double>(got[i]) - base_ref[i]));
      EXPECT_GT(change, 0.05) << name << "/" << f;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);  // 3 adapters × mlx/peft/gguf + pattern/peft
}

// A request's scale multiplies the adapter's own: scale 0 equals the base bit for bit, and two
// uses of one adapter at 0.5 each equal one at 1 within f32 rounding.
TEST(LoraForward, RequestScaleMultiplies) {
  test::LoadedModel l = test::load_model(kRoot + "base");
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  const std::vector<int32_t> tokens = ref()["tokens"].get<std::vector<int32_t>>();
  auto b = bind_file(m, kRoot + "attn_r8/peft");
  ASSERT_TRUE(b);
  const std::vector<std::shared_ptr<const BoundLora>> bound = {b};
  auto zero = models::forward_adapter_uses({{b->lora, 0.0f}}, bound);
  ASSERT_TRUE(zero.is_ok());
  EXPECT_TRUE(zero.value().empty());  // scale 0: dropped, the base path
  const std::vector<float> base = logits_with(m, tokens, {});
  const AdapterUse one[] = {{&b->adapter, 1.0f}}, halves[] = {{&b->adapter, 0.5f}, {&b->adapter, 0.5f}};
  const std::vector<float> full = logits_with(m, tokens, one), half2 = logits_with(m, tokens, halves);
  double err = 0, mx = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(full[i]) - half2[i]));
    mx = std::max(mx, std::abs(static_cast<double>(full[i]) - base[i]));
  }
  EXPECT_GT(mx, 0.05);
  EXPECT_LE(err, 1e-5 * mx);
}

// The order the deltas are summed in is the canonical one whatever order the request lists them:
// {X, Y} and {Y, X} give the same bits.
TEST(LoraForward, AdapterOrderIsCanonical) {
  test::LoadedModel l = test::load_model(kRoot + "base");
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  const std::vector<int32_t> tokens = ref()["tokens"].get<std::vector<int32_t>>();
  auto x = bind_file(m, kRoot + "attn_r8/peft"), y = bind_file(m, kRoot + "mixed_r16/peft");
  ASSERT_TRUE(x && y);
  const std::vector<std::shared_ptr<const BoundLora>> bound = {x, y};
  auto xy = models::forward_adapter_uses({{x->lora, 0.7f}, {y->lora, 1.1f}}, bound);
  auto yx = models::forward_adapter_uses({{y->lora, 1.1f}, {x->lora, 0.7f}}, bound);
  ASSERT_TRUE(xy.is_ok() && yx.is_ok());
  const std::vector<float> a = logits_with(m, tokens, xy.value()), b = logits_with(m, tokens, yx.value());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  // A use of an adapter that is not bound is an error, not a silent base row.
  auto missing = models::forward_adapter_uses({{x->lora, 1.0f}}, std::span<const std::shared_ptr<const BoundLora>>(&y, 1));
  EXPECT_FALSE(missing.is_ok());
}

// One batch: rows under attn_r8, under mixed_r16, under none, and under both — prefill then two
// decode steps — each equals its forward alone bit for bit (the active kernel table).
TEST(LoraForward, BatchOfDifferentAdaptersEqualsEachAlone) {
  test::LoadedModel l = test::load_model(kRoot + "base");
  ASSERT_NE(l.model, nullptr);
  models::Model& m = *l.model;
  const std::vector<int32_t> tokens = ref()["tokens"].get<std::vector<int32_t>>();
  auto x = bind_file(m, kRoot + "attn_r8/mlx"), y = bind_file(m, kRoot + "mixed_r16/peft");
  ASSERT_TRUE(x && y);
  const AdapterUse ux[] = {{&x->adapter, 1.0f}}, uy[] = {{&y->adapter, 0.8f}},
                   uxy[] = {{&x->adapter, 0.5f}, {&y->adapter, 1.0f}};
  struct Row {
    int64_t off, n;
    std::span<const AdapterUse> ad;
  };
  const Row rows[] = {{0, 13, ux}, {5, 9, {}}, {20, 17, uy}, {30, 6, uxy}, {40, 11, {}}};
  const int64_t V = m.info().vocab;
  auto run = [&](std::span<const Row> rs) {
    std::vector<memory::SequenceState> states;
    for (size_t i = 0; i < rs.size(); ++i) states.push_back(m.new_state(64));
    std::vector<std::vector<float>> out(rs.size());
    std::vector<models::BatchItem> batch;
    for (size_t i = 0; i < rs.size(); ++i) {
      out[i].resize(static_cast<size_t>(rs[i].n * V));
      batch.push_back({tokens.data() + rs[i].off, rs[i].n, &states[i], out[i].data(), true, rs[i].ad});
    }
    EXPECT_TRUE(m.forward_batch(batch).is_ok());
    for (int step = 0; step < 2; ++step)
      for (size_t i = 0; i < rs.size(); ++i) {
        batch[i].tokens = tokens.data() + rs[i].off + rs[i].n + step;
        batch[i].n = 1;
        batch[i].logits_all = false;
        out[i].resize(out[i].size() + static_cast<size_t>(V));
        batch[i].logits = out[i].data() + out[i].size() - V;
        if (i + 1 == rs.size()) EXPECT_TRUE(m.forward_batch(batch).is_ok());
      }
    return out;
  };
  const std::vector<std::vector<float>> together = run(rows);
  for (size_t i = 0; i < std::size(rows); ++i) {
    const std::vector<std::vector<float>> alone = run(std::span<const Row>(&rows[i], 1));
    ASSERT_EQ(alone[0].size(), together[i].size());
    EXPECT_EQ(0, std::memcmp(alone[0].data(), together[i].data(), alone[0].size() * sizeof(float))) << "row " << i;
  }
}

// Binding checks the seam itself: an adapter for another model's shapes is refused, naming the
// projection (bad/ adapters of the fixture that load but must not validate).
TEST(LoraForward, BindRefusesWrongShapeNamingProjection) {
  test::LoadedModel l = test::load_model(kRoot + "base");
  ASSERT_NE(l.model, nullptr);
  for (const auto& [bad, names] : {std::pair{"wrong_in", "layers.1.self_attn.q_proj"},
                                   {"wrong_out", "layers.0.self_attn.q_proj"},
                                   {"no_layer", "layers.7.self_attn.q_proj"}}) {
    auto a = LoraAdapter::load(kRoot + "bad/" + bad);
    ASSERT_TRUE(a.is_ok()) << bad << ": " << a.status().to_string();
    auto b = models::bind_lora(a.value(), l.model->projections());
    ASSERT_FALSE(b.is_ok()) << bad;
    EXPECT_NE(b.status().to_string().find(names), std::string::npos) << b.status().to_string();
  }
}

}  // namespace
}  // namespace larder
