// Progress: plain lines off a terminal (start, one per 10 %, final), the bar's in-place redraw,
// unknown totals, and ProgressSteps starting a new bar per phase.
#include "larder/core/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace larder {
namespace {

std::string run_with(const char* style, const std::function<void(FILE*)>& body) {
  setenv("LARDER_PROGRESS", style, 1);
  FILE* f = std::tmpfile();
  body(f);
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  unsetenv("LARDER_PROGRESS");
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0, b;
  while ((b = s.find('\n', a)) != std::string::npos) out.push_back(s.substr(a, b - a)), a = b + 1;
  return out;
}

TEST(Progress, PlainLinesAtStartEachTenthAndEnd) {
  const std::string out = run_with("plain", [](FILE* f) {
    Progress p("get x", 1000, Progress::Unit::kBytes, 0, f);
    for (int i = 1; i <= 1000; ++i) p.update(i);
    p.finish();
  });
  EXPECT_EQ(out.find('\r'), std::string::npos);
  const auto ls = lines(out);
  ASSERT_EQ(ls.size(), 11u) << out;  // 0 %, 10 % ... 90 %, final
  EXPECT_EQ(ls.front().rfind("get x    0% 0 B/1000 B", 0), 0u) << ls.front();
  EXPECT_NE(ls[5].find(" 50% 500 B/1000 B"), std::string::npos) << ls[5];
  EXPECT_NE(ls.back().find("100% 1000 B/1000 B  done in 0:00"), std::string::npos) << ls.back();
}

TEST(Progress, FailureIsTheFinalLine) {
  const std::string out = run_with("plain", [](FILE* f) {
    Progress p("get y", 100, Progress::Unit::kItems, 0, f);
    p.update(30);
    p.finish("connection reset");
    p.finish();  // idempotent
  });
  const auto ls = lines(out);
  ASSERT_FALSE(ls.empty());
  EXPECT_NE(ls.back().find("30/100  failed: connection reset"), std::string::npos) << out;
  EXPECT_EQ(out.find("done in"), std::string::npos);
}

TEST(Progress, BarRedrawsInPlaceAndEndsWithNewline) {
  const std::string out = run_with("bar", [](FILE* f) {
    Progress p("load", 2u << 20, Progress::Unit::kBytes, 1u << 20, f);
    p.update(2u << 20);
    p.finish();
  });
  EXPECT_EQ(out.front(), '\r');
  EXPECT_EQ(out.back(), '\n');
  EXPECT_NE(out.find("[########################] 100% 2.0 MiB/2.0 MiB"), std::string::npos) << out;
}

TEST(Progress, OffWritesNothing) {
  const std::string out = run_with("0", [](FILE* f) {
    Progress p("quiet", 10, Progress::Unit::kItems, 0, f);
    p.update(10);
  });
  EXPECT_EQ(out, "");
}

TEST(Progress, FormatBytes) {
  EXPECT_EQ(Progress::format_bytes(980), "980 B");
  EXPECT_EQ(Progress::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(Progress::format_bytes(12.0 * 1048576), "12.0 MiB");
  EXPECT_EQ(Progress::format_bytes(1.5 * 1073741824.0), "1.50 GiB");
}

TEST(ProgressSteps, NewPhaseWhenTheCountChanges) {
  // ProgressSteps writes to stderr: capture it through a temporary redirect.
  setenv("LARDER_PROGRESS", "plain", 1);
  std::fflush(stderr);
  testing::internal::CaptureStderr();
  {
    ProgressSteps s("quantize");
    for (size_t i = 1; i <= 4; ++i) s.step(i, 4, "layer");
    for (size_t i = 1; i <= 2; ++i) s.step(i, 2, "probe");
    s.finish();
  }
  const std::string out = testing::internal::GetCapturedStderr();
  unsetenv("LARDER_PROGRESS");
  size_t finals = 0;
  for (size_t p = 0; (p = out.find("done in", p)) != std::string::npos; ++p) ++finals;
  EXPECT_EQ(finals, 2u) << out;
  EXPECT_NE(out.find("4/4"), std::string::npos) << out;
  EXPECT_NE(out.find("2/2"), std::string::npos) << out;
}

}  // namespace
}  // namespace larder
