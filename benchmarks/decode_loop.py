"""Host time of an eager decode loop: the KV length grows by one per step.

Usage on a GPU:
    PYTHONPATH=src python benchmarks/decode_loop.py [--ops DC-GQA,DC-Causal] \
        [--seq 16384] [--steps 200]

A serving loop reads a preallocated KV cache whose visible length grows by one token per
step, so every call has a new key length: what it costs on the host is the path of a new
input signature, not the steady state of one shape that ``host_overhead.py`` and the
bench time. Per operator: one warm-up call (tunes the shape class), then ``--steps`` calls
at lengths ``seq - steps + 1 .. seq`` (one shape class) and the same number at the
fixed length ``seq``, timed on the host with a synchronisation at the end; the last
step's output is checked against float64; ``--profile`` shows where the growing loop's
host time goes. The compiler is called only through its public ``ops.attention`` (inputs,
reference and error from the harness), so versions of the compiler compare like for like.
"""

from __future__ import annotations

import argparse
import time

import torch

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.workloads import make_inputs, select_operators
from neptune_fusion.frontend.attention import AttentionCache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="DC-GQA,DC-Causal,DC-ALiBi,DC-SoftCap")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--profile", action="store_true",
                    help="also print where the host time of the growing loop goes (cProfile)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"{'operator':<11} {'growing us/step':>16} {'fixed us/step':>14} {'rel. error':>11}")
    for op in select_operators(args.ops.split(",")):
        q, kc, vc = make_inputs(op, args.seq, torch.float16, dev)
        cache = AttentionCache()
        slopes = op.alibi_slopes(dev)

        def step(m, q=q, kc=kc, vc=vc, cache=cache, op=op, slopes=slopes):
            return ops.attention(q, kc[:, :, :m], vc[:, :, :m], scale=op.scale,
                                 causal=op.causal, q_start=m - 1, alibi_slopes=slopes,
                                 softcap=op.softcap, window=op.window, cache=cache)
        lengths = range(args.seq - args.steps + 1, args.seq + 1)
        step(lengths[0] - 1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for m in lengths:
            out = step(m)
        torch.cuda.synchronize()
        grow = (time.perf_counter() - t0) / len(lengths) * 1e6
        ref = reference_attention(op, q, kc, vc)
        err = relative_error(out, ref)
        t0 = time.perf_counter()
        for _ in lengths:
            step(args.seq)
        torch.cuda.synchronize()
        fixed = (time.perf_counter() - t0) / len(lengths) * 1e6
        print(f"{op.name:<11} {grow:>16.1f} {fixed:>14.1f} {err:>11.1e}", flush=True)
        if args.profile:    # lengths not seen yet, in the same shape class
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            for m in range(lengths[0] - len(lengths), lengths[0] - 1):
                step(m)
            torch.cuda.synchronize()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
