// sampler.h — logits processors and token sampling.
//
// Pipeline for one step (mlx-lm's order, which llama.cpp's default chain agrees with):
//   1. logit_bias: logits[id] += bias
//   2. repetition penalty over the last repetition_context_size history tokens (HF / CTRL):
//      each distinct seen token's logit is divided by the penalty if positive, multiplied if not
//   3. presence penalty (OpenAI): −presence_penalty once per distinct token in its window
//   4. frequency penalty (OpenAI): −frequency_penalty × occurrences in its window
//   5. temperature == 0: argmax (lowest id on ties). Otherwise the candidate set is the shortest
//      prefix of the tokens ranked by probability (at temperature 1) that satisfies top_k,
//      top_p (cumulative mass ≥ top_p) and min_p (p ≥ min_p · p_max) — the three filters
//      keep prefixes of one ranking, so their order does not matter — and a token is drawn from
//      the candidates with weights exp(logit / temperature).
// Filters see the untempered distribution (as mlx-lm and llama.cpp do), so temperature changes
// how the kept mass is shared, not which tokens are kept. A NaN logit is never a candidate.
//
// Cost: one row is 49k–262k logits, sampled on the engine thread between forwards while the rest
// of the pool waits, so each step is a vectorised pass (kernels::argmax, sum_exp,
// select_at_least) and only the ranked prefix the filters keep is sorted: 13–66 µs per token on
// Zen 5, where a double-precision pass and a sort of the vocabulary took 0.7–4.4 ms.
//
// Randomness is counter-based: the uniform draw of step s is a pure function of (seed, s), so the
// same seed gives the same tokens whatever else runs, however requests are batched, and a
// resumed generation can continue at any step.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace larder::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // off unless 0 < top_p < 1
  float min_p = 0.0f;        // off at 0
  int top_k = 0;             // off at 0
  float repetition_penalty = 1.0f;  // off at 1
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // History windows in tokens (server-api.md §3: 20 by default; 0 = the whole history).
  int repetition_context_size = 20;
  int presence_context_size = 20;
  int frequency_context_size = 20;
  std::map<int32_t, float> logit_bias;  // ids outside the vocabulary are ignored
  uint64_t seed = 0;
};

// The uniform double in [0, 1) for (seed, step): splitmix64 finalizers over the pair.
double counter_uniform(uint64_t seed, uint64_t step);

// One generated token's reported distribution (logprobs, llama-server's n_probs).
struct TokenLogprobs {
  int32_t id = 0;
  float logprob = 0;                               // of `id`
  std::vector<std::pair<int32_t, float>> top;      // the k most likely, descending (ties: lower id)
  bool linear = false;  // the values are probabilities, not logs (Sampler::post_sampling_probs)
};

class Sampler {
 public:
  explicit Sampler(SamplingParams p) : p_(std::move(p)) {}
  const SamplingParams& params() const { return p_; }

  // Processes `logits` in place (steps 1–4) and picks a token (step 5) using draw `step()`, then
  // advances the step. `history`: the tokens so far (prompt + generated), oldest first.
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  // The same with an explicit step.
  int32_t sample_at(float* logits, int64_t vocab, const std::vector<int32_t>& history, uint64_t step) const;

  uint64_t step() const { return step_; }
  void set_step(uint64_t s) { step_ = s; }

  // Step 5 alone, on logits already processed (steps 1–4): lets the caller read the processed
  // distribution (logprobs) without processing twice. sample_at == process + pick.
  int32_t pick(const float* processed, int64_t vocab, uint64_t step) const;

  // Steps 1–4 alone (exposed for tests and for logprob reporting).
  void process(float* logits, int64_t vocab, const std::vector<int32_t>& history) const;
  // Step 5's candidate set for processed logits: token ids, most probable first.
  std::vector<int32_t> candidates(const float* logits, int64_t vocab) const;
  // The distribution pick() draws from (after the filters and temperature) for processed logits:
  // the probability of `id` and the k most probable candidates, zero-probability ones left out —
  // llama-server's `post_sampling_probs`. Greedy (temperature 0) is the argmax with probability 1.
  // The values are probabilities (TokenLogprobs::linear is set).
  TokenLogprobs post_sampling_probs(const float* processed, int64_t vocab, int32_t id, int k) const;

 private:
  SamplingParams p_;
  uint64_t step_ = 0;
};

// Log-probabilities of the processed distribution (full-vocabulary log-softmax after the logits
// processors, before filters and temperature — mlx_lm.server's semantics, server-api.md §4.4).
TokenLogprobs token_logprobs(const float* processed, int64_t vocab, int32_t id, int k);

}  // namespace larder::runtime
