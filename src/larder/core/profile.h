// profile.h — an opt-in per-op timeline of forward passes: where a decode step's time goes.
//
// Off by default; `LARDER_PROFILE=1` (any verb: the table is printed to stderr at exit) or
// `larder bench --profile` (a separate profiled decode run after the timed ones) turns it on.
// Every kernels/ops.h entry point opens a Scope named after the op and its operand (a matmul:
// format and shape), the model layer adds a few of its own (the forward itself, the K/V write),
// and the thread pool reports each job's fork/join costs to the innermost open scope of the
// calling thread. Scopes nest; a scope's *self* time excludes its children, so the self times
// add up to the wall time of the outermost scope and "forward (self)" is what no op accounts for.
//
// Cost when off: one relaxed atomic load per op. When on: two clock reads and a mutex-protected
// map update per op (~100 ns; a 1B decode step has ~200 ops, ~0.1 % of a 30 ms step).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace larder::profile {

namespace detail {
extern std::atomic<bool> g_enabled;
}

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
void set_enabled(bool on);

// One row of the table: totals over every call since the last reset().
struct OpStat {
  std::string name;
  uint64_t calls = 0;
  double self_ns = 0;     // wall time inside the scope minus its child scopes
  double total_ns = 0;    // wall time inside the scope
  double bytes = 0;       // bytes the op must read (weights, K/V) — for GB/s
  uint64_t jobs = 0;      // thread-pool jobs the calling thread submitted inside the scope
  double join_wait_ns = 0;  // of which: the caller waiting for workers after its own chunks ran out
  uint64_t jobs_alone = 0;  // jobs no worker joined (asleep or descheduled): the caller did it all
};

// Pool-wide counters (all jobs, scoped or not).
struct PoolStat {
  uint64_t jobs = 0, joins = 0;  // jobs submitted; worker joins (a worker may join each job once)
  double join_latency_ns = 0;    // sum over joins: job published -> worker joined
  double join_wait_ns = 0;       // sum over jobs: caller's wait for joined workers at the end
};

class Scope {
 public:
  // name is copied only when profiling is on; bytes: what the op reads (0 = not a stream).
  explicit Scope(const char* name, double bytes = 0) {
    if (enabled()) open(name, bytes);
  }
  ~Scope() {
    if (active_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(const char* name, double bytes);
  void close();
  bool active_ = false;
  int index_ = -1;
  double bytes_ = 0;
  int64_t t0_ = 0;
  double child_ns_ = 0;
  Scope* parent_ = nullptr;
  friend void note_job(double, bool);
  friend void add_child_time(Scope*, double);
  uint64_t jobs_ = 0, alone_ = 0;
  double wait_ns_ = 0;
};

// A label for the ops the calling thread runs inside it (a model projection: "self_attn.q_proj"):
// matmul scopes append it to their name, so the table splits one matmul shape by the projections
// that run it. Labels do not nest (the innermost wins); `label` must outlive the Label.
class Label {
 public:
  explicit Label(const char* label) {
    if (enabled()) open(label);
  }
  ~Label() {
    if (active_) close();
  }
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  void open(const char* label);
  void close();
  bool active_ = false;
  const char* prev_ = nullptr;
};
// The calling thread's current label, or nullptr.
const char* current_label();

// Thread-pool hooks (called only while enabled()).
void note_job(double join_wait_ns, bool alone);  // by the submitting thread, after the job closed
void note_join(double latency_ns);                // by a worker, when it joins a job

// Monotonic nanoseconds (steady_clock).
int64_t now_ns();

void reset();
std::vector<OpStat> snapshot();  // sorted by self time, largest first
PoolStat pool_snapshot();

// The table as text: per op calls/step, µs/step (self), % of the summed self time, GB/s where the
// op streams bytes, pool jobs/step and the caller's join wait; then the pool summary.
// `steps`: how many forward passes the counters cover (decode tokens), for the per-step columns.
std::string format_table(const std::vector<OpStat>& ops, const PoolStat& pool, double steps);

}  // namespace larder::profile
