// Every architecture vs mlx-lm: tiny random checkpoints made by tests/ref/model_reference.py,
// teacher-forced over 64 tokens; logits of every position compared.
//
// Bounds
// - f32 checkpoints, and bf16 checkpoints against mlx run in f32 on the same bf16 values
//   ("f32math"), and GGUF Q8_0/Q4_0/Q4_K+Q6_K against mlx on the exactly dequantized values ("deq"): the
//   math is the same as larder's, only summation order differs (mlx: f32 accumulation; larder
//   ref: double), so max |diff| ≤ 1e-4 · max|logit| and the top-1 token must agree everywhere.
// - bf16 checkpoints against mlx computing in bf16 ("bf16"): mlx rounds every activation (each
//   matmul output, norm, rope, softmax, residual sum) to bf16, unit roundoff u = 2^-8 ≈ 3.9e-3;
//   larder computes in f32 from the same bf16 weights. Each of the ~10 rounded stages per layer
//   perturbs the residual stream by ≲ u relative, and the final logits (|logit| up to ~60 here)
//   are themselves stored in bf16 by mlx (step 0.25 at 32..64). The bound is 8u · max|logit| ≈
//   3.1e-2 · max|logit| (measured worst is printed). Top-1 must agree wherever mlx's own bf16
//   top-1 margin exceeds twice that bound (below it mlx's ranking is bf16 noise).
// Kernel tables: the tight comparisons run on the scalar reference table (the model layer's
// oracle check), and again on the active table (fast tiers). On the active table the float
// formats keep the tight bound (exact products, f32 accumulation); a GGUF block format whose
// matmul is not the reference (int8-quantized activations, as llama.cpp does: ≈1% of Σ|w·x|
// per dot product) gets 3e-2 · max|logit| and top-1 agreement where mlx's margin exceeds twice
// that.
// MLX affine checkpoints (mlx-lm quantized and saved them; "f32math": mlx-lm re-loads the
// directory and runs with scales/biases upcast to f32): the dequantized weights s·q + b are the
// same f32 values on both sides (tests/unit/kernels RefAffine checks them bit for bit against
// mx.dequantize), so the reference table gets the tight 1e-4 bound. The AVX2 affine kernel
// quantizes activations to int8 like the GGUF kernels (the bias term uses exact Σx), so it gets
// the same 3e-2 bound and margin rule.
// BF16 checkpoints on the AVX-512 table: its BF16 matmul rounds activations to bf16 once per
// matmul (vdpbf16ps; llama.cpp's BF16 path does the same), relative error ≤ 2^-9 per element, so
// it gets 1e-2 · max|logit| (≈ 2× the measured worst, 4.7e-3 on qwen3_bf16) and the margin rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "larder/formats/model_files.h"
#include "larder/kernels/cpu/common/cpu_kernels.h"
#include "larder/kernels/dispatch.h"
#include "larder/memory/kv_cache.h"
#include "larder/models/model.h"
#include "../../support/model_fixture.h"
#include "../../support/logit_diff.h"

