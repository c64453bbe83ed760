#include "larder/formats/model_files.h"
#include "larder/formats/safetensors.h"

namespace larder::formats {

using nlohmann::ordered_json;

Result<ordered_json> read_json_file(const std::string& path) {
  LARDER_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  try {
    return ordered_json::parse(text);
  } catch (const ordered_json::parse_error& e) {
    return corrupt(strfmt("[config] %s: invalid JSON: %s", path.c_str(), e.what()));
  }
}

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// tokenizer_config.chat_template is a string, or a list of {"name", "template"} (the "default"
// entry is the chat template; "tool_use" etc. are alternatives).
std::string template_from_tokenizer_config(const ordered_json& tc) {
  if (!tc.is_object() || !tc.contains("chat_template")) return "";
  const auto& t = tc["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& e : t) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    }
    for (const auto& e : t) {
      if (e.is_object() && e.contains("template") && e["template"].is_string()) return e["template"].get<std::string>();
    }
  }
  return "";
}

}  // namespace

Result<ModelFiles> open_model_files(const std::string& path_in, const OpenOptions& opts) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  ModelFiles m;
  m.path = path;
  if (!file_exists(path)) return not_found(strfmt("[model] %s: no such file or directory", path.c_str()));

  if (!is_directory(path)) {
    if (!ends_with(path, ".gguf")) {
      return invalid_argument(strfmt("[model] %s: expected a model directory or a .gguf file", path.c_str()));
    }
    m.source = ModelSource::kGguf;
    LARDER_ASSIGN_OR_RETURN(auto g, GgufFile::open(path, opts.weights ? opts.map_mode : MapMode::kMap));
    m.gguf = std::move(g);
    if (auto t = m.gguf->get_string("tokenizer.chat_template")) {
      m.chat_template = *t;
      m.chat_template_source = "GGUF tokenizer.chat_template";
    }
    return m;
  }

  m.source = ModelSource::kHfDir;
  const std::string config_path = path + "/config.json";
  if (file_exists(config_path)) {
    LARDER_ASSIGN_OR_RETURN(m.config, read_json_file(config_path));
    if (!m.config.is_object()) return corrupt(strfmt("[config] %s: top level is not an object", config_path.c_str()));
  } else if (opts.weights) {
    return not_found(strfmt("[model] %s: no config.json (not a Hugging Face model directory)", path.c_str()));
  }
  if (file_exists(path + "/generation_config.json")) {
    LARDER_ASSIGN_OR_RETURN(m.generation_config, read_json_file(path + "/generation_config.json"));
  }
  if (file_exists(path + "/tokenizer_config.json")) {
    LARDER_ASSIGN_OR_RETURN(m.tokenizer_config, read_json_file(path + "/tokenizer_config.json"));
  }
  if (file_exists(path + "/tokenizer.json")) m.tokenizer_json_path = path + "/tokenizer.json";
  if (file_exists(path + "/chat_template.jinja")) {
    LARDER_ASSIGN_OR_RETURN(m.chat_template, read_text_file(path + "/chat_template.jinja"));
    m.chat_template_source = "chat_template.jinja";
  } else if (file_exists(path + "/chat_template.json")) {
    LARDER_ASSIGN_OR_RETURN(auto ct, read_json_file(path + "/chat_template.json"));
    m.chat_template = template_from_tokenizer_config(ct);
    m.chat_template_source = "chat_template.json";
  } else {
    m.chat_template = template_from_tokenizer_config(m.tokenizer_config);
    m.chat_template_source = "tokenizer_config.json";
  }
  if (m.chat_template.empty()) m.chat_template_source.clear();
  if (opts.weights) {
    LARDER_ASSIGN_OR_RETURN(auto set, open_safetensors_dir(path, opts.map_mode));
    m.hf_tensors = std::make_shared<TensorSet>(std::move(set));
  }
  return m;
}

}  // namespace larder::formats
