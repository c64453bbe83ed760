// Rotation fold (design/quantization.md §6, TV-12/TV-14): small random Llama-family checkpoints
// with non-unit norm gains are written here, rotated, and both the original and the rotated
// directory are run by larder's model code; teacher-forced logits must agree.
//
// Why larder's forward is a fair oracle here: the fold is checked by an *invariance* (the same
// function, computed from different weights), and the model code knows nothing about rotations —
// a wrong sign, index, transpose, head split or missed γ gives O(1) logit differences, which no
// tolerance below hides. The checks also assert that the weights really changed (a no-op fold
// would pass the invariance trivially).
//
// Bounds (f32 output): every folded weight is a sum of ±w·γ/√n terms rounded in f32 (relative
// error ~ log2(n)·2^-24), and the forward then runs on differently rounded inputs; through the two
// layers of these random models that is measured at <= 8e-7 of max|logit| (printed). The bound
// 1e-5·max|logit| (the fp32 level: ~100 ulps of the largest logit) leaves an order of magnitude
// of margin and is still ~10^4 times smaller than what a wrong fold produces (checked by breaking
// single folds — R2 on o_proj, the v bias, a writer bias: 0.7-1.5 of max|logit|). On the active
// (AVX2/AVX-512) table f32 weights run in f32 as well, only in another summation order: same bound.
// bf16 output: each weight gets one bf16 rounding (relative 2^-9) instead of none, so the logits
// move like those of the plain bf16 cast of the original model. The bound is relative to that
// baseline: max|diff| <= 3·(bf16-cast baseline error) + 1e-4·max|logit|, and <= 2e-2·max|logit|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "larder/formats/model_files.h"
#include "larder/formats/safetensors.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"
#include "larder/quant/checkpoint_io.h"
#include "larder/quant/hadamard.h"
#include "larder/quant/rotate.h"

namespace larder::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct Spec {
  std::string name, model_type;
  int64_t H, L, nh, nkv, hd, I, V;
  bool tied = false;
  bool attention_bias = false;  // llama: q/k/v/o biases
  bool mlp_bias = false;        // llama: gate/up/down biases
};

const Spec kSpecs[] = {
    {"llama_tied", "llama", 64, 2, 4, 2, 16, 128, 100, true},
    {"llama_untied_bias", "llama", 64, 2, 4, 2, 16, 128, 100, false, true, true},
    {"qwen2", "qwen2", 64, 2, 4, 2, 16, 96, 100, false},
    {"qwen3", "qwen3", 64, 2, 4, 2, 32, 128, 100, true},
    {"llama_h96", "llama", 96, 2, 4, 2, 24, 160, 100, false},
    {"mistral_h80", "mistral", 80, 2, 4, 4, 20, 144, 100, true},
    {"llama_h112", "llama", 112, 2, 4, 2, 28, 128, 100, false},
};

std::string test_root() { return std::string(LARDER_TEST_DATA_DIR) + "/rotate"; }

