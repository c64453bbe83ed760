// log_escape (core/log.h): client text written to a log can neither start a new line nor send a
// terminal escape; readable UTF-8 stays as it is.
#include <gtest/gtest.h>

#include "larder/core/log.h"

namespace larder {
namespace {

TEST(LogEscape, ControlBytesBecomeEscapes) {
  EXPECT_EQ(log_escape("a\r\nb\tc"), "a\\r\\nb\\tc");
  EXPECT_EQ(log_escape(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(log_escape("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");
  EXPECT_EQ(log_escape("back\\slash"), "back\\\\slash");
}

TEST(LogEscape, Utf8KeptC1AndInvalidBytesEscaped) {
  EXPECT_EQ(log_escape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(log_escape("\xc2\x9b" "2J"), "\\u009b2J");  // C1 CSI
  EXPECT_EQ(log_escape("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(log_escape("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
  EXPECT_EQ(log_escape("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(log_escape("\xe2\x82"), "\\xe2\\x82");          // cut short
}

TEST(LogEscape, ExtraCharacters) {
  EXPECT_EQ(log_escape("a b\"c", " \""), "a\\x20b\\x22c");
  EXPECT_EQ(log_escape("a b"), "a b");
}

// The one escape of the KV store's and the server's /metrics label values.
TEST(PrometheusLabelEscape, BackslashQuoteNewline) {
  EXPECT_EQ(prometheus_label_escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(prometheus_label_escape("lora-1 \t\xc3\xa9"), "lora-1 \t\xc3\xa9");  // nothing else changes
}

}  // namespace
}  // namespace larder
