"""Cold and warm compile times of reduction chains with static (Python int) sizes, on a GPU.

Issue 14's tuning targets: the auto-scheduler's candidate check never evaluates the
full-size float64 reference on the host (static sizes included), cold compile + tune of
a chain <= 5 s, a warm compile in a running process <= 50 ms. For each program below this
compiles it with ``schedule="auto"`` in a fresh cache (cold: plan, lowering, tuning with
the sampled reference check), calls it, then compiles the same definition again in the
same process with the cache kept (warm), and checks the output against float64 torch on
a few rows. Prints one line per program and writes JSON to ``--out``.

    python benchmarks/compile_check.py --out compile.json
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time

import torch

import neptune_fusion as nf


def softmax(rows: int, cols: int):
    x = nf.placeholder((rows, cols), "float32", name="x")
    j = nf.reduce_axis(cols, "j")
    m = nf.compute((rows,), lambda i: nf.max(x[i, j], j), name="m")
    s = nf.compute((rows,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="s")
    y = nf.compute((rows, cols), lambda i, c: nf.exp(x[i, c] - m[i]) / s[i], name="y")
    ref = lambda x: torch.softmax(x.double(), -1)  # noqa: E731
    return [y], [x], ref


def logsumexp(rows: int, cols: int):
    x = nf.placeholder((rows, cols), "float32", name="x")
    j = nf.reduce_axis(cols, "j")
    m = nf.compute((rows,), lambda i: nf.max(x[i, j], j), name="m")
    s = nf.compute((rows,), lambda i: nf.log(nf.sum(nf.exp(x[i, j] - m[i]), j)) + m[i],
                   name="lse")
    ref = lambda x: torch.logsumexp(x.double(), -1)  # noqa: E731
    return [s], [x], ref


def attention(heads: int, n: int, d: int):
    q = nf.placeholder((heads, n, d), "float16", name="q")
    k = nf.placeholder((heads, n, d), "float16", name="k")
    v = nf.placeholder((heads, n, d), "float16", name="v")
    c = nf.reduce_axis(d, "c")
    j = nf.reduce_axis(n, "j")
    sc = d ** -0.5
    s = nf.compute((heads, n, n), lambda h, i, jj: nf.sum(q[h, i, c] * k[h, jj, c], c) * sc,
                   name="s")
    m = nf.compute((heads, n), lambda h, i: nf.max(s[h, i, j], j), name="m")
    den = nf.compute((heads, n), lambda h, i: nf.sum(nf.exp(s[h, i, j] - m[h, i]), j), name="l")
    o = nf.compute((heads, n, d), lambda h, i, e: nf.sum(nf.exp(s[h, i, j] - m[h, i])
                                                         * v[h, j, e], j) / den[h, i], name="o")

    def ref(q, k, v):
        return torch.softmax((q.double() @ k.double().transpose(-1, -2)) * sc, -1) @ v.double()
    return [o], [q, k, v], ref


PROGRAMS = {
    "softmax 4096x32768 fp32": lambda: softmax(4096, 32768),
    "logsumexp 4096x32768 fp32": lambda: logsumexp(4096, 32768),
    "attention 32x4096x4096 d64 fp16": lambda: attention(32, 4096, 64),
}


def _inputs(ins):
    return [torch.randn(tuple(p.shape), device="cuda").to(getattr(torch, p.dtype.name))
            for p in ins]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name, make in PROGRAMS.items():
        outs, ins, ref = make()
        x = _inputs(ins)
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            kern = nf.compile(outs, ins, cache=cache)
            y = kern(*x)
            y = y[0] if isinstance(y, list) else y
            torch.cuda.synchronize()
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = nf.compile(outs, ins, cache=cache)
            again.kernel_for(*x)
            warm = time.perf_counter() - t0
        sel = slice(0, 8)   # float64 check on a few rows of the leading axis
        want = ref(*[t[sel] for t in x])
        got = y[sel].double()
        err = ((got - want).norm() / want.norm()).item()
        choice = kern.last_choice
        rows.append({"program": name, "cold_s": cold, "warm_ms": warm * 1e3, "rel_err": err,
                     "schedule": choice.schedule.to_dict() if choice else None,
                     "source": choice.source if choice else None,
                     "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        print(f"{name:34s} cold {cold:6.2f} s  warm {warm * 1e3:7.1f} ms  rel.err {err:.1e}  "
              f"host peak {rows[-1]['max_rss_mib']:.0f} MiB", flush=True)
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": __import__("triton").__version__}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
