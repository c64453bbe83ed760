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
                      : strfmt("plain_kv:f32:L=%d:h=%d:d=%d", layout.n_layers, layout.n_kv_heads, layout.head_dim);
  for (const LayerState* l : layers) s += "|" + l->signature();
  for (const Attachment* a : attachments) s += "|att:" + a->schema;
  return s;
}

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kNone: return "none";
    case Tier::kRam: return "ram";
    case Tier::kSsd: return "ssd";
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

int64_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace larder::memory
