#include "larder/memory/sequence_state.h"

namespace larder::memory {

KvLayout StateSchema::plain_layout() const {
  KvLayout l;
  l.dtype = kv_dtype;
  for (const LayerStateSpec& s : layers) {
    if (s.kind != StateKind::kPlainKv) continue;
    if (l.n_layers == 0) {
      l.n_kv_heads = s.n_kv_heads;
      l.head_dim = s.head_dim;
    }
    ++l.n_layers;
  }
  return l;
}

Status StateSchema::validate() const {
  const KvLayout l = plain_layout();
  if (kv_dtype != DType::kF32 && kv_dtype != DType::kF16 && kv_dtype != DType::kQ8_0)
    return unsupported(strfmt("[state] KV dtype %s: KV rows are f32, f16 or q8_0", dtype_name(kv_dtype)));
  if (kv_dtype == DType::kQ8_0 && l.n_layers > 0 && l.head_dim % 32 != 0)
    return unsupported(strfmt("[state] q8_0 KV needs head_dim to be a multiple of 32 (this model's is %d): use f16",
                              l.head_dim));
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerStateSpec& s = layers[i];
    switch (s.kind) {
      case StateKind::kPlainKv:
        if (s.n_kv_heads != l.n_kv_heads || s.head_dim != l.head_dim)
          return unsupported(strfmt("[state] layer %zu: plain KV of %d heads x %d dims differs from the first plain "
                                    "layer's %d x %d (one KvCache row shape per model)",
                                    i, s.n_kv_heads, s.head_dim, l.n_kv_heads, l.head_dim));
        break;
      case StateKind::kRing:
        if (s.window <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0)
          return invalid_argument(strfmt("[state] layer %zu: ring needs a positive window, heads and head_dim", i));
        break;
      case StateKind::kRecurrent:
        if (s.conv_k <= 0 || s.conv_dim <= 0 || s.n_heads <= 0 || s.dk <= 0 || s.dv <= 0)
          return invalid_argument(strfmt("[state] layer %zu: recurrent state needs positive sizes", i));
        break;
    }
  }
  return Status::ok();
}

StateFootprint StateSchema::footprint() const {
  // Element sizes follow the states' storage: K/V rows in the schema's KV dtype (KvCache), f32
  // ring rows (RingState), f32 conv and recurrent matrices (RecurrentState).
  StateFootprint f;
  for (const LayerStateSpec& s : layers) {
    const uint64_t elems = static_cast<uint64_t>(s.n_kv_heads) * static_cast<uint64_t>(s.head_dim);
    const uint64_t kv_row = 2ull * elems * sizeof(float);
    switch (s.kind) {
      case StateKind::kPlainKv:
        f.per_token += 2ull * dtype_bytes(kv_dtype, elems);
        break;
      case StateKind::kRing:
        f.fixed += kv_row * static_cast<uint64_t>(s.window);
        break;
      case StateKind::kRecurrent:
        f.fixed += (static_cast<uint64_t>(s.conv_k - 1) * static_cast<uint64_t>(s.conv_dim) +
                    static_cast<uint64_t>(s.n_heads) * static_cast<uint64_t>(s.dk) * static_cast<uint64_t>(s.dv)) *
                   sizeof(float);
        break;
    }
  }
  return f;
}

StateSchema StateSchema::all_plain(const KvLayout& layout) {
  StateSchema s;
  s.layers.assign(static_cast<size_t>(layout.n_layers),
                  LayerStateSpec{StateKind::kPlainKv, layout.n_kv_heads, layout.head_dim});
  s.kv_dtype = layout.dtype;
  return s;
}

SequenceState::SequenceState(const KvLayout& layout, int64_t max_tokens) : kv(layout, max_tokens) {
  for (int l = 0; l < layout.n_layers; ++l) slots.push_back({StateKind::kPlainKv, l});
}

SequenceState::SequenceState(const StateSchema& schema, int64_t max_tokens) : kv(schema.plain_layout(), max_tokens) {
  LARDER_CHECK(schema.validate().is_ok(), "SequenceState from an invalid schema");
  int plain = 0;
  for (const LayerStateSpec& s : schema.layers) {
    switch (s.kind) {
      case StateKind::kPlainKv:
        slots.push_back({s.kind, plain++});
        break;
      case StateKind::kRing:
        slots.push_back({s.kind, static_cast<int>(layers.size())});
        layers.push_back(std::make_unique<RingState>(s.window, s.n_kv_heads, s.head_dim));
        break;
      case StateKind::kRecurrent:
        slots.push_back({s.kind, static_cast<int>(layers.size())});
        layers.push_back(std::make_unique<RecurrentState>(s.conv_k, s.conv_dim, s.n_heads, s.dk, s.dv));
        break;
    }
  }
}

Status SequenceState::consistent() const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i]->offset() != length())
      return invalid_argument(strfmt("[state] layer state %zu (%s) holds %lld tokens, the sequence %lld", i,
                                     state_kind_name(layers[i]->kind()), (long long)layers[i]->offset(),
                                     (long long)length()));
  }
  return Status::ok();
}

Status SequenceState::trim(int64_t n) {
  if (n < 0 || n > length())
    return invalid_argument(strfmt("[state] trim to %lld of %lld tokens", (long long)n, (long long)length()));
  if (n == length()) return Status::ok();
  if (n == 0) {  // forgetting everything is always possible: a fresh sequence in the same buffers
    for (const auto& l : layers) {
      if (l->kind() == StateKind::kRing) static_cast<RingState*>(l.get())->reset();
      if (l->kind() == StateKind::kRecurrent) static_cast<RecurrentState*>(l.get())->reset();
    }
    kv.trim(0);
    return Status::ok();
  }
  for (const auto& l : layers) {
    if (!l->trimmable())
      return unsupported(strfmt("[state] a %s layer state cannot forget tokens (%lld → %lld)",
                                state_kind_name(l->kind()), (long long)length(), (long long)n));
  }
  for (const auto& l : layers) LARDER_RETURN_IF_ERROR(l->trim(l->offset() - n));
  kv.trim(n);
  return Status::ok();
}

RingState* SequenceState::ring(int i) const {
  const LayerSlot& s = slots[static_cast<size_t>(i)];
  if (s.kind != StateKind::kRing) return nullptr;
  return static_cast<RingState*>(layers[static_cast<size_t>(s.index)].get());
}

RecurrentState* SequenceState::recurrent(int i) const {
  const LayerSlot& s = slots[static_cast<size_t>(i)];
  if (s.kind != StateKind::kRecurrent) return nullptr;
  return static_cast<RecurrentState*>(layers[static_cast<size_t>(s.index)].get());
}

size_t SequenceState::resident_bytes() const {
  size_t n = kv.owned_bytes();
  for (const auto& l : layers) n += l->resident_bytes();
  for (const Attachment& a : attachments) n += a.bytes();
  return n;
}

}  // namespace larder::memory
