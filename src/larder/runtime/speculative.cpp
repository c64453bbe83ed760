#include "larder/runtime/speculative.h"

#include <algorithm>

namespace larder::runtime {

namespace {
constexpr double kMinRate = 0.2;   // below: drafting pauses
constexpr double kDecay = 0.7;     // weight of the past in the acceptance average
constexpr int kMaxPause = 256;     // steps
}  // namespace

bool speculation_possible(const memory::SequenceState& state) {
  return state.layers.empty() && state.attachments.empty();
}

NgramDrafter::NgramDrafter(SpecOptions o) : o_(o) {
  o_.ngram_min = std::max(1, o_.ngram_min);
  o_.ngram_max = std::max(o_.ngram_min, o_.ngram_max);
  k_ = std::max(0, o_.draft_max);
}

std::vector<int32_t> NgramDrafter::draft(const std::vector<int32_t>& history, int64_t limit) {
  if (pause_ > 0) {
    --pause_;
    return {};
  }
  const int64_t want = std::min<int64_t>(k_, limit);
  const int64_t H = static_cast<int64_t>(history.size());
  if (want <= 0) return {};
  for (int64_t n = std::min<int64_t>(o_.ngram_max, H - 1); n >= o_.ngram_min; --n) {
    const int32_t* suffix = history.data() + (H - n);
    // The most recent earlier occurrence: recent text predicts the next tokens best.
    for (int64_t i = H - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, history.data() + i)) continue;
      const int64_t from = i + n, to = std::min(H, from + want);
      return std::vector<int32_t>(history.begin() + from, history.begin() + to);
    }
  }
  return {};
}

void NgramDrafter::feedback(int drafted, int accepted) {
  if (drafted <= 0) return;
  drafted_ += drafted;
  accepted_ += accepted;
  rate_ = kDecay * rate_ + (1 - kDecay) * (static_cast<double>(accepted) / drafted);
  // All taken: the text repeats, look further ahead. Otherwise draft one past what was taken.
  k_ = accepted == drafted ? std::min(o_.draft_max, std::max(1, k_) * 2)
                           : std::clamp(accepted + 1, 1, std::max(1, o_.draft_max));
  if (rate_ < kMinRate) {
    pause_ = next_pause_;
    next_pause_ = std::min(kMaxPause, next_pause_ * 2);
    rate_ = 0.5;  // after the pause the drafter gets a fresh chance
  }
}

}  // namespace larder::runtime
