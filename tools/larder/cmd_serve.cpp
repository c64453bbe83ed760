// larder serve [MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N] ...
// OpenAI- and Anthropic-compatible HTTP server (server-api.md). Startup order matters: the port
// is bound first (a taken port fails at once, and /health answers 503 "loading" while the model
// maps), then the model loads, then /health turns 200. SIGTERM/SIGINT drain: stop admitting,
// finish running requests within LARDER_SHUTDOWN_TIMEOUT_MS (default 120 s), flush the KV
// store, exit 0; a second signal exits at once. A signal while the model is still loading exits
// at once (128 + signal): loading may block in the kernel (a FIFO, a hung mount), and a user who
// presses Ctrl-C must never need kill -9. A load failure prints its reason and exits 1.
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include <pthread.h>
#include <unistd.h>

#include "larder/core/cpuid.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/store/identity.h"
#include "larder/memory/store/kv_store.h"
#include "larder/runtime/adapters.h"
#include "larder/runtime/kv_identity.h"
#include "larder/runtime/fit.h"
#include "larder/runtime/page_in.h"
#include "larder/runtime/loaded_model.h"
#include "larder/runtime/generate.h"
#include "larder/server/engine.h"
#include "larder/server/http_server.h"
#include "kv_dtype_flag.h"
#include "spec_flags.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

namespace {

struct ServeFlags {
  ModelArg model;
  KvDtypeFlags kv;
  std::string host = "127.0.0.1", alias, api_key, ssd_cache;
  int port = 8080, threads = 0, parallel = 4, http_threads = 0;
  int64_t ctx = 4096, step_tokens = 256;
  size_t queue_max = 64;
  SpecFlags spec;  // --spec, --draft, --draft-max, --draft-min (spec_flags.h)
  std::string kv_budget;     // memory admission: empty = off
  std::string min_free_memory;  // KV store pressure relief: empty = off
  double admit_wait_s = 30;
  double prompt_cache_gb = 4, ssd_cache_max_gb = 32, body_limit_mb = 32;
  std::optional<double> ssd_demote_idle_s;
  std::string kv_remote;            // --kv-remote URL (empty = off)
  int kv_remote_timeout_ms = 100;
  int64_t kv_remote_chunk_tokens = 0;  // 0 = derived from the model (~4 MiB values)
  double kv_remote_queue_gb = 1;       // --kv-remote-queue (GiB)
  double kv_remote_write_mibps = 128;  // --kv-remote-write-mibps while busy (0 = unpaced)
  std::vector<std::string> cors, allowed_hosts;
  int max_connections = 1024, max_connections_per_ip = 256;
  int stream_flush_ms = 25;
  double read_timeout_s = 10, idle_timeout_s = 60;
  std::string log_format = "text";
  bool no_webui = false;
  std::optional<float> temp, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  int64_t seed = -1;  // -1: every request without a seed gets a random one
  int64_t max_tokens = runtime::kDefaultMaxTokens;
  runtime::ChatTemplateFlags chat_template;
  std::vector<std::string> lora;  // --lora NAME=PATH[:SCALE], repeatable (server/loras.h)
};

// Signals are taken by one dedicated thread (sigwait), never by a handler on an arbitrary
// thread, so they work however long the main thread blocks (model loading, engine shutdown).
class SignalWatcher {
 public:
  explicit SignalWatcher(sigset_t sigs) : sigs_(sigs) {
    std::thread([this] { run(); }).detach();
  }
  // From now on a first signal starts a drain instead of exiting.
  void set_serving() {
    std::lock_guard<std::mutex> l(mu_);
    serving_ = true;
  }
  // Blocks until the first signal arrives while serving; returns it.
  int wait_first() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return count_ > 0; });
    return first_;
  }
  // Called (on the watcher thread) when a second signal arrives while draining; then exits.
  void on_second(std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu_);
    second_ = std::move(fn);
  }

 private:
  void run() {
    for (;;) {
      int s = 0;
      if (sigwait(&sigs_, &s) != 0) continue;
      std::function<void()> second;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!serving_) {
          std::fprintf(stderr, "larder: %s received while loading the model: exiting\n", s == SIGINT ? "SIGINT" : "SIGTERM");
          std::_Exit(128 + s);
        }
        if (++count_ == 1) {
          first_ = s;
          cv_.notify_all();
          continue;
        }
        second = second_;
      }
      if (second) {
        // Let the running requests end with an error event and the process exit by itself;
        // exit regardless after a few seconds.
        std::fprintf(stderr, "larder: %s received again: stopping running requests now\n", s == SIGINT ? "SIGINT" : "SIGTERM");
        second();
        std::this_thread::sleep_for(std::chrono::seconds(5));
      }
      std::_Exit(128 + s);
    }
  }
  sigset_t sigs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serving_ = false;
  int count_ = 0, first_ = 0;
  std::function<void()> second_;
};

