#include "larder/core/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace larder::profile {

namespace detail {
namespace {
bool from_env() {
  const char* e = std::getenv("LARDER_PROFILE");
  return e && *e && std::strcmp(e, "0") != 0;
}
}  // namespace
std::atomic<bool> g_enabled{from_env()};
}  // namespace detail

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, int> index;
  std::vector<OpStat> ops;
  PoolStat pool;
};

Registry& reg() {
  static Registry* r = new Registry;  // leaked: used from an atexit handler
  return *r;
}

thread_local Scope* tl_top = nullptr;
thread_local const char* tl_label = nullptr;

// LARDER_PROFILE=1 on any verb: the table goes to stderr at exit (bench --profile prints its own).
struct AtExit {
  AtExit() {
    if (detail::g_enabled.load()) {
      std::atexit([] {
        if (!enabled()) return;
        const std::string t = format_table(snapshot(), pool_snapshot(), 0);
        std::fprintf(stderr, "%s", t.c_str());
      });
    }
  }
} g_at_exit;

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void set_enabled(bool on) { detail::g_enabled.store(on); }

void Scope::open(const char* name, double bytes) {
  Registry& r = reg();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto [it, fresh] = r.index.try_emplace(name, static_cast<int>(r.ops.size()));
    if (fresh) {
      r.ops.emplace_back();
      r.ops.back().name = name;
    }
    index_ = it->second;
  }
  active_ = true;
  bytes_ = bytes;
  parent_ = tl_top;
  tl_top = this;
  t0_ = now_ns();
}

void Scope::close() {
  const double dt = static_cast<double>(now_ns() - t0_);
  tl_top = parent_;
  if (parent_) parent_->child_ns_ += dt;
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  OpStat& s = r.ops[static_cast<size_t>(index_)];
  s.calls += 1;
  s.total_ns += dt;
  s.self_ns += dt - child_ns_;
  s.bytes += bytes_;
  s.jobs += jobs_;
  s.jobs_alone += alone_;
  s.join_wait_ns += wait_ns_;
}

void Label::open(const char* label) {
  active_ = true;
  prev_ = tl_label;
  tl_label = label;
}
void Label::close() { tl_label = prev_; }
const char* current_label() { return tl_label; }

void note_job(double join_wait_ns, bool alone) {
  if (Scope* s = tl_top) {
    s->jobs_ += 1;
    s->alone_ += alone ? 1 : 0;
    s->wait_ns_ += join_wait_ns;
  }
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pool.jobs += 1;
  r.pool.join_wait_ns += join_wait_ns;
}

void note_join(double latency_ns) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pool.joins += 1;
  r.pool.join_latency_ns += latency_ns;
}

void reset() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  for (OpStat& s : r.ops) {
    const std::string name = std::move(s.name);
    s = OpStat{};
    s.name = name;
  }
  r.pool = PoolStat{};
}

std::vector<OpStat> snapshot() {
  Registry& r = reg();
  std::vector<OpStat> out;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (const OpStat& s : r.ops)
      if (s.calls > 0) out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) { return a.self_ns > b.self_ns; });
  return out;
}

PoolStat pool_snapshot() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.pool;
}

std::string format_table(const std::vector<OpStat>& ops, const PoolStat& pool, double steps) {
  const bool per_step = steps > 0;
  const double div = per_step ? steps : 1.0;
  double total = 0;
  for (const OpStat& s : ops) total += s.self_ns;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-76s %9s %11s %6s %8s %8s %11s %8s\n", "op (self time)",
                per_step ? "calls/tok" : "calls", per_step ? "us/tok" : "us", "%", "GB/s", per_step ? "jobs/tok" : "jobs",
                "join wait us", "alone %");
  out += line;
  for (const OpStat& s : ops) {
    const double us = s.self_ns / 1e3 / div;
    char gbs[32] = "";
    // GB/s over the whole scope (a matmul's time includes its fork/join)
    if (s.bytes > 0 && s.total_ns > 0) std::snprintf(gbs, sizeof gbs, "%.1f", s.bytes / s.total_ns);
    std::snprintf(line, sizeof line, "%-76.76s %9.1f %11.1f %6.1f %8s %8.1f %11.1f %8.1f\n", s.name.c_str(),
                  static_cast<double>(s.calls) / div, us, total > 0 ? 100.0 * s.self_ns / total : 0.0, gbs,
                  static_cast<double>(s.jobs) / div, s.join_wait_ns / 1e3 / div,
                  s.jobs ? 100.0 * static_cast<double>(s.jobs_alone) / static_cast<double>(s.jobs) : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-76s %9s %11.1f %6.1f\n", "total", "", total / 1e3 / div, 100.0);
  out += line;
  std::snprintf(line, sizeof line,
                "pool: %.1f jobs%s, worker joined %.0f %% of them, publish->join %.2f us avg, caller join wait %.1f us%s\n",
                static_cast<double>(pool.jobs) / div, per_step ? "/tok" : "",
                pool.jobs ? 100.0 * static_cast<double>(pool.joins) / static_cast<double>(pool.jobs) : 0.0,
                pool.joins ? pool.join_latency_ns / 1e3 / static_cast<double>(pool.joins) : 0.0,
                pool.join_wait_ns / 1e3 / div, per_step ? "/tok" : "");
  out += line;
  return out;
}

}  // namespace larder::profile
