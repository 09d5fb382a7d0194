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
"""

import json
import os
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


def point(name: str, n: int, d: int) -> dict:
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
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ours()
        torch.cuda.synchronize()
    r["prof"] = [[e.key[:60], round(e.device_time_total / 5, 1)]
                 for e in prof.key_averages() if e.device_time_total > 0]
    return r


def main() -> None:
    res = []
    for p in POINTS:
        res.append(point(*p))
        print(json.dumps(res[-1]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "nf_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
