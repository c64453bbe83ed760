#include "larder/models/blocks/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "larder/core/threadpool.h"

namespace larder::models {

Status bind_attention(WeightBinder& b, const std::string& p, const LayerSpec& spec, const ModelConfig& c,
                      const AttentionOptions& opt, AttentionWeights* w) {
  const int64_t q_dim = int64_t{spec.n_heads} * spec.head_dim, kv_dim = int64_t{spec.n_kv_heads} * spec.head_dim;
  const bool own_kv = spec.kv_source < 0;
  const int64_t q_rows = spec.attn_gate ? 2 * q_dim : q_dim;  // [query | gate] per head
  const bool qkv_bias = opt.qkv_bias || c.attention_bias;
  LARDER_ASSIGN_OR_RETURN(w->q, b.projection({.module = p + "q_proj",
                                              .out = q_rows,
                                              .in = c.hidden,
                                              .why = spec.attn_gate ? "2*num_attention_heads*head_dim x hidden_size (query and gate)"
                                                                    : "num_attention_heads*head_dim x hidden_size",
                                              .bias = qkv_bias,
                                              .bias_why = "q_proj rows"}));
  if (own_kv) {
    const char* why = "num_key_value_heads*head_dim x hidden_size";
    const char* bias_why = "num_key_value_heads*head_dim";
    LARDER_ASSIGN_OR_RETURN(w->k, b.projection({.module = p + "k_proj", .out = kv_dim, .in = c.hidden, .why = why,
                                                .bias = qkv_bias, .bias_why = bias_why}));
    if (!spec.k_eq_v) {
      LARDER_ASSIGN_OR_RETURN(w->v, b.projection({.module = p + "v_proj", .out = kv_dim, .in = c.hidden, .why = why,
                                                  .bias = qkv_bias, .bias_why = bias_why}));
    }
  }
  // llama-style attention_bias also covers o_proj (HF LlamaAttention); qwen2's q/k/v bias does not.
  LARDER_ASSIGN_OR_RETURN(w->o, b.projection({.module = p + "o_proj",
                                              .out = c.hidden,
                                              .in = q_dim,
                                              .why = "hidden_size x num_attention_heads*head_dim",
                                              .bias = c.attention_bias,
                                              .bias_why = "hidden_size"}));
  if (spec.norms.qk) {
    LARDER_ASSIGN_OR_RETURN(w->q_norm.weight, b.vector(p + "q_norm.weight", spec.head_dim, "head_dim"));
    if (own_kv) {
      LARDER_ASSIGN_OR_RETURN(w->k_norm.weight, b.vector(p + "k_norm.weight", spec.head_dim, "head_dim"));
    }
    w->q_norm.eps = w->k_norm.eps = static_cast<float>(c.rms_eps);
  }
  if (spec.norms.v && own_kv) {
    w->v_norm.weight.assign(static_cast<size_t>(spec.head_dim), 1.0f);
    w->v_norm.eps = static_cast<float>(c.rms_eps);
  }
  return Status::ok();
}

namespace {
// Whether to attend the sequences of a batch in parallel, one sequence per pool chunk, instead of
// one after another with the kernel spreading each one over the pool. Batched decode (several
// streams, one or a few rows each) is what wants it: per sequence the kernel has only one item
// per KV head (3 for SmolLM2-135M) and microseconds of work, so on a 2-thread pool the caller
// finished most of them before the worker joined, and attention ran nearly serially while the
// worker spun (perf, 8 streams). Across sequences the chunks are as many as the sequences.
// Dynamic claiming bounds the step by about total/threads + the longest sequence, so it is
// taken only when no sequence dominates (the longest ≤ 1.25 × an even share) and every
// sequence is a decode-sized slice; a long prefill, or one long context among short ones,
// keeps the kernel's own split (query tiles, or KV chunks at long contexts).
bool across_sequences(std::span<const AttentionSeq> seqs, const int64_t* positions, int64_t window) {
  const int threads = default_pool().n_threads();
  if (seqs.size() < 2 || threads < 2) return false;
  int64_t total = 0, longest = 0;
  for (const AttentionSeq& sq : seqs) {
    if (sq.n > 16) return false;
    int64_t keys = positions[sq.row0] + sq.n;
    if (window > 0) keys = std::min(keys, window + sq.n);
    total += keys;
    longest = std::max(longest, keys);
  }
  return longest * threads * 4 <= total * 5;
}
}  // namespace

void attention_block(const AttentionCall& call, AttentionScratch& s, float* out) {
  const LayerSpec& spec = *call.spec;
  const AttentionOptions& opt = *call.opt;
  const AttentionWeights& w = *call.w;
  const float* h = call.h;
  const float* inv_freq = call.inv_freq;
  const int64_t rows = call.rows;
  const int64_t* positions = call.positions;
  const int layer = call.layer;
  const std::span<const AttentionSeq> seqs = call.seqs;
  std::vector<KvKeep>* keep = call.keep;
  const int nh = spec.n_heads, nkv = spec.n_kv_heads, hd = spec.head_dim;
  const int64_t q_dim = int64_t{nh} * hd, kv_dim = int64_t{nkv} * hd;
  const bool own_kv = spec.kv_source < 0;
  const int slot_i = own_kv ? layer : spec.kv_source;
  s.q.resize(static_cast<size_t>(rows * q_dim));
  s.att.resize(static_cast<size_t>(rows * q_dim));
  // q, k and v read the same activations: one group (one quantization of h, one pool job in
  // decode) instead of three projections.
  {
    if (spec.attn_gate) s.qg.resize(static_cast<size_t>(rows * 2 * q_dim));
    const Projection* ps[3] = {&w.q};
    float* ys[3] = {spec.attn_gate ? s.qg.data() : s.q.data()};
    int count = 1;
    if (own_kv) {
      s.k.resize(static_cast<size_t>(rows * kv_dim));
      s.v.resize(static_cast<size_t>(rows * kv_dim));
      ps[count] = &w.k;
      ys[count++] = s.k.data();
      if (!spec.k_eq_v) {
        ps[count] = &w.v;
        ys[count++] = s.v.data();
      }
    }
    apply_group(ps, ys, count, h, rows, call.adapters);
  }
  if (spec.attn_gate) {
    // Per head, q_proj emits head_dim query values then head_dim gate values (mlx-lm
    // Qwen3NextAttention: reshape [.., heads, 2·head_dim], split in halves). The bias, when there
    // is one, covers both halves.
    s.gate.resize(static_cast<size_t>(rows * q_dim));
    for (int64_t r = 0; r < rows * nh; ++r) {
      const float* src = s.qg.data() + r * 2 * hd;
      std::memcpy(s.q.data() + r * hd, src, static_cast<size_t>(hd) * sizeof(float));
      std::memcpy(s.gate.data() + r * hd, src + hd, static_cast<size_t>(hd) * sizeof(float));
    }
  }
  if (own_kv && spec.k_eq_v) std::memcpy(s.v.data(), s.k.data(), static_cast<size_t>(rows * kv_dim) * sizeof(float));
  if (spec.norms.qk) {  // per head: the rows are [rows * heads, head_dim]
    w.q_norm.apply(s.q.data(), rows * nh, s.q.data());
    if (own_kv) w.k_norm.apply(s.k.data(), rows * nkv, s.k.data());
  }
  if (spec.norms.v && own_kv) w.v_norm.apply(s.v.data(), rows * nkv, s.v.data());
  // RoPE is per row (each row carries its own position), so one call covers every sequence.
  kernels::rope(s.q.data(), rows, nh, hd, spec.rope_dim, positions, inv_freq, opt.pairing);
  if (own_kv) kernels::rope(s.k.data(), rows, nkv, hd, spec.rope_dim, positions, inv_freq, opt.pairing);

  kernels::AttentionParams ap;
  ap.n_heads = nh;
  ap.n_kv_heads = nkv;
  ap.head_dim = hd;
  ap.scale = spec.attn_scale;
  ap.window = spec.kind == LayerKind::kSliding ? spec.window : 0;
  ap.sinks = w.sinks.empty() ? nullptr : w.sinks.data();
  if (keep && own_kv) keep->resize(seqs.size());
  // One sequence: its K/V write, the spans its slot hands out, causal attention over them.
  // Sequences touch only their own state, keep entry and output rows, so they may run on
  // different pool threads (the kernel's own parallel_for then runs inline on that thread).
  auto one = [&](size_t si, std::vector<memory::KvSpan>& spans, std::vector<kernels::KvSpanView>& views) {
    const AttentionSeq& sq = seqs[si];
    memory::SequenceState& st = *sq.state;
    const memory::LayerSlot& slot = st.slots[static_cast<size_t>(slot_i)];
    const int64_t pos0 = positions[sq.row0];
    const float* k_new = own_kv ? s.k.data() + sq.row0 * kv_dim : nullptr;
    const float* v_new = own_kv ? s.v.data() + sq.row0 * kv_dim : nullptr;
    spans.clear();
    memory::RingState* ring = nullptr;
    if (slot.kind == memory::StateKind::kPlainKv) {
      memory::KvCache& cache = st.kv;
      if (own_kv && sq.n > 0) {
        // The new rows in the cache's KV dtype (a private tail: positions pos0.. are contiguous).
        // Attention then reads them back from the cache like every other row, so a row is
        // attended with the same (rounded) value now and when a later request reuses it.
        const DType dt = cache.layout().dtype;
        kernels::kv_encode(dt, k_new, sq.n * kv_dim, cache.k_row(slot.index, pos0));
        kernels::kv_encode(dt, v_new, sq.n * kv_dim, cache.v_row(slot.index, pos0));
      }
      // A sliding layer kept in plain KV reads only its window (the kernel masks the rest).
      cache.spans(slot.index, pos0 + sq.n, &spans);
    } else if (!own_kv) {
      LARDER_DCHECK(keep != nullptr && si < keep->size(), "KV-sharing layer over a ring without its source's copy");
      const KvKeep& kk = (*keep)[si];
      spans.push_back({kk.k.data(), kk.v.data(), kk.start, kk.len});
    } else {
      // Ring: what the window of the chunk's first query needs from before the chunk, then the
      // chunk's own rows straight from the projections; the ring absorbs them afterwards. So a
      // prefill chunk longer than the window never overwrites keys its own earlier queries see.
      ring = st.ring(layer);
      LARDER_DCHECK(ring != nullptr && ring->offset() == pos0, "ring slot out of step");
      ring->spans(std::max<int64_t>(0, pos0 - ring->window() + 1), &spans);
      spans.push_back({k_new, v_new, pos0, sq.n});
      if (keep) {
        KvKeep& kk = (*keep)[si];
        kk.k.clear();
        kk.v.clear();
        kk.start = spans.front().start;
        kk.len = 0;
        for (const auto& sp : spans) {
          // Ring rows and the chunk's own rows are f32 (rings keep f32, memory/sequence_state.h).
          const auto* ks = static_cast<const float*>(sp.k);
          const auto* vs = static_cast<const float*>(sp.v);
          kk.k.insert(kk.k.end(), ks, ks + sp.len * kv_dim);
          kk.v.insert(kk.v.end(), vs, vs + sp.len * kv_dim);
          kk.len += sp.len;
        }
      }
    }
    views.clear();
    for (const auto& sp : spans) views.push_back({sp.k, sp.v, sp.start, sp.len, sp.dtype});
    kernels::attention(s.q.data() + sq.row0 * q_dim, sq.n, pos0, views.data(), static_cast<int>(views.size()), ap,
                       s.att.data() + sq.row0 * q_dim);
    if (ring) ring->append_rows(k_new, v_new, sq.n);
  };
  if (across_sequences(seqs, positions, ap.window)) {
    s.seq_spans.resize(seqs.size());
    s.seq_views.resize(seqs.size());
    default_pool().parallel_for(static_cast<int64_t>(seqs.size()), [&](int64_t si, int) {
      one(static_cast<size_t>(si), s.seq_spans[static_cast<size_t>(si)], s.seq_views[static_cast<size_t>(si)]);
    });
  } else {
    for (size_t si = 0; si < seqs.size(); ++si) one(si, s.spans, s.views);
  }
  if (spec.attn_gate) {
    float* a = s.att.data();
    const float* g = s.gate.data();
    for (int64_t i = 0; i < rows * q_dim; ++i) a[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }
  w.o.apply(s.att.data(), rows, out, call.adapters);
}

}  // namespace larder::models
