// Mixed-precision allocator on hand-made sensitivity tables: greedy order, name tie-break, NaN,
// protection, block floor, run guard, unreachable targets, determinism.
#include "larder/quant/allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace larder::quant {
namespace {

const double kNaN = std::nan("");

// Core greedy only: no protection of boundary blocks, no floor, no run guard.
AllocatorOptions plain(double target, std::vector<int> cand = {4, 8}) {
  AllocatorOptions o;
  o.target_bpw = target;
  o.candidates = std::move(cand);
  o.protect_first_last = false;
  o.n_floor_per_block = 0;
  o.max_low_bit_run = 0;
  return o;
}

std::map<std::string, int> bits_of(const AllocationPlan& p) {
  std::map<std::string, int> m;
  for (const auto& x : p.modules) m[x.name] = x.bits;
  return m;
}

TEST(Allocator, GreedyPicksBestReductionPerBit) {
  const std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.up_proj", {{4, 0.5}, {8, 0.0}}, 100},
      {"model.layers.1.mlp.down_proj", {{4, 1.0}, {8, 0.0}}, 100},
      {"model.layers.1.self_attn.q_proj", {{4, 0.9}, {8, 0.0}}, 50},  // 0.9/200 > 1.0/400
  };
  auto r = allocate_bits(t, plain(5.0));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto b = bits_of(r.value());
  EXPECT_EQ(b["model.layers.1.self_attn.q_proj"], 8);
  EXPECT_EQ(b["model.layers.1.mlp.down_proj"], 8);  // 4.8 < 5 after q_proj: one more step
  EXPECT_EQ(b["model.layers.1.mlp.up_proj"], 4);
  EXPECT_NEAR(r.value().achieved_bpw, (8 * 50 + 8 * 100 + 4 * 100) / 250.0, 1e-12);
  EXPECT_EQ(r.value().n_high, 2);
  EXPECT_EQ(r.value().n_low, 1);
  // Result in input order.
  EXPECT_EQ(r.value().modules[0].name, "model.layers.1.mlp.up_proj");
}

TEST(Allocator, TiesBrokenByName) {
  const std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.b", {{4, 1.0}, {8, 0.0}}, 100},
      {"model.layers.1.mlp.a", {{4, 1.0}, {8, 0.0}}, 100},
      {"model.layers.1.mlp.c", {{4, 1.0}, {8, 0.0}}, 100},
  };
  auto r = allocate_bits(t, plain(5.0));
  ASSERT_TRUE(r.is_ok());
  auto b = bits_of(r.value());
  EXPECT_EQ(b["model.layers.1.mlp.a"], 8);
  EXPECT_EQ(b["model.layers.1.mlp.b"], 4);
  EXPECT_EQ(b["model.layers.1.mlp.c"], 4);
}

TEST(Allocator, NanIsMaximallySensitive) {
  const std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.up_proj", {{4, 1e3}, {8, 0.0}}, 100},
      {"model.layers.1.mlp.zz_proj", {{4, kNaN}, {8, 0.0}}, 100},  // per-layer max finite is 0
      {"model.layers.1.mlp.down_proj", {{4, kNaN}, {8, kNaN}}, 100},
  };
  auto r = allocate_bits(t, plain(5.2));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  auto b = bits_of(r.value());
  EXPECT_EQ(b["model.layers.1.mlp.zz_proj"], 8);
  EXPECT_EQ(b["model.layers.1.mlp.up_proj"], 4);
  // {NaN, NaN}: 1e3*10*(8/4) at 4 vs 1e3*10*(8/8) at 8 -> benefit 1e4 < 2e4 of zz_proj, > up_proj's 1e3.
  EXPECT_EQ(b["model.layers.1.mlp.down_proj"], 4);
  auto r2 = allocate_bits(t, plain(6.0));
  ASSERT_TRUE(r2.is_ok());
  EXPECT_EQ(bits_of(r2.value())["model.layers.1.mlp.down_proj"], 8);
  EXPECT_EQ(bits_of(r2.value())["model.layers.1.mlp.up_proj"], 4);
}

TEST(Allocator, UnreachableTargetsAreClearErrors) {
  const std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.up_proj", {{4, 1.0}, {8, 0.0}}, 100},
      {"model.layers.1.mlp.down_proj", {{4, 0.0}, {8, 0.0}}, 100},  // no upgrade lowers anything
  };
  auto r = allocate_bits(t, plain(9.0));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("unreachable"), std::string::npos) << r.status().message();
  auto r2 = allocate_bits(t, plain(7.0));
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("unreachable"), std::string::npos);
  auto r3 = allocate_bits(t, plain(6.0));  // exactly one upgrade
  ASSERT_TRUE(r3.is_ok());
  EXPECT_EQ(r3.value().achieved_bpw, 6.0);
  auto r4 = allocate_bits(t, plain(4.0, {4, 7}));
  EXPECT_FALSE(r4.is_ok());
  EXPECT_TRUE(allocate_bits({}, plain(4.0)).is_ok());
}

TEST(Allocator, ProtectedModulesWin) {
  const std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.up_proj", {{4, 1.0}, {8, 0.0}}, 100},
      {"lm_head", {{4, 0.05}, {8, 0.0}}, 100},  // x100 -> 5.0
  };
  auto r = allocate_bits(t, plain(6.0));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(bits_of(r.value())["lm_head"], 8);
  EXPECT_TRUE(is_protected_output("model.embed_tokens"));
  EXPECT_TRUE(is_protected_output("lm_head"));
  EXPECT_FALSE(is_protected_output("model.layers.3.mlp.gate_proj"));
  EXPECT_EQ(block_index("model.layers.12.self_attn.q_proj"), 12);
  EXPECT_EQ(block_index("lm_head"), -1);
}

