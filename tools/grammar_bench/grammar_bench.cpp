// grammar_bench — what constrained decoding (runtime/grammar.h) costs per schema and per token,
// measured on the exact calls the engine makes: GrammarEngine::compile once per schema (cold: each
// schema is new to the cache), then for every token of a recorded answer ConstraintMatcher::mask
// over a logits row of the model's vocabulary followed by accept.
//
//   grammar_bench MODEL CASES.jsonl [--repeat N]
//
// CASES.jsonl: one {"schema": {...}, "text": "..."} per line (the answers a run of
// tests/server/schema_corpus.py wrote; bench/grammar_bench.py makes them). The text is tokenized
// with the model's tokenizer; a token the grammar rejects ends that case (counted).
// Prints JSON: compile ms (p50, p99, max, sum), mask µs per token (p50, p90, p99, max, mean),
// accept µs per token (p50, p99), the vocabulary size, and the counts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "larder/runtime/grammar.h"
#include "larder/runtime/loaded_model.h"

using namespace larder;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

double us(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: grammar_bench MODEL CASES.jsonl [--repeat N]\n");
    return 2;
  }
  int repeat = 1;
  for (int i = 3; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
  auto lm = runtime::load_model(argv[1]);
  if (!lm.is_ok()) {
    std::fprintf(stderr, "grammar_bench: %s\n", lm.status().message().c_str());
    return 1;
  }
  runtime::LoadedModel& m = **lm;
  const int64_t V = m.model->info().vocab;
  std::ifstream in(argv[2]);
  if (!in) {
    std::fprintf(stderr, "grammar_bench: cannot read %s\n", argv[2]);
    return 1;
  }
  m.grammar->vocabulary();  // the one-time vocabulary export, not part of any schema's compile
  std::vector<double> compile_ms, mask_us, accept_us;
  int cases = 0, refused = 0, rejected = 0;
  std::vector<float> logits(static_cast<size_t>(V));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::ordered_json::parse(line);
    ++cases;
    const auto t0 = Clock::now();
    auto compiled = m.grammar->compile({runtime::ConstraintSpec::Kind::kJsonSchema, c["schema"].dump(), true});
    const auto t1 = Clock::now();
    if (!compiled.is_ok()) {
      ++refused;
      continue;
    }
    compile_ms.push_back(us(t0, t1) / 1000.0);
    const std::vector<int32_t> ids = m.tokenizer->encode(c["text"].get<std::string>(), false);
    for (int r = 0; r < repeat; ++r) {
      runtime::ConstraintMatcher cm(*compiled);
      for (size_t i = 0; i <= ids.size(); ++i) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const auto a = Clock::now();
        cm.mask(logits.data(), V);
        const auto b = Clock::now();
        mask_us.push_back(us(a, b));
        if (i == ids.size()) break;  // the mask before EOS is a step too
        const bool ok = cm.accept(ids[i]);
        accept_us.push_back(us(b, Clock::now()));
        if (!ok) {
          ++rejected;
          break;
        }
      }
    }
  }
  double mean = 0;
  for (double x : mask_us) mean += x;
  mean /= std::max<size_t>(1, mask_us.size());
  double csum = 0;
  for (double x : compile_ms) csum += x;
  nlohmann::ordered_json out = {
      {"model", argv[1]},
      {"vocab", V},
      {"cases", cases},
      {"refused", refused},
      {"rejected_texts", rejected},
      {"compile_ms", {{"n", compile_ms.size()}, {"p50", pct(compile_ms, 50)}, {"p99", pct(compile_ms, 99)},
                      {"max", pct(compile_ms, 100)}, {"sum", csum}}},
      {"mask_us", {{"n", mask_us.size()}, {"p50", pct(mask_us, 50)}, {"p90", pct(mask_us, 90)},
                   {"p99", pct(mask_us, 99)}, {"max", pct(mask_us, 100)}, {"mean", mean}}},
      {"accept_us", {{"p50", pct(accept_us, 50)}, {"p99", pct(accept_us, 99)}}},
  };
  std::cout << out.dump(1) << "\n";
  return 0;
}
