// api_native.h — llama-server's native response shapes (POST /completion), for tools written
// against llama-server. Requests parse like /v1/completions (parse_completion accepts
// n_predict); only the answer differs: {content, stop, stop_type, tokens_predicted, timings, …},
// and a stream of `data: {content, stop:false}` events ending with the full object (no [DONE]).
#pragma once

#include <string>

#include "larder/server/api.h"

namespace larder::server {

// The final object (non-stream body, or the last stream event with content "").
ordered_json native_completion_body(const ServedModel& sm, const ParsedRequest& pr, const Outcome& o,
                                    const std::string& content);
// One stream event for engine event `e` ("" when it carries nothing).
std::string native_stream_frame(const Event& e);

}  // namespace larder::server
