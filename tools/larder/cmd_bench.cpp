// larder bench MODEL [-p 512] [-n 128] [-d DEPTH] [-t T] [-r REPEATS] [--kv-dtype f16] [--json]
// llama-bench's two tests on larder: pp<p> (prefill p tokens, one forward) and tg<n> (n
// single-token decode steps), after DEPTH tokens of context (-d, like llama-bench's: the context
// is prefilled once, untimed, in 512-token chunks, and every repeat starts from it — a trim back
// to DEPTH, or a fresh prefill where a wrapped ring cannot be trimmed), median of repeats, each next to
// this machine's ceilings measured in the same run: decode as achieved GB/s and % of the read
// bandwidth (bytes per token = every matmul weight byte + the KV read), prefill as GOP/s and % of
// the multiply-add peak of the format's arithmetic as the active kernels issue it (int8 dot products
// for Q8_0/Q4_0/K-quants/MLX affine — zmm vpdpbusd on the AVX-512 tier —, bf16 dot products for
// BF16 weights where the tier has them, f32 FMA else).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "larder/core/cpuid.h"
#include "larder/core/mmap_file.h"
#include "larder/core/profile.h"
#include "larder/core/roofline.h"
#include "larder/core/threadpool.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/kv_cache.h"
#include "larder/runtime/loaded_model.h"
#include "larder/runtime/page_in.h"
#include "kv_dtype_flag.h"
#include "larder/runtime/generate.h"
#include "spec_flags.h"
#include "generation_setup.h"
#include "model_arg.h"
#include "validators.h"
#include "verbs.h"

namespace larder::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchFlags {
  std::string model;
  ModelArg model_arg;
  int64_t prompt = 512, gen = 128, depth = 0;
  int threads = 0, repeats = 3;
  KvDtypeFlags kv;
  bool json = false, no_roofline = false;
  bool profile = false;  // --profile: one extra, untimed decode run with the per-op timeline
  // --spec ngram|draft: the speculation test instead (run_spec_bench) on --spec-prompt's text.
  SpecFlags spec;
  std::string spec_prompt;
};

struct Sample {
  double median = 0, min = 0, max = 0;
};

Sample summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Sample s;
  if (v.empty()) return s;  // a skipped test (-p 0)
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

// Resident memory of this process from /proc/self/status, bytes: VmRSS, RssAnon, RssFile.
struct Rss {
  uint64_t total = 0, anon = 0, file = 0;
};
Rss read_rss() {
  Rss r;
  std::FILE* fp = std::fopen("/proc/self/status", "r");
  if (!fp) return r;
  char line[256];
  while (std::fgets(line, sizeof line, fp)) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) r.total = kb * 1024;
    if (std::sscanf(line, "RssAnon: %llu kB", &kb) == 1) r.anon = kb * 1024;
    if (std::sscanf(line, "RssFile: %llu kB", &kb) == 1) r.file = kb * 1024;
  }
  std::fclose(fp);
  return r;
}

bool is_embedding(const std::string& name) {
  return name.rfind("model.embed_tokens.", 0) == 0 || name == "token_embd.weight";
}

// The prompt of `bench --spec` without --spec-prompt: an answer that repeats its input, where
// speculation pays (the three workloads of bench/RESULTS.md pass their own with --spec-prompt).
constexpr const char* kSpecPrompt =
    "Rewrite this Python function with type hints, changing nothing else:\n\n"
    "def add_all(values, start):\n    total = start\n    for v in values:\n        total = total + v\n"
    "    return total\n\ndef mean(values):\n    if not values:\n        return 0\n"
    "    return add_all(values, 0) / len(values)\n";

