#!/usr/bin/env python3
"""PyTorch DTensor tensor parallelism on CPU over gloo: GPT medium split over the ranks, the twin
of `weft-bench-tp --arch gpt2`, for side-by-side benchmarks only.

The model is weft-transformer's GPT-2 (learned positions, LayerNorm eps 1e-5, biases everywhere,
GELU tanh, MLP 4 d_model, tied head, byte vocabulary) with the fused c_attn written as three
Linears q, k and v: the same products, and the layout DTensor's ColwiseParallel can split by
heads (a ColwiseParallel c_attn would give rank 0 all of q and half of k). Plan, as weft's
tp::parallelize_gpt2_blocks: q, k, v and c_fc ColwiseParallel, the attention's and the MLP's
c_proj RowwiseParallel; embeddings, norms and the tied head whole; heads per rank divided as
torchtitan does. --tp N of the ranks a group and fully_shard (FSDP2) over the other mesh dim.
Every step: random token ids (the same global batch on every rank, drawn before the timer),
forward, cross-entropy, backward, gradient-norm clip 1.0 over the mixed DTensors, AdamW (lr 3e-4,
weight decay 0.1 on every parameter).
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 scripts/tp_gpt_pytorch.py
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 scripts/tp_gpt_pytorch.py --tp 2
Prints rank 0's median step time, tokens/s (global) and the loss trace.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True   # no __pycache__ in scripts/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp2_llama_pytorch import clip_tp  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.c_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (m(x).view(B, T, self.h, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), Attention(d, h), nn.LayerNorm(d)
        self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d, ctx, vocab=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.layers = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.layers:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tp", type=int, default=0, help="ranks a tensor-parallel group (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp or world
    dp = world // tp
    B, T = args.batch_size, args.ctx
    assert dp * tp == world and B % dp == 0, f"batch {B}, {world} ranks, tp {tp}"
    rows, row0 = B // dp, (B // dp) * (rank // tp)

    torch.manual_seed(0)
    model = GPT(args.n_layer, args.n_head, args.d_model, T)
    nparams = sum(p.numel() for p in model.parameters())
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    for blk in model.layers:
        parallelize_module(blk, mesh["tp"], {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(), "c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
        blk.attn.h //= tp
    if dp > 1:
        from torch.distributed.fsdp import fully_shard
        for blk in model.layers:
            fully_shard(blk, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)

    gen = torch.Generator().manual_seed(1)
    times, losses = [], []
    for _ in range(args.steps):
        ids = torch.randint(0, 256, (B, T + 1), generator=gen)[row0:row0 + rows]
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(ids[:, :T], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_tp(model, 1.0)
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    timed = sorted(times[args.warmup:] if len(times) > args.warmup else times)
    if rank == 0:
        st = timed[len(timed) // 2]
        print(f"torch {torch.__version__} gpt2 dp={dp} tp={tp} threads/rank={torch.get_num_threads()} "
              f"params={nparams:,} n_layer={args.n_layer} d_model={args.d_model} ctx={T} batch={B}")
        print(f"summary ms_per_step={1e3 * st:.1f} tokens_per_s={B * T / st:.0f} "
              f"min_ms={1e3 * timed[0]:.1f} max_ms={1e3 * timed[-1]:.1f}")
        print("losses: " + " ".join(f"{i + 1}:{v:.6f}" for i, v in enumerate(losses)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
