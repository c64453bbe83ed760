// webui.h — the browser chat page served at GET / (web/: index.html, app.css, markdown.js,
// app.js). The files are embedded at build time (embed_web.cmake writes webui_assets.cpp), so
// the page needs nothing from disk or the network; its Content-Security-Policy forbids any
// load from elsewhere. `serve --no-webui` turns it off (GET / then answers the JSON index only).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace larder::server {

struct WebAsset {
  std::string_view name;          // "index.html", "app.js", ...
  std::string_view content_type;
  std::string_view body;
};

// Every embedded file (generated source).
const std::vector<WebAsset>& web_assets();

// The file named `name` ("app.js"), or nullptr.
const WebAsset* find_web_asset(std::string_view name);

// True when a GET / should get the page rather than the JSON index: a browser navigation
// (its Accept header names text/html). API clients (Accept: */* or application/json) keep the
// JSON index.
bool wants_html(const std::string& accept);

// The security headers every page response carries: the CSP allows scripts, styles and
// fetches from this server only (no inline script, no remote origin), no framing, no sniffing.
const std::vector<std::pair<std::string, std::string>>& web_security_headers();

}  // namespace larder::server
