// core/threadpool: every chunk exactly once, per-thread indices, nesting, sleep/wake, resizing.
#include "larder/core/threadpool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace larder {
namespace {

TEST(ThreadPool, EveryChunkRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](int64_t c, int t) {
        ASSERT_GE(t, 0);
        ASSERT_LT(t, threads);
        hits[c].fetch_add(1);
      });
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(hits[c].load(), 1) << "chunk " << c << " threads " << threads;
    }
  }
}

TEST(ThreadPool, ThreadIndexIsUniqueAmongConcurrentChunks) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<int> clashes{0};
  pool.parallel_for(300, [&](int64_t, int t) {
    if (busy[t].fetch_add(1) != 0) clashes.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    busy[t].fetch_sub(1);
  });
  EXPECT_EQ(clashes.load(), 0);
}

TEST(ThreadPool, ManySmallJobsBackToBack) {
  // The decode pattern: hundreds of short jobs per token. Also checks no lost wake-ups.
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int j = 0; j < 20000; ++j) {
    pool.parallel_for(4, [&](int64_t c, int) { sum.fetch_add(c + 1, std::memory_order_relaxed); });
  }
  EXPECT_EQ(sum.load(), 20000LL * 10);
}

TEST(ThreadPool, WorkersSleepAndWake) {
  ThreadPool pool(2);
  pool.set_spin_us(0);  // straight to the futex
  for (int j = 0; j < 200; ++j) {
    std::atomic<int> n{0};
    pool.parallel_for(8, [&](int64_t, int) { n.fetch_add(1); });
    ASSERT_EQ(n.load(), 8);
    if (j % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t, int t) {
    pool.parallel_for(3, [&](int64_t, int t2) {
      EXPECT_EQ(t2, t);  // inline on the same pool thread
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 12);
}

TEST(ThreadPool, ResizeAndPinning) {
  ThreadPool pool(1);
  for (int threads : {2, 1, 3, 2}) {
    pool.set_threads(threads);
    ASSERT_EQ(pool.n_threads(), threads);
    std::atomic<int> n{0};
    pool.parallel_for(100, [&](int64_t, int) { n.fetch_add(1); });
    ASSERT_EQ(n.load(), 100);
  }
  pool.set_pinning(true);
  std::atomic<int> n{0};
  pool.parallel_for(10, [&](int64_t, int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 10);
}

TEST(ThreadPool, UsesMoreThanOneThread) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> per_thread(2);
  // Chunks long enough that the worker (spinning or woken) surely claims some.
  pool.parallel_for(64, [&](int64_t, int t) {
    per_thread[t].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  EXPECT_GT(per_thread[0].load(), 0);
  EXPECT_GT(per_thread[1].load(), 0);
}

TEST(ThreadPool, ConcurrentSubmittersAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&] {
      for (int j = 0; j < 500; ++j) pool.parallel_for(5, [&](int64_t, int) { total.fetch_add(1); });
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(total.load(), 3 * 500 * 5);
}

}  // namespace
}  // namespace larder
