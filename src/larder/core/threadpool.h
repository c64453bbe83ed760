// threadpool.h — the persistent compute pool that runs kernel chunks for the engine thread.
//
// Why this shape (system.md §4, performance.md §4 rule 7):
// - Workers = physical cores by default, and the calling thread is one of them: on the 2-core dev
//   machine a pool of 2 means 1 extra thread, and the engine thread does half the work instead of
//   sleeping on a condition variable.
// - One job at a time, split into `n_chunks` chunks claimed from a single atomic counter
//   (dynamic balancing): a matmul splits its output rows into ~8 chunks per thread, so a core
//   slowed by a neighbour's compile simply claims fewer chunks instead of stalling the barrier.
// - Every shared counter sits on its own 64-byte line: the chunk counter is hammered by all
//   threads, the job generation is read by spinning workers, and the done counter is written
//   once per job by each worker; sharing a line would make every claim a coherence miss for the
//   spinners.
// - Spin, then sleep: a decode step issues a few hundred matmuls ~10-100 µs apart, and a futex
//   wake costs ~5-20 µs on a KVM guest, so workers spin (with `pause`) for a bounded time after a
//   job and only then sleep on a futex. The spin budget is short (default 100 µs) because the
//   machine is shared: a spinning worker steals a core from whoever else runs.
// - The caller never waits for a worker that has not started: a worker must *join* a job (CAS on
//   one state word: generation | closed | joined count) before it may claim chunks, and the caller
//   closes the job once its own claim loop is exhausted and the joined count is zero. On a shared
//   2-core host a descheduled worker therefore costs nothing; an earlier "every worker checks in"
//   design made each job wait a scheduler slice under load (430 µs per empty job at load 6).
// - parallel_for called from inside a chunk runs serially (no nested parallelism, no deadlock).
// - Callers from several threads are serialized by a mutex; the engine is the only real caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace larder {

class ThreadPool {
 public:
  // n_threads <= 0: cpu_features().physical_cores. The count includes the calling thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Resize (joins and restarts workers). Not to be called while a job runs.
  void set_threads(int n_threads);
  int n_threads() const { return n_threads_; }

  // How long an idle worker spins before sleeping on the futex (microseconds; 0 = sleep at once).
  void set_spin_us(int us) { spin_us_.store(us, std::memory_order_relaxed); }

  // Pin worker i to CPU i+1 (the caller is left where the OS put it). Off by default: on a
  // shared development host a pinned worker cannot escape a neighbour's busy core. Production
  // serving turns it on (system.md §4).
  void set_pinning(bool on);

  // Runs fn(chunk, thread_index) for every chunk in [0, n_chunks), on all pool threads; returns
  // when all chunks are done. thread_index is in [0, n_threads) and unique among concurrently
  // running chunks (0 = the caller), so fn may index per-thread scratch with it.
  template <class F>
  void parallel_for(int64_t n_chunks, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n_chunks, [](void* ctx, int64_t c, int t) { (*static_cast<Fn*>(ctx))(c, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  using ChunkFn = void (*)(void* ctx, int64_t chunk, int thread);
  void run(int64_t n_chunks, ChunkFn fn, void* ctx);

 private:
  struct alignas(64) PaddedAtomicI64 {
    std::atomic<int64_t> v{0};
  };
  struct alignas(64) PaddedAtomicU32 {
    std::atomic<uint32_t> v{0};
  };

  void start_workers();
  void stop_workers();
  void worker_main(int index, uint32_t seen_generation);
  void work_on_current_job(int thread);

  int n_threads_ = 1;
  bool pin_ = false;
  std::vector<std::thread> workers_;
  std::mutex submit_mu_;

  // The current job. Written by the submitter before it bumps generation_ (release), read by
  // workers after they observe the new generation (acquire).
  ChunkFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_chunks_ = 0;

  struct alignas(64) PaddedAtomicU64 {
    std::atomic<uint64_t> v{0};
  };
  static constexpr uint64_t kClosed = uint64_t{1} << 31;
  static constexpr uint64_t kCountMask = kClosed - 1;

  PaddedAtomicI64 next_chunk_;  // claimed by fetch_add
  PaddedAtomicU32 generation_;  // futex word: bumped once per job (and on shutdown)
  PaddedAtomicU64 state_;       // (generation << 32) | closed bit | workers joined
  PaddedAtomicU32 sleepers_;    // workers currently (about to be) in futex_wait
  // Profiling only (core/profile.h): when the current job was published, how many workers joined it.
  PaddedAtomicI64 publish_ns_;
  PaddedAtomicU32 job_joins_;
  std::atomic<bool> stop_{false};
  std::atomic<int> spin_us_{100};
};

// The process-wide pool used by kernels (created on first use with physical_cores threads).
ThreadPool& default_pool();

// Convenience: default_pool().parallel_for(...).
template <class F>
inline void parallel_for(int64_t n_chunks, F&& fn) {
  default_pool().parallel_for(n_chunks, static_cast<F&&>(fn));
}

}  // namespace larder
