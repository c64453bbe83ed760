// allocator.cpp — see allocator.h and design §5 (steps numbered as there).
#include "larder/quant/allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <set>
#include <tuple>

namespace larder::quant {

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == '.') {
      out.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

const char* const kOutputNames[] = {"lm_head", "embed_tokens", "wte", "wpe", "output_proj", "embed_out", "head"};

bool is_router_or_shared(const std::vector<std::string>& seg, const std::string& name) {
  const std::string& last = seg.back();
  if (last == "gate" && seg.size() >= 2 && seg[seg.size() - 2] == "mlp") return true;
  if (last == "router") return true;
  if (name.find("router.proj") != std::string::npos) return true;
  return name.find(".shared_expert.") != std::string::npos || name.find(".shared_experts.") != std::string::npos;
}

bool is_attention_component(const std::string& last) {
  static const std::set<std::string> k = {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_a", "in_proj_b",
                                          "in_proj_z", "out_proj", "qkv_proj", "wqkv", "Wqkv", "attn_qkv"};
  return k.count(last) > 0;
}

// First match of `layers\.(\d+)` anywhere in the name (step 4's block index).
int block_index_regex(const std::string& name) {
  size_t pos = 0;
  while ((pos = name.find("layers.", pos)) != std::string::npos) {
    size_t i = pos + 7, j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j > i) return std::stoi(name.substr(i, std::min<size_t>(j - i, 9)));
    pos += 1;
  }
  return -1;
}

double get(const std::map<int, double>& m, int b) {
  auto it = m.find(b);
  return it == m.end() ? 0.0 : it->second;
}

// NaN sorts as +inf (larder deviation, design §5 step 4).
double sort_key(double v) { return std::isnan(v) ? std::numeric_limits<double>::infinity() : v; }

}  // namespace

bool is_protected_output(const std::string& name) {
  const std::vector<std::string> seg = split_dots(name);
  for (const char* o : kOutputNames)
    if (seg.back().find(o) != std::string::npos) return true;
  for (size_t k = seg.size() >= 2 ? seg.size() - 2 : 0; k < seg.size(); ++k)
    for (const char* o : kOutputNames)
      if (seg[k] == o) return true;
  return std::find(seg.begin(), seg.end(), "layers") == seg.end();
}

int block_index(const std::string& name) {
  const std::vector<std::string> seg = split_dots(name);
  for (size_t i = 0; i + 1 < seg.size(); ++i)
    if (seg[i] == "layers" && all_digits(seg[i + 1])) return std::stoi(seg[i + 1].substr(0, 9));
  return -1;
}

