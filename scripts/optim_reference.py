#!/usr/bin/env python3
"""PyTorch reference for weft's optimizer tests (tests/test_nn_optim.cpp): prints each case's parameters after its
steps as C++ hexfloats, to paste into the test. Run it through scripts/hf_reference.sh optim-fixture (the venv).
A developer tool: never part of meson test or CI.

Every case starts from p_i = ((i * a) % 23 - 11) / 7 and steps with gradients g_k = base * (k + 1) + 0.5 * p,
base_i = ((i * b) % 17 - 8) / 20, in f32 through torch.optim's defaults (the single-tensor path on CPU).
"""
import torch


def run(make, n=32, steps=4, a=37, b=13):
    p = torch.tensor([((i * a) % 23 - 11) / 7.0 for i in range(n)], dtype=torch.float32, requires_grad=True)
    base = torch.tensor([((i * b) % 17 - 8) / 20.0 for i in range(n)], dtype=torch.float32)
    opt = make([p])
    for k in range(steps):
        p.grad = base * float(k + 1) + p.detach() * 0.5
        opt.step()
    return p.detach()


def show(name, p):
    print(f"// {name}")
    print(", ".join(float(x).hex().replace("0000000p", "p").rstrip() + "f" for x in p))


def main():
    print(f"// torch {torch.__version__}")
    show("AdamW lr 0.01 wd 0.1", run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)))
    show("Adam lr 0.01 wd 0.1", run(lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1)))
    show("SGD lr 0.1 momentum 0.9 dampening 0.1 wd 0.01",
         run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)))
    show("SGD lr 0.1 momentum 0.9 nesterov", run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)))
    # Six steps on 64 parameters: inputs where exp_avg.lerp_(grad, 1 - beta1) (torch >= 2.0) and
    # exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) (torch 1.x) round differently, and where torch's f32 sqrt
    # (MKL's on PyPI builds, not always correctly rounded) happens to round as std::sqrt does.
    show("AdamW lr 0.01 wd 0.1, 64 parameters, 6 steps, a 43, b 31",
         run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1), n=64, steps=6, a=43, b=31))


if __name__ == "__main__":
    main()
