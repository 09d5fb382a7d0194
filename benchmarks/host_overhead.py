"""Host time per ``ops.attention`` call, where it goes, and both launch paths checked.

Usage on a GPU:
    PYTHONPATH=src python benchmarks/host_overhead.py [--ops DC-GQA,DC-Causal] \
        [--seq 16384] [--profile]

Per operator: the launch path in use (Triton's dispatch, or the compiled kernels' own
launchers, runtime/launcher.py: ``raw (flat layout)`` on Triton 3.6, ``raw (tuple
layout)`` on 3.9, else ``run`` or ``runner``); outputs on fresh random inputs checked
against float64 through the direct path, through Triton's dispatch (a new cache: the
first call) -- the two must be bit-identical -- and with inputs 2 bytes off 16-byte
alignment (dispatch path).
Then times per call: the whole eager call in a loop (host-bound when the kernels are
short), first with every launch through Triton's dispatch (the path before
runtime/launcher.py: an A/B in one process), then on the general path (no call bound per
signature: before the lean eager call), then as it is (bound per signature); the same
with a device synchronisation per call, ``do_bench`` (what the bench's eager column measures) and
CUDA-graph replay (GPU time only), and the same for a prepared call
(``nf.prepare_attention``: signature compare + direct launches). First a yardstick of the
host's speed (a tiny ``torch.add`` and an SDPA decode call, eager) so runs on different
machines compare; with ``--profile`` the functions with the most host time (cProfile).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import time

import torch

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.providers.base import RunContext
from neptune_fusion.bench.providers.sdpa import CUDNN
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.timing import gpu_timer, graph_timer
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.runtime import launcher


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


def launchers(cache: AttentionCache) -> list:
    """The launcher of every CUDA launch step of every call setup in ``cache``."""
    return [step.launcher for auto in cache.kernels() for kern in auto.kernels()
            for setup in kern._setups.values() for step in setup.steps
            if step.launcher is not None]


def launch_paths(cache: AttentionCache) -> str:
    """How the cache's kernel launches go: per path (launcher.direct_runner's: ``raw``
    -- the compiled kernel's C launch function, with the layout of the Triton version --,
    ``run``, ``runner``; or ``dispatch``, Triton's ``fn[grid]``), how many launch steps."""
    paths: dict[str, int] = {}
    for la in launchers(cache):
        paths[la.path] = paths.get(la.path, 0) + 1
    return ", ".join(f"{n} {p}" for p, n in sorted(paths.items())) or "none"


@contextlib.contextmanager
def dispatch_only(cache: AttentionCache):
    """Every launch through Triton's dispatch with per-tensor workspaces (the launch path
    before runtime/launcher.py), for an A/B in one process."""
    found = launchers(cache)
    kept = [la.direct for la in found]
    saved = launcher.direct_runner
    launcher.direct_runner = lambda compiled, grid: None
    for la in found:
        la.direct = None
    try:
        with general_only(cache):
            yield
    finally:
        launcher.direct_runner = saved
        for la, direct in zip(found, kept):
            la.direct = direct


@contextlib.contextmanager
def general_only(cache: AttentionCache):
    """Eager calls on the general path: no call bound per signature (the eager path
    before frontend/bound.py BoundCalls), for an A/B in one process."""
    saved = cache.bound.call
    cache.bound.call = lambda *args, **kwargs: None
    try:
        yield
    finally:
        cache.bound.call = saved


def bound_paths(cache: AttentionCache) -> str:
    """The launch paths of the cache's bound eager calls (runtime/prepared.py; a prepared
    call binds the same launchers)."""
    paths = {run.path for got in cache.bound._table.values() if isinstance(got, tuple)
             for run, _, _ in got[0]._launches}
    return ", ".join(sorted(paths)) or "none bound"


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose address is 2 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


