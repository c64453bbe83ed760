// LoRA adapters (issue 45 items 1 and 3): the three file formats load to the same matrices and
// scales, which equal what the fixture (tests/ref/lora_reference.py, mlx-lm's own tuner classes)
// wrote; validation against the base names the projection; KV namespaces follow content, not
// names. The logits with an adapter (the fixture's <adapter>/logits.f32) are checked through the
// forward in lora_forward_test.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/models/lora.h"
#include "larder/runtime/kv_identity.h"

namespace larder {
namespace {

namespace fs = std::filesystem;
using models::BaseProjections;
using models::LoraAdapter;
using models::LoraModule;
using models::LoraUse;

const std::string kRoot = std::string(LARDER_TEST_DATA_DIR) + "/lora/";

std::shared_ptr<const LoraAdapter> load_ok(const std::string& path) {
  auto a = LoraAdapter::load(path);
  EXPECT_TRUE(a.is_ok()) << path << ": " << a.status().to_string();
  return a.is_ok() ? a.value() : nullptr;
}

std::string load_error(const std::string& path) {
  auto a = LoraAdapter::load(path);
  EXPECT_FALSE(a.is_ok()) << path << " loaded but must be refused";
  return a.is_ok() ? "" : a.status().to_string();
}

const BaseProjections& base() {
  static formats::ModelFiles files = [] {
    auto f = formats::open_model_files(kRoot + "base");
    EXPECT_TRUE(f.is_ok()) << f.status().to_string() << " (fixture lora_ref did not run?)";
    return f.is_ok() ? std::move(f.value()) : formats::ModelFiles{};
  }();
  static BaseProjections b = [] {
    auto r = BaseProjections::from_files(files);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r.value()) : BaseProjections{};
  }();
  return b;
}

std::string validate_error(const std::string& path) {
  auto a = load_ok(path);
  if (!a) return "";
  std::vector<std::string> warnings;
  Status st = a->validate(base(), &warnings);
  EXPECT_FALSE(st.is_ok()) << path << " validated but must be refused";
  return st.to_string();
}

LoraModule module_of(const std::string& hf) {
  for (int i = 0; i < models::kLoraModuleCount; ++i)
    if (models::lora_module_hf(static_cast<LoraModule>(i)) == hf) return static_cast<LoraModule>(i);
  ADD_FAILURE() << "unknown module " << hf;
  return LoraModule::kQ;
}

// The adapter holds exactly the fixture's projections, matrices bit for bit (after the one
// conversion to f32: f16/bf16 widen exactly) and scales as f32.
void expect_matches_fixture(const LoraAdapter& a, const std::string& dir) {
  std::ifstream jf(dir + "/expect.json");
  ASSERT_TRUE(jf.good()) << dir;
  const nlohmann::json ex = nlohmann::json::parse(jf)["projections"];
  std::ifstream bf(dir + "/expect_ab.f32", std::ios::binary);
  std::vector<char> ab((std::istreambuf_iterator<char>(bf)), std::istreambuf_iterator<char>());
  ASSERT_EQ(a.projections().size(), ex.size()) << a.path();
  size_t off = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    const models::LoraProjection& p = a.projections()[i];
    const std::string what = a.path() + " " + models::lora_projection_name(p.layer, p.module);
    EXPECT_EQ(p.layer, ex[i][0].get<int>()) << what;
    EXPECT_EQ(p.module, module_of(ex[i][1].get<std::string>())) << what;
    EXPECT_EQ(p.rank, ex[i][2].get<int64_t>()) << what;
    EXPECT_EQ(p.in, ex[i][3].get<int64_t>()) << what;
    EXPECT_EQ(p.out, ex[i][4].get<int64_t>()) << what;
    EXPECT_EQ(p.scale, static_cast<float>(ex[i][5].get<double>())) << what;
    const size_t na = static_cast<size_t>(p.rank * p.in) * 4, nb = static_cast<size_t>(p.out * p.rank) * 4;
    ASSERT_LE(off + na + nb, ab.size()) << what;
    // The factors' values as f32 against the fixture's f32 bytes ([r, in] then [out, r]).
    std::vector<float> fa(static_cast<size_t>(p.rank * p.in)), fb(static_cast<size_t>(p.out * p.rank));
    for (int64_t k = 0; k < p.rank; ++k)
      for (int64_t j = 0; j < p.in; ++j) fa[static_cast<size_t>(k * p.in + j)] = p.f.a_at(k, j);
    for (int64_t o = 0; o < p.out; ++o)
      for (int64_t k = 0; k < p.rank; ++k) fb[static_cast<size_t>(o * p.rank + k)] = p.f.b_at(o, k);
    EXPECT_EQ(std::memcmp(fa.data(), ab.data() + off, na), 0) << what << ": A differs";
    EXPECT_EQ(std::memcmp(fb.data(), ab.data() + off + na, nb), 0) << what << ": B differs";
    EXPECT_EQ(a.find(p.layer, p.module), &p) << what;
    off += na + nb;
  }
  EXPECT_EQ(off, ab.size());
}

