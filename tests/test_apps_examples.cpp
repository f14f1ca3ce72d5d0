// Datasets of examples (apps/transformer/example_data.h, chat_template.h): `prepare` of JSONL
// records gives the ids and masked labels that transformers gives (apply_chat_template with its
// assistant mask, for three chat formats) and the loss of a model over them equals
// transformers' (tests/data/chat, made by scripts/chat_reference.py); batches, cuts and skips;
// bad records named by file and line.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <array>
#include <set>

#include "apps/transformer/block_eval.h"
#include "apps/transformer/bpe_tokenizer.h"
#include "apps/transformer/chat_template.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/text_data.h"
#include "apps/transformer/token_data.h"
#include "apps/transformer/utf8.h"
#include "scratch_dir.h"

using namespace weft;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

const std::string kChat = WEFT_TEST_DATA "/chat";

const test::ScratchDir kScratch("weft_examples");

nlohmann::json expected() {
  std::ifstream in(kChat + "/expected.json");
  return nlohmann::json::parse(in);
}

std::vector<std::string> record_lines() {
  std::ifstream in(kChat + "/records.jsonl");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The records `style` accepts, as a JSONL file.
fs::path accepted_records(const std::string& style, const fs::path& dir) {
  const nlohmann::json rows = expected()[style]["records"];
  const std::vector<std::string> lines = record_lines();
  const fs::path file = dir / "records.jsonl";
  std::ofstream out(file);
  for (size_t i = 0; i < lines.size(); ++i)
    if (rows[i].contains("ids")) out << lines[i] << "\n";
  return file;
}

std::vector<int64_t> concat(const apps::TokenView& a, const apps::TokenView& b) {
  std::vector<int64_t> v;
  for (const apps::TokenView* s : {&a, &b})
    for (int64_t i = 0; i < s->size(); ++i) v.push_back((*s)[i]);
  return v;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace

TEST_CASE("prepare of JSONL records gives transformers' ids and masked labels, and the loss over them equals its",
          "[apps][examples]") {
  const nlohmann::json e = expected();
  apps::LanguageModel lm = apps::make_model(apps::read_hf_config(kChat + "/model"));
  apps::load_hf_checkpoint(kChat + "/model", lm, nullptr);
  for (const std::string style : {"llama3", "chatml", "mistral"}) {
    SECTION(style) {
      const fs::path dir = kScratch.fresh(style);
      const fs::path data = accepted_records(style, dir);
      apps::prepare_examples(kChat + "/" + style, data.string(), (dir / "ds").string(), e[style]["eos"], 0.1, true, "");
      apps::TrainingData d;
      apps::load_training_data((dir / "ds").string(), d);
      REQUIRE(d.examples());
      const std::vector<int64_t> ids = concat(d.train, d.val), labels = concat(d.train_labels, d.val_labels);
      std::vector<int64_t> want_ids, want_labels;
      for (const auto& r : e[style]["records"]) {
        if (!r.contains("ids")) continue;
        for (int64_t id : r["ids"]) want_ids.push_back(id);
        for (int64_t l : r["labels"]) want_labels.push_back(l);
      }
      std::vector<int64_t> got_labels;  // as transformers writes them: the id, or -100
      for (size_t i = 0; i < ids.size(); ++i) got_labels.push_back(labels[i] == apps::kLabelTrained ? ids[i] : -100);
      CHECK(ids == want_ids);
      CHECK(got_labels == want_labels);
      // The loss over all examples: the train and val splits' sums over their targets.
      const apps::ExampleSet train(d.train, d.train_labels, lm.cfg.ctx, "train"), val(d.val, d.val_labels, lm.cfg.ctx, "val");
      const apps::BlockLoss a = apps::example_loss(*lm.module, train, 4), b = apps::example_loss(*lm.module, val, 4);
      const double loss = (a.loss_sum + b.loss_sum) / double(a.tokens + b.tokens), want = e[style]["loss"];
      INFO(style << ": weft " << loss << ", transformers " << want << " over " << a.tokens + b.tokens << " targets");
      CHECK(std::abs(loss - want) <= 1e-5 * std::abs(want));
    }
  }
}

TEST_CASE("a chat template renders as its family's, and roles it has no place for are named", "[apps][examples]") {
  using apps::ChatFormat;
  const std::vector<apps::ChatMessage> chat = {{"user", " hi "}, {"assistant", " yes "}};
  auto text = [](const std::vector<apps::TextPiece>& pieces, bool trained) {
    std::string s;
    for (const auto& p : pieces)
      if (p.trained == trained) s += p.text;
    return s;
  };
  const apps::ChatTemplate llama = apps::load_chat_template(kChat + "/llama3", "");
  CHECK(llama.format == ChatFormat::llama3);
  const auto l = apps::render_chat(llama, chat);
  CHECK(text(l, false) == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(text(l, true) == "yes<|eot_id|>");
  const apps::ChatTemplate chatml = apps::load_chat_template(kChat + "/chatml", "");
  CHECK(chatml.format == ChatFormat::chatml);
  CHECK(chatml.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(text(apps::render_chat(chatml, chat), true) == " yes <|im_end|>");
  const apps::ChatTemplate mistral = apps::load_chat_template(kChat + "/mistral", "");
  CHECK(mistral.format == ChatFormat::mistral);
  CHECK_THROWS_WITH(apps::render_chat(mistral, {{"system", "x"}, {"user", "y"}}),
                    Contains("message 0: role \"system\"") && Contains("mistral chat template has no place"));
  CHECK_THROWS_WITH(apps::render_chat(mistral, {{"user", "x"}, {"user", "y"}}), Contains("alternate"));
  CHECK_THROWS_WITH(apps::render_chat(chatml, {{"tool", "x"}}), Contains("role \"tool\""));
  CHECK_THROWS_WITH(apps::parse_chat_format("vicuna"), Contains("--chat-format vicuna"));
  // --chat-format wins over the recognised template; a template weft does not know is named.
  CHECK(apps::load_chat_template(kChat + "/chatml", "mistral").format == ChatFormat::mistral);
  const fs::path dir = kScratch.fresh("template");
  fs::copy_file(kChat + "/chatml/tokenizer.json", dir / "tokenizer.json");
  write(dir / "tokenizer_config.json", R"({"chat_template": "{% for m in messages %}### {{ m.content }}{% endfor %}"})");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("does not recognise") && Contains("### "));
  fs::remove(dir / "tokenizer_config.json");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("has none"));
}

TEST_CASE("bad JSONL records are named by file and line", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("bad");
  auto fails = [&](const std::string& lines, const std::string& what, const std::string& format = "") {
    write(dir / "d.jsonl", lines);
    CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "out").string(),
                                             "<|endoftext|>", 0.1, true, format),
                      Contains((dir / "d.jsonl").string() + ":2: ") && Contains(what));
  };
  const std::string ok = R"({"text": "fine"})" "\n";
  fails(ok + "[1, 2]\n", "must be a JSON object, got array");
  fails(ok + "{\"text\": \n", "not JSON");
  fails(ok + R"({"text": "\ud800"})" "\n", "not JSON: [json.exception.parse_error.101] parse error at line 1, column 17: "
                                          "syntax error while parsing value - invalid string: surrogate");
  fails(ok + R"({"id": 3})" "\n", "none of them");
  fails(ok + R"({"text": "a", "messages": []})" "\n", "several");
  fails(ok + R"({"prompt": "a"})" "\n", "needs \"completion\" too");
  fails(ok + R"({"text": 5})" "\n", "\"text\" must be a string");
  // With no BOS, an empty text is its EOS alone, the example's first token: never a target.
  fails(ok + R"({"text": ""})" "\n", "no token of the record is trained: its empty \"text\" encodes, with --eos, to no "
        "token after the example's first");
  fails(ok + R"({"messages": [{"role": "user"}]})" "\n", "message 0 must be an object");
  fails(ok + R"({"messages": [{"role": "tool", "content": "x"}]})" "\n", "role \"tool\"");
  fails(ok + R"({"messages": [{"role": "user", "content": "x"}]})" "\n", "which is not a token", "llama3");
  // The fixture's system message in Mistral's format: the record's line is named.
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/mistral", kChat + "/records.jsonl", (dir / "m").string(), "</s>",
                                           0.1, true, ""),
                    Contains("records.jsonl:15: message 0: role \"system\""));
  // --eos ends text and prompt/completion records: a chat's end is its template's, so a tokenizer without the default
  // <|endoftext|> prepares chats, and the first record that needs it is named.
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n";
  write(dir / "chat.jsonl", chat + chat);
  CHECK(apps::prepare_examples(kChat + "/mistral", (dir / "chat.jsonl").string(), (dir / "c").string(), "<|endoftext|>",
                               0.1, true, "").records == 2);
  write(dir / "chat.jsonl", chat + ok);
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/mistral", (dir / "chat.jsonl").string(), (dir / "c2").string(),
                                           "<|endoftext|>", 0.1, true, ""),
                    Contains("chat.jsonl:2: --eos \"<|endoftext|>\" is not a token of"));
  write(dir / "one.jsonl", ok);
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "one.jsonl").string(), (dir / "o").string(),
                                           "<|endoftext|>", 0.1, true, ""), Contains("too few"));
  fs::create_directories(dir / "mixed");
  write(dir / "mixed" / "a.jsonl", ok);
  write(dir / "mixed" / "b.txt", "text");
  CHECK_THROWS_WITH(apps::is_jsonl_data((dir / "mixed").string()), Contains("mixes .jsonl files"));
  fs::remove(dir / "mixed" / "b.txt");
  write(dir / "mixed" / "c.JSONL", ok);  // the extension in any case
  CHECK(apps::is_jsonl_data((dir / "mixed").string()));
}

