"""Host time per ``ops.attention`` call, and where it goes (cProfile), on a GPU.

Usage: PYTHONPATH=src python benchmarks/host_overhead.py [--op DC-GQA] [--seq 16384]

Times, per call: the whole eager call in a loop (host-bound when the kernels are short),
the same with a device synchronisation per call, the compiled kernel's ``launch`` alone,
and CUDA-graph replay (GPU time only); then the functions with the most host time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import triton.testing

from neptune_fusion import ops
from neptune_fusion.bench.operators import make_inputs, select_operators
from neptune_fusion.frontend.attention import AttentionCache


def per_call_us(fn, n: int = 500, sync_each: bool = False) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="DC-GQA")
    ap.add_argument("--seq", type=int, default=16384)
    args = ap.parse_args()
    (op,) = select_operators([args.op])
    dev = torch.device("cuda")
    q, k, v = make_inputs(op, args.seq, torch.float16, dev)
    kw = dict(scale=op.scale, causal=op.causal, q_start=op.q_start(args.seq),
              alibi_slopes=op.alibi_slopes(dev), softcap=op.softcap, window=op.window)
    cache = AttentionCache()

    def call():
        return ops.attention(q, k, v, cache=cache, **kw)
    call()
    (auto,) = cache.kernels()
    print(f"{op.name} S={args.seq}: {auto.last_choice.schedule}")
    print(f"eager loop         {per_call_us(call):8.1f} us/call")
    print(f"eager + sync each  {per_call_us(call, sync_each=True):8.1f} us/call")
    print(f"do_bench (L2 flush){triton.testing.do_bench(call, return_mode='median') * 1e3:8.1f} us")
    print(f"graph replay       "
          f"{triton.testing.do_bench_cudagraph(call, return_mode='median') * 1e3:8.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        call()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
