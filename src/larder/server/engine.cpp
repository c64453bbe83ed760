#include "larder/server/engine.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <optional>

#include "larder/core/log.h"
#include "larder/runtime/decode_step.h"
#include "larder/runtime/fit.h"
#include "larder/runtime/sequence.h"
#include "larder/server/loras.h"

namespace larder::server {

using Clock = std::chrono::steady_clock;

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

// A running request: its generation lifecycle (runtime::Sequence: store take, prefill slices with
// the boundary checkpoint, put at the end), its decode step (runtime::DecodeStep: pick, grammar,
// EOS, stop strings, length, logprobs — the same step `larder generate` runs) plus what only the
// server needs (channel, tokens whose text is held back, timings).
struct Engine::Seq {
  Seq(GenRequest r, std::shared_ptr<Channel> c, runtime::Sequence sq, const runtime::LoadedModel& m)
      : req(std::move(r)), ch(std::move(c)), seq(std::move(sq)), decode(decode_options(req, m), m.tokenizer.get()) {}
  static runtime::DecodeOptions decode_options(const GenRequest& r, const runtime::LoadedModel& m) {
    runtime::DecodeOptions o;
    o.sampling = r.sampling;
    o.max_new_tokens = r.max_tokens;
    o.eos_ids = m.defaults.eos_ids;
    o.stops = r.stops;
    o.special_text = r.special_text;
    // Stop strings need no grammar rollback: text held back is only ever released or cut, never
    // re-sampled, so the matcher's state always equals the tokens kept.
    o.constraint = r.constraint;
    o.top_logprobs = r.top_logprobs;
    o.logprobs_of = r.probs;
    return o;
  }
  GenRequest req;
  std::shared_ptr<Channel> ch;
  runtime::Sequence seq;
  runtime::DecodeStep decode;
  bool decoding = false;             // prompt done; `next` is the token to forward
  int32_t next = 0;
  bool done = false;
  std::vector<TokenInfo> pending;    // tokens whose text is still held back
  std::vector<float> logits;         // [vocab]
  // Speculation: the drafter (none when off or the state cannot be trimmed back), this step's
  // draft, the verify forward's tokens (next + draft) and its logits [k + 1, vocab].
  std::unique_ptr<runtime::Drafter> drafter;
  std::vector<int32_t> draft, verify_tokens;
  std::vector<float> rows;
  Outcome out;
  Clock::time_point admitted, first_token;
  bool has_first = false;
  uint64_t kv_reserved = 0;          // memory admission: bytes reserved until finish()
};

// An admitted request whose KV take waits for its remote lookup (kv_store.h begin_take): it
// holds its slot and its memory reservation; it becomes a Seq once the lookup is ready.
struct Engine::Pending {
  GenRequest req;
  std::shared_ptr<Channel> ch;
  std::shared_ptr<memory::RemoteLookup> lookup;
  uint64_t kv_reserved = 0;
};

namespace {
std::string mib(uint64_t b) { return strfmt("%.1f MiB", b / 1048576.0); }
}  // namespace

uint64_t Engine::kv_need(const GenRequest& r) const {
  const uint64_t tokens = std::min<uint64_t>(static_cast<uint64_t>(cfg_.ctx),
                                             r.prompt.size() + static_cast<uint64_t>(std::max<int64_t>(r.max_tokens, 0)));
  return tokens * cfg_.kv_bytes_per_token + cfg_.kv_fixed_bytes;
}

Event Engine::memory_refusal(const GenRequest& r, uint64_t need, uint64_t reserving) const {
  // When would it fit? Running sequences free their reservation as they finish; the one whose
  // end makes room bounds the wait (remaining prompt + tokens, at the recent step time).
  std::vector<std::pair<int64_t, uint64_t>> ends;  // (steps left, bytes freed)
  for (const auto& s : seqs_) {
    if (s->done) continue;
    // Prefill slices while others decode: a quarter of the step budget (step()).
    const int64_t left = (s->seq.prompt_size() - s->seq.prefilled()) / std::max<int64_t>(cfg_.step_tokens / 4, 32) +
                         (s->req.max_tokens - s->decode.generated());
    ends.emplace_back(std::max<int64_t>(left, 1), s->kv_reserved);
  }
  std::sort(ends.begin(), ends.end());
  uint64_t used = kv_reserved_.load() + reserving;
  int64_t steps = 1;
  for (const auto& [left, bytes] : ends) {
    if (used + need <= cfg_.kv_budget) break;
    used -= std::min(used, bytes);
    steps = left;
  }
  const double secs = steps * std::max(step_ms_, 1.0) / 1e3;
  const uint64_t free_now = cfg_.kv_budget > kv_reserved_.load() + reserving ? cfg_.kv_budget - kv_reserved_.load() - reserving : 0;
  Event e;
  e.done = true;
  e.refuse_status = 503;
  e.retry_after_s = static_cast<int>(std::min(std::ceil(secs), 3600.0));
  if (e.retry_after_s < 1) e.retry_after_s = 1;
  e.outcome.finish = Finish::kError;
  e.outcome.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  e.outcome.error = strfmt(
      "not admitted within %.1f s: this request's KV (prompt %zu + max_tokens %lld tokens = %s) does not fit beside the "
      "%zu running requests, which hold %s of the %s KV budget; what fits now is %lld tokens (%s) — lower max_tokens, "
      "or retry in about %d s",
      std::chrono::duration<double>(cfg_.admit_wait).count(), r.prompt.size(), (long long)r.max_tokens, mib(need).c_str(),
      ends.size(), mib(kv_reserved_.load() + reserving).c_str(), mib(cfg_.kv_budget).c_str(),
      (long long)(free_now / std::max<uint64_t>(cfg_.kv_bytes_per_token, 1)), mib(free_now).c_str(), e.retry_after_s);
  return e;
}

Engine::Engine(runtime::LoadedModel& model, std::unique_ptr<memory::KvStore> store, EngineConfig cfg, Metrics& metrics)
    : m_(model), store_(std::move(store)), cfg_(cfg), metrics_(metrics) {
  if (cfg_.ctx <= 0) cfg_.ctx = m_.model->info().max_context;
  cfg_.parallel = std::max(cfg_.parallel, 1);
  cfg_.step_tokens = std::max<int64_t>(cfg_.step_tokens, 1);
  // One measured cost model for every sequence's drafter: they share the model pair and the steps.
  if (cfg_.spec.draft_max > 0 && !cfg_.spec.cost) cfg_.spec.cost = std::make_shared<runtime::SpecCost>();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(Clock::now()); }

Result<std::shared_ptr<Channel>> Engine::submit(GenRequest req) {
  auto ch = std::make_shared<Channel>();
  if (cfg_.kv_budget > 0 && kv_need(req) > cfg_.kv_budget) {
    // It could never be admitted, whatever finishes first: say what would fit.
    const uint64_t fit_tokens = cfg_.kv_budget > cfg_.kv_fixed_bytes
                                    ? (cfg_.kv_budget - cfg_.kv_fixed_bytes) / std::max<uint64_t>(cfg_.kv_bytes_per_token, 1)
                                    : 0;
    return Status(StatusCode::kUnavailable,
                  strfmt("this request's KV (prompt %zu + max_tokens %lld tokens = %s) is larger than the whole KV budget "
                         "of %s (serve --kv-budget): at most %llu tokens (prompt + max_tokens) fit; lower max_tokens "
                         "or shorten the prompt",
                         req.prompt.size(), (long long)req.max_tokens, mib(kv_need(req)).c_str(),
                         mib(cfg_.kv_budget).c_str(), (unsigned long long)fit_tokens));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return Status(StatusCode::kUnavailable, "the server is shutting down");
  drop_cancelled();
  // Capacity is parallel running + queue_max waiting. queue_max 0 means no queue: a request is
  // admitted when a slot is free and refused otherwise. Requests being admitted right now count
  // as running (they left queue_ but are not in active_count_ yet).
  const size_t running = active_count_.load() + admitting_;
  const size_t waiting = queue_.size() + running > static_cast<size_t>(cfg_.parallel)
                             ? queue_.size() + running - static_cast<size_t>(cfg_.parallel) : 0;
  if (queue_.size() + running >= static_cast<size_t>(cfg_.parallel) + cfg_.queue_max) {
    if (cfg_.queue_max == 0)
      return Status(StatusCode::kResourceExhausted,
                    strfmt("all %d slots are busy and there is no queue (--queue-max 0); retry later", cfg_.parallel));
    return Status(StatusCode::kResourceExhausted, strfmt("the request queue is full (%zu waiting); retry later", waiting));
  }
  queue_.emplace_back(std::move(req), ch);
  cv_.notify_one();
  return ch;
}

void Engine::drop_cancelled() {
  // A queued request whose client has left gives its place back now, not when the engine would
  // have reached it: with --queue-max 4, four abandoned requests made new ones 429 for 18 s.
  const size_t before = queue_.size();
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [](const auto& q) { return q.second->cancelled(); }),
               queue_.end());
  for (size_t i = queue_.size(); i < before; ++i) metrics_.cancelled("client_disconnect");
}

