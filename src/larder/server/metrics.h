// metrics.h — server counters and latency histograms for GET /metrics (Prometheus text format,
// server-api.md §11) and GET /stats. Updated from HTTP threads and the engine thread; one mutex
// (updates are a few per request or per step, never per kernel).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace larder::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds) : le_(std::move(upper_bounds)), counts_(le_.size(), 0) {}
  void observe(double v);
  // Appends `name_bucket{le=…}`, `name_sum`, `name_count` lines (labels: extra `k="v"` pairs).
  void render(std::string& out, const std::string& name, const std::string& labels = {}) const;
  uint64_t count() const { return count_; }
  double quantile(double q) const;  // bucket-interpolated estimate (for /stats)

 private:
  std::vector<double> le_;
  std::vector<uint64_t> counts_;  // non-cumulative per bucket
  uint64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_done(const std::string& route, int status, double seconds);
  void generation_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens, double ttft_s,
                       double prefill_tps, double decode_tps);
  void cancelled(const std::string& reason);
  // Speculation (--spec): draft tokens one request verified, and how many were picked.
  void speculation(int64_t drafted, int64_t accepted);
  void set_model_info(std::string model, std::string quant, std::string isa);

  // Everything but the KV store block and the live gauges, which the caller appends.
  std::string prometheus(size_t queue_depth, size_t active) const;
  nlohmann::json json() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, Histogram> duration_;
  Histogram ttft_, prefill_tps_, decode_tps_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0;
  uint64_t drafted_tokens_ = 0, accepted_tokens_ = 0;
  std::map<std::string, uint64_t> cancelled_;
  std::string model_, quant_, isa_;
};

// Resident set size of this process (bytes), from /proc/self/statm; 0 if unreadable.
uint64_t process_resident_bytes();

}  // namespace larder::server
