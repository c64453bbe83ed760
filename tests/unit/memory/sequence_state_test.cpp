// SequenceState (one slot per model layer) and the ring's attention spans.
#include <gtest/gtest.h>

#include <random>

#include "larder/memory/sequence_state.h"
#include "larder/memory/store/entry.h"

namespace larder::memory {
namespace {

// Row of position p: every float encodes (p, element) so a misplaced row is visible.
std::vector<float> rows_for(int64_t p0, int64_t n, int64_t row) {
  std::vector<float> v(static_cast<size_t>(n * row));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < row; ++i) v[static_cast<size_t>(t * row + i)] = static_cast<float>((p0 + t) * 1000 + i);
  return v;
}

// After any sequence of appends, spans(from) covers exactly positions [from, offset) in order,
// each row holding its own position's data, in at most two spans.
TEST(RingSpans, MatchPositionsAfterRandomAppends) {
  std::mt19937 rng(7);
  for (int64_t window : {1, 3, 8, 13}) {
    RingState ring(window, 2, 3);
    const int64_t row = 6;
    int64_t pos = 0;
    for (int step = 0; step < 60; ++step) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % static_cast<unsigned>(2 * window + 3));
      const auto k = rows_for(pos, n, row);
      std::vector<float> v = k;
      for (float& x : v) x = -x;
      if (step % 3 == 0) {
        for (int64_t t = 0; t < n; ++t) ring.append(k.data() + t * row, v.data() + t * row);
      } else {
        ring.append_rows(k.data(), v.data(), n);
      }
      pos += n;
      ASSERT_EQ(ring.offset(), pos);
      const int64_t from = std::max<int64_t>(0, pos - window);
      std::vector<KvSpan> sp;
      ring.spans(from, &sp);
      ASSERT_LE(sp.size(), 2u);
      int64_t at = from;
      for (const KvSpan& s : sp) {
        ASSERT_EQ(s.start, at);
        for (int64_t t = 0; t < s.len; ++t)
          for (int64_t i = 0; i < row; ++i) {
            ASSERT_EQ(s.k_f32()[t * row + i], static_cast<float>((at + t) * 1000 + i)) << "window " << window;
            ASSERT_EQ(s.v_f32()[t * row + i], -static_cast<float>((at + t) * 1000 + i));
          }
        at += s.len;
      }
      ASSERT_EQ(at, pos);
    }
  }
}

TEST(RingSpans, ViewIsCopyOnWrite) {
  RingState ring(4, 1, 2);
  const auto a = rows_for(0, 3, 2);
  ring.append_rows(a.data(), a.data(), 3);
  auto view = ring.view();
  const auto b = rows_for(3, 4, 2);
  ring.append_rows(b.data(), b.data(), 4);  // wraps: must not touch the view's rows
  std::vector<KvSpan> sp;
  static_cast<RingState*>(view.get())->spans(0, &sp);
  ASSERT_EQ(sp.size(), 1u);
  EXPECT_EQ(sp[0].len, 3);
  EXPECT_EQ(sp[0].k_f32()[0], 0.0f);
  EXPECT_EQ(sp[0].k_f32()[4], 2000.0f);
}

StateSchema mixed_schema() {
  StateSchema s;
  s.layers = {{StateKind::kRing, 2, 4, 8}, {StateKind::kPlainKv, 2, 4}, {StateKind::kRing, 2, 4, 8},
              {StateKind::kPlainKv, 2, 4}};
  return s;
}

TEST(SequenceState, OneSlotPerLayer) {
  const StateSchema schema = mixed_schema();
  ASSERT_TRUE(schema.validate().is_ok());
  EXPECT_EQ(schema.plain_layout(), (KvLayout{2, 2, 4}));
  SequenceState s(schema, 100);
  ASSERT_EQ(s.slots.size(), 4u);
  EXPECT_EQ(s.slots[0].kind, StateKind::kRing);
  EXPECT_EQ(s.slots[1].index, 0);
  EXPECT_EQ(s.slots[3].index, 1);
  EXPECT_EQ(s.layers.size(), 2u);
  ASSERT_NE(s.ring(2), nullptr);
  EXPECT_EQ(s.ring(1), nullptr);
  EXPECT_EQ(s.kv.device(), Device::kCpu);
  // A ring's memory is its window, whatever the context.
  EXPECT_EQ(s.layers[0]->resident_bytes(), 2u * 8 * 2 * 4 * sizeof(float));

  StateSchema bad = schema;
  bad.layers[3].head_dim = 8;
  EXPECT_FALSE(bad.validate().is_ok());
}

TEST(SequenceState, TrimRespectsRings) {
  SequenceState s(mixed_schema(), 100);
  const auto r = rows_for(0, 10, 8);
  ASSERT_TRUE(s.kv.reserve(10).is_ok());
  for (int i : {0, 2}) s.ring(i)->append_rows(r.data(), r.data(), 10);
  s.kv.advance(10);
  ASSERT_TRUE(s.consistent().is_ok());
  EXPECT_FALSE(s.trim(5).is_ok()) << "wrapped rings cannot forget tokens";
  EXPECT_EQ(s.length(), 10);
  ASSERT_TRUE(s.trim(0).is_ok()) << "a reset always works";
  EXPECT_EQ(s.length(), 0);
  EXPECT_EQ(s.ring(0)->offset(), 0);
}

TEST(SequenceState, HitIntoSchemaChecksKinds) {
  Hit h;
  h.tokens = 0;
  h.layers.push_back(std::make_unique<RingState>(8, 2, 4));
  auto bad = std::move(h).into_state(mixed_schema(), 100);
  EXPECT_FALSE(bad.is_ok()) << "one ring for a schema of two";
}

}  // namespace
}  // namespace larder::memory
