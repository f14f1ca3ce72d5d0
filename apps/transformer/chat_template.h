// apps/transformer: chat conversations rendered as a model family's chat template renders them
// (transformers' apply_chat_template without a generation prompt), as pieces of text that say
// which parts a fine-tune trains on: each assistant message's content and the end-of-turn
// marker after it; headers, system and user messages carry no loss. Four formats:
//   llama3   <|begin_of_text|> then per message <|start_header_id|>ROLE<|end_header_id|>\n\n
//            CONTENT (trimmed) <|eot_id|>                       (Llama 3 / 3.0's template)
//   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, after the template's default
//            system message when the first message is not a system one, after the BOS when the
//            template starts with {{ bos_token }}             (Qwen2, Qwen2.5; Hermes 2 Pro, InternLM2)
//   qwen3    chatml without a default system message; an assistant message's reasoning (its
//            reasoning_content, else what its content holds in <think>...</think>) is dropped,
//            except after the last user message, where the message is <think>\nREASONING\n
//            </think>\n\nCONTENT (the last message always, others when they have reasoning);
//            tool messages are user turns of <tool_response>s. The think block is trained, as
//            the model writes it after the assistant header                (Qwen3's template)
//   mistral  <s> then [INST] USER [/INST] and ASSISTANT</s>, alternating from a user message; no
//            system role                                         (Mistral v0.1's template)
// The format is recognised from the tokenizer's chat_template (chat_template.jinja or
// tokenizer_config.json beside tokenizer.json) by its markers, or named by --chat-format; a
// template weft does not know is an error that names what it found, and so is a recognised one
// with logic its family's templates lack (a condition, filter or method; llama3: no trim).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace weft::apps {

struct ChatMessage {
  std::string role, content;
  std::optional<std::string> reasoning;  // a record's "reasoning_content" (qwen3 renders it)
};

// A piece of an example's text and whether its tokens carry loss.
struct TextPiece {
  std::string text;
  bool trained = false;
};

enum class ChatFormat { llama3, chatml, qwen3, mistral };

struct ChatTemplate {
  ChatFormat format = ChatFormat::chatml;
  std::string bos, eos;          // the tokenizer's, where the template writes them
  std::optional<std::string> default_system;  // chatml: the system message put first when none is given
  bool bos_first = false;                      // chatml: the template starts with {{ bos_token }}
};

const char* chat_format_name(ChatFormat f);
// "llama3", "chatml", "qwen3" or "mistral"; anything else is an error listing them.
ChatFormat parse_chat_format(const std::string& name);

// The chat template of the tokenizer at `tokenizer_path` (a tokenizer.json or its directory):
// the format named by `forced` when not empty, else the one recognised in its chat_template.
// chatml's default system message is read from the template's Jinja string literals (their
// escapes undone); a template that builds it otherwise is an error naming the file.
ChatTemplate load_chat_template(const std::string& tokenizer_path, const std::string& forced);

// The conversation as the template renders it. A role the template has no place for, or (mistral)
// turns that do not alternate from a user message, is an error naming the message.
std::vector<TextPiece> render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages);

}  // namespace weft::apps