// Writes an HF checkpoint in `dtype` (values drawn in f32, then cast) with RMSNorm gains 1 + 0.3·N.
void make_checkpoint(const std::string& dir, const Spec& s, DType dtype, uint64_t seed, uint64_t max_shard = 1ull << 40,
                     const std::string& drop = "", ordered_json extra_cfg = ordered_json::object(),
                     const std::string& extra_tensor = "") {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct T { std::string name; std::vector<int64_t> shape; std::vector<float> v; };
  std::vector<T> ts;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float sd) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    T t{name, shape, std::vector<float>(static_cast<size_t>(n))};
    for (float& x : t.v) x = mean + sd * nd(rng);
    if (name != drop) ts.push_back(std::move(t));
  };
  const int64_t H = s.H, q = s.nh * s.hd, kv = s.nkv * s.hd;
  add("model.embed_tokens.weight", {s.V, H}, 0, 0.5f);
  add("model.norm.weight", {H}, 1, 0.3f);
  if (!s.tied) add("lm_head.weight", {s.V, H}, 0, 0.3f);
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 1, 0.3f);
    add(p + "post_attention_layernorm.weight", {H}, 1, 0.3f);
    add(p + "self_attn.q_proj.weight", {q, H}, 0, 1.0f / std::sqrt(static_cast<float>(H)));
    add(p + "self_attn.k_proj.weight", {kv, H}, 0, 1.0f / std::sqrt(static_cast<float>(H)));
    add(p + "self_attn.v_proj.weight", {kv, H}, 0, 1.0f / std::sqrt(static_cast<float>(H)));
    add(p + "self_attn.o_proj.weight", {H, q}, 0, 1.0f / std::sqrt(static_cast<float>(q)));
    add(p + "mlp.gate_proj.weight", {s.I, H}, 0, 1.0f / std::sqrt(static_cast<float>(H)));
    add(p + "mlp.up_proj.weight", {s.I, H}, 0, 1.0f / std::sqrt(static_cast<float>(H)));
    add(p + "mlp.down_proj.weight", {H, s.I}, 0, 1.0f / std::sqrt(static_cast<float>(s.I)));
    if (s.model_type == "qwen2" || s.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.2f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.2f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.2f);
    }
    if (s.attention_bias) add(p + "self_attn.o_proj.bias", {H}, 0, 0.2f);
    if (s.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {s.I}, 0, 0.2f);
      add(p + "mlp.up_proj.bias", {s.I}, 0, 0.2f);
      add(p + "mlp.down_proj.bias", {H}, 0, 0.2f);
    }
    if (s.model_type == "qwen3") {
      add(p + "self_attn.q_norm.weight", {s.hd}, 1, 0.3f);
      add(p + "self_attn.k_norm.weight", {s.hd}, 1, 0.3f);
    }
  }
  if (!extra_tensor.empty()) add(extra_tensor, {s.H}, 0, 1);
  std::sort(ts.begin(), ts.end(), [](const T& a, const T& b) { return a.name < b.name; });
  const size_t esz = dtype == DType::kF32 ? 4 : 2;
  std::vector<ShardEntry> entries;
  uint64_t params = 0;
  for (const T& t : ts) {
    entries.push_back({t.name, dtype, t.shape, t.v.size() * esz});
    params += t.v.size();
  }
  std::vector<uint8_t> buf;
  auto produce = [&](size_t i) -> Result<const void*> {
    const T& t = ts[i];
    buf.resize(t.v.size() * esz);
    if (dtype == DType::kF32) {
      std::memcpy(buf.data(), t.v.data(), buf.size());
    } else {
      for (size_t j = 0; j < t.v.size(); ++j) {
        const uint16_t b = f32_to_bf16(t.v[j]);
        std::memcpy(buf.data() + 2 * j, &b, 2);
      }
    }
    return static_cast<const void*>(buf.data());
  };
  fs::create_directories(dir);
  auto w = write_safetensors_shards(dir, entries, max_shard, ordered_json{{"format", "pt"}}, params, produce);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ordered_json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", s.model_type}, {"hidden_size", H},
                      {"intermediate_size", s.I}, {"num_hidden_layers", s.L}, {"num_attention_heads", s.nh},
                      {"num_key_value_heads", s.nkv}, {"head_dim", s.hd}, {"vocab_size", s.V},
                      {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"max_position_embeddings", 256},
                      {"tie_word_embeddings", s.tied}, {"hidden_act", "silu"},
                      {"attention_bias", s.attention_bias}, {"mlp_bias", s.mlp_bias},
                      {"torch_dtype", dtype == DType::kF32 ? "float32" : "bfloat16"}};
  for (auto it = extra_cfg.begin(); it != extra_cfg.end(); ++it) cfg[it.key()] = it.value();
  ASSERT_TRUE(write_config_json(dir + "/config.json", cfg).is_ok());
  std::ofstream(dir + "/generation_config.json") << "{\"bos_token_id\": 1, \"eos_token_id\": 2}\n";
}

std::vector<int32_t> tokens(int64_t V) {
  std::mt19937 rng(5);
  std::vector<int32_t> t(32);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  return t;
}

