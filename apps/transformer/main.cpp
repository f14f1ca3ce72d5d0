// weft-transformer: decoders of the GPT-2 and Llama families (--arch, or a Hugging Face checkpoint's) trained on
// text or a prepared dataset, in one process or sharded over mpirun's ranks, then sampled, evaluated and exported.
// This file is its command line: each command's flags into its options (commands.h), then the command
// (train_command.cpp; sample, eval, export-hf and export-peft in model_commands.cpp; prepare here).
//   weft-transformer train --steps 200 --checkpoint-dir ck
//   mpirun -np 2 --oversubscribe --bind-to none weft-transformer train --fsdp --threads 1
//   weft-transformer sample --from ck --prompt "Q: " --tokens 200
//   weft-transformer export-hf --from ck --out hf
//   weft-transformer prepare --tokenizer tokenizer.json --data texts/ --out tokens/
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "apps/common/checkpoint_owner.h"
#include "apps/common/cli.h"
#include "apps/common/output_paths.h"
#include "apps/transformer/chat_template.h"
#include "apps/transformer/commands.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/token_data.h"
#include "weft.h"

using namespace weft;
using namespace weft::apps::transformer;

namespace {

// prepare with JSONL records: a dataset of examples (apps/transformer/example_data.h).
int prepare_examples(const PrepareOptions& p) {
  const apps::PreparedExamples d =
      apps::prepare_examples(p.tokenizer, p.data, p.out, p.eos, 0.1, !p.no_special, p.chat_format);
  std::printf("prepared %s: %lld train and %lld val examples (%lld and %lld tokens, %lld of them trained) from %lld "
              "record(s) in %lld file(s) of %s\n", p.out.c_str(), (long long)d.train_examples,
              (long long)d.val_examples, (long long)d.train_tokens, (long long)d.val_tokens,
              (long long)d.trained_tokens, (long long)d.records, (long long)d.files, p.data.c_str());
  return 0;
}

// train's flags for how a step runs: device, sharding, precision, determinism, NaN policy.
void add_step_flags(CLI::App* tr, TrainOptions& t) {
  tr->add_option("--device", t.device, "cpu, cuda (this rank's GPU) or cuda:N: where the model and batches live")
      ->capture_default_str();
  auto* det = tr->add_flag("--deterministic", t.deterministic, "the same bits at any number of ranks and threads (with --mixed-precision "
               "bf16: among --fsdp runs, one rank included): each step's batch split into --virtual-batches "
               "micro-batches, every sum over them in one fixed order (docs/FSDP.md)");
  tr->add_option("--virtual-batches", t.virtual_batches, "with --deterministic: micro-batches per step's batch; the "
                 "number of ranks must divide it into a power of two per rank")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str()->needs(det);
  tr->add_flag("--pack", t.pack, "a dataset of examples (prepare of JSONL): several examples per row, each attending "
               "to itself only, its positions from 0 (without: one example per row, padded)");
  auto* ac_full = tr->add_flag("--activation-checkpointing", t.ac_full, "--ac full");
  tr->add_option("--ac", t.ac, "activation checkpointing of each block: none, selective (keep the outputs of its "
                 "GEMMs and attention, recompute the element-wise ops and norms in backward) or full (keep its input "
                 "only, recompute its whole forward; default none, or with --memory-budget the planner's choice)")
      ->check(CLI::IsMember({"none", "selective", "full"}))->excludes(ac_full);
  apps::add_plan_flags(*tr, t.plan);
  tr->add_flag("--fsdp", t.fsdp, "shard over the ranks of mpirun: fully_shard per block, then the root");
  tr->add_option("--tp", t.tp, "under --fsdp: split each layer over N consecutive ranks (tensor parallel), "
                 "fully_shard over the world / N data-parallel groups")->check(apps::cli::integer(1, 1024))
      ->capture_default_str();
  tr->add_option("--reshard-after-forward", t.reshard_after_forward,
                 "under --fsdp: free each block's gathered parameters after forward (true), keep them for "
                 "backward (false), or keep 1/N per rank and gather within groups of N ranks (N); default true")
      ->check(CLI::IsMember({"true", "false"}) | apps::cli::integer(1, 1 << 20));
  tr->add_option("--sharding-strategy", t.sharding_strategy,
                 "under --fsdp: FULL_SHARD (parameters, gradients and optimizer state sharded), SHARD_GRAD_OP "
                 "(parameters kept gathered from forward to backward) or NO_SHARD (every rank holds the whole "
                 "model; gradients all-reduced, as DDP)")
      ->check(CLI::IsMember({"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"}))->capture_default_str();
  tr->add_option("--mixed-precision", t.mixed_precision,
                 "bf16: linear layers and attention in bf16 with f32 master weights (autocast; under --fsdp: "
                 "bf16 parameters gathered, gradients reduced in f32); none keeps f32")
      ->check(CLI::IsMember({"bf16", "none"}))->capture_default_str();
  tr->add_option("--on-nan", t.on_nan, "when the loss is NaN or infinite: error (stop), skip (drop that step's "
                 "update) or ignore (train on)")->check(CLI::IsMember({"error", "skip", "ignore"}))->capture_default_str();
  tr->add_option("--max-skipped-steps", t.max_skipped, "with --on-nan skip: give up (exit 1) after "
                 "N skipped steps in a row")->check(apps::cli::integer(1, 1000000))->capture_default_str();
  tr->footer(
      "Sharded training: mpirun -np N --oversubscribe --bind-to none weft-transformer train --fsdp ...\n"
      "  --batch-size stays the global batch (a multiple of N): rank r trains on rows [r*B/N, (r+1)*B/N)\n"
      "  of the same batch, so the losses match a single-process run up to float rounding (without --dropout:\n"
      "  each rank draws its rows' masks; --deterministic draws them per virtual batch, at any world size).");
}

// train's model flags: the family and its shape, or --init-from's.
void add_model_flags(CLI::App* tr, TrainOptions& t) {
  auto* arch = tr->add_option("--arch", t.model.arch, "model family: gpt2 (learned positions, LayerNorm, GELU, tied "
                              "head) or llama (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head)")
                   ->check(CLI::IsMember({"gpt2", "llama"}))->capture_default_str();
  auto* init_from = tr->add_option("--init-from", t.init_from, "start from a Hugging Face model directory (config.json "
                                   "+ safetensors; model_type gpt2, llama, mistral, qwen2 or qwen3): its config and weights");
  std::vector<CLI::Option*> shape_flags;
  shape_flags.push_back(tr->add_option("--n-layer", t.model.n_layer, "transformer blocks")->check(apps::cli::integer(1, apps::kMaxLayers))->capture_default_str());
  shape_flags.push_back(tr->add_option("--n-head", t.model.n_head, "attention heads (must divide --d-model)")->check(apps::cli::integer(1, apps::kMaxHeads))
      ->capture_default_str());
  shape_flags.push_back(tr->add_option("--n-kv-head", t.model.n_kv_head, "llama: key/value heads, dividing --n-head (0: as many as "
                 "--n-head)")->check(apps::cli::integer(0, apps::kMaxHeads))->capture_default_str());
  shape_flags.push_back(tr->add_option("--d-model", t.model.d_model, "embedding width")->check(apps::cli::integer(1, apps::kMaxDModel))->capture_default_str());
  shape_flags.push_back(tr->add_option("--ffn-dim", t.model.ffn_dim, "the MLP's hidden width (0: gpt2 4 x --d-model, llama 8/3 x "
                 "--d-model rounded up to a multiple of 32)")->check(apps::cli::integer(0, 16 * apps::kMaxDModel))->capture_default_str());
  shape_flags.push_back(tr->add_option("--rope-theta", t.model.rope_theta, "llama: the rotary embeddings' base")
      ->check(apps::cli::number_above(0))->capture_default_str());
  auto* ctx = tr->add_option("--ctx", t.model.ctx, "context length in bytes")->check(apps::cli::integer(1, apps::kMaxCtx))->capture_default_str();
  tr->add_option("--dropout", t.model.dropout, "dropout probability")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  auto* untie = tr->add_flag("--untie", t.untie, "give the LM head its own weight instead of sharing the token "
                             "embedding (llama is untied unless --tie)");
  shape_flags.push_back(untie);
  auto* tie_flag = tr->add_flag("--tie", t.tie, "llama: share the token embedding with the LM head")->excludes(untie);
  shape_flags.push_back(tie_flag);
  shape_flags.push_back(arch);
  for (CLI::Option* f : shape_flags) f->excludes(init_from);
  tr->parse_complete_callback([&t, shape_flags, ctx] {  // --resume alone takes the checkpoint's model
    t.shape_given = std::any_of(shape_flags.begin(), shape_flags.end(), [](CLI::Option* f) { return f->count() > 0; });
    t.ctx_given = ctx->count() > 0;
  });
}

// train's LoRA flags (nn/lora.h): adapters on the blocks' linear layers, the rest frozen.
void add_lora_flags(CLI::App* tr, TrainOptions& t) {
  auto* rank = tr->add_option("--lora-rank", t.lora.rank, "train LoRA adapters of this rank on the blocks' linear "
                              "layers, every other parameter frozen (0: train every parameter)")
                   ->check(apps::cli::integer(0, 1 << 16))->capture_default_str();
  tr->add_option("--lora-alpha", t.lora.alpha, "the adapters' term is scaled by alpha / rank (default: the rank)")
      ->check(apps::cli::number_above(0))->check(apps::cli::number_from(0, 1e6))->needs(rank);
  tr->add_option("--lora-dropout", t.lora.dropout, "dropout on the adapters' input, in training")
      ->check(apps::cli::number_in_half_open(0, 1))->needs(rank);
  tr->add_option("--lora-targets", t.lora_targets, "comma-separated names of the modules to adapt (default: every "
                 "linear layer of the blocks: llama q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; gpt2 "
                 "c_attn,c_proj,c_fc)")->needs(rank)->check(CLI::Validator([](std::string& s) {
        return s.empty() ? std::string("an empty list: name the modules, or leave the flag out for the default") : "";
      }, "LIST"));
  tr->add_option("--base-dtype", t.base_dtype, "with --lora-rank and --init-from: the frozen base's dtype (bf16 halves "
                 "its memory; the adapters and their optimizer state stay f32; needs --mixed-precision bf16)")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
}

// train's flags: the model, the batches and schedule, checkpoints, and how the step runs.
CLI::App* add_train_flags(CLI::App& app, TrainOptions& t) {
  auto* tr = app.add_subcommand("train", "train a decoder on the bytes of a text file or folder");
  add_model_flags(tr, t);
  add_lora_flags(tr, t);
  tr->add_option("--batch-size", t.batch_size, "sequences per micro-step (the global batch under --fsdp)")
      ->check(apps::cli::integer(1, 1 << 20))->capture_default_str();
  tr->add_option("--grad-accum", t.grad_accum, "micro-steps accumulated per optimizer step")->check(apps::cli::integer(1, 1 << 20))
      ->capture_default_str();
  tr->add_option("--steps", t.steps, "optimizer steps in all (the schedule's length)")
      ->check(apps::cli::integer(1, int64_t(1) << 40))->capture_default_str();
  tr->add_option("--lr", t.lr, "peak learning rate")->check(apps::cli::number_above(0))->capture_default_str();
  tr->add_option("--warmup", t.warmup, "linear warmup steps before the decay (default: 10, at most --steps - 1; a "
                 "given one past --steps ramps to the end)")->check(apps::cli::integer(0, int64_t(1) << 40));
  tr->add_option("--weight-decay", t.weight_decay, "AdamW decay on 2-D weights (matmuls and embeddings; never biases "
                 "or norm weights)")->check(apps::cli::number_from(0, 1e6))->capture_default_str();
  tr->add_option("--lr-schedule", t.lr_schedule, "after the linear warmup: cosine or linear decay to --min-lr at "
                 "--steps, constant, or wsd (warmup-stable-decay: constant, then linear to --min-lr over the last "
                 "--decay-steps)")->check(CLI::IsMember({"cosine", "linear", "constant", "wsd"}))->capture_default_str();
  tr->add_option("--min-lr", t.min_lr, "the learning rate the decay ends at (default: 0.1 x --lr)")
      ->check(apps::cli::number_from(0, 1e6));
  tr->add_option("--decay-steps", t.decay_steps, "--lr-schedule wsd: the final decay's steps (default: a fifth of "
                 "--steps)")->check(apps::cli::integer(1, int64_t(1) << 40));
  tr->add_option("--beta1", t.beta1, "AdamW's beta1")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  tr->add_option("--beta2", t.beta2, "AdamW's beta2")->check(apps::cli::number_in_half_open(0, 1))->capture_default_str();
  tr->add_option("--eps", t.eps, "AdamW's epsilon")->check(apps::cli::number_above(0))->capture_default_str();
  tr->add_option("--clip", t.clip, "gradient norm clip (0: none)")->check(apps::cli::number_from(0, 1e30))->capture_default_str();
  tr->add_option("--seed", t.seed, "seed for initialisation and batches")->check(apps::cli::seed())->capture_default_str();
  tr->add_option("--threads", t.threads, "CPU threads per rank (default: OMP_NUM_THREADS or all cores)")
      ->check(apps::cli::threads());
  tr->add_option("--metrics", t.metrics, "append JSONL metrics to FILE (rank 0 writes)");
  tr->add_option("--data", t.data, "text file or folder of text files")->capture_default_str();
  tr->add_option("--eval-every", t.eval_every, "steps between validation losses (0: only at the end)")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->capture_default_str();
  tr->add_option("--eval-iters", t.eval_iters, "validation batches per evaluation")->check(apps::cli::integer(1, 1000000))
      ->capture_default_str();
  tr->add_option("--log-every", t.log_every, "steps between metrics lines")->check(apps::cli::integer(1, int64_t(1) << 40))
      ->capture_default_str();
  tr->add_option("--profile", t.profile, "time every op of the steps from step N on (the lead rank's thread; on a GPU "
                 "each op alone) and print a table of them after the run: calls, milliseconds, share of a step, rates")
      ->check(apps::cli::integer(1, int64_t(1) << 40));
  tr->add_option("--stop-after", t.stop_after, "end this run after N steps, keeping the --steps schedule (for --resume)")
      ->check(apps::cli::integer(1, int64_t(1) << 40));
  auto* ck_dir = tr->add_option("--checkpoint-dir", t.checkpoint_dir,
                                "save model, optimizer, RNG and data position to DIR/step_<N>/ (one file per rank + "
                                "index.json); one run at a time may write DIR");
  tr->add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->check(apps::cli::integer(0, int64_t(1) << 40))->needs(ck_dir);
  tr->add_option("--keep-last", t.keep_last, "keep only the K newest checkpoints in --checkpoint-dir (0: all), "
                 "besides them the lowest training loss's, the one before it and the newest known to resume")
      ->check(apps::cli::integer(0, 1000000))->capture_default_str()->needs(ck_dir);
  tr->add_option("--resume", t.resume, "continue from the latest checkpoint in DIR (written at any number of ranks)");
  tr->add_flag(apps::kOverwriteCheckpointsFlag, t.overwrite_checkpoints, "let this run replace the checkpoints "
               "another run wrote to --checkpoint-dir (removed at its first save)")->needs(ck_dir);
  add_step_flags(tr, t);
  return tr;
}
CLI::App* add_sample_flags(CLI::App& app, SampleOptions& s) {
  auto* sa = app.add_subcommand("sample", "generate text from a checkpoint or a Hugging Face model");
  sa->add_option("--from,--checkpoint", s.checkpoint, "a Hugging Face model directory, a checkpoint directory (the "
                 "latest in it) or a consolidated .safetensors file")->required();
  auto* prompt = sa->add_option("--prompt", s.prompt, "text to continue (its bytes are the token ids, or --tokenizer's "
                                "encoding; default: a newline)");
  sa->add_option("--prompt-ids", s.prompt_id_list, "the prompt as token ids, comma-separated (a model trained on "
                 "token files, without its tokenizer)")->excludes(prompt)->check(apps::cli::integer_list(0, INT64_MAX));
  sa->add_option("--tokens,--max-new-tokens", s.tokens, "tokens to generate")
      ->check(apps::cli::integer(0, apps::kMaxSampleTokens))->capture_default_str();
  auto* temperature = sa->add_option("--temperature", s.temperature, "softmax temperature (0: greedy)")
                          ->check(apps::cli::number_from(0, 1e6))->capture_default_str();
  sa->add_flag("--greedy", s.greedy, "always take the most likely token (--temperature 0)")->excludes(temperature);
  sa->add_flag("--ids", s.ids, "print the generated token ids, comma-separated, on one line, instead of text");
  sa->add_option("--tokenizer", s.tokenizer, "tokenizer.json to encode the prompt and decode the output with (a "
                 "model trained on a prepared dataset: its DIR/tokenizer.json; default: the tokenizer.json of the "
                 "Hugging Face directory the model came from, if any)");
  sa->add_flag("--no-special", s.no_special, "encode the prompt without the tokenizer's special tokens (the BOS its "
               "post-processor puts first)")->excludes("--prompt-ids");
  sa->add_option("--logits-out", s.logits_out, "write the prompt's logits [T, vocab] (f32) to FILE.safetensors");
  sa->add_option("--top-k", s.top_k, "draw from the K most likely tokens only (0: all)")
      ->check(apps::cli::integer(0, 1 << 20))->capture_default_str();
  sa->add_option("--top-p", s.top_p, "then from the fewest most likely tokens whose probability reaches P (1: all)")
      ->check(apps::cli::number_from(1e-9, 1))->capture_default_str();
  sa->add_option("--repetition-penalty", s.repetition_penalty, "divide a positive logit (multiply a negative one) of "
                 "each token already in the sequence by P, as transformers (1: off)")
      ->check(apps::cli::number_from(1e-9, 1e9))->capture_default_str();
  sa->add_option("--eos", s.eos, "stop after generating this token: an id, a token of --tokenizer, or none (default: "
                 "the eos ids of the model's Hugging Face generation_config.json, if any)")
      ->check([](const std::string& v) { return v.empty() ? std::string("empty: give an id, a token or none") : ""; });
  sa->add_flag("--no-cache", s.no_cache, "run the whole window again for every token instead of keeping each layer's "
               "keys and values");
  sa->add_flag("--fsdp", s.fsdp, "shard the model over the ranks of mpirun (fully_shard per block, then the root); "
               "rank 0 prints");
  sa->add_option("--seed", s.seed, "seed for drawing")->check(apps::cli::seed())->capture_default_str();
  sa->add_option("--threads", s.threads, "CPU threads")->check(apps::cli::threads());
  sa->add_option("--device", s.device, "cpu, cuda or cuda:N: where the model runs")->capture_default_str();
  sa->add_option("--dtype", s.dtype, "the weights' dtype, and so the computation's: f32, or bf16 (half the bytes "
                 "read per token)")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  return sa;
}

CLI::App* add_export_flags(CLI::App& app, ExportOptions& x) {
  auto* ex = app.add_subcommand("export-hf", "write a checkpoint as a Hugging Face model directory (config.json + "
                                 "safetensors) that transformers' from_pretrained loads");
  ex->add_option("--from", x.from, "checkpoint directory (the latest in it, written at any number of ranks) or a "
                 "consolidated .safetensors file")->required();
  ex->add_option("--out", x.out, "the directory to write (must not exist)")->required();
  ex->add_option("--max-shard-size", x.max_shard_size, "split the weights into files of at most this many bytes "
                 "(with model.safetensors.index.json) when they are larger")->check(apps::cli::bytes())->capture_default_str();
  ex->add_option("--dtype", x.dtype, "the weights' dtype in the files: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  ex->add_flag("--merge", x.merge, "a LoRA run's checkpoint: fold each adapter into its weight, W + (alpha / r) B A, "
               "and write the plain model");
  return ex;
}

CLI::App* add_eval_flags(CLI::App& app, EvalOptions& ev) {
  CLI::App* evc = app.add_subcommand("eval", "a model's loss, perplexity and token count on a dataset's validation "
                                     "(or training) part");
  evc->add_option("--from", ev.from, "a Hugging Face model directory, a checkpoint directory (the latest in it) or a "
                  "consolidated .safetensors file")->required();
  evc->add_option("--data", ev.data, "text file or folder of text files, or a prepared token dataset")->capture_default_str();
  evc->add_option("--split", ev.split, "val: the part training validates on (the last tenth of a text, a dataset's "
                  "val.tokens); train: the rest")->check(CLI::IsMember({"val", "train"}))->capture_default_str();
  evc->add_option("--ctx", ev.ctx, "tokens each block predicts (blocks of ctx + 1 tokens; default: the --ctx a "
                  "checkpoint's run trained at, else the model's context)")->check(apps::cli::integer(1, apps::kMaxCtx));
  evc->add_option("--batch-size", ev.batch_size, "blocks per forward")->check(apps::cli::integer(1, 1 << 20))
      ->capture_default_str();
  evc->add_option("--threads", ev.threads, "CPU threads (default: OMP_NUM_THREADS or all cores)")->check(apps::cli::threads());
  return evc;
}

CLI::App* add_peft_flags(CLI::App& app, ExportOptions& px) {
  CLI::App* pe = app.add_subcommand("export-peft", "write a LoRA run's adapters as a Hugging Face peft adapter "
                                    "directory (adapter_config.json + adapter_model.safetensors)");
  pe->add_option("--from", px.from, "a checkpoint directory of a train --init-from --lora-rank run (the latest in it)")
      ->required();
  pe->add_option("--out", px.out, "the directory to write (must not exist)")->required();
  return pe;
}

CLI::App* add_prepare_flags(CLI::App& app, PrepareOptions& p) {
  auto* pr = app.add_subcommand("prepare", "tokenize text files with a BPE tokenizer.json into a dataset directory "
                                 "(train.tokens, val.tokens, tokenizer.json)");
  pr->add_option("--tokenizer", p.tokenizer, "tokenizer.json (Hugging Face tokenizers format, byte-level BPE)")
      ->required();
  pr->add_option("--data", p.data, "text file or folder of text files; or a .jsonl file or folder of them, one "
                 "example per line: {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\": [{\"role\", "
                 "\"content\"}, ...]} (only completions and assistant messages carry loss)")->capture_default_str();
  pr->add_option("--out", p.out, "the dataset directory to write (created; its dataset files replaced)")->required();
  pr->add_option("--eos", p.eos, "token put after each file, or each text or completion record (\"\" for none; an "
                 "error if the tokenizer lacks it)")->capture_default_str();
  pr->add_option("--chat-format", p.chat_format, "how \"messages\" are rendered: llama3, chatml, qwen3 or mistral "
                 "(default: recognised from the tokenizer's chat_template)");
  pr->add_flag("--no-special", p.no_special, "leave out the special tokens the tokenizer's post-processor puts "
               "around each file (Llama's BOS)");
  return pr;
}

// Which sampling flags were given (they override generation_config.json's fields); --greedy is --temperature 0. And
// --prompt-ids's list as ids.
void note_given_sampling(SampleOptions& s, const CLI::App& sa) {
  auto given = [&](const char* flag) { return sa.get_option(flag)->count() > 0; };
  if (s.greedy) s.temperature = 0;
  s.temperature_set = s.greedy || given("--temperature");
  s.top_k_set = given("--top-k"), s.top_p_set = given("--top-p"), s.repetition_penalty_set = given("--repetition-penalty");
  if (!s.prompt_id_list.empty()) s.prompt_ids = apps::cli::integers_of(s.prompt_id_list);  // checked by integer_list
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-transformer: train a byte-level decoder (GPT-2 or Llama) on text, sample from it, export it"};
  app.require_subcommand(1);
  TrainOptions t;
  SampleOptions s;
  ExportOptions x, px;  // export-hf's, export-peft's
  PrepareOptions p;
  CLI::App* tr = add_train_flags(app, t);
  CLI::App* sa = add_sample_flags(app, s);
  CLI::App* ex = add_export_flags(app, x);
  EvalOptions ev;
  CLI::App* evc = add_eval_flags(app, ev);
  CLI::App* pe = add_peft_flags(app, px);
  CLI::App* pr = add_prepare_flags(app, p);
  // A first word that is neither a flag nor a command is named (CLI11 would only say that a subcommand is required).
  const std::string first = argc > 1 ? argv[1] : "";
  if (argc > 1 && first[0] != '-' && first != "train" && first != "sample" && first != "export-hf" &&
      first != "export-peft" && first != "eval" && first != "prepare") {
    std::fprintf(stderr, "weft-transformer: unknown command \"%s\" (the commands are train, sample, eval, export-hf, "
                 "export-peft and prepare; see --help)\n", argv[1]);
    return 2;
  }
  if (const auto rc = apps::parse_launched(app, argc, argv, "weft-transformer")) return *rc;
  note_given_sampling(s, *sa);
  t.checkpointing = t.ac_full ? nn::Checkpointing::full : nn::parse_checkpointing(t.ac.empty() ? "none" : t.ac, "--ac");
  if (t.model.arch == "llama") t.untie = t.untie || !t.tie;  // Llama's head is untied by default
  else if (t.tie || tr->get_option("--rope-theta")->count() > 0) {  // flags GPT-2 would ignore
    std::fprintf(stderr, "weft-transformer: %s is for --arch llama (%s)\n", t.tie ? "--tie" : "--rope-theta",
                 t.tie ? "GPT-2's head is tied unless --untie" : "GPT-2 learns its positions: no rotary embeddings");
    return 2;
  }

  return dist::run_program("weft-transformer", [&] {
    if (sa->parsed()) {
      if (!s.fsdp) apps::start_alone("weft-transformer", "sample");
      const apps::Ranks ranks = apps::start_ranks("weft-transformer", s.fsdp, {{"command", "sample"}},
                                            {{"--from", s.checkpoint}, {"--prompt", s.prompt},
                                             {"--tokens", std::to_string(s.tokens)}, {"--seed", std::to_string(s.seed)},
                                             {"--eos", s.eos}, {"--tokenizer", s.tokenizer},
                                             {"--no-special", s.no_special ? "1" : "0"}, {"--dtype", s.dtype},
                                             {"--no-cache", s.no_cache ? "1" : "0"},
                                             {"--logits-out", s.logits_out.empty() ? "not given" : "given"},
                                             {"--temperature", fmt::format("{}", s.temperature)},
                                             {"--top-k", std::to_string(s.top_k)}, {"--top-p", fmt::format("{}", s.top_p)},
                                             {"--repetition-penalty", fmt::format("{}", s.repetition_penalty)}});
      return sample(s, ranks);
    }
    if (ex->parsed()) {
      apps::start_alone("weft-transformer", "export-hf");
      return export_hf(x);
    }
    if (evc->parsed()) {
      apps::start_alone("weft-transformer", "eval");
      return eval(ev);
    }
    if (pe->parsed()) {
      apps::start_alone("weft-transformer", "export-peft");
      return export_peft(px);
    }
    if (pr->parsed()) {
      apps::start_alone("weft-transformer", "prepare");
      apps::check_outputs_apart({apps::dataset_out(p.out)}, {{"--tokenizer", p.tokenizer}, {"--data", p.data}}, "transformer");
      if (!p.chat_format.empty()) apps::parse_chat_format(p.chat_format);  // named now, not at the first chat record
      if (apps::is_jsonl_data(p.data)) return prepare_examples(p);
      WEFT_CHECK(p.chat_format.empty(), "transformer: --chat-format renders the \"messages\" of JSONL records, and {} "
                 "is text", p.data);
      const apps::PreparedData d = apps::prepare_tokens(p.tokenizer, p.data, p.out, p.eos, 0.1, !p.no_special);
      std::printf("prepared %s: %lld train and %lld val tokens from %lld bytes in %lld file(s) of %s\n", p.out.c_str(),
                  (long long)d.train_tokens, (long long)d.val_tokens, (long long)d.bytes, (long long)d.files,
                  p.data.c_str());
      return 0;
    }
    WEFT_CHECK(tr->get_option("--max-skipped-steps")->count() == 0 || t.on_nan == "skip", "transformer: --max-skipped-steps applies to --on-nan "
               "skip only (--on-nan is {})", t.on_nan);
    apps::Ranks ranks = apps::start_ranks("weft-transformer", t.fsdp, {{"command", "train"}}, shared_settings(t));
    if (ranks.fsdp) ranks.tp = t.tp;
    return train(t, ranks);
  });
}