TEST(LoraFormats, MlxPeftAndGgufLoadTheFixturesMatrices) {
  for (const char* name : {"attn_r8", "mlp_r4", "mixed_r16"}) {
    SCOPED_TRACE(name);
    const std::string dir = kRoot + name;
    auto mlx = load_ok(dir + "/mlx");
    auto peft = load_ok(dir + "/peft");
    auto gguf = load_ok(dir + "/lora.gguf");
    ASSERT_TRUE(mlx && peft && gguf);
    EXPECT_EQ(mlx->format(), models::LoraFormat::kMlx);
    EXPECT_EQ(peft->format(), models::LoraFormat::kPeft);
    EXPECT_EQ(gguf->format(), models::LoraFormat::kGguf);
    expect_matches_fixture(*mlx, dir);
    expect_matches_fixture(*peft, dir);
    expect_matches_fixture(*gguf, dir);
    // Same values → same content hash, whatever the format.
    EXPECT_EQ(mlx->content_hash(), peft->content_hash());
    EXPECT_EQ(mlx->content_hash(), gguf->content_hash());
    EXPECT_EQ(peft->base_model(), "larder-tests/lora-base");
    EXPECT_EQ(gguf->architecture(), "qwen3");
    EXPECT_EQ(mlx->find(0, LoraModule::kDeltaQkv), nullptr);
  }
}

// A pair stored F16/BF16 is kept in that dtype, never widened in RAM (what the forward reads: half
// the bytes); its values — the fixture's, bit for bit — are checked by expect_matches_fixture
// above. The fixtures: attn_r8 f32, mlp_r4 f16, mixed_r16 bf16.
TEST(LoraFormats, SixteenBitAdaptersKeepTheirDtype) {
  for (auto [name, dtype] : {std::pair{"attn_r8", DType::kF32}, std::pair{"mlp_r4", DType::kF16},
                             std::pair{"mixed_r16", DType::kBF16}}) {
    for (const char* form : {"/mlx", "/peft", "/lora.gguf"}) {
      const std::string path = kRoot + name + form;
      auto a = load_ok(path);
      ASSERT_TRUE(a);
      for (const models::LoraProjection& p : a->projections()) {
        const std::string what = path + " " + models::lora_projection_name(p.layer, p.module);
        EXPECT_EQ(p.f.dtype, dtype) << what;
        EXPECT_TRUE(p.f.a && p.f.bp) << what;
        EXPECT_EQ(p.f.rank, p.rank) << what;
        EXPECT_EQ(p.f.in, p.in) << what;
        EXPECT_EQ(p.f.out, p.out) << what;
      }
    }
  }
}

TEST(LoraFormats, PeftRankAndAlphaPatternsAndRsLora) {
  // rank_pattern {"self_attn.v_proj": 4, "model.layers.2.mlp.down_proj": 2}, alpha_pattern
  // {"o_proj": 4}, r 8, alpha 16: the fixture's expect.json holds PEFT's resolution.
  auto a = load_ok(kRoot + "pattern/peft");
  ASSERT_TRUE(a);
  expect_matches_fixture(*a, kRoot + "pattern");
  EXPECT_EQ(a->find(2, LoraModule::kDown)->rank, 2);
  EXPECT_EQ(a->find(1, LoraModule::kDown)->rank, 8);
  EXPECT_EQ(a->find(0, LoraModule::kO)->scale, 0.5f);
  // rsLoRA: alpha 5 / sqrt(16) = 1.25.
  auto rs = load_ok(kRoot + "mixed_r16/peft");
  ASSERT_TRUE(rs);
  EXPECT_EQ(rs->projections()[0].scale, 1.25f);
}

