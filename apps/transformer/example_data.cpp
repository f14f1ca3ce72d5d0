#include "apps/transformer/example_data.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/common/progress.h"
#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/chat_template.h"
#include "apps/transformer/token_data.h"
#include "core/error.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with_jsonl(const std::string& path) {  // .jsonl or .JSONL (any case)
  return path.size() > 6 && std::equal(path.end() - 6, path.end(), ".jsonl", [](char a, char b) { return std::tolower(a) == b; });
}

// The tokens of `pieces` encoded as one text, each flagged as its piece is (see the header): a run
// of equally flagged pieces starts where the encoding of the text before it stops agreeing with
// the whole's. The text is encoded in parts cut where the tokenizer may cut it (split_point: before
// each special token too), so each run's start costs the text since the last cut, not the whole
// prefix, and a run keeps the ids of that text only until the next cut settles where they stop agreeing.
void encode_pieces(const BpeTokenizer& tok, const std::vector<TextPiece>& pieces, Example& ex) {
  std::string whole;
  for (const TextPiece& p : pieces) whole += p.text;
  const std::string_view text(whole);
  std::vector<int32_t> ids;  // of text[0, cut)
  size_t cut = 0;
  auto encode_to = [&](size_t end) {  // the ids of text[cut, end), after moving `cut` as near `end` as it may go
    if (const size_t k = tok.split_point(text.substr(cut, end - cut), end - cut); k > 0) {
      const std::vector<int32_t> part = tok.encode(text.substr(cut, k), false, cut > 0);
      ids.insert(ids.end(), part.begin(), part.end());
      cut += k;
    }
    return tok.encode(text.substr(cut, end - cut), false, cut > 0);
  };
  struct Run {
    size_t base;                  // where `before` starts in the ids: at last, where the run's prefix stops agreeing
    std::vector<int32_t> before;  // the ids of the text from there to the run, not yet compared with the whole's
    bool trained;
  };
  std::vector<Run> runs;
  size_t settled = 0;  // the runs before it have compared all of `before`
  auto settle = [&](bool last) {
    for (size_t r = settled; r < runs.size(); ++r) {
      Run& run = runs[r];
      size_t n = 0;
      while (n < run.before.size() && run.base + n < ids.size() && run.before[n] == ids[run.base + n]) ++n;
      run.base += n;
      run.before.erase(run.before.begin(), run.before.begin() + std::ptrdiff_t(n));
      if (last || run.base < ids.size()) run.before = {};  // where they stop agreeing (or the whole's ids end)
    }
    while (settled < runs.size() && runs[settled].before.empty()) ++settled;
  };
  size_t text_end = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (k == 0 || pieces[k].trained != pieces[k - 1].trained) {
      std::vector<int32_t> before = k > 0 ? encode_to(text_end) : std::vector<int32_t>();
      settle(false);
      runs.push_back({ids.size(), std::move(before), pieces[k].trained});
    }
    text_end += pieces[k].text.size();
  }
  const std::vector<int32_t> rest = encode_to(whole.size());
  ids.insert(ids.end(), rest.begin(), rest.end());
  settle(true);
  for (size_t r = 0, start = 0; r < runs.size(); ++r) {
    start = r == 0 ? 0 : std::max(start, runs[r].base);
    const size_t end = r + 1 < runs.size() ? std::max(start, runs[r + 1].base) : ids.size();
    for (size_t i = start; i < end; ++i) ex.ids.push_back(uint32_t(ids[i])), ex.trained.push_back(runs[r].trained);
  }
}

// A record's string field ("" when absent); a present field of another type is an error.
std::optional<std::string> string_field(const json& record, const char* key) {
  if (!record.contains(key)) return std::nullopt;
  WEFT_CHECK(record[key].is_string(), "\"{}\" must be a string, got {}{}", key, record[key].type_name(),
             record[key].is_array() ? " (conversational prompt and completion: give it as {\"messages\": [...]})" : "");
  return record[key].get<std::string>();
}

