"""Does the tuner's clock agree with the benchmark's? (issue 18, docs/hopper.md)

The auto-scheduler times candidates by CUDA-graph replay (back to back, no L2 flush:
runtime/tune.py); ``neptune-fusion bench`` by ``do_bench`` (an L2 flush before each
call). For a few schedules of one operator this prints both, and a third clock: the
same back-to-back launches timed by events without a graph, so a difference can be
put on the graph or on the back-to-back load. Every output is checked against the
kernel of the first schedule. Usage (GPU): ``python benchmarks/tuner_timing.py --op
PF-ALiBi --seq 4096``.
"""
import argparse
import json
from functools import partial

import torch
from triton.testing import do_bench, do_bench_cudagraph

from neptune_fusion import ops
from neptune_fusion.bench.workloads import attention_options
from neptune_fusion.schedule.schedule import Schedule

FORMS = {"gluon-128x128": dict(block_n=128, num_stages=2, dialect="gluon"),
         "gluon-128x64": dict(block_n=64, num_stages=2, dialect="gluon"),
         "triton-128x128-s3": dict(block_n=128, num_stages=3)}


def back_to_back(fn, n=100):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="PF-ALiBi")
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    op = ops.operator(args.op)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, op.q_heads, args.seq, op.head_dim, device="cuda",
                    dtype=torch.float16, generator=gen)
    k, v = (torch.randn(1, op.kv_heads, args.seq, op.head_dim, device="cuda",
                        dtype=torch.float16, generator=gen) for _ in range(2))
    opts = attention_options(op, args.seq, q.device)
    first = None
    for name, kw in FORMS.items():
        s = Schedule(block_m=128, num_warps=8, **kw)
        fn = partial(ops.attention, q, k, v, schedule=s, **opts)
        out = fn()
        first = out if first is None else first
        err = ((out.float() - first.float()).norm() / first.float().norm()).item()
        print(json.dumps(dict(op=args.op, seq=args.seq, form=name, vs_first=err,
                              do_bench=round(do_bench(fn, warmup=50, rep=300), 4),
                              graph=round(do_bench_cudagraph(fn, rep=100), 4),
                              back_to_back=round(back_to_back(fn), 4))), flush=True)


if __name__ == "__main__":
    main()