size_t Engine::queue_depth() const {
  std::lock_guard<std::mutex> l(mu_);
  size_t n = 0;
  for (const auto& q : queue_) n += !q.second->cancelled();
  return n;
}

nlohmann::json Engine::with_store(const std::function<nlohmann::json(memory::KvStore&)>& fn) {
  auto p = std::make_shared<std::promise<nlohmann::json>>();
  auto fut = p->get_future();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!thread_.joinable() || flushed_) return nlohmann::json();
    tasks_.push_back([this, p, &fn] {
      p->set_value(store_ ? fn(*store_) : nlohmann::json());
    });
  }
  cv_.notify_one();
  return fut.get();
}

memory::FlushReport Engine::shutdown(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stop_) {
      stop_ = true;
      deadline_ = deadline;
      draining_ = true;
    }
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  return flush_report_;
}

void Engine::hurry() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stop_) return;
    deadline_ = Clock::now();
  }
  cv_.notify_one();
}

void Engine::loop() {
  for (;;) {
    std::deque<std::pair<GenRequest, std::shared_ptr<Channel>>> incoming;
    std::deque<std::function<void()>> tasks;
    std::vector<std::pair<std::shared_ptr<Channel>, Event>> verdicts;  // held / refused, sent unlocked
    bool past_deadline = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (seqs_.empty() && pending_.empty() && queue_.empty() && tasks_.empty()) {
        if (stop_) break;
        // Idle (kv-store.md §8.1–8.2): open the SSD writer's idle gate; after a debounce of
        // idle time (so the next turn of a conversation, which usually follows at once, never
        // waits behind a disk write) hand it snapshots of new entries; every few seconds demote
        // entries idle for longer than --ssd-demote-idle.
        const auto now = Clock::now();
        if (!idle_) {
          idle_ = true;
          idle_since_ = now;
          snapshotted_ = false;
        }
        if (store_) {
          l.unlock();
          store_->set_engine_busy(false);
          if (!snapshotted_ && now - idle_since_ >= cfg_.writebehind_debounce) {
            store_->write_behind();
            snapshotted_ = true;
          }
          if (cfg_.demote_idle.count() > 0 && now - last_demote_ >= std::chrono::seconds(5)) {
            store_->demote_idle(cfg_.demote_idle);
            last_demote_ = now;
          }
          relieve_memory_pressure();
          l.lock();
        }
        auto wait = std::chrono::milliseconds(500);
        if (!snapshotted_) {
          wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    cfg_.writebehind_debounce - (now - idle_since_)) + std::chrono::milliseconds(1));
        }
        cv_.wait_for(l, std::max(wait, std::chrono::milliseconds(1)),
                     [&] { return stop_ || !queue_.empty() || !tasks_.empty(); });
        if (queue_.empty() && tasks_.empty()) continue;
      } else if (seqs_.empty() && tasks_.empty() && !pending_.empty() && !lookup_ready_) {
        // Nothing to step, only remote lookups in flight: sleep until one is ready (on_ready),
        // with a short bound so a cancelled request, a newly queued one or a shutdown deadline
        // is seen soon. (Not woken by stop_ itself: during a drain that would spin.)
        cv_.wait_for(l, std::chrono::milliseconds(10), [&] { return !tasks_.empty() || lookup_ready_; });
      }
      lookup_ready_ = false;  // every pending lookup is polled below
      // Only generation work ends an idle period: a /stats or /metrics poll (a task) must not
      // restart the write-behind debounce, or a scraper polling faster than it would keep new
      // entries from ever reaching the SSD / remote tier.
      if (!queue_.empty() || !seqs_.empty() || !pending_.empty()) idle_ = false;
      if (store_ && cfg_.min_free_memory > 0) {  // busy: once a second between steps
        l.unlock();
        relieve_memory_pressure();
        l.lock();
      }
      tasks.swap(tasks_);
      past_deadline = stop_ && Clock::now() >= deadline_;
      if (past_deadline) {
        incoming.swap(queue_);
      } else {
        uint64_t reserving = 0;  // reservations of `incoming`
        while (!queue_.empty() && seqs_.size() + pending_.size() + incoming.size() < static_cast<size_t>(cfg_.parallel)) {
          auto& [req, ch] = queue_.front();
          if (cfg_.kv_budget > 0 && !ch->cancelled()) {
            const uint64_t need = kv_need(req);
            if (kv_reserved_.load() + reserving + need > cfg_.kv_budget) {
              if (Clock::now() - req.arrived < cfg_.admit_wait) {
                // First in line waits, and the ones behind it too (no overtaking): all are told,
                // so their HTTP threads keep the status line until admission or refusal.
                for (auto& [qreq, qch] : queue_) {
                  if (qreq.memory_held) continue;
                  qreq.memory_held = true;
                  Event e;
                  e.held = true;
                  verdicts.emplace_back(qch, std::move(e));
                }
                break;
              }
              verdicts.emplace_back(ch, memory_refusal(req, need, reserving));
              metrics_.cancelled("memory");
              queue_.pop_front();
              continue;
            }
            reserving += need;
          }
          incoming.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        admitting_ = incoming.size();
      }
    }
    for (auto& [ch, e] : verdicts) ch->push(std::move(e));
    for (auto& t : tasks) t();
    if (past_deadline) {
      // Shutdown deadline: whatever has not finished is cancelled (its KV is still kept).
      for (auto& [req, ch] : incoming) {
        Event e;
        e.done = true;
        e.outcome.finish = Finish::kCancelled;
        e.outcome.error = "the server shut down before this request ran";
        ch->push(std::move(e));
        metrics_.cancelled("shutdown");
      }
      for (auto& s : seqs_) {
        metrics_.cancelled("shutdown");
        finish(*s, Finish::kCancelled, "the server shut down before this request finished");
      }
      seqs_.clear();
      poll_pending(true);
      active_count_ = 0;
      kv_reserved_ = 0;
      continue;
    }
    poll_pending(false);
    admit(incoming);
    if (!seqs_.empty()) {
      const auto t = Clock::now();
      step();
      step_ms_ = step_ms_ == 0 ? ms_between(t, Clock::now()) : 0.8 * step_ms_ + 0.2 * ms_between(t, Clock::now());
    }
  }
  if (store_) flush_report_ = store_->flush();
  std::lock_guard<std::mutex> l(mu_);
  flushed_ = true;
  for (auto& t : tasks_) t();  // nobody may wait forever on with_store
  tasks_.clear();
}