// A value for an error message: its JSON when that is short and shallow (cut at a character
// boundary), else its type; never the whole of a deep or large value.
std::string describe(const json& v) {
  std::function<bool(const json&, int, size_t&)> small = [&](const json& x, int depth, size_t& budget) {
    if (!x.is_structured()) return budget-- > 0;
    if (depth == 0 || x.size() > budget) return false;
    budget -= x.size();
    for (const json& e : x)
      if (!small(e, depth - 1, budget)) return false;
    return true;
  };
  size_t budget = 16;
  if (!small(v, 3, budget)) return fmt::format("an {} of {} elements", v.type_name(), v.size());
  std::string s = v.dump();
  if (s.size() <= 80) return s;
  size_t cut = 80;
  while (cut > 0 && (uint8_t(s[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 sequence
  return s.substr(0, cut) + "...";
}

std::vector<ChatMessage> messages_of(const json& record) {
  const json& m = record["messages"];
  WEFT_CHECK(m.is_array(), "\"messages\" must be a list, got {}", m.type_name());
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    WEFT_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string() && m[i].contains("content") &&
               m[i]["content"].is_string(), "message {} must be an object with string \"role\" and \"content\", got {}",
               i, describe(m[i]));
    // The templates test `message.tool_calls` for truth: null, false and an empty list render no tool calls.
    const auto calls = m[i].find("tool_calls");
    const bool none = calls == m[i].end() || calls->is_null() || *calls == false || (calls->is_array() && calls->empty());
    WEFT_CHECK(none || calls->is_array(), "message {}: \"tool_calls\" must be a list of tool calls (or null, false or "
               "empty: none), got {}", i, describe(*calls));
    WEFT_CHECK(none, "message {}: \"tool_calls\": weft renders a message's content, not its tool calls", i);
    out.push_back({m[i]["role"].get<std::string>(), m[i]["content"].get<std::string>(), std::nullopt});
    if (m[i].contains("reasoning_content") && !m[i]["reasoning_content"].is_null()) {
      WEFT_CHECK(m[i]["reasoning_content"].is_string(), "message {}: \"reasoning_content\" must be a string, got {}",
                 i, m[i]["reasoning_content"].type_name());
      out.back().reasoning = m[i]["reasoning_content"].get<std::string>();
    }
  }
  return out;
}

// Encodes records: the tokenizer, the EOS id and the chat template (read when first needed).
class RecordEncoder {
 public:
  RecordEncoder(const std::string& tokenizer_path, const std::string& eos, bool special, std::string chat_format)
      : path_(tokenizer_path), tok_(tokenizer_path), special_(special), chat_format_(std::move(chat_format)),
        eos_name_(eos) {}
  const BpeTokenizer& tokenizer() const { return tok_; }

  Example encode(const json& record) {
    WEFT_CHECK(record.is_object(), "a record must be a JSON object, got {}", record.type_name());
    const bool chat = record.contains("messages");
    const std::optional<std::string> text = string_field(record, "text"), prompt = string_field(record, "prompt"),
                                     completion = string_field(record, "completion");
    const int kinds = int(chat) + int(text.has_value()) + int(prompt.has_value() || completion.has_value());
    WEFT_CHECK(kinds == 1, "a record needs exactly one of \"text\", \"prompt\" + \"completion\" or \"messages\"; "
               "this one has {}", kinds == 0 ? "none of them" : "several");
    WEFT_CHECK(chat || text || (prompt && completion), "a record with \"{}\" needs \"{}\" too",
               prompt ? "prompt" : "completion", prompt ? "completion" : "prompt");
    Example ex;
    if (chat) {
      encode_pieces(tok_, render_chat(chat_template(), messages_of(record)), ex);
      return ex;
    }
    if (special_) add(ex, tok_.special_prefix(), false);
    if (text) encode_pieces(tok_, {{*text, true}}, ex);
    else encode_pieces(tok_, {{*prompt, false}, {*completion, true}}, ex);
    if (special_) add(ex, tok_.special_suffix(), true);
    if (!eos_name_.empty()) add(ex, {eos_id()}, true);
    return ex;
  }

 private:
  static void add(Example& ex, const std::vector<int32_t>& ids, bool trained) {
    for (int32_t id : ids) ex.ids.push_back(uint32_t(id)), ex.trained.push_back(trained);
  }
  // --eos ends text and prompt/completion records only (a chat's template has its own end): checked at the first.
  int32_t eos_id() {
    if (eos_ < 0) eos_ = tok_.id_of(eos_name_);
    WEFT_CHECK(eos_ >= 0, "--eos \"{}\" is not a token of {} (pass --eos \"\" for none): text and prompt/completion "
               "records end with it", eos_name_, path_);
    return eos_;
  }
  const ChatTemplate& chat_template() {
    if (!template_) {
      template_ = load_chat_template(path_, chat_format_);
      std::vector<std::string> markers = {"<|im_start|>", "<|im_end|>"};
      if (template_->format == ChatFormat::llama3)
        markers = {template_->bos, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
      if (template_->format == ChatFormat::mistral) markers = {template_->bos, template_->eos};
      for (const std::string& m : markers)
        WEFT_CHECK(tok_.id_of(m) >= 0, "the {} chat template writes \"{}\", which is not a token of {} (another "
                   "tokenizer, or the wrong --chat-format?)", chat_format_name(template_->format), m, path_);
    }
    return *template_;
  }
  std::string path_;
  BpeTokenizer tok_;
  bool special_;
  std::string chat_format_, eos_name_;
  int32_t eos_ = -1;
  std::optional<ChatTemplate> template_;
};

std::vector<Example> read_jsonl(const std::string& file, RecordEncoder& enc) {
  std::ifstream in(file, std::ios::binary);
  WEFT_CHECK(in.good(), "transformer: cannot open {}: {}", file, std::strerror(errno));
  std::vector<Example> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      json record;
      try {
        record = json::parse(line);
      } catch (const json::exception& e) {  // its reason: a lone surrogate, a missing quote, ...
        WEFT_ERROR("not JSON: {}", e.what());
      }
      out.push_back(enc.encode(record));
      const Example& ex = out.back();
      WEFT_CHECK(!ex.ids.empty(), "the record encodes to no tokens");
      const char* field = record.contains("messages") ? nullptr : record.contains("text") ? "text" : "completion";
      WEFT_CHECK(std::count(ex.trained.begin() + 1, ex.trained.end(), uint8_t(1)) > 0, "no token of the record is "
                 "trained: {}", field ? fmt::format("its {}\"{}\" encodes, with --eos, to no token after the example's "
                 "first, which is never a target", record[field] == "" ? "empty " : "", field) : "a chat needs an "
                 "assistant message");
    } catch (const Error& e) {
      throw Error(fmt::format("transformer: {}:{}: {}", file, n, e.what()));
    }
  }
  WEFT_CHECK(!in.bad(), "transformer: error while reading {}", file);
  return out;
}

// One split's ids, and each id's label (kLabelStart at an example's first token).
struct Split {
  std::vector<uint32_t> ids, labels;
};
Split make_split(const std::vector<Example>& examples, size_t begin, size_t end) {
  Split s;
  for (size_t e = begin; e < end; ++e) {
    s.ids.insert(s.ids.end(), examples[e].ids.begin(), examples[e].ids.end());
    for (size_t i = 0; i < examples[e].ids.size(); ++i)
      s.labels.push_back(i == 0 ? kLabelStart : examples[e].trained[i] ? kLabelTrained : kLabelContext);
  }
  return s;
}

// A .json file that starts as JSON does (records as Hugging Face datasets often ship them) is refused: it would be
// read as text, its braces and keys trained on.
void check_not_json_records(const std::string& path) {
  if (path.size() < 5 || !std::equal(path.end() - 5, path.end(), ".json", [](char a, char b) { return std::tolower(a) == b; }))
    return;
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c) && std::isspace(uint8_t(c))) {}
  WEFT_CHECK(!in || (c != '{' && c != '['), "transformer: {} is JSON, which prepare would read as text: records go in a "
             ".jsonl file (one object per line; rename it if it holds such lines), text in any other", path);
}

}  // namespace

