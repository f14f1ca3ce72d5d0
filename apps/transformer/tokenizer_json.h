// apps/transformer: reading one part of a tokenizer.json (Hugging Face `tokenizers` format) with
// errors that name the file and where the part is in it ("pre_tokenizer.pretokenizers[0]: ...").
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace weft::apps {

// A part of the file: its JSON, the file's path and where the part is in it ("" for the whole).
struct TokenizerField {
  const nlohmann::json& j;
  const std::string& file;
  std::string where;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("tokenizer {}: {}{}", file, where.empty() ? "" : where + ": ", what));
  }
  const nlohmann::json& at(const std::string& key) const {
    if (!j.is_object() || !j.contains(key)) fail(fmt::format("\"{}\" is missing", key));
    return j[key];
  }
  bool is_null(const std::string& key) const { return !j.is_object() || !j.contains(key) || j[key].is_null(); }
  std::string text(const std::string& key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_string()) fail(fmt::format("\"{}\" must be a string, got {}", key, v.dump()));
    return v.get<std::string>();
  }
  bool flag(const std::string& key, bool fallback) const {
    if (is_null(key)) return fallback;
    if (!j[key].is_boolean()) fail(fmt::format("\"{}\" must be true or false, got {}", key, j[key].dump()));
    return j[key].get<bool>();
  }
  TokenizerField sub(const std::string& key) const {
    return TokenizerField{at(key), file, where.empty() ? key : where + "." + key};
  }
  // The items of the array at `key`, each as a field.
  TokenizerField item(const std::string& key, size_t k) const {
    return TokenizerField{at(key)[k], file, fmt::format("{}{}[{}]", where.empty() ? "" : where + ".", key, k)};
  }
  size_t items(const std::string& key) const {
    if (!at(key).is_array()) fail(fmt::format("\"{}\" must be an array", key));
    return j[key].size();
  }
  // A {"String": s} pattern's string; a {"Regex": ...} one is refused.
  std::string string_pattern(const std::string& key) const {
    const TokenizerField p = sub(key);
    if (p.is_null("String")) p.fail("weft supports a String pattern here, not a Regex");
    return p.text("String");
  }
};

}  // namespace weft::apps