void Engine::admit(std::deque<std::pair<GenRequest, std::shared_ptr<Channel>>>& incoming) {
  for (auto& [req, ch] : incoming) {
    if (ch->cancelled()) {  // the client left while queued: never runs
      metrics_.cancelled("client_disconnect");
      continue;
    }
    Pending p{std::move(req), ch, nullptr, 0};
    if (cfg_.kv_budget > 0) {
      p.kv_reserved = kv_need(p.req);
      kv_reserved_ += p.kv_reserved;
    }
    memory::TakeResult taken;
    if (store_) {
      store_->set_engine_busy(true);
      // RAM and SSD answer now; a remote lookup runs on the store's lookup thread while the
      // other sequences keep stepping, and poll_pending starts the sequence once it is ready.
      memory::TakeStart t = store_->begin_take(p.req.prompt, p.req.ns, [this] {
        std::lock_guard<std::mutex> l(mu_);
        lookup_ready_ = true;
        cv_.notify_one();
      });
      if (t.pending) {
        p.lookup = std::move(t.pending);
        pending_.push_back(std::move(p));
        continue;
      }
      taken = std::move(t.result);
    }
    start_seq(std::move(p), std::move(taken));
  }
  std::lock_guard<std::mutex> l(mu_);
  active_count_ = seqs_.size() + pending_.size();
  admitting_ = 0;
}