TEST_CASE("examples are drawn whole, padded with ignored targets, cut at the context or skipped", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("batches");
  write(dir / "d.jsonl", R"({"prompt": "a b c d e f g h i j k l m n o p", "completion": " q"})" "\n"
                         R"({"text": "one two"})" "\n" R"({"prompt": "x", "completion": " y z"})" "\n"
                         R"({"text": "val"})" "\n");
  apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "ds").string(), "<|endoftext|>", 0.1,
                         true, "");
  apps::TrainingData d;
  apps::load_training_data((dir / "ds").string(), d);
  const apps::ExampleSet all(d.train, d.train_labels, 64, "train");
  REQUIRE(all.size() == 3);
  // Each row one example from its start; its targets where labels say; -100 past its end.
  auto [x, y, positions] = all.rows({1, 2}, 0, 2);
  CHECK_FALSE(positions.defined());
  const int64_t T = x.size(1);
  int64_t targets = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < T; ++t) targets += y.data<int64_t>()[r * T + t] != apps::kIgnoreLabel;
  CHECK(targets == all.targets({1, 2}));
  // The completion's tokens and the end-of-text token; the prompt "x" is context.
  CHECK(all.targets({2}) == int64_t(apps::BpeTokenizer(kChat + "/chatml").encode(" y z").size()) + 1);
  // A context that cuts the long prompt before its completion skips it (not counted as cut too); one that cuts the
  // others past their first target keeps them, cut.
  const apps::ExampleSet short_ctx(d.train, d.train_labels, 6, "train");
  CHECK(short_ctx.size() == 2);
  CHECK(short_ctx.skipped() == 1);
  CHECK(short_ctx.truncated() == 0);
  const apps::ExampleSet shorter(d.train, d.train_labels, 1, "train");
  CHECK(shorter.size() == 2);
  CHECK(shorter.skipped() == 1);
  CHECK(shorter.truncated() == 2);
  // Every example once per epoch, in an order drawn anew each epoch: of eight epochs, not all alike.
  std::set<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 8; ++epoch) {
    std::vector<int64_t> seen = all.draw(7, epoch, 3);
    orders.insert(seen);
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int64_t>{0, 1, 2});
  }
  CHECK(orders.size() > 1);
}