TEST(LoraValidate, FixtureAdaptersFitTheirBase) {
  const BaseProjections& b = base();
  EXPECT_EQ(b.architecture, "qwen3");
  EXPECT_EQ(b.n_layers, 3);
  ASSERT_NE(b.find(0, LoraModule::kQ), nullptr);
  EXPECT_EQ(b.find(0, LoraModule::kQ)->out, 128);  // 4 heads × head_dim 32, not hidden 64
  EXPECT_EQ(b.find(0, LoraModule::kQ)->in, 64);
  EXPECT_EQ(b.find(0, LoraModule::kDeltaQkv), nullptr);
  for (const char* p : {"attn_r8/mlx", "attn_r8/peft", "attn_r8/lora.gguf", "mlp_r4/mlx", "mlp_r4/peft",
                        "mlp_r4/lora.gguf", "mixed_r16/mlx", "mixed_r16/peft", "mixed_r16/lora.gguf", "pattern/peft"}) {
    auto a = load_ok(kRoot + p);
    ASSERT_TRUE(a);
    std::vector<std::string> warnings;
    Status st = a->validate(b, &warnings);
    EXPECT_TRUE(st.is_ok()) << p << ": " << st.to_string();
    EXPECT_TRUE(warnings.empty()) << p << ": " << (warnings.empty() ? "" : warnings[0]);
  }
}

// The base side read from each weight format: MLX-quantized matrices' input width from the packed
// codes and the config's (per-module) bits, GGUF from ne[]; all equal the HF checkpoint's.
TEST(LoraValidate, BaseProjectionsFromEveryWeightFormat) {
  auto proj = [](const std::string& dir) {
    auto f = formats::open_model_files(std::string(LARDER_TEST_DATA_DIR) + "/models/" + dir);
    EXPECT_TRUE(f.is_ok()) << dir << ": " << f.status().to_string() << " (fixture model_ref did not run?)";
    if (!f.is_ok()) return BaseProjections{};
    auto b = BaseProjections::from_files(f.value());
    EXPECT_TRUE(b.is_ok()) << dir << ": " << b.status().to_string();
    return b.is_ok() ? std::move(b.value()) : BaseProjections{};
  };
  const BaseProjections hf = proj("qwen3_f32");
  ASSERT_EQ(hf.n_layers, 3);
  int n = 0;
  for (const char* other : {"qwen3_q8g32", "qwen3_q8_0/model.gguf", "qwen3_q4_0/model.gguf"}) {
    const BaseProjections b = proj(other);
    EXPECT_EQ(b.architecture, "qwen3") << other;
    EXPECT_EQ(b.order, std::string(other).find(".gguf") != std::string::npos ? models::WeightOrder::kGguf
                                                                              : models::WeightOrder::kHf)
        << other;
    ASSERT_EQ(b.shapes.size(), hf.shapes.size()) << other;
    for (size_t i = 0; i < hf.shapes.size(); ++i) {
      EXPECT_EQ(b.shapes[i].out, hf.shapes[i].out) << other << " #" << i;
      EXPECT_EQ(b.shapes[i].in, hf.shapes[i].in) << other << " #" << i;
      n += hf.shapes[i].out > 0;
    }
  }
  EXPECT_EQ(n, 3 * 3 * 7);  // three formats × three layers × q k v o gate up down
  // Mixed widths (3, 6, 2, 8 bits per module, one module unquantized, group sizes 32–128).
  const BaseProjections mixed = proj("llama_mixed");
  ASSERT_EQ(mixed.n_layers, 2);
  const std::pair<LoraModule, std::pair<int64_t, int64_t>> want[] = {
      {LoraModule::kQ, {128, 128}}, {LoraModule::kK, {64, 128}},   {LoraModule::kV, {64, 128}},
      {LoraModule::kO, {128, 128}}, {LoraModule::kGate, {192, 128}}, {LoraModule::kUp, {192, 128}},
      {LoraModule::kDown, {128, 192}}};
  for (int l = 0; l < 2; ++l)
    for (const auto& [m, s] : want) {
      const BaseProjections::Shape* got = mixed.find(l, m);
      ASSERT_NE(got, nullptr) << models::lora_projection_name(l, m);
      EXPECT_EQ(got->out, s.first) << models::lora_projection_name(l, m);
      EXPECT_EQ(got->in, s.second) << models::lora_projection_name(l, m);
    }
}

