// eval.h — quality measurement for quantized models (design/quantization.md §10): perplexity
// over fixed chunks of a token stream, KL divergence of a candidate against a base model on the
// same chunks, top-1 agreement, and a greedy-generation sanity check.
//
// The chunking and scoring follow llama.cpp's llama-perplexity so numbers are comparable in
// kind (never across tokenizers or contexts): the text tokenized as one document (BOS first when
// the tokenizer adds one), non-overlapping chunks of n_ctx, each chunk's first token overwritten
// with BOS, and only the second half of each chunk scored, so every scored position has at least
// n_ctx/2 tokens of context.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "larder/core/status.h"
#include "larder/models/model.h"

namespace larder::tokenizer {
class Tokenizer;
}

namespace larder::runtime {

struct LoadedModel;

// ---- per-position math (f32 logits in, double out) ----------------------------------------

// KL(ref ‖ cand) = Σ p_ref (log p_ref − log p_cand), log-softmax of each side through its own
// logsumexp, accumulated in double. Terms with p_ref == 0 contribute 0 (limit of p log p), so the
// result is finite for finite logits; +inf only where p_ref > 0 but p_cand underflows to 0
// (a logit gap beyond what a double log-probability can represent). Never negative.
double kl_divergence_logits(const float* ref_logits, const float* cand_logits, int64_t vocab);

// −log softmax(logits)[target], in double.
double token_nll(const float* logits, int64_t vocab, int32_t target);

// softmax(logits)[target], in double.
double token_prob(const float* logits, int64_t vocab, int32_t target);

// Index of the largest logit (the first one on ties).
int32_t argmax_logits(const float* logits, int64_t vocab);

// The stream llama-perplexity cuts into chunks: the text tokenized with special tokens
// (common_tokenize(text, add_special = true)), i.e. BOS first when the tokenizer adds one. The
// BOS matters beyond chunk 0: without it every chunk starts one token later in the text, and on
// Gemma 3 that alone moved PPL by 1-2 % against llama-perplexity (issue 13). `bos` is the BOS
// the tokenizer adds (nullopt when it adds none: SmolLM2, Qwen), which the chunks then start with.
struct EvalStream {
  std::vector<int32_t> ids;
  std::optional<int32_t> bos;
};
EvalStream make_eval_stream(const tokenizer::Tokenizer& tok, const std::string& text);

// The BOS the tokenizer adds when encoding with special tokens (nullopt when it adds none).
// make_eval_stream and the quantizer's calibration stream (quant/sensitivity.cpp) both start
// with it, and overwrite each chunk's first token with it, so sensitivity is measured on the
// same kind of sequences `larder eval` scores.
std::optional<int32_t> added_bos(const tokenizer::Tokenizer& tok);

// Non-overlapping chunks of n_ctx tokens from the start of `stream` (a trailing partial chunk
// is dropped), at most max_chunks of them (<= 0: all). With `bos`, each chunk's first token is
// overwritten with it (llama.cpp convention: every chunk starts like a document). Errors: n_ctx
// < 2, or a stream shorter than n_ctx.
Result<std::vector<std::vector<int32_t>>> make_eval_chunks(const std::vector<int32_t>& stream, int64_t n_ctx,
                                                           int64_t max_chunks, std::optional<int32_t> bos);

// The scored positions of a chunk of n tokens: logits at [first, n−1) predict tokens
// [first+1, n), first = n/2.
inline int64_t eval_first_scored(int64_t n_ctx) { return n_ctx / 2; }
inline int64_t eval_scored_per_chunk(int64_t n_ctx) { return n_ctx - 1 - n_ctx / 2; }

// ---- runners --------------------------------------------------------------------------------

// Called after each chunk with running values over the chunks so far.
struct EvalProgress {
  int64_t chunk = 0;     // 1-based, chunks done
  int64_t n_chunks = 0;
  double ppl = 0;        // running perplexity (the base model's, for KL runs)
  double cand_ppl = 0;   // KL runs: running perplexity of the candidate
  double kl_mean = 0;    // KL runs: running mean KL
  double seconds = 0;    // since the run started
};
using EvalProgressFn = std::function<void(const EvalProgress&)>;

struct PplResult {
  double ppl = 0;       // exp(mean_nll)
  double ppl_err = 0;   // ppl · SE(nll): the standard error propagated through exp (delta method)
  double mean_nll = 0;
  double nll_se = 0;    // standard error of the per-token NLL mean, sqrt(var / (N − 1))
  int64_t n_tokens = 0;  // scored tokens
  int64_t n_chunks = 0;
};

// Perplexity of `model` over `chunks` (all of one length <= the model's context). One cache,
// cleared between chunks, so each chunk is scored from an empty context. `adapters`: LoRA adapters
// on every row (runtime/adapters.h; `larder eval ppl --lora`).
Result<PplResult> eval_perplexity(models::Model& model, const std::vector<std::vector<int32_t>>& chunks,
                                  const EvalProgressFn& progress = {},
                                  std::span<const models::AdapterUse> adapters = {});

struct KlResult {
  int64_t n_tokens = 0;  // scored positions
  int64_t n_chunks = 0;
  // KL(base ‖ candidate) per position.
  double mean = 0, mean_se = 0;  // SE = sqrt(var / (N − 1))
  double median = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // percentiles with linear interpolation
  // Teacher-forced same-argmax rate and its binomial error sqrt(p(1−p)/(N−1)).
  double top1 = 0, top1_err = 0;
  // ln(PPL_cand / PPL_base) = mean NLL difference.
  double ln_ppl_ratio = 0;
  // Δp = p_cand(correct token) − p_base(correct token): mean and root mean square.
  double mean_dp = 0, rms_dp = 0;
  PplResult base, cand;
};

// KL statistics of `cand` against `base` on the same chunks (same vocabulary required).
// `cand_adapters`: LoRA adapters on the candidate's rows (`larder eval kl BASE BASE --lora X`: the
// adapter's KL against its base).
Result<KlResult> eval_kl(models::Model& base, models::Model& cand, const std::vector<std::vector<int32_t>>& chunks,
                         const EvalProgressFn& progress = {},
                         std::span<const models::AdapterUse> cand_adapters = {});

// Linear-interpolation percentile (numpy's default) of an ascending-sorted vector, q in [0, 100].
double sorted_percentile(const std::vector<double>& sorted, double q);

// ---- greedy generation sanity (§10.3 identical prefix, §10.4 short generations) ------------

struct SanityPrompt {
  std::string prompt;
  std::vector<int32_t> base_tokens, cand_tokens;  // greedy continuations (EOS excluded)
  std::string base_text, cand_text;
  int64_t identical_prefix = 0;  // leading tokens the two continuations share
  bool collapsed = false;        // candidate: one token repeated, or far shorter than the base
};

struct SanityResult {
  std::vector<SanityPrompt> prompts;
  int64_t max_new_tokens = 0;
  int64_t base_short = 0, cand_short = 0;  // generations shorter than 8 tokens
  double mean_identical_prefix = 0;
  int64_t collapsed = 0;                   // prompts with the collapse flag
};

// The collapse flag of one prompt: the candidate's continuation ends in one token repeated (its
// last min(length, 16) tokens, length >= 8) where the base's does not, or it is under a quarter
// of the base's length when the base ran to at least 16 tokens (EOS far too early).
bool generation_collapsed(const std::vector<int32_t>& base, const std::vector<int32_t>& cand);

// The fixed built-in prompts (raw text, no chat template).
const std::vector<std::string>& sanity_prompts();

// Greedy-generates up to max_new_tokens from each built-in prompt on both models, prompts
// encoded with the base tokenizer (with its special tokens, as `larder generate` does), stopping
// at the base model's EOS ids.
Result<SanityResult> eval_sanity(LoadedModel& base, LoadedModel& cand, int64_t max_new_tokens = 64);

}  // namespace larder::runtime
