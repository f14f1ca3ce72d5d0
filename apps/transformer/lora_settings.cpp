#include "apps/transformer/lora_settings.h"

#include <algorithm>
#include <cstdlib>

#include "core/fill_rule.h"

namespace weft::apps {

std::vector<std::string> lora_targets(const std::string& list, const ModelConfig& cfg) {
  if (list.empty() && cfg.arch == "llama") return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (list.empty()) return {"c_attn", "c_proj", "c_fc"};
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    std::string name = list.substr(start, end - start);  // "q_proj, v_proj" names two modules
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    WEFT_CHECK(!name.empty(), "transformer: --lora-targets \"{}\" has an empty name", list);
    WEFT_CHECK(std::find(out.begin(), out.end(), name) == out.end(), "transformer: --lora-targets \"{}\" names {} "
               "twice", list, name);
    out.push_back(std::move(name));
    start = end + 1;
  }
  return out;
}

std::map<std::string, std::string> lora_fields(const nn::LoRAOptions& o) {
  if (o.rank == 0) return {};
  std::string targets;
  for (const std::string& t : o.targets) targets += (targets.empty() ? "" : ",") + t;
  return {{"lora_rank", std::to_string(o.rank)}, {"lora_alpha", fmt::format("{}", o.alpha)},
          {"lora_dropout", fmt::format("{}", o.dropout)}, {"lora_targets", targets}};
}

nn::LoRAOptions lora_of(const std::map<std::string, std::string>& recorded, const std::string& where) {
  nn::LoRAOptions o{.rank = 0};
  if (!recorded.count("lora_rank")) return o;
  auto get = [&](const std::string& k) {
    auto f = recorded.find(k);
    WEFT_CHECK(f != recorded.end(), "transformer: {} records lora_rank but no \"{}\"", where, k);
    return f->second;
  };
  // A number in [lo, hi) (hi included when `closed`), naming the field when it is not.
  auto number = [&](const std::string& k, double lo, double hi, bool closed) {
    const std::string text = get(k);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    WEFT_CHECK(!text.empty() && *end == '\0' && v >= lo && (v < hi || (closed && v == hi)),
               "transformer: {}: field \"{}\" is \"{}\", not a number in [{}, {}{}", where, k, text, lo, hi,
               closed ? "]" : ")");
    return v;
  };
  o.rank = int64_t(number("lora_rank", 1, 1 << 16, true));
  WEFT_CHECK(double(o.rank) == number("lora_rank", 1, 1 << 16, true), "transformer: {}: field \"lora_rank\" is not "
             "an integer", where);
  o.alpha = number("lora_alpha", 0, 1e30, true);
  WEFT_CHECK(o.alpha > 0, "transformer: {}: field \"lora_alpha\" must be above 0", where);
  o.dropout = number("lora_dropout", 0, 1, false);
  WEFT_CHECK(!get("lora_targets").empty(), "transformer: {}: field \"lora_targets\" is empty", where);
  o.targets = lora_targets(get("lora_targets"), ModelConfig{});
  return o;
}

void add_lora(const LanguageModel& lm, const nn::LoRAOptions& o, bool to_load) {
  if (o.rank == 0) return;
  nn::apply_lora(*lm.module, o);
  if (!to_load) return;
  for (auto& [name, p] : lm.module->named_parameters())
    if (nn::is_lora_parameter(name)) p.storage()->set_deferred_fill(nullptr);
}

}  // namespace weft::apps
