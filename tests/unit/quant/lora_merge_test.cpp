// `larder quantize --lora` (issue 45 item 4, quant/lora_merge.h): an adapter merged into the base
// before quantizing gives, on a full-precision output, the logits the run-time adapter gives
// (projection hook, models::bind_lora) within the fp32 bound of 1e-4 × max |logit|: the
// two compute x·(W + s·B·A)ᵀ and x·Wᵀ + s·B(A x) in f32, which differ by rounding only (the
// merged weight is exact to one f32 rounding; the activations' sums are reordered). Checked on
// the merged f32 checkpoint (what both output formats quantize) with the fixture's PEFT adapters
// (tests/ref/lora_reference.py; rsLoRA among them) at a request scale ≠ 1, and two at once with a
// negative scale. The CLI's GGUF F32 output is checked in tests/quant/quantize_lora_test.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "larder/models/lora.h"
#include "larder/quant/lora_merge.h"
#include "../../support/model_fixture.h"

namespace larder {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = std::string(LARDER_TEST_DATA_DIR) + "/lora/";

struct Tmp {
  std::string path;
  Tmp() {
    char t[] = "/tmp/larder-lora-merge-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Tmp() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<int32_t> tokens() {
  std::ifstream f(kRoot + "ref.json");
  EXPECT_TRUE(f.good()) << "fixture lora_ref did not run";
  return nlohmann::json::parse(f)["tokens"].get<std::vector<int32_t>>();
}

std::vector<float> logits(models::Model& m, const std::vector<int32_t>& t, std::span<const models::AdapterUse> uses) {
  memory::SequenceState st = m.new_state(static_cast<int64_t>(t.size()));
  std::vector<float> out(t.size() * static_cast<size_t>(m.info().vocab));
  const Status s = m.forward(t.data(), static_cast<int64_t>(t.size()), st, out.data(), true, uses);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

// max |a − b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    mx = std::max(mx, std::abs(static_cast<double>(b[i])));
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return err / mx;
}

TEST(LoraMerge, MergedCheckpointGivesTheRunTimeAdapterLogits) {
  const std::vector<int32_t> toks = tokens();
  test::LoadedModel base = test::load_model(kRoot + "base");
  ASSERT_NE(base.model, nullptr);
  auto x = models::LoraAdapter::load(kRoot + "mixed_r16/peft");
  auto y = models::LoraAdapter::load(kRoot + "attn_r8/peft");
  ASSERT_TRUE(x.is_ok() && y.is_ok());
  auto bx = models::bind_lora(x.value(), base.model->projections());
  auto by = models::bind_lora(y.value(), base.model->projections());
  ASSERT_TRUE(bx.is_ok() && by.is_ok());
  const std::vector<float> plain = logits(*base.model, toks, {});

  struct Case {
    std::vector<models::LoraUse> uses;
    std::vector<models::AdapterUse> runtime;
  };
  const Case cases[] = {
      {{{x.value(), 0.7f}}, {{&bx.value()->adapter, 0.7f}}},
      {{{y.value(), 1.0f}, {x.value(), -0.5f}}, {}},
  };
  for (const Case& c : cases) {
    Tmp tmp;
    std::vector<std::string> warnings;
    auto r = quant::merge_lora_checkpoint(kRoot + "base", tmp.path + "/merged", c.uses, &warnings);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_GT(r->merged_tensors, 0u);
    std::vector<models::AdapterUse> rt = c.runtime;
    if (rt.empty()) {  // the forward's canonical order, as a request with both would run
      const std::vector<std::shared_ptr<const models::BoundLora>> bound = {bx.value(), by.value()};
      auto f = models::forward_adapter_uses(c.uses, bound);
      ASSERT_TRUE(f.is_ok());
      rt = f.value();
    }
    const std::vector<float> want = logits(*base.model, toks, rt);
    EXPECT_GT(rel_err(want, plain), 1e-3);  // the adapter does change the logits

    test::LoadedModel merged = test::load_model(tmp.path + "/merged");
    ASSERT_NE(merged.model, nullptr);
    const double e_hf = rel_err(logits(*merged.model, toks, {}), want);
    EXPECT_LE(e_hf, 1e-4) << "merged HF directory";

    std::printf("[lora-merge] %zu adapter(s): max |Δ logit| / max |logit| %.3g\n", c.uses.size(), e_hf);
  }
}

// The same adapter as a GGUF LoRA (qwen3: llama.cpp keeps HF's row order) merges to the same
// weights; an adapter that does not fit the base is refused naming it and the projection, and
// nothing is left behind.
TEST(LoraMerge, GgufLoraMergesAlikeAndAMisfitIsRefused) {
  auto peft = models::LoraAdapter::load(kRoot + "attn_r8/peft");
  auto gguf = models::LoraAdapter::load(kRoot + "attn_r8/lora.gguf");
  ASSERT_TRUE(peft.is_ok() && gguf.is_ok());
  Tmp tmp;
  std::vector<std::string> warnings;
  ASSERT_TRUE(quant::merge_lora_checkpoint(kRoot + "base", tmp.path + "/p", {{{peft.value(), 1.0f}}}, &warnings).is_ok());
  ASSERT_TRUE(quant::merge_lora_checkpoint(kRoot + "base", tmp.path + "/g", {{{gguf.value(), 1.0f}}}, &warnings).is_ok());
  auto read = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read(tmp.path + "/p/model.safetensors"), read(tmp.path + "/g/model.safetensors"));
  fs::remove_all(tmp.path + "/p");
  fs::remove_all(tmp.path + "/g");
  auto bad = models::LoraAdapter::load(kRoot + "bad/wrong_in");
  ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
  auto r = quant::merge_lora_checkpoint(kRoot + "base", tmp.path + "/merged", {{{bad.value(), 1.0f}}}, &warnings);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("bad/wrong_in"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("layers."), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(fs::is_empty(tmp.path));
  auto no_src = quant::merge_lora_checkpoint(kRoot + "base/nonexistent", tmp.path + "/m2", {}, &warnings);
  EXPECT_FALSE(no_src.is_ok());
}

}  // namespace
}  // namespace larder