namespace {

// Each example's summed loss in a packed row, over the whole batch of `packed`'s units at once,
// against its loss alone in a row of its own (`alone`).
void check_packed_losses(nn::Module& model, const apps::ExampleSet& alone, const apps::ExampleSet& packed) {
  NoGradGuard no_grad;
  auto losses = [&](const apps::ExampleRows& r) {
    Tensor logits = r.positions.defined() ? model({r.x, r.positions})[0] : model(r.x);
    return cross_entropy(logits.reshape({r.y.numel(), logits.size(-1)}), r.y.view({-1}), {.reduction = "none"})
        .to(kFloat64).contiguous();
  };
  std::vector<int64_t> units(size_t(packed.size()));
  for (size_t u = 0; u < units.size(); ++u) units[u] = int64_t(u);
  const apps::ExampleRows rows = packed.rows(units, 0, packed.size());
  const Tensor all = losses(rows);
  const int64_t T = rows.x.size(1);
  int64_t compared = 0;
  for (int64_t u = 0; u < packed.size(); ++u) {
    int64_t at = u * T;
    for (int64_t e : packed.unit(u)) {
      const apps::ExampleRows own = alone.rows({e}, 0, 1);
      const int64_t n = own.x.size(1);
      const double want = sum(losses(own)).item();
      double got = 0;
      for (int64_t t = 0; t < n; ++t) got += all.data<double>()[at + t];
      INFO("unit " << u << " example " << e << " (" << n << " tokens): packed " << got << ", alone " << want);
      CHECK(std::abs(got - want) <= 1e-5 * std::abs(want) + 1e-6);
      at += n, ++compared;
    }
  }
  CHECK(compared == alone.size());
}

}  // namespace

