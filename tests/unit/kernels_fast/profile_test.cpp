// core/profile.h: the per-op timeline that `larder bench --profile` prints.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "larder/core/dtype.h"
#include "larder/core/profile.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/ops.h"

namespace larder {
namespace {

const profile::OpStat* find(const std::vector<profile::OpStat>& ops, const std::string& prefix) {
  for (const auto& o : ops)
    if (o.name.rfind(prefix, 0) == 0) return &o;
  return nullptr;
}

TEST(Profile, OffRecordsNothing) {
  profile::set_enabled(false);
  profile::reset();
  { profile::Scope s("never"); }
  EXPECT_EQ(find(profile::snapshot(), "never"), nullptr);
}

TEST(Profile, NestedScopesSplitSelfTime) {
  profile::reset();
  profile::set_enabled(true);
  {
    profile::Scope outer("outer");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (int i = 0; i < 3; ++i) {
      profile::Scope inner("inner", 1000.0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  profile::set_enabled(false);
  const auto ops = profile::snapshot();
  const auto* outer = find(ops, "outer");
  const auto* inner = find(ops, "inner");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(outer->calls, 1u);
  EXPECT_EQ(inner->calls, 3u);
  EXPECT_DOUBLE_EQ(inner->bytes, 3000.0);
  EXPECT_GE(inner->self_ns, 6e6);
  // The outer scope's self time excludes its children's (>= 6 ms of sleeps). Not compared with the
  // children's time itself: on a loaded host one 2 ms sleep can overshoot past three.
  EXPECT_GE(outer->self_ns, 2e6);
  EXPECT_GE(outer->total_ns, outer->self_ns + 6e6);
  EXPECT_NEAR(outer->total_ns, outer->self_ns + inner->total_ns, 1e3);
}

// A pooled matmul is one "matmul <format> <rows>x<cols>" row with the weight bytes and its pool
// job(s) attributed to it.
TEST(Profile, MatmulRowCarriesBytesAndJobs) {
  default_pool().set_threads(2);
  const int64_t rows = 512, cols = 1024;
  std::vector<uint8_t> w(dtype_bytes(DType::kQ8_0, rows * cols), 0);
  for (size_t b = 0; b < w.size(); b += 34) {
    const uint16_t h = f32_to_f16(0.01f);
    std::memcpy(&w[b], &h, 2);
  }
  kernels::WeightView v;
  v.dtype = DType::kQ8_0;
  v.rows = rows;
  v.cols = cols;
  v.data = w.data();
  std::vector<float> x(cols, 1.0f), y(rows);
  profile::reset();
  profile::set_enabled(true);
  kernels::matmul(v, x.data(), 1, y.data());
  profile::set_enabled(false);
  const auto ops = profile::snapshot();
  const auto* m = find(ops, "matmul Q8_0 512x1024");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->calls, 1u);
  EXPECT_DOUBLE_EQ(m->bytes, static_cast<double>(w.size()));
  EXPECT_GE(m->jobs, 1u);
  EXPECT_GE(profile::pool_snapshot().jobs, 1u);
  EXPECT_NE(profile::format_table(ops, profile::pool_snapshot(), 1).find("matmul Q8_0 512x1024"), std::string::npos);
  default_pool().set_threads(0);
}

}  // namespace
}  // namespace larder
