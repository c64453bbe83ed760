#include "larder/runtime/speculative.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "larder/kernels/batch_invariance.h"
#include "larder/kernels/ops.h"
#include "larder/runtime/loaded_model.h"

namespace larder::runtime {

namespace {
constexpr double kMinRate = 0.2;   // below (or below SpecOptions::draft_cost): drafting pauses
constexpr double kDecay = 0.7;     // weight of the past in the acceptance average
constexpr int kMaxPause = 256;     // steps
constexpr int64_t kDraftPrefillChunk = 512;  // tokens per forward when the draft catches up

// ModelInfo::weight_dtypes names ("Q4_K", "affine-q4-g64") as kernels/batch_invariance.h names
// formats ("Q4_K", "affine4g64").
std::string invariance_format(const std::string& d) {
  int bits = 0, group = 0;
  if (std::sscanf(d.c_str(), "affine-q%d-g%d", &bits, &group) == 2)
    return "affine" + std::to_string(bits) + "g" + std::to_string(group);
  return d;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s) out += c < 0x20 ? strfmt("\\x%02x", c) : std::string(1, static_cast<char>(c));
  return out + "'";
}
}  // namespace

bool speculation_possible(const memory::SequenceState& state) {
  return state.layers.empty() && state.attachments.empty();
}

bool speculation_exact(const models::Model& model, std::string* why) {
  const std::string mode = kernels::active_decode_mode();
  std::stringstream ss(model.info().weight_dtypes);
  for (std::string d; std::getline(ss, d, '+');) {
    if (d.empty()) continue;
    if (const char* gap = kernels::batch_variance(mode, invariance_format(d))) {
      if (why) *why = strfmt("%s weights on the %s kernels are not batch-invariant (%s)", d.c_str(), mode.c_str(), gap);
      return false;
    }
  }
  return true;
}

