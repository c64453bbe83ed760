#include "larder/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace larder {

namespace {

std::string hms(double s) {
  if (s < 0 || s > 360000) return "--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  }
  return buf;
}

std::string per_second(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 10 ? "%.0f/s" : "%.2f/s", r);
  return buf;
}

}  // namespace

Progress::Style Progress::style_for(FILE* out) {
  const char* env = std::getenv("LARDER_PROGRESS");
  if (env && *env) {
    if (!std::strcmp(env, "0") || !std::strcmp(env, "off")) return Style::kOff;
    if (!std::strcmp(env, "plain")) return Style::kPlain;
    if (!std::strcmp(env, "bar")) return Style::kBar;
  }
  return isatty(fileno(out)) ? Style::kBar : Style::kPlain;
}

std::string Progress::format_bytes(double b) {
  char buf[32];
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else if (b >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  } else if (b >= 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

Progress::Progress(std::string label, uint64_t total, Unit unit, uint64_t start, FILE* out)
    : label_(std::move(label)), total_(total), start_(start), done_(start), unit_(unit), out_(out),
      style_(style_for(out)) {
  t0_ = last_draw_ = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (style_ == Style::kPlain) {
    draw_locked(false, {});
    last_decile_ = total_ ? static_cast<int>(10 * done_ / total_) : 0;
  }
}

Progress::~Progress() { finish(); }

void Progress::add(uint64_t n) {
  uint64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v = done_ + n;
  }
  update(v);
}

void Progress::set_detail(std::string detail) {
  std::lock_guard<std::mutex> lock(mu_);
  detail_ = std::move(detail);
}

void Progress::update(uint64_t done) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = done;
  if (finished_ || style_ == Style::kOff) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_draw_).count();
  if (style_ == Style::kBar) {
    if (since >= 0.1) draw_locked(false, {});
    return;
  }
  const int decile = total_ ? static_cast<int>(10 * std::min(done_, total_) / total_) : 0;
  // The 100 % line is the final one (finish), not a decile line.
  if ((decile > last_decile_ && decile < 10) || since >= 10.0) {
    last_decile_ = decile;
    draw_locked(false, {});
  }
}

void Progress::finish(const std::string& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (style_ == Style::kOff) return;
  draw_locked(true, failure);
}

std::string Progress::amount_locked(uint64_t v) const {
  if (unit_ == Unit::kBytes) return format_bytes(static_cast<double>(v));
  return std::to_string(v);
}

void Progress::draw_locked(bool final_line, const std::string& failure) {
  const auto now = Clock::now();
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - t0_).count();
  const uint64_t fresh = done_ > start_ ? done_ - start_ : 0;
  const double rate = elapsed > 0.05 ? fresh / elapsed : 0.0;
  std::string line = label_;
  line += "  ";
  if (total_) {
    const double frac = std::min(1.0, static_cast<double>(done_) / total_);
    if (style_ == Style::kBar) {
      const int width = 24, fill = static_cast<int>(frac * width + 1e-9);
      line += '[' + std::string(fill, '#') + std::string(width - fill, '.') + "] ";
    }
    char pct[16];
    std::snprintf(pct, sizeof pct, "%3.0f%% ", frac * 100);
    line += pct;
    line += amount_locked(done_) + "/" + amount_locked(total_);
  } else {
    line += amount_locked(done_);
  }
  if (final_line) {
    line += failure.empty() ? "  done in " + hms(elapsed) : "  failed: " + failure;
    if (failure.empty() && rate > 0 && unit_ == Unit::kBytes) line += " (" + format_bytes(rate) + "/s)";
  } else if (fresh > 0 && elapsed > 0.2) {
    line += "  " + (unit_ == Unit::kBytes ? format_bytes(rate) + "/s" : per_second(rate));
    if (total_ && done_ < total_ && rate > 0) line += "  ETA " + hms((total_ - done_) / rate);
  }
  if (!detail_.empty() && !final_line) line += "  " + detail_;
  if (style_ == Style::kBar) {
    // Pad over the previous, possibly longer, line; end with a newline only when done.
    std::string padded = line;
    if (padded.size() < last_width_) padded.append(last_width_ - padded.size(), ' ');
    last_width_ = line.size();
    std::fprintf(out_, "\r%s%s", padded.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressSteps::step(size_t i, size_t n, const std::string& what) {
  if (!p_ || n != n_ || i < last_) {
    if (p_) p_->finish();
    p_ = std::make_unique<Progress>(label_, n, Progress::Unit::kItems);
    n_ = n;
  }
  last_ = i;
  p_->set_detail(what);
  p_->update(i);
}

void ProgressSteps::finish(const std::string& failure) {
  if (p_) p_->finish(failure);
  p_.reset();
}

}  // namespace larder