TEST_CASE("packed rows give every example the loss it has alone (Llama and GPT-2)", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("packed");
  apps::prepare_examples(kChat + "/chatml", accepted_records("chatml", dir).string(), (dir / "ds").string(),
                         "<|endoftext|>", 0.1, true, "");
  apps::TrainingData d;
  apps::load_training_data((dir / "ds").string(), d);
  const apps::ExampleSet alone(d.train, d.train_labels, 128, "train"), packed(d.train, d.train_labels, 128, "train",
                                                                                true, 5);
  REQUIRE(packed.examples() == alone.size());
  CHECK(packed.size() < alone.size() / 2);  // several examples per row
  CHECK(packed.targets({0}) > 0);
  SECTION("llama") {
    apps::LanguageModel lm = apps::make_model(apps::read_hf_config(kChat + "/model"));
    apps::load_hf_checkpoint(kChat + "/model", lm, nullptr);
    check_packed_losses(*lm.module, alone, packed);
  }
  SECTION("gpt2") {  // learned positions, the fused q, k, v attention
    manual_seed(4);
    apps::LanguageModel lm = apps::make_model({.vocab_size = 2100, .ctx = 128, .n_layer = 2, .n_head = 2, .d_model = 32});
    apps::init_model(lm);
    check_packed_losses(*lm.module, alone, packed);
  }
  SECTION("positions that do not count from 0 are named") {
    Tensor pos = from_vector({0, 1, 2, 4}, {1, 4}, {.dtype = kInt64});
    CHECK_THROWS_WITH(nn::Documents::from_positions(pos), Contains("row 0 position 3 is 4"));
  }
}

namespace {

// The ids and labels (as transformers writes them: the id, or -100) of the examples prepared from `data`.
std::pair<std::vector<int64_t>, std::vector<int64_t>> prepared(const std::string& tokenizer, const fs::path& data,
                                                               const fs::path& out, const std::string& format = "") {
  apps::prepare_examples(tokenizer, data.string(), out.string(), "<|endoftext|>", 0, true, format);
  apps::TrainingData d;
  apps::load_training_data(out.string(), d);
  const std::vector<int64_t> ids = concat(d.train, d.val), labels = concat(d.train_labels, d.val_labels);
  std::vector<int64_t> got_labels;
  for (size_t i = 0; i < ids.size(); ++i) got_labels.push_back(labels[i] == apps::kLabelTrained ? ids[i] : -100);
  return {ids, got_labels};
}

}  // namespace