std::vector<float> run_logits(const std::string& dir, const kernels::KernelTable& table) {
  auto files = formats::open_model_files(dir);
  EXPECT_TRUE(files.is_ok()) << files.status().to_string();
  if (!files.is_ok()) return {};
  auto model = models::Model::load(files.value());
  EXPECT_TRUE(model.is_ok()) << dir << ": " << model.status().to_string();
  if (!model.is_ok()) return {};
  models::Model& m = *model.value();
  const std::vector<int32_t> toks = tokens(m.info().vocab);
  std::vector<float> out(toks.size() * static_cast<size_t>(m.info().vocab));
  const kernels::KernelTable active = kernels::active_table();
  kernels::set_active_table(table);
  memory::SequenceState cache = m.new_state(m.info().max_context);
  Status st = m.forward(toks.data(), static_cast<int64_t>(toks.size()), cache, out.data(), true);
  kernels::set_active_table(active);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

struct Diff {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : INFINITY; }
};

Diff diff(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  if (got.size() != want.size() || want.empty()) {
    d.max_abs = INFINITY;
    return d;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    d.max_abs = std::max(d.max_abs, static_cast<double>(std::abs(got[i] - want[i])));
    d.max_ref = std::max(d.max_ref, static_cast<double>(std::abs(want[i])));
  }
  return d;
}

std::vector<float> tensor_f32(const formats::TensorSet& ts, const std::string& name) {
  const formats::TensorInfo* t = ts.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> v(static_cast<size_t>(t->numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t->dtype == DType::kF32) {
      std::memcpy(&v[i], t->data + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, t->data + 2 * i, 2);
      v[i] = bf16_to_f32(b);
    }
  }
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// No `dst` and no `dst.partial-*` next to it.
void expect_nothing_left(const std::string& dst) {
  EXPECT_FALSE(fs::exists(dst)) << dst;
  const fs::path parent = fs::path(dst).parent_path();
  const std::string stem = fs::path(dst).filename().string() + ".partial";
  for (const auto& e : fs::directory_iterator(parent))
    EXPECT_NE(e.path().filename().string().rfind(stem, 0), 0u) << "left behind: " << e.path();
}

// Each test owns <testdata>/rotate/<test name>/, so CTest may run them in parallel processes.
class RotateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test_root() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::error_code ec;
    fs::remove_all(root_, ec);
    fs::create_directories(root_);
  }
  std::string dir(const std::string& name) { return root_ + "/" + name; }
  std::string root_;
};

struct Mode {
  const char* name;
  bool r1, r2;
};