void Engine::poll_pending(bool shutdown) {
  if (pending_.empty()) return;
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    if (shutdown || p.ch->cancelled()) {
      // The lookup is dropped (one in flight ends within the tier's timeouts on its own thread;
      // its callback never runs after cancel returns) and the slot and reservation freed now.
      p.lookup->cancel();
      kv_reserved_ -= std::min(kv_reserved_.load(), p.kv_reserved);
      if (shutdown) {
        Event e;
        e.done = true;
        e.outcome.finish = Finish::kCancelled;
        e.outcome.error = "the server shut down before this request ran";
        p.ch->push(std::move(e));
        metrics_.cancelled("shutdown");
      } else {
        metrics_.cancelled("client_disconnect");
      }
    } else if (p.lookup->ready()) {
      memory::TakeResult taken = store_->complete_take(*p.lookup);
      p.lookup.reset();
      start_seq(std::move(p), std::move(taken));
    } else {
      still.push_back(std::move(p));
    }
  }
  pending_ = std::move(still);
  std::lock_guard<std::mutex> l(mu_);
  active_count_ = seqs_.size() + pending_.size();
}

void Engine::start_seq(Pending p, memory::TakeResult taken) {
  const Clock::time_point now = Clock::now();
  runtime::SequenceOptions so{store_.get(), p.req.ns, cfg_.ctx, p.req.message_ends};
  runtime::Sequence sq = runtime::Sequence::start(*m_.model, p.req.prompt, std::move(so), std::move(taken));
  auto s = std::make_unique<Seq>(std::move(p.req), p.ch, std::move(sq), m_);
  s->kv_reserved = p.kv_reserved;
  s->logits.resize(static_cast<size_t>(m_.model->info().vocab));
  s->drafter = runtime::make_drafter(cfg_.spec, s->seq.state(), s->seq.ctx());
  s->admitted = now;
  s->out.prompt_tokens = s->seq.prompt_size();
  s->out.cached_tokens = s->seq.cached_tokens();
  s->out.cache_tier = s->seq.cache_tier();
  s->out.cache_reason = label_cache_reason(cfg_.ns_labels, s->seq.cache_reason());
  s->out.queue_ms = ms_between(s->req.arrived, now);  // the remote lookup's wait included
  Event e;
  e.admitted = true;
  e.outcome = s->out;
  s->ch->push(std::move(e));
  seqs_.push_back(std::move(s));
}