TEST_CASE("Qwen3's template and chatml default system messages written with Jinja escapes render as transformers' "
          "apply_chat_template", "[apps][examples]") {
  std::ifstream in(kChat + "/templates.json");
  const nlohmann::json cases = nlohmann::json::parse(in)["cases"];
  for (const nlohmann::json& c : cases) {
    SECTION(c["name"].get<std::string>()) {
      const fs::path dir = kScratch.fresh(c["name"].get<std::string>());
      std::string tokenizer = kChat + "/" + c["dir"].get<std::string>();
      if (c.contains("template")) {  // the chatml fixture's tokenizer with this template
        fs::create_directories(dir / "tok");
        fs::copy_file(tokenizer + "/tokenizer.json", dir / "tok" / "tokenizer.json");
        nlohmann::json config{{"chat_template", c["template"]}};
        if (c.contains("bos_token")) config["bos_token"] = c["bos_token"];  // a chatml template that writes it first
        write(dir / "tok" / "tokenizer_config.json", config.dump());
        tokenizer = (dir / "tok").string();
      }
      std::ofstream data(dir / "d.jsonl");
      std::vector<int64_t> want_ids, want_labels;
      for (const auto& r : c["records"]) {
        data << nlohmann::json{{"messages", r["messages"]}}.dump() << "\n";
        for (int64_t id : r["ids"]) want_ids.push_back(id);
        for (int64_t l : r["labels"]) want_labels.push_back(l);
      }
      data.close();
      const auto [ids, labels] = prepared(tokenizer, dir / "d.jsonl", dir / "ds");
      CHECK(ids == want_ids);
      CHECK(labels == want_labels);
      CHECK(apps::load_chat_template(tokenizer, "").format ==
            (c["name"] == "qwen3" ? apps::ChatFormat::qwen3 : apps::ChatFormat::chatml));
    }
  }
}

TEST_CASE("a chatml default system message weft cannot read, and a <think> template that is not Qwen3's, are named",
          "[apps][examples]") {
  const fs::path dir = kScratch.fresh("unreadable");
  fs::copy_file(kChat + "/chatml/tokenizer.json", dir / "tokenizer.json");
  auto config = [&](const std::string& t) { write(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", t}}.dump()); };
  config("{% set s = 'Be kind.' %}{% if messages[0].role != 'system' %}{{ '<|im_start|>system\\n' + s + "
         "'<|im_end|>\\n' }}{% endif %}{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
         "'<|im_end|>\\n' }}{% endfor %}");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""),
                    Contains("tokenizer_config.json: cannot read the chatml default system message") && Contains("`s +"));
  config("{{ '<|im_start|>system\\nA\\N{BULLET}<|im_end|>' }}");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("a \\N{NAME} escape"));
  // A default written as template text, and the system header joined to messages[0]'s content, are read.
  config("{% if messages[0].role != 'system' %}<|im_start|>system\nPlain 'text'.<|im_end|>\n{% else %}"
         "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% endif %}");
  CHECK(apps::load_chat_template(dir.string(), "").default_system == "Plain 'text'.");
  // QwQ's template strips the reasoning of earlier turns but puts no think block on the last.
  config("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content.split('</think>')[-1] + "
         "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("not Qwen3's"));
  CHECK(apps::load_chat_template(dir.string(), "qwen3").format == apps::ChatFormat::qwen3);
  CHECK(!apps::load_chat_template(dir.string(), "qwen3").default_system);
}

