"""``nf.attention``'s eager prefill call: GPU time against the time an eager timer sees,
and the host time per call (H200; issues 17, 18).

Usage: ``PYTHONPATH=src:benchmarks python benchmarks/prefill_host.py`` (writes ``nf_probe.json``
under ``$OUT``, or here).

For PF-Causal and PF-Global (fp16, one batch, 32 heads) at 4096 keys, head dim 64 and
128, and PF-Causal at 16384, head dim 64: ``do_bench`` (an L2 flush before each call;
what ``neptune-fusion bench`` uses), ``do_bench_cudagraph`` (GPU time), 200 calls
back to back waited for (``nf_loop``), the host time per call (200 calls enqueued, not
waited for: ``nf_host_ms``), cuDNN's SDPA both ways, and the profiler's kernel time.
Where the host time per call approaches the kernel's, ``do_bench`` times the host too.
``--points PF-Global:4096:128,...`` picks the points; ``--cprofile N`` also profiles N
bound calls per point (enqueued, not waited for) and writes the functions with the most
own time, with cuDNN's host time per call beside ours (``cudnn_host_ms``).
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import time
from functools import partial

import torch
from host_overhead import per_call_us
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench, do_bench_cudagraph

from neptune_fusion import ops
from neptune_fusion.bench.workloads import attention_options

POINTS = (("PF-Causal", 4096, 64), ("PF-Global", 4096, 64), ("PF-Causal", 4096, 128),
          ("PF-Causal", 16384, 64))


def _host_ms(fn, calls: int = 200) -> float:
    """Host milliseconds per call: ``calls`` calls enqueued, not waited for."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    took = (time.perf_counter() - t) / calls * 1e3
    torch.cuda.synchronize()
    return took


def point(name: str, n: int, d: int, cprofile: int = 0) -> dict:
    op = ops.operator(name)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, k, v = (torch.randn(1, op.q_heads, n, d, device="cuda", dtype=torch.half,
                           generator=gen) for _ in range(3))
    opts = attention_options(op, n, q.device)
    opts["scale"] = d ** -0.5
    ours = partial(ops.attention, q, k, v, **opts)
    ours()
    r = {"op": name, "n": n, "d": d,
         "nf_bench": do_bench(ours, warmup=50, rep=300),
         "nf_graph": do_bench_cudagraph(ours, rep=300),
         "nf_loop": per_call_us(ours, n=200) / 1e3,
         "nf_host_ms": _host_ms(ours)}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cud = partial(torch.nn.functional.scaled_dot_product_attention, q, k, v,
                      is_causal=op.causal, scale=opts["scale"])
        r["cudnn_bench"] = do_bench(cud, warmup=50, rep=300)
        r["cudnn_graph"] = do_bench_cudagraph(cud, rep=300)
        r["cudnn_host_ms"] = _host_ms(cud)
    if cprofile:
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(cprofile):
            ours()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        r["cprofile"] = text.getvalue()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ours()
        torch.cuda.synchronize()
    r["prof"] = [[e.key[:60], round(e.device_time_total / 5, 1)]
                 for e in prof.key_averages() if e.device_time_total > 0]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=None,
                    help="op:keys:head_dim,... (default: the four above)")
    ap.add_argument("--cprofile", type=int, default=0, help="profile this many calls")
    args = ap.parse_args()
    points = POINTS if args.points is None else [
        (a, int(b), int(c)) for a, b, c in (x.split(":") for x in args.points.split(","))]
    res = []
    for p in points:
        res.append(point(*p, cprofile=args.cprofile))
        text = res[-1].pop("cprofile", None)
        print(json.dumps(res[-1]), flush=True)
        if text:
            print(text, flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "nf_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
