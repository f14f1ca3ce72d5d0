#!/usr/bin/env python3
"""Byte-level Llama on Debian's `fortunes` text in PyTorch: step time, tokens/s, loss.

The Llama twin of shared/peer/gpt_char.py (it lives here because shared/peer is read-only): the
same data, batching, optimiser, timing and table, and the same --threads --steps --warmup
--compile --autocast flags; only the model differs. It imports load_corpus/get_batch from
gpt_char.py and the helpers from _common.py in shared/peer (found beside this checkout, or
through PEER_DIR). For side-by-side benchmarks only: nothing in weft's build or tests uses it.

  OMP_NUM_THREADS=T python3 scripts/llama_char_pytorch.py --config small|medium --threads T \\
      [--compile --warmup 10] [--autocast bf16] [--lora-rank R]
  (FSDP2 over gloo: scripts/fsdp2_llama_pytorch.py)

Model: token embedding (256; no position table); n_layer x [x += Attn(RMSNorm(x));
x += SwiGLU(RMSNorm(x))]; final RMSNorm; LM head NOT tied; no biases anywhere; RMSNorm eps 1e-5
(Hugging Face's LlamaRMSNorm: normalised in f32, then times the weight). Attention: q, k, v
projections with n_kv_head <= n_head key/value heads (grouped-query attention), RoPE (theta 1e4,
Hugging Face's rotate-half convention: the two halves of each head are the pairs) on q and k,
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), or k/v repeat_interleave'd to
n_head where torch lacks enable_gqa (printed). MLP: down(silu(gate(x)) * up(x)) = w2(silu(w1 x) *
w3 x). Parameter names follow Hugging Face's Llama (q_proj ... down_proj), so a state dict maps
onto LlamaForCausalLM one to one. Init: N(0, 0.02) for Linear/Embedding weights,
N(0, 0.02/sqrt(2*n_layer)) for o_proj and down_proj, RMSNorm weight 1.
--lora-rank R: peft's LoRA (inject_adapter_in_model; r R, lora_alpha 2R, dropout 0) on all seven
projections (q, k, v, o, gate, up, down), every other parameter frozen, AdamW over the adapters
only (needs `pip install peft`); as weft-transformer train --lora-rank R --lora-alpha 2R.
Optimiser: AdamW(lr=3e-4, betas=(0.9,0.999), eps=1e-8, weight_decay=0.1 on ALL parameters),
grad-norm clip 1.0, no LR schedule. Batches: uniformly random windows from the whole corpus
(torch.Generator seeded), targets = inputs shifted by one byte.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _peer_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.environ.get("PEER_DIR"), os.path.join(here, "..", "..", "shared", "peer"),
              os.path.join(here, "..", "shared", "peer"), "/work/shared/peer"):
        if d and os.path.isfile(os.path.join(d, "gpt_char.py")):
            return os.path.abspath(d)
    sys.exit("llama_char_pytorch.py: cannot find shared/peer (gpt_char.py, _common.py); "
             "set PEER_DIR")


sys.dont_write_bytecode = True   # no __pycache__ in scripts/ or shared/peer
sys.path.insert(0, _peer_dir())
from _common import setup, env_line, median, table, peak_rss_mib, LoadMonitor  # noqa: E402
from gpt_char import load_corpus, get_batch, FORTUNE_DIR  # noqa: E402  (the same data, batching)

CONFIGS = {
    "small": dict(n_layer=4, n_head=4, n_kv_head=2, d_model=128, ffn_dim=352, ctx=128, batch=16,
                  steps=200),
    "medium": dict(n_layer=6, n_head=6, n_kv_head=2, d_model=384, ffn_dim=1024, ctx=256, batch=8,
                   steps=50),
}
AUTOCAST = None  # --autocast bf16: forward under torch.autocast("cpu", torch.bfloat16)
RMS_EPS = 1e-5
ROPE_THETA = 10000.0


def _sdpa_has_gqa():
    try:
        q = torch.zeros(1, 2, 1, 4)
        kv = torch.zeros(1, 1, 1, 4)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


USE_GQA = _sdpa_has_gqa()


class RMSNorm(nn.Module):
    def __init__(self, d, eps=RMS_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(ctx, head_dim, theta=ROPE_THETA):
    """cos, sin [ctx, head_dim]: frequency i for dimensions i and i + head_dim/2."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    f = torch.outer(torch.arange(ctx, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, h, T, hd]; cos, sin [T, hd]."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, d, h, kv):
        super().__init__()
        assert d % h == 0 and h % kv == 0, f"d_model {d}, n_head {h}, n_kv_head {kv}"
        self.h, self.kv, self.hd = h, kv, d // h
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)     # B,h,T,hd
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)    # B,kv,T,hd
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv == self.h:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif USE_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:   # kv head j serves query heads j*g .. j*g+g-1, as enable_gqa and HF's repeat_kv
            g = self.h // self.kv
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1),
                                               v.repeat_interleave(g, dim=1), is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, self.h * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)   # w1
        self.up_proj = nn.Linear(d, ffn, bias=False)     # w3
        self.down_proj = nn.Linear(ffn, d, bias=False)   # w2

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d, h, kv, ffn):
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, h, kv)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = MLP(d, ffn)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Llama(nn.Module):
    def __init__(self, n_layer, n_head, n_kv_head, d_model, ffn_dim, ctx, vocab=256):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(Block(d_model, n_head, n_kv_head, ffn_dim)
                                    for _ in range(n_layer))
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        # plain attributes, not buffers: nothing to shard, broadcast or checkpoint
        self.cos, self.sin = rope_tables(ctx, d_model // n_head)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    @property
    def blocks(self):      # the name fsdp2 scripts shard by
        return self.layers

    def logits(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed_tokens(idx)
        for blk in self.layers:
            x = blk(x, cos, sin)
        return self.lm_head(self.norm(x))

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def build(cfg):
    return Llama(cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["d_model"], cfg["ffn_dim"],
                 cfg["ctx"])


def make(cfg, seed, lora_rank=0):
    torch.manual_seed(seed)
    model = build(cfg)
    if lora_rank > 0:
        from peft import LoraConfig, inject_adapter_in_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = inject_adapter_in_model(LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                   target_modules=targets), model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.1)
    return model, opt


def attention_line(cfg):
    if cfg["n_kv_head"] == cfg["n_head"]:
        return "sdpa (no GQA: n_kv_head == n_head)"
    if USE_GQA:
        return f"sdpa enable_gqa=True ({cfg['n_head']} q heads / {cfg['n_kv_head']} kv heads)"
    return (f"sdpa on repeat_interleave'd k/v ({cfg['n_head']} q heads / {cfg['n_kv_head']} kv "
            f"heads): this torch's scaled_dot_product_attention has no enable_gqa")


def train_step(model, opt, x, y):
    if AUTOCAST is not None:
        with torch.autocast("cpu", dtype=AUTOCAST):
            loss = model(x, y)
    else:
        loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return loss.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=list(CONFIGS), required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="default: 200 small / 50 medium")
    ap.add_argument("--warmup", type=int, default=5,
                    help="first N training steps are excluded from the timing median")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--lora-rank", type=int, default=0, help="peft LoRA adapters of this rank, the base frozen")
    ap.add_argument("--autocast", choices=["bf16", "none"], default="none",
                    help="bf16: PyTorch's CPU mixed precision (oneDNN bf16 GEMMs where the CPU has AVX512_BF16/AMX)")
    args = ap.parse_args()
    global AUTOCAST
    AUTOCAST = torch.bfloat16 if args.autocast == "bf16" else None
    cfg = dict(CONFIGS[args.config])
    steps = args.steps or cfg["steps"]
    B, T = cfg["batch"], cfg["ctx"]

    setup(args.threads, args.seed)
    data, files = load_corpus()
    print(env_line(args.threads))
    print(f"corpus: {len(data):,} bytes from {len(files)} files in {FORTUNE_DIR} "
          f"(excluding *.dat, *.u8)")
    if cfg["n_kv_head"] != cfg["n_head"] and not USE_GQA:
        print("note: F.scaled_dot_product_attention has no enable_gqa here; "
              "repeating k/v with repeat_interleave instead")
    rss0 = peak_rss_mib()
    model, opt = make(cfg, args.seed, args.lora_rank)
    step_model = torch.compile(model) if args.compile else model
    nparams = sum(p.numel() for p in model.parameters())
    if args.lora_rank:
        print(f"LoRA rank {args.lora_rank}: {sum(p.numel() for p in model.parameters() if p.requires_grad):,} "
              f"trainable of {nparams:,}")
    gen = torch.Generator().manual_seed(args.seed + 1)

    times, losses = [], []
    with LoadMonitor() as lm:
        for s in range(steps):
            x, y = get_batch(data, B, T, gen)
            t0 = time.perf_counter()
            losses.append(train_step(step_model, opt, x, y))
            times.append(time.perf_counter() - t0)
    timed = times[args.warmup:] if len(times) > args.warmup else times
    st = median(timed)
    print(f"attention: {attention_line(cfg)} | compile: {args.compile} | autocast: {args.autocast}")
    print(f"config {args.config}: {cfg} | params {nparams:,} (untied head) | "
          f"peak RSS {peak_rss_mib():.0f} MiB (before model: {rss0:.0f} MiB)")
    print(table(["config", "threads", "ms/step (median)", "min..max ms", "tokens/s",
                 "loss@step1", f"loss@step{steps}", "mean loss last 10"],
                [[args.config, args.threads, f"{1e3 * st:.1f}",
                  f"{1e3 * min(timed):.1f}..{1e3 * max(timed):.1f}", f"{B * T / st:,.0f}",
                  f"{losses[0]:.4f}", f"{losses[-1]:.4f}",
                  f"{sum(losses[-10:]) / len(losses[-10:]):.4f}"]]))
    print(f"(median over steps {args.warmup + 1}..{steps}; step = fwd+bwd+clip+AdamW, "
          f"batch sampling excluded)")
    print(f"CPU during run: {lm}")
    marks = [1, 6, 10, 25, 50, 100, 150, 200]
    print("loss trace: " + ", ".join(f"{m}:{losses[m - 1]:.4f}" for m in marks if m <= steps))


if __name__ == "__main__":
    main()
