#include <gtest/gtest.h>

#include "larder/core/status.h"

namespace larder {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument(strfmt("[test] %d is not positive", v));
  return v;
}

Result<int> doubled(int v) {
  LARDER_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(StatusTest, ResultCarriesValueOrError) {
  auto ok = doubled(4);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(*ok, 8);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().to_string(), "invalid_argument: [test] -1 is not positive");
}

TEST(StatusTest, ResultFromOkStatusIsAnError) {
  Result<int> r{Status::ok()};
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace larder
