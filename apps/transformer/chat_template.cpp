#include "apps/transformer/chat_template.h"
#include "apps/transformer/file_contents.h"

#include <cctype>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>

#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/utf8.h"
#include "core/error.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormats = "llama3, chatml, qwen3 or mistral";

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
// or a list of named templates of which "default" is used); "" when there is none. `where`: its file.
std::string template_text(const fs::path& dir, const json& config, std::string& where) {
  const std::string config_file = where;
  if (WEFT_FS(fs::exists(dir / "chat_template.jinja"))) {
    where = (dir / "chat_template.jinja").string();
    return read_file(where);
  }
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

// A Jinja string literal at text[at] (its quote): its value with Python's escapes undone, as
// jinja2 reads it; `at` is left past the closing quote.
std::string jinja_string(const std::string& text, size_t& at, const std::string& where) {
  const char quote = text[at++];
  std::string out;
  auto fail = [&](const char* what) {
    return Error(fmt::format("transformer: {}: cannot read the chat template's string literal at byte {}: {}", where,
                             at, what));
  };
  while (at < text.size() && text[at] != quote) {
    if (text[at] != '\\' || at + 1 >= text.size()) {
      out += text[at++];
      continue;
    }
    const char c = text[at + 1];
    at += 2;
    static constexpr char kSimple[] = "n\nt\tr\ra\ab\bf\fv\v\\\\''\"\"";  // pairs: escape, character
    const char* simple = c == 0 ? nullptr : std::strchr(kSimple, c);
    if (simple && (simple - kSimple) % 2 == 0) {
      out += simple[1];
    } else if (c == 'x' || c == 'u' || c == 'U' || (c >= '0' && c <= '7')) {  // hex digits, or up to 3 octal
      const bool octal = c >= '0' && c <= '7';
      const size_t n = octal ? 3 : c == 'x' ? 2 : c == 'u' ? 4 : 8, begin = octal ? at - 1 : at;
      size_t len = 0;
      while (len < n && begin + len < text.size() && std::isxdigit(uint8_t(text[begin + len])) &&
             (!octal || (text[begin + len] >= '0' && text[begin + len] <= '7')))
        ++len;
      if (!octal && len < n) throw fail("a \\x, \\u or \\U escape without its hex digits");
      const unsigned long cp = std::stoul(text.substr(begin, len), nullptr, octal ? 8 : 16);
      if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) throw fail("an escape that is not a Unicode character");
      utf8::append(out, uint32_t(cp));
      at = begin + len;
    } else if (c == 'N') {
      throw fail("a \\N{NAME} escape");
    } else if (c != '\n') {  // a backslash before a newline joins the lines; other escapes stay as written
      out += '\\', out += c;
    }
  }
  if (at >= text.size()) throw fail("no closing quote");
  ++at;
  return out;
}

// The template's text pieces: its data between tags, and the string literals inside {{ }} and
// {% %} tags (comments skipped); `end` is where each ends in `text`.
struct JinjaText {
  std::string value;
  size_t end;
  bool in_tag;
};
std::vector<JinjaText> jinja_texts(const std::string& text, const std::string& where) {
  std::vector<JinjaText> out;
  for (size_t i = 0; i < text.size();) {
    size_t tag = text.find('{', i);
    while (tag != std::string::npos && (tag + 1 >= text.size() || !std::strchr("{%#", text[tag + 1])))
      tag = text.find('{', tag + 1);
    tag = std::min(tag, text.size());
    if (tag > i) out.push_back({text.substr(i, tag - i), tag, false});
    if (tag + 1 >= text.size()) break;
    const char close = text[tag + 1] == '{' ? '}' : text[tag + 1];
    for (i = tag + 2; i < text.size() && !(text[i] == close && i + 1 < text.size() && text[i + 1] == '}');) {
      if (close != '#' && (text[i] == '\'' || text[i] == '"')) {
        std::string value = jinja_string(text, i, where);
        out.push_back({std::move(value), i, true});
      } else {
        ++i;
      }
    }
    i += 2;
  }
  return out;
}