def run_op(name: str, seq: int, profile: bool) -> None:
    (op,) = select_operators([name])
    dev = torch.device("cuda")
    kw = attention_options(op, seq, dev)
    q, k, v = make_inputs(op, seq, torch.float16, dev)
    cache = AttentionCache()

    def call():
        return ops.attention(q, k, v, cache=cache, **kw)
    call()
    call()
    (auto,) = cache.kernels()
    print(f"{op.name} S={seq}: {auto.last_choice.schedule}")
    print(f"  launches: {launch_paths(cache)}")
    q2, k2, v2 = make_inputs(op, seq, torch.float16, dev)   # fresh random data
    ref = reference_attention(op, q2, k2, v2)
    with general_only(cache):
        direct = ops.attention(q2, k2, v2, cache=cache, **kw)
    fresh = AttentionCache()                                 # first call: dispatch
    dispatched = ops.attention(q2, k2, v2, cache=fresh, **kw)
    off = ops.attention(q2, unaligned(k2), unaligned(v2), cache=cache, **kw)
    print(f"  rel. error: direct {relative_error(direct, ref):.1e}, dispatch "
          f"{relative_error(dispatched, ref):.1e} (bit-identical: "
          f"{torch.equal(direct, dispatched)}), unaligned k, v "
          f"{relative_error(off, ref):.1e}")
    with dispatch_only(cache):
        print(f"  eager loop, Triton's dispatch only (before launcher.py): "
              f"{per_call_us(call):8.1f} us/call")
    with general_only(cache):
        print(f"  eager loop, general path (before the bound eager call): "
              f"{per_call_us(call):8.1f} us/call")
    print(f"  eager loop (bound per signature) {per_call_us(call):8.1f} us/call "
          f"({cache.bound.hits} bound calls)")
    bound = ops.attention(q2, k2, v2, cache=cache, **kw)
    print(f"  bound eager: rel. error {relative_error(bound, ref):.1e} (bit-identical to "
          f"the general path: {torch.equal(bound, direct)})")
    print(f"  bound calls launch by: {bound_paths(cache)}")
    run = ops.prepare(q, k, v, cache=cache, **kw)   # nf.prepare_attention
    prepared = run(q2, k2, v2)
    print(f"  prepared: rel. error {relative_error(prepared, ref):.1e} (bit-identical to "
          f"direct: {torch.equal(prepared, direct)})")
    print(f"  prepared call      {per_call_us(lambda: run(q, k, v)):8.1f} us/call")
    print(f"  prepared + sync    {per_call_us(lambda: run(q, k, v), sync_each=True):8.1f} "
          "us/call")
    print(f"  prepared do_bench  {gpu_timer()(lambda: run(q, k, v)) * 1e3:8.1f} us")
    got = CUDNN.prepare(op, q, k, v, RunContext(dev, torch.float16, gpu_timer()))
    if hasattr(got, "fn"):
        print(f"  cuDNN (SDPA) eager {per_call_us(got.fn):8.1f} us/call, do_bench "
              f"{gpu_timer()(got.fn) * 1e3:8.1f} us, graph replay "
              f"{graph_timer(rep_ms=20)(got.fn) * 1e3:8.1f} us")
    else:
        print(f"  cuDNN (SDPA): {got.reason}")
    print(f"  eager + sync each  {per_call_us(call, sync_each=True):8.1f} us/call")
    print(f"  do_bench           {gpu_timer()(call) * 1e3:8.1f} us")
    print(f"  graph replay       {graph_timer(rep_ms=20)(call) * 1e3:8.1f} us")
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            call()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


def host_yardstick() -> None:
    """This host's speed, to compare runs on different machines: PyTorch's own eager
    launch of a tiny add, and SDPA's (cuDNN's) eager decode call."""
    a = torch.randn(8, device="cuda")
    out = torch.empty_like(a)
    print(f"host yardstick: torch.add(out=) {per_call_us(lambda: torch.add(a, a, out=out)):.1f}"
          " us/call", end="")
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.float16)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"; SDPA GQA decode {per_call_us(lambda: sdpa(q, k, k, enable_gqa=True)):.1f} us/call")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="DC-GQA")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    host_yardstick()
    for name in args.ops.split(","):
        run_op(name, args.seq, args.profile)


if __name__ == "__main__":
    main()