TEST_F(RotateTest, LogitsInvariantF32) {
  const Mode modes[] = {{"r1r2", true, true}, {"r1", true, false}, {"gamma", false, false}};
  const kernels::KernelTable active = kernels::active_table();
  for (const Spec& s : kSpecs) {
    SCOPED_TRACE(s.name);
    const std::string src = dir(s.name + "_src");
    make_checkpoint(src, s, DType::kF32, 11, s.attention_bias ? 40000 : 1ull << 40);
    const std::vector<float> want_ref = run_logits(src, kernels::ref_table());
    const std::vector<float> want_act = run_logits(src, active);
    auto src_ts = formats::open_safetensors_dir(src);
    ASSERT_TRUE(src_ts.is_ok());
    for (const Mode& mode : modes) {
      SCOPED_TRACE(mode.name);
      const std::string dst = dir(s.name + "_" + mode.name);
      RotateOptions o;
      o.r1 = mode.r1;
      o.r2 = mode.r2;
      o.out_dtype = DType::kF32;
      size_t progress_calls = 0;
      o.progress = [&](size_t, size_t, const std::string&) { ++progress_calls; };
      auto rep = rotate_checkpoint(src, dst, o);
      ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
      EXPECT_GT(progress_calls, 0u);
      EXPECT_EQ(rep.value().hidden, s.H);
      EXPECT_EQ(rep.value().head_dim, s.hd);
      EXPECT_EQ(rep.value().untied, s.tied);
      EXPECT_EQ(rep.value().deviations.size(), 6u);
      EXPECT_EQ(rep.value().r1_construction == "none", !mode.r1);
      EXPECT_EQ(rep.value().r2_construction == "none", !(mode.r1 && mode.r2));
      for (const auto& [name, table, want] : {std::tuple{"ref", &kernels::ref_table(), &want_ref},
                                              std::tuple{active.name, &active, &want_act}}) {
        const Diff d = diff(run_logits(dst, *table), *want);
        std::printf("[rotate] %-18s %-6s %-8s max|diff| %.3g max|logit| %.3g rel %.3g\n", s.name.c_str(), mode.name,
                    name, d.max_abs, d.max_ref, d.rel());
        EXPECT_LE(d.rel(), 1e-5) << name;
      }
      // The fold really happened: gains are ones, the head is untied, and the rotated tensors differ.
      auto ts = formats::open_safetensors_dir(dst);
      ASSERT_TRUE(ts.is_ok()) << ts.status().to_string();
      for (const formats::TensorInfo& t : ts.value().tensors()) {
        EXPECT_EQ(t.dtype, DType::kF32) << t.name;
        if (t.name.find("layernorm") != std::string::npos || t.name == "model.norm.weight") {
          for (float v : tensor_f32(ts.value(), t.name)) ASSERT_EQ(v, 1.0f) << t.name;
        }
      }
      EXPECT_NE(ts.value().find("lm_head.weight"), nullptr);
      EXPECT_EQ(tensor_f32(ts.value(), "model.embed_tokens.weight") == tensor_f32(src_ts.value(), "model.embed_tokens.weight"),
                !mode.r1);
      EXPECT_NE(tensor_f32(ts.value(), "model.layers.1.self_attn.q_proj.weight"),
                tensor_f32(src_ts.value(), "model.layers.1.self_attn.q_proj.weight"));
      EXPECT_EQ(tensor_f32(ts.value(), "model.layers.1.self_attn.o_proj.weight") ==
                    tensor_f32(src_ts.value(), "model.layers.1.self_attn.o_proj.weight"),
                !mode.r1);
      if (s.model_type == "qwen3") {  // q/k outputs are never rotated
        EXPECT_EQ(tensor_f32(ts.value(), "model.layers.0.self_attn.q_norm.weight"),
                  tensor_f32(src_ts.value(), "model.layers.0.self_attn.q_norm.weight"));
      }
      const ordered_json cfg = formats::read_json_file(dst + "/config.json").value();
      EXPECT_EQ(cfg["tie_word_embeddings"], false);
      EXPECT_EQ(cfg["torch_dtype"], "float32");
      EXPECT_EQ(cfg["larder_rotation"]["seed"], 42);
      EXPECT_EQ(cfg["larder_rotation"]["r1"], rep.value().r1_construction);
      EXPECT_TRUE(fs::exists(dst + "/generation_config.json"));
    }
  }
}

