#!/usr/bin/env python3
"""The PyTorch twin of `weft-transformer train` for speed comparisons: the same model, data and step.

Takes weft-transformer train's shape flags (--arch gpt2|llama, --n-layer, --n-head, --n-kv-head,
--d-model, --ffn-dim, --ctx, --tie/--untie, --batch-size) and its --data: a text file (its bytes,
vocabulary 256) or a dataset directory of `weft-transformer prepare` (train.tokens: a 128-byte
header, then 2- or 4-byte little-endian ids; the vocabulary from the header). Batches are uniformly
random windows of ctx + 1 tokens, targets shifted by one.

  gpt2:  token + learned position embeddings; pre-LN blocks (LayerNorm eps 1e-5, fused q/k/v with
         biases, causal F.scaled_dot_product_attention, MLP 4 d with tanh GELU); final LayerNorm;
         head tied to the token embedding (unless --untie).
  llama: token embedding; blocks of RMSNorm (eps 1e-5), q/k/v without biases, grouped-query
         attention (n_kv_head), RoPE (theta 1e4, rotate-half), SwiGLU MLP (ffn_dim, default
         8/3 d rounded up to 32); final RMSNorm; untied head (unless --tie).
The step: forward, cross-entropy over every position, backward, gradient-norm clip 1.0, AdamW
(lr 3e-4, betas 0.9/0.999, weight decay 0.1 on 2-D weights; fused where this torch has it).

--precision bf16 runs the forward under torch.autocast("cpu", torch.bfloat16) (PyTorch's CPU mixed
precision: oneDNN's AVX512_BF16 / AMX kernels); --compile adds torch.compile (its first step
compiles, so give --warmup at least 1). Under torchrun with --fsdp, every block and then the root
are fully_shard'ed over gloo (with --precision bf16: MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=f32)) and --batch-size is the global batch, split over the ranks.
--lora-rank R: peft's LoRA (inject_adapter_in_model; r R, alpha 2R, dropout 0) on the linear
layers weft-transformer train --lora-rank adapts by default (llama: q, k, v, o, gate, up and down
projections; gpt2: fused q/k/v, both output projections and the MLP input), applied before fully_shard; every
other parameter frozen and AdamW over the adapters only (needs `pip install peft`).

Prints one line per step and then
  summary mode=M precision=P threads=T world=W ms=... tokens_per_s=... loss=... peak_rss_mib=...
with the median step time over the steps after --warmup (tokens/s: global tokens / that median).
For benchmarks only (scripts/bench_vs_pytorch.sh): nothing in weft's build or tests uses it.
"""
import argparse
import math
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-kv-head", type=int, default=0)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--ffn-dim", type=int, default=0)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--tie", action="store_true")
    p.add_argument("--untie", action="store_true")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora-rank", type=int, default=0)
    a = p.parse_args()
    if a.warmup >= a.steps:
        p.error(f"--warmup {a.warmup} leaves no timed step of --steps {a.steps}")
    return a


def load_tokens(path):
    """The ids of a weft token dataset (DIR/train.tokens) or the bytes of a text file, and the vocabulary."""
    if os.path.isdir(path):
        f = os.path.join(path, "train.tokens")
        head = np.fromfile(f, dtype=np.uint8, count=128)
        if head[:8].tobytes() != b"WEFTTOK1":
            sys.exit(f"transformer_pytorch: {f} is not a weft token file")
        width = int(head[12:16].view(np.uint32)[0])
        vocab = int(head[24:32].view(np.uint64)[0])
        ids = np.memmap(f, dtype=np.uint16 if width == 2 else np.uint32, mode="r", offset=128)
        return torch.from_numpy(ids.astype(np.int64)), vocab
    data = np.fromfile(path, dtype=np.uint8)
    return torch.from_numpy(data.astype(np.int64)), 256