// A template is recognised only where weft renders its text: a chatml template that trims or strips content, or writes
// a BOS other than first, or an EOS, is refused naming it (--chat-format chatml still renders the form); a Mistral
// template other than v0.1's, and any unknown one, is refused saying that --chat-format renders other text.
TEST_CASE("a chat template whose text weft's form does not render is refused, naming what differs", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("differs");
  fs::copy_file(kChat + "/chatml/tokenizer.json", dir / "tokenizer.json");
  auto config = [&](const std::string& t) { write(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", t}}.dump()); };
  const std::string loop = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + CONTENT + '<|im_end|>\\n' }}"
                           "{% endfor %}";
  auto chatml = [&](const std::string& before, const std::string& content, const std::string& after = "") {
    std::string t = loop;
    t.replace(t.find("CONTENT"), 7, content);
    config(before + t + after);
  };
  for (const auto& [before, content, after, what] : std::vector<std::array<std::string, 4>>{
           {"", "m['content'] | trim", "", "`trim`"},
           {"", "m['content'].strip()", "", "`strip(`"},
           {"", "m['content']", "{{ eos_token }}", "`eos_token`"},
           {"{% if false %}{{ bos_token }}{% endif %}", "m['content']", "", "`bos_token`"}}) {
    chatml(before, content, after);
    CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("tokenizer_config.json: a chatml template "
                      "that writes " + what) && Contains("--chat-format chatml renders that form, not this template's"));
    CHECK(apps::load_chat_template(dir.string(), "chatml").format == apps::ChatFormat::chatml);
  }
  chatml("{{- bos_token -}}\n", "m['content']");  // a BOS first is rendered (templates.json: bos_first)
  CHECK(apps::load_chat_template(dir.string(), "").bos_first);
  chatml("", "m['content']");
  CHECK(!apps::load_chat_template(dir.string(), "").bos_first);
  config("{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{- ' [INST] ' + "
         "message['content'] + ' [/INST]' }}{%- else %}{{- ' ' + message['content'] + eos_token }}{%- endif %}"
         "{%- endfor %}");
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("a Mistral template other than v0.1's") &&
                    Contains("not this template's text") && !Contains("to render one of them"));
}