// Qwen3.5 (the seed's planQwen35Fold: R1 + γ, no R2) on the random-weight fixtures of
// tests/ref/qwen3_5_reference.py and qwen3_moe_reference.py: hybrid layers (gated DeltaNet + gated
// attention), HF gains stored as γ − 1, text-only and multimodal layouts, and the MoE variant
// (router, shared expert and its gate, stacked experts). Bound 5e-5·max|logit|, five times the
// Llama one: the same f32 rounding of the folded weights, but the DeltaNet's decay and gates
// (exp, sigmoid, softplus of rotated-then-rounded projections) amplify it more than attention does
// — measured up to 1.2e-5 (MoE fixture, ref table), 2.2e-6 without experts (printed). A wrong fold
// is O(1): dropping the "1 +" of the post-attention gains gives 0.66-1.09, leaving
// linear_attn.out_proj unrotated 0.73-1.29 (checked by breaking them).
TEST_F(RotateTest, Qwen35LogitsInvariantF32) {
  const std::string fixtures = std::string(LARDER_TEST_DATA_DIR) + "/models/";
  const kernels::KernelTable active = kernels::active_table();
  for (const char* name : {"qwen3_5_text_f32", "qwen3_5_mm", "qwen3_5_moe_f32"}) {
    SCOPED_TRACE(name);
    const std::string src = fixtures + name;
    const std::string dst = dir(std::string(name) + "_rot");
    RotateOptions o;
    o.out_dtype = DType::kF32;
    auto rep = rotate_checkpoint(src, dst, o);
    ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
    EXPECT_NE(rep.value().r1_construction, "none");
    EXPECT_EQ(rep.value().r2_construction, "none");  // architecturally off (output gate)
    const std::vector<std::string>& dev = rep.value().deviations;
    EXPECT_NE(std::find(dev.begin(), dev.end(), "no-R2-output-gate"), dev.end());
    EXPECT_EQ(std::find(dev.begin(), dev.end(), "mtp-dropped") != dev.end(), std::string(name) == "qwen3_5_mm");
    for (const auto& [tname, table] : {std::pair{"ref", &kernels::ref_table()}, std::pair{active.name, &active}}) {
      const Diff d = diff(run_logits(dst, *table), run_logits(src, *table));
      std::printf("[rotate] %-18s r1     %-8s max|diff| %.3g max|logit| %.3g rel %.3g\n", name, tname, d.max_abs,
                  d.max_ref, d.rel());
      EXPECT_LE(d.rel(), 5e-5) << tname;
    }
    auto src_ts = formats::open_safetensors_dir(src);
    auto ts = formats::open_safetensors_dir(dst);
    ASSERT_TRUE(src_ts.is_ok() && ts.is_ok());
    const bool mm = std::string(name) == "qwen3_5_mm";
    const std::string P = mm ? "model.language_model." : "model.";
    // Folded gains are written as 0 (the norm computes 1 + w); head-space tensors are untouched;
    // the residual-stream matrices changed; the MTP head is gone, the vision tower kept.
    for (const char* g : {"norm.weight", "layers.0.input_layernorm.weight", "layers.1.post_attention_layernorm.weight"})
      for (float v : tensor_f32(ts.value(), P + g)) ASSERT_EQ(v, 0.0f) << g;
    for (const char* same : {"layers.0.linear_attn.conv1d.weight", "layers.0.linear_attn.A_log",
                             "layers.0.linear_attn.norm.weight", "layers.1.self_attn.q_norm.weight"})
      EXPECT_EQ(tensor_f32(ts.value(), P + same), tensor_f32(src_ts.value(), P + same)) << same;
    for (const char* changed : {"embed_tokens.weight", "layers.0.linear_attn.in_proj_qkv.weight",
                                "layers.0.linear_attn.out_proj.weight", "layers.1.self_attn.o_proj.weight"})
      EXPECT_NE(tensor_f32(ts.value(), P + changed), tensor_f32(src_ts.value(), P + changed)) << changed;
    EXPECT_NE(ts.value().find("lm_head.weight"), nullptr);
    const ordered_json cfg = formats::read_json_file(dst + "/config.json").value();
    EXPECT_EQ(cfg["tie_word_embeddings"], false);
    EXPECT_EQ(cfg["larder_rotation"]["order"], "untie, gamma-fold, R1");
    if (mm) {
      EXPECT_EQ(cfg["text_config"]["tie_word_embeddings"], false);
      EXPECT_EQ(ts.value().find("mtp.fc.weight"), nullptr);
      EXPECT_EQ(tensor_f32(ts.value(), "model.visual.blocks.0.attn.qkv.weight"),
                tensor_f32(src_ts.value(), "model.visual.blocks.0.attn.qkv.weight"));
    }
  }
}

