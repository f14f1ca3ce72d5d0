// apps/transformer: the commands that read a trained model: sample (text from it, with a key/value cache), eval
// (its loss and perplexity on a dataset), export-hf (a Hugging Face model directory) and export-peft (a LoRA run's
// adapters for peft).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "apps/common/cli.h"
#include "apps/common/device.h"
#include "apps/common/nonfinite.h"
#include "apps/common/output_paths.h"
#include "apps/common/resume.h"
#include "apps/common/trainer.h"
#include "apps/transformer/block_eval.h"
#include "apps/transformer/checkpoint_description.h"
#include "apps/transformer/commands.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/lora_settings.h"
#include "apps/transformer/peft_adapter.h"
#include "apps/transformer/token_data.h"
#include "apps/transformer/utf8.h"
#include "core/element_search.h"
#include "core/trace.h"
#include "weft.h"

namespace weft::apps::transformer {

namespace {

// The model a sample or an export reads: a Hugging Face directory, a checkpoint directory (the latest in it) or one
// file (weft-checkpoint consolidate's, or any with the same description and the family's names; a tied head's
// lm_head.weight must equal the embedding). Whole, on the CPU; or, with `shard`, built on the meta device and
// fully_shard per block and at the root over the world (default options), each rank reading its own shards. In `dtype`:
// built on the meta device in it, so that bf16 weights are read straight into bf16 parameters (others converted). A NaN
// or infinity in any parameter throws, naming it: Hugging Face and peft files are checked as they are read
// (fsdp/external_checkpoint.h), a weft checkpoint after its load.
struct LoadedModel {
  apps::LanguageModel lm;
  std::optional<fsdp::FSDPModule> root;  // with `shard`
  std::map<std::string, std::string> recorded;  // a checkpoint's training description (tokenizer_sha256, ...)
  nn::LoRAOptions lora{.rank = 0};              // a LoRA run's adapters (rank 0: none)
};
// The Hugging Face directory a model came from: --from itself, or the run's --init-from ("" if neither). With `lost`
// (what goes unread without it), a recorded --init-from that is gone is said so.
std::string hf_source(const std::string& from, const std::map<std::string, std::string>& recorded,
                      const char* lost = nullptr) {
  if (apps::is_hf_dir(from)) return from;
  const auto it = recorded.find("hf_source");
  const std::string source = it != recorded.end() ? it->second : "";
  if (source.empty() || apps::is_hf_dir(source)) return source;
  if (lost) std::fprintf(stderr, "weft-transformer: warning: %s, the run's --init-from, is gone: %s\n", source.c_str(), lost);
  return "";
}

// The tokenizer.json of a Hugging Face directory ("" for none).
std::string source_tokenizer(const std::string& source) {
  return !source.empty() && WEFT_FS(std::filesystem::exists(source + "/tokenizer.json")) ? source + "/tokenizer.json" : "";
}
// The tokenizer whose ids the model reads: a run's recorded one ("" for text, as bytes), else its source's.
std::string model_tokenizer_digest(const LoadedModel& loaded, const std::string& source) {
  const auto& r = loaded.recorded;
  if (r.count("train_sha256")) return r.count("tokenizer_sha256") ? r.at("tokenizer_sha256") : "";
  return source_tokenizer(source).empty() ? "" : apps::tokenizer_digest(source_tokenizer(source));
}

// A rotary model fine-tuned from a Hugging Face directory at a shorter --ctx reads as far as its export-hf does.
apps::ModelConfig with_source_context(apps::ModelConfig cfg, const std::map<std::string, std::string>& recorded) {
  if (const std::string source = hf_source("", recorded); cfg.arch == "llama" && !source.empty())
    cfg.ctx = std::max(cfg.ctx, apps::read_hf_config(source).ctx);
  return cfg;
}

LoadedModel load_model(const std::string& from, bool say, bool shard = false, Device device = kCPU,
                       DType dtype = kFloat32) {
  LoadedModel m;
  auto build = [&](const apps::ModelConfig& cfg, const nn::LoRAOptions& lora) {
    m.lm = apps::make_model_to_load(cfg);
    apps::add_lora(m.lm, lora, true);  // a LoRA run's checkpoint holds its adapters too
    m.lora = lora;
    m.lm.module->to(dtype);
    if (!shard) return apps::check_fits_host(cfg), nn::materialize(*m.lm.module, kCPU);
    const fsdp::FullyShardOptions opts{.mesh = dist::default_mesh(device.type)};
    for (auto& block : m.lm.blocks) fsdp::fully_shard(block, opts);
    m.root = fsdp::fully_shard(m.lm.module, opts);
  };
  const fsdp::FSDPModule* root = nullptr;
  if (apps::is_hf_dir(from)) {
    build(apps::read_hf_config(from), {.rank = 0});
    if (m.root) root = &*m.root;
    apps::load_hf_checkpoint(from, m.lm, root);
    return m;
  }
  if (apps::is_peft_dir(from)) {  // a peft adapter: its base model, then its adapters
    const apps::PeftAdapter a = apps::read_peft_adapter(from);
    const apps::ModelConfig cfg = apps::read_hf_config(a.base);
    build(cfg, {.rank = a.lora.rank, .alpha = a.lora.alpha, .dropout = a.lora.dropout,
                .targets = a.lora.targets.empty() ? apps::lora_targets("", cfg) : a.lora.targets});
    if (m.root) root = &*m.root;
    apps::load_hf_checkpoint(a.base, m.lm, root);
    apps::load_peft_weights(a, m.lm, root);
    m.recorded["hf_source"] = a.base;  // its tokenizer and generation files
    return m;
  }
  if (WEFT_FS(std::filesystem::is_regular_file(from))) {
    const std::filesystem::path file(from);
    WEFT_CHECK(file.filename() != "index.json" && file.filename() != "config.json", "transformer: {} is "
               "a file of a {} directory: pass the directory, {}", from, file.filename() == "config.json" ?
               "Hugging Face model" : "checkpoint", file.parent_path().string());
    WEFT_CHECK(!shard, "transformer: {} is one consolidated file, read whole: sample it without --fsdp, or from the "
               "checkpoint directory it was made from", from);
    auto contents = load_safetensors(from);
    WEFT_CHECK(!contents.metadata.count("lora_base_sha256"), "transformer: {} holds only LoRA adapters (the base is "
               "{}): read the checkpoint directory it was made from instead", from, contents.metadata["hf_source"]);
    const auto cfg = with_source_context(config_of(contents.metadata, from), contents.metadata);
    build(cfg, apps::lora_of(contents.metadata, from));
    std::erase_if(contents.tensors, [](auto& t) { return t.first.starts_with("optim."); });  // --with-optimizer's
    fsdp::load_full_state_dict(*m.lm.module, contents.tensors, nullptr, head_alias(cfg));
    m.recorded = contents.metadata;
    apps::check_finite_parameters(*m.lm.module, fmt::format("transformer: refusing to load {}", from));
    return m;
  }
  std::string where = apps::readable_checkpoint(from, "transformer", say, false);
  WEFT_CHECK(!where.empty(), "transformer: no checkpoint at {} (neither a Hugging Face directory, a checkpoint directory "
             "nor a safetensors file)", from);
  m.recorded = fsdp::read_checkpoint_index(where).training.app;
  build(with_source_context(config_of(m.recorded, where), m.recorded), apps::lora_of(m.recorded, where));
  if (m.root) root = &*m.root;
  const std::string base = lora_base(m.recorded, where);  // a LoRA checkpoint of adapters only: its base first
  if (!base.empty()) apps::load_hf_checkpoint(base, m.lm, root);
  fsdp::load_checkpoint(where, *m.lm.module, nullptr, root, {.restore_rng = false, .frozen_elsewhere = !base.empty()});
  apps::check_finite_parameters(*m.lm.module, fmt::format("transformer: refusing to load {}", from));
  return m;
}

// --eos: a token id, or a token of the tokenizer; "none": never stop; not given: the eos ids of
// the generation_config.json (or config.json) of the Hugging Face directory the model came from, if any.
std::vector<int64_t> eos_ids(const std::string& eos, const apps::BpeTokenizer* tok, int64_t vocab,
                             const apps::HfGenerationConfig& gen) {
  if (eos == "none") return {};
  if (eos.empty()) {
    std::vector<int64_t> ids = gen.eos, outside;  // ids no token has never match, as in transformers: said, dropped
    std::erase_if(ids, [&](int64_t id) { return (id < 0 || id >= vocab) && (outside.push_back(id), true); });
    if (!outside.empty())
      std::fprintf(stderr, "weft-transformer: %s's eos id(s) %s lie outside the vocabulary of %lld: no token matches "
                   "them\n", gen.file.c_str(), fmt::format("{}", fmt::join(outside, ",")).c_str(), (long long)vocab);
    if (!ids.empty())
      std::fprintf(stderr, "weft-transformer: stopping after eos id(s) %s (%s; --eos none: never)\n",
                   fmt::format("{}", fmt::join(ids, ",")).c_str(), gen.file.c_str());
    return ids;
  }
  int64_t id = -1;
  if (eos.find_first_not_of("0123456789") == std::string::npos && eos.size() < 10) id = std::stoll(eos);
  else if (tok) id = tok->id_of(eos);
  WEFT_CHECK(id >= 0 && id < vocab, "transformer: --eos \"{}\" is not a token id below the vocabulary of {}{}", eos,
             vocab, tok ? " nor a token of --tokenizer" : " (a token's text needs --tokenizer)");
  return {id};
}

// The generated text as the tokenizer decodes the whole of it (bytes that are no character as U+FFFD, as tokenizers'
// decode), written to stdout as it grows. What a later token may still change waits: a run of byte tokens (decoded
// together) until another token ends it, and a trailing U+FFFD that a later byte-level token may complete. Only the
// ids since the text was last all written are decoded again.
class TextStream {
 public:
  explicit TextStream(const apps::BpeTokenizer& tok) : tok_(tok) {}
  void add(int64_t id) {
    ids_.push_back(int32_t(id));
    if (!tok_.byte_token(int32_t(id))) write(false);
  }
  void finish() { write(true); }

