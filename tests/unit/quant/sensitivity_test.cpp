// Sensitivity widths that share one quantizer (SensitivityOptions::quantizer_id, as GGUF's 2–4 bits
// all write IQ4_NL on rows 256 does not divide) are measured once: the table equals, number for
// number, the one that measures every width on its own, for both methods, with fewer quantizations
// (and, for the reference method, fewer forwards). Model: the random-weight Llama fixture of
// tests/ref/model_reference.py (hidden 64, intermediate 96, 3 layers).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "larder/formats/model_files.h"
#include "larder/quant/affine.h"
#include "larder/quant/sensitivity.h"

namespace larder::quant {
namespace {

// GGUF-like: widths 2, 3 and 4 all quantize at 4 bits.
int shared_width(int b) { return b <= 4 ? 4 : b; }

struct Measured {
  std::vector<ModuleSensitivity> table;
  int quantizations = 0;
  int64_t forwards = 0;
};

Measured measure(const formats::ModelFiles& f, const std::vector<ModuleSensitivity>& mods, const CalibrationSet& cs,
                 SensitivityMethod method, bool share) {
  Measured m;
  SensitivityOptions so;
  so.candidates = {2, 3, 4, 5, 8};
  so.group_size = 32;
  so.method = method;
  so.fake_quant = [&](const std::string&, const formats::TensorInfo& w, int b, float* out) -> Status {
    ++m.quantizations;
    return fake_quantize_affine(w.data, w.dtype, w.dim(0), w.dim(1), shared_width(b), 32, 0, out);
  };
  if (share) so.quantizer_id = [](const formats::TensorInfo&, int b) { return static_cast<int64_t>(shared_width(b)); };
  auto r = measure_kl_sensitivity(f, mods, cs, so);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (r.is_ok()) {
    m.table = r.value().table;
    m.forwards = r.value().forwards;
  }
  return m;
}

TEST(SensitivitySharedQuantizer, SameTableFewerQuantizations) {
  auto files = formats::open_model_files(std::string(LARDER_TEST_DATA_DIR) + "/models/llama_gqa_f32");
  ASSERT_TRUE(files.is_ok()) << files.status().to_string();
  std::vector<ModuleSensitivity> mods;
  for (const formats::TensorInfo& t : files.value().tensors().tensors()) {
    const std::string& n = t.name;
    if (n.rfind("model.layers.", 0) == 0 && t.rank() == 2 && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0)
      mods.push_back({n.substr(0, n.size() - 7), {}, static_cast<uint64_t>(t.numel())});
  }
  ASSERT_EQ(mods.size(), 21u);  // 3 layers × q, k, v, o, gate, up, down
  CalibrationSet cs;
  cs.samples = {{1, 17, 40, 99, 150, 7, 260, 3, 88, 311, 45, 12}, {1, 200, 5, 66, 123, 301, 9, 77, 18, 250, 140, 33}};
  cs.seq_len = 12;
  cs.source = "test";
  for (SensitivityMethod method : {SensitivityMethod::kFast, SensitivityMethod::kKl}) {
    const bool fast = method == SensitivityMethod::kFast;
    SCOPED_TRACE(fast ? "fast" : "kl");
    const Measured each = measure(files.value(), mods, cs, method, false);
    const Measured shared = measure(files.value(), mods, cs, method, true);
    ASSERT_EQ(each.table.size(), mods.size());
    ASSERT_EQ(shared.table.size(), mods.size());
    for (size_t i = 0; i < mods.size(); ++i) {
      EXPECT_EQ(shared.table[i].name, each.table[i].name);
      EXPECT_EQ(shared.table[i].kl, each.table[i].kl) << mods[i].name;  // exact: the same computations
      // (fast: 4 bits is KL(p)·e(4)/e(p) with e(4) = e(p), equal to KL(p) up to the rounding of ·/.)
      EXPECT_DOUBLE_EQ(shared.table[i].kl.at(2), shared.table[i].kl.at(4)) << mods[i].name;
      EXPECT_NE(shared.table[i].kl.at(4), shared.table[i].kl.at(5)) << mods[i].name;
    }
    // Per module: fast quantizes every width in the capture and the probe width once more
    // (5 + 1 → 3 + 1); the reference quantizes and probes each width (5 → 3).
    const int n = static_cast<int>(mods.size());
    EXPECT_EQ(each.quantizations, n * (fast ? 6 : 5));
    EXPECT_EQ(shared.quantizations, n * (fast ? 4 : 3));
    const int64_t samples = static_cast<int64_t>(cs.samples.size());
    EXPECT_EQ(each.forwards, samples * (fast ? n + 2 : 5 * n + 1));
    EXPECT_EQ(shared.forwards, samples * (fast ? n + 2 : 3 * n + 1));
  }
}

}  // namespace
}  // namespace larder::quant
