// filters.h — names of jinja2's builtin filters and tests. jinja2 resolves them when the template
// is compiled, so an unknown name is an error even in a branch that never runs.
#pragma once

#include <set>
#include <string>

namespace larder::chat_template {

const std::set<std::string>& known_filters();        // every jinja2 builtin filter, plus HF's tojson
const std::set<std::string>& unsupported_filters();  // jinja2 builtins this engine does not implement
const std::set<std::string>& known_tests();

}  // namespace larder::chat_template