std::vector<ModuleSensitivity> blocks(int n_blocks, double scale = 1.0) {
  const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  const uint64_t params[] = {1000, 250, 250, 1000, 3000, 3000, 3000};
  std::vector<ModuleSensitivity> t;
  for (int b = 0; b < n_blocks; ++b)
    for (int c = 0; c < 7; ++c)
      t.push_back({"model.layers." + std::to_string(b) + "." + names[c],
                   {{2, scale * (b + 1) * (1 + 0.1 * c)}, {4, 0.3 * scale * (b + 1) * (1 + 0.1 * c)}, {8, 0.0}},
                   params[c]});
  return t;
}

TEST(Allocator, BlockFloorRaisesMostSensitiveAttention) {
  AllocatorOptions o = plain(2.0, {2, 4, 8});
  o.n_floor_per_block = 2;
  auto r = allocate_bits(blocks(2), o);
  ASSERT_TRUE(r.is_ok());
  auto b = bits_of(r.value());
  for (int blk = 0; blk < 2; ++blk) {
    const std::string p = "model.layers." + std::to_string(blk) + ".";
    EXPECT_EQ(b[p + "self_attn.o_proj"], 4);  // most sensitive attention comps (c = 3, 2)
    EXPECT_EQ(b[p + "self_attn.v_proj"], 4);
    EXPECT_EQ(b[p + "self_attn.q_proj"], 2);
    EXPECT_EQ(b[p + "mlp.down_proj"], 2);
  }
}

TEST(Allocator, RunGuardBreaksLongLowRuns) {
  AllocatorOptions o = plain(2.0, {2, 4, 8});
  o.max_low_bit_run = 3;
  auto r = allocate_bits(blocks(7), o);
  ASSERT_TRUE(r.is_ok());
  auto b = bits_of(r.value());
  // One run of 7 low blocks > 3: blocks 0, 3, 6 get their most sensitive b0 layer (down_proj) at 4.
  for (int blk = 0; blk < 7; ++blk) {
    const int want = (blk % 3 == 0) ? 4 : 2;
    EXPECT_EQ(b["model.layers." + std::to_string(blk) + ".mlp.down_proj"], want) << blk;
    EXPECT_EQ(b["model.layers." + std::to_string(blk) + ".mlp.up_proj"], 2) << blk;
  }
  EXPECT_GT(r.value().achieved_bpw, 2.0);
}

TEST(Allocator, DeterministicAndOrderIndependent) {
  AllocatorOptions o;
  o.target_bpw = 3.5;
  o.candidates = {2, 4, 8};
  auto t = blocks(6);
  t.push_back({"model.embed_tokens", {{2, 0.01}, {4, 0.001}, {8, 0}}, 20000});
  t.push_back({"lm_head", {{2, kNaN}, {4, 0.002}, {8, 0}}, 20000});
  auto a = allocate_bits(t, o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  auto t2 = t;
  std::reverse(t2.begin(), t2.end());
  auto b = allocate_bits(t2, o);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(bits_of(a.value()), bits_of(b.value()));
  EXPECT_GE(a.value().achieved_bpw, 3.5);
  for (const auto& m : a.value().modules) EXPECT_TRUE(m.bits == 2 || m.bits == 4 || m.bits == 8);
  // Raising the target never lowers a module (no run-guard effect here).
  o.target_bpw = 5.0;
  auto c = allocate_bits(t, o);
  ASSERT_TRUE(c.is_ok());
  auto ba = bits_of(a.value()), bc = bits_of(c.value());
  for (const auto& [k, v] : ba) EXPECT_GE(bc[k], v) << k;
}


// GGUF prices (ModuleSensitivity::cost): the greedy loop spends stored bits, not widths, and a
// width that costs what the current one does is no upgrade (576-column rows: Q2_K, Q3_K and
// Q4_K all fall back to the same 4.5-bit IQ4_NL) — it moves on to the next dearer one.
TEST(Allocator, PerModuleCostsPriceTheUpgrades) {
  std::vector<ModuleSensitivity> t = {
      {"model.layers.1.mlp.up_proj", {{2, 1.0}, {4, 1.0}, {8, 0.0}}, 100, {{2, 4.5}, {4, 4.5}, {8, 8.5}}},
      {"model.layers.1.mlp.down_proj", {{2, 1.0}, {4, 0.5}, {8, 0.0}}, 100, {{2, 2.625}, {4, 4.5}, {8, 8.5}}},
  };
  auto r = allocate_bits(t, plain(5.0, {2, 4, 8}));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // Start: (4.5 + 2.625) / 2 = 3.5625. up_proj 2 -> 8 (its 4 costs the same as its 2: skipped)
  // lowers 1.0 for 4.0 bits; down_proj 2 -> 4 lowers 0.5 for 1.875 bits: the better rate, first.
  // 4.5 + 4.5 = 9 / 2 = 4.5 < 5, then up_proj 2 -> 8 (1.0 / 4.0) beats down 4 -> 8 (0.5 / 4.0).
  auto b = bits_of(r.value());
  EXPECT_EQ(b["model.layers.1.mlp.down_proj"], 4);
  EXPECT_EQ(b["model.layers.1.mlp.up_proj"], 8);
  EXPECT_DOUBLE_EQ(r.value().achieved_bpw, (8.5 + 4.5) / 2);
  // The reachable maximum is the costs' (8.5), not the widest width's (8).
  EXPECT_TRUE(allocate_bits(t, plain(8.4, {2, 4, 8})).is_ok());
  auto over = allocate_bits(t, plain(8.6, {2, 4, 8}));
  ASSERT_FALSE(over.is_ok());
  EXPECT_NE(over.status().message().find("8.5 bits per weight stored"), std::string::npos) << over.status().message();
}

}  // namespace
}  // namespace larder::quant
