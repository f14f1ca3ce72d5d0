#include "apps/transformer/chat_template.h"
#include "apps/transformer/file_contents.h"

#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>

#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/utf8.h"
#include "core/error.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormats = "llama3, chatml or mistral";

// Python's str.isspace, which the templates' `trim` (str.strip) uses.
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string trim(const std::string& s) {
  size_t begin = 0, end = 0;  // [begin, end): from the first to past the last non-space
  bool seen = false;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const uint32_t c = utf8::next(s, i);
    if (is_space(c)) continue;
    if (!seen) begin = at, seen = true;
    end = i;
  }
  return seen ? s.substr(begin, end - begin) : std::string();
}

// A special token as tokenizer_config.json writes it: a string or {"content": ...}.
std::string token_text(const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const json& v = config[key];
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return v.is_string() ? v.get<std::string>() : "";
}

// The template text: chat_template.jinja, else tokenizer_config.json's chat_template (a string,
// or a list of named templates of which "default" is used); "" when there is none.
std::string template_text(const fs::path& dir, const json& config, const std::string& config_file) {
  if (WEFT_FS(fs::exists(dir / "chat_template.jinja"))) return read_file((dir / "chat_template.jinja").string());
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const json& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return named["template"].get<std::string>();
  throw Error(fmt::format("transformer: {}: \"chat_template\" is neither a string nor a list holding a \"default\" "
                          "template", config_file));
}

// chatml's default system message: the literal '<|im_start|>system\n...<|im_end|>' a template
// writes when the conversation has none ("" when it writes none).
std::string default_system(const std::string& text) {
  const std::string open = "<|im_start|>system\\n", close = "<|im_end|>";
  for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
    const size_t begin = at + open.size(), end = text.find(close, begin);
    if (end == std::string::npos) break;
    const std::string body = text.substr(begin, end - begin);
    if (!body.empty() && body.find_first_of("'\"{}+") == std::string::npos) return body;
  }
  return "";
}

[[noreturn]] void no_place(const ChatTemplate& t, size_t i, const std::string& role, const char* roles) {
  throw Error(fmt::format("message {}: role \"{}\": the {} chat template has no place for it (it has {})", i, role,
                          chat_format_name(t.format), roles));
}

ChatFormat recognise(const std::string& text, const std::string& where) {
  auto has = [&](const char* s) { return text.find(s) != std::string::npos; };
  if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    WEFT_CHECK(!has("Cutting Knowledge Date"), "transformer: {}: a Llama 3.1+ template (a dated system header): "
               "not recognised; --chat-format llama3 renders Llama 3's form without it", where);
    return ChatFormat::llama3;
  }
  if (has("<|im_start|>") && has("<|im_end|>")) return ChatFormat::chatml;
  if (has("'[INST] ' + message['content'] + ' [/INST]'") && !has("<<SYS>>")) return ChatFormat::mistral;
  const std::string start = text.substr(0, 120);
  throw Error(fmt::format("transformer: {}: a chat template weft does not recognise (it knows {}; the template "
                          "begins \"{}\"): pass --chat-format NAME to render one of them", where, kFormats, start));
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::mistral: return "mistral";
  }
  return "?";
}

ChatFormat parse_chat_format(const std::string& name) {
  for (ChatFormat f : {ChatFormat::llama3, ChatFormat::chatml, ChatFormat::mistral})
    if (name == chat_format_name(f)) return f;
  throw Error(fmt::format("transformer: --chat-format {}: not a chat format (use {})", name, kFormats));
}

ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& forced) {
  const fs::path dir = fs::path(tokenizer_json_path(tokenizer_path)).parent_path();
  const std::string config_file = (dir / "tokenizer_config.json").string();
  json config = json::object();
  if (WEFT_FS(fs::exists(config_file))) config = read_json_object(config_file);
  ChatTemplate t;
  const std::string text = template_text(dir, config, config_file);
  if (!forced.empty()) {
    t.format = parse_chat_format(forced);
  } else {
    WEFT_CHECK(!text.empty(), "transformer: chat messages need a chat template, and {} has none (no "
               "chat_template.jinja, no \"chat_template\" in tokenizer_config.json): pass --chat-format {}",
               dir.string(), kFormats);
    t.format = recognise(text, config_file);
  }
  t.bos = token_text(config, "bos_token");
  t.eos = token_text(config, "eos_token");
  if (t.format == ChatFormat::llama3 && t.bos.empty()) t.bos = "<|begin_of_text|>";
  if (t.format == ChatFormat::mistral && t.bos.empty()) t.bos = "<s>";
  if (t.format == ChatFormat::mistral && t.eos.empty()) t.eos = "</s>";
  if (t.format == ChatFormat::chatml) t.default_system = default_system(text);
  return t;
}

std::vector<TextPiece> render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  WEFT_CHECK(!messages.empty(), "\"messages\" is empty");
  std::vector<TextPiece> out;
  auto piece = [&](std::string text, bool trained) { out.push_back({std::move(text), trained}); };
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const bool assistant = role == "assistant";
    switch (t.format) {
      case ChatFormat::llama3:
        if (role != "system" && role != "user" && !assistant) no_place(t, i, role, "system, user and assistant");
        piece((i == 0 ? t.bos : "") + "<|start_header_id|>" + role + "<|end_header_id|>\n\n", false);
        piece(trim(messages[i].content) + "<|eot_id|>", assistant);
        break;
      case ChatFormat::chatml:
        if (role != "system" && role != "user" && !assistant) no_place(t, i, role, "system, user and assistant");
        if (i == 0 && role != "system" && !t.default_system.empty())
          piece("<|im_start|>system\n" + t.default_system + "<|im_end|>\n", false);
        piece("<|im_start|>" + role + "\n", false);
        piece(messages[i].content + "<|im_end|>", assistant);
        piece("\n", false);
        break;
      case ChatFormat::mistral:
        if (role != "user" && !assistant) no_place(t, i, role, "user and assistant, alternating");
        if ((role == "user") != (i % 2 == 0))
          throw Error(fmt::format("message {}: role \"{}\": the mistral chat template needs the roles to alternate "
                                  "user, assistant, user, ...", i, role));
        if (assistant) piece(messages[i].content + t.eos, true);
        else piece((i == 0 ? t.bos : "") + "[INST] " + messages[i].content + " [/INST]", false);
        break;
    }
  }
  return out;
}

}  // namespace weft::apps