void Engine::step() {
  const int64_t V = m_.model->info().vocab;
  // Cancellations first: a client that left frees its slot before any more compute.
  for (auto& s : seqs_) {
    if (!s->done && s->ch->cancelled()) {
      metrics_.cancelled("client_disconnect");
      finish(*s, Finish::kCancelled);
    }
  }
  std::vector<models::BatchItem> items;
  std::vector<Seq*> who;
  std::vector<bool> completes_prompt;
  int64_t decode_rows = 0;
  const int64_t model_ctx = m_.model->info().max_context;
  // Each draft is weighed against the step it joins: the decoding sequences' rows and the drafts
  // already planned in it (runtime::Drafter::plan).
  int64_t decoding = 0;
  for (auto& s : seqs_) decoding += !s->done && s->decoding;
  runtime::StepShape shape{decoding, decoding};
  for (auto& s : seqs_) {
    if (s->done || !s->decoding) continue;
    s->draft.clear();
    if (s->drafter) {
      // As runtime::generate: the rows fit with room for one more token (every row's accept sees
      // plain decoding's length check), and no drafting past the token budget.
      const memory::SequenceState& st = s->seq.state();
      const int64_t limit = std::min({s->seq.ctx(), st.max_tokens(), model_ctx});
      const int64_t room = std::min(limit - st.length() - 2, s->req.max_tokens - s->decode.generated() - 1);
      s->draft = s->drafter->draft(s->seq.history(), room, shape);
      shape.rows += static_cast<int64_t>(s->draft.size());
    }
    if (s->draft.empty()) {
      items.push_back({&s->next, 1, &s->seq.state(), s->logits.data(), false, s->req.adapters});
    } else {
      s->verify_tokens.assign(1, s->next);
      s->verify_tokens.insert(s->verify_tokens.end(), s->draft.begin(), s->draft.end());
      s->rows.resize(s->verify_tokens.size() * static_cast<size_t>(V));
      items.push_back({s->verify_tokens.data(), static_cast<int64_t>(s->verify_tokens.size()), &s->seq.state(),
                       s->rows.data(), true, s->req.adapters});
    }
    who.push_back(s.get());
    completes_prompt.push_back(false);
    decode_rows += items.back().n;
  }
  // Prefill slices share what the decode rows left of the step budget (at least a minimum slice,
  // so prompts progress even when many sequences decode). While any sequence decodes, the slices
  // get at most a quarter of the budget: every decoding stream waits for the whole step, so a
  // full 256-token slice is a ~1 s gap in each stream's tokens on a 2-core machine with a 1B
  // model (bench/RESULTS.md: ITL p99 of 10 s at 16 clients), while 64-token slices keep the
  // prefill matmuls compute-bound (the GEMM works in 16-token groups) and cost the waiting
  // prompt only the per-step overhead of ~4x as many steps.
  const int64_t prefill_cap = decode_rows > 0 ? std::max<int64_t>(cfg_.step_tokens / 4, 32) : cfg_.step_tokens;
  int64_t budget = std::max<int64_t>(std::min(cfg_.step_tokens - decode_rows, prefill_cap), 32);
  for (auto& s : seqs_) {
    if (s->done || s->decoding || budget <= 0) continue;
    // The slice stops at the sequence's checkpoint offset when one lies inside it.
    const std::span<const int32_t> slice = s->seq.next_prefill(budget);
    const int64_t n = static_cast<int64_t>(slice.size());
    items.push_back({slice.data(), n, &s->seq.state(), s->logits.data(), false, s->req.adapters});
    who.push_back(s.get());
    completes_prompt.push_back(s->seq.prefilled() + n == s->seq.prompt_size());
    budget -= n;
  }
  if (!items.empty()) {
    const Clock::time_point f0 = Clock::now();
    Status st = m_.model->forward_batch(items);
    // A step of decode and verify rows alone times what the drafters weigh (a prefill slice in it
    // would count as rows it is not).
    if (st.is_ok() && cfg_.spec.cost && items.size() == static_cast<size_t>(decoding))
      cfg_.spec.cost->forward(decode_rows, std::chrono::duration<double>(Clock::now() - f0).count());
    if (!st.is_ok()) {
      LARDER_LOG_ERROR("[engine] forward failed for a batch of %zu sequences: %s", items.size(), st.message().c_str());
      for (Seq* s : who) finish(*s, Finish::kError, st.message());
    } else {
      for (size_t i = 0; i < who.size(); ++i) {
        Seq& s = *who[i];
        if (!s.decoding) {
          s.seq.prefill_done(items[i].n);  // may capture the boundary checkpoint
          if (!completes_prompt[i]) continue;
          if (s.drafter) s.drafter->prefill(s.seq.history());  // a draft model's own prompt
        }
        if (s.decoding && !s.draft.empty()) {
          verify(s, V);
          continue;
        }
        // The decode step of this row (runtime/decode_step.h): pick, then what the token does.
        runtime::Accepted a = s.decode.step(s.logits.data(), V, s.seq);
        if (deliver(s, a)) {
          finish(s, a.finish, std::move(a.error));
          continue;
        }
        s.next = a.id;
        s.decoding = true;
      }
    }
  }
  seqs_.erase(std::remove_if(seqs_.begin(), seqs_.end(), [](const std::unique_ptr<Seq>& s) { return s->done; }),
              seqs_.end());
  active_count_ = seqs_.size();
}

