#include "larder/tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "larder/tokenizer/utf8.h"

namespace larder::tokenizer {

namespace {
void init_onig() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
  });
}

// RAII for the per-search match region.
struct Region {
  OnigRegion* r = onig_region_new();
  ~Region() { onig_region_free(r, 1); }
};
}  // namespace

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  init_onig();
  regex_t* re = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  // Ruby syntax with no options is what the `onig` crate (used by HF tokenizers) defaults to.
  const int rc = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_RUBY, &einfo);
  if (rc != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, rc, &einfo);
    return invalid_argument(strfmt("[tokenizer] regex '%.*s': %s", static_cast<int>(pattern.size()),
                                   pattern.data(), reinterpret_cast<const char*>(msg)));
  }
  std::shared_ptr<Regex> out(new Regex());
  out->re_ = re;
  out->pattern_ = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(out));
}

Regex::~Regex() {
  if (re_) onig_free(static_cast<regex_t*>(re_));
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  if (s.empty()) return;
  Region region;
  auto* re = static_cast<regex_t*>(re_);
  const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
  const OnigUChar* end = str + s.size();
  size_t pos = 0;
  while (pos <= s.size()) {
    const int r = onig_search(re, str, end, str + pos, end, region.r, ONIG_OPTION_NONE);
    if (r < 0) break;  // ONIG_MISMATCH (or an engine error: treat as no further match)
    const auto b = static_cast<size_t>(region.r->beg[0]);
    const auto e = static_cast<size_t>(region.r->end[0]);
    if (e == b) {
      // Empty match: step over one character so the scan always advances.
      if (b >= s.size()) break;
      pos = b + utf8::lead_len(static_cast<unsigned char>(s[b]));
      continue;
    }
    out.emplace_back(b, e);
    pos = e;
  }
}

}  // namespace larder::tokenizer
