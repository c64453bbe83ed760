#include "larder/models/layer_spec.h"

#include "larder/core/status.h"

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
    if (l.kv_source >= 0) {
      LARDER_CHECK(l.kv_source < static_cast<int>(s.layers.size()), "a KV-sharing layer reads an earlier state layer");
      continue;
    }
    LARDER_CHECK(s.layers.size() == static_cast<size_t>(&l - layers.data()), "KV-sharing layers come last");
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