Status check_draft_vocab(const LoadedModel& target, const LoadedModel& draft) {
  const tokenizer::Tokenizer& t = *target.tokenizer;
  const tokenizer::Tokenizer& d = *draft.tokenizer;
  const auto refuse = [](const std::string& what) {
    return invalid_argument("[spec] the draft model cannot draft for this model: " + what +
                            " (a draft model must share the target's tokenizer, e.g. a smaller model of the same family)");
  };
  if (t.vocab_size() != d.vocab_size())
    return refuse(strfmt("its vocabulary has %d tokens, the target's %d", d.vocab_size(), t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const std::string a = t.id_to_token(id), b = d.id_to_token(id);
    if (a != b)
      return refuse(strfmt("token %d is %s in the target and %s in the draft", id, quoted(a).c_str(), quoted(b).c_str()));
    if (t.is_special(id) != d.is_special(id))
      return refuse(strfmt("token %d (%s) is special in the %s only", id, quoted(a).c_str(),
                           t.is_special(id) ? "target" : "draft"));
  }
  // BOS/EOS choices are not compared: they are the target's generation settings (which EOS ids end
  // a generation comes from its generation_config or GGUF metadata, and the target's decode step
  // applies them), and the draft only proposes ids — a draft past an EOS is simply not taken.
  return Status::ok();
}

// ---- the shared policy -------------------------------------------------------------------

Drafter::Drafter(SpecOptions o) : o_(o) {
  o_.ngram_min = std::max(1, o_.ngram_min);
  o_.ngram_max = std::max(o_.ngram_min, o_.ngram_max);
  o_.draft_max = std::max(0, o_.draft_max);
  o_.draft_min = std::clamp(o_.draft_min, 0, o_.draft_max);
  k_ = o_.draft_max;
  min_rate_ = std::clamp(o_.draft_cost, kMinRate, 0.9);
}

std::vector<int32_t> Drafter::draft(const std::vector<int32_t>& history, int64_t limit) {
  if (pause_ > 0) {
    --pause_;
    return {};
  }
  const int64_t want = std::min<int64_t>(k_, limit);
  if (want <= 0 || want < o_.draft_min) return {};
  std::vector<int32_t> d = propose(history, want);
  if (static_cast<int64_t>(d.size()) > want) d.resize(static_cast<size_t>(want));
  if (static_cast<int>(d.size()) < o_.draft_min) d.clear();
  return d;
}

void Drafter::feedback(int drafted, int accepted) {
  if (drafted <= 0) return;
  drafted_ += drafted;
  accepted_ += accepted;
  rate_ = kDecay * rate_ + (1 - kDecay) * (static_cast<double>(accepted) / drafted);
  // All taken: the text repeats, look further ahead. Otherwise draft one past what was taken.
  const int lo = std::max(1, o_.draft_min), hi = std::max(lo, o_.draft_max);
  k_ = accepted == drafted ? std::min(hi, std::max(1, k_) * 2) : std::clamp(accepted + 1, lo, hi);
  if (rate_ < min_rate_) {
    pause_ = next_pause_;
    next_pause_ = std::min(kMaxPause, next_pause_ * 2);
    rate_ = std::min(1.0, min_rate_ + 0.3);  // after the pause the drafter gets a fresh chance
  }
}

// ---- prompt lookup -----------------------------------------------------------------------

NgramDrafter::NgramDrafter(SpecOptions o) : Drafter(o) {}

std::vector<int32_t> NgramDrafter::propose(const std::vector<int32_t>& history, int64_t want) {
  const int64_t H = static_cast<int64_t>(history.size());
  for (int64_t n = std::min<int64_t>(options().ngram_max, H - 1); n >= options().ngram_min; --n) {
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

// ---- draft model -------------------------------------------------------------------------

DraftModelDrafter::DraftModelDrafter(SpecOptions o, int64_t max_tokens)
    : Drafter(o),
      m_(*o.draft_model),
      state_(o.draft_model->new_state(std::min(max_tokens, o.draft_model->info().max_context))),
      logits_(static_cast<size_t>(o.draft_model->info().vocab)) {}

bool DraftModelDrafter::catch_up(const std::vector<int32_t>& history, int64_t upto) {
  int64_t keep = 0;
  const int64_t shared = std::min<int64_t>(static_cast<int64_t>(fed_.size()), upto - 1);
  while (keep < shared && fed_[static_cast<size_t>(keep)] == history[static_cast<size_t>(keep)]) ++keep;
  const auto fail = [&](const Status& s) {
    error_ = s.message();
    return false;
  };
  if (keep < state_.length()) {
    if (Status s = state_.trim(keep); !s.is_ok()) return fail(s);
  }
  fed_.resize(static_cast<size_t>(keep));
  for (int64_t at = keep; at < upto; at += kDraftPrefillChunk) {
    const int64_t n = std::min(kDraftPrefillChunk, upto - at);
    if (Status s = m_.forward(history.data() + at, n, state_, logits_.data(), false); !s.is_ok()) return fail(s);
    fed_.insert(fed_.end(), history.begin() + at, history.begin() + at + n);
  }
  return true;
}

void DraftModelDrafter::prefill(const std::vector<int32_t>& history) {
  const int64_t H = static_cast<int64_t>(history.size());
  if (error_.empty() && H > 1 && H <= state_.max_tokens()) (void)catch_up(history, H - 1);
}

std::vector<int32_t> DraftModelDrafter::propose(const std::vector<int32_t>& history, int64_t want) {
  if (!error_.empty() || history.empty()) return {};
  const int64_t H = static_cast<int64_t>(history.size());
  // Room in the draft's state for the history and want - 1 drafted tokens forwarded.
  want = std::min(want, state_.max_tokens() - H + 1);
  if (want <= 0) return {};
  // The draft's last logits must follow history's last token: at most H - 1 shared tokens are kept.
  if (!catch_up(history, H)) return {};
  // Greedy over the ids both models have.
  const int64_t V = std::min<int64_t>(static_cast<int64_t>(logits_.size()),
                                      options().target_vocab > 0 ? options().target_vocab : INT64_MAX);
  std::vector<int32_t> out;
  while (true) {
    const int32_t t = static_cast<int32_t>(kernels::argmax(logits_.data(), V));
    out.push_back(t);
    if (static_cast<int64_t>(out.size()) >= want) break;
    if (Status s = m_.forward(&t, 1, state_, logits_.data(), false); !s.is_ok()) {
      error_ = s.message();
      return {};
    }
    fed_.push_back(t);
  }
  return out;
}

std::unique_ptr<Drafter> make_drafter(const SpecOptions& o, const memory::SequenceState& state, int64_t ctx) {
  if (o.draft_max <= 0 || !speculation_possible(state)) return nullptr;
  if (o.draft_model) {
    // The draft's own state must trim back too (its rejected tokens go the same way).
    if (!speculation_possible(o.draft_model->new_state(1))) return nullptr;
    return std::make_unique<DraftModelDrafter>(o, ctx);
  }
  return std::make_unique<NgramDrafter>(o);
}

}  // namespace larder::runtime