bool is_jsonl_data(const std::string& data) {
  std::error_code ec;
  if (!fs::is_directory(data, ec)) return check_not_json_records(data), ends_with_jsonl(data);
  const std::vector<std::string> files = text_files(data);
  std::for_each(files.begin(), files.end(), check_not_json_records);
  const auto jsonl = std::count_if(files.begin(), files.end(), ends_with_jsonl);
  if (jsonl == 0) return false;
  for (const std::string& f : files)
    WEFT_CHECK(ends_with_jsonl(f), "transformer: {} mixes .jsonl files ({}) with others ({}): a dataset is either "
               "JSONL records or text", data, *std::find_if(files.begin(), files.end(), ends_with_jsonl), f);
  return true;
}

PreparedExamples prepare_examples(const std::string& tokenizer_path, const std::string& data,
                                  const std::string& out_dir, const std::string& eos, double val_fraction,
                                  bool special, const std::string& chat_format) {
  WEFT_CHECK(val_fraction >= 0 && val_fraction < 1, "transformer: validation fraction {} not in [0, 1)", val_fraction);
  check_output_place(dataset_out(out_dir), "transformer");
  RecordEncoder enc(tokenizer_path, eos, special, chat_format);
  const std::vector<std::string> files = text_files(data);
  PreparedExamples out;
  std::vector<Example> examples;
  Progress progress("prepare", int64_t(files.size()), "records");
  for (const std::string& f : files) {
    std::vector<Example> part = read_jsonl(f, enc);
    out.files += 1;
    progress.update(out.files, int64_t(part.size()), fmt::format("{} records", examples.size() + part.size()));
    std::move(part.begin(), part.end(), std::back_inserter(examples));
  }
  progress.finish(fmt::format("{} records from {} files", examples.size(), files.size()));
  out.records = int64_t(examples.size());
  WEFT_CHECK(!examples.empty(), "transformer: {} holds no records", data);
  size_t n_val = size_t(double(examples.size()) * val_fraction);
  if (val_fraction > 0 && n_val == 0) n_val = 1;
  WEFT_CHECK(n_val < examples.size(), "transformer: {} holds {} record(s): too few for a training and a validation "
             "split", data, examples.size());
  for (const Example& ex : examples) out.trained_tokens += std::count(ex.trained.begin() + 1, ex.trained.end(), uint8_t(1));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  WEFT_CHECK(!ec && WEFT_FS(fs::is_directory(out_dir)), "transformer: cannot create the dataset directory {}: {}", out_dir,
             ec ? ec.message() : "not a directory");
  const std::string digest = tokenizer_digest(tokenizer_path);
  const int64_t vocab = enc.tokenizer().vocab_size();
  const size_t n_train = examples.size() - n_val;
  const Split train = make_split(examples, 0, n_train), val = make_split(examples, n_train, examples.size());
  const std::string id = dataset_id({train.ids, train.labels, val.ids, val.labels});
  for (const auto& [name, split] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
    write_token_file(out_dir + "/" + name + ".tokens", split->ids, vocab, digest, id);
    write_token_file(out_dir + "/" + name + ".labels", split->labels, 3, digest, id);
  }
  out.train_tokens = int64_t(train.ids.size()), out.val_tokens = int64_t(val.ids.size());
  copy_tokenizer(tokenizer_path, out_dir);
  out.train_examples = int64_t(n_train), out.val_examples = int64_t(n_val);
  return out;
}

