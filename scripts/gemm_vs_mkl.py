"""weft's f32 GEMM kernels beside PyTorch's torch.mm (MKL on x86) on one thread, call by call in one process.

    /tmp/torchenv/bin/python scripts/gemm_vs_mkl.py [--build build] [--reps 15] [--kernels avx512,avx512_8x48]

Each kernel is called straight from build/libweft-kernels.so (the serial entry points of kernels/cpu/sgemm.h, the
same code weft's gemm runs per thread) on the operands torch.mm multiplies, in turn with torch.mm, so that the
machine's drift falls on both alike. Prints per shape MKL's median GFLOP/s and each kernel's median ratio of speed
to it (and its best GFLOP/s). A developer tool for docs/PERFORMANCE.md: never part of meson test or CI.
"""
import argparse
import ctypes
import statistics
import time

import torch

SHAPES = [  # name, m, k, n, which operand is a transposed view (as a weight or X^T is)
    ("1024^3", 1024, 1024, 1024, ""),
    ("GPT medium qkv fwd", 2048, 384, 1152, "b"),
    ("GPT medium mlp fc dW", 1536, 2048, 384, "a"),
    ("GPT-2 124M qkv fwd", 2048, 768, 2304, "b"),
    ("GPT-2 124M mlp proj fwd", 2048, 3072, 768, "b"),
    ("GPT-2 124M mlp proj dX", 2048, 768, 3072, ""),
    ("GPT-2 124M mlp fc dW", 3072, 2048, 768, "a"),
    ("Llama 350M qkv fwd", 2048, 1024, 2048, "b"),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--kernels", default="avx512,avx512_8x48")
    o = p.parse_args()
    torch.set_num_threads(1)
    lib = ctypes.CDLL(f"{o.build}/libweft-kernels.so")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fns = []
    for name in o.kernels.split(","):
        # weft::kernels::cpu::sgemm_<name>(int64 m, n, k, const float* a, a_rs, a_cs, b, b_rs, b_cs, float* c, ldc,
        # float alpha, float beta), by its mangled name
        fn = getattr(lib, f"_ZN4weft7kernels3cpu{len('sgemm_' + name)}sgemm_{name}ElllPKfllS3_llPflff")
        fn.argtypes = [i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_float, ctypes.c_float]
        fns.append(fn)
    print(f"# {torch.__version__}, torch.backends.cpu capability {torch.backends.cpu.get_cpu_capability()}, 1 thread")
    print("| shape | m x k x n | MKL GFLOP/s | " + " | ".join(f"{k} / MKL (best GFLOP/s)" for k in o.kernels.split(",")) + " |")
    print("|---|---|---:|" + "---:|" * len(fns))
    for name, m, k, n, t in SHAPES:
        a = torch.randn(k, m).t() if t == "a" else torch.randn(m, k)
        b = torch.randn(n, k).t() if t == "b" else torch.randn(k, n)
        c = torch.empty(m, n)
        calls = [lambda: torch.mm(a, b, out=c)] + [
            (lambda f=f: f(m, n, k, a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1),
                           c.data_ptr(), n, 1.0, 0.0)) for f in fns]
        rates = [[] for _ in calls]
        for call in calls:
            call()
        for _ in range(o.reps):
            for i, call in enumerate(calls):
                t0 = time.perf_counter()
                call()
                rates[i].append(2 * m * n * k / (time.perf_counter() - t0) / 1e9)
        want = torch.mm(a, b)
        for call in calls[1:]:
            call()
            assert torch.allclose(c, want, rtol=1e-3, atol=1e-2), f"{name}: a kernel's product differs from torch.mm's"
        ratios = [statistics.median(r[j] / rates[0][j] for j in range(o.reps)) for r in rates[1:]]
        cells = " | ".join(f"{x:.2f} ({max(r):.0f})" for x, r in zip(ratios, rates[1:]))
        t_note = " A^T" if t == "a" else " B^T" if t == "b" else ""
        print(f"| {name} | {m}x{k}x{n}{t_note} | {statistics.median(rates[0]):.0f} | {cells} |")


if __name__ == "__main__":
    main()
