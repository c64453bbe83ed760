#include "larder/runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "larder/kernels/batch_invariance.h"
#include "larder/kernels/ops.h"
#include "larder/runtime/loaded_model.h"

namespace larder::runtime {

namespace {
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

// ---- measured costs ----------------------------------------------------------------------

namespace {
double median(std::vector<double>& v) {
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (v.size() % 2 == 1) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)));
}
constexpr int kFewSamples = 3;      // slope samples before their median stands in for the prior
constexpr double kMaxSlope = 2.0;   // per row, of a step: a compute-bound forward is ~1
}  // namespace

void SpecCost::forward(int64_t rows, double seconds) {
  if (rows < 1 || rows > kMaxRows || !(seconds > 0)) return;
  // A one-row forward next to a multi-row one ran under the same load (the machine's other work
  // changes over seconds, a step takes a fraction of one): their ratio is the slope's sample.
  if (last_rows_ > 0 && (last_rows_ == 1) != (rows == 1)) {
    const double one = rows == 1 ? seconds : last_seconds_, many = rows == 1 ? last_seconds_ : seconds;
    const int64_t r = std::max(rows, last_rows_);
    s_[si_] = (many / one - 1) / static_cast<double>(r - 1);
    si_ = (si_ + 1) % kWindow;
    sn_ = std::min(sn_ + 1, kWindow);
    if (sn_ >= kFewSamples) {
      std::vector<double> v(s_, s_ + sn_);
      slope_ = std::clamp(median(v), 0.0, kMaxSlope);
    }
  }
  last_rows_ = rows;
  last_seconds_ = seconds;
  f_[fi_] = seconds / (1 + slope_ * static_cast<double>(rows - 1));
  fi_ = (fi_ + 1) % kWindow;
  fn_ = std::min(fn_ + 1, kWindow);
  std::vector<double> v(f_, f_ + fn_);
  step_ = median(v);
}

void SpecCost::drafted(int64_t tokens, double seconds) {
  if (tokens < 0 || !(seconds >= 0) || last_rows_ == 0) return;
  // Per token (a draft that stopped at its first token costs a forward for none), over the one-row
  // step of the moment: the forward just before the draft, scaled to one row.
  const double step = last_seconds_ / (1 + slope_ * static_cast<double>(last_rows_ - 1));
  d_[di_] = seconds / static_cast<double>(std::max<int64_t>(tokens, 1)) / step;
  di_ = (di_ + 1) % kWindow;
  dn_ = std::min(dn_ + 1, kWindow);
  std::vector<double> v(d_, d_ + dn_);
  ratio_ = median(v);
}

// ---- the shared policy -------------------------------------------------------------------

namespace {
constexpr double kDecayCounts = 0.8;  // weight of the past in the acceptance counts, per verify
constexpr double kPriorRate = 0.75;   // a kind's acceptance before it was tried (one trial's weight)
constexpr double kMargin = 0.03;      // a draft must beat plain decoding's rate by this much
}  // namespace

Drafter::Drafter(SpecOptions o) : o_(std::move(o)) {
  o_.ngram_min = std::max(1, o_.ngram_min);
  o_.ngram_max = std::max(o_.ngram_min, o_.ngram_max);
  o_.draft_max = std::max(0, o_.draft_max);
  o_.draft_min = std::clamp(o_.draft_min, 0, o_.draft_max);
  if (!o_.cost) o_.cost = std::make_shared<SpecCost>();
  k_ = std::min(o_.draft_max, std::max(2, o_.draft_min));  // short until the pair shows its rate
}

double Drafter::acceptance(int kind) const {
  const Track& t = track_[std::clamp(kind, 0, kKinds - 1)];
  return std::min(0.98, (t.hits + kPriorRate) / (t.trials + 1));
}