// Markers alone do not make a template its family's: one that filters or calls methods on what it writes, or tests a
// condition the family's template does not (so renders or skips messages otherwise), or a llama3 one that does not trim,
// is refused naming it (each had rendered the form's text: other ids than apply_chat_template's, silently). The
// families' own templates are recognised (Qwen2's, Qwen2.5's, Llama 3's; tests/data/chat holds Qwen3's and Mistral's).
TEST_CASE("a chat template with logic its family's template does not have is refused, naming it", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("logic");
  fs::copy_file(kChat + "/chatml/tokenizer.json", dir / "tokenizer.json");
  auto config = [&](const std::string& t) { write(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", t}}.dump()); };
  const std::string llama3_system = "{{ bos_token }}{% if messages[0]['role'] != 'system' %}{{ '<|start_header_id|>"
      "system<|end_header_id|>\\n\\nYou are a helpful assistant.<|eot_id|>' }}{% endif %}{% for m in messages %}{{ "
      "'<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}";
  for (const auto& [name, text, what] : std::vector<std::array<std::string, 3>>{
           {"chatml", "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | replace('\\r\\n',"
            "'\\n') + '<|im_end|>\\n' }}{% endfor %}", "applies the filter `replace`"},
           {"chatml", "{% for m in messages %}{% if m['role'] != 'system' or loop.first %}{{ '<|im_start|>' + m['role'] "
            "+ '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}",
            "tests a condition of its own (`{% if m['role'] != 'system' or loop.first %}`)"},
           {"chatml", "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content.upper() + '<|im_end|>\\n' }}"
            "{% endfor %}", "calls `upper(...)`"},
           {"llama3", llama3_system, "tests a condition of its own (`{% if messages[0]['role'] != 'system' %}`)"}}) {
    INFO(text);
    config(text);
    CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("tokenizer_config.json: the chat template " +
                      what) && Contains("which weft does not render") && Contains("--chat-format " + name));
    CHECK(apps::load_chat_template(dir.string(), name).format == apps::parse_chat_format(name));
  }
  std::string untrimmed = llama3_system.substr(llama3_system.find("{% for"));
  config(untrimmed);
  CHECK_THROWS_WITH(apps::load_chat_template(dir.string(), ""), Contains("does not `trim` the messages' content"));
  config("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
         "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
         "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
         "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}");  // Llama 3's
  CHECK(apps::load_chat_template(dir.string(), "").format == apps::ChatFormat::llama3);
  config("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
         "You are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
         "assistant\\n' }}{% endif %}");  // Qwen2's
  CHECK(apps::load_chat_template(dir.string(), "").default_system == "You are a helpful assistant.");
  const std::string qwen25 = R"QWEN({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)QWEN";
  config(qwen25);  // Qwen2.5's
  CHECK(apps::load_chat_template(dir.string(), "").default_system ==
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

TEST_CASE("a deeply nested or long message is named without dumping it whole", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("deep");
  const std::string ok = R"({"text": "fine"})" "\n";
  const size_t depth = 200000;
  write(dir / "d.jsonl", ok + "{\"messages\": " + std::string(depth, '[') + std::string(depth, ']') + "}\n" + ok);
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "o").string(),
                                           "<|endoftext|>", 0.1, true, ""),
                    Contains("d.jsonl:2: message 0 must be an object with string \"role\" and \"content\", got an array"));
  // 79 bytes of JSON, then a two-byte character across the 80-byte cut.
  write(dir / "d.jsonl", ok + R"({"messages": [{"role": "user", "content": 1, "note": ")" + std::string(58, 'x') +
                             "\xc3\xa9\xc3\xa9\"}]}\n");
  try {
    apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "o").string(), "<|endoftext|>", 0.1,
                           true, "");
    FAIL("accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("got {\"content\":1,\"note\":\"xxx") && Contains("x..."));
    CHECK(apps::utf8::valid(what));
  }
  write(dir / "d.jsonl", ok + R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": 1}]}]})" "\n");
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "o").string(),
                                           "<|endoftext|>", 0.1, true, ""),
                    Contains("d.jsonl:2: message 0: \"tool_calls\": weft renders a message's content"));
  // The templates test tool_calls for truth: false, null and [] are no tool calls (it was refused as tool calls).
  for (const char* none : {"false", "null", "[]"}) {
    write(dir / "d.jsonl", ok + R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", )"
                               R"("tool_calls": )" + none + "}]}\n");
    CHECK_NOTHROW(apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "o").string(),
                                         "<|endoftext|>", 0.1, true, ""));
  }
  write(dir / "d.jsonl", ok + R"({"messages": [{"role": "assistant", "content": "", "tool_calls": "x"}]})" "\n");
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "d.jsonl").string(), (dir / "o").string(),
                                           "<|endoftext|>", 0.1, true, ""),
                    Contains("d.jsonl:2: message 0: \"tool_calls\" must be a list of tool calls") && Contains("\"x\""));
}

