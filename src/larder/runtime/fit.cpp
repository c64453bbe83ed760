#include "larder/runtime/fit.h"

#include "larder/memory/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "larder/core/progress.h"

namespace larder::runtime {

namespace {

// The process before any model: binary text, libraries, the thread pool's threads and allocator
// arenas. Measured by tests/fit with a 512-entry-vocabulary 1 MB model: ~20 MiB at peak RSS
// (`larder tokenize` alone ~14 MiB); grows with the binary, so tests/fit re-measures it.
constexpr uint64_t kProcessBase = 20ull << 20;
// The tokenizer's tables per vocabulary entry, with the tokenizer.json text held while it is
// parsed (read once, without a second copy: core read_text_file). Measured by tests/fit: a
// 128k-entry HF tokenizer peaks ~13 MiB above the GGUF models of the same shapes.
constexpr uint64_t kTokenizerPerEntry = 100;
constexpr uint64_t kHeadroom = 64ull << 20;  // page tables, allocator slack, the OS's share

std::string gib(uint64_t b) { return Progress::format_bytes(static_cast<double>(b)); }

uint64_t read_u64_file(const std::string& path, bool* ok) {
  std::ifstream in(path);
  std::string s;
  *ok = static_cast<bool>(in >> s) && s != "max";
  return *ok ? std::strtoull(s.c_str(), nullptr, 10) : 0;
}

// The largest routed-experts intermediate size of the model's layers.
uint64_t moe_ffn_of(const models::Model& model) {
  int64_t f = 0;
  for (const models::LayerSpec& l : model.layers())
    if (l.ffn == models::FfnKind::kRoutedExperts) f = std::max(f, l.experts.ffn);
  return static_cast<uint64_t>(f);
}

}  // namespace

uint64_t parse_bytes(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return 0;
  double mul = 1;
  switch (*end) {
    case 'k': case 'K': mul = 1024.0; break;
    case 'm': case 'M': mul = 1024.0 * 1024; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
    case '\0': break;
    default: return 0;
  }
  return static_cast<uint64_t>(v * mul);
}


FitEstimate estimate_fit(const models::Model& model, uint64_t weight_bytes, const FitRequest& req) {
  const models::ModelInfo& i = model.info();
  FitEstimate e;
  e.weights = weight_bytes;
  e.expert_bytes = i.expert_bytes;
  e.weights_per_token = weight_bytes - std::min(weight_bytes, i.expert_bytes - i.active_expert_bytes);
  // From the layers' own state schema: plain layers grow per token, rings stop at their window,
  // KV-sharing layers (Gemma 4) hold nothing.
  const memory::StateFootprint fp = model.state_schema().footprint();
  e.kv_per_token = fp.per_token;
  e.kv_dtype = model.state_schema().kv_dtype;
  e.kv_fixed = fp.fixed;
  e.kv = fp.at(req.ctx) * static_cast<uint64_t>(req.parallel);
  const uint64_t rows = static_cast<uint64_t>(std::max<int64_t>(1, std::min(req.ctx, req.prefill_rows)));
  const uint64_t q_dim = static_cast<uint64_t>(i.n_heads * i.head_dim), kv_dim = static_cast<uint64_t>(i.n_kv_heads * i.head_dim);
  // decoder x/h/o, attention q/k/v/att, MLP gate/up, the activations quantized for the integer
  // kernels (a byte per element), and the last row's logits (twice: model buffer + caller's).
  // MoE layers: router logits, ids and weights, gate/up per (token, slot), down's output per slot.
  const uint64_t k = static_cast<uint64_t>(i.n_experts_used);
  const uint64_t moe_ffn = k > 0 && i.n_experts > 0 ? moe_ffn_of(model) : 0;
  const uint64_t per_row = 3 * i.hidden + 2 * q_dim + 2 * kv_dim + 2 * i.ffn +
                           (k > 0 ? static_cast<uint64_t>(i.n_experts) + 2 * k + 2 * k * moe_ffn + k * i.hidden : 0);
  // Gated DeltaNet layers (models/blocks/gated_delta.cpp) keep their own per-row buffers beside
  // those: projected and convolved q|k|v, the output gate z and the output y, four gates per value
  // head, and q/k copied per value head when the heads are tiled (GGUF qwen35) or the fused
  // projections' outputs before they are split (Qwen3-Next's in_proj_qkvz / in_proj_ba; a model
  // has one or the other) — sized by the largest.
  uint64_t delta_row = 0;
  for (const memory::LayerStateSpec& l : model.state_schema().layers) {
    if (l.kind != memory::StateKind::kRecurrent) continue;
    const uint64_t C = static_cast<uint64_t>(l.conv_dim), Hv = static_cast<uint64_t>(l.n_heads);
    const uint64_t V = Hv * static_cast<uint64_t>(l.dv), tiled = 2 * Hv * static_cast<uint64_t>(l.dk) + V;
    const uint64_t fused = C + V + 2 * Hv;
    delta_row = std::max(delta_row, 2 * C + 2 * V + 4 * Hv + std::max(tiled, fused));
  }
  e.scratch = rows * (per_row + delta_row) * sizeof(float) + rows * std::max(i.hidden, i.ffn) +
              2 * i.vocab * sizeof(float);
  e.runtime = kProcessBase + kTokenizerPerEntry * static_cast<uint64_t>(i.vocab);
  e.kv_store_cap = req.kv_store_ram_cap;
  return e;
}

MemoryAvailable available_memory() {
  MemoryAvailable a;
  if (const char* lim = std::getenv("LARDER_MEMORY_LIMIT"); lim && *lim) {
    a.bytes = parse_bytes(lim);
    a.source = "LARDER_MEMORY_LIMIT";
    return a;
  }
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        a.bytes = kb * 1024;
        a.source = "MemAvailable";
        break;
      }
    }
  }
  // cgroup v2: this process's group (from /proc/self/cgroup "0::/path").
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    bool ok_max = false, ok_cur = false;
    const uint64_t max = read_u64_file(dir + "/memory.max", &ok_max);
    const uint64_t cur = read_u64_file(dir + "/memory.current", &ok_cur);
    if (ok_max && ok_cur) {
      const uint64_t room = max > cur ? max - cur : 0;
      if (a.source.empty() || room < a.bytes) {
        a.bytes = room;
        a.source = "cgroup memory.max";
      }
    }
  }
  return a;
}

