#include "larder/models/layer_spec.h"

namespace larder::models {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::kFull: return "full";
    case LayerKind::kSliding: return "sliding";
    case LayerKind::kRecurrent: return "recurrent";
  }
  return "unknown";
}

memory::StateSchema state_schema_of(std::span<const LayerSpec> layers) {
  memory::StateSchema s;
  for (const LayerSpec& l : layers) {
    memory::LayerStateSpec st;
    st.n_kv_heads = l.n_kv_heads;
    st.head_dim = l.head_dim;
    switch (l.kind) {
      case LayerKind::kFull: st.kind = memory::StateKind::kPlainKv; break;
      case LayerKind::kSliding:
        st.kind = memory::StateKind::kRing;
        st.window = l.window;
        break;
      case LayerKind::kRecurrent: st.kind = memory::StateKind::kRecurrent; break;
    }
    s.layers.push_back(st);
  }
  return s;
}

}  // namespace larder::models
