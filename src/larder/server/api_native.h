// api_native.h — llama-server's native completion (POST /completion, and /completions as
// llama-server routes it), for tools written against llama-server. Requests parse like
// /v1/completions (parse_completion: prompt strings, token ids, mixed, lists; n_predict) plus
// llama-server's n_probs and post_sampling_probs; the answer is llama-server's object
// {index, content, stop, stop_type, tokens_predicted, timings, completion_probabilities, …},
// a JSON array of them for a list of prompts, and a stream of `data: {index, content, tokens,
// stop: false, …}` events ending with each result's full object (no [DONE]).
#pragma once

#include <memory>

#include "larder/server/api.h"

namespace larder::server {

class ResponseWriter;

// The most alternatives n_probs may ask for per token.
inline constexpr int kMaxNProbs = 1000;

// Throws ApiError on invalid input.
ParsedRequest parse_native_completion(const ServedModel& sm, const ordered_json& body);

// The writer of one result (set_index(i) for the i-th of several): body() is the final object,
// stream_frames() the events.
std::unique_ptr<ResponseWriter> make_native_writer(const ServedModel& sm, const ParsedRequest& pr);

}  // namespace larder::server