bool Engine::deliver(Seq& s, runtime::Accepted& a) {
  const Clock::time_point now = Clock::now();
  if (!s.has_first) {
    s.has_first = true;
    s.first_token = now;
    s.out.prefill_ms = ms_between(s.admitted, now);
    s.out.ttft_ms = ms_between(s.req.arrived, now);
  }
  if (a.kept) s.pending.push_back({a.id, std::move(a.logprobs)});
  // Tokens whose text the stop string swallowed are not reported (server-api.md §4.4).
  if (a.finish == runtime::FinishReason::kStop) s.pending.clear();
  if (!a.text.empty()) {
    Event e;
    e.text = std::move(a.text);
    e.tokens.swap(s.pending);
    s.ch->push(std::move(e));
  }
  return a.finish != runtime::FinishReason::kNone;
}

// The verify rows of a drafted sequence (runtime/speculative.h): each row is the ordinary decode
// step; the draft is kept while the step picks it, the first other pick is the next token, and
// the KV is trimmed back to what plain decoding would hold — before finish() puts it in the store.
void Engine::verify(Seq& s, int64_t V) {
  const int d = static_cast<int>(s.draft.size());
  memory::SequenceState& st = s.seq.state();
  const int64_t base = st.length() - (d + 1);  // the state before the verify forward
  int matched = 0, forwarded = 0;
  runtime::Accepted a;
  bool ended = false;
  for (int i = 0; i <= d; ++i) {
    a = s.decode.step(s.rows.data() + static_cast<size_t>(i) * static_cast<size_t>(V), V, s.seq);
    const bool hit = i < d && a.kept && a.id == s.draft[static_cast<size_t>(i)];
    matched += hit;
    ended = deliver(s, a);
    if (!hit || ended) break;
    ++forwarded;
  }
  s.drafter->feedback(d, matched);
  if (Status t = st.trim(base + 1 + forwarded); !t.is_ok()) {  // plain KV only: never expected
    finish(s, Finish::kError, t.message());
    return;
  }
  if (ended) {
    finish(s, a.finish, std::move(a.error));
    return;
  }
  s.next = a.id;
}

