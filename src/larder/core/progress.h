// progress.h — one progress reporter for long work (downloads, model loading, quantization,
// evaluation), so every verb shows progress the same way.
//
// On a terminal it redraws one line in place (bar, percentage, amount, speed, ETA) at most ten
// times a second. When stderr is not a terminal (CI logs, pipes, `2> file`) a carriage-return
// bar would be noise, so it writes plain lines instead: one at start, one per 10 % step (or
// every 10 s, whichever comes first), one at the end. LARDER_PROGRESS=0 silences it,
// =plain forces lines, =bar forces the bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace larder {

class Progress {
 public:
  enum class Unit { kBytes, kItems };
  enum class Style { kOff, kPlain, kBar };

  // total == 0: unknown (no percentage or ETA). `start` counts work already done before this
  // session (a resumed download): shown in the amount, left out of the speed.
  Progress(std::string label, uint64_t total, Unit unit = Unit::kBytes, uint64_t start = 0, FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Absolute amount done; thread-safe, cheap when nothing needs drawing.
  void update(uint64_t done);
  void add(uint64_t n);
  // A short note after the numbers (the tensor being quantized, the file being read).
  void set_detail(std::string detail);
  // Final line: "done" with the total time, or `failure` instead.
  void finish(const std::string& failure = {});

  // The style the environment selects for `out` (LARDER_PROGRESS, isatty).
  static Style style_for(FILE* out);
  // "1.5 GiB", "12.0 MiB", "980 B".
  static std::string format_bytes(double bytes);

 private:
  void draw_locked(bool final_line, const std::string& failure);
  std::string amount_locked(uint64_t v) const;

  std::mutex mu_;
  std::string label_, detail_;
  uint64_t total_ = 0, start_ = 0, done_ = 0;
  Unit unit_;
  FILE* out_;
  Style style_;
  bool finished_ = false;
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_, last_draw_;
  int last_decile_ = -1;
  size_t last_width_ = 0;
};

// For callbacks shaped (i, n, what) — quantize's per-tensor and sensitivity steps, eval's
// chunks: one Progress per phase, a new one whenever n changes or i starts over.
class ProgressSteps {
 public:
  explicit ProgressSteps(std::string label) : label_(std::move(label)) {}
  void step(size_t i, size_t n, const std::string& what);
  void finish(const std::string& failure = {});

 private:
  std::string label_;
  std::unique_ptr<Progress> p_;
  size_t n_ = 0, last_ = 0;
};

}  // namespace larder
