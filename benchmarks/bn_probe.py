"""A batch norm's statistics over non-adjacent axes: which schedule, and against Inductor.

``F.batch_norm(training=True)`` reduces ``(N, C, H, W)`` over ``(0, 2, 3)``; the backend
fuses it as one reduction per channel over the merged ``N * H * W`` axis, read by index
arithmetic (``x[r // HW, c, r % HW]``). This times, in one process and GPU time
(CUDA-graph replay), on fresh data checked against float64 first:

* ``jit``/``inductor``/``eager``: ``batch_norm`` (statistics and the normalised output)
  and ``var_mean`` over ``(0, 2, 3)`` through the backend (auto schedule), Inductor and
  eager;
* ``stats:<schedule>``: the statistics written in the language over the merged axis, at
  the auto schedule and at explicit rolling and split-k schedules (``--schedules``);
* ``contiguous:<schedule>``: the same program over a ``(C, N * H * W)`` copy (no index
  arithmetic), for what the strided read costs.

Usage (GPU): ``PYTHONPATH=src python benchmarks/bn_probe.py [--out FILE.jsonl]``; prints
one JSON line per point.
"""

from __future__ import annotations

import argparse
import json

import torch

import neptune_fusion as nf
from neptune_fusion.bench.timing import graph_timer
from neptune_fusion.dynamo import jit
from neptune_fusion.schedule.schedule import Schedule

N, C, HW = 32, 64, 56 * 56
SCHEDULES = {
    "rolling-1x4096-w8": Schedule(strategy="rolling", block_m=1, block_n=4096, num_warps=8),
    "rolling-4x1024-w4": Schedule(strategy="rolling", block_m=4, block_n=1024, num_warps=4),
    "split8-1x4096-w8": Schedule(strategy="split", splits=8, block_m=1, block_n=4096,
                                 num_warps=8),
    "split16-2x2048-w4": Schedule(strategy="split", splits=16, block_m=2, block_n=2048,
                                  num_warps=4),
    "split32-4x1024-w4": Schedule(strategy="split", splits=32, block_m=4, block_n=1024,
                                  num_warps=4),
}


def stats_program(contiguous: bool):
    """Mean and variance per channel over the merged axis (fp16 in, fp32 math)."""
    shape = (C, N * HW) if contiguous else (N, C, HW)
    x = nf.placeholder(shape, "float16", name="x")
    r = nf.reduce_axis(N * HW, "r")

    def at(c):
        e = x[c, r] if contiguous else x[r // HW, c, r % HW]
        return nf.cast(e, "float32")
    mu = nf.compute((C,), lambda c: nf.sum(at(c), r) / (N * HW), name="mean")
    var = nf.compute((C,), lambda c: nf.sum((at(c) - mu[c]) ** 2, r) / (N * HW),
                     name="var")
    return [mu, var], [x]


def _err(got, want) -> float:
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    return max(float((g.double() - w).norm() / w.norm()) for g, w in zip(got, want))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    timer = graph_timer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, C, 56, 56, device="cuda", generator=gen).half() * 2 + 1
    w = torch.randn(C, device="cuda", generator=gen)
    b = torch.randn(C, device="cuda", generator=gen)
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    fns = {
        "batch_norm": (lambda x: torch.nn.functional.batch_norm(
            x, None, None, w, b, training=True), (x,)),
        "var_mean": (lambda x: torch.var_mean(x, (0, 2, 3), correction=0), (x,)),
    }
    for name, (fn, a) in fns.items():
        want = fn(a[0].double()) if name == "var_mean" else \
            torch.nn.functional.batch_norm(a[0].double(), None, None, w.double(),
                                           b.double(), training=True)
        for prov, f in (("eager", fn), ("inductor", torch.compile(fn)),
                        ("jit", jit(fn))):
            with torch.no_grad():
                got = f(*a)
                emit({"work": name, "provider": prov, "rel_err": _err(got, want),
                      "gpu_ms": timer(lambda f=f, a=a: f(*a))})
    xd = x.double().permute(1, 0, 2, 3).reshape(C, -1)
    want = (xd.mean(1), xd.var(1, correction=0))
    for contiguous in (False, True):
        outs, ins = stats_program(contiguous)
        xin = x.permute(1, 0, 2, 3).reshape(C, -1).contiguous() if contiguous else \
            x.reshape(N, C, HW)
        for sname, s in (("auto", "auto"), *SCHEDULES.items()):
            kind = "contiguous" if contiguous else "stats"
            try:
                f = nf.compile(outs, inputs=ins, schedule=s)
                got = f(xin)
                row = {"work": f"{kind}:{sname}", "rel_err": _err(got, want),
                       "gpu_ms": timer(lambda f=f, xin=xin: f(xin))}
                if s == "auto":
                    row["chosen"] = str(f.schedule_for(xin))
            except Exception as e:   # noqa: BLE001 - a probe reports and goes on
                row = {"work": f"{kind}:{sname}", "error": f"{type(e).__name__}: {e}"[:300]}
            emit(row)
    if args.out:
        with open(args.out, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