void Engine::finish(Seq& s, Finish why, std::string error) {
  if (s.done) return;
  s.done = true;
  kv_reserved_ -= std::min(kv_reserved_.load(), s.kv_reserved);
  s.kv_reserved = 0;
  const Clock::time_point now = Clock::now();
  Event e;
  // The held-back tail, unless a stop string, an error or the client ended it (a tail that
  // completes a stop string turns the reason into kStop).
  if (why != Finish::kStop && why != Finish::kCancelled && why != Finish::kError) e.text = s.decode.flush(&why);
  e.tokens.swap(s.pending);
  e.done = true;
  s.out.finish = why;
  s.out.error = std::move(error);
  s.out.matched_stop = s.decode.matched_stop();
  s.out.completion_tokens = s.decode.generated();
  if (s.drafter) {
    s.out.speculative = true;
    s.out.drafted_tokens = s.drafter->drafted();
    s.out.accepted_tokens = s.drafter->accepted();
    metrics_.speculation(s.out.drafted_tokens, s.out.accepted_tokens);
  }
  if (s.has_first) s.out.decode_ms = ms_between(s.first_token, now);
  const double prefill_tps = s.out.prefill_ms > 0 ? (s.out.prompt_tokens - s.out.cached_tokens) / (s.out.prefill_ms / 1e3) : 0;
  const int64_t generated = s.decode.generated();
  const double decode_tps = s.out.decode_ms > 0 && generated > 1 ? (generated - 1) / (s.out.decode_ms / 1e3) : 0;
  metrics_.generation_done(s.out.prompt_tokens, s.out.cached_tokens, generated,
                           s.has_first ? s.out.ttft_ms / 1e3 : -1, prefill_tps, decode_tps);
  // Keep what was computed (also for a cancelled request: the next identical one hits).
  if (Status put = s.seq.finish(why == Finish::kError); !put.is_ok())
    LARDER_LOG_WARN("[engine] %s: KV not kept: %s", s.req.id.c_str(), put.message().c_str());
  e.outcome = s.out;
  // The slot is free from the moment the client learns it is done (admission counts it).
  for (size_t n = active_count_.load(); n > 0 && !active_count_.compare_exchange_weak(n, n - 1);) {
  }
  s.ch->push(std::move(e));
}

void Engine::relieve_memory_pressure() {
  if (!store_ || cfg_.min_free_memory == 0) return;
  const auto now = Clock::now();
  if (now - last_pressure_check_ < std::chrono::seconds(1)) return;
  last_pressure_check_ = now;
  auto over = [&] { return runtime::available_memory().bytes < cfg_.min_free_memory; };
  if (!over()) return;
  const size_t n = store_->relieve_pressure(over);
  if (n == 0) return;  // nothing left in RAM to give back
  const runtime::MemoryAvailable a = runtime::available_memory();
  LARDER_LOG_WARN("[kv-store] memory pressure: %zu RAM entries demoted (available %.0f MiB from %s, --min-free-memory %.0f MiB)",
                  n, a.bytes / 1048576.0, a.source.c_str(), cfg_.min_free_memory / 1048576.0);
}

}  // namespace larder::server