std::optional<float> gc_number(const nlohmann::ordered_json& gc, const char* k) {
  if (gc.is_object() && gc.contains(k) && gc[k].is_number()) return gc[k].get<float>();
  return std::nullopt;
}

int run_serve(ServeFlags f) {
  // Every thread created from here on inherits this mask; the main thread takes the signals
  // with sigwait, so no handler runs in an arbitrary thread.
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  SignalWatcher signals(sigs);

  if (f.threads > 0) default_pool().set_threads(f.threads);
  if (f.api_key.empty()) {
    if (const char* k = std::getenv("LARDER_API_KEY")) f.api_key = k;
  }
  const char* remote_pw = std::getenv("LARDER_KV_REMOTE_PASSWORD");
  if (!f.kv_remote.empty()) {  // a bad URL fails before the model is loaded (the message masks the password)
    auto u = memory::parse_remote_url(f.kv_remote, remote_pw ? remote_pw : "");
    if (!u.is_ok()) return report(u.status());
    std::fprintf(stderr, "larder: remote KV tier %s (timeout %d ms)\n", u->redacted().c_str(), f.kv_remote_timeout_ms);
  }
  std::vector<models::LoraSpec> lora_specs;  // a malformed --lora fails before the model loads
  for (const std::string& a : f.lora) {
    auto spec = models::parse_lora_spec(a, /*named=*/true);
    if (!spec.is_ok()) return report(spec.status());
    for (const models::LoraSpec& o : lora_specs)
      if (o.name == spec->name) return report(invalid_argument("--lora: the name '" + o.name + "' is given twice"));
    lora_specs.push_back(std::move(*spec));
  }
  auto located = resolve_model(f.model, /*allow_default=*/true);
  if (!located.is_ok()) return report(located.status());

  server::Metrics metrics;
  server::HttpConfig hc;
  hc.host = f.host;
  hc.port = f.port;
  hc.api_key = f.api_key;
  hc.webui = !f.no_webui;
  hc.stream_flush_ms = f.stream_flush_ms;
  for (const std::string& c : f.cors) {  // accept "a,b" as well as repeated flags
    std::stringstream ss(c);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) hc.cors.push_back(item);
  }
  if (Status st = server::check_cors_patterns(hc.cors); !st.is_ok()) return report(st);
  for (const std::string& h : f.allowed_hosts) {
    std::stringstream ss(h);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) hc.allowed_hosts.push_back(item);
  }
  hc.max_connections = f.max_connections;
  hc.max_connections_per_ip = f.max_connections_per_ip;
  hc.header_timeout_ms = static_cast<int>(f.read_timeout_s * 1e3);
  hc.body_timeout_ms = static_cast<int>(f.read_timeout_s * 3e3);
  hc.idle_timeout_ms = static_cast<int>(f.idle_timeout_s * 1e3);
  hc.log_json = f.log_format == "json";
  hc.body_limit = static_cast<size_t>(f.body_limit_mb * (1 << 20));
  hc.threads = f.http_threads > 0 ? f.http_threads : f.parallel + static_cast<int>(f.queue_max) + 8;
  server::HttpServer http(hc, metrics);
  if (Status st = http.bind(); !st.is_ok()) return report(st);
  std::thread http_thread([&] { http.serve(); });
  // A model that cannot be served: say why and exit now. Nothing is running that needs a clean
  // stop (no engine yet, the KV store not opened), and stopping the transport first could only
  // delay the message.
  auto fail = [&](const Status& st) {
    const int rc = report(st);
    std::fflush(nullptr);
    std::_Exit(rc == 0 ? 1 : rc);
    return rc;
  };

  runtime::LoadOptions lo;
  lo.chat_template = f.chat_template;
  lo.map_mode = map_mode(f.model);
  {
    auto dt = kv_dtype_of(f.kv);
    if (!dt.is_ok()) return fail(dt.status());
    lo.kv_dtype = *dt;
  }
  auto loaded = runtime::load_model(located->path, lo);
  if (!loaded.is_ok()) return fail(loaded.status());
  runtime::LoadedModel& m = **loaded;
  const auto& info = m.model->info();
  runtime::announce_chat_template(m);

  server::ServedModel sm;
  uint64_t kv_budget = 0, kv_bytes_per_token = 0, kv_fixed_bytes = 0;  // memory admission (engine.h)
  sm.m = &m;
  sm.id = f.alias.empty() ? located->id : f.alias;
  sm.fingerprint = std::string("larder-0.1.0-") + kernels::active_table().name;
  sm.ns_base = memory::namespace_id({});
  if (!lora_specs.empty()) {  // loaded, validated and bound once; the names must not be the model's id
    std::vector<server::ServedLora> served;
    for (const models::LoraSpec& spec : lora_specs) {
      if (spec.name == sm.id)
        return fail(invalid_argument("--lora " + spec.name + "=…: the name is the served model's id; pick another"));
      std::vector<std::string> warnings;
      auto b = runtime::load_lora(m, spec.path, &warnings);
      if (!b.is_ok()) return fail(Status(b.status().code(), "--lora " + spec.name + ": " + b.status().message()));
      for (const std::string& w : warnings) std::fprintf(stderr, "larder: --lora %s: %s\n", spec.name.c_str(), w.c_str());
      std::fprintf(stderr, "larder: adapter %s (id %zu): %s, %zu projections, rank <= %lld, content %s\n",
                   spec.name.c_str(), served.size(), spec.path.c_str(), b.value()->lora->projections().size(),
                   static_cast<long long>(b.value()->lora->max_rank()), b.value()->lora->content_hash().c_str());
      served.push_back({spec.name, spec.path, spec.scale, b.value()});
    }
    sm.loras = std::make_shared<server::LoraTable>(std::move(served));
  }
  sm.ctx = f.ctx > 0 ? std::min<int64_t>(f.ctx, info.max_context) : info.max_context;
  sm.max_token_bytes = server::longest_token_bytes(m);
  {  // Before the first weight is read: refuse a --ctx x --parallel that cannot fit, cap the prompt cache.
    runtime::FitRequest fr;
    fr.ctx = sm.ctx;
    fr.parallel = f.parallel;
    fr.kv_store_ram_cap = static_cast<uint64_t>(f.prompt_cache_gb * (1ull << 30));
    const auto est = runtime::estimate_fit(*m.model, m.files.tensors().total_bytes(), fr);
    kv_bytes_per_token = est.kv_per_token;
    kv_fixed_bytes = est.kv_fixed;
    if (!f.kv_budget.empty()) {
      kv_budget = runtime::parse_bytes(f.kv_budget);
      if (kv_budget == 0)
        return fail(invalid_argument(strfmt("[serve] --kv-budget '%s' is not a size (e.g. 2G, 512M, 1048576)", f.kv_budget.c_str())));
      // The running requests' KV is capped by the budget, not by ctx x parallel: check that.
      const uint64_t per_seq = std::max<uint64_t>(static_cast<uint64_t>(sm.ctx) * kv_bytes_per_token + kv_fixed_bytes, 1);
      fr.parallel = std::clamp<int64_t>(static_cast<int64_t>((kv_budget + per_seq - 1) / per_seq), 1, f.parallel);
    }
    const auto fit = runtime::check_model_fit(*m.model, m.files.tensors().total_bytes(), fr);
    if (!fit.status.is_ok()) {
      if (!f.kv_budget.empty()) return fail(fit.status);
      return fail(Status(fit.status.code(), fit.status.message() +
                                                "; or keep --parallel and cap the running requests' KV with --kv-budget "
                                                "(requests wait for memory instead)"));
    }
    if (!fit.note.empty()) {
      std::fprintf(stderr, "larder: %s\n", fit.note.c_str());
      f.prompt_cache_gb = static_cast<double>(fit.kv_store_cap) / (1ull << 30);
    }
  }
  runtime::page_in_weights(m.files.tensors());  // a bar while a cold model file is read
  const auto& gc = m.files.generation_config;
  sm.defaults.temperature = f.temp ? f.temp : gc_number(gc, "temperature");
  sm.defaults.top_p = f.top_p ? f.top_p : gc_number(gc, "top_p");
  sm.defaults.min_p = f.min_p ? f.min_p : gc_number(gc, "min_p");
  sm.defaults.repetition_penalty = f.repeat_penalty ? f.repeat_penalty : gc_number(gc, "repetition_penalty");
  if (f.top_k) {
    sm.defaults.top_k = f.top_k;
  } else if (auto k = gc_number(gc, "top_k")) {
    sm.defaults.top_k = static_cast<int>(*k);
  }
  if (f.max_tokens > 0) sm.defaults.max_tokens = f.max_tokens;  // -1: until the context is full
  if (f.seed >= 0) sm.defaults.seed = static_cast<uint64_t>(f.seed);

  memory::KvStoreConfig kc;
  kc.ram_cap_bytes = static_cast<size_t>(f.prompt_cache_gb * (1ull << 30));
  kc.ssd_dir = f.ssd_cache;
  kc.ssd_cap_bytes = static_cast<uint64_t>(f.ssd_cache_max_gb * (1ull << 30));
  kc.remote_url = f.kv_remote;
  kc.remote_password_env = remote_pw ? remote_pw : "";
  kc.remote_timeout_ms = f.kv_remote_timeout_ms;
  // Values of about 4 MiB (LMCache measured that size as the sweet spot), a multiple of 16
  // tokens; every replica of a model derives the same size, so their keys agree.
  kc.remote_chunk_tokens =
      f.kv_remote_chunk_tokens > 0
          ? f.kv_remote_chunk_tokens
          : std::clamp<int64_t>(static_cast<int64_t>((4ull << 20) / std::max<uint64_t>(kv_bytes_per_token, 1)) / 16 * 16,
                                16, 65536);
  kc.remote_queue.cap_bytes = static_cast<size_t>(f.kv_remote_queue_gb * (1ull << 30));
  kc.remote_queue.busy_bytes_per_s = static_cast<uint64_t>(f.kv_remote_write_mibps * (1ull << 20));
  auto id = runtime::kv_store_identity(m);
  if (!id.is_ok()) return fail(id.status());
  kc.identity = *id;
  kc.signature = runtime::kv_state_signature(m);
  auto store = memory::KvStore::open(std::move(kc));
  if (!store.is_ok()) return fail(store.status());

  server::EngineConfig ec;
  ec.parallel = f.parallel;
  ec.queue_max = f.queue_max;
  ec.ctx = sm.ctx;
  ec.step_tokens = f.step_tokens;
  // The draft model (--draft) lives as long as the engine that drafts with it.
  auto spec_run = spec_setup(f.spec, m, lo);
  if (!spec_run.is_ok()) return fail(spec_run.status());
  ec.spec = spec_run->options;
  if (sm.loras) ec.ns_labels = server::namespace_labels(sm.loras->adapters());
  ec.kv_budget = kv_budget;
  if (!f.min_free_memory.empty()) {
    ec.min_free_memory = runtime::parse_bytes(f.min_free_memory);
    if (ec.min_free_memory == 0)
      return fail(invalid_argument(strfmt("[serve] --min-free-memory '%s' is not a size (e.g. 1G, 512M)", f.min_free_memory.c_str())));
  }
  if (spec_run->draft) {
    // Each drafting sequence holds the draft model's KV beside the target's (its own state,
    // runtime::DraftModelDrafter): --kv-budget admission counts both.
    runtime::FitRequest dfr;
    dfr.ctx = sm.ctx;
    dfr.parallel = f.parallel;
    const auto de = runtime::estimate_fit(*spec_run->draft->model, spec_run->draft->files.tensors().total_bytes(), dfr);
    kv_bytes_per_token += de.kv_per_token;
    kv_fixed_bytes += de.kv_fixed;
  }
  ec.kv_bytes_per_token = kv_bytes_per_token;
  ec.kv_fixed_bytes = kv_fixed_bytes;
  ec.admit_wait = std::chrono::milliseconds(static_cast<int64_t>(f.admit_wait_s * 1e3));
  // kv-store.md §12: idle demotion defaults to 300 s with an SSD tier, off without one.
  const double demote_s = f.ssd_demote_idle_s.value_or(f.ssd_cache.empty() ? 0.0 : 300.0);
  ec.demote_idle = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(demote_s));
  metrics.set_model_info(sm.id, info.weight_dtypes, kernels::active_table().name);
  server::Engine engine(m, std::move(*store), ec, metrics);
  http.set_ready(&sm, &engine);
  std::fprintf(stderr,
               "larder: serving %s (%s, %s) on http://%s:%d — context %lld, parallel %d, %d threads, load %.0f ms, "
               "chat template %s\n",
               sm.id.c_str(), info.architecture.c_str(), info.weight_dtypes.c_str(), f.host.c_str(), http.port(),
               static_cast<long long>(sm.ctx), f.parallel, default_pool().n_threads(), m.load_seconds * 1e3,
               m.template_choice.describe().c_str());
  if (!spec_run->note.empty()) std::fprintf(stderr, "larder: %s\n", spec_run->note.c_str());
  std::fprintf(stderr, "larder: speculative decoding: %s%s\n", spec_run->kind.c_str(),
               spec_run->off_reason.empty() ? "" : (" (by default: " + spec_run->off_reason + ")").c_str());
  if (hc.webui) {
    const bool v6 = f.host.find(':') != std::string::npos;
    std::fprintf(stderr, "larder: chat in a browser at http://%s%s%s:%d/\n", v6 ? "[" : "", f.host.c_str(), v6 ? "]" : "",
                 http.port());
  }

  signals.set_serving();
  const int sig = signals.wait_first();
  long timeout_ms = 120000;
  if (const char* t = std::getenv("LARDER_SHUTDOWN_TIMEOUT_MS")) timeout_ms = std::max(0L, std::atol(t));
  std::fprintf(stderr,
               "larder: %s received: draining — running requests get up to %.0f s to finish "
               "(LARDER_SHUTDOWN_TIMEOUT_MS=%ld); send it again to stop them now\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", timeout_ms / 1e3, timeout_ms);
  http.set_draining();
  signals.on_second([&engine] { engine.hurry(); });
  const memory::FlushReport fr = engine.shutdown(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
  http.stop();
  http_thread.join();
  if (fr.ssd_enabled) {
    std::fprintf(stderr, "larder: kv store flushed: %zu written, %zu already on disk, %zu failed%s\n", fr.written, fr.already,
                 fr.failed, fr.durable ? "" : " (not durable)");
    for (const std::string& w : fr.not_written) std::fprintf(stderr, "larder:   not written: %s\n", w.c_str());
  }
  return 0;
}

}  // namespace

