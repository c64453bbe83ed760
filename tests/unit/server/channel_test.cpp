// Channel (server/request.h): the engine → HTTP-thread event queue, and the paced wait that lets
// token events queue without waking the consumer while urgent ones (the last event) still do.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "larder/server/request.h"

namespace larder::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Event token(int32_t id) {
  Event e;
  e.text = "t" + std::to_string(id);
  e.tokens.push_back({id, {}});
  return e;
}

TEST(Channel, PopWakesOnATokenEvent) {
  Channel ch;
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    ch.push(token(7));
  });
  const auto t0 = Clock::now();
  std::optional<Event> e = ch.pop(milliseconds(5000));
  producer.join();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->tokens.at(0).id, 7);
  EXPECT_LT(Clock::now() - t0, milliseconds(2000));
  EXPECT_FALSE(ch.try_pop().has_value());
}

// Token events pushed during the paced wait do not end it; they are all there, in order, after.
TEST(Channel, PacedWaitIsNotEndedByTokens) {
  Channel ch;
  std::thread producer([&] {
    for (int i = 0; i < 5; ++i) {
      std::this_thread::sleep_for(milliseconds(5));
      ch.push(token(i));
    }
  });
  const auto t0 = Clock::now();
  ch.wait_urgent(t0 + milliseconds(300));
  const auto waited = Clock::now() - t0;
  producer.join();
  EXPECT_GE(waited, milliseconds(300));
  for (int i = 0; i < 5; ++i) {
    std::optional<Event> e = ch.try_pop();
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(e->tokens.at(0).id, i);
  }
  EXPECT_FALSE(ch.try_pop().has_value());
}

// The last event ends the wait at once, whatever is queued before it; so does an admission.
TEST(Channel, PacedWaitEndsOnTheLastEvent) {
  for (const bool admitted : {false, true}) {
    Channel ch;
    std::thread producer([&] {
      std::this_thread::sleep_for(milliseconds(20));
      ch.push(token(1));
      Event e;
      if (admitted) e.admitted = true;
      else e.done = true;
      ch.push(std::move(e));
    });
    const auto t0 = Clock::now();
    ch.wait_urgent(t0 + milliseconds(10000));
    producer.join();
    EXPECT_LT(Clock::now() - t0, milliseconds(5000)) << "admitted=" << admitted;
    EXPECT_EQ(ch.try_pop()->tokens.at(0).id, 1);
    std::optional<Event> last = ch.try_pop();
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->done, !admitted);
    // Taken: a second wait is paced again (the urgent event was counted out).
    const auto t1 = Clock::now();
    ch.wait_urgent(t1 + milliseconds(50));
    EXPECT_GE(Clock::now() - t1, milliseconds(50));
  }
}

// An urgent event queued before the wait begins ends it without sleeping.
TEST(Channel, PacedWaitSeesAnUrgentEventAlreadyQueued) {
  Channel ch;
  Event e;
  e.done = true;
  ch.push(std::move(e));
  const auto t0 = Clock::now();
  ch.wait_urgent(t0 + milliseconds(10000));
  EXPECT_LT(Clock::now() - t0, milliseconds(5000));
}

}  // namespace
}  // namespace larder::server