// chatml's default system message: the body of a '<|im_start|>system\n...<|im_end|>' the
// template writes as one text (none when it writes none). The header joined (+, ~ or {{ }}) to
// anything but messages[0]'s content is a default weft cannot read: an error.
std::optional<std::string> default_system(const std::string& text, const std::string& where) {
  const std::string head = "<|im_start|>system\n", close = "<|im_end|>";
  std::optional<std::string> found;
  for (const JinjaText& t : jinja_texts(text, where)) {
    const size_t at = t.value.find(head);
    if (at == std::string::npos) continue;
    const size_t end = t.value.find(close, at + head.size());
    if (end != std::string::npos) {
      const std::string body = t.value.substr(at + head.size(), end - at - head.size());
      WEFT_CHECK(!found || *found == body, "transformer: {}: the chat template writes two default system messages "
                 "(\"{}\" and \"{}\"): weft cannot tell which one applies", where, *found, body);
      found = body;
      continue;
    }
    size_t p = text.find_first_not_of(" \t\r\n", t.end);
    const bool joined = p != std::string::npos && (t.in_tag ? text[p] == '+' || text[p] == '~' : text.compare(p, 2, "{{") == 0);
    if (!joined) continue;
    p = text.find_first_not_of(" \t\r\n-", p + (t.in_tag ? 1 : 2));
    WEFT_CHECK(p != std::string::npos && text.compare(p, 11, "messages[0]") == 0, "transformer: {}: cannot read the "
               "chatml default system message: the template follows \"<|im_start|>system\\n\" with `{}` rather than "
               "writing it as one string literal: give each record a system message and --chat-format chatml, or "
               "fix the template", where, text.substr(p == std::string::npos ? text.size() : p, 40));
  }
  return found;
}

// A template's {% %} and {{ }} tags: `code` with each string literal as "\x01" (its value, as jinja2 reads it, in
// `literals`), and the tag as written.
struct JinjaTag {
  bool statement;
  std::string code, raw;
  std::vector<std::string> literals;
};
std::vector<JinjaTag> jinja_tags(const std::string& text, const std::string& where) {
  std::vector<JinjaTag> out;
  for (size_t tag = text.find('{'); tag != std::string::npos && tag + 1 < text.size(); tag = text.find('{', tag + 1)) {
    if (text[tag + 1] == '#') tag = std::min(text.find("#}", tag + 2), text.size() - 1);  // a comment
    if (text[tag + 1] != '{' && text[tag + 1] != '%') continue;
    JinjaTag t{text[tag + 1] == '%', "", "", {}};
    const char close = t.statement ? '%' : '}';
    size_t i = tag + 2;
    while (i < text.size() && !(text[i] == close && i + 1 < text.size() && text[i + 1] == '}')) {
      if (text[i] == '\'' || text[i] == '"') t.literals.push_back(jinja_string(text, i, where)), t.code += '\x01';
      else t.code += text[i++];
    }
    t.raw = text.substr(tag, std::min(i + 2, text.size()) - tag);
    out.push_back(std::move(t));
    tag = i;
  }
  return out;
}

// A tag's code in one form whatever its spelling: a space only between two words, whitespace control (-, +) dropped,
// literals single-quoted, x['name'] as x.name, and `loop_var` (a loop over the messages) as `message`.
std::string canonical(const JinjaTag& t, const std::string& loop_var) {
  std::string code = t.code;
  for (char& c : code)
    if (std::isspace(uint8_t(c))) c = ' ';
  code.erase(0, std::min(code.find_first_not_of(' '), code.size()));
  code.erase(code.find_last_not_of(' ') + 1);
  if (!code.empty() && (code.front() == '-' || code.front() == '+')) code.erase(0, 1);
  if (!code.empty() && (code.back() == '-' || code.back() == '+')) code.pop_back();
  auto word = [](char c) { return std::isalnum(uint8_t(c)) || c == '_'; };
  std::string tight;
  for (size_t i = 0; i < code.size(); ++i)
    if (code[i] != ' ' || (!tight.empty() && word(tight.back()) && i + 1 < code.size() && word(code[i + 1])))
      tight += code[i];
  if (!loop_var.empty() && loop_var != "message")
    tight = std::regex_replace(tight, std::regex("(^|[^.\\w])" + loop_var + "\\b"), "$1message");
  std::string out;
  size_t literal = 0;
  for (size_t i = 0; i < tight.size(); ++i) {
    if (tight[i] != '\x01') {
      out += tight[i];
      continue;
    }
    const std::string& v = t.literals[literal++];
    const bool name = !v.empty() && std::all_of(v.begin(), v.end(), word) && !out.empty() && out.back() == '[' &&
                      i + 1 < tight.size() && tight[i + 1] == ']';
    if (name) out.back() = '.', out += v, ++i;
    else out += "'" + v + "'";
  }
  return out;
}