 private:
  void write(bool all) {
    const std::string text = tok_.decode(ids_, false, false), replacement = "\xef\xbf\xbd";
    size_t end = text.size();
    while (!all && end >= written_.size() + 3 && text.compare(end - 3, 3, replacement) == 0) end -= 3;
    if (end <= written_.size() || text.compare(0, written_.size(), written_) != 0) return;  // nothing new, or not final
    std::fwrite(text.data() + written_.size(), 1, end - written_.size(), stdout);
    written_ = text.substr(0, end);
    if (end == text.size()) ids_.clear(), written_.clear();  // all of it final: the next tokens decode on their own
  }
  const apps::BpeTokenizer& tok_;
  std::vector<int32_t> ids_;
  std::string written_;
};

// --temperature, --top-k and --top-p where given; the others from the generation_config.json (or
// config.json) of the Hugging Face directory the model came from (do_sample false or absent:
// greedy), stderr naming what it took; without one, weft's defaults.
nn::SamplingOptions sampling_of(const SampleOptions& o, const apps::HfGenerationConfig& gen) {
  nn::SamplingOptions s{.repetition_penalty = o.repetition_penalty, .temperature = o.temperature, .top_k = o.top_k,
                        .top_p = o.top_p};
  if (!gen.found) return s;
  std::vector<std::string> taken;
  if (!o.repetition_penalty_set && gen.repetition_penalty != 1)  // greedy too
    s.repetition_penalty = gen.repetition_penalty, taken.push_back(fmt::format("repetition_penalty {}", gen.repetition_penalty));
  if (!o.temperature_set) {
    s.temperature = gen.do_sample ? gen.temperature : 0;
    taken.push_back(gen.do_sample ? fmt::format("temperature {}", s.temperature) : "greedy (do_sample false)");
  }
  // Sampling (do_sample, or a --temperature): its top_k and top_p, as generate(do_sample=True, ...) takes them.
  if (!o.top_k_set && s.temperature > 0) s.top_k = gen.top_k, taken.push_back(fmt::format("top_k {}", s.top_k));
  if (!o.top_p_set && s.temperature > 0) s.top_p = gen.top_p, taken.push_back(fmt::format("top_p {}", s.top_p));
  if (!taken.empty())
    std::fprintf(stderr, "weft-transformer: sampling %s, as %s says (flags override)\n",
                 fmt::format("{}", fmt::join(taken, ", ")).c_str(), gen.file.c_str());
  return s;
}

// The Hugging Face directory whose tokenizer and generation files sample reads: the model's, unless its run trained on
// other ids than its tokenizer's (text as bytes, or another tokenizer's files): no stop id of it applies then.
std::string sample_source(const SampleOptions& o, const LoadedModel& loaded, const Ranks& ranks) {
  const std::string source = hf_source(o.checkpoint, loaded.recorded, ranks.lead() ? "its generation_config.json (stop "
                                       "ids, sampling defaults), context and tokenizer are not read" : nullptr);
  const std::string tok = source_tokenizer(source), on = model_tokenizer_digest(loaded, source);
  if (tok.empty() || on == apps::tokenizer_digest(tok)) return source;  // without a tokenizer, its ids are bytes too
  if (ranks.lead())
    std::fprintf(stderr, "weft-transformer: %s was trained on %s: %sthe tokenizer and generation files of %s are not "
                 "used\n", o.checkpoint.c_str(), apps::describe_tokens(on).c_str(),
                 on.empty() ? "the prompt is read as bytes, and " : "", source.c_str());
  return "";
}

// --tokenizer (by default the tokenizer.json of the Hugging Face directory the model came from),
// checked against the model's vocabulary and the tokenizer its checkpoint records.
std::optional<apps::BpeTokenizer> sample_tokenizer(const SampleOptions& o, const LoadedModel& loaded,
                                                   const std::string& source) {
  const int64_t vocab = loaded.lm.cfg.vocab_size;
  const auto recorded = loaded.recorded.find("tokenizer_sha256");  // a run on token files: its tokenizer's
  std::optional<apps::BpeTokenizer> tok;
  std::string path = o.tokenizer;
  if (path.empty() && !source_tokenizer(source).empty()) {
    path = source_tokenizer(source);
    std::fprintf(stderr, "weft-transformer: tokenizer %s (the model's; --tokenizer to give another)\n", path.c_str());
  }
  WEFT_CHECK(path.empty() || !loaded.recorded.count("train_bytes"), "transformer: {} was trained on text (bytes), whose "
             "ids a --tokenizer's are not: leave --tokenizer out", o.checkpoint);
  if (!path.empty()) {
    tok.emplace(path);
    WEFT_CHECK(tok->vocab_size() <= vocab, "transformer: --tokenizer {} has {} tokens, more than {}'s "
               "vocabulary of {}", path, tok->vocab_size(), o.checkpoint, vocab);
    if (recorded != loaded.recorded.end()) {
      const std::string digest = apps::tokenizer_digest(path);
      WEFT_CHECK(recorded->second == digest, "transformer: {} {} is not the tokenizer {} was trained with (sha256 {}, the "
                 "checkpoint records {}): give the dataset's tokenizer.json with --tokenizer", o.tokenizer.empty() ?
                 "the model's tokenizer" : "--tokenizer", path, o.checkpoint, digest, recorded->second);
    }
  }
  if (!tok && o.prompt_ids.empty() && !loaded.recorded.count("train_bytes")) apps::check_tokenizer_readable(source, "the prompt");
  WEFT_CHECK(tok || recorded == loaded.recorded.end() || !o.prompt_ids.empty(), "transformer: {} was trained on the ids "
             "of a tokenizer (sha256 {}), which a prompt's bytes are not: give that tokenizer.json with --tokenizer, or "
             "the prompt's ids with --prompt-ids", o.checkpoint, recorded->second);
  WEFT_CHECK(o.ids || tok || vocab == 256 || loaded.recorded.count("train_bytes"), "transformer: {} has a vocabulary of {} tokens, not 256 bytes: "
             "give its --tokenizer (the tokenizer.json of the dataset it was trained on) or print token ids with --ids",
             o.checkpoint, vocab);
  return tok;
}

// The prompt's tokens: its bytes, or the tokenizer's encoding (with its special tokens, as
// `transformers` encodes a prompt, unless --no-special).
std::vector<int64_t> prompt_ids(const SampleOptions& o, const apps::BpeTokenizer* tok, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t id : o.prompt_ids)
    WEFT_CHECK(id >= 0 && id < vocab, "transformer: --prompt-ids: {} is not a token of {}'s vocabulary of {}", id,
               o.checkpoint, vocab);
  WEFT_CHECK(!o.no_special || tok, "transformer: --no-special leaves out the special tokens a tokenizer adds to "
             "--prompt, and {} reads bytes (no tokenizer)", o.checkpoint);
  if (!o.prompt_ids.empty()) return o.prompt_ids;
  if (tok) {
    WEFT_CHECK(apps::utf8::valid(o.prompt), "transformer: --prompt is not valid UTF-8 text, which the tokenizer encodes");
    for (int32_t id : tok->encode(o.prompt, !o.no_special)) ids.push_back(id);
  } else {
    for (unsigned char c : o.prompt) {
      WEFT_CHECK(int64_t(c) < vocab, "transformer: the prompt's byte {} is not a token of {}'s vocabulary "
                 "of {}", int(c), o.checkpoint, vocab);
      ids.push_back(c);
    }
  }
  WEFT_CHECK(!ids.empty(), "transformer: --prompt must not be empty (it starts the text)");
  return ids;
}

// --logits-out: the prompt's logits [T, vocab] (f32), as the model computes them in one forward.
void write_prompt_logits(nn::Module& model, const std::vector<int64_t>& ids, int64_t ctx, Device device,
                         const std::string& path, const Ranks& ranks) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t t = std::min<int64_t>(int64_t(ids.size()), ctx);
  Tensor x = empty({1, t}, {.dtype = kInt64});
  std::copy(ids.end() - t, ids.end(), x.data<int64_t>());
  Tensor logits = model(x.to(device)).select(0, 0).to(kCPU).to(kFloat32).contiguous();  // [t, vocab]
  if (auto bad = find_nonfinite(logits))  // on every rank alike: each holds the whole logits
    WEFT_ERROR("transformer: the prompt's logits hold {} ([{}, {}]): nothing was written to {} (the model's weights or "
               "config give non-finite values)", bad->str(), t, logits.size(1), path);
  if (ranks.lead()) save_safetensors(path, {{"logits", logits}}, {{"prompt_tokens", std::to_string(t)}});
}