ExampleSet::ExampleSet(TokenView ids, TokenView labels, int64_t ctx, const std::string& what, bool pack,
                       uint64_t seed)
    : ids_(ids), labels_(labels) {
  WEFT_CHECK(ids.size() == labels.size() && (labels.size() == 0 || labels[0] == kLabelStart),
             "transformer: the labels of {} do not match its tokens: the dataset is damaged; prepare it again", what);
  for (int64_t i = 0; i < labels.size();) {
    int64_t end = i + 1;
    while (end < labels.size() && labels[end] != kLabelStart) ++end;
    const int64_t len = std::min(end - i, ctx + 1);
    int64_t targets = 0;
    for (int64_t t = i + 1; t < i + len; ++t) targets += labels[t] == kLabelTrained;
    if (targets == 0) {  // a skipped example is not counted as cut too
      ++skipped_;
    } else {
      truncated_ += len < end - i;
      starts_.push_back(i), lengths_.push_back(len), targets_.push_back(targets);
    }
    i = end;
  }
  if (!pack || starts_.empty()) return;
  std::vector<int64_t> order = draw(seed ^ 0x9ac4ed5eedull, 0, examples());  // the first epoch's order
  epoch_ = -1;
  int64_t used = ctx;  // the current pack's inputs (none open yet)
  for (int64_t e : order) {
    if (used + length(e) - 1 > ctx) packs_.emplace_back(), used = 0;
    packs_.back().push_back(e);
    used += length(e) - 1;
  }
}