int Drafter::plan(int kind, int64_t most, StepShape shape) const {
  if (o_.force) return static_cast<int>(std::max<int64_t>(0, most));
  const SpecCost& c = *o_.cost;
  if (c.step() <= 0) return 0;  // nothing measured yet: one plain step first
  const int64_t rows = std::max<int64_t>(1, shape.rows);
  const double R = static_cast<double>(std::max<int64_t>(1, shape.sequences));
  // Everything in one-row steps: the step's own length cancels out of the comparison.
  const double s = c.slope(), td = c.draft_ratio(o_.draft_cost);
  const auto forward = [&](int64_t r) { return 1 + s * static_cast<double>(r - 1); };
  const double a = acceptance(kind);
  // Tokens per step-time of the step's R sequences: R / forward(rows) plainly; with this sequence
  // drafting k, R - 1 + E_k over the step lengthened by the k verify rows and the k drafted tokens
  // (every sequence waits for both), E_k = 1 + a + … + a^k.
  const double plain = R / forward(rows) * (1 + kMargin);
  double best = plain, e = 1, p = 1;
  int best_k = 0;
  for (int k = 1; k <= most; ++k) {
    p *= a;
    e += p;
    const double rate = (R - 1 + e) / (forward(rows + k) + k * td);
    if (rate > best) best = rate, best_k = k;
  }
  return best_k;
}

int Drafter::decide(int kind, int planned, int64_t most) {
  Track& t = track_[kind];
  probing_ = false;
  if (planned > 0) {
    t.skipped = 0;
    t.next_probe = std::min(t.next_probe, kFirstProbe);
    return planned;
  }
  if (most < 1) return 0;
  if (t.skipped < t.next_probe) {
    ++t.skipped;
    ++skipped_;
    return 0;
  }
  // A probe: one token (draft_min's at least) keeps the kind's acceptance and the costs current.
  // How long until the next one follows its result (feedback).
  t.skipped = 0;
  probing_ = true;
  return static_cast<int>(std::min<int64_t>(most, std::max(1, o_.draft_min)));
}

void Drafter::probed(bool taken) {
  if (!probing_) return;
  probing_ = false;
  Track& t = track_[last_kind_];
  // Missed: back off. Taken: the acceptance rose, the same interval again — not shorter, for a
  // draft model's probe also forwards the tokens it skipped, a cost the plan does not see.
  t.next_probe = std::clamp(taken ? t.next_probe : t.next_probe * 2, kFirstProbe, kMaxProbe);
}

std::vector<int32_t> Drafter::draft(const std::vector<int32_t>& history, int64_t limit, StepShape shape) {
  const int64_t most = std::min<int64_t>(k_, limit);
  if (most <= 0 || most < o_.draft_min || (!o_.force && o_.cost->step() <= 0)) return {};
  Proposal prop;
  const auto t0 = std::chrono::steady_clock::now();
  const auto timed = [&] {
    const double s = prop.seconds >= 0 ? prop.seconds
                                        : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    o_.cost->drafted(static_cast<int64_t>(prop.tokens.size()), std::max(0.0, s - prop.untimed_seconds));
  };
  if (cheap()) {
    prop = propose(history, most);
    timed();
    const int64_t have = std::min<int64_t>(static_cast<int64_t>(prop.tokens.size()), most);
    if (have <= 0 || have < o_.draft_min) return {};
    last_kind_ = std::clamp(prop.kind, 0, kKinds - 1);
    const int k = decide(last_kind_, plan(last_kind_, have, shape), have);
    if (k <= 0 || k < o_.draft_min) return {};
    prop.tokens.resize(static_cast<size_t>(k));
  } else {
    last_kind_ = 0;
    const int k = decide(0, plan(0, most, shape), most);
    if (k <= 0) return {};
    prop = propose(history, k);
    timed();
    if (prop.tokens.empty()) {  // unsure of its first token: the draft forward was spent on nothing
      Track& t = track_[0];
      t.hits = kDecayCounts * t.hits;
      t.trials = kDecayCounts * t.trials + 1;
      probed(false);
      return {};
    }
    if (static_cast<int64_t>(prop.tokens.size()) > k) prop.tokens.resize(static_cast<size_t>(k));
    if (static_cast<int>(prop.tokens.size()) < std::max(1, o_.draft_min)) return {};
  }
  return std::move(prop.tokens);
}

