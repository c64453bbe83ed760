// larder loads what `larder quantize` wrote: teacher-forced logits of every checkpoint made by
// tests/quant/quantize_test.py (fixture quantize_out) vs mlx-lm running the same directory with
// scales/biases upcast to f32 ("f32math"), and of the microscaling-mode checkpoints (mxfp4,
// nvfp4, mxfp8, a per-module plan) written by larder and by mlx_lm.convert.
//
// Bounds (same reasoning as tests/unit/models/arch_parity_test.cpp): on the scalar reference
// kernel table the dequantized weights s*q + b are the same f32 values on both sides and only
// the summation order differs, so max|diff| <= 1e-4 * max|logit| and top-1 agrees everywhere. On
// the active table the AVX2/AVX-512 affine kernels quantize activations to int8 (bias term with
// exact sum x), an error of ~1% of sum|w*x| per dot product; these random-weight checkpoints have
// logits made of heavy cancellation (sum|w*x| >> |sum w*x|, max|logit| ~3 for the untied heads),
// so relative to max|logit| it is larger than on trained models: measured worst 0.045, bound
// 6e-2 * max|logit|; top-1 checked where mlx's margin exceeds twice that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"
#include "../../support/logit_diff.h"

namespace larder {
namespace {


TEST(QuantizeRoundTrip, LarderLoadsItsOutputLikeMlxLm) {
  const std::string root = std::string(LARDER_TEST_DATA_DIR) + "/quantize";
  int n_cases = 0;
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec))
    if (std::filesystem::exists(e.path() / "ref.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  for (const std::string& dir : dirs) {
    std::ifstream jf(dir + "/ref.json");
    const nlohmann::json ref = nlohmann::json::parse(jf);
    const std::vector<int32_t> toks = ref["tokens"].get<std::vector<int32_t>>();
    const int64_t V = ref["vocab"];
    std::vector<float> want(toks.size() * static_cast<size_t>(V));
    std::ifstream lf(dir + "/" + ref["logits"]["f32math"].get<std::string>(), std::ios::binary);
    lf.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(want.size() * 4));
    ASSERT_TRUE(lf.good()) << dir;
    auto files = formats::open_model_files(dir + "/larder");
    ASSERT_TRUE(files.is_ok()) << files.status().to_string();
    auto model = models::Model::load(files.value());
    ASSERT_TRUE(model.is_ok()) << dir << ": " << model.status().to_string();
    models::Model& m = *model.value();
    ASSERT_EQ(m.info().vocab, V);
    const kernels::KernelTable active = kernels::active_table();
    struct Run { const char* name; const kernels::KernelTable* table; float rel; };
    const bool same = active.matmul_affine[4] == kernels::ref_table().matmul_affine[4];
    const Run runs[] = {{"ref", &kernels::ref_table(), 1e-4f}, {active.name, &active, same ? 1e-4f : 6e-2f}};
    for (const Run& run : runs) {
      kernels::set_active_table(*run.table);
      memory::SequenceState cache = m.new_state(m.info().max_context);
      std::vector<float> got(want.size());
      Status st = m.forward(toks.data(), static_cast<int64_t>(toks.size()), cache, got.data(), true);
      kernels::set_active_table(active);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      float max_ref = 0;
      for (float v : want) max_ref = std::max(max_ref, std::abs(v));
      const float margin = run.rel > 1e-4f ? 2 * run.rel * max_ref : 0.0f;
      const test::LogitDiff d = test::compare_logits(got, want, V, margin);
      std::printf("[roundtrip] %-48s %-8s max|diff| %.3g max|logit| %.3g rel %.3g top1 %d/%d\n", dir.c_str(), run.name,
                  d.max_abs, d.max_ref, d.max_abs / d.max_ref, d.top1_checked - d.top1_mismatch, d.top1_checked);
      EXPECT_LE(d.max_abs, run.rel * d.max_ref) << dir << " " << run.name;
      EXPECT_EQ(d.top1_mismatch, 0) << dir << " " << run.name;
    }
    ++n_cases;
  }
  EXPECT_GE(n_cases, 14) << "fixture quantize_out (tests/quant/quantize_test.py) did not run";
}

}  // namespace
}  // namespace larder