FitVerdict check_fit(const FitEstimate& est, const FitRequest& req, const MemoryAvailable& avail) {
  FitVerdict v;
  v.kv_store_cap = req.kv_store_ram_cap;
  if (avail.source.empty()) return v;  // nothing known: do not guess
  const uint64_t budget = avail.bytes > kHeadroom ? avail.bytes - kHeadroom : 0;
  if (est.total() <= budget) {
    const uint64_t left = budget - est.total();
    if (req.kv_store_ram_cap > left) {
      v.kv_store_cap = left;
      v.note = strfmt("the prompt cache's RAM cap is lowered from %s to %s so the model, its KV and the cache fit in "
                      "%s (%s)",
                      gib(req.kv_store_ram_cap).c_str(), gib(left).c_str(), gib(avail.bytes).c_str(),
                      avail.source.c_str());
    }
    return v;
  }
  std::string advice;
  if (est.fixed() + est.kv_fixed + est.kv_per_token * 256 > budget) {
    advice = strfmt("the weights alone (%s) plus the runtime leave no room for a context: pick a smaller or more "
                    "quantized model",
                    gib(est.weights).c_str());
  } else {
    const uint64_t room = budget - est.fixed();  // for every sequence's state
    const uint64_t per_seq = room / static_cast<uint64_t>(req.parallel);
    const uint64_t ctx_tokens = per_seq > est.kv_fixed ? (per_seq - est.kv_fixed) / std::max<uint64_t>(est.kv_per_token, 1) : 0;
    const int64_t ctx_at_p = static_cast<int64_t>(ctx_tokens) / 256 * 256;
    advice = strfmt("what fits: --ctx %lld with --parallel %lld", static_cast<long long>(ctx_at_p),
                    static_cast<long long>(req.parallel));
    const int64_t p_at_ctx = static_cast<int64_t>(room / std::max<uint64_t>(est.kv_per_token * static_cast<uint64_t>(req.ctx) + est.kv_fixed, 1));
    if (req.parallel > 1 && p_at_ctx >= 1) {
      advice += strfmt(", or --parallel %lld with --ctx %lld", static_cast<long long>(p_at_ctx),
                       static_cast<long long>(req.ctx));
    }
  }
  v.status = Status(StatusCode::kResourceExhausted,
                    strfmt("[fit] needs about %s (weights %s + KV %s for %lld x %lld tokens + scratch %s + runtime %s) "
                           "but %s is available (%s); %s",
                           gib(est.total()).c_str(), gib(est.weights).c_str(), gib(est.kv).c_str(),
                           static_cast<long long>(req.parallel), static_cast<long long>(req.ctx),
                           gib(est.scratch).c_str(), gib(est.runtime).c_str(), gib(avail.bytes).c_str(),
                           avail.source.c_str(), advice.c_str()));
  return v;
}

FitVerdict check_model_fit(const models::Model& model, uint64_t weight_bytes, const FitRequest& req) {
  return check_fit(estimate_fit(model, weight_bytes, req), req, available_memory());
}

std::string describe_fit(const FitEstimate& est, const FitRequest& req, const MemoryAvailable& avail) {
  std::ostringstream o;
  o << strfmt("memory estimate (--ctx %lld --parallel %lld):\n", static_cast<long long>(req.ctx),
              static_cast<long long>(req.parallel));
  o << strfmt("  weights        %s\n", gib(est.weights).c_str());
  if (est.expert_bytes)
    o << strfmt("    experts      %s of them (all mapped); a token reads %s of the weights (the experts it is routed "
                "to)\n",
                gib(est.expert_bytes).c_str(), gib(est.weights_per_token).c_str());
  o << strfmt("  KV cache       %s (%s per token per sequence in %s", gib(est.kv).c_str(), gib(est.kv_per_token).c_str(),
              memory::kv_dtype_tag(est.kv_dtype));
  if (est.kv_fixed) o << strfmt(", + %s per sequence for sliding-window rings and recurrent state", gib(est.kv_fixed).c_str());
  o << ")\n";
  o << strfmt("  scratch        %s\n", gib(est.scratch).c_str());
  o << strfmt("  runtime        %s\n", gib(est.runtime).c_str());
  o << strfmt("  total          %s\n", gib(est.total()).c_str());
  if (est.kv_store_cap) o << strfmt("  + prompt cache up to %s\n", gib(est.kv_store_cap).c_str());
  if (!avail.source.empty()) {
    const FitVerdict v = check_fit(est, req, avail);
    o << strfmt("  available      %s (%s): %s\n", gib(avail.bytes).c_str(), avail.source.c_str(),
                v.status.is_ok() ? "fits" : v.status.message().c_str());
  }
  return o.str();
}

}  // namespace larder::runtime