Result<AllocationPlan> allocate_bits(const std::vector<ModuleSensitivity>& table, const AllocatorOptions& opts) {
  AllocationPlan plan;
  if (table.empty()) return plan;
  // 1. Candidates.
  std::vector<int> cand = opts.candidates;
  if (cand.empty()) {
    std::set<int> u;
    for (const auto& m : table)
      for (const auto& [b, v] : m.kl) u.insert(b);
    cand.assign(u.begin(), u.end());
  }
  if (cand.empty()) cand = {4, 8};
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  for (int b : cand)
    if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8)
      return invalid_argument(strfmt("[allocator] candidate width %d is not one of 2, 3, 4, 5, 6, 8", b));
  const int b0 = cand.front(), bmax = cand.back();
  const int b1 = cand.size() >= 2 ? cand[1] : b0;
  plan.candidates = cand;
  const size_t n = table.size();
  // Stored bits per weight of module i at width b (ModuleSensitivity::cost).
  auto cost_of = [&](size_t i, int b) {
    auto it = table[i].cost.find(b);
    return it == table[i].cost.end() ? static_cast<double>(b) : it->second;
  };
  {
    long double top = 0, all = 0;
    for (size_t i = 0; i < n; ++i) {
      top += static_cast<long double>(cost_of(i, bmax)) * table[i].params;
      all += table[i].params;
    }
    const double reach = all > 0 ? static_cast<double>(top / all) : static_cast<double>(bmax);
    if (!(opts.target_bpw <= reach + 1e-9))
      return invalid_argument(strfmt("[allocator] target %.4g bits per weight is unreachable: the highest candidate is %d bits"
                                     " (%.4g bits per weight stored)", opts.target_bpw, bmax, reach));
  }
  // The next width of module i that costs more than width c (equal-cost widths are one choice).
  auto next_of = [&](size_t i, int c) {
    for (auto it = std::upper_bound(cand.begin(), cand.end(), c); it != cand.end(); ++it)
      if (cost_of(i, *it) > cost_of(i, c)) return *it;
    return -1;
  };

  // 2. Protected set.
  std::vector<bool> prot(n, false);
  std::set<int> blocks_all;
  for (size_t i = 0; i < n; ++i) {
    const int bi = block_index(table[i].name);
    if (bi >= 0) blocks_all.insert(bi);
  }
  std::set<int> boundary;
  if (opts.protect_first_last && !blocks_all.empty()) {
    std::vector<int> bl(blocks_all.begin(), blocks_all.end());
    for (int k = 0; k < opts.n_protect && k < static_cast<int>(bl.size()); ++k) {
      boundary.insert(bl[static_cast<size_t>(k)]);
      boundary.insert(bl[bl.size() - 1 - static_cast<size_t>(k)]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& nm = table[i].name;
    prot[i] = is_protected_output(nm) || is_router_or_shared(split_dots(nm), nm) || boundary.count(block_index(nm)) > 0;
  }

  // 3. Init.
  std::vector<int> bits(n, b0);

  // 4. Block floor on the raw table.
  if (opts.n_floor_per_block > 0 && cand.size() >= 2) {
    std::map<int, std::vector<size_t>> by_block;
    for (size_t i = 0; i < n; ++i) {
      const int bi = block_index_regex(table[i].name);
      if (bi >= 0) by_block[bi].push_back(i);
    }
    for (auto& [bi, idx] : by_block) {
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        return sort_key(get(table[a].kl, b0)) > sort_key(get(table[b].kl, b0));
      });
      std::vector<size_t> attn;
      for (size_t i : idx)
        if (is_attention_component(split_dots(table[i].name).back())) attn.push_back(i);
      const int na = static_cast<int>(attn.size());
      const int reserve = std::min(opts.n_floor_per_block, na >= 4 ? 2 : na > 0 ? 1 : 0);
      const int floor = na >= 4 ? opts.n_floor_per_block : std::min(opts.n_floor_per_block, 1);
      std::vector<size_t> picks(attn.begin(), attn.begin() + std::min(reserve, na));
      for (size_t i : idx) {
        if (static_cast<int>(picks.size()) >= floor) break;
        if (std::find(picks.begin(), picks.end(), i) == picks.end()) picks.push_back(i);
      }
      for (size_t i : picks)
        if (bits[i] < b1) bits[i] = b1;
    }
  }

  // 5. NaN cleanup -> cleaned table.
  // larder deviation: maxFinite is the largest finite value of the whole table (not of the layer),
  // so a NaN layer outranks every finite one; a per-layer maximum of 0 (e.g. {4: NaN, 8: 0}) would
  // otherwise make it look insensitive.
  double table_max = -std::numeric_limits<double>::infinity();
  for (const auto& m : table)
    for (const auto& [b, v] : m.kl)
      if (std::isfinite(v)) table_max = std::max(table_max, v);
  if (!(table_max > 0)) table_max = 1e6;
  std::vector<std::map<int, double>> sens(n);
  for (size_t i = 0; i < n; ++i) {
    sens[i] = table[i].kl;
    bool any_nan = false;
    for (const auto& [b, v] : sens[i]) any_nan |= std::isnan(v);
    if (!any_nan) continue;
    const double max_finite = table_max;
    for (auto& [b, v] : sens[i])
      if (std::isnan(v)) v = max_finite * 10.0 * (static_cast<double>(bmax) / std::max(b, 1));
  }

  // 6-8. Greedy upgrades.
  const double mult_protected = 100.0;
  auto eff_sens = [&](size_t i, int b) { return get(sens[i], b) * (prot[i] ? mult_protected : 1.0); };
  using Step = std::tuple<double, std::string, int, int, double, size_t>;  // (-eff, name, c, next, benefit, index)
  std::priority_queue<Step, std::vector<Step>, std::greater<Step>> heap;
  auto push_step = [&](size_t i) {
    const int c = bits[i], nx = next_of(i, c);
    if (nx < 0) return;
    const double sc = eff_sens(i, c), sn = eff_sens(i, nx);
    const double benefit = sn > sc ? sn - sc : sc - sn;
    if (!(benefit > 0)) return;
    const double cost = (cost_of(i, nx) - cost_of(i, c)) * static_cast<double>(table[i].params);
    heap.emplace(-(benefit / std::max(cost, 1.0)), table[i].name, c, nx, benefit, i);
  };
  long double total_params = 0, bit_params = 0;
  for (size_t i = 0; i < n; ++i) {
    total_params += table[i].params;
    bit_params += static_cast<long double>(cost_of(i, bits[i])) * table[i].params;
  }
  auto bpw = [&] { return static_cast<double>(bit_params / std::max<long double>(total_params, 1)); };
  for (size_t i = 0; i < n; ++i) push_step(i);
  while (!heap.empty() && bpw() < opts.target_bpw) {
    const Step s = heap.top();
    heap.pop();
    const size_t i = std::get<5>(s);
    if (bits[i] != std::get<2>(s)) continue;  // stale
    bit_params += static_cast<long double>(cost_of(i, std::get<3>(s)) - cost_of(i, bits[i])) * table[i].params;
    bits[i] = std::get<3>(s);
    push_step(i);
  }
  if (bpw() < opts.target_bpw)
    return invalid_argument(strfmt("[allocator] target %.4g bits per weight is unreachable: the greedy allocation stops at "
                                   "%.4g (no remaining upgrade lowers the sensitivity; candidates %d..%d)",
                                   opts.target_bpw, bpw(), b0, bmax));

  // 9. Block-run guard.
  if (opts.max_low_bit_run > 0 && cand.size() >= 2) {
    std::map<int, std::vector<size_t>> by_block;
    for (size_t i = 0; i < n; ++i) {
      const int bi = block_index_regex(table[i].name);
      if (bi >= 0) by_block[bi].push_back(i);
    }
    std::vector<int> order;
    std::vector<bool> low;
    for (const auto& [bi, idx] : by_block) {
      size_t nl = 0;
      for (size_t i : idx) nl += bits[i] == b0;
      order.push_back(bi);
      low.push_back(2 * nl > idx.size());
    }
    const size_t stride = static_cast<size_t>(std::max(1, opts.max_low_bit_run));
    for (size_t s = 0; s < order.size();) {
      if (!low[s]) {
        ++s;
        continue;
      }
      size_t e = s;
      while (e < order.size() && low[e]) ++e;
      if (e - s > static_cast<size_t>(opts.max_low_bit_run)) {
        for (size_t p = s; p < e; p += stride) {
          std::vector<size_t> idx;
          for (size_t i : by_block[order[p]])
            if (bits[i] == b0) idx.push_back(i);
          std::stable_sort(idx.begin(), idx.end(),
                           [&](size_t a, size_t b) { return get(sens[a], b0) > get(sens[b], b0); });
          if (!idx.empty()) {
            bit_params += static_cast<long double>(cost_of(idx[0], b1) - cost_of(idx[0], b0)) * table[idx[0]].params;
            bits[idx[0]] = b1;
          }
        }
      }
      s = e;
    }
  }

  // 10. Result.
  for (size_t i = 0; i < n; ++i) {
    plan.modules.push_back({table[i].name, bits[i], opts.group_size, table[i].params});
    plan.n_high += bits[i] == bmax;
    plan.n_low += bits[i] == b0;
    plan.estimated_mb += cost_of(i, bits[i]) * static_cast<double>(table[i].params) / 8.0 / 1048576.0;
  }
  plan.achieved_bpw = bpw();
  return plan;
}

}  // namespace larder::quant