void Drafter::feedback(int drafted, int accepted) {
  if (drafted <= 0) return;
  drafted_ += drafted;
  accepted_ += accepted;
  // Positions tested: every taken one, and the first miss (the ones after it were never judged).
  Track& t = track_[last_kind_];
  t.hits = kDecayCounts * t.hits + accepted;
  t.trials = kDecayCounts * t.trials + std::min(drafted, accepted + 1);
  probed(accepted == drafted);
  // All taken: the text repeats, look further ahead. Otherwise draft one past what was taken.
  const int lo = std::max(1, o_.draft_min), hi = std::max(lo, o_.draft_max);
  k_ = accepted == drafted ? std::min(hi, std::max(1, k_) * 2) : std::clamp(accepted + 1, lo, hi);
}

// ---- prompt lookup -----------------------------------------------------------------------

NgramDrafter::NgramDrafter(SpecOptions o) : Drafter(std::move(o)) {}

Drafter::Proposal NgramDrafter::propose(const std::vector<int32_t>& history, int64_t want) {
  const int64_t H = static_cast<int64_t>(history.size());
  const int64_t nmax = options().ngram_max;
  // The longest match of the suffix ending before the last token, the most recent among equals:
  // each earlier end position i is extended backwards while it agrees with the suffix.
  int64_t best_len = 0, best_end = -1;
  const int32_t last = H > 0 ? history[static_cast<size_t>(H - 1)] : 0;
  for (int64_t i = H - 2; i >= 0; --i) {
    if (history[static_cast<size_t>(i)] != last) continue;
    int64_t n = 1;
    while (n < nmax && i - n >= 0 && history[static_cast<size_t>(i - n)] == history[static_cast<size_t>(H - 1 - n)]) ++n;
    if (n > best_len) best_len = n, best_end = i;
    if (best_len >= nmax) break;
  }
  Proposal p;
  if (best_end < 0 || best_len < options().ngram_min) return p;
  const int64_t from = best_end + 1, to = std::min(H, from + want);
  p.tokens.assign(history.begin() + from, history.begin() + to);
  p.kind = best_len <= 1 ? 0 : best_len == 2 ? 1 : best_len <= 4 ? 2 : best_len <= 8 ? 3 : 4;
  return p;
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

Drafter::Proposal DraftModelDrafter::propose(const std::vector<int32_t>& history, int64_t want) {
  Proposal p;
  if (!error_.empty() || history.empty()) return p;
  const int64_t H = static_cast<int64_t>(history.size());
  // Room in the draft's state for the history and want - 1 drafted tokens forwarded.
  want = std::min(want, state_.max_tokens() - H + 1);
  if (want <= 0) return p;
  // The draft's last logits must follow history's last token: at most H - 1 shared tokens are
  // kept. Catching up on more than the one or two tokens a verify adds (the target decoded them
  // while drafting paused) is prefill-like work, not the drafted tokens' cost.
  const int64_t behind = H - static_cast<int64_t>(fed_.size());
  const auto t0 = std::chrono::steady_clock::now();
  if (!catch_up(history, H)) return p;
  if (behind > 2) p.untimed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Greedy over the ids both models have.
  const int64_t V = std::min<int64_t>(static_cast<int64_t>(logits_.size()),
                                      options().target_vocab > 0 ? options().target_vocab : INT64_MAX);
  while (true) {
    const int32_t t = static_cast<int32_t>(kernels::argmax(logits_.data(), V));
    // The draft's probability of its own pick: a token it is unsure of ends the draft.
    if (options().draft_p_min > 0) {
      const float top = logits_[static_cast<size_t>(t)];
      double z = 0;
      for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(logits_[static_cast<size_t>(i)] - top));
      if (1.0 / z < options().draft_p_min) break;
    }
    p.tokens.push_back(t);
    if (static_cast<int64_t>(p.tokens.size()) >= want) break;
    if (Status s = m_.forward(&t, 1, state_, logits_.data(), false); !s.is_ok()) {
      error_ = s.message();
      p.tokens.clear();
      return p;
    }
    fed_.push_back(t);
  }
  return p;
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
