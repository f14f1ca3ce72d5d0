#!/usr/bin/env python3
"""GPT-2 124M training steps in PyTorch, the reference for weft-bench-gpt2.

The same model and step as apps/bench/bench_gpt2.cpp, printed in the same columns:
nanoGPT's GPT (12 layers, 12 heads, d_model 768, ctx 1024, vocabulary 50304, GELU tanh,
head tied to wte, causal F.scaled_dot_product_attention; written out before PyTorch 2.0), random token ids in
[0, min(vocab, 50257)) drawn before the timer (the upload is timed), cross-entropy over all
positions, backward, gradient-norm clip, AdamW (betas 0.9/0.95, weight decay on 2-D weights,
fused on CUDA). bf16 is torch.autocast over f32 parameters, the PyTorch counterpart of weft's
FSDP mixed precision (bf16 compute, f32 master weights, f32 logits for the loss).

  python3 scripts/bench_gpt2_pytorch.py --mode eager
  python3 scripts/bench_gpt2_pytorch.py --mode compile

Model FLOPs per token and MFU as weft's: 6 N + 12 L H hd T, N = parameters without the
position table, against --peak-tflops (989: H100 SXM dense bf16). Each step is timed between
two torch.cuda.synchronize() calls; the summary line gives medians over the steps after
--warmup (torch.compile compiles in the first one). Exits 77 when PyTorch, a CUDA device or
(for --mode compile) torch.compile is missing, saying which.
"""
import argparse
import math
import statistics
import sys
import time

SKIP = 77


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def skip(why):
    print(f"bench_gpt2_pytorch: skipped: {why}", flush=True)
    sys.exit(SKIP)


def build_model(torch, args):
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(args.d_model, 3 * args.d_model)
            self.c_proj = nn.Linear(args.d_model, args.d_model)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            hd = C // args.n_head
            q, k, v = (t.view(B, T, args.n_head, hd).transpose(1, 2) for t in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # PyTorch < 2.0 (e.g. Debian's 1.13): the attention written out
                att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(args.d_model, 4 * args.d_model)
            self.c_proj = nn.Linear(4 * args.d_model, args.d_model)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(args.d_model)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(args.d_model)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(args.vocab, args.d_model),
                wpe=nn.Embedding(args.ctx, args.d_model),
                h=nn.ModuleList([Block() for _ in range(args.n_layer)]),
                ln_f=nn.LayerNorm(args.d_model)))
            self.lm_head = nn.Linear(args.d_model, args.vocab, bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied, as weft's default
            residual_std = 0.02 / math.sqrt(2 * args.n_layer)
            for name, p in self.named_parameters():
                if ".ln_" in name or name.startswith("transformer.ln_f"):
                    continue
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                elif name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, residual_std)
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            T = idx.size(1)
            pos = torch.arange(T, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return GPT()


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        skip(f"PyTorch is not installed ({e})")
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        skip(f"--device {args.device}: PyTorch {torch.__version__} sees no CUDA device")
    if args.mode == "compile" and not hasattr(torch, "compile"):
        skip(f"--mode compile: PyTorch {torch.__version__} has no torch.compile (2.0 or later)")
    if args.d_model % args.n_head:
        sys.exit(f"bench_gpt2_pytorch: --n-head {args.n_head} does not divide --d-model {args.d_model}")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # as weft's default: f32 products in f32
    torch.backends.cudnn.allow_tf32 = False

    model = build_model(torch, args).to(device)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight once
    n_flop = n_params - model.transformer.wpe.weight.numel()
    hd = args.d_model // args.n_head
    flops_per_token = 6 * n_flop + 12 * args.n_layer * args.n_head * hd * args.ctx
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kwargs = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if on_cuda:
        opt_kwargs["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)
    fwd = torch.compile(model) if args.mode == "compile" else model
    bf16 = args.precision == "bf16"
    autocast_device = "cuda" if on_cuda else "cpu"

    B, T, V = args.batch_size, args.ctx, args.vocab
    token_range = min(V, 50257)
    gen = torch.Generator().manual_seed(args.seed + 1)
    what = f"{args.device}, {torch.cuda.get_device_name(device)}" if on_cuda else \
        f"{args.device}, {torch.get_num_threads()} threads"
    print(f"# bench_gpt2_pytorch ({args.mode}): GPT n_layer {args.n_layer}, n_head {args.n_head}, d_model "
          f"{args.d_model}, ctx {T}, vocab {V} (tied head): {n_params} parameters")
    print(f"# {what}; PyTorch {torch.__version__}; "
          f"{'bf16 autocast, f32 master weights' if bf16 else 'f32'}; batch {B} x {T} = {B * T} tokens/step; "
          f"AdamW lr {args.lr:g}{' (fused)' if on_cuda else ''}, clip {args.clip:g}; random tokens in [0, {token_range})")
    print(f"# model FLOPs/token 6N + 12*L*H*hd*T = {flops_per_token:.4g} (N = {n_flop} without wpe); "
          f"MFU against {args.peak_tflops:g} TFLOP/s")
    print("| step | loss | ms | tokens/s | MFU % | peak MiB |")
    print("|---:|---:|---:|---:|---:|---:|", flush=True)

    def sync():
        if on_cuda:
            torch.cuda.synchronize(device)

    def peak_mib():
        return torch.cuda.max_memory_allocated(device) / 2**20 if on_cuda else float("nan")

    warmup = min(args.warmup, args.steps - 1)
    measured = []
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, token_range, (B, T + 1), generator=gen)
        x_host, y_host = tokens[:, :T].contiguous(), tokens[:, 1:].contiguous()
        sync()
        t0 = time.perf_counter()
        x, y = x_host.to(device), y_host.to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=bf16):
            logits = fwd(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, V), y.view(-1))
        del logits
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        loss_v = loss.item()
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        if step > warmup:
            measured.append(ms)
        tok_s = B * T / (ms * 1e-3)
        mfu = flops_per_token * tok_s / (args.peak_tflops * 1e12)
        print(f"| {step} | {loss_v:.6f} | {ms:.2f} | {tok_s:.0f} | {100 * mfu:.2f} | {peak_mib():.1f} |", flush=True)
        if not math.isfinite(loss_v):
            sys.exit(f"bench_gpt2_pytorch: loss is {loss_v} at step {step}")

    ms = statistics.median(measured)
    tok_s = B * T / (ms * 1e-3)
    reserved = torch.cuda.memory_reserved(device) / 2**20 if on_cuda else float("nan")
    print(f"summary impl=pytorch-{args.mode} precision={args.precision} steps={warmup + 1}-{args.steps} ms={ms:.2f} "
          f"tokens_per_s={tok_s:.0f} mfu={flops_per_token * tok_s / (args.peak_tflops * 1e12):.4f} "
          f"peak_mib={peak_mib():.1f} reserved_mib={reserved:.1f}", flush=True)


if __name__ == "__main__":
    main()
