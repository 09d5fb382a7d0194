"""Probe: would Hopper TMA loads speed up the split-k partial kernel of DC-GQA?

A measurement tool, not product code: a minimal hand-written decode partial kernel in the
shape of the generated one (8 KV heads, the group's 8 query heads packed into a 16-row
tile, head dim 128, fp16), in three load forms, timed by CUDA-graph replay:

* ``ptr``: pointer-arithmetic loads (what the generated kernel does);
* ``tma``: device-side tensor descriptors (``tl.make_tensor_descriptor``);
* ``read``/``read_tma``: the same streaming loads with no arithmetic (a floor).

Each attention variant is merged in torch and checked against float64. Prints GPU µs and
the share of the copy ceiling measured in the same run (K+V bytes over time).

Usage on a GPU: PYTHONPATH=src python benchmarks/tma_probe.py [--seq 16384] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

HKV, G, D = 8, 8, 128


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, o_ptr, S, CHUNK, scale,
             NH: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
             TMA: tl.constexpr, READ: tl.constexpr, WS: tl.constexpr,
             STAGES: tl.constexpr):
    h = tl.program_id(0)
    sp = tl.program_id(1)
    rows = tl.arange(0, BM)
    cols = tl.arange(0, D)
    offs_n = tl.arange(0, BN)
    q = tl.load(q_ptr + (h * G + rows)[:, None] * D + cols[None, :],
                mask=(rows < G)[:, None], other=0.0)
    lo = sp * CHUNK
    hi = tl.minimum(lo + CHUNK, S)
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)  # noqa: E741
    acc = tl.zeros([BM, D], tl.float32)
    red = tl.zeros([D], tl.float32)
    if TMA:
        kd = tl.make_tensor_descriptor(k_ptr, shape=[NH * S, D], strides=[D, 1],
                                       block_shape=[BN, D])
        vd = tl.make_tensor_descriptor(v_ptr, shape=[NH * S, D], strides=[D, 1],
                                       block_shape=[BN, D])
    for j0 in tl.range(lo, hi, BN, num_stages=STAGES, warp_specialize=WS):
        if TMA:
            k = kd.load([h * S + j0, 0])
            v = vd.load([h * S + j0, 0])
        else:
            k = tl.load(k_ptr + (h * S + j0 + offs_n)[:, None] * D + cols[None, :])
            v = tl.load(v_ptr + (h * S + j0 + offs_n)[:, None] * D + cols[None, :])
        if READ:
            red += tl.sum(k.to(tl.float32), 0) + tl.sum(v.to(tl.float32), 0)
        else:
            s = tl.dot(q, tl.trans(k)) * scale
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)  # noqa: E741
            acc = tl.dot(p.to(tl.float16), v, acc=acc * alpha[:, None])
            m = m_new
    base = (sp * NH + h) * BM
    if READ:
        tl.store(o_ptr + (sp * NH + h) * D + cols, red)
    else:
        tl.store(m_ptr + base + rows, m)
        tl.store(l_ptr + base + rows, l)
        tl.store(o_ptr + (base + rows)[:, None] * D + cols[None, :], acc)


def merge(m, l, o):  # noqa: E741 - (splits, HKV, BM[, D]) partial states, base-2 scores
    gm = m.max(0).values
    w = torch.exp2(m - gm)
    return (o * w[..., None]).sum(0) / (l * w).sum(0)[..., None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                   device=dev))
    S = args.seq
    src = torch.empty(1 << 29, dtype=torch.float16, device=dev)
    dst = torch.empty_like(src)
    ceil_ms = triton.testing.do_bench(lambda d=dst, s=src: d.copy_(s), rep=200,
                                      return_mode="median")
    ceiling = 2 * src.numel() * 2 / (ceil_ms * 1e-3) / 1e12
    del src, dst
    q = torch.randn(HKV * G, D, dtype=torch.float16, device=dev)
    k = torch.randn(HKV, S, D, dtype=torch.float16, device=dev)
    v = torch.randn(HKV, S, D, dtype=torch.float16, device=dev)
    scale = D ** -0.5 * 1.4426950408889634
    sref = (q.double().view(HKV, G, D) @ k.double().transpose(1, 2)) * D ** -0.5
    ref = torch.softmax(sref, -1) @ v.double()
    kv_bytes = 2 * k.numel() * 2
    print(f"copy ceiling {ceiling:.2f} TB/s; K+V {kv_bytes / 1e6:.1f} MB -> "
          f"{kv_bytes / ceiling / 1e6:.1f} us at the ceiling")
    rows = []
    for mode, bn, warps, stages, splits in itertools.product(
            ("ptr", "tma", "tma_ws", "read", "read_tma"), (64, 128), (4, 8), (2, 3, 4),
            (16, 32)):
        if mode == "tma_ws" and (warps != 4 or stages == 2):
            continue
        chunk = S // splits
        m = torch.empty(splits, HKV, 16, device=dev)
        l = torch.empty_like(m)  # noqa: E741
        o = torch.empty(splits, HKV, 16, D, device=dev)

        def call(mode=mode, bn=bn, warps=warps, stages=stages, splits=splits, chunk=chunk,
                 m=m, l=l, o=o):  # noqa: E741
            _partial[(HKV, splits)](q, k, v, m, l, o, S, chunk, scale, NH=HKV, G=G, BM=16, BN=bn,
                                    D=D, TMA=mode in ("tma", "tma_ws", "read_tma"),
                                    READ=mode.startswith("read"), WS=mode == "tma_ws",
                                    STAGES=stages, num_warps=warps)
        row = dict(mode=mode, bn=bn, warps=warps, stages=stages, splits=splits)
        try:
            call()
            torch.cuda.synchronize()
            if not mode.startswith("read"):
                got = merge(m, l, o)[:, :G]
                row["rel_error"] = ((got.double() - ref).norm() / ref.norm()).item()
            us = triton.testing.do_bench_cudagraph(call, rep=30, return_mode="median") * 1e3
            row.update(us=us, of_ceiling=kv_bytes / (us * 1e-6) / 1e12 / ceiling)
        except Exception as err:  # noqa: BLE001 - a probe: record and go on
            row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        rows.append(row)
        print(row, flush=True)
    print("\nbest per mode:")
    for mode in ("ptr", "tma", "tma_ws", "read", "read_tma"):
        ok = [r for r in rows if r["mode"] == mode and "us" in r]
        if ok:
            b = min(ok, key=lambda r: r["us"])
            print(f"  {mode:9s} {b['us']:6.1f} us  {b['of_ceiling']:.0%}  {b}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tma_probe.json").write_text(json.dumps(
            {"ceiling_tbps": ceiling, "seq": S, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