int64_t ExampleSet::inputs(int64_t u) const {
  int64_t n = 0;
  for (int64_t e : unit(u)) n += length(e) - 1;
  return n;
}

std::vector<int64_t> ExampleSet::longest_row() const {
  std::vector<int64_t> row;
  if (size() == 0) return row;
  int64_t longest = 0;
  for (int64_t u = 1; u < size(); ++u) longest = inputs(u) > inputs(longest) ? u : longest;
  for (int64_t e : unit(longest)) row.push_back(length(e) - 1);
  return row;
}

std::vector<int64_t> ExampleSet::draw(uint64_t seed, int64_t index, int64_t batch) const {
  const int64_t n = size();
  WEFT_CHECK(n > 0, "transformer: no example to draw a batch from");
  std::vector<int64_t> picked(static_cast<size_t>(batch));
  for (int64_t k = 0; k < batch; ++k) {
    const int64_t slot = index * batch + k, epoch = slot / n;
    if (epoch != epoch_) {
      order_.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) order_[size_t(i)] = i;
      Generator g(seed * 1000003ull + uint64_t(epoch) + 1);
      for (int64_t i = n - 1; i > 0; --i) std::swap(order_[size_t(i)], order_[g.next_u64() % uint64_t(i + 1)]);
      epoch_ = epoch;
    }
    picked[size_t(k)] = order_[size_t(slot % n)];
  }
  return picked;
}

std::vector<int64_t> ExampleSet::draw_once(uint64_t seed, int64_t index, int64_t batch) const {
  std::vector<int64_t> picked = draw(seed, 0, std::min(size(), (index + 1) * batch));
  picked.erase(picked.begin(), picked.begin() + std::min<int64_t>(int64_t(picked.size()), index * batch));
  picked.resize(size_t(batch), -1);
  return picked;
}

ExampleRows ExampleSet::rows(const std::vector<int64_t>& picked, int64_t lo, int64_t hi) const {
  WEFT_CHECK(0 <= lo && lo <= hi && hi <= int64_t(picked.size()), "ExampleSet: rows [{}, {}) outside [0, {})", lo, hi,
             picked.size());
  int64_t T = 1;
  for (int64_t u : picked) T = std::max(T, inputs(u));
  ExampleRows out{zeros({hi - lo, T}, {.dtype = kInt64}), full({hi - lo, T}, double(kIgnoreLabel), {.dtype = kInt64})};
  if (packed()) out.positions = zeros({hi - lo, T}, {.dtype = kInt64});
  int64_t* xp = out.x.data<int64_t>();
  int64_t* yp = out.y.data<int64_t>();
  int64_t* pp = packed() ? out.positions.data<int64_t>() : nullptr;
  for (int64_t r = 0; r < hi - lo; ++r) {
    int64_t at = r * T;
    for (int64_t e : unit(picked[size_t(lo + r)])) {
      const int64_t s = starts_[size_t(e)];
      for (int64_t t = 0; t + 1 < length(e); ++t, ++at) {
        xp[at] = ids_[s + t];
        if (labels_[s + t + 1] == kLabelTrained) yp[at] = ids_[s + t + 1];
        if (pp) pp[at] = t;
      }
    }
    for (int64_t t = 0; pp && at < (r + 1) * T; ++t, ++at) pp[at] = t;  // the padding: a document of its own
  }
  return out;
}

int64_t ExampleSet::targets(const std::vector<int64_t>& picked) const {
  int64_t n = 0;
  for (int64_t u : picked)
    for (int64_t e : unit(u)) n += targets_[size_t(e)];
  return n;
}

}  // namespace weft::apps