TEST(LoraValidate, ShapeErrorsNameTheProjection) {
  EXPECT_NE(validate_error(kRoot + "bad/wrong_in")
                .find("layers.1.self_attn.q_proj: lora_A is 8×48 but the model's q_proj takes 64 inputs"),
            std::string::npos)
      << validate_error(kRoot + "bad/wrong_in");
  EXPECT_NE(validate_error(kRoot + "bad/wrong_out")
                .find("layers.0.self_attn.q_proj: lora_B is 136×8 but the model's q_proj gives 128 outputs"),
            std::string::npos)
      << validate_error(kRoot + "bad/wrong_out");
  EXPECT_NE(validate_error(kRoot + "bad/no_layer").find("layers.7.self_attn.q_proj: the model has 3 layers"),
            std::string::npos);
  EXPECT_NE(validate_error(kRoot + "bad/mlx_num_layers").find("num_layers 1 adapts only the last 1"),
            std::string::npos)
      << validate_error(kRoot + "bad/mlx_num_layers");
  const std::string arch = validate_error(kRoot + "bad/arch_llama.gguf");
  EXPECT_NE(arch.find("architecture 'llama'"), std::string::npos) << arch;
  EXPECT_NE(arch.find("'qwen3'"), std::string::npos) << arch;
}

TEST(LoraValidate, RefusedAdaptersSayWhy) {
  const std::string unknown = load_error(kRoot + "bad/unknown_module");
  EXPECT_NE(unknown.find("unknown module 'self_attn.qkv_proj' in layer 0"), std::string::npos) << unknown;
  EXPECT_NE(load_error(kRoot + "bad/vision_tower").find("outside the text model (a vision/audio tower)"),
            std::string::npos);
  EXPECT_NE(load_error(kRoot + "bad/lm_head").find("output head (lm_head) is not supported"), std::string::npos);
  EXPECT_NE(load_error(kRoot + "bad/peft_dora").find("DoRA adapters (use_dora: true) are not supported"),
            std::string::npos);
  EXPECT_NE(load_error(kRoot + "bad/mlx_dora").find("DoRA adapters (fine_tune_type: dora) are not supported"),
            std::string::npos);
  const std::string nt = load_error(kRoot + "bad/not_targeted");
  EXPECT_NE(nt.find("holds LoRA weights for model.layers.0.self_attn.o_proj, but target_modules [\"q_proj\",\"k_proj\"] does not name it"),
            std::string::npos)
      << nt;
  EXPECT_NE(load_error(kRoot + "bad/modules_to_save").find("modules_to_save [\"lm_head\"]"), std::string::npos);
  const std::string rm = load_error(kRoot + "bad/rank_mismatch");
  EXPECT_NE(rm.find("layers.0.self_attn.k_proj: lora_A [8, 64] has rank 8 but the adapter config says r = 4"),
            std::string::npos)
      << rm;
  EXPECT_NE(load_error(kRoot + "base").find("no adapter_config.json"), std::string::npos);
  EXPECT_NE(load_error(kRoot + "base/model.safetensors").find("pass the adapter's directory"), std::string::npos);
  EXPECT_NE(load_error(kRoot + "nonexistent.gguf").find("no such file"), std::string::npos);
}

