#!/usr/bin/env python3
"""Plot weft-bench-memory timelines: live bytes over time per rank, one panel per world size.

    python3 scripts/plot_memory.py OUT.png np1.json np2.json np4.json

Each input is a `weft-bench-memory --json` file. A rank's line is the largest live value in
each time bin of its timeline (the bench keeps min and max per bin, so no peak is lost); the
band under it reaches down to the bin's smallest value. A dotted line marks rank 0's bound
(FSDP2's formula plus the measured activations, 4B + E + 4Ps + A + A/L) and grey spans the
training steps' forward passes. Needs matplotlib (Debian: python3-matplotlib); nothing in weft's build or tests runs it.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: plot_memory.py OUT.png RUN.json [RUN.json ...]")
    out, paths = argv[1], argv[2:]
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    runs.sort(key=lambda r: r["world"])
    ymax = max(max(max(r["series"]["max_mib"]) for r in run["ranks"]) for run in runs)
    ymax = max(ymax, max(run["ranks"][0]["bound"] / MIB for run in runs)) * 1.08
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4.4), sharey=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, run in zip(axes[0], runs):
        for r in run["ranks"]:
            s = r["series"]
            c = colors[r["rank"] % len(colors)]
            ax.fill_between(s["t_s"], s["min_mib"], s["max_mib"], step="post", color=c, alpha=0.25, lw=0)
            ax.step(s["t_s"], s["max_mib"], where="post", color=c, lw=0.9,
                    label=f"rank {r['rank']}: peak {r['train_peak'] / MIB:.0f} MiB")
        r0 = run["ranks"][0]
        ax.axhline(r0["bound"] / MIB, color="k", ls=":", lw=1,
                   label=f"bound 4B+E+4Ps+A+A/L = {r0['bound'] / MIB:.0f} MiB")
        # Shade each training forward pass (rank 0's clock).
        ev = r0["events"]
        for a, b in zip(ev, ev[1:]):
            if a["phase"] == "forward":
                ax.axvspan(a["t_s"], b["t_s"], color="0.85", alpha=0.5, lw=0)
        ax.set_title(f"{run['world']} rank{'s' if run['world'] > 1 else ''}: peak/rank "
                     f"{max(r['train_peak'] for r in run['ranks']) / MIB:.0f} MiB")
        ax.set_xlabel("time (s)   [grey: forward passes]")
        ax.set_ylim(0, ymax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0][0].set_ylabel("allocator live memory per rank (MiB)")
    r = runs[0]
    fig.suptitle(f"weft FSDP memory over time: GPT n_layer {r['n_layer']}, d_model {r['d_model']}, ctx {r['ctx']}, "
                 f"batch {r['batch_per_rank']}/rank, fp32 AdamW, {r['steps']} steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
