"""Dynamic shapes through the torch.compile backend: one graph for every size (issue 19).

Usage:
    PYTHONPATH=src python benchmarks/jit_dynamic.py [--work decode,prefill,ce,rmsnorm] \
        [--out FILE.jsonl] [--profile]

Each workload is a plain PyTorch function whose sizes come from its inputs (a mask built
from ``q.shape``, no size baked in), called at several sizes in turn -- a growing KV
cache, prompts of several lengths, batches of several token counts -- as serving calls it.
Per size, in one process:

* ``jit``: ``nf.jit(fn)`` with torch.compile's default ``dynamic=None`` (the second size
  recompiles with symbolic sizes; every later size reuses that graph);
* ``inductor``: ``torch.compile(fn)``, the same default, Inductor alone;
* ``jit-static``: ``nf.jit(fn, dynamic=False)``: a graph per size, the yardstick of what
  the symbolic graph gives up.

Columns: the first call's wall time at that size (a compile when one happens), graphs
compiled so far, the chains fused in the graph that size runs, the output's error against
float64, the GPU time of a call (CUDA-graph replay: the sizes' kernels alone; the
ratios are of these) and its time as an eager call (``do_bench``, host work included:
Dynamo's guards and the graph's wrapper, the same for every size). On a CPU the sizes are
tiny, the kernels run under the interpreter and times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from neptune_fusion.bench.providers._compile import raise_recompile_limits
from neptune_fusion.dynamo import jit


def decode(q, k, v):
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v


def prefill_causal(q, k, v):
    n = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s = s.float().masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).to(v.dtype) @ v


def cross_entropy(x, t):
    return F.cross_entropy(x.float(), t)


def rmsnorm_matmul(x, w, big_w):
    xf = x.float()
    y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + 1e-6) * w.float()
    return y.to(x.dtype) @ big_w


def _attention_inputs(heads, dim, q_len, kv_len, dtype, dev, gen):
    def r(n):
        return torch.randn(1, heads, n, dim, generator=gen, device=dev).to(dtype)
    return r(q_len), r(kv_len), r(kv_len)


# name: (function, sizes on a GPU, sizes on a CPU, inputs(size, dtype, device, generator))
WORK = {
    "decode": (decode, [4096, 4097, 6000, 8192, 16384], [16, 17, 40],
               lambda n, dt, dev, g, small: _attention_inputs(
                   4 if small else 32, 16 if small else 128, 1, n, dt, dev, g)),
    "prefill": (prefill_causal, [1024, 2048, 3000, 4096], [16, 24, 40],
                lambda n, dt, dev, g, small: _attention_inputs(
                    2 if small else 32, 16 if small else 128, n, n, dt, dev, g)),
    "ce": (cross_entropy, [1024, 2048, 3000, 4096], [3, 5, 9],
           lambda n, dt, dev, g, small: (
               torch.randn(n, 64 if small else 32768, generator=g, device=dev).to(dt),
               torch.randint(0, 64 if small else 32768, (n,), generator=g, device=dev))),
    "rmsnorm": (rmsnorm_matmul, [512, 1000, 2048, 4096], [3, 5, 9],
                lambda n, dt, dev, g, small: (
                    torch.randn(n, 32 if small else 4096, generator=g, device=dev).to(dt),
                    (1 + 0.1 * torch.randn(32 if small else 4096, generator=g,
                                           device=dev)).to(dt),
                    (torch.randn(32 if small else 4096, 24 if small else 4096, generator=g,
                                 device=dev) / (32 if small else 64)).to(dt))),
}


def float64(args):
    return tuple(a.double() if a.is_floating_point() else a for a in args)


def timers(device: str) -> dict:
    """``ms``: a call (``do_bench``: eager, host work included); ``gpu_ms``: GPU time alone
    (CUDA-graph replay); on a CPU one wall-clock call, meaningless."""
    from neptune_fusion.bench.timing import gpu_timer, graph_timer, wall_timer
    if device == "cuda":
        return {"ms": gpu_timer(), "gpu_ms": graph_timer()}
    return {"ms": wall_timer()}


def kernels(call, device: str, top: int = 8) -> list:
    """``[[kernel, microseconds per call], ...]``: the ``top`` GPU kernels of one call by
    time (torch.profiler over five calls); on a CPU, ``[]``."""
    if device != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    return [[e.key[:80], round(e.device_time_total / 5, 1)] for e in rows[:top]]


def first_call(call, args, device: str):
    """``(output, seconds)`` of a call, waited for on a GPU: a compile when one happens."""
    t0 = time.perf_counter()
    out = call(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def graphs_of(provider) -> int:
    """Graphs compiled so far: the jit's backend reports one per graph; Inductor's count
    is Dynamo's."""
    backend = getattr(provider, "backend", None)
    if backend is not None:
        return len(backend.reports)
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def run(name: str, device: str, profile: bool = False) -> list[dict]:
    fn, big, small_sizes, make = WORK[name]
    small = device != "cuda"
    dtype = torch.float16 if device == "cuda" else torch.float32
    sizes = small_sizes if small else big
    torch._dynamo.reset()
    # the three providers' graphs share fn's one Dynamo cache: past its recompile limit a
    # call ran eagerly without a word (decode 16384's static column on 2026-12-03)
    raise_recompile_limits()
    from torch._dynamo.utils import counters
    counters.clear()
    providers = {"jit": jit(fn), "inductor": torch.compile(fn),
                 "jit-static": jit(fn, dynamic=False)}
    time_of = timers(device)
    rows = []
    for n in sizes:
        gen = torch.Generator(device=device)
        gen.manual_seed(1000 + n)
        args = make(n, dtype, device, gen, small)
        ref = fn(*float64(args))
        for pname, compiled in providers.items():
            out, first = first_call(compiled, args, device)
            err = float((out.double() - ref).norm() / ref.norm())
            reports = getattr(getattr(compiled, "backend", None), "reports", None)
            row = {"work": name, "size": n, "provider": pname, "first_call_s": round(first, 3),
                   "graphs": graphs_of(compiled), "rel_err": err,
                   # chains fused in the newest graph (the one this size runs)
                   "fused": len(reports[-1].fused) if reports else None}
            row |= {k: t(lambda c=compiled, a=args: c(*a)) for k, t in time_of.items()}
            if profile:
                row["kernels"] = kernels(lambda c=compiled, a=args: c(*a), device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Per size: GPU time (``gpu_ms``, CUDA-graph replay) where measured, else ``ms``."""
    key = "gpu_ms" if all("gpu_ms" in r for r in rows) else "ms"
    out = [f"| work | size | jit {key} | jit / static | inductor / jit | jit ms (eager call) "
           "| jit first call s | jit graphs | fused | static first call s | "
           "inductor first call s | jit rel. err |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["work"], r["size"], r["provider"]): r for r in rows}
    for (work, size, p), r in by.items():
        if p != "jit":
            continue
        s, i = by[(work, size, "jit-static")], by[(work, size, "inductor")]
        out.append(f"| {work} | {size} | {r[key]:.4f} | {r[key] / s[key]:.3f} | "
                   f"{i[key] / r[key]:.2f} | {r['ms']:.4f} | {r['first_call_s']:.2f} | "
                   f"{r['graphs']} | "
                   f"{r['fused']} | "
                   f"{s['first_call_s']:.2f} | {i['first_call_s']:.2f} | {r['rel_err']:.1e} |")
    return "\n".join(out)


def cli(work: dict, run, table, description: str) -> None:
    """The command line of this script and of its siblings (``jit_modules.py``): run the
    chosen ``--work`` items, print the table, write the rows."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--work", default=",".join(work), help=f"of {', '.join(work)}")
    ap.add_argument("--out", help="rows as JSON lines (a .md table beside it)")
    ap.add_argument("--profile", action="store_true",
                    help="add each provider's slowest GPU kernels to its row (``kernels``: "
                         "name, microseconds per call; torch.profiler)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    unknown = set(a.work.split(",")) - set(work)
    if unknown:
        sys.exit(f"unknown --work {', '.join(sorted(unknown))}: choose from {', '.join(work)}")
    rows = [r for w in a.work.split(",") for r in run(w, device, a.profile)]
    text = table(rows)
    print(text)
    if a.out:
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        Path(a.out).with_suffix(".md").write_text(text + "\n")


def main() -> None:
    cli(WORK, run, table, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