// What each format renders of a template's logic: the conditions it tests (in canonical form), the filters and the
// methods it calls. The templates the forms were checked against (tests/data/chat: Llama 3's, Qwen2's and Qwen2.5's,
// Qwen3's, Mistral v0.1's) use no others; a template that does may render other text, and is refused naming it.
struct FormLogic {
  std::vector<const char*> conditions, filters, methods;
};
const FormLogic& form_logic(ChatFormat f) {
  static const FormLogic llama3{{"loop.index0==0", "message.role=='assistant'", "add_generation_prompt"}, {"trim"}, {}};
  static const FormLogic chatml{
      {"add_generation_prompt", "messages[0].role=='system'", "messages[0].role!='system'",
       "loop.first and messages[0].role!='system'", "message.role=='assistant'",
       "message.role=='user'or(message.role=='system'and not loop.first)", "tools",
       "(message.role=='user')or(message.role=='system'and not loop.first)or(message.role=='assistant'and not "
       "message.tool_calls)",
       "message.content", "tool_call.function is defined", "message.role=='tool'",
       "(loop.index0==0)or(messages[loop.index0-1].role!='tool')", "loop.last or(messages[loop.index0+1].role!='tool')"},
      {"tojson"},
      {}};
  static const FormLogic qwen3{
      {"tools", "messages[0].role=='system'", "ns.multi_step_tool and message.role=='user'and not(message.content."
       "startswith('<tool_response>')and message.content.endswith('</tool_response>'))",
       "(message.role=='user')or(message.role=='system'and not loop.first)", "message.role=='assistant'",
       "message.reasoning_content is defined and message.reasoning_content is not none", "'</think>'in message.content",
       "loop.index0>ns.last_query_index", "loop.last or(not loop.last and reasoning_content)", "message.tool_calls",
       "(loop.first and content)or(not loop.first)", "tool_call.function", "tool_call.arguments is string",
       "message.role=='tool'", "loop.first or(messages[loop.index0-1].role!='tool')",
       "loop.last or(messages[loop.index0+1].role!='tool')", "add_generation_prompt",
       "enable_thinking is defined and enable_thinking is false"},
      {"length", "tojson"},
      {"startswith", "endswith", "split", "lstrip", "rstrip", "strip"}};
  static const FormLogic mistral{{"(message.role=='user')!=(loop.index0%2==0)", "message.role=='user'",
                                  "message.role=='assistant'"}, {}, {}};
  switch (f) {
    case ChatFormat::llama3: return llama3;
    case ChatFormat::chatml: return chatml;
    case ChatFormat::qwen3: return qwen3;
    case ChatFormat::mistral: break;
  }
  return mistral;
}

