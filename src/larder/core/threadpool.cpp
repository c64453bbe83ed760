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
  done_.v.store(0);
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
    work_on_current_job(index + 1);
    done_.v.fetch_add(1, std::memory_order_acq_rel);
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
  const uint32_t n_workers = static_cast<uint32_t>(workers_.size());
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_chunks_ = n_chunks;
  next_chunk_.v.store(0, std::memory_order_relaxed);
  done_.v.store(0, std::memory_order_relaxed);
  generation_.v.fetch_add(1);  // seq_cst: publishes the job and orders against sleepers_ below
  if (sleepers_.v.load() > 0) futex_wake_all(&generation_.v);

  work_on_current_job(0);

  // Every worker checks in once per job, even with no chunk left, so the job fields above stay
  // valid until nobody can read them. Workers are normally spinning, so this wait is short; if
  // one is asleep or descheduled, yield the core to it (2 cores: it may be waiting for ours).
  for (int i = 0; done_.v.load(std::memory_order_acquire) != n_workers; ++i) {
    if (i < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

ThreadPool& default_pool() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace larder
