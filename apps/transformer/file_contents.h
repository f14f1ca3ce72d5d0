// apps: the whole contents of the small files beside a model, tokenizer or dataset (config.json,
// tokenizer.json, generation_config.json, ...): read as text or as a JSON object. Errors name the
// file and what is wrong with it (missing, a directory, a FIFO, unreadable, not a JSON object).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace weft::apps {

std::string read_file(const std::string& path);
// `text` as the whole of `path`, through write_file_atomic (errors name the path and the system's reason).
void write_file(const std::string& path, const std::string& text);
nlohmann::json read_json_object(const std::string& path);

}  // namespace weft::apps