TEST_CASE("a folder of JSONL records follows links to .jsonl files; passed-over links are named", "[apps][examples]") {
  const fs::path dir = kScratch.fresh("links");
  std::string records;
  for (int i = 0; i < 6; ++i) records += R"({"text": "record )" + std::to_string(i) + "\"}\n";
  write(dir / "blob", records);
  fs::create_directories(dir / "snap" / "sub");
  fs::create_symlink(dir / "blob", dir / "snap" / "train.jsonl");  // a Hugging Face snapshot's link
  write(dir / "snap" / "extra.jsonl", R"({"text": "more"})" "\n");
  write(dir / "snap" / "sub" / "skipped.jsonl", R"({"text": "not read"})" "\n");
  fs::create_symlink(dir / "blob", dir / "snap" / "README.md");  // not a .jsonl file: passed over
  CHECK(apps::is_jsonl_data((dir / "snap").string()));
  const auto p = apps::prepare_examples(kChat + "/chatml", (dir / "snap").string(), (dir / "o").string(),
                                        "<|endoftext|>", 0.1, true, "");
  CHECK(p.files == 2);
  CHECK(p.records == 7);
  // A link whose target is missing (a snapshot's shard gone from blobs/) is named, not passed over.
  fs::create_symlink(dir / "gone", dir / "snap" / "train-2.jsonl");
  CHECK_THROWS_WITH(apps::prepare_examples(kChat + "/chatml", (dir / "snap").string(), (dir / "o2").string(),
                                           "<|endoftext|>", 0.1, true, ""),
                    Contains("snap/train-2.jsonl: a symbolic link to " + (dir / "gone").string() + ", which does not exist"));
  fs::remove(dir / "snap" / "train-2.jsonl");
  // Text folders pass over links (the fortunes folder's *.u8 links): when that leaves nothing, the error says so,
  // without the hint about the default data.
  fs::create_directories(dir / "texts");
  fs::create_symlink(dir / "blob", dir / "texts" / "a.txt");
  try {
    apps::text_files((dir / "texts").string());
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Contains("no text found in") && Contains("1 symbolic link(s) or sub-folder(s), "
                                                                                "such as a.txt, which are not read"));
    CHECK_THAT(std::string(e.what()), !Contains("fortunes"));
  }
}

namespace {

// A conversation of `turns` user and assistant messages with spaces, digits, new lines and non-ASCII text.
nlohmann::json long_chat(int turns) {
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < turns; ++i) {
    m.push_back({{"role", "user"}, {"content", fmt::format("question {} about the weather in caf\u00e9 town{}{}", i,
                                                          i % 3 ? "?" : "\n\n", i % 5 ? "" : "  <mask>\u4e2d\u6587[END] ")}});
    m.push_back({{"role", "assistant"}, {"content", fmt::format("{}answer{}: sunny, a light breeze ({} km/h)", i % 4 ? " " : "",
                                                               i, i * 7)}});
  }
  return m;
}

}  // namespace

TEST_CASE("a long conversation gets the ids of its whole text and the labels of its prefixes' encodings",
          "[apps][examples]") {
  for (const std::string style : {"llama3", "chatml", "mistral", "qwen3"}) {
    SECTION(style) {  // against the definition: each run starts where the encoding of the text before it stops agreeing
      const fs::path dir = kScratch.fresh("long_" + style);
      const nlohmann::json chat = long_chat(40);
      write(dir / "d.jsonl", nlohmann::json{{"messages", chat}}.dump() + "\n");
      const auto [ids, labels] = prepared(kChat + "/" + style, dir / "d.jsonl", dir / "ds");
      std::vector<apps::ChatMessage> messages;
      for (const auto& m : chat) messages.push_back({m["role"], m["content"], std::nullopt});
      const auto pieces = apps::render_chat(apps::load_chat_template(kChat + "/" + style, ""), messages);
      const apps::BpeTokenizer tok(kChat + "/" + style);
      std::string whole;
      for (const auto& p : pieces) whole += p.text;
      const std::vector<int32_t> want = tok.encode(whole);
      REQUIRE(ids == std::vector<int64_t>(want.begin(), want.end()));
      std::vector<int64_t> want_labels(want.size(), -100);
      size_t start = 0, end = 0;
      for (size_t k = 0; k < pieces.size(); end += pieces[k].text.size(), ++k) {
        if (k == 0 || pieces[k].trained == pieces[k - 1].trained) continue;
        const std::vector<int32_t> before = tok.encode(std::string_view(whole).substr(0, end));
        size_t same = 0;
        while (same < before.size() && before[same] == want[same]) ++same;
        start = std::max(start, same);  // from here on, this run's flag
        for (size_t i = start; i < want.size(); ++i) want_labels[i] = pieces[k].trained ? want[i] : -100;
      }
      want_labels[0] = -100;
      CHECK(labels == want_labels);
    }
  }
}
