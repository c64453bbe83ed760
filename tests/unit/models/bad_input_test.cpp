// Broken checkpoints (built here) must fail to load or run with a Status that names the file,
// the tensor and the expected/actual values — never crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "larder/formats/model_files.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"

namespace larder::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct T {
  std::string dtype;  // safetensors dtype string
  std::vector<int64_t> shape;
};

size_t elem_bytes(const std::string& dt) {
  return dt == "F32" || dt == "I32" || dt == "U32" ? 4 : dt == "F64" ? 8 : 2;
}

void write_safetensors(const std::string& path, const std::map<std::string, T>& tensors) {
  ordered_json h = ordered_json::object();
  std::vector<char> data;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (const auto& [name, t] : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    const size_t begin = data.size();
    for (size_t i = 0; i < n; ++i) {
      float f = nd(rng);
      if (t.dtype == "F32") {
        data.insert(data.end(), reinterpret_cast<char*>(&f), reinterpret_cast<char*>(&f) + 4);
      } else {  // 2-byte or other: bf16 bits of f / zero-filled
        uint32_t u;
        std::memcpy(&u, &f, 4);
        std::vector<char> b(elem_bytes(t.dtype), 0);
        if (t.dtype == "BF16") std::memcpy(b.data(), reinterpret_cast<char*>(&u) + 2, 2);
        data.insert(data.end(), b.begin(), b.end());
      }
    }
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = hs.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

ordered_json tiny_config() {
  return {{"model_type", "llama"},      {"hidden_size", 32},       {"num_hidden_layers", 2},
          {"intermediate_size", 64},    {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 40},           {"rms_norm_eps", 1e-5},     {"max_position_embeddings", 16},
          {"tie_word_embeddings", false}};
}

std::map<std::string, T> tiny_tensors() {
  std::map<std::string, T> t;
  t["model.embed_tokens.weight"] = {"F32", {40, 32}};
  t["lm_head.weight"] = {"F32", {40, 32}};
  t["model.norm.weight"] = {"F32", {32}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = {"F32", {32}};
    t[p + "post_attention_layernorm.weight"] = {"F32", {32}};
    t[p + "self_attn.q_proj.weight"] = {"F32", {32, 32}};
    t[p + "self_attn.k_proj.weight"] = {"F32", {16, 32}};
    t[p + "self_attn.v_proj.weight"] = {"F32", {16, 32}};
    t[p + "self_attn.o_proj.weight"] = {"F32", {32, 32}};
    t[p + "mlp.gate_proj.weight"] = {"F32", {64, 32}};
    t[p + "mlp.up_proj.weight"] = {"F32", {64, 32}};
    t[p + "mlp.down_proj.weight"] = {"F32", {32, 64}};
  }
  return t;
}

class BadInput : public ::testing::Test {
 protected:
  std::string make(const std::string& name, const ordered_json& cfg, const std::map<std::string, T>& tensors) {
    const std::string dir = std::string(LARDER_TEST_DATA_DIR) + "/bad_input/" + name;
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << cfg.dump(1);
    write_safetensors(dir + "/model.safetensors", tensors);
    return dir;
  }
  // Loads and returns the Status (ok if it loaded); keeps the loaded objects.
  Status load(const std::string& dir) {
    auto f = formats::open_model_files(dir);
    if (!f.is_ok()) return f.status();
    files_ = std::move(f.value());
    auto m = Model::load(files_);
    if (!m.is_ok()) return m.status();
    model_ = std::move(m.value());
    return Status::ok();
  }
  formats::ModelFiles files_;
  std::unique_ptr<Model> model_;
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(BadInput, GoodCheckpointLoads) {
  const std::string dir = make("good", tiny_config(), tiny_tensors());
  Status st = load(dir);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(model_->info().n_params, 2 * 40 * 32 + 32 + 2 * (2 * 32 + 32 * 32 * 2 + 16 * 32 * 2 + 3 * 64 * 32));
}

TEST_F(BadInput, TensorShapeDisagreesWithConfig) {
  auto t = tiny_tensors();
  t["model.layers.1.self_attn.k_proj.weight"] = {"F32", {24, 32}};
  const std::string dir = make("kshape", tiny_config(), t);
  Status st = load(dir);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(st.message(), "model.layers.1.self_attn.k_proj.weight");
  EXPECT_HAS(st.message(), "[24, 32]");
  EXPECT_HAS(st.message(), "expected [16, 32]");
  EXPECT_HAS(st.message(), dir + "/model.safetensors");
}

TEST_F(BadInput, ConfigDisagreesWithTensors) {
  auto cfg = tiny_config();
  cfg["intermediate_size"] = 48;
  Status st = load(make("ffn", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_HAS(st.message(), "has shape [64, 32], expected [48, 32]");
}

TEST_F(BadInput, MissingTensor) {
  auto t = tiny_tensors();
  t.erase("model.layers.1.post_attention_layernorm.weight");
  Status st = load(make("missing", tiny_config(), t));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_HAS(st.message(), "missing tensor 'model.layers.1.post_attention_layernorm.weight'");
}

TEST_F(BadInput, UntiedWithoutLmHead) {
  auto t = tiny_tensors();
  t.erase("lm_head.weight");
  Status st = load(make("nolmhead", tiny_config(), t));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "lm_head.weight");
}

TEST_F(BadInput, UnusedLayerTensorIsAnError) {
  auto t = tiny_tensors();
  t["model.layers.0.self_attn.q_proj.bias"] = {"F32", {32}};  // config has no attention_bias
  Status st = load(make("stray_bias", tiny_config(), t));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "'model.layers.0.self_attn.q_proj.bias' is not used");
  // Unrelated extra tensors outside the layers are tolerated (reported in the log).
  t = tiny_tensors();
  t["vision_tower.patch_embed.weight"] = {"F32", {4, 4}};
  t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {"F32", {4}};
  EXPECT_TRUE(load(make("extra", tiny_config(), t)).is_ok());
}

TEST_F(BadInput, UnknownArchitecture) {
  auto cfg = tiny_config();
  cfg["model_type"] = "gpt_frobnicator";
  Status st = load(make("arch", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_HAS(st.message(), "'gpt_frobnicator'");
  EXPECT_HAS(st.message(), "llama");
}

TEST_F(BadInput, MissingModelTypeAndBadHeads) {
  auto cfg = tiny_config();
  cfg.erase("model_type");
  Status st = load(make("notype", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "model_type");
  cfg = tiny_config();
  cfg["num_key_value_heads"] = 3;
  st = load(make("heads", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "not a multiple of num_key_value_heads 3");
  cfg = tiny_config();
  cfg.erase("hidden_size");
  st = load(make("nohidden", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "missing required key 'hidden_size'");
}

TEST_F(BadInput, UnsupportedDtype) {
  auto t = tiny_tensors();
  t["model.layers.0.self_attn.q_proj.weight"] = {"I32", {32, 32}};
  Status st = load(make("dtype", tiny_config(), t));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_HAS(st.message(), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_HAS(st.message(), "I32");
  t = tiny_tensors();
  t["model.norm.weight"] = {"I32", {32}};
  st = load(make("dtype1d", tiny_config(), t));
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "model.norm.weight");
}

// ---- MLX affine checkpoints: every matrix P of tiny_tensors() as P.weight U32 [rows,
// cols·bits/32] + P.scales / P.biases BF16 [rows, cols/g] (random bytes: only loading is tested;
// execution is tests/unit/models/arch_parity_test.cpp against mlx-lm).
std::map<std::string, T> affine_tensors(int bits, int g) {
  std::map<std::string, T> out;
  for (const auto& [name, t] : tiny_tensors()) {
    if (t.shape.size() != 2) {
      out[name] = t;
      continue;
    }
    const std::string mod = name.substr(0, name.size() - std::string(".weight").size());
    out[name] = {"U32", {t.shape[0], t.shape[1] * bits / 32}};
    out[mod + ".scales"] = {"BF16", {t.shape[0], t.shape[1] / g}};
    out[mod + ".biases"] = {"BF16", {t.shape[0], t.shape[1] / g}};
  }
  return out;
}

ordered_json affine_config(int bits, int g) {
  auto c = tiny_config();
  c["quantization"] = {{"group_size", g}, {"bits", bits}, {"mode", "affine"}};
  c["quantization_config"] = c["quantization"];
  return c;
}

TEST_F(BadInput, AffineCheckpointLoads) {
  auto cfg = affine_config(4, 32);
  auto t = affine_tensors(4, 32);
  // Per-module overrides: an 8-bit module and one left unquantized (`false`, plain F32 tensor).
  cfg["quantization"]["model.layers.1.mlp.down_proj"] = {{"bits", 8}, {"group_size", 32}};
  t["model.layers.1.mlp.down_proj.weight"] = {"U32", {32, 64 * 8 / 32}};
  cfg["quantization"]["model.layers.0.mlp.up_proj"] = false;
  t.erase("model.layers.0.mlp.up_proj.scales");
  t.erase("model.layers.0.mlp.up_proj.biases");
  t["model.layers.0.mlp.up_proj.weight"] = {"F32", {64, 32}};
  Status st = load(make("affine_good", cfg, t));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(model_->info().weight_dtypes, "F32+affine-q4-g32+affine-q8-g32");
  EXPECT_EQ(model_->info().n_params, 2 * 40 * 32 + 32 + 2 * (2 * 32 + 32 * 32 * 2 + 16 * 32 * 2 + 3 * 64 * 32));
  // A module without an entry packed differently from the top level: like mlx-lm's loader
  // (infer_quant_config), its parameters come from the tensor shapes.
  t["model.layers.1.self_attn.o_proj.weight"] = {"U32", {32, 32 * 8 / 32}};
  st = load(make("affine_inferred", cfg, t));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(model_->info().weight_dtypes, "F32+affine-q4-g32+affine-q8-g32");
  t["model.layers.1.self_attn.k_proj.weight"] = {"U32", {16, 32 * 2 / 32}};
  st = load(make("affine_inferred2", cfg, t));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(model_->info().weight_dtypes, "F32+affine-q2-g32+affine-q4-g32+affine-q8-g32");
  // quantization_config alone (the twin) is read too; every matrix then uses the top level.
  cfg = affine_config(4, 32);
  cfg.erase("quantization");
  st = load(make("affine_twin", cfg, affine_tensors(4, 32)));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(model_->info().weight_dtypes, "affine-q4-g32");
}

TEST_F(BadInput, AffineConfigErrors) {
  struct Bad {
    const char* name;
    ordered_json block;
    StatusCode code;
    const char* says;
  } bads[] = {
      {"mode", {{"group_size", 32}, {"bits", 4}, {"mode", "fp6"}}, StatusCode::kUnsupported, "mode 'fp6'"},
      // A microscaling mode has one layout; and its module must hold U8 scales (these are affine's).
      {"mode_layout", {{"group_size", 32}, {"bits", 8}, {"mode", "mxfp4"}}, StatusCode::kUnsupported,
       "mode 'mxfp4' with bits 8, group_size 32 is not supported"},
      {"mode_tensors", {{"group_size", 32}, {"bits", 4}, {"model.layers.0.mlp.up_proj", {{"mode", "mxfp4"}}}},
       StatusCode::kInvalidArgument, "model.layers.0.mlp.up_proj.scales' is BF16"},
      {"bits", {{"group_size", 32}, {"bits", 7}}, StatusCode::kUnsupported, "bits 7 is not supported"},
      {"group", {{"group_size", 16}, {"bits", 4}}, StatusCode::kUnsupported, "group_size 16 is not supported"},
      {"module_bits",
       {{"group_size", 32}, {"bits", 4}, {"model.layers.0.mlp.up_proj", {{"bits", 1}, {"group_size", 32}}}},
       StatusCode::kUnsupported, "'quantization.model.layers.0.mlp.up_proj' bits 1"},
      {"entry", {{"group_size", 32}, {"bits", 4}, {"model.layers.0.mlp.up_proj", 3}}, StatusCode::kInvalidArgument,
       "must be true, false or {bits, group_size, mode}"},
      {"gptq", {{"group_size", 32}, {"bits", 4}, {"quant_method", "gptq"}}, StatusCode::kUnsupported,
       "quant_method \"gptq\""},
  };
  for (const Bad& b : bads) {
    auto cfg = tiny_config();
    cfg["quantization"] = b.block;
    Status st = load(make(std::string("affine_cfg_") + b.name, cfg, affine_tensors(4, 32)));
    ASSERT_FALSE(st.is_ok()) << b.name;
    EXPECT_EQ(st.code(), b.code) << b.name << ": " << st.to_string();
    EXPECT_HAS(st.message(), b.says);
    EXPECT_HAS(st.message(), "config.json");
  }
}

TEST_F(BadInput, AffineTensorErrors) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  {  // packed width of no supported bit count (7)
    auto t = affine_tensors(4, 32);
    t[q + ".weight"] = {"U32", {32, 7}};
    Status st = load(make("affine_packed", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(st.message(), q + ".weight' has shape [32, 7], expected [32, 4]");
    EXPECT_HAS(st.message(), "bits 4, group_size 32");
  }
  {  // scales of another group size
    auto t = affine_tensors(4, 32);
    t[q + ".scales"] = {"BF16", {32, 2}};
    Status st = load(make("affine_scales", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), q + ".scales' has shape [32, 2], expected [32, 1]");
  }
  {  // biases missing
    auto t = affine_tensors(4, 32);
    t.erase("model.layers.1.mlp.up_proj.biases");
    Status st = load(make("affine_nobias", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kNotFound);
    EXPECT_HAS(st.message(), "missing tensor 'model.layers.1.mlp.up_proj.biases'");
  }
  {  // scales in an integer dtype; scales and biases in different dtypes
    auto t = affine_tensors(4, 32);
    t[q + ".scales"] = {"I32", {32, 1}};
    Status st = load(make("affine_sdtype", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    EXPECT_HAS(st.message(), q + ".scales' has dtype I32, expected BF16, F16 or F32");
    t = affine_tensors(4, 32);
    t[q + ".biases"] = {"F32", {32, 1}};
    st = load(make("affine_mixdtype", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "must have the same dtype");
  }
  {  // codes not U32
    auto t = affine_tensors(4, 32);
    t[q + ".weight"] = {"I32", {32, 4}};
    Status st = load(make("affine_codes_dtype", affine_config(4, 32), t));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), q + ".weight' has dtype I32, expected U32 packed codes");
  }
  {  // a module marked `false` whose weight is still packed
    auto cfg = affine_config(4, 32);
    cfg["quantization"][q] = false;
    Status st = load(make("affine_false_packed", cfg, affine_tensors(4, 32)));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "leaves module '" + q + "' unquantized");
  }
  {  // scales but no quantization block
    Status st = load(make("affine_noblock", tiny_config(), affine_tensors(4, 32)));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "no 'quantization' block");
  }
  {  // an override that disagrees with the stored packing
    auto cfg = affine_config(4, 32);
    cfg["quantization"][q] = {{"bits", 8}, {"group_size", 32}};
    Status st = load(make("affine_override", cfg, affine_tensors(4, 32)));
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "expected [32, 8]");
    EXPECT_HAS(st.message(), "bits 8, group_size 32");
  }
}

TEST_F(BadInput, UnsupportedRopeScaling) {
  auto cfg = tiny_config();
  cfg["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};  // NTK-dynamic: not implemented
  Status st = load(make("dynamic", cfg, tiny_tensors()));
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_HAS(st.message(), "dynamic");
}

TEST_F(BadInput, ForwardRejectsTooLongAndBadTokens) {
  ASSERT_TRUE(load(make("good2", tiny_config(), tiny_tensors())).is_ok());
  Model& m = *model_;
  std::vector<float> logits(40 * 17);
  std::vector<int32_t> toks(17, 3);
  {
    memory::SequenceState cache = m.new_state(64);  // cache larger than the model context (16)
    Status st = m.forward(toks.data(), 17, cache, logits.data(), true);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(st.message(), "exceeds the model context of 16 tokens");
    EXPECT_EQ(cache.length(), 0);
    ASSERT_TRUE(m.forward(toks.data(), 10, cache, logits.data(), false).is_ok());
    st = m.forward(toks.data(), 7, cache, logits.data(), false);  // 10 cached + 7 new > 16
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "10 cached + 7 new");
    EXPECT_EQ(cache.length(), 10);  // untouched by the failed call
    ASSERT_TRUE(m.forward(toks.data(), 6, cache, logits.data(), false).is_ok());
  }
  {
    memory::SequenceState small = m.new_state(8);  // the cache's own limit
    Status st = m.forward(toks.data(), 9, small, logits.data(), false);
    ASSERT_FALSE(st.is_ok());
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  }
  {
    memory::SequenceState cache = m.new_state(16);
    const int32_t bad[2] = {5, 40};
    Status st = m.forward(bad, 2, cache, logits.data(), false);
    ASSERT_FALSE(st.is_ok());
    EXPECT_HAS(st.message(), "token id 40 at index 1 is outside the vocabulary [0, 40)");
    const int32_t neg[1] = {-1};
    EXPECT_FALSE(m.forward(neg, 1, cache, logits.data(), false).is_ok());
    EXPECT_FALSE(m.forward(bad, 0, cache, logits.data(), false).is_ok());
  }
  {
    memory::SequenceState wrong(memory::KvLayout{3, 2, 8}, 16);
    EXPECT_FALSE(m.forward(toks.data(), 1, wrong, logits.data(), false).is_ok());
  }
}

// Broken GGUFs written by the model_ref fixture (tests/ref/model_reference.py).
Status load_gguf(const std::string& name, std::string* path_out) {
  *path_out = std::string(LARDER_TEST_DATA_DIR) + "/models/bad_gguf/" + name;
  auto f = formats::open_model_files(*path_out);
  if (!f.is_ok()) return f.status();
  auto m = Model::load(*f);
  return m.is_ok() ? Status::ok() : m.status();
}

TEST(BadGguf, UnsupportedBlockFormat) {
  std::string path;
  Status st = load_gguf("q8_1_tensor.gguf", &path);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_HAS(st.message(), "blk.1.ffn_up.weight");
  EXPECT_HAS(st.message(), "ggml type 9");
  EXPECT_HAS(st.message(), path);
}

TEST(BadGguf, MissingMetadata) {
  std::string path;
  Status st = load_gguf("no_block_count.gguf", &path);
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "missing GGUF metadata 'llama.block_count'");
}

TEST(BadGguf, MetadataDisagreesWithTensors) {
  std::string path;
  Status st = load_gguf("wrong_ffn.gguf", &path);
  ASSERT_FALSE(st.is_ok());
  EXPECT_HAS(st.message(), "blk.0.ffn_gate.weight");
  EXPECT_HAS(st.message(), "has shape [96, 64], expected [128, 64]");
}

TEST(BadGguf, UnknownArchitecture) {
  std::string path;
  Status st = load_gguf("unknown_arch.gguf", &path);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_HAS(st.message(), "'rwkv9'");
}

// The shared random-weight GGUF (real Llama 2 vocabulary, dim 8, one layer) loads and runs.
TEST(SharedGguf, TinyRandomLlama2Runs) {
  auto f = formats::open_model_files(std::string(LARDER_SHARED_DIR) + "/models/llama-2-tiny-random/llama-2-tiny-random.gguf");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto m = Model::load(*f);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ((*m)->info().vocab, 32000);
  memory::SequenceState cache = (*m)->new_state(32);
  std::vector<float> logits(32000);
  const int32_t toks[3] = {1, 15043, 3186};
  ASSERT_TRUE((*m)->forward(toks, 3, cache, logits.data(), false).is_ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace larder::models
