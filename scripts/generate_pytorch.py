#!/usr/bin/env python3
"""Generation with a key/value cache in PyTorch eager, batch 1: the twin of weft-bench-generate.

The same two models at the same size (GPT medium: L6 H6 d384, learned positions, LayerNorm, erf
GELU, MLP 4x, tied head, biases on; the Llama config: L6 H6 d384 with 2 key/value heads, RoPE
theta 1e4 in Hugging Face's rotate-half convention, RMSNorm, SwiGLU of width 1024, no biases,
untied head), freshly initialised, a prompt of --prompt random bytes continued greedily by --new
tokens (default 448 + 64 = a context of 512). Each layer keeps its keys and values in
preallocated [1, Hkv, ctx, hd] tensors written in place; a step runs one token's projections and
F.scaled_dot_product_attention (enable_gqa) over the cached positions, under
torch.inference_mode(). Prints the prompt's forward (ms) and the decode tokens/s after it, best
and median of --rounds, in the table weft-bench-generate prints. --autocast bf16 runs the
forward under torch.autocast("cpu", torch.bfloat16). For side-by-side benchmarks only: nothing
in weft's build or tests uses it.

  OMP_NUM_THREADS=1 python3 scripts/generate_pytorch.py --arch gpt2|llama --threads 1 [--autocast bf16]
"""
import argparse
import contextlib
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, n_head, n_kv_head, bias, rope):
        super().__init__()
        self.h, self.kv, self.hd, self.rope = n_head, n_kv_head, d // n_head, rope
        self.q = nn.Linear(d, d, bias=bias)
        self.k = nn.Linear(d, n_kv_head * self.hd, bias=bias)
        self.v = nn.Linear(d, n_kv_head * self.hd, bias=bias)
        self.o = nn.Linear(d, d, bias=bias)

    def forward(self, x, cache, pos, cos, sin):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        if self.rope:
            c, s = cos[pos:pos + T], sin[pos:pos + T]
            q, k = rotate(q, c, s), rotate(k, c, s)
        kc, vc = cache
        kc[:, :, pos:pos + T] = k
        vc[:, :, pos:pos + T] = v
        y = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T], is_causal=T > 1,
                                           enable_gqa=self.kv != self.h)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


def rotate(x, cos, sin):  # Hugging Face's rotate_half convention
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, llama = a.d, a.arch == "llama"
        norm = (lambda: RMSNorm(d)) if llama else (lambda: nn.LayerNorm(d))
        self.n1, self.n2, self.llama = norm(), norm(), llama
        self.attn = Attention(d, a.n_head, a.n_kv_head if llama else a.n_head, not llama, llama)
        if llama:
            self.gate, self.up, self.down = (nn.Linear(d, a.ffn, bias=False), nn.Linear(d, a.ffn, bias=False),
                                             nn.Linear(a.ffn, d, bias=False))
        else:
            self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cache, pos, cos, sin):
        x = x + self.attn(self.n1(x), cache, pos, cos, sin)
        h = self.n2(x)
        h = self.down(F.silu(self.gate(h)) * self.up(h)) if self.llama else self.proj(F.gelu(self.fc(h)))
        return x + h


class Decoder(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a, llama = a, a.arch == "llama"
        self.wte = nn.Embedding(256, a.d)
        self.wpe = None if llama else nn.Embedding(a.ctx, a.d)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.n_layer))
        self.norm = RMSNorm(a.d) if llama else nn.LayerNorm(a.d)
        self.head = nn.Linear(a.d, 256, bias=False) if llama else None
        hd = a.d // a.n_head
        inv = 1.0 / (1e4 ** (torch.arange(0, hd, 2).float() / hd))
        f = torch.outer(torch.arange(a.ctx).float(), inv)
        f = torch.cat((f, f), dim=-1)
        self.cos, self.sin = f.cos(), f.sin()
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0, 0.02)

    def new_cache(self, dtype):
        kv = self.a.n_kv_head if self.a.arch == "llama" else self.a.n_head
        hd = self.a.d // self.a.n_head
        return [(torch.zeros(1, kv, self.a.ctx, hd, dtype=dtype), torch.zeros(1, kv, self.a.ctx, hd, dtype=dtype))
                for _ in self.blocks]

    def forward(self, idx, cache, pos):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(pos, pos + idx.shape[1]))
        for b, c in zip(self.blocks, cache):
            x = b(x, c, pos, self.cos, self.sin)
        x = self.norm(x[:, -1:])
        return self.head(x) if self.head is not None else x @ self.wte.weight.t()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=448)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--autocast", choices=["none", "bf16"], default="none")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    a.ctx, a.n_layer, a.n_head, a.n_kv_head, a.d, a.ffn = a.prompt + a.new, 6, 6, 2, 384, 1024
    torch.manual_seed(0)
    model = Decoder(a).eval()
    prompt = torch.randint(0, 256, (1, a.prompt))
    amp = (lambda: torch.autocast("cpu", torch.bfloat16)) if a.autocast == "bf16" else contextlib.nullcontext
    cache_dtype = torch.bfloat16 if a.autocast == "bf16" else torch.float32

    def generate(n):
        cache = model.new_cache(cache_dtype)
        with torch.inference_mode(), amp():
            t0 = time.perf_counter()
            nxt = model(prompt, cache, 0)[0, -1].argmax()
            t1 = time.perf_counter()
            pos = a.prompt
            for _ in range(n - 1):
                nxt = model(nxt.view(1, 1), cache, pos)[0, -1].argmax()
                pos += 1
            t2 = time.perf_counter()
        return 1e3 * (t1 - t0), (n - 1) / (t2 - t1)

    generate(2)
    runs = [generate(a.new) for _ in range(a.rounds)]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"generate_pytorch: {a.arch}, {n_params} parameters, batch 1, {a.threads} thread(s); prompt {a.prompt} "
          f"tokens, then {a.new} new (context {a.ctx}); greedy; torch {torch.__version__}, autocast {a.autocast}")
    print("| path | new tokens | prompt forward ms (median) | decode tokens/s (best) | decode tokens/s (median) |")
    print("|---|---:|---:|---:|---:|")
    print(f"| PyTorch eager, key/value cache | {a.new} | {statistics.median(r[0] for r in runs):.1f} | "
          f"{max(r[1] for r in runs):.1f} | {statistics.median(r[1] for r in runs):.1f} |")


if __name__ == "__main__":
    main()
