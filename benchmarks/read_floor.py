"""How fast can this GPU read DC-GQA's K and V (64 MiB) at all, and how fast do we?

Usage on a GPU: PYTHONPATH=src python benchmarks/read_floor.py [--seq 16384] [--out DIR]

A measurement tool. Three things, each timed by CUDA-graph replay over three different
input sets per replay (3 x 64 MiB, more than the 60 MiB L2, so no replay finds its data
in L2), as microseconds per pass:

* ``read``: a streaming-read kernel over a flat buffer of K+V's size (each program reads
  one contiguous chunk in 16-byte-per-thread blocks and accumulates elementwise; one
  float out per program), for many grid sizes, block sizes and warp counts -- the floor
  for any kernel that must read those bytes once;
* ``copy``: ``torch``'s device copy of half that size (the same bytes moved);
* ``decode``: ``ops.attention`` for DC-GQA (split-k, auto schedule), and ``cudnn``: SDPA's
  cuDNN backend, each checked against float64 first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from neptune_fusion import ops
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.workloads import make_inputs, select_operators
from neptune_fusion.frontend.attention import AttentionCache

SETS = 3


@triton.jit
def _read(x_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = tl.cast(pid, tl.int64) * chunk
    end = tl.minimum(start + chunk, n)
    for i in range(0, chunk, BLOCK):
        idx = start + i + offs
        acc += tl.load(x_ptr + idx, mask=idx < end, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def graph_us(fns, reps: int = 200) -> float:
    """Median microseconds of one fn, replaying a graph that runs every fn once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    (op,) = select_operators(["DC-GQA"])
    inputs = [make_inputs(op, args.seq, torch.float16, dev) for _ in range(SETS)]
    nbytes = 2 * inputs[0][1].numel() * 2
    rows = []

    # the decode call itself, on three input sets per replay
    kw = dict(scale=op.scale, causal=op.causal, q_start=op.q_start(args.seq),
              alibi_slopes=None, softcap=None, window=None)
    cache = AttentionCache()
    q, k, v = inputs[0]
    err = ((ops.attention(q, k, v, cache=cache, **kw).double()
            - reference_attention(op, q, k, v)).norm()
           / reference_attention(op, q, k, v).norm()).item()
    us = graph_us([lambda t=t: ops.attention(*t, cache=cache, **kw) for t in inputs])
    rows.append(dict(what="decode", us=us, rel_error=err))

    # cuDNN's SDPA the same way
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, scale=op.scale, enable_gqa=True)
    err = ((cudnn(q, k, v).double() - reference_attention(op, q, k, v)).norm()
           / reference_attention(op, q, k, v).norm()).item()
    rows.append(dict(what="cudnn", rel_error=err,
                     us=graph_us([lambda t=t: cudnn(*t) for t in inputs])))

    # torch copy: the same bytes moved (half read, half written)
    flat = [torch.cat([t[1].flatten(), t[2].flatten()]) for t in inputs]
    half = [(f[: f.numel() // 2], torch.empty_like(f[: f.numel() // 2])) for f in flat]
    rows.append(dict(what="copy", us=graph_us([lambda s=s, d=d: d.copy_(s)
                                                for s, d in half])))

    # streaming reads of all the bytes
    n = flat[0].numel()
    for programs in (128, 132, 256, 264, 512, 528, 1056, 2112, 4224, 8448):
        for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8)):
            chunk = -(-n // programs // 8) * 8     # 16-byte aligned chunks
            out = torch.empty(programs, device=dev)
            fns = [lambda f=f, chunk=chunk, block=block, warps=warps, programs=programs,
                   out=out: _read[(programs,)](f, out, n, chunk, BLOCK=block, num_warps=warps)
                   for f in flat]
            fns[0]()
            torch.cuda.synchronize()
            pad = torch.zeros(programs * chunk, device=dev)
            pad[:n] = flat[0].float()
            ok = torch.allclose(out, pad.view(programs, chunk).sum(1), rtol=1e-3, atol=2e-1)
            rows.append(dict(what="read", programs=programs, block=block, warps=warps,
                             us=graph_us(fns), ok=ok))
    for r in rows:
        r["tbps"] = nbytes / (r["us"] * 1e-6) / 1e12
        print(r, flush=True)
    best = min((r for r in rows if r["what"] == "read" and r["ok"]), key=lambda r: r["us"])
    dec = rows[0]
    print(f"\n{nbytes / 2**20:.0f} MiB: best read {best['us']:.1f} us ({best['tbps']:.2f} TB/s, "
          f"{best['programs']} programs), copy {rows[2]['us']:.1f} us, cuDNN "
          f"{rows[1]['us']:.1f} us, decode "
          f"{dec['us']:.1f} us ({dec['tbps']:.2f} TB/s, rel. error {dec['rel_error']:.1e})")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "read_floor.json").write_text(json.dumps(
            {"seq": args.seq, "bytes": nbytes, "sets": SETS, "gpu": torch.cuda.get_device_name(),
             "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
