"""The 1B-scale benchmark's Python side (scripts/bench_1b.sh runs it in the venv of
scripts/hf_reference.sh: torch, transformers).

  make --out DIR      a random-weight checkpoint of Llama 3.2 1B's shape, as transformers writes
                      it: LlamaForCausalLM, 16 layers, hidden 2048, 32 heads, 8 key/value heads,
                      SwiGLU 8192, vocabulary 128,256, tied head, rope_theta 5e5 with llama3
                      scaling (factor 32, original context 8192), bf16 weights (normal, std
                      0.02) in one model.safetensors (~2.5 GB), generation_config.json.
  decode --from DIR   greedy generation with the key/value cache in transformers (generate,
                      batch 1): --prompt's bytes as ids continued by --new tokens; prints the
                      prompt's forward and the decode tokens/s (best of --rounds), in --dtype.
  lora --from DIR     LoRA fine-tuning steps with peft (r --rank, alpha 2r, dropout 0, the seven
                      projections; AdamW lr 3e-4, weight decay 0.1 over the adapters, clip 1.0),
                      as weft-transformer train --init-from DIR --lora-rank R --lora-alpha 2R:
                      --batch rows of --ctx + 1 random byte ids (0..255), the base in --base-dtype
                      (the adapters f32), the forward under autocast bf16 with --autocast, compiled
                      with --compile; prints the median step after --warmup and tokens/s. Under
                      torchrun with --fsdp: FSDP2 over gloo, fully_shard on every decoder layer and
                      then the model with MixedPrecisionPolicy(bf16, f32), each rank --batch / world
                      of the rows (tokens/s counts the whole batch; rank 0 prints).
Not part of the build or the tests.
"""
import argparse
import json
import os
import sys
import time

import torch


def cmd_make(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.02)
    model.save_pretrained(args.out, max_shard_size="5GB")
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {n} parameters, bf16", file=sys.stderr)
    return 0


def cmd_decode(args):
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.from_dir, dtype=dtype)
    model.eval()
    load = time.perf_counter() - t0
    ids = torch.tensor([list(args.prompt.encode())])  # its bytes as ids, as weft's sample --ids reads it
    prefill, decode = [], []
    with torch.inference_mode():
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False, use_cache=True)
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                                 use_cache=True)
            t2 = time.perf_counter()
            prefill.append(t1 - t0)
            decode.append((args.new - 1) / ((t2 - t1) - (t1 - t0)))
    print(json.dumps({"load_s": round(load, 2), "prefill_ms": round(1e3 * min(prefill), 1),
                      "decode_tokens_per_s": round(max(decode), 3), "threads": args.threads, "dtype": args.dtype,
                      "ids": out[0, ids.shape[1]:].tolist()}))
    return 0


def cmd_lora(args):
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.base_dtype]
    model = AutoModelForCausalLM.from_pretrained(args.from_dir, dtype=dtype)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = inject_adapter_in_model(LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                                               target_modules=targets), model)
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        if p.requires_grad:
            p.data = p.data.float()
            trainable.append(p)
    rank, world = 0, 1
    if args.fsdp:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    fwd = torch.compile(model) if args.compile else model
    gen = torch.Generator().manual_seed(1)
    rows = args.batch // world
    times = []
    for _ in range(args.steps):
        ids = torch.randint(0, 256, (args.batch, args.ctx + 1), generator=gen)[rank * rows:(rank + 1) * rows]
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            logits = fwd(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {len(times)} loss {loss.item():.4f} s {times[-1]:.2f}", file=sys.stderr, flush=True)
    timed = sorted(times[args.warmup:])
    s = timed[len(timed) // 2]
    if args.fsdp:
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps({"step_s": round(s, 3), "tokens_per_s": round(args.batch * args.ctx / s, 1),
                          "trainable": sum(p.numel() for p in trainable), "base_dtype": args.base_dtype,
                          "autocast": args.autocast, "compile": args.compile, "threads": args.threads,
                          "world": world}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--out", required=True)
    de = sub.add_parser("decode")
    de.add_argument("--from", dest="from_dir", required=True)
    de.add_argument("--prompt", default="0123456789abcdef")
    de.add_argument("--new", type=int, default=32)
    de.add_argument("--rounds", type=int, default=2)
    de.add_argument("--threads", type=int, default=2)
    de.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    lo = sub.add_parser("lora")
    lo.add_argument("--from", dest="from_dir", required=True)
    lo.add_argument("--rank", type=int, default=16)
    lo.add_argument("--ctx", type=int, default=256)
    lo.add_argument("--batch", type=int, default=2)
    lo.add_argument("--steps", type=int, default=5)
    lo.add_argument("--warmup", type=int, default=2)
    lo.add_argument("--threads", type=int, default=2)
    lo.add_argument("--base-dtype", choices=["f32", "bf16"], default="f32")
    lo.add_argument("--autocast", action="store_true")
    lo.add_argument("--compile", action="store_true")
    lo.add_argument("--fsdp", action="store_true")
    args = ap.parse_args()
    return {"make": cmd_make, "decode": cmd_decode, "lora": cmd_lora}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