namespace larder::models {
namespace {

using test::run_chunks;
using test::with_table;

const std::string& kRoot = test::kModelFixtures;

struct Ref {
  std::vector<int32_t> tokens;
  int64_t vocab = 0;
  nlohmann::json meta;
  std::vector<float> logits(const std::string& dir, const std::string& set) const {
    std::vector<float> v(tokens.size() * static_cast<size_t>(vocab));
    std::ifstream f(dir + "/" + meta["logits"][set].get<std::string>(), std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    EXPECT_TRUE(f.good()) << dir << " " << set;
    return v;
  }
};

Ref read_ref(const std::string& dir) {
  Ref r;
  std::ifstream f(dir + "/ref.json");
  EXPECT_TRUE(f.good()) << dir << ": fixture model_ref did not run";
  if (!f.good()) return r;
  r.meta = nlohmann::json::parse(f);
  r.tokens = r.meta["tokens"].get<std::vector<int32_t>>();
  r.vocab = r.meta["vocab"].get<int64_t>();
  return r;
}

// Forward the sequence in the given chunk sizes, collecting every position's logits.
struct Case {
  const char* dir;   // under testdata/models/
  const char* file;  // "" = HF directory, else file inside it
  const char* arch;
  bool tied;
  const char* dtypes;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.dir; }

class ArchParity : public ::testing::TestWithParam<Case> {};

// Runs `fn` with `t` as the active kernel table, restoring the previous one after.
bool is_block_format(const std::string& dtypes) { return dtypes.rfind("Q", 0) == 0; }

TEST_P(ArchParity, TightAgainstMlxLm) {
  const Case& c = GetParam();
  const std::string dir = kRoot + c.dir;
  Ref ref = read_ref(dir);
  ASSERT_FALSE(ref.tokens.empty());
  test::LoadedModel l = test::load_model(std::string(c.file).empty() ? dir : dir + "/" + c.file);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  EXPECT_EQ(m.info().architecture, c.arch);
  EXPECT_EQ(m.info().tied_embeddings, c.tied);
  EXPECT_EQ(m.info().weight_dtypes, c.dtypes);
  ASSERT_EQ(m.info().vocab, ref.vocab);

  const std::string set = ref.meta["logits"].contains("f32") ? "f32" : ref.meta["logits"].contains("f32math") ? "f32math" : "deq";
  const std::vector<float> want = ref.logits(dir, set);
  const kernels::KernelTable active = kernels::active_table();
  // The (first) block format of the case, by name ("Q4_K+Q6_K" -> Q4_K).
  const std::string first = std::string(c.dtypes).substr(0, std::string(c.dtypes).find('+'));
  DType dt = DType::kQ4_0;
  for (int i = 0; i < static_cast<int>(DType::kUnknown); ++i)
    if (first == dtype_name(static_cast<DType>(i))) dt = static_cast<DType>(i);
  const bool affine = std::string(c.dtypes).find("affine") != std::string::npos;
  const bool loose = (is_block_format(c.dtypes) &&
                      active.matmul[static_cast<int>(dt)] != kernels::ref_table().matmul[static_cast<int>(dt)]) ||
                     (affine && active.matmul_affine[4] != kernels::ref_table().matmul_affine[4]);
  const bool bf16_acts = std::string(c.dtypes) == "BF16" &&
                         active.matmul[static_cast<int>(DType::kBF16)] == kernels::cpu::fast_matmul("avx512", DType::kBF16);
  struct Run { const char* name; const kernels::KernelTable* table; float rel; };
  const Run runs[] = {{"ref", &kernels::ref_table(), 1e-4f},
                      {active.name, &active, loose ? 3e-2f : bf16_acts ? 1e-2f : 1e-4f}};
  for (const Run& run : runs) {
    with_table(*run.table, [&] {
      // Chunks of 5 cut every sliding window (8-16 tokens in the Gemma cases) mid-way; 43 and 30
      // are longer than a window (a prefill chunk wider than its ring).
      for (const auto& chunks : {std::vector<int64_t>{64}, std::vector<int64_t>{20, 1, 43},
                                 std::vector<int64_t>{1, 1, 30, 32},
                                 std::vector<int64_t>{5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 4}}) {
        float max_ref = 0;
        for (float v : want) max_ref = std::max(max_ref, std::abs(v));
        const float margin = run.rel > 1e-4f ? 2 * run.rel * max_ref : 0.0f;
        const test::LogitDiff d = test::compare_logits(run_chunks(m, ref.tokens, chunks), want, ref.vocab, margin);
        std::string cs;
        for (int64_t x : chunks) cs += std::to_string(x) + " ";
        std::printf("[parity] %-18s %-8s %-6s chunks %-10s max|diff| %.3g  max|logit| %.3g  rel %.3g  top1 %d/%d\n",
                    c.dir, set.c_str(), run.name, cs.c_str(), d.max_abs, d.max_ref, d.max_abs / d.max_ref,
                    d.top1_checked - d.top1_mismatch, d.top1_checked);
        EXPECT_LE(d.max_abs, run.rel * d.max_ref) << c.dir << " table " << run.name << " chunks " << cs;
        EXPECT_EQ(d.top1_mismatch, 0) << c.dir << " table " << run.name << " chunks " << cs;
        if (margin == 0) {
          EXPECT_EQ(d.top1_checked, static_cast<int>(ref.tokens.size()));
        }
      }
    });
  }
}

// A KvPrefix holding a copy of another cache's first `p` rows: what the KV store hands out.
class CopiedPrefix final : public memory::KvPrefix {
 public:
  CopiedPrefix(const memory::KvCache& from, int64_t p) : layout_(from.layout()), p_(p) {
    std::vector<memory::KvSpan> sp;
    const int64_t row = layout_.row_floats();
    for (int l = 0; l < layout_.n_layers; ++l) {
      from.spans(l, p, &sp);
      std::vector<float> k, v;
      for (const auto& s : sp) {
        k.insert(k.end(), s.k_f32(), s.k_f32() + s.len * row);
        v.insert(v.end(), s.v_f32(), s.v_f32() + s.len * row);
      }
      k_.push_back(std::move(k));
      v_.push_back(std::move(v));
    }
  }
  const memory::KvLayout& layout() const override { return layout_; }
  int64_t tokens() const override { return p_; }
  const void* k(int layer) const override { return k_[static_cast<size_t>(layer)].data(); }
  const void* v(int layer) const override { return v_[static_cast<size_t>(layer)].data(); }

