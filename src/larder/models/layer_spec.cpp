#include "larder/models/layer_spec.h"

#include "larder/core/status.h"

namespace larder::models {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::kFull: return "full";
    case LayerKind::kSliding: return "sliding";
    case LayerKind::kGatedDelta: return "gated_delta";
  }
  return "unknown";
}

const char* ffn_kind_name(FfnKind k) {
  switch (k) {
    case FfnKind::kDense: return "dense";
    case FfnKind::kRoutedExperts: return "routed_experts";
  }
  return "unknown";
}

void declare_state(LayerSpec& l) {
  memory::LayerStateSpec st;
  switch (l.kind) {
    case LayerKind::kFull:
      st.kind = memory::StateKind::kPlainKv;
      st.n_kv_heads = l.n_kv_heads;
      st.head_dim = l.head_dim;
      break;
    case LayerKind::kSliding:
      st.kind = memory::StateKind::kRing;
      st.n_kv_heads = l.n_kv_heads;
      st.head_dim = l.head_dim;
      st.window = l.window;
      break;
    case LayerKind::kGatedDelta:
      st.kind = memory::StateKind::kRecurrent;
      st.conv_k = l.delta.conv_kernel;
      st.conv_dim = static_cast<int>(l.delta.conv_dim());
      st.n_heads = l.delta.n_v_heads;
      st.dk = l.delta.d_k;
      st.dv = l.delta.d_v;
      break;
  }
  l.state = st;
}

namespace {
memory::StateKind state_kind_of(LayerKind k) {
  switch (k) {
    case LayerKind::kFull: return memory::StateKind::kPlainKv;
    case LayerKind::kSliding: return memory::StateKind::kRing;
    case LayerKind::kGatedDelta: return memory::StateKind::kRecurrent;
  }
  return memory::StateKind::kPlainKv;
}
}  // namespace

memory::StateSchema state_schema_of(std::span<const LayerSpec> layers) {
  memory::StateSchema s;
  for (const LayerSpec& l : layers) {
    if (l.kv_source >= 0) {
      LARDER_CHECK(l.kv_source < static_cast<int>(s.layers.size()), "a KV-sharing layer reads an earlier state layer");
      continue;
    }
    LARDER_CHECK(s.layers.size() == static_cast<size_t>(&l - layers.data()), "KV-sharing layers come last");
    LARDER_CHECK(l.state.kind == state_kind_of(l.kind) &&
                     (l.kind == LayerKind::kGatedDelta ||
                      (l.state.n_kv_heads == l.n_kv_heads && l.state.head_dim == l.head_dim)),
                 "a layer declares the state its mixer keeps (declare_state)");
    s.layers.push_back(l.state);
  }
  return s;
}

}  // namespace larder::models