// An existing --logits-out file is replaced only if an earlier --logits-out wrote it: any other file is the user's.
bool is_logits_file(const std::string& path) try {
  const SafetensorsReader file(path);
  return file.entries().size() == 1 && file.metadata().count("prompt_tokens");
} catch (const Error&) {  // not a safetensors file
  return false;
}

}  // namespace

// What makes the tokens differ from transformers' generate, named on stderr: the context or window passed, fields of the
// generation config weft does not apply, a prompt past the context (cut to its last ctx tokens).
void warn_unlike_transformers(const SampleOptions& o, const apps::ModelConfig& cfg, const apps::HfGenerationConfig& gen,
                              const nn::SamplingOptions& s, int64_t prompt) {
  if (s.temperature <= 0 && (o.top_k_set || o.top_p_set))  // they filter only sampled tokens: ignored, as it warns
    std::fprintf(stderr, "weft-transformer: warning: --top-k and --top-p filter only sampled tokens, and this run is "
                 "greedy (%s): give --temperature to sample\n", o.temperature_set ? (o.greedy ? "--greedy" :
                 "--temperature 0") : ("do_sample false in " + gen.file).c_str());
  // The last new token is never fed back: positions up to prompt + tokens - 1 enter the model.
  if (const bool window = cfg.ctx == cfg.sliding_window; prompt + o.tokens - 1 > cfg.ctx && prompt <= cfg.ctx)
    std::fprintf(stderr, "weft-transformer: warning: %lld prompt and %lld new tokens pass the %s of %lld: weft starts "
                 "again from the last half of it there%s\n", (long long)prompt, (long long)o.tokens,
                 window ? "sliding_window" : "model's context", (long long)cfg.ctx,
                 window ? ", where transformers slides it, so the tokens differ from that point" : "");
  if (!gen.ignored.empty())
    std::fprintf(stderr, "weft-transformer: warning: %s sets %s, which weft does not apply (it samples with "
                 "repetition_penalty, temperature, top_k and top_p, --tokens new tokens): the tokens may differ from "
                 "transformers' generate\n", gen.file.c_str(), fmt::format("{}", fmt::join(gen.ignored, ", ")).c_str());
  if (prompt > cfg.ctx)
    std::fprintf(stderr, "weft-transformer: warning: the prompt's %lld tokens are past the context of %lld: the model "
                 "sees its last %lld\n", (long long)prompt, (long long)cfg.ctx, (long long)cfg.ctx);
}

