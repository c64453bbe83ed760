// lexer.h — splits a template into data and tag tokens the way jinja2's lexer does with
// Hugging Face's settings (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace larder::chat_template {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // data text, name, decoded string literal, or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

// Throws TemplateError (kSyntax) naming line:col on malformed input.
std::vector<Token> lex(std::string_view source);

}  // namespace larder::chat_template