class GPTBlock(nn.Module):
    def __init__(self, d, h, ffn):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class LlamaBlock(nn.Module):
    def __init__(self, d, h, kv, ffn, ctx):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.input_layernorm = nn.RMSNorm(d, eps=1e-5)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-5)
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)
        inv = 1.0 / 10000 ** (torch.arange(0, self.hd, 2).float() / self.hd)
        ang = torch.outer(torch.arange(ctx).float(), inv)
        self.cos = torch.cat([ang.cos(), ang.cos()], -1)
        self.sin = torch.cat([ang.sin(), ang.sin()], -1)

    def rope(self, t):
        T, half = t.shape[2], self.hd // 2
        rot = torch.cat([-t[..., half:], t[..., :half]], -1)
        return t * self.cos[:T].to(t.dtype) + rot * self.sin[:T].to(t.dtype)

    def forward(self, x):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True,
                                           enable_gqa=self.kv != self.h)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Decoder(nn.Module):
    def __init__(self, a, vocab):
        super().__init__()
        d, llama = a.d_model, a.arch == "llama"
        ffn = a.ffn_dim or ((8 * d // 3 + 31) // 32 * 32 if llama else 4 * d)
        self.embed = nn.Embedding(vocab, d)
        self.pos = None if llama else nn.Embedding(a.ctx, d)
        self.blocks = nn.ModuleList(
            LlamaBlock(d, a.n_head, a.n_kv_head or a.n_head, ffn, a.ctx) if llama else GPTBlock(d, a.n_head, ffn)
            for _ in range(a.n_layer))
        self.norm = nn.RMSNorm(d, eps=1e-5) if llama else nn.LayerNorm(d)
        tied = a.tie if llama else not a.untie
        self.head = None if tied else nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scaled = ("o_proj.weight", "down_proj.weight") if llama else ("attn_proj.weight", "mlp_proj.weight")
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith(scaled) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.embed(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        x = self.norm(x)
        logits = self.head(x) if self.head is not None else x @ self.embed.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def add_lora(model, arch, rank):
    from peft import LoraConfig, inject_adapter_in_model
    targets = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] if arch == "llama"
               else ["c_attn", "attn_proj", "c_fc", "mlp_proj"])
    model = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets),
                                    model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, fused=True), "fused"
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.999), eps=1e-8), "foreach"


def shard(model, world, bf16):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (world,))
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if bf16 else {}
    for b in model.blocks:
        fully_shard(b, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    rank, world = 0, 1
    if a.fsdp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch_size % world:
        sys.exit(f"transformer_pytorch: --batch-size {a.batch_size} does not divide over {world} ranks")
    data, vocab = load_tokens(a.data)
    torch.manual_seed(a.seed)
    model = Decoder(a, vocab)
    params = sum(p.numel() for p in model.parameters())
    if a.lora_rank > 0:
        model = add_lora(model, a.arch, a.lora_rank)
    if a.fsdp:
        shard(model, world, a.precision == "bf16")
    opt, opt_kind = make_optimizer(model)
    fwd = torch.compile(model) if a.compile else model
    bf16 = a.precision == "bf16" and not a.fsdp  # FSDP's policy casts instead
    gen = torch.Generator().manual_seed(a.seed)
    rows, T = a.batch_size // world, a.ctx

    def step():
        ix = torch.randint(len(data) - T - 1, (a.batch_size,), generator=gen)[rank * rows:(rank + 1) * rows]
        x = torch.stack([data[i:i + T] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        return loss.item()

    if rank == 0:
        print(f"# torch {torch.__version__}, {a.arch} L{a.n_layer} d{a.d_model} ctx {T} vocab {vocab}: "
              f"{params:,} parameters; batch {a.batch_size} over {world} rank(s), {a.threads} thread(s); "
              f"{'compile + ' if a.compile else ''}{'autocast bf16' if bf16 else a.precision}"
              f"{' (FSDP2 policy)' if a.fsdp else ''}; AdamW {opt_kind}"
              f"{f'; peft LoRA rank {a.lora_rank}' if a.lora_rank else ''}", flush=True)
    times = []
    for s in range(1, a.steps + 1):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {s} loss {loss:.4f} ms {1e3 * times[-1]:.1f}", flush=True)
    ms = 1e3 * statistics.median(times[a.warmup:])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if rank == 0:
        print(f"summary mode={'compile' if a.compile else 'eager'} precision={a.precision} threads={a.threads} "
              f"world={world} ms={ms:.1f} tokens_per_s={1e3 * a.batch_size * T / ms:.1f} loss={loss:.4f} "
              f"peak_rss_mib={rss:.0f}", flush=True)
    if a.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