TEST(LoraValidate, GgufArchitectureNamesMatchTheHfFamily) {
  // A GGUF adapter carries llama.cpp's architecture name; an HF base carries its model_type. The
  // same family under its two names fits; another family is refused. Qwen3-MoE's rows are in the
  // same order on both sides (the HF base); gpt-oss's FFN has no dense rows to compare (a GGUF base).
  using models::WeightOrder;
  for (const auto& [file, hf, order, other] :
       {std::tuple{"arch_qwen3moe.gguf", "qwen3_moe", WeightOrder::kHf, "qwen3"},
        std::tuple{"arch_gpt-oss.gguf", "gpt_oss", WeightOrder::kGguf, "qwen3_moe"}}) {
    auto a = load_ok(kRoot + "bad/" + file);
    ASSERT_TRUE(a) << file;
    BaseProjections b = base();
    b.architecture = hf;
    b.order = order;
    const Status st = a->validate(b, nullptr);
    EXPECT_TRUE(st.is_ok()) << file << ": " << st.to_string();
    b.architecture = other;
    EXPECT_FALSE(a->validate(b, nullptr).is_ok()) << file << " on " << other;
  }
}

TEST(LoraValidate, OtherBaseNameIsAWarning) {
  auto a = load_ok(kRoot + "bad/other_base");
  ASSERT_TRUE(a);
  std::vector<std::string> warnings;
  Status st = a->validate(base(), &warnings);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("trained on 'meta-llama/Llama-3.2-1B'"), std::string::npos) << warnings[0];
}

TEST(LoraValidate, RowOrderAcrossFormats) {
  // llama.cpp's converter permutes Llama's Q/K rows in GGUF files: an HF-ordered adapter does not
  // fit a GGUF Llama's q_proj, while v_proj (not permuted) does. Qwen3 permutes nothing.
  auto a = load_ok(kRoot + "attn_r8/peft");
  ASSERT_TRUE(a);
  BaseProjections llama = base();
  llama.architecture = "llama";
  llama.order = models::WeightOrder::kGguf;
  const Status st = a->validate(llama, nullptr);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("layers.0.self_attn.q_proj: a PEFT adapter on a GGUF model"), std::string::npos)
      << st.to_string();
  BaseProjections qwen = base();
  qwen.order = models::WeightOrder::kGguf;
  EXPECT_TRUE(a->validate(qwen, nullptr).is_ok());
}

TEST(LoraSpec, PathScaleAndName) {
  auto one = [](std::string_view a, bool named) {
    auto r = models::parse_lora_spec(a, named);
    EXPECT_TRUE(r.is_ok()) << a << ": " << r.status().to_string();
    return r.is_ok() ? r.value() : models::LoraSpec{};
  };
  auto err = [](std::string_view a, bool named) {
    auto r = models::parse_lora_spec(a, named);
    EXPECT_FALSE(r.is_ok()) << a << " parsed";
    return r.is_ok() ? std::string() : r.status().to_string();
  };
  EXPECT_EQ(one("a/b.gguf", false).path, "a/b.gguf");
  EXPECT_EQ(one("a/b.gguf", false).scale, 1.0f);
  EXPECT_EQ(one("a/b.gguf:0.5", false).path, "a/b.gguf");
  EXPECT_EQ(one("a/b.gguf:0.5", false).scale, 0.5f);
  EXPECT_EQ(one("a/b.gguf:-2", false).scale, -2.0f);
  EXPECT_EQ(one("c:/x:y", false).path, "c:/x:y");  // not a number after the last ':': part of the path
  EXPECT_EQ(one("c:/x:y:3", false).path, "c:/x:y");
  const models::LoraSpec s = one("pirate=/ad/pirate:0.75", true);
  EXPECT_EQ(s.name, "pirate");
  EXPECT_EQ(s.path, "/ad/pirate");
  EXPECT_EQ(s.scale, 0.75f);
  EXPECT_EQ(one("p=/a=b", true).path, "/a=b");
  EXPECT_NE(err("/ad/pirate", true).find("expected NAME=PATH[:SCALE]"), std::string::npos);
  EXPECT_NE(err("=/ad", true).find("expected NAME=PATH[:SCALE]"), std::string::npos);
  EXPECT_NE(err("a b=/ad", true).find("whitespace"), std::string::npos);
  EXPECT_NE(err("x.gguf:inf", false).find("scale 'inf' is not a finite number"), std::string::npos);
  EXPECT_NE(err("x.gguf:1e60", false).find("not a finite number"), std::string::npos);
  EXPECT_NE(err(":0.5", false).find("no adapter path"), std::string::npos);
  EXPECT_NE(err("n=", true).find("no adapter path"), std::string::npos);
}