// The vision merger's last projection writes image features into the token embeddings, so it is
// a writer of the residual stream: W' = R1ᵀ·W, b' = b·R1, i.e. (W'x + b') = (Wx + b)·R1 for any x.
// A merger tensor the plan does not know is refused.
TEST_F(RotateTest, Qwen35VisionMergerIsAWriter) {
  const std::string src0 = std::string(LARDER_TEST_DATA_DIR) + "/models/qwen3_5_mm";
  auto ts0 = formats::open_safetensors_dir(src0);
  ASSERT_TRUE(ts0.is_ok());
  const int64_t H = ts0.value().find("model.language_model.embed_tokens.weight")->dim(1), C = 8;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> W(static_cast<size_t>(H * C)), b(static_cast<size_t>(H));
  for (float& v : W) v = nd(rng);
  for (float& v : b) v = nd(rng);
  auto write = [&](const std::string& dir, const std::string& extra) {
    std::vector<ShardEntry> entries;
    std::vector<std::vector<float>> vals;
    uint64_t params = 0;
    for (const formats::TensorInfo& t : ts0.value().tensors()) {
      entries.push_back({t.name, DType::kF32, t.shape, static_cast<uint64_t>(t.numel()) * 4});
      vals.push_back(tensor_f32(ts0.value(), t.name));
    }
    entries.push_back({"model.visual.merger.linear_fc2.bias", DType::kF32, {H}, static_cast<uint64_t>(H) * 4});
    vals.push_back(b);
    entries.push_back({"model.visual.merger.linear_fc2.weight", DType::kF32, {H, C}, static_cast<uint64_t>(H * C) * 4});
    vals.push_back(W);
    if (!extra.empty()) {
      entries.push_back({extra, DType::kF32, {H, C}, static_cast<uint64_t>(H * C) * 4});
      vals.push_back(W);
    }
    std::vector<size_t> order(entries.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return entries[x].name < entries[y].name; });
    std::vector<ShardEntry> sorted;
    for (size_t i : order) {
      sorted.push_back(entries[i]);
      params += vals[i].size();
    }
    fs::create_directories(dir);
    auto w = write_safetensors_shards(dir, sorted, 1ull << 40, ordered_json{{"format", "pt"}}, params,
                                      [&](size_t i) -> Result<const void*> { return static_cast<const void*>(vals[order[i]].data()); });
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    fs::copy_file(src0 + "/config.json", dir + "/config.json");
  };
  const std::string src = dir("mm_merger");
  write(src, "");
  RotateOptions o;
  o.out_dtype = DType::kF32;
  ASSERT_TRUE(rotate_checkpoint(src, dir("mm_merger_rot"), o).is_ok());
  auto ts = formats::open_safetensors_dir(dir("mm_merger_rot"));
  ASSERT_TRUE(ts.is_ok());
  const std::vector<float> W2 = tensor_f32(ts.value(), "model.visual.merger.linear_fc2.weight");
  const std::vector<float> b2 = tensor_f32(ts.value(), "model.visual.merger.linear_fc2.bias");
  const Rotation R = Rotation::make(H, 42, 0).value();
  std::vector<float> x(static_cast<size_t>(C)), y(static_cast<size_t>(H)), y2(static_cast<size_t>(H)), scratch(static_cast<size_t>(H));
  for (float& v : x) v = nd(rng);
  for (int64_t i = 0; i < H; ++i) {
    double a = b[static_cast<size_t>(i)], a2 = b2[static_cast<size_t>(i)];
    for (int64_t j = 0; j < C; ++j) {
      a += static_cast<double>(W[static_cast<size_t>(i * C + j)]) * x[static_cast<size_t>(j)];
      a2 += static_cast<double>(W2[static_cast<size_t>(i * C + j)]) * x[static_cast<size_t>(j)];
    }
    y[static_cast<size_t>(i)] = static_cast<float>(a);
    y2[static_cast<size_t>(i)] = static_cast<float>(a2);
  }
  R.rowT(y.data(), scratch.data());
  for (int64_t i = 0; i < H; ++i) EXPECT_NEAR(y2[static_cast<size_t>(i)], y[static_cast<size_t>(i)], 1e-4) << i;

  const std::string bad = dir("mm_deepstack");
  write(bad, "model.visual.deepstack_merger_list.0.linear_fc2.weight");
  auto r = rotate_checkpoint(bad, bad + "_rot", o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("deepstack_merger_list.0.linear_fc2.weight"), std::string::npos) << r.status().message();
  expect_nothing_left(bad + "_rot");
}

TEST_F(RotateTest, ConstructionsNamed) {
  const Spec& s = kSpecs[4];  // hidden 96, head_dim 24
  const std::string src = dir("names_src");
  make_checkpoint(src, s, DType::kF32, 3);
  auto rep = rotate_checkpoint(src, dir("names_dst"), RotateOptions{});
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_EQ(rep.value().r1_construction, "H_12 (x) H_8");
  EXPECT_EQ(rep.value().r2_construction, "H_12 (x) H_2");
  EXPECT_FALSE(rep.value().untied);
}

