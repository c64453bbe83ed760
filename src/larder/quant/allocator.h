// allocator.h — mixed-precision bit allocation (shared/design/quantization.md §5; a port of the
// rules of OptiQ's optimize_mixed_precision as the seed's allocator applies them).
//
// Given per-module sensitivities {bits -> KL} and parameter counts, choose bits per module so the
// nominal bits per weight (sum bits*params / sum params, no scale/bias overhead; with per-module
// costs, sum cost(bits)*params / sum params) reaches the target while the total sensitivity stays low:
//   candidates sorted; every module starts at the lowest (b0); a per-block floor raises the most
//   sensitive (attention first) modules of every block to b1; NaN sensitivities become "maximally
//   sensitive" finite values (10 x the table maximum or more); protected modules (embeddings / lm_head / non-block paths, MoE
//   routers and shared experts, the first and last n_protect blocks) weigh x100; a greedy loop
//   applies the upgrade with the best sensitivity reduction per extra bit (ties: module name,
//   then widths) until the target is met; a final pass breaks runs of more than max_low_bit_run
//   consecutive blocks dominated by b0. Same input -> same plan.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "larder/core/status.h"

namespace larder::quant {

struct ModuleSensitivity {
  std::string name;
  std::map<int, double> kl;  // bits -> sensitivity (NaN allowed: maximally sensitive)
  uint64_t params = 0;
  // bits -> stored bits per weight of this module at that width (GGUF: the block type's size,
  // e.g. 4 -> Q4_K = 4.5, or its fallback for a row length the block does not divide). Empty:
  // the width itself (MLX, nominal bits). Widths of equal cost are one choice: the greedy loop
  // skips from one to the next dearer one.
  std::map<int, double> cost = {};
};

struct AllocatorOptions {
  double target_bpw = 4.0;
  int group_size = 64;
  std::vector<int> candidates;  // empty: union of the table's widths, or {4, 8}
  bool protect_first_last = true;
  int n_protect = 1;
  int n_floor_per_block = 2;
  int max_low_bit_run = 3;
};

struct ModuleBits {
  std::string name;
  int bits = 0;
  int group_size = 0;
  uint64_t params = 0;
};

struct AllocationPlan {
  std::vector<ModuleBits> modules;  // input order
  std::vector<int> candidates;
  double achieved_bpw = 0;  // nominal
  int n_high = 0, n_low = 0;
  double estimated_mb = 0;
};

// Errors: a target above the highest candidate, a candidate outside {2,3,4,5,6,8}, and a target
// the greedy loop cannot reach (no upgrade left that lowers sensitivity) — each with the numbers.
Result<AllocationPlan> allocate_bits(const std::vector<ModuleSensitivity>& table, const AllocatorOptions& opts);

// Helpers (exposed for tests).
bool is_protected_output(const std::string& name);
int block_index(const std::string& name);  // integer after the first `layers` segment, or -1

}  // namespace larder::quant