// ---- KV namespaces (item 3) ----

struct TempDir {
  fs::path p = fs::temp_directory_path() / ("lora-test-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() { fs::remove_all(p); }
};

std::string ns(std::vector<LoraUse> uses, std::string_view salt = {}) {
  auto r = runtime::lora_namespace(std::move(uses), salt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : "";
}

TEST(LoraNamespace, ContentNotNames) {
  TempDir t;
  fs::copy(kRoot + "attn_r8/peft", t.p / "renamed", fs::copy_options::recursive);
  fs::copy(kRoot + "attn_r8/peft", t.p / "changed", fs::copy_options::recursive);
  {  // one value of one matrix changed (the last byte of the file: a lora_B element's top byte)
    std::fstream f(t.p / "changed" / "adapter_model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  auto orig = load_ok(kRoot + "attn_r8/peft");
  auto renamed = load_ok((t.p / "renamed").string());
  auto changed = load_ok((t.p / "changed").string());
  auto gguf = load_ok(kRoot + "attn_r8/lora.gguf");
  ASSERT_TRUE(orig && renamed && changed && gguf);
  EXPECT_EQ(ns({}), "base");
  const std::string n0 = ns({{orig, 1.0f}});
  EXPECT_EQ(n0.size(), 32u);
  EXPECT_EQ(ns({{renamed, 1.0f}}), n0);                 // renaming the file hits
  EXPECT_EQ(ns({{gguf, 1.0f}}), n0);                    // the same values in another format hit
  EXPECT_NE(ns({{changed, 1.0f}}), n0);                 // changed content misses
  EXPECT_NE(changed->content_hash(), orig->content_hash());
  EXPECT_NE(ns({{orig, 0.5f}}), n0);                    // another scale misses
  EXPECT_NE(ns({{orig, 1.0f}}, "salt"), n0);            // a cache salt separates too
  EXPECT_NE(ns({}, "salt"), "base");
}

TEST(LoraNamespace, OrderIndependentThroughTheCanonicalOrder) {
  auto a = load_ok(kRoot + "attn_r8/mlx");
  auto b = load_ok(kRoot + "mlp_r4/mlx");
  auto c = load_ok(kRoot + "mixed_r16/mlx");
  ASSERT_TRUE(a && b && c);
  const std::string abc = ns({{a, 1.0f}, {b, 0.5f}, {c, -1.0f}});
  EXPECT_EQ(ns({{c, -1.0f}, {a, 1.0f}, {b, 0.5f}}), abc);
  EXPECT_EQ(ns({{b, 0.5f}, {c, -1.0f}, {a, 1.0f}}), abc);
  EXPECT_NE(ns({{a, 0.5f}, {b, 1.0f}, {c, -1.0f}}), abc);  // scales belong to their adapter
  EXPECT_NE(ns({{a, 1.0f}, {b, 0.5f}}), abc);
  // Scale 0 adds nothing: dropped, so {a, b:0} is {a}, and only zeros is the base.
  EXPECT_EQ(ns({{a, 1.0f}, {b, 0.0f}}), ns({{a, 1.0f}}));
  EXPECT_EQ(ns({{a, 0.0f}, {b, -0.0f}}), "base");
  // The order the hook must apply: sorted by content hash, then scale.
  const auto canon = models::canonical_lora_uses({{c, 2.0f}, {a, 1.0f}, {b, 0.0f}, {c, 1.0f}});
  ASSERT_EQ(canon.size(), 3u);
  EXPECT_LE(canon[0].adapter->content_hash(), canon[1].adapter->content_hash());
  EXPECT_LE(canon[1].adapter->content_hash(), canon[2].adapter->content_hash());
  for (size_t i = 0; i + 1 < canon.size(); ++i) {
    if (canon[i].adapter == canon[i + 1].adapter) {
      EXPECT_LT(canon[i].scale, canon[i + 1].scale);
    }
  }
  // A non-finite scale is refused.
  EXPECT_FALSE(runtime::lora_namespace({{a, std::nanf("")}}).is_ok());
  EXPECT_FALSE(runtime::lora_namespace({{a, INFINITY}}).is_ok());
}

}  // namespace
}  // namespace larder
