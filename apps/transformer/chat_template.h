// apps/transformer: chat conversations rendered as a model family's chat template renders them
// (transformers' apply_chat_template without a generation prompt), as pieces of text that say
// which parts a fine-tune trains on: each assistant message's content and the end-of-turn
// marker after it; headers, system and user messages carry no loss. Three formats:
//   llama3   <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|>\n\n
//            CONTENT (trimmed) <|eot_id|>                       (Llama 3 / 3.0's template)
//   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, after the template's default
//            system message when the first message is not a system one     (Qwen2, Qwen2.5, Qwen3)
//   mistral  <s> then [INST] USER [/INST] and ASSISTANT</s>, alternating from a user message; no
//            system role                                         (Mistral v0.1's template)
// The format is recognised from the tokenizer's chat_template (chat_template.jinja or
// tokenizer_config.json beside tokenizer.json) by its markers, or named by --chat-format; a
// template weft does not know is an error that names what it found.
#pragma once
#include <string>
#include <vector>

namespace weft::apps {

struct ChatMessage {
  std::string role, content;
};

// A piece of an example's text and whether its tokens carry loss.
struct TextPiece {
  std::string text;
  bool trained = false;
};

enum class ChatFormat { llama3, chatml, mistral };

struct ChatTemplate {
  ChatFormat format = ChatFormat::chatml;
  std::string bos, eos;          // the tokenizer's, where the template writes them
  std::string default_system;    // chatml: the system message put first when none is given
};

const char* chat_format_name(ChatFormat f);
// "llama3", "chatml" or "mistral"; anything else is an error listing them.
ChatFormat parse_chat_format(const std::string& name);

// The chat template of the tokenizer at `tokenizer_path` (a tokenizer.json or its directory):
// the format named by `forced` when not empty, else the one recognised in its chat_template.
ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& forced);

// The conversation as the template renders it. A role the template has no place for, or (mistral)
// turns that do not alternate from a user message, is an error naming the message.
std::vector<TextPiece> render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages);

}  // namespace weft::apps