// bench --spec: greedy decode of -n tokens on one chat prompt with and without speculation,
// alternating (the order reversed every other round, so a neighbour's load falls on both), -r
// rounds: decode tok/s of each (median), the speedup (median of the per-round ratios), drafted,
// accepted and the acceptance rate, and whether the two outputs were the same tokens. The target's
// prompt is prefilled once; a draft model prefills the prompt in each speculative run, reported
// apart (prefill, not decode: generate runs it right after the target's prefill).
int run_spec_bench(const BenchFlags& f, runtime::LoadedModel& m, const runtime::LoadOptions& lo) {
  SpecFlags sf = f.spec;
  if (sf.spec == "auto" || sf.spec == "none")
    return report(invalid_argument("[bench] --spec takes ngram or draft (with --draft MODEL)"));
  if (sf.spec.empty()) sf.spec = sf.draft.empty() ? "ngram" : "draft";
  auto sp = spec_setup(sf, m, lo);
  if (!sp.is_ok()) return report(sp.status());
  if (!sp->note.empty()) std::fprintf(stderr, "larder: %s\n", sp->note.c_str());
  std::string text = kSpecPrompt;
  if (!f.spec_prompt.empty()) {
    auto r = read_text_input(f.spec_prompt, text_limit_for_context(m.model->info().max_context), "--spec-prompt");
    if (!r.is_ok()) return report(r.status());
    text = std::move(r->text);
  }
  auto prompt = runtime::encode_chat(m, {{"user", text}}, /*add_generation_prompt=*/true);
  if (!prompt.is_ok()) return report(prompt.status());
  const int64_t ctx = std::min<int64_t>(m.model->info().max_context, static_cast<int64_t>(prompt->size()) + f.gen + 8);
  runtime::GenerateOptions plain;
  plain.max_new_tokens = f.gen;
  plain.eos_ids = m.defaults.eos_ids;  // greedy: SamplingParams' default temperature 0
  runtime::GenerateOptions spec = plain;
  spec.spec = sp->options;
  struct Run {
    double tps = 0;
    runtime::GenerateStats st;
  };
  // The target's prompt is prefilled once; every run starts from it (trimmed back to the prompt,
  // whose last token each run forwards again for its logits).
  memory::SequenceState state = m.model->new_state(ctx);
  {
    runtime::GenerateOptions pre = plain;
    pre.max_new_tokens = 0;
    auto st = runtime::generate(*m.model, state, *prompt, pre, nullptr);
    if (!st.is_ok()) return report(st.status());
  }
  const int64_t P = static_cast<int64_t>(prompt->size());
  auto run = [&](const runtime::GenerateOptions& go) -> Result<Run> {
    LARDER_RETURN_IF_ERROR(state.trim(std::min(P, state.length())));
    LARDER_ASSIGN_OR_RETURN(runtime::GenerateStats st, runtime::generate(*m.model, state, *prompt, go, nullptr));
    Run r;
    r.tps = st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0;
    r.st = std::move(st);
    return r;
  };
  std::vector<double> tps_plain, tps_spec, ratio, draft_prefill;
  int64_t drafted = 0, accepted = 0, generated = 0;
  bool same = true;
  std::vector<int32_t> want;
  for (int r = 0; r < f.repeats; ++r) {
    Run a, b;  // plain, spec
    for (int i = 0; i < 2; ++i) {
      const bool spec_turn = (i == 0) == (r % 2 == 1);
      auto got = run(spec_turn ? spec : plain);
      if (!got.is_ok()) return report(got.status());
      (spec_turn ? b : a) = std::move(*got);
    }
    if (r == 0) want = a.st.tokens;
    same = same && a.st.tokens == want && b.st.tokens == want;
    tps_plain.push_back(a.tps);
    tps_spec.push_back(b.tps);
    ratio.push_back(a.tps > 0 ? b.tps / a.tps : 0);
    draft_prefill.push_back(b.st.prefill_seconds - a.st.prefill_seconds);
    drafted = b.st.drafted_tokens;
    accepted = b.st.accepted_tokens;
    generated = b.st.generated_tokens;
    if (!f.json)
      std::printf("round %d: plain %.2f tok/s, spec %.2f tok/s (x%.2f), drafted %lld, accepted %lld\n", r, a.tps, b.tps,
                  ratio.back(), (long long)drafted, (long long)accepted);
  }
  const Sample p = summarize(tps_plain), s = summarize(tps_spec), x = summarize(ratio), dp = summarize(draft_prefill);
  const double rate = drafted > 0 ? static_cast<double>(accepted) / drafted : 0;
  if (f.json) {
    nlohmann::json j = {{"model", m.model->info().architecture}, {"weights", m.model->info().weight_dtypes},
                        {"spec", sp->kind}, {"draft_max", sp->options.draft_max}, {"prompt_tokens", prompt->size()},
                        {"generated_tokens", generated}, {"rounds", f.repeats},
                        {"plain_tps", p.median}, {"spec_tps", s.median}, {"speedup", x.median},
                        {"drafted", drafted}, {"accepted", accepted}, {"acceptance", rate}, {"identical", same},
                        {"draft_prefill_s", dp.median}, {"plain_tps_all", tps_plain}, {"spec_tps_all", tps_spec}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("spec %s (draft-max %d): prompt %zu tokens, %lld generated | plain %.2f tok/s, spec %.2f tok/s "
                "(medians of %d) | speedup x%.2f (median of per-round ratios) | drafted %lld, accepted %lld (%.1f%%) | "
                "draft prefill %.2f s | output %s\n",
                sp->kind.c_str(), sp->options.draft_max, prompt->size(), (long long)generated, p.median, s.median, f.repeats,
                x.median, (long long)drafted, (long long)accepted, 100 * rate, dp.median,
                same ? "identical to plain decoding" : "DIFFERS from plain decoding");
  }
  return same ? 0 : 1;
}

int run_bench(const BenchFlags& f) {
  // Either test may be skipped (llama-bench's -p 0 / -n 0), not both.
  if (f.prompt == 0 && f.gen == 0) return report(invalid_argument("[bench] -p 0 and -n 0: no test left to run"));
  if (f.profile && f.gen == 0) return report(invalid_argument("[bench] --profile times the tg test; give -n > 0"));
  if (f.threads > 0) default_pool().set_threads(f.threads);
  auto kv_dtype = kv_dtype_of(f.kv);
  if (!kv_dtype.is_ok()) return report(kv_dtype.status());
  runtime::LoadOptions lo;
  lo.kv_dtype = *kv_dtype;
  lo.map_mode = map_mode(f.model_arg);
  auto loaded = runtime::load_model(f.model, lo);
  if (!loaded.is_ok()) return report(loaded.status());
  runtime::LoadedModel& m = **loaded;
  // As serve and generate: a cold file is read now, not inside the first timed run, and a file
  // cached in 4 KiB pieces is read again into 2 MiB pages, so bench measures what they run.
  runtime::page_in_weights(m.files.tensors());
  if (!f.spec.spec.empty() || !f.spec.draft.empty()) return run_spec_bench(f, m, lo);
  models::Model& model = *m.model;
  const auto& info = model.info();
  const int64_t V = info.vocab;
  // Past the trained context llama-bench runs anyway (with a warning), and so does bench: speed
  // does not depend on what the positions mean (the 1B benchmark model is trained to 8192, and
  // issue 14 measures decode at -d 16384).
  if (const int64_t need = f.depth + std::max(f.prompt, f.gen) + 1; need > info.max_context) {
    std::fprintf(stderr,
                 "note: -d %lld + max(-p %lld, -n %lld) passes the model's trained context of %lld tokens; "
                 "measuring speed there anyway, as llama-bench does\n",
                 (long long)f.depth, (long long)f.prompt, (long long)f.gen, (long long)info.max_context);
    model.extend_context(need);
  }

  // Bytes a decode step streams: every tensor except the embedding table (a row gather) — unless
  // the LM head is the embedding (tied), which is then read in full.
  uint64_t weight_bytes = 0;
  for (const auto& t : m.files.tensors().tensors()) {
    if (is_embedding(t.name) && !info.tied_embeddings) continue;
    weight_bytes += t.nbytes;
  }
  // Multiply-adds per token: the layer matmuls and the LM head.
  const int64_t q_dim = info.n_heads * info.head_dim, kv_dim = info.n_kv_heads * info.head_dim;
  const double macs_layer = static_cast<double>(info.hidden) * (2 * q_dim + 2 * kv_dim) + 3.0 * info.hidden * info.ffn;
  const double macs_token = info.n_layers * macs_layer;  // prefill: LM head only for the last row
  // KV bytes a decode step reads per token of context (K and V of every plain layer, in the KV
  // dtype; sliding rings are bounded by their window and left out).
  const memory::KvLayout kv_layout = model.state_schema().plain_layout();
  const double kv_row_bytes = 2.0 * kv_layout.n_layers * static_cast<double>(kv_layout.row_bytes());
  (void)kv_dim;
  const bool int8_arith = info.weight_dtypes.find("Q8_0") != std::string::npos ||
                          info.weight_dtypes.find("Q4_0") != std::string::npos ||
                          info.weight_dtypes.find("Q4_K") != std::string::npos ||
                          info.weight_dtypes.find("Q6_K") != std::string::npos ||
                          info.weight_dtypes.find("affine") != std::string::npos ||
                          info.weight_dtypes.find("U32") != std::string::npos;

  const bool bf16 = info.weight_dtypes.find("BF16") != std::string::npos;
  Roofline roof;
  double bf16_gflops = 0;  // the active tier's BF16 dot-product ceiling, when it has one
  if (!f.no_roofline) {
    roof.read_gbs = measure_read_bandwidth(default_pool());
    roof.f32_fma_gflops = measure_f32_fma_peak(default_pool());
    // Prefill ceilings of what the active kernels issue (AVX-512: zmm vpdpbusd / vdpbf16ps).
    roof.int8_gops = kernels::cpu::active_int8_peak(default_pool());
    if (roof.int8_gops <= 0) roof.int8_gops = measure_int8_peak(default_pool());
    if (bf16) bf16_gflops = kernels::cpu::active_bf16_peak(default_pool());
  }
  const double peak = int8_arith ? roof.int8_gops : bf16_gflops > 0 ? bf16_gflops : roof.f32_fma_gflops;

  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<float> logits(static_cast<size_t>(V));

  // pp: one forward of `prompt` random tokens into an empty cache (llama-bench's pp<p>).
  std::vector<double> pp_tps, tg_tps;
  const int cache_plain_layers = model.state_schema().plain_layout().n_layers;
  // Resident memory after the last prefill, its KV cache still alive, against what must be
  // resident: the mapped weights (all tensors) plus that KV cache (issue 3: ≤ both + 5 %).
  Rss rss;
  uint64_t kv_bytes = 0, mapped_bytes = 0;
  // The state by layer kind after the last prefill: plain KV grows with the context, a sliding
  // layer's ring stays at its window (issue 13), a recurrent state is constant.
  uint64_t plain_bytes = 0, ring_bytes = 0, other_bytes = 0;
  int ring_layers = 0, other_layers = 0;
  for (const auto& t : m.files.tensors().tensors()) mapped_bytes += t.nbytes;
  // -d: the context every repeat starts from, prefilled once (untimed) in 512-token chunks.
  const int64_t cap = f.depth + std::max(f.prompt, f.gen) + 1;
  std::vector<int32_t> depth_ids(static_cast<size_t>(f.depth));
  for (auto& id : depth_ids) id = tok(rng);
  double depth_seconds = 0;
  auto at_depth = [&](memory::SequenceState& s, bool fresh) -> Status {
    if (!fresh && s.trim(f.depth).is_ok()) return Status::ok();
    s = model.new_state(cap);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < f.depth; i += 512) {
      LARDER_RETURN_IF_ERROR(model.forward(depth_ids.data() + i, std::min<int64_t>(512, f.depth - i), s, logits.data(), false));
    }
    depth_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return Status::ok();
  };
  memory::SequenceState cache = model.new_state(cap);
  if (Status st = at_depth(cache, true); !st.is_ok()) return report(st);
  for (int r = 0; r < f.repeats + 1; ++r) {  // r = 0 warms the page cache and the pool
    std::vector<int32_t> ids(static_cast<size_t>(f.prompt));
    for (auto& id : ids) id = tok(rng);
    if (Status st = at_depth(cache, false); !st.is_ok()) return report(st);
    const auto t0 = Clock::now();
    Status st = f.prompt > 0 ? model.forward(ids.data(), f.prompt, cache, logits.data(), false) : Status::ok();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.is_ok()) return report(st);
    if (r > 0 && f.prompt > 0) pp_tps.push_back(static_cast<double>(f.prompt) / dt);
    if (r == f.repeats) {
      rss = read_rss();
      kv_bytes = cache.resident_bytes();
      plain_bytes = cache.kv.owned_bytes();
      for (const auto& l : cache.layers) {
        const bool ring = l->kind() == memory::StateKind::kRing;
        (ring ? ring_bytes : other_bytes) += l->resident_bytes();
        ++(ring ? ring_layers : other_layers);
      }
    }
  }
  // tg: `gen` single-token steps after the context (llama-bench's tg<n>). The read probe runs
  // before every timed run and after the last, so each run is set against the bandwidth of its
  // own minutes (the mean of the probes on either side), not the start's.
  // Made after the prefill runs, so the RSS they report does not hold its buffer.
  std::vector<double> tg_probe;
  std::optional<ReadProbe> probe;
  if (!f.no_roofline && f.gen > 0) probe.emplace();
  for (int r = 0; f.gen > 0 && r < f.repeats + 1; ++r) {
    if (Status st = at_depth(cache, false); !st.is_ok()) return report(st);
    if (r > 0 && probe && probe->ok()) tg_probe.push_back(probe->measure(default_pool(), 3));
    int32_t next = tok(rng);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < f.gen; ++i) {
      Status st = model.forward(&next, 1, cache, logits.data(), false);
      if (!st.is_ok()) return report(st);
      // The server's greedy pick (runtime/sampler.h), so tg and a greedy stream do the same work.
      next = static_cast<int32_t>(kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())));
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) tg_tps.push_back(static_cast<double>(f.gen) / dt);
  }
  if (!tg_probe.empty()) tg_probe.push_back(probe->measure(default_pool(), 3));
  probe.reset();
  // --profile: the same decode once more with core/profile.h on (after the timed runs, so the
  // clock reads never touch the reported tok/s).
  std::vector<profile::OpStat> prof_ops;
  profile::PoolStat prof_pool;
  double prof_tps = 0;
  if (f.profile) {
    memory::SequenceState cache = model.new_state(f.gen + 1);
    int32_t next = tok(rng);
    profile::reset();
    profile::set_enabled(true);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < f.gen; ++i) {
      Status st = model.forward(&next, 1, cache, logits.data(), false);
      if (!st.is_ok()) return report(st);
      next = static_cast<int32_t>(kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())));
    }
    prof_tps = static_cast<double>(f.gen) / std::chrono::duration<double>(Clock::now() - t0).count();
    profile::set_enabled(false);
    prof_ops = profile::snapshot();
    prof_pool = profile::pool_snapshot();
  }
  if (pp_tps.empty()) pp_tps.push_back(0);
  if (tg_tps.empty()) tg_tps.push_back(0);
  const Sample pp = summarize(pp_tps), tg = summarize(tg_tps);
  // The weights' pages after the runs: a file mapping whose page cache was filled by a write (a
  // fresh download or conversion) stays in 4 KiB pages, and decode streams it measurably slower
  // (bench/RESULTS.md, session 23) — worth a line, since nothing else shows it.
  MappedFile::Residency weight_pages;
  bool weights_mapped = false;
  for (const auto& file : m.files.tensors().files()) {
    const MappedFile::Residency r = file->residency();
    weight_pages.resident += r.resident;
    weight_pages.huge += r.huge;
    weights_mapped |= file->mode() == MapMode::kMap;
  }
  const double avg_ctx = static_cast<double>(f.depth) + static_cast<double>(f.gen) / 2;
  const double kv_read_gbs = tg.median * kv_row_bytes * avg_ctx / 1e9;  // of tg_gbs
  const double bytes_token = static_cast<double>(weight_bytes) + kv_row_bytes * avg_ctx;
  const double tg_gbs = tg.median * bytes_token / 1e9;
  // Decode against the probes beside each run (see the tg loop); else against the start's probe.
  std::vector<double> tg_pct_runs;
  for (size_t i = 0; i + 1 < tg_probe.size() && i < tg_tps.size(); ++i) {
    const double beside = 0.5 * (tg_probe[i] + tg_probe[i + 1]);
    if (beside > 0) tg_pct_runs.push_back(100 * tg_tps[i] * bytes_token / 1e9 / beside);
  }
  const double tg_pct = !tg_pct_runs.empty() ? summarize(tg_pct_runs).median
                        : roof.read_gbs > 0  ? 100 * tg_gbs / roof.read_gbs
                                             : 0.0;
  const double pp_avg_ctx = static_cast<double>(f.depth) + static_cast<double>(f.prompt) / 2;
  const double attn_macs = 2.0 * info.n_layers * q_dim * pp_avg_ctx;
  const double pp_gops = pp.median * 2 * (macs_token + attn_macs) / 1e9 +
                         (f.prompt > 0 ? 2.0 * static_cast<double>(V) * info.hidden * pp.median / f.prompt / 1e9 : 0.0);

  if (f.json) {
    nlohmann::ordered_json j = {
        {"model", m.files.path}, {"architecture", info.architecture}, {"weights", info.weight_dtypes},
        {"params", info.n_params}, {"weight_bytes_per_token", weight_bytes}, {"threads", default_pool().n_threads()},
        {"kernels", kernels::active_table().name}, {"cpu", cpu_features().describe()}, {"repeats", f.repeats},
        {"kv_dtype", memory::kv_dtype_tag(kv_layout.dtype)}, {"depth", f.depth}, {"depth_prefill_s", depth_seconds},
        {"roofline", {{"read_gbs", roof.read_gbs}, {"f32_fma_gflops", roof.f32_fma_gflops}, {"int8_gops", roof.int8_gops},
                      {"bf16_gflops", bf16_gflops}}},
        {"pp", {{"tokens", f.prompt}, {"tok_s", pp.median}, {"tok_s_min", pp.min}, {"tok_s_max", pp.max},
                {"gops", pp_gops}, {"pct_peak", peak > 0 ? 100 * pp_gops / peak : 0}}},
        {"tg", {{"tokens", f.gen}, {"tok_s", tg.median}, {"tok_s_min", tg.min}, {"tok_s_max", tg.max},
                {"gbs", tg_gbs}, {"kv_read_gbs", kv_read_gbs}, {"pct_bandwidth", tg_pct},
                {"pct_bandwidth_runs", tg_pct_runs}, {"probe_gbs_beside_runs", tg_probe},
                {"bound_tok_s", roof.read_gbs > 0 ? roof.read_gbs * 1e9 / bytes_token : 0}}},
        {"memory", {{"rss_bytes", rss.total}, {"rss_anon_bytes", rss.anon}, {"rss_file_bytes", rss.file},
                    {"weights_resident_bytes", weight_pages.resident}, {"weights_huge_page_bytes", weight_pages.huge},
                    {"mapped_weight_bytes", mapped_bytes}, {"kv_bytes", kv_bytes},
                    {"state", {{"context_tokens", f.depth + f.prompt}, {"plain_kv_layers", cache_plain_layers},
                               {"plain_kv_bytes", plain_bytes}, {"ring_layers", ring_layers},
                               {"ring_bytes", ring_bytes}, {"other_layers", other_layers}, {"other_bytes", other_bytes}}},
                    {"rss_over_weights_plus_kv", static_cast<double>(rss.total) / static_cast<double>(std::max<uint64_t>(1, mapped_bytes + kv_bytes))}}}};
    if (f.profile) {
      nlohmann::ordered_json ops = nlohmann::ordered_json::array();
      const double g = static_cast<double>(f.gen);
      for (const auto& o : prof_ops) {
        ops.push_back({{"op", o.name}, {"calls_per_token", o.calls / g}, {"self_us_per_token", o.self_ns / 1e3 / g},
                       {"gbs", o.total_ns > 0 ? o.bytes / o.total_ns : 0}, {"jobs_per_token", o.jobs / g},
                       {"join_wait_us_per_token", o.join_wait_ns / 1e3 / g}, {"jobs_alone", o.jobs_alone}});
      }
      j["profile"] = {{"tok_s", prof_tps},
                      {"ops", ops},
                      {"pool", {{"jobs_per_token", prof_pool.jobs / g},
                                {"worker_joins_per_job", prof_pool.jobs ? double(prof_pool.joins) / prof_pool.jobs : 0},
                                {"publish_to_join_us", prof_pool.joins ? prof_pool.join_latency_ns / 1e3 / prof_pool.joins : 0},
                                {"join_wait_us_per_token", prof_pool.join_wait_ns / 1e3 / g}}}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model: %s (%s, %s, %.2f GB streamed per decode token)\n", m.files.path.c_str(), info.architecture.c_str(),
              info.weight_dtypes.c_str(), weight_bytes / 1e9);
  std::printf("cpu: %s | kernels %s | %d threads | KV %s\n", cpu_features().describe().c_str(),
              kernels::active_table().name, default_pool().n_threads(), memory::kv_dtype_tag(kv_layout.dtype));
  if (f.depth > 0)
    std::printf("depth: %lld tokens of context before each test (prefilled once in %.1f s; KV %.1f MiB read per "
                "decode token)\n",
                (long long)f.depth, depth_seconds, kv_row_bytes * static_cast<double>(f.depth) / 1048576.0);
  if (!f.no_roofline) {
    std::printf("roofline (this run): read %.1f GB/s | f32 FMA %.0f GFLOP/s | int8 %.0f GOP/s", roof.read_gbs,
                roof.f32_fma_gflops, roof.int8_gops);
    if (bf16_gflops > 0) std::printf(" | bf16 dot %.0f GFLOP/s", bf16_gflops);
    std::printf("\n");
  }
  std::printf("%-8s %12s %22s %14s %10s\n", "test", "tok/s", "(min..max)", "rate", "of ceiling");
  const std::string at = f.depth > 0 ? strfmt(" @ d%lld", (long long)f.depth) : std::string();
  if (f.prompt > 0)
    std::printf("pp%-6lld %12.1f %10.1f..%-10.1f %9.1f GOP/s %9.1f%%%s\n", (long long)f.prompt, pp.median, pp.min, pp.max,
              pp_gops, peak > 0 ? 100 * pp_gops / peak : 0.0, at.c_str());
  if (f.gen > 0)
    std::printf("tg%-6lld %12.2f %10.2f..%-10.2f %9.1f GB/s  %9.1f%%   (bound %.1f tok/s; KV read %.1f GB/s)%s\n",
              (long long)f.gen, tg.median, tg.min, tg.max, tg_gbs, tg_pct,
              roof.read_gbs > 0 ? roof.read_gbs * 1e9 / bytes_token : 0.0, kv_read_gbs, at.c_str());
  if (!tg_pct_runs.empty()) {
    const Sample pr = summarize(tg_probe);
    std::string runs;
    for (double p : tg_pct_runs) runs += strfmt("%s%.1f %%", runs.empty() ? "" : ", ", p);
    std::printf("tg vs the read probe beside each run (%.1f..%.1f GB/s): %s\n", pr.min, pr.max, runs.c_str());
  }
  std::printf("memory after pp: RSS %.1f MiB (file %.1f, anon %.1f) = %.3f x (mapped weights %.1f MiB + KV %.1f MiB)\n",
              rss.total / 1048576.0, rss.file / 1048576.0, rss.anon / 1048576.0,
              static_cast<double>(rss.total) / static_cast<double>(std::max<uint64_t>(1, mapped_bytes + kv_bytes)),
              mapped_bytes / 1048576.0,
              kv_bytes / 1048576.0);
  std::printf("weights in 2 MiB pages: %.1f of %.1f MiB resident (%s)\n", weight_pages.huge / 1048576.0,
              weight_pages.resident / 1048576.0, weights_mapped ? "mapped" : "--no-mmap copy");
  if (weights_mapped && weight_pages.resident > (uint64_t{64} << 20) && 2 * weight_pages.huge < weight_pages.resident)
    std::printf("note: most of the weights are mapped in 4 KiB pages (how the file entered the page cache decides it: "
                "one written since it was last read, e.g. a fresh download, stays in 4 KiB pages); --no-mmap reads "
                "them into 2 MiB pages\n");
  std::printf("state after pp%lld: plain KV %.2f MiB (%d layers) | sliding rings %.2f MiB (%d layers)",
              (long long)f.prompt, plain_bytes / 1048576.0, cache_plain_layers, ring_bytes / 1048576.0, ring_layers);
  if (other_layers > 0) std::printf(" | other %.2f MiB (%d layers)", other_bytes / 1048576.0, other_layers);
  std::printf("\n");
  if (f.profile) {
    std::printf("\nper-op timeline of one tg%lld run (profiled, %.2f tok/s; self time per decode token):\n%s",
                (long long)f.gen, prof_tps, profile::format_table(prof_ops, prof_pool, static_cast<double>(f.gen)).c_str());
  }
  if (pp.max > 1.15 * pp.min || tg.max > 1.15 * tg.min)
    std::printf("note: spread over 15%% between repeats — the host is noisy; compare medians from one run\n");
  return 0;
}

}  // namespace

