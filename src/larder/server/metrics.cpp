#include "larder/server/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "larder/core/log.h"

namespace larder::server {

namespace {

const std::vector<double> kSeconds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
const std::vector<double> kTps = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < le_.size() && v > le_[i]) ++i;
  if (i < le_.size()) ++counts_[i];
  ++count_;
  sum_ += v;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cum = 0;
  for (size_t i = 0; i < le_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{" + labels + sep + "le=\"" + num(le_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
  const std::string l = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + l + " " + num(sum_) + "\n";
  out += name + "_count" + l + " " + std::to_string(count_) + "\n";
}

double Histogram::quantile(double q) const {
  if (count_ == 0) return 0;
  const double target = q * static_cast<double>(count_);
  uint64_t cum = 0;
  double lo = 0;
  for (size_t i = 0; i < le_.size(); ++i) {
    if (static_cast<double>(cum + counts_[i]) >= target && counts_[i] > 0) {
      const double frac = (target - static_cast<double>(cum)) / static_cast<double>(counts_[i]);
      return lo + (le_[i] - lo) * std::min(1.0, std::max(0.0, frac));
    }
    cum += counts_[i];
    lo = le_[i];
  }
  return le_.empty() ? 0 : le_.back();
}

Metrics::Metrics() : ttft_(kSeconds), prefill_tps_(kTps), decode_tps_(kTps) {}

void Metrics::request_done(const std::string& route, int status, double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{route, status}];
  duration_.try_emplace(route, kSeconds).first->second.observe(seconds);
}

void Metrics::generation_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens,
                              double ttft_s, double prefill_tps, double decode_tps) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  generated_tokens_ += static_cast<uint64_t>(completion_tokens);
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (prefill_tps > 0) prefill_tps_.observe(prefill_tps);
  if (decode_tps > 0) decode_tps_.observe(decode_tps);
}

void Metrics::speculation(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> l(mu_);
  drafted_tokens_ += static_cast<uint64_t>(drafted);
  accepted_tokens_ += static_cast<uint64_t>(accepted);
}

void Metrics::cancelled(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  ++cancelled_[reason];
}

void Metrics::set_model_info(std::string model, std::string quant, std::string isa) {
  std::lock_guard<std::mutex> l(mu_);
  model_ = std::move(model);
  quant_ = std::move(quant);
  isa_ = std::move(isa);
}

std::string Metrics::prometheus(size_t queue_depth, size_t active) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  o += "# HELP larder_requests_total HTTP requests by route and status.\n# TYPE larder_requests_total counter\n";
  for (const auto& [k, v] : requests_) {
    o += "larder_requests_total{route=\"" + prometheus_label_escape(k.first) + "\",status=\"" + std::to_string(k.second) +
         "\"} " + std::to_string(v) + "\n";
  }
  o += "# HELP larder_request_duration_seconds Request wall time by route.\n"
       "# TYPE larder_request_duration_seconds histogram\n";
  for (const auto& [route, h] : duration_) h.render(o, "larder_request_duration_seconds", "route=\"" + prometheus_label_escape(route) + "\"");
  o += "# HELP larder_time_to_first_token_seconds Arrival to first generated token.\n"
       "# TYPE larder_time_to_first_token_seconds histogram\n";
  ttft_.render(o, "larder_time_to_first_token_seconds");
  o += "# TYPE larder_prefill_tokens_per_second histogram\n";
  prefill_tps_.render(o, "larder_prefill_tokens_per_second");
  o += "# TYPE larder_decode_tokens_per_second histogram\n";
  decode_tps_.render(o, "larder_decode_tokens_per_second");
  o += "# TYPE larder_prompt_tokens_total counter\nlarder_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  o += "# TYPE larder_cached_prompt_tokens_total counter\nlarder_cached_prompt_tokens_total " +
       std::to_string(cached_tokens_) + "\n";
  o += "# TYPE larder_generated_tokens_total counter\nlarder_generated_tokens_total " +
       std::to_string(generated_tokens_) + "\n";
  o += "# HELP larder_spec_drafted_tokens_total Draft tokens verified (--spec).\n"
       "# TYPE larder_spec_drafted_tokens_total counter\nlarder_spec_drafted_tokens_total " +
       std::to_string(drafted_tokens_) + "\n";
  o += "# HELP larder_spec_accepted_tokens_total Draft tokens the decode step picked (--spec).\n"
       "# TYPE larder_spec_accepted_tokens_total counter\nlarder_spec_accepted_tokens_total " +
       std::to_string(accepted_tokens_) + "\n";
  o += "# TYPE larder_queue_depth gauge\nlarder_queue_depth " + std::to_string(queue_depth) + "\n";
  o += "# TYPE larder_active_requests gauge\nlarder_active_requests " + std::to_string(active) + "\n";
  o += "# HELP larder_cancelled_total Requests cancelled before finishing, by reason.\n"
       "# TYPE larder_cancelled_total counter\n";
  if (cancelled_.empty()) o += "larder_cancelled_total{reason=\"client_disconnect\"} 0\n";
  for (const auto& [r, v] : cancelled_) o += "larder_cancelled_total{reason=\"" + prometheus_label_escape(r) + "\"} " + std::to_string(v) + "\n";
  o += "# TYPE larder_model_info gauge\nlarder_model_info{model=\"" + prometheus_label_escape(model_) + "\",quant=\"" +
       prometheus_label_escape(quant_) + "\",isa=\"" + prometheus_label_escape(isa_) + "\"} 1\n";
  o += "# TYPE larder_process_resident_bytes gauge\nlarder_process_resident_bytes " +
       std::to_string(process_resident_bytes()) + "\n";
  return o;
}

nlohmann::json Metrics::json() const {
  std::lock_guard<std::mutex> l(mu_);
  nlohmann::json j;
  uint64_t total = 0;
  for (const auto& [k, v] : requests_) total += v;
  j["requests_total"] = total;
  j["prompt_tokens_total"] = prompt_tokens_;
  j["cached_prompt_tokens_total"] = cached_tokens_;
  j["generated_tokens_total"] = generated_tokens_;
  j["spec_drafted_tokens_total"] = drafted_tokens_;
  j["spec_accepted_tokens_total"] = accepted_tokens_;
  j["ttft_seconds"] = {{"p50", ttft_.quantile(0.5)}, {"p99", ttft_.quantile(0.99)}, {"count", ttft_.count()}};
  j["cancelled"] = cancelled_;
  return j;
}

uint64_t process_resident_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace larder::server
