#include "larder/core/threadpool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>

#include "larder/core/cpuid.h"
#include "larder/core/profile.h"

namespace larder {
namespace {

// Index of the pool thread running the current chunk, or -1 outside any job. A parallel_for
// issued from inside a chunk sees >= 0 and runs inline on this thread.
thread_local int tl_thread_index = -1;

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) { set_threads(n_threads); }

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::set_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (n_threads <= 0) n_threads = cpu_features().physical_cores;
  if (n_threads < 1) n_threads = 1;
  if (n_threads == n_threads_ && static_cast<int>(workers_.size()) == n_threads - 1) return;
  stop_workers();
  n_threads_ = n_threads;
  start_workers();
}

void ThreadPool::set_pinning(bool on) {
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (on == pin_) return;
  stop_workers();
  pin_ = on;
  start_workers();
}

void ThreadPool::start_workers() {
  stop_.store(false);
  workers_.reserve(n_threads_ - 1);
  // The generation is read here, not in the new thread: a job submitted before the thread first
  // runs must still count as new to it, or the submitter would wait for its check-in forever.
  const uint32_t g0 = generation_.v.load();
  for (int i = 0; i < n_threads_ - 1; ++i) {
    workers_.emplace_back([this, i, g0] { worker_main(i, g0); });
  }
}

void ThreadPool::stop_workers() {
  if (workers_.empty()) return;
  stop_.store(true);
  state_.v.fetch_or(kClosed);
  generation_.v.fetch_add(1);
  futex_wake_all(&generation_.v);
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::work_on_current_job(int thread) {
  tl_thread_index = thread;
  const int64_t n = job_chunks_;
  for (;;) {
    int64_t c = next_chunk_.v.fetch_add(1, std::memory_order_relaxed);
    if (c >= n) break;
    job_fn_(job_ctx_, c, thread);
  }
  tl_thread_index = -1;
}

void ThreadPool::worker_main(int index, uint32_t seen) {
  if (pin_) {
    int ncpu = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((index + 1) % (ncpu > 0 ? ncpu : 1), &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  for (;;) {
    // Spin for a bounded time: the next matmul of a decode step usually arrives within tens of
    // microseconds, far sooner than a futex round trip on a VM.
    uint32_t g = generation_.v.load(std::memory_order_acquire);
    if (g == seen) {
      const auto spin = std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0;; ++i) {
        _mm_pause();
        g = generation_.v.load(std::memory_order_acquire);
        if (g != seen) break;
        if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 >= spin) break;
      }
    }
    while (g == seen) {
      // Announce the sleep before re-checking (seq_cst on both sides): either the submitter
      // sees sleepers_ > 0 and wakes us, or we see its generation bump and skip the wait.
      sleepers_.v.fetch_add(1);
      g = generation_.v.load();
      if (g == seen) futex_wait(&generation_.v, seen);
      sleepers_.v.fetch_sub(1);
      g = generation_.v.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    // Join job g unless the caller already closed it (it finished without us) or moved on.
    uint64_t st = state_.v.load(std::memory_order_acquire);
    bool joined = false;
    while ((st >> 32) == g && !(st & kClosed)) {
      if (state_.v.compare_exchange_weak(st, st + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    if (profile::enabled()) {
      job_joins_.v.fetch_add(1, std::memory_order_relaxed);
      profile::note_join(static_cast<double>(profile::now_ns() - publish_ns_.v.load(std::memory_order_relaxed)));
    }
    work_on_current_job(index + 1);
    state_.v.fetch_sub(1, std::memory_order_release);  // our chunks' writes happen-before the close
  }
}

void ThreadPool::run(int64_t n_chunks, ChunkFn fn, void* ctx) {
  if (n_chunks <= 0) return;
  if (tl_thread_index >= 0 || n_threads_ == 1 || n_chunks == 1) {
    const int t = tl_thread_index >= 0 ? tl_thread_index : 0;
    for (int64_t c = 0; c < n_chunks; ++c) fn(ctx, c, t);
    return;
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  const bool prof = profile::enabled();
  if (prof) {
    job_joins_.v.store(0, std::memory_order_relaxed);
    publish_ns_.v.store(profile::now_ns(), std::memory_order_relaxed);
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_chunks_ = n_chunks;
  next_chunk_.v.store(0, std::memory_order_relaxed);
  const uint32_t g = generation_.v.load(std::memory_order_relaxed) + 1;
  state_.v.store(static_cast<uint64_t>(g) << 32, std::memory_order_release);  // open, 0 joined
  generation_.v.store(g);  // seq_cst: publishes the job and orders against sleepers_ below
  if (sleepers_.v.load() > 0) futex_wake_all(&generation_.v);

  work_on_current_job(0);
  const int64_t t_own = prof ? profile::now_ns() : 0;

  // All chunks are claimed; close the job once no joined worker is still running one. Workers
  // that never joined (asleep, descheduled) are not waited for. A joined worker holds at most one
  // chunk here; if it is descheduled mid-chunk, yield the core to it (2 cores: it may need ours).
  for (int i = 0;; ++i) {
    uint64_t st = state_.v.load(std::memory_order_acquire);
    if ((st & kCountMask) == 0 &&
        state_.v.compare_exchange_weak(st, st | kClosed, std::memory_order_acq_rel)) {
      break;
    }
    if (i < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
  if (prof) {
    profile::note_job(static_cast<double>(profile::now_ns() - t_own), job_joins_.v.load(std::memory_order_relaxed) == 0);
  }
}

ThreadPool& default_pool() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace larder
