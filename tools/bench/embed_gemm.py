#!/usr/bin/env python3
"""One f32 GEMM in isolation, to set the kernel choices of issue 16 side by side.

MiniLM's biggest matrix product at a batch of 64 sentences of 16 tokens: (1024 x 384) times
(384 x 1536), the feed-forward layer's first half (1.2 GFLOP). Times it with numpy (PyPI's
numpy wheel bundles OpenBLAS: the "system BLAS" candidate, without Debian's packaging) and,
where torch imports, with torch (oneDNN/MKL, what sentence-transformers and Infinity run on).
candle's gemm does the same product in benches/embed_forward.rs (`gemm_1024x384x1536`).

    V/bin/python tools/bench/embed_gemm.py [--threads 2] [--repeats 30]

Prints one JSON line per library: median and min ms, and GFLOP/s at the median.
"""
import argparse
import json
import os
import statistics
import time

M, K, N = 1024, 384, 1536


def timed(f, repeats):
    for _ in range(3):
        f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times)


def report(lib, version, threads, med, low):
    flop = 2 * M * K * N
    print(
        json.dumps(
            {
                "lib": lib,
                "version": version,
                "threads": threads,
                "shape": f"{M}x{K}x{N}",
                "median_ms": round(med, 3),
                "min_ms": round(low, 3),
                "gflops": round(flop / med / 1e6, 1),
                "load1": float(open("/proc/loadavg").read().split()[0]),
            }
        )
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((K, N), dtype=np.float32)
    med, low = timed(lambda: x @ w, a.repeats)
    report("numpy-openblas", np.__version__, a.threads, med, low)
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(a.threads)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    with torch.no_grad():
        med, low = timed(lambda: tx @ tw, a.repeats)
    report("torch", torch.__version__, a.threads, med, low)


if __name__ == "__main__":
    main()