 private:
  memory::KvLayout layout_;
  int64_t p_;
  std::vector<std::vector<float>> k_, v_;
};

// Attention reads a shared prefix segment followed by a private tail (two spans), and a trim into
// the prefix detaches it; both must give the reference logits.
TEST(SharedPrefix, SpansAndTrimMatchReference) {
  for (const char* name : {"llama_gqa_f32", "qwen3_f32"}) {
    const std::string dir = kRoot + name;
    Ref ref = read_ref(dir);
    ASSERT_FALSE(ref.tokens.empty());
    test::LoadedModel l = test::load_model(dir);
    ASSERT_NE(l.model, nullptr);
    Model& m = *l.model;
    const int64_t V = ref.vocab;
    const std::vector<float> want = ref.logits(dir, "f32");
    float max_ref = 0;
    for (float v : want) max_ref = std::max(max_ref, std::abs(v));
    std::vector<float> out(64 * static_cast<size_t>(V));

    memory::SequenceState donor = m.new_state(128);
    ASSERT_TRUE(m.forward(ref.tokens.data(), 20, donor, out.data(), true).is_ok());
    auto prefix = std::make_shared<CopiedPrefix>(donor.kv, 20);
    memory::SequenceState c = m.new_state(128);
    c.kv.attach_prefix(prefix, 20);
    std::vector<memory::KvSpan> sp;
    ASSERT_TRUE(m.forward(ref.tokens.data() + 20, 44, c, out.data() + 20 * V, true).is_ok());
    c.kv.spans(0, 64, &sp);
    EXPECT_EQ(sp.size(), 2u) << "prefix + tail";
    float d = 0;
    for (int64_t i = 20 * V; i < 64 * V; ++i) d = std::max(d, std::abs(out[i] - want[i]));
    EXPECT_LE(d, 1e-4f * max_ref) << name << " with a shared prefix";

    ASSERT_TRUE(c.trim(10).is_ok());  // into the shared prefix: detaches (copies) it
    EXPECT_EQ(c.kv.prefix_tokens(), 0);
    ASSERT_TRUE(m.forward(ref.tokens.data() + 10, 54, c, out.data() + 10 * V, true).is_ok());
    d = 0;
    for (int64_t i = 10 * V; i < 64 * V; ++i) d = std::max(d, std::abs(out[i] - want[i]));
    EXPECT_LE(d, 1e-4f * max_ref) << name << " after trimming into the prefix";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ArchParity,
    ::testing::Values(Case{"llama_gqa_f32", "", "llama", true, "F32"},
                      Case{"llama_untied_f32", "", "llama", false, "F32"},
                      Case{"mistral_f32", "", "mistral", false, "F32"},
                      Case{"qwen2_f32", "", "qwen2", true, "F32"},
                      Case{"qwen3_f32", "", "qwen3", false, "F32"},
                      Case{"llama_gqa_bf16", "", "llama", true, "BF16"},
                      Case{"llama_untied_bf16", "", "llama", false, "BF16"},
                      Case{"mistral_bf16", "", "mistral", false, "BF16"},
                      Case{"qwen2_bf16", "", "qwen2", true, "BF16"},
                      Case{"qwen3_bf16", "", "qwen3", false, "BF16"},
                      Case{"llama_gqa_q8_0", "model.gguf", "llama", true, "Q8_0"},
                      Case{"llama_gqa_q4_0", "model.gguf", "llama", true, "Q4_0"},
                      Case{"qwen3_q8_0", "model.gguf", "qwen3", false, "Q8_0"},
                      Case{"qwen3_q4_0", "model.gguf", "qwen3", false, "Q4_0"},
                      Case{"llama_gqa_q4_1", "model.gguf", "llama", true, "Q4_1"},
                      Case{"llama_gqa_q5_1", "model.gguf", "llama", true, "Q5_1"},
                      Case{"qwen3_q5_0", "model.gguf", "qwen3", false, "Q5_0"},
                      Case{"llama_q4_k_m", "model.gguf", "llama", true, "Q4_K+Q6_K"},
                      Case{"llama_q4g64", "", "llama", true, "affine-q4-g64"},
                      Case{"llama_mixed", "", "llama", false,
                           "F16+affine-q2-g64+affine-q3-g32+affine-q4-g64+affine-q5-g32+affine-q6-g128+"
                           "affine-q8-g128+affine-q8-g64"},
                      Case{"qwen3_q8g32", "", "qwen3", false, "affine-q8-g32"},
                      // Gemma 3 (tests/ref/gemma3_reference.py): sliding + global layers, windows
                      // 8 and 13, layer_types, linear rope scaling, multimodal text tower, GGUF.
                      Case{"gemma3_text_f32", "", "gemma3_text", true, "F32"},
                      Case{"gemma3_text_bf16", "", "gemma3_text", true, "BF16"},
                      Case{"gemma3_ltypes_f32", "", "gemma3_text", true, "F32"},
                      Case{"gemma3_mm", "", "gemma3", true, "F32"},
                      Case{"gemma3_q8_0", "model.gguf", "gemma3", true, "Q8_0"},
                      // A checkpoint's own lm_head is used (issue 47 item 14): without
                      // tie_word_embeddings (Gemma 3's default is tied), and against a
                      // tie_word_embeddings: true that the head contradicts (transformers 5).
                      Case{"gemma3_head", "", "gemma3_text", false, "F32"},
                      Case{"gemma3_head_tiedcfg", "", "gemma3_text", false, "F32"},
                      // Gemma 4 (tests/ref/gemma4_reference.py): per-kind head dims, KV sharing,
                      // per-layer embeddings, k_eq_v, proportional RoPE, soft-capped logits.
                      Case{"gemma4_text_f32", "", "gemma4_text", true, "F32"},
                      Case{"gemma4_keqv_f32", "", "gemma4_text", false, "F32"},
                      Case{"gemma4_mm", "", "gemma4", true, "F32"}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.dir); });

class Bf16Parity : public ::testing::TestWithParam<const char*> {};

TEST_P(Bf16Parity, LooseAgainstMlxBf16Compute) {
  const std::string dir = kRoot + GetParam();
  Ref ref = read_ref(dir);
  ASSERT_FALSE(ref.tokens.empty());
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  const std::vector<float> want = ref.logits(dir, "bf16");
  float max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, std::abs(v));
  const float u = 1.0f / 256;  // bf16 unit roundoff
  const float bound = 8 * u * max_ref;
  const test::LogitDiff d = test::compare_logits(run_chunks(*l.model, ref.tokens, {64}), want, ref.vocab, 2 * bound);
  std::printf("[parity] %-18s bf16     max|diff| %.3g  max|logit| %.3g  rel %.3g (bound %.3g)  top1 %d/%d checked\n",
              GetParam(), d.max_abs, d.max_ref, d.max_abs / d.max_ref, 8 * u, d.top1_checked - d.top1_mismatch,
              d.top1_checked);
  EXPECT_LE(d.max_abs, bound);
  EXPECT_EQ(d.top1_mismatch, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16Parity,
                         ::testing::Values("llama_gqa_bf16", "llama_untied_bf16", "mistral_bf16", "qwen2_bf16",
                                           "qwen3_bf16"));

}  // namespace
}  // namespace larder::models
