// Gemma 4 with enable_moe_block (the 26B-A4B layout) vs mlx-lm's own gemma4_text Model: tiny
// random checkpoints from tests/ref/gemma4_reference.py — gemma4_moe_f32 (HF, fused
// experts.gate_up_proj as transformers 5 saves them) and gemma4_moe_mlx4 (mlx-lm's 4-bit
// quantization: experts.switch_glu.* stacked, router.proj at 8 bits) — 64 teacher-forced tokens,
// f32 max |diff| <= 1e-4 · max|logit| and top-1 identical; decode after prefill and prefill cuts
// equal to all-at-once; a batch of four sequences equal to each alone, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
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

}  // namespace
}  // namespace larder::models
