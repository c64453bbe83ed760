// Gemma 4 with enable_moe_block (the 26B-A4B layout) vs mlx-lm's own gemma4_text Model: tiny
// random checkpoints from tests/ref/gemma4_reference.py — gemma4_moe_f32 (HF, fused
// experts.gate_up_proj as transformers 5 saves them) and gemma4_moe_mlx4 (mlx-lm's 4-bit
// quantization: experts.switch_glu.* stacked, router.proj at 8 bits) — 64 teacher-forced tokens,
// f32 max |diff| <= 1e-4 · max|logit| and top-1 identical; decode after prefill and prefill cuts
// equal to all-at-once; a batch of four sequences equal to each alone, bit for bit. And GGUF
// `gemma4` with experts (gemma4_moe_gguf_f32: the converter's tensor names and metadata, written by
// tests/ref/gemma4_gguf.py beside an HF checkpoint of the same weights) against mlx-lm on the HF
// checkpoint and against larder's own HF path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <nlohmann/json.hpp>

#include "larder/kernels/dispatch.h"
#include "larder/models/model.h"
#include "../../support/logit_diff.h"
#include "../../support/model_fixture.h"

namespace larder::models {
namespace {

using test::run_chunks;
using test::with_table;
using Ref = test::RefLogits;

Ref read_ref(const std::string& dir) { return test::read_ref_logits(dir, "gemma4_ref"); }

const std::string& kRoot = test::kModelFixtures;

// Every layer has the dense MLP and 8 routed experts of 32, 2 per token; info counts the experts.
TEST(Gemma4Moe, DeclaresRoutedLayers) {
  for (const char* dir : {"gemma4_moe_f32", "gemma4_moe_mlx4"}) {
    test::LoadedModel l = test::load_model(kRoot + dir);
    ASSERT_NE(l.model, nullptr) << dir;
    const ModelInfo& i = l.model->info();
    EXPECT_EQ(i.n_experts, 8) << dir;
    EXPECT_EQ(i.n_experts_used, 2) << dir;
    const auto layers = l.model->layers();
    ASSERT_EQ(layers.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(layers[j].ffn, FfnKind::kRoutedExperts) << dir << " layer " << j;
      EXPECT_EQ(layers[j].experts.n_experts, 8);
      EXPECT_EQ(layers[j].experts.k, 2);
      EXPECT_EQ(layers[j].experts.ffn, 32);
    }
    EXPECT_EQ(i.active_expert_bytes, i.expert_bytes / 8 * 2) << dir;
    if (std::string(dir) == "gemma4_moe_f32") {
      EXPECT_EQ(i.expert_bytes, uint64_t{5} * 8 * 3 * 32 * 64 * 4);
    }
  }
}

// Teacher-forced logits against mlx-lm, whole and cut (decode after a prefill of 40, uneven
// prefill chunks): within 1e-4 · max|logit|, top-1 identical at all 64 positions, and every cut
// equal to the whole run bit for bit. The reference table for both checkpoints; the active table
// for the f32 one (its float kernels are row-invariant; the 4-bit one's fast kernels quantize
// activations to int8, which mlx-lm does not).
TEST(Gemma4Moe, TightAgainstMlxLm) {
  for (const char* dir_name : {"gemma4_moe_f32", "gemma4_moe_mlx4"}) {
    const std::string dir = kRoot + dir_name;
    const Ref ref = read_ref(dir);
    ASSERT_EQ(ref.tokens.size(), 64u);
    test::LoadedModel l = test::load_model(dir);
    ASSERT_NE(l.model, nullptr) << dir_name;
    Model& m = *l.model;
    ASSERT_EQ(m.info().vocab, ref.vocab);
    std::vector<const kernels::KernelTable*> tables = {&kernels::ref_table()};
    if (std::string(dir_name) == "gemma4_moe_f32") tables.push_back(&kernels::active_table());
    for (const kernels::KernelTable* table : tables) {
      const kernels::KernelTable t = *table;
      with_table(t, [&] {
        std::vector<int64_t> decode = {40};
        decode.resize(25, 1);
        std::vector<float> whole;
        for (const auto& chunks : {std::vector<int64_t>{64}, std::vector<int64_t>{5, 7, 11, 13, 17, 11}, decode}) {
          const std::vector<float> got = run_chunks(m, ref.tokens, chunks);
          if (whole.empty()) whole = got;
          EXPECT_EQ(got, whole) << dir_name << " " << t.name << ": " << chunks.size() << " chunks from " << chunks[0];
          const test::LogitDiff d = test::compare_logits(got, ref.logits, ref.vocab);
          std::printf("[parity] %-16s %-6s %2zu chunks  max|diff| %.3g  max|logit| %.3g  rel %.3g  top1 %d/%d\n",
                      dir_name, t.name, chunks.size(), d.max_abs, d.max_ref, d.max_abs / d.max_ref,
                      d.top1_checked - d.top1_mismatch, d.top1_checked);
          EXPECT_LE(d.max_abs, 1e-4f * d.max_ref) << dir_name << " " << t.name;
          EXPECT_EQ(d.top1_mismatch, 0) << dir_name << " " << t.name;
          EXPECT_EQ(d.top1_checked, 64);
        }
      });
    }
  }
}

// Four sequences prefilled alone to 9, 16, 23, 30 tokens (their sliding rings, window 13, at
// different wrap points), then stepped together in one forward_batch with different chunk sizes:
// each equals what it gives alone, bit for bit (reference and active table).
TEST(Gemma4Moe, BatchOfFourEqualsEachAloneExactly) {
  const std::string dir = kRoot + "gemma4_moe_f32";
  const Ref ref = read_ref(dir);
  test::LoadedModel l = test::load_model(dir);
  ASSERT_NE(l.model, nullptr);
  Model& m = *l.model;
  ASSERT_EQ(ref.tokens.size(), 64u);
  test::expect_batched_equals_alone(m, ref.tokens, {{{1, 3, 1, 5}, {4, 1, 2, 1}, {1, 1, 1, 1}, {7, 2, 3, 1}, {6, 7, 7, 8}}},
                                    "gemma4_moe");
}

// GGUF gemma4 with experts: the layers it declares, logits against mlx-lm (on the HF checkpoint of
// the same weights) whole and cut, and against larder's HF path of those weights (they differ only
// in where the constants are rounded: f32 rope factors, the router gain's product).
TEST(Gemma4Moe, GgufAgainstMlxLmAndTheHfPath) {
  const std::string dir = kRoot + "gemma4_moe_gguf_f32";
  const Ref ref = read_ref(dir);
  ASSERT_EQ(ref.tokens.size(), 64u);
  test::LoadedModel g = test::load_model(dir + "/model.gguf");
  test::LoadedModel h = test::load_model(dir);
  ASSERT_NE(g.model, nullptr);
  ASSERT_NE(h.model, nullptr);
  const ModelInfo& i = g.model->info();
  EXPECT_EQ(i.n_experts, 8);
  EXPECT_EQ(i.n_experts_used, 2);
  EXPECT_EQ(i.expert_bytes, h.model->info().expert_bytes);
  const auto layers = g.model->layers();
  ASSERT_EQ(layers.size(), 5u);
  for (size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(layers[j].ffn, FfnKind::kRoutedExperts) << "layer " << j;
    EXPECT_EQ(layers[j].experts.ffn, 32);
    EXPECT_EQ(layers[j].k_eq_v, layers[j].kind == LayerKind::kFull) << "layer " << j;
  }
  for (const kernels::KernelTable* table : {&kernels::ref_table(), &kernels::active_table()}) {
    const kernels::KernelTable t = *table;
    with_table(t, [&] {
      std::vector<int64_t> decode = {40};
      decode.resize(25, 1);
      std::vector<float> whole;
      for (const auto& chunks : {std::vector<int64_t>{64}, std::vector<int64_t>{5, 7, 11, 13, 17, 11}, decode}) {
        const std::vector<float> got = run_chunks(*g.model, ref.tokens, chunks);
        if (whole.empty()) whole = got;
        EXPECT_EQ(got, whole) << t.name << ": " << chunks.size() << " chunks";
        const test::LogitDiff d = test::compare_logits(got, ref.logits, ref.vocab);
        std::printf("[parity] gemma4_moe_gguf  %-6s %2zu chunks  max|diff| %.3g  max|logit| %.3g  rel %.3g  top1 %d/%d\n",
                    t.name, chunks.size(), d.max_abs, d.max_ref, d.max_abs / d.max_ref,
                    d.top1_checked - d.top1_mismatch, d.top1_checked);
        EXPECT_LE(d.max_abs, 1e-4f * d.max_ref) << t.name;
        EXPECT_EQ(d.top1_mismatch, 0) << t.name;
        EXPECT_EQ(d.top1_checked, 64);
      }
      const test::LogitDiff hd = test::compare_logits(whole, run_chunks(*h.model, ref.tokens, {64}), ref.vocab);
      EXPECT_LE(hd.max_abs, 1e-4f * hd.max_ref) << t.name << " GGUF vs HF";
      EXPECT_EQ(hd.top1_mismatch, 0) << t.name << " GGUF vs HF";
    });
  }
  test::expect_batched_equals_alone(*g.model, ref.tokens, {{{1, 3, 1, 5}, {4, 1, 2, 1}, {6, 7, 7, 8}}},
                                    "gemma4_moe_gguf");
}

// A GGUF with routers but no expert count in its metadata is refused naming the key (a copy of
// the fixture with the key renamed in place: same length, unknown name).
TEST(Gemma4Moe, GgufWithoutExpertCountIsRefused) {
  const std::string src = kRoot + "gemma4_moe_gguf_f32/model.gguf";
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "gemma4.expert_count";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  bytes[at + key.size() - 1] = 'X';  // gemma4.expert_counX: same length, unknown key
  const std::string dst = ::testing::TempDir() + "gemma4_moe_no_count.gguf";
  {
    std::ofstream out(dst, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto f2 = formats::open_model_files(dst);
  ASSERT_TRUE(f2.is_ok()) << f2.status().to_string();
  auto m = Model::load(*f2);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("expert_count"), std::string::npos) << m.status().to_string();
  std::remove(dst.c_str());
}

}  // namespace
}  // namespace larder::models
