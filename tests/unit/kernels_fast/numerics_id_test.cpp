// The numerics fingerprint that keeps KV-store entries of other numerics from being reused
// (kernels/numerics.h): stable for one table, different whenever any kernel's bits differ.
#include <gtest/gtest.h>

#include <cmath>

#include "larder/kernels/dispatch.h"
#include "larder/kernels/numerics.h"

namespace larder::kernels {
namespace {

KernelTable g_base;

// Kernels that compute what the base table does, except for one output moved by one ulp: the
// smallest numerics change a kernel edit can make.
void q4_0_one_ulp(const WeightView& w, const float* x, int64_t n, float* y) {
  g_base.matmul[static_cast<int>(DType::kQ4_0)](w, x, n, y);
  if (n >= 9) y[3] = std::nextafter(y[3], INFINITY);  // the prefill GEMM only
}
void attention_one_ulp(const float* q, int64_t n, int64_t q_pos0, const KvSpanView* spans, int n_spans,
                       const AttentionParams& p, float* out) {
  g_base.attention(q, n, q_pos0, spans, n_spans, p, out);
  if (n == 1 && p.window > 0) out[7] = std::nextafter(out[7], -INFINITY);  // sliding-window decode only
}
void rmsnorm_one_ulp(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* out) {
  g_base.rmsnorm(x, weight, n, dim, eps, out);
  out[dim + 1] = std::nextafter(out[dim + 1], INFINITY);
}
void delta_state_one_ulp(const GatedDeltaInputs& in, const GatedDeltaShape& s, float* state, float* y) {
  g_base.gated_delta_recurrent(in, s, state, y);
  state[5] = std::nextafter(state[5], INFINITY);  // the carried state only, not the outputs
}

TEST(NumericsId, StableAndNamesTheTier) {
  const std::string a = numerics_fingerprint(active_table());
  EXPECT_EQ(a, numerics_fingerprint(active_table()));
  EXPECT_EQ(a, active_numerics_id());
  EXPECT_EQ(a.rfind(std::string("cpu:") + active_table().name + ":", 0), 0u) << a;
  EXPECT_EQ(a.size(), std::string("cpu:").size() + std::string(active_table().name).size() + 1 + 16) << a;
}

TEST(NumericsId, TheReferenceAndTheFastTierDiffer) {
  if (std::string(active_table().name) == "ref") GTEST_SKIP() << "LARDER_ISA=ref: only one table";
  EXPECT_NE(numerics_fingerprint(ref_table()), numerics_fingerprint(active_table()));
}

TEST(NumericsId, OneUlpInOneKernelChangesIt) {
  g_base = active_table();
  const std::string base = numerics_fingerprint(g_base);
  ASSERT_NE(g_base.matmul[static_cast<int>(DType::kQ4_0)], nullptr);
  struct Case {
    const char* what;
    void (*edit)(KernelTable&);
  } cases[] = {
      {"Q4_0 GEMM", [](KernelTable& t) { t.matmul[static_cast<int>(DType::kQ4_0)] = q4_0_one_ulp; }},
      {"windowed decode attention", [](KernelTable& t) { t.attention = attention_one_ulp; }},
      {"rmsnorm", [](KernelTable& t) { t.rmsnorm = rmsnorm_one_ulp; }},
      {"gated delta state", [](KernelTable& t) { t.gated_delta_recurrent = delta_state_one_ulp; }},
  };
  for (const Case& c : cases) {
    KernelTable t = g_base;
    c.edit(t);
    EXPECT_NE(numerics_fingerprint(t), base) << c.what;
  }
}

TEST(NumericsId, ActiveIdFollowsTheActiveTable) {
  const KernelTable saved = active_table();
  const std::string before = active_numerics_id();
  set_active_table(ref_table());
  const std::string ref = active_numerics_id();
  set_active_table(saved);
  EXPECT_EQ(ref, numerics_fingerprint(ref_table()));
  EXPECT_EQ(active_numerics_id(), before);
}

}  // namespace
}  // namespace larder::kernels