// The rates of a generation, on stderr.
void print_generate_stats(const nn::GenerateStats& st, bool no_cache) {
  const double total = st.prefill_seconds + st.decode_seconds;
  if (st.new_tokens > 0)
    std::fprintf(stderr, "weft-transformer: %lld tokens in %.3f s (%.1f tokens/s; prompt of %lld tokens %.1f ms, then "
                 "%.1f tokens/s%s; %s)\n", (long long)st.new_tokens, total, double(st.new_tokens) / total,
                 (long long)st.prompt_tokens, 1e3 * st.prefill_seconds,
                 st.new_tokens > 1 ? double(st.new_tokens - 1) / st.decode_seconds : 0.0,
                 st.prefills > 1 ? fmt::format(", {} restart{} at a full context", st.prefills - 1, st.prefills > 2 ? "s" : "").c_str() : "",
                 no_cache ? "no cache" : fmt::format("key/value cache of {:.1f} MiB", double(st.cache_bytes) / (1 << 20)).c_str());
}

int sample(const SampleOptions& o, const Ranks& ranks) {
  const Device device = apps::parse_device(o.device, "transformer");
  apps::cli::use_threads(o.threads);
  WEFT_CHECK(o.tokens >= 0, "transformer: --tokens must be non-negative");
  apps::check_outputs_apart({{"--logits-out", o.logits_out, false, is_logits_file, "the logits an earlier --logits-out "
                             "wrote"}, {"WEFT_TRACE", trace::file()}}, {{"--from", o.checkpoint}, {"--tokenizer", o.tokenizer}},
                            "transformer");
  LoadedModel loaded;
  const auto load_start = std::chrono::steady_clock::now();
  dist::agree(ranks.groups(), "transformer", [&] {  // sharded: on the device; else on the CPU, then moved
    loaded = load_model(o.checkpoint, ranks.lead(), ranks.fsdp, ranks.fsdp ? device : kCPU, o.dtype == "bf16" ? kBFloat16 : kFloat32);
    if (!ranks.fsdp) loaded.lm.module->to(device);
  });
  if (ranks.lead())
    std::fprintf(stderr, "weft-transformer: loaded %s in %.2f s\n", o.checkpoint.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
  nn::Module& model = *loaded.lm.module;
  const apps::ModelConfig& cfg = loaded.lm.cfg;
  const std::string source = sample_source(o, loaded, ranks);
  const std::optional<apps::BpeTokenizer> tok = sample_tokenizer(o, loaded, source);
  const std::vector<int64_t> ids = prompt_ids(o, tok ? &*tok : nullptr, cfg.vocab_size);
  WEFT_CHECK(o.logits_out.empty() || int64_t(ids.size()) <= cfg.ctx, "transformer: --logits-out writes a row per prompt "
             "token, and the prompt's {} tokens are past {}'s context of {}: shorten it", ids.size(), o.checkpoint, cfg.ctx);
  const apps::HfGenerationConfig gen = source.empty() ? apps::HfGenerationConfig{} : apps::read_hf_generation_config(source);
  const nn::SamplingOptions sampling = sampling_of(o, gen);
  if (ranks.lead()) warn_unlike_transformers(o, cfg, gen, sampling, int64_t(ids.size()));
  nn::GenerateOptions g{.max_new_tokens = o.tokens,
                        .sampling = sampling,
                        .seed = o.seed,
                        .eos = eos_ids(o.eos, tok ? &*tok : nullptr, cfg.vocab_size, gen),
                        .use_cache = !o.no_cache};
  if (ranks.fsdp)  // every rank takes rank 0's token, so all run the same steps and stop together
    g.agree = [](int64_t token) {
      Tensor t = full({1}, double(token), {.dtype = kFloat64});
      dist::world()->broadcast(t, 0)->wait();
      return int64_t(t.item());
    };
  if (!o.logits_out.empty()) write_prompt_logits(model, ids, cfg.ctx, device, o.logits_out, ranks);
  const bool print = ranks.lead();
  std::string printed;
  std::optional<TextStream> stream;
  if (tok) stream.emplace(*tok);
  int64_t unprintable = 0;  // a byte model's ids past its bytes (one trained on bytes from a larger vocabulary)
  auto text = [&](int64_t token) {
    if (!tok && token < 256) std::fputc(int(token), stdout);
    else if (tok && token < tok->vocab_size()) stream->add(token);
    else ++unprintable;
  };
  if (print && !o.ids && o.prompt_ids.empty()) std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  if (print && !o.ids) std::for_each(o.prompt_ids.begin(), o.prompt_ids.end(), text);
  auto on_token = [&](int64_t next) {
    if (!print) return;
    if (o.ids) printed += (printed.empty() ? "" : ",") + std::to_string(next);
    else text(next);
    std::fflush(stdout);
  };
  nn::GenerateStats st;
  nn::generate(model, ids, g, on_token, &st);
  if (!print) return 0;
  if (o.ids) std::fputs(printed.c_str(), stdout);
  if (stream) stream->finish();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (unprintable > 0)
    std::fprintf(stderr, "weft-transformer: %lld token(s) past the tokenizer's or the 256 bytes' ids were not printed "
                 "(--ids prints every id)\n", (long long)unprintable);
  print_generate_stats(st, o.no_cache);
  return 0;
}

int export_hf(const ExportOptions& o) {
  const int64_t shard = parse_bytes(o.max_shard_size, "transformer: --max-shard-size");
  WEFT_CHECK(shard > 0, "transformer: --max-shard-size must be positive");
  apps::check_outputs_apart({{"--out", o.out, true}}, {{"--from", o.from}}, "transformer");
  const LoadedModel loaded = load_model(o.from, true);
  WEFT_CHECK(loaded.lora.rank > 0 || !o.merge, "transformer: {} has no LoRA adapters to --merge", o.from);
  WEFT_CHECK(loaded.lora.rank == 0 || o.merge, "transformer: {} holds LoRA adapters (rank {}): export-hf --merge folds "
             "them into the weights of a plain model", o.from, loaded.lora.rank);
  apps::LanguageModel merged;
  if (o.merge) {  // the plain model with W + (alpha / r) B A in each adapted weight
    merged = apps::make_model_to_load(loaded.lm.cfg);
    nn::materialize(*merged.module, kCPU);
    merged.module->load_state_dict(nn::merge_lora(loaded.lm.module->state_dict(), loaded.lora));
  }
  const apps::LanguageModel& lm = o.merge ? merged : loaded.lm;
  // The Hugging Face directory the model came from, whose tokenizer and generation files go along.
  const std::string source = hf_source(o.from, loaded.recorded, "its tokenizer and generation files are not copied");
  // A run's checkpoint takes the source's tokenizer (and the token ids of its files) only if it trained on its tokens.
  const std::string tok = source_tokenizer(source), on = model_tokenizer_digest(loaded, source);
  const bool tokens = tok.empty() || on == apps::tokenizer_digest(tok);
  if (!tokens)
    std::fprintf(stderr, "weft-transformer: %s was trained on %s, not on the tokens of %s (sha256 %s): its tokenizer "
                 "and generation files and token ids are not exported; put the dataset's tokenizer.json beside the "
                 "model\n", o.from.c_str(), apps::describe_tokens(on).c_str(), tok.c_str(), apps::tokenizer_digest(tok).c_str());
  apps::export_hf_checkpoint(lm, o.out, shard, o.dtype == "bf16" ? kBFloat16 : kFloat32, source, tokens);
  std::fprintf(stderr, "weft-transformer: wrote %s (Hugging Face model_type %s, %lld parameters, %s)\n", o.out.c_str(),
               (lm.cfg.family.empty() ? lm.cfg.arch : lm.cfg.family).c_str(),
               (long long)apps::count_parameters(*lm.module), o.dtype.c_str());
  return 0;
}

namespace {

// eval's result (stdout): loss, perplexity and the tokens scored; a non-finite loss is an error.
void print_eval(const EvalOptions& o, const apps::BlockLoss& r) {
  WEFT_CHECK(std::isfinite(r.loss()), "transformer: the loss of {} on {} is {}", o.from, o.data,
             apps::describe_value(r.loss()));
  std::printf("loss %.6f perplexity %s tokens %lld\n", r.loss(), apps::perplexity_text(r.loss(), 4).c_str(), (long long)r.tokens);
}

// eval over a dataset of examples: every example of the split, the mean over its trained targets.
int eval_examples(const EvalOptions& o, nn::Module& model, const apps::TrainingData& data, int64_t ctx) {
  const bool train = o.split == "train";
  const apps::ExampleSet set(train ? data.train : data.val, train ? data.train_labels : data.val_labels, ctx,
                             data.files[train ? 0 : 1]);
  WEFT_CHECK(set.size() > 0, "transformer: no example of the {} part of {} has a target within --ctx {}", o.split,
             o.data, ctx);
  const apps::BlockLoss r = apps::example_loss(model, set, o.batch_size);
  print_eval(o, r);
  std::fprintf(stderr, "weft-transformer: %s on the %s part of %s: %lld examples (%lld skipped: no target within "
               "--ctx %lld; %lld cut at it), %lld trained targets\n", o.from.c_str(), o.split.c_str(), o.data.c_str(),
               (long long)r.blocks, (long long)set.skipped(), (long long)ctx, (long long)set.truncated(),
               (long long)r.tokens);
  return 0;
}

// --data must be in the model's tokens: prepared with the tokenizer its checkpoint records (or its
// Hugging Face directory's tokenizer.json), and text (bytes) only for a model trained on bytes.
void check_data_tokenizer(const EvalOptions& o, const LoadedModel& loaded, const apps::TrainingData& data) {
  const std::string model = model_tokenizer_digest(loaded, hf_source(o.from, loaded.recorded));
  const bool bytes = loaded.recorded.count("train_bytes") > 0;
  const std::string& have = data.tokenizer_sha256;
  if (have.empty() && !bytes) apps::check_tokenizer_readable(hf_source(o.from, loaded.recorded), o.data + "'s text");
  WEFT_CHECK(model.empty() ? have.empty() || !bytes : have == model, "transformer: {} "
             "holds {}, and {} reads {}: prepare it with the model's tokenizer", o.data, apps::describe_tokens(have),
             o.from, apps::describe_tokens(model));
}

}  // namespace

// Loss, perplexity and token count of a model over a split of a dataset, in blocks of ctx + 1
// tokens (apps/transformer/block_eval.h).
int eval(const EvalOptions& o) {
  apps::cli::use_threads(o.threads);
  const LoadedModel loaded = load_model(o.from, true);
  nn::Module& model = *loaded.lm.module;
  apps::TrainingData data;
  apps::load_training_data(o.data, data);
  check_data_tokenizer(o, loaded, data);
  const auto& run = loaded.recorded;  // a checkpoint's: blocks of its run's --ctx by default
  const int64_t ctx = o.ctx > 0 ? o.ctx : run.count("ctx") ? std::stoll(run.at("ctx")) : loaded.lm.cfg.ctx,
                vocab = loaded.lm.cfg.vocab_size;
  apps::check_ctx_within(ctx, loaded.lm.cfg, o.from);
  WEFT_CHECK(vocab >= data.vocab_size, "transformer: {}'s vocabulary of {} is smaller than {}'s {}", o.from, vocab,
             o.data, data.vocab_size);
  if (data.examples()) return eval_examples(o, model, data, ctx);
  const apps::TokenView stream = o.split == "train" ? data.train : data.val;
  const int64_t blocks = apps::block_count(stream, ctx);
  WEFT_CHECK(blocks > 0, "transformer: the {} part of {} ({} tokens) is shorter than one block of --ctx + 1 = {}",
             o.split, o.data, stream.size(), ctx + 1);
  const apps::BlockLoss r = apps::block_loss(model, stream, ctx, 0, blocks, o.batch_size);
  print_eval(o, r);
  std::fprintf(stderr, "weft-transformer: %s on the %s part of %s: %lld blocks of %lld + 1 tokens\n", o.from.c_str(),
               o.split.c_str(), o.data.c_str(), (long long)r.blocks, (long long)ctx);
  return 0;
}

// A LoRA run's adapters for peft: PeftModel.from_pretrained(base, OUT) on the run's --init-from.
int export_peft(const ExportOptions& o) {
  apps::check_outputs_apart({{"--out", o.out, true}}, {{"--from", o.from}}, "transformer");
  const LoadedModel loaded = load_model(o.from, true);
  WEFT_CHECK(loaded.lora.rank > 0, "transformer: {} holds no LoRA adapters (a train --lora-rank run's checkpoint has "
             "them)", o.from);
  const std::string base = hf_source(o.from, loaded.recorded);
  WEFT_CHECK(!base.empty(), "transformer: {} holds the LoRA adapters of a model trained from scratch (no --init-from): "
             "peft puts adapters on a Hugging Face base, and this run has none: write the merged model with export-hf "
             "--merge", o.from);
  apps::export_peft_adapter(loaded.lm, loaded.lora, o.out, WEFT_FS(std::filesystem::absolute(base)).string());
  std::fprintf(stderr, "weft-transformer: wrote %s (LoRA rank %lld on %s, base %s)\n", o.out.c_str(),
               (long long)loaded.lora.rank, apps::lora_fields(loaded.lora).at("lora_targets").c_str(), base.c_str());
  return 0;
}

}  // namespace weft::apps::transformer