TEST_F(RotateTest, DeterministicAndSeeded) {
  const Spec& s = kSpecs[1];
  const std::string src = dir("det_src");
  make_checkpoint(src, s, DType::kF32, 21);
  RotateOptions a;
  a.out_dtype = DType::kF32;
  a.threads = 1;
  a.max_shard_bytes = 60000;  // several shards + index, which must be deterministic too
  RotateOptions b = a;
  b.threads = 3;
  RotateOptions c = a;
  c.seed = 7;
  ASSERT_TRUE(rotate_checkpoint(src, dir("det_a"), a).is_ok());
  ASSERT_TRUE(rotate_checkpoint(src, dir("det_b"), b).is_ok());
  ASSERT_TRUE(rotate_checkpoint(src, dir("det_c"), c).is_ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir("det_a"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::string> names_b;
  for (const auto& e : fs::directory_iterator(dir("det_b"))) names_b.push_back(e.path().filename().string());
  std::sort(names_b.begin(), names_b.end());
  EXPECT_EQ(names, names_b);
  EXPECT_TRUE(fs::exists(dir("det_a") + "/model.safetensors.index.json"));
  for (const std::string& n : names)
    EXPECT_TRUE(read_file(dir("det_a") + "/" + n) == read_file(dir("det_b") + "/" + n)) << n << " differs";
  auto ta = formats::open_safetensors_dir(dir("det_a"));
  auto tc = formats::open_safetensors_dir(dir("det_c"));
  ASSERT_TRUE(ta.is_ok() && tc.is_ok());
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.self_attn.v_proj.weight",
                        "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"})
    EXPECT_NE(tensor_f32(ta.value(), n), tensor_f32(tc.value(), n)) << n;
  EXPECT_EQ(formats::read_json_file(dir("det_c") + "/config.json").value()["larder_rotation"]["seed"], 7);
  const std::vector<float> la = run_logits(dir("det_a"), kernels::ref_table());
  const std::vector<float> lc = run_logits(dir("det_c"), kernels::ref_table());
  const std::vector<float> l0 = run_logits(src, kernels::ref_table());
  EXPECT_LE(diff(lc, l0).rel(), 1e-5);
  EXPECT_LE(diff(la, l0).rel(), 1e-5);
}

TEST_F(RotateTest, Bf16Output) {
  for (const Spec& s : {kSpecs[0], kSpecs[2], kSpecs[4]}) {
    SCOPED_TRACE(s.name);
    const std::string src = dir(s.name + "_bsrc"), src16 = dir(s.name + "_bsrc16");
    make_checkpoint(src, s, DType::kF32, 31);
    make_checkpoint(src16, s, DType::kBF16, 31);  // the same values, cast once
    RotateOptions o;
    o.out_dtype = DType::kBF16;
    ASSERT_TRUE(rotate_checkpoint(src, dir(s.name + "_b16"), o).is_ok());
    // A bf16 source keeps bf16 with the default out_dtype.
    ASSERT_TRUE(rotate_checkpoint(src16, dir(s.name + "_b16b"), RotateOptions{}).is_ok());
    auto ts = formats::open_safetensors_dir(dir(s.name + "_b16b"));
    ASSERT_TRUE(ts.is_ok());
    for (const formats::TensorInfo& t : ts.value().tensors()) EXPECT_EQ(t.dtype, DType::kBF16) << t.name;
    EXPECT_EQ(formats::read_json_file(dir(s.name + "_b16b") + "/config.json").value()["torch_dtype"], "bfloat16");
    const std::vector<float> ref = run_logits(src, kernels::ref_table());
    const Diff base = diff(run_logits(src16, kernels::ref_table()), ref);
    const Diff rot = diff(run_logits(dir(s.name + "_b16"), kernels::ref_table()), ref);
    const Diff rot16 = diff(run_logits(dir(s.name + "_b16b"), kernels::ref_table()), ref);
    std::printf("[rotate] %-18s bf16: cast-only rel %.3g, rotated rel %.3g, rotated-from-bf16 rel %.3g\n",
                s.name.c_str(), base.rel(), rot.rel(), rot16.rel());
    EXPECT_LE(rot.max_abs, 3 * base.max_abs + 1e-4 * base.max_ref);
    EXPECT_LE(rot.rel(), 2e-2);
    EXPECT_LE(rot16.max_abs, 4 * base.max_abs + 1e-4 * base.max_ref);
    EXPECT_LE(rot16.rel(), 3e-2);
  }
}

