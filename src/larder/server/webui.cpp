#include "larder/server/webui.h"

namespace larder::server {

const WebAsset* find_web_asset(std::string_view name) {
  for (const WebAsset& a : web_assets())
    if (a.name == name) return &a;
  return nullptr;
}

bool wants_html(const std::string& accept) {
  // Case-insensitive search for the media type; q-values are not weighed (a browser's
  // navigation lists text/html first, API clients do not list it at all).
  std::string a = accept;
  for (char& c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return a.find("text/html") != std::string::npos;
}

const std::vector<std::pair<std::string, std::string>>& web_security_headers() {
  static const std::vector<std::pair<std::string, std::string>> h = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
      // Rebuilt binaries serve new files under the same names: revalidate every time.
      {"Cache-Control", "no-cache"},
  };
  return h;
}

}  // namespace larder::server