VerbMain add_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  add_model_arg(cmd, f->model, std::string(kModelHelp) + " (default: the most recently used model in that cache)");
  cmd->add_option("--host", f->host, "address to bind (default 127.0.0.1: loopback only)");
  cmd->add_option("--port", f->port, "port (0 = any free port)")->check(in_range(0, 65535));
  cmd->add_option("-t,--threads", f->threads, "compute threads (default: physical cores)")->check(positive());
  cmd->add_option("-c,--ctx,--ctx-size", f->ctx, "context tokens per sequence (default 4096, capped at the model's)")
      ->check(positive());
  cmd->add_option("--parallel,--np", f->parallel, "sequences decoded together (continuous batching)")
      ->check(in_range(1, 256));
  cmd->add_option("--queue-max", f->queue_max, "requests waiting for a slot before 429")->check(in_range(0, 100000));
  cmd->add_option("--kv-budget", f->kv_budget,
                  "memory the running requests' KV may take together (e.g. 2G, 512M): a request whose prompt + "
                  "max_tokens does not fit waits for memory, then 503 (default: off; the startup check makes ctx x "
                  "parallel fit)");
  cmd->add_option("--admit-wait", f->admit_wait_s, "seconds a request may wait for KV memory before 503 (default 30)")
      ->check(at_least(0));
  add_spec_flags(cmd, f->spec);
  cmd->add_option("--step-tokens,--batch-tokens", f->step_tokens, "prefill tokens per engine step (chunked prefill)")
      ->check(in_range(1, 65536));
  cmd->add_option("--prompt-cache", f->prompt_cache_gb, "RAM KV cache cap in GiB (0 = off)")->check(at_least(0));
  add_kv_dtype_flags(cmd, f->kv);
  cmd->add_option("--ssd-cache", f->ssd_cache, "directory of the persistent KV cache (survives restarts)");
  cmd->add_option("--ssd-cache-max", f->ssd_cache_max_gb, "SSD KV cache cap in GiB")->check(positive());
  cmd->add_option("--kv-remote", f->kv_remote,
                  "remote KV tier on Redis below RAM and SSD, shared by replicas: redis://[:PASSWORD@]HOST[:PORT][/DB] "
                  "or redis+unix:///PATH[?db=N]; the password may come from env LARDER_KV_REMOTE_PASSWORD instead");
  cmd->add_option("--kv-remote-timeout-ms", f->kv_remote_timeout_ms,
                  "timeout of every remote KV command and connect (default 100); past it the request prefills locally")
      ->check(in_range(1, 60000));
  cmd->add_option("--kv-remote-chunk-tokens", f->kv_remote_chunk_tokens,
                  "tokens per remote KV value (0, the default: ~4 MiB values for this model); replicas must agree")
      ->check(in_range(0, 65536));
  cmd->add_option("--kv-remote-queue", f->kv_remote_queue_gb,
                  "GiB of entries waiting to be written to the remote tier (default 1); past it the oldest are dropped "
                  "(larder_kv_remote_queue_total{outcome=\"dropped\"})")
      ->check(positive());
  cmd->add_option("--kv-remote-write-mibps", f->kv_remote_write_mibps,
                  "MiB/s the remote writer may send while requests run (default 128; unpaced when idle; 0 = never paced)")
      ->check(at_least(0));
  cmd->add_option("--min-free-memory", f->min_free_memory,
                  "when available memory falls below this size, demote least recently used KV store entries from RAM "
                  "(to --ssd-cache, else dropped) until it is above again (e.g. 1G; default off)");
  cmd->add_option("--ssd-demote-idle", f->ssd_demote_idle_s,
                  "seconds before an unused RAM entry moves to the SSD tier (default 300 with --ssd-cache; 0 = off)")
      ->check(at_least(0));
  cmd->add_option("--api-key", f->api_key, "require this key (Authorization: Bearer or x-api-key); env LARDER_API_KEY");
  cmd->add_option("--cors,--cors-origins", f->cors, "allowed CORS origins (comma-separated or repeated; '*' = any)");
  cmd->add_option("--allowed-hosts", f->allowed_hosts,
                  "Host header names accepted (comma-separated or repeated; '*' = any). A loopback bind "
                  "always accepts localhost, 127.0.0.1 and [::1]; other binds check Host only when this is given");
  cmd->add_option("--max-connections", f->max_connections, "open connections in total (default 1024)")
      ->check(in_range(16, 1000000));
  cmd->add_option("--max-connections-per-ip", f->max_connections_per_ip,
                  "open connections per client address (default 256; beyond it the oldest idle one is closed)")
      ->check(in_range(1, 1000000));
  cmd->add_option("--read-timeout", f->read_timeout_s,
                  "seconds a client has to send a request header (default 10; the body gets 3x plus 1 s per MiB)")
      ->check(in_range(0.1, 3600.0));
  cmd->add_option("--idle-timeout", f->idle_timeout_s, "seconds an idle keep-alive connection stays open (default 60)")
      ->check(in_range(0.1, 86400.0));
  cmd->add_option("--log-format", f->log_format, "request log lines: text (default) or json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--stream-flush-ms", f->stream_flush_ms,
                  "a stream writes at most once per this many ms; tokens made meanwhile go out together "
                  "(default 25; 0 = every token in its own write; the first token is never held)")
      ->check(in_range(0, 1000));
  cmd->add_flag("--no-webui", f->no_webui, "do not serve the browser chat page at / (GET / then answers the JSON index)");
  cmd->add_option("--alias", f->alias, "model id to serve as (default: repo id or file name)");
  cmd->add_option("--lora", f->lora,
                  "LoRA adapter NAME=PATH[:SCALE] (PEFT or mlx-lm directory, or GGUF LoRA): requests pick it by "
                  "`model`: NAME or by the `lora` list; repeatable")
      ->allow_extra_args(false);
  add_chat_template_flags(cmd, &f->chat_template);
  cmd->add_option("--temp,--temperature", f->temp, "default temperature")->check(in_range(0.0, 5.0));
  cmd->add_option("--top-p", f->top_p, "default top_p")->check(in_range(0.0, 1.0));
  cmd->add_option("--top-k", f->top_k, "default top_k")->check(at_least(0));
  cmd->add_option("--min-p", f->min_p, "default min_p")->check(in_range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", f->repeat_penalty, "default repetition penalty")
      ->check(positive())  // 0 would divide by zero (requests: repetition_penalty > 0 too)
      ->check(in_range(0.0, 100.0));
  cmd->add_option("-s,--seed", f->seed,
                  "seed of every request that sets none, so such requests repeat (llama-server's -s); "
                  "-1 = random per request (default)")
      ->check(at_least(-1));
  cmd->add_option("-n,--n-predict,--max-tokens", f->max_tokens, runtime::kMaxTokensHelp)->check(max_tokens_check());
  cmd->add_option("--http-threads", f->http_threads, "generation worker threads (default parallel + queue-max + 8)")
      ->check(positive());
  cmd->add_option("--body-limit-mb", f->body_limit_mb, "request body limit in MiB")->check(positive());
  return [f]() { return run_serve(*f); };
}

}  // namespace larder::cli
