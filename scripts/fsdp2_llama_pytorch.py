#!/usr/bin/env python3
"""PyTorch FSDP2 (`fully_shard`) on CPU over gloo: the byte-level Llama of llama_char_pytorch.py, sharded.

The Llama twin of shared/peer/fsdp2_gpt.py, for side-by-side benchmarks only.
Launch (torch >= 2.6 from PyPI; one process per rank, one thread each):
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node N scripts/fsdp2_llama_pytorch.py --config small
Modes: --mode fsdp (fully_shard each block, then the root; default), --mode replicate
(every rank holds the whole model and all-reduces gradients: DDP), --mode tp (DTensor tensor
parallelism: ColwiseParallel q/k/v/gate/up, RowwiseParallel o/down in every block, heads per
rank divided as torchtitan does; every rank trains on the whole batch; the twin of
weft-bench-tp; --tp N of the ranks a group, fully_shard over the other mesh dim), --mode single (no process group; run it without torchrun). Except under tp the
global batch is the config's batch, split evenly over the ranks, so the loss sequence matches
one process on the whole batch.
--mp bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32) under --mode fsdp.
Prints rank 0's median step time, tokens/s (global), the loss trace and the peak RSS of
every rank (ru_maxrss).
"""
import argparse
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.dont_write_bytecode = True   # no __pycache__ in scripts/ or shared/peer
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_char_pytorch import (CONFIGS, load_corpus, build, get_batch, median,  # noqa: E402
                                attention_line)


def clip_tp(model, max_norm):
    """clip_grad_norm_ for a model whose parameters are DTensors on different meshes (split over
    tp, sharded over dp, both) or plain tensors (torch's refuses the mix): each rank's local
    squares divided by the number of ranks holding the same values, summed over the world, as
    weft's PartialReduction totals them."""
    from torch.distributed.tensor import DTensor
    world = dist.get_world_size()
    total = torch.zeros((), dtype=torch.float64)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for g in grads:
        if isinstance(g, DTensor):
            copies = world // g.device_mesh.size()
            for dim, placement in enumerate(g.placements):
                copies *= g.device_mesh.size(dim) if placement.is_replicate() else 1
            total += g.to_local().double().pow(2).sum() / copies
        else:
            total += g.double().pow(2).sum() / world
    dist.all_reduce(total)
    coef = min(1.0, max_norm / (float(total.sqrt()) + 1e-6))
    for g in grads:
        g.mul_(coef)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=list(CONFIGS), default="small")
    ap.add_argument("--mode", choices=["fsdp", "replicate", "tp", "single"], default="fsdp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reshard-after-forward", type=int, default=1)
    ap.add_argument("--tp", type=int, default=0,
                    help="--mode tp: ranks a tensor-parallel group (default: all; the rest "
                         "data-parallel under fully_shard, a (dp, tp) mesh)")
    ap.add_argument("--mp", choices=["bf16", "none"], default="none",
                    help="bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32) under --mode fsdp")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.mode == "single":
        rank, world = 0, 1
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dict(CONFIGS[args.config])
    B, T = cfg["batch"], cfg["ctx"]
    tp = (args.tp or world) if args.mode == "tp" else 1
    shards = world // tp                         # data-parallel groups: each its rows of the batch
    assert B % shards == 0 and shards * tp == world, f"batch {B}, {world} ranks, tp {tp}"
    rows = B // shards
    row0 = rows * (rank // tp)

    torch.manual_seed(args.seed)
    model = build(cfg)
    nparams = sum(p.numel() for p in model.parameters())
    if args.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        kw = {}
        if args.mp == "bf16":
            from torch.distributed.fsdp import MixedPrecisionPolicy
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.layers:
            fully_shard(blk, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward), **kw)
        fully_shard(model, mesh=mesh, **kw)
    elif args.mode == "replicate":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (parallelize_module, ColwiseParallel,
                                                       RowwiseParallel)
        mesh = init_device_mesh("cpu", (shards, tp), mesh_dim_names=("dp", "tp"))
        for blk in model.layers:
            parallelize_module(blk, mesh["tp"], {
                "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel()})
            blk.self_attn.h //= tp
            blk.self_attn.kv //= tp
        if shards > 1:
            from torch.distributed.fsdp import fully_shard
            for blk in model.layers:
                fully_shard(blk, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1)

    data, _ = load_corpus()
    gen = torch.Generator().manual_seed(args.seed + 1)
    times, losses = [], []
    for s in range(args.steps):
        x, y = get_batch(data, B, T, gen)            # the same global batch on every rank
        if shards > 1:
            x, y = x[row0:row0 + rows], y[row0:row0 + rows]
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.mode == "tp":
            clip_tp(model, 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.detach().float().clone()
        if shards > 1:
            dist.all_reduce(lv)
            lv /= world                              # tp copies of each dp group's loss
        losses.append(lv.item())
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup:] if len(times) > args.warmup else times
    rss = torch.tensor([peak_rss_mib()])
    if world > 1:
        all_rss = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(all_rss, rss)
    else:
        all_rss = [rss]
    if rank == 0:
        st = median(timed)
        print(f"torch {torch.__version__} mode={args.mode} mp={args.mp} world={world} threads/rank="
              f"{torch.get_num_threads()} config={args.config} params={nparams:,} (untied head) "
              f"attention: {attention_line(cfg)}")
        print(f"summary ms_per_step={1e3 * st:.1f} tokens_per_s={B * T / st:.0f} "
              f"min_ms={1e3 * min(timed):.1f} max_ms={1e3 * max(timed):.1f} "
              f"peak_rss_mib={','.join(f'{r.item():.0f}' for r in all_rss)}")
        print("losses: " + " ".join(f"{i + 1}:{l:.6f}" for i, l in enumerate(losses)))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