VerbMain add_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "prefill and decode speed against this machine's roofline");
  add_model_arg(cmd, f->model_arg, "");
  cmd->add_option("-p,--prompt", f->prompt, "prefill test tokens (pp; 0 skips the test)")->check(at_least(0));
  cmd->add_option("-n,--gen", f->gen, "decode test tokens (tg; 0 skips the test)")->check(at_least(0));
  cmd->add_option("-d,--depth,--n-depth", f->depth, "tokens of context before each test (llama-bench -d)")
      ->check(at_least(0));
  add_kv_dtype_flags(cmd, f->kv);
  cmd->add_option("-t,--threads", f->threads, "compute threads (default: physical cores)")->check(positive());
  cmd->add_option("-r,--repeats", f->repeats, "repeats per test (median reported)")->check(in_range(1, 1000));
  cmd->add_flag("--json", f->json, "machine-readable output");
  cmd->add_flag("--no-roofline", f->no_roofline, "skip the bandwidth/peak probes");
  cmd->add_flag("--profile", f->profile,
                "after the timed runs, one more tg run with the per-op timeline (core/profile.h): time per op "
                "and per decode token, GB/s, thread-pool jobs and join waits");
  add_spec_flags(cmd, f->spec);
  f->spec.spec.clear();  // bench: no speculation test unless asked for
  cmd->add_option("--spec-prompt", f->spec_prompt,
                  "with --spec: the user message (chat template applied) to decode -n tokens after, from FILE "
                  "(default: a function to rewrite)");
  return [f]() {
    auto m = resolve_model(f->model_arg);
    if (!m.is_ok()) return report(m.status());
    f->model = m->path;
    return run_bench(*f);
  };
}

}  // namespace larder::cli