TEST_F(RotateTest, Refusals) {
  const Spec base = kSpecs[0];
  auto refuse = [&](const std::string& src, const RotateOptions& o, const std::string& needle) {
    const std::string dst = src + "_out";
    auto r = rotate_checkpoint(src, dst, o);
    ASSERT_FALSE(r.is_ok()) << src;
    EXPECT_EQ(r.status().message().rfind("[rotate]", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    expect_nothing_left(dst);
  };
  {  // existing destination: untouched, no partial
    const std::string src = dir("ref_exist");
    make_checkpoint(src, base, DType::kF32, 1);
    fs::create_directories(src + "_out");
    std::ofstream(src + "_out/keep.txt") << "mine";
    auto r = rotate_checkpoint(src, src + "_out", RotateOptions{});
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("already exists"), std::string::npos) << r.status().message();
    EXPECT_EQ(read_file(src + "_out/keep.txt"), "mine");
    fs::remove_all(src + "_out");
    expect_nothing_left(src + "_out");
  }
  {
    const std::string src = dir("ref_quant");
    make_checkpoint(src, base, DType::kF32, 1, 1ull << 40, "",
                    ordered_json{{"quantization", {{"group_size", 64}, {"bits", 4}}}});
    refuse(src, RotateOptions{}, "quantization block");
  }
  {
    Spec s = base;
    s.model_type = "gemma";
    const std::string src = dir("ref_type");
    make_checkpoint(src, s, DType::kF32, 1);
    refuse(src, RotateOptions{}, "model_type 'gemma' has no fold plan (supported: llama, mistral, qwen2, qwen3, qwen3_5, qwen3_5_moe)");
  }
  {
    Spec s = base;
    s.H = 92;  // 23·4: no Paley base (91 and 45 are not prime powers)
    s.hd = 23;
    const std::string src = dir("ref_hidden");
    make_checkpoint(src, s, DType::kF32, 1);
    refuse(src, RotateOptions{}, "hidden_size 92 cannot be rotated: size 92 is not supported: a rotation size must be m*2^k");
  }
  {
    Spec s = base;
    s.H = 48;
    s.nh = 8;
    s.nkv = 4;
    s.hd = 6;
    const std::string src = dir("ref_headdim");
    make_checkpoint(src, s, DType::kF32, 1);
    refuse(src, RotateOptions{}, "head_dim 6");
    RotateOptions no_r2;
    no_r2.r2 = false;
    EXPECT_TRUE(rotate_checkpoint(src, src + "_r1only", no_r2).is_ok());  // R1 alone needs only hidden
  }
  {
    const std::string src = dir("ref_missing");
    make_checkpoint(src, base, DType::kF32, 1, 1ull << 40, "model.layers.1.post_attention_layernorm.weight");
    refuse(src, RotateOptions{}, "missing tensor 'model.layers.1.post_attention_layernorm.weight'");
  }
  {  // a layer beyond num_hidden_layers
    const std::string src = dir("ref_unknown");
    make_checkpoint(src, base, DType::kF32, 1);
    ordered_json cfg = formats::read_json_file(src + "/config.json").value();
    cfg["num_hidden_layers"] = 1;
    ASSERT_TRUE(write_config_json(src + "/config.json", cfg).is_ok());
    refuse(src, RotateOptions{}, "layer 1");
  }
  {  // a tensor outside the fold table (TV-14): refused, never passed through unrotated
    const std::string src = dir("ref_extra");
    make_checkpoint(src, base, DType::kF32, 1, 1ull << 40, "", ordered_json::object(), "model.layers.0.mlp.shift.weight");
    refuse(src, RotateOptions{}, "tensor 'model.layers.0.mlp.shift.weight' has no fold rule");
  }
  refuse(dir("does_not_exist"), RotateOptions{}, "not a directory");
}

}  // namespace
}  // namespace larder::quant
