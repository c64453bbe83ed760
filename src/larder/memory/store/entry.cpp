#include "larder/memory/store/entry.h"

namespace larder::memory {

void Entry::storage(std::vector<StorageRef>* out) const {
  if (kv) kv->storage(out);
  for (const auto& l : layers) l->storage(out);
  for (const Attachment& a : attachments) a.storage(out);
}

size_t Entry::bytes(Backing backing) const {
  std::vector<StorageRef> refs;
  storage(&refs);
  return distinct_bytes(refs, backing);
}

std::string state_signature(const KvLayout& layout, const std::vector<const LayerState*>& layers,
                            const std::vector<const Attachment*>& attachments) {
  std::string s = layout.n_layers == 0
                      ? std::string("plain_kv:none")
                      : strfmt("plain_kv:%s:L=%d:h=%d:d=%d", kv_dtype_tag(layout.dtype), layout.n_layers,
                               layout.n_kv_heads, layout.head_dim);
  for (const LayerState* l : layers) s += "|" + l->signature();
  for (const Attachment* a : attachments) s += "|att:" + a->schema;
  return s;
}

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kNone: return "none";
    case Tier::kRam: return "ram";
    case Tier::kSsd: return "ssd";
    case Tier::kRemote: return "remote";
  }
  return "none";
}

SequenceState Hit::into_state(const KvLayout& layout, int64_t max_tokens) && {
  SequenceState s(layout, max_tokens);
  if (kv && layout.n_layers > 0) s.kv.attach_prefix(std::move(kv), tokens);
  s.layers = std::move(layers);
  s.attachments = std::move(attachments);
  return s;
}

Result<SequenceState> Hit::into_state(const StateSchema& schema, int64_t max_tokens) && {
  SequenceState s(schema, max_tokens);
  const KvLayout layout = s.kv.layout();
  if (layout.n_layers > 0 && !(kv && kv->layout() == layout))
    return incompatible("[kv] the stored entry's plain KV does not match the model's state schema");
  if (layers.size() != s.layers.size())
    return incompatible(strfmt("[kv] the stored entry has %zu layer states, the model's schema %zu",
                                      layers.size(), s.layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i]->kind() != s.layers[i]->kind() || layers[i]->signature() != s.layers[i]->signature())
      return incompatible(strfmt("[kv] stored layer state %zu is %s, the model declares %s", i,
                                        layers[i]->signature().c_str(), s.layers[i]->signature().c_str()));
  }
  if (kv && layout.n_layers > 0) s.kv.attach_prefix(std::move(kv), tokens);
  if (layout.n_layers == 0) {
    // No plain layer: the KvCache still carries the sequence length.
    LARDER_RETURN_IF_ERROR(s.kv.reserve(tokens));
    s.kv.advance(tokens);
  }
  s.layers = std::move(layers);
  s.attachments = std::move(attachments);
  return s;
}

int64_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace larder::memory