// Refuses a recognised template whose logic its format does not render (form_logic), naming what it uses.
void check_logic(const std::string& text, ChatFormat f, const std::string& where) {
  const std::vector<JinjaTag> tags = jinja_tags(text, where);
  const FormLogic& logic = form_logic(f);
  const std::string name = chat_format_name(f);
  auto refuse = [&](const std::string& what, const JinjaTag& t) {
    size_t cut = std::min<size_t>(t.raw.size(), 100);
    while (cut < t.raw.size() && (uint8_t(t.raw[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 sequence
    return Error(fmt::format("transformer: {}: the chat template {} (`{}`), which weft does not render: weft renders "
                             "the {} form only where the template renders the same text; --chat-format {} renders "
                             "that form, not this template's text", where, what, t.raw.substr(0, cut), name, name));
  };
  auto listed = [](const std::vector<const char*>& list, const std::string& s) {
    return std::any_of(list.begin(), list.end(), [&](const char* l) { return s == l; });
  };
  std::string loop_var;
  const std::regex for_messages(R"(^\s*[-+]?\s*for\s+(\w+)\s+in\s+(loop_)?messages\b)");
  const std::regex filter(R"(\|\s*(\w+))"), method(R"(\.\s*(\w+)\s*\()");
  bool trims = false;
  for (const JinjaTag& t : tags) {
    std::smatch m;
    if (t.statement && std::regex_search(t.code, m, for_messages)) loop_var = m[1];
    for (auto it = std::sregex_iterator(t.code.begin(), t.code.end(), filter); it != std::sregex_iterator(); ++it) {
      if (!listed(logic.filters, (*it)[1])) throw refuse("applies the filter `" + (*it)[1].str() + "`", t);
      trims = trims || (*it)[1] == "trim";
    }
    for (auto it = std::sregex_iterator(t.code.begin(), t.code.end(), method); it != std::sregex_iterator(); ++it)
      if (!listed(logic.methods, (*it)[1])) throw refuse("calls `" + (*it)[1].str() + "(...)`", t);
    const std::string c = canonical(t, loop_var);
    if (t.statement && std::regex_search(c, m, std::regex("^(el)?if\\b ?")) && !listed(logic.conditions, m.suffix()))
      throw refuse("tests a condition of its own", t);
  }
  WEFT_CHECK(f != ChatFormat::llama3 || trims, "transformer: {}: the chat template does not `trim` the messages' "
             "content, which weft's llama3 form does (as Llama 3's template): --chat-format llama3 renders that form, "
             "not this template's text", where);
}

// chatml's default system message and leading BOS; what the chatml form does not write is refused unless forced.
void read_chatml(ChatTemplate& t, const std::string& text, const std::string& where, const std::string& forced) {
  t.default_system = default_system(text, where);
  std::smatch bos;  // a {{ bos_token }} first (Hermes 2 Pro's, InternLM2's) is written; a template that trims or
  // strips text, or writes a BOS elsewhere or an EOS, renders other text than the form: refused, naming what
  t.bos_first = std::regex_search(text, bos, std::regex(R"(^\s*\{\{-?\s*bos_token\s*-?\}\})"));
  for (const char* s : {"trim", "strip(", "bos_token", "eos_token"}) {
    const size_t at = forced.empty() ? text.find(s, size_t(bos.length(0))) : std::string::npos;
    WEFT_CHECK(at == std::string::npos, "transformer: {}: a chatml template that writes `{}` (\"...{}...\"): not "
               "recognised, as weft's chatml form writes each message's content as given, after a BOS only where the "
               "template starts with {{{{ bos_token }}}}; --chat-format chatml renders that form, not this template's "
               "text", where, s, text.substr(at - std::min<size_t>(at, 30), 60));
  }
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
  if (has("<|im_start|>") && has("<|im_end|>")) {
    if (!has("<think>")) return ChatFormat::chatml;
    WEFT_CHECK(has("last_query_index") && has("loop.last or (not loop.last and reasoning_content)"), "transformer: {}: "
               "a chatml template with <think> reasoning that is not Qwen3's: not recognised; --chat-format qwen3 "
               "renders Qwen3's form, --chat-format chatml plain chatml", where);
    return ChatFormat::qwen3;
  }
  if (has("'[INST] ' + message['content'] + ' [/INST]'") && !has("<<SYS>>")) return ChatFormat::mistral;
  WEFT_CHECK(!has("[INST]"), "transformer: {}: a Mistral template other than v0.1's: not recognised; --chat-format "
             "mistral renders v0.1's `<s>[INST] X [/INST]Y</s>`, not this template's text (later ones put a space "
             "before [INST] and before each answer, and fold a system message into the first [INST]): other ids", where);
  throw Error(fmt::format("transformer: {}: a chat template weft does not recognise (it knows {}; the template begins "
                          "\"{}\"): --chat-format NAME renders one of those forms, not this template's text, so the ids "
                          "differ from its own", where, kFormats, text.substr(0, 120)));
}

// An assistant message's reasoning and content as Qwen3's template splits them: reasoning_content
// when the record gives it, else what the content holds between <think> and </think>.
std::pair<std::string, std::string> qwen3_parts(const ChatMessage& m) {
  if (m.reasoning) return {*m.reasoning, m.content};
  const size_t first = m.content.find("</think>"), last = m.content.rfind("</think>");
  if (first == std::string::npos) return {"", m.content};
  std::string reasoning = m.content.substr(0, first);
  reasoning.erase(reasoning.find_last_not_of('\n') + 1);
  const size_t open = reasoning.rfind("<think>");
  if (open != std::string::npos) reasoning.erase(0, open + 7);
  const std::string content = m.content.substr(last + 8);
  return {reasoning.substr(std::min(reasoning.find_first_not_of('\n'), reasoning.size())),
          content.substr(std::min(content.find_first_not_of('\n'), content.size()))};
}

// Qwen3's template (chat_template.h): the think block goes on assistant messages after the last
// user message that is not a <tool_response>, and on the last message.
void render_qwen3(const ChatTemplate& t, const std::vector<ChatMessage>& m, std::vector<TextPiece>& out) {
  auto piece = [&](std::string text, bool trained) { out.push_back({std::move(text), trained}); };
  auto tool_response = [](const std::string& s) {
    return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
  };
  size_t last_query = m.size() - 1;
  for (size_t k = m.size(); k-- > 0;)
    if (m[k].role == "user" && !tool_response(m[k].content)) {
      last_query = k;
      break;
    }
  auto strip = [](const std::string& s) {  // Python's s.strip("\n")
    const size_t b = s.find_first_not_of('\n');
    return b == std::string::npos ? std::string() : s.substr(b, s.find_last_not_of('\n') + 1 - b);
  };
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string& role = m[i].role;
    if (role == "system" || role == "user") {
      piece("<|im_start|>" + role + "\n" + m[i].content + "<|im_end|>\n", false);
    } else if (role == "tool") {
      const bool first = i == 0 || m[i - 1].role != "tool", last = i + 1 == m.size() || m[i + 1].role != "tool";
      piece(std::string(first ? "<|im_start|>user" : "") + "\n<tool_response>\n" + m[i].content + "\n</tool_response>" +
            (last ? "<|im_end|>\n" : ""), false);
    } else if (role == "assistant") {
      auto [reasoning, content] = qwen3_parts(m[i]);
      if (i > last_query && (i + 1 == m.size() || !reasoning.empty()))
        content = "<think>\n" + strip(reasoning) + "\n</think>\n\n" +
                  content.substr(std::min(content.find_first_not_of('\n'), content.size()));
      piece("<|im_start|>assistant\n", false);
      piece(content + "<|im_end|>", true);
      piece("\n", false);
    } else {
      no_place(t, i, role, "system, user, assistant and tool");
    }
  }
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::qwen3: return "qwen3";
    case ChatFormat::mistral: return "mistral";
  }
  return "?";
}

ChatFormat parse_chat_format(const std::string& name) {
  for (ChatFormat f : {ChatFormat::llama3, ChatFormat::chatml, ChatFormat::qwen3, ChatFormat::mistral})
    if (name == chat_format_name(f)) return f;
  throw Error(fmt::format("transformer: --chat-format {}: not a chat format (use {})", name, kFormats));
}

ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& forced) {
  const fs::path dir = fs::path(tokenizer_json_path(tokenizer_path)).parent_path();
  const std::string config_file = (dir / "tokenizer_config.json").string();
  json config = json::object();
  if (WEFT_FS(fs::exists(config_file))) config = read_json_object(config_file);
  ChatTemplate t;
  std::string where = config_file;
  const std::string text = template_text(dir, config, where);
  if (!forced.empty()) {
    t.format = parse_chat_format(forced);
  } else {
    WEFT_CHECK(!text.empty(), "transformer: chat messages need a chat template, and {} has none (no "
               "chat_template.jinja, no \"chat_template\" in tokenizer_config.json): pass --chat-format {}",
               dir.string(), kFormats);
    t.format = recognise(text, where);
  }
  t.bos = token_text(config, "bos_token");
  t.eos = token_text(config, "eos_token");
  if (t.format == ChatFormat::llama3 && t.bos.empty()) t.bos = "<|begin_of_text|>";
  if (t.format == ChatFormat::mistral && t.bos.empty()) t.bos = "<s>";
  if (t.format == ChatFormat::mistral && t.eos.empty()) t.eos = "</s>";
  if (t.format == ChatFormat::chatml) read_chatml(t, text, where, forced);
  if (forced.empty()) check_logic(text, t.format, where);
  return t;
}

std::vector<TextPiece> render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  WEFT_CHECK(!messages.empty(), "\"messages\" is empty");
  std::vector<TextPiece> out;
  auto piece = [&](std::string text, bool trained) { out.push_back({std::move(text), trained}); };
  if (t.format == ChatFormat::qwen3) render_qwen3(t, messages, out);
  for (size_t i = 0; i < messages.size() && t.format != ChatFormat::qwen3; ++i) {
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
        if (i == 0 && t.bos_first) piece(t.bos, false);
        if (i == 0 && role != "system" && t.default_system)
          piece("<|im_start|>system\n" + *t.default_system + "<|im_end|>\n", false);
        piece("<|im_start|>" + role + "\n", false);
        piece(messages[i].content + "<|im_end|>", assistant);
        piece("\n", false);
        break;
      case ChatFormat::qwen3: break;  // render_qwen3
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
