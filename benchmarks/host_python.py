"""Our Python per attention call, with the kernel launches stubbed (runs on any CPU).

Usage:
    PYTHONPATH=src python benchmarks/host_python.py [--ops DC-GQA,DC-Causal,DC-ALiBi] \
        [--seq 4096] [--calls 2000] [--profile]

The generated kernels' launches are replaced by no-ops (the Triton functions by a stub,
the interpreter's set-up by nothing), so what is timed is the host code of one call of
ours: keyword handling, signature and cache lookups, allocations, argument lists. CPU
tensors take the interpreter's launch path (no alignment check, stream or device
lookup: a few hundred nanoseconds of the CUDA path are not here); on a GPU,
``benchmarks/host_overhead.py`` times the real thing. Per operator (decode, explicit
split-k: two launches per call, as on the H200), A/B in one process:

* eager ``ops.attention``: the general path (bound calls switched off: the path before
  the lean eager call), then as it is (bound once per signature, BoundCalls);
* the prepared call (``ops.prepare``, i.e. ``nf.prepare_attention``);
* the torch ops as a compiled graph calls them (the handle a constant, the launch bound
  at the signature's first call): ``neptune_fusion::attention`` (the custom op with its
  autograd wrapper: what a graph traced for training calls), ``attention_infer`` (what a
  graph traced without gradients calls) and the Python behind both (the entry's ``run``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import time

import torch

from neptune_fusion import ops
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators
from neptune_fusion.frontend import attention as attention_mod
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.runtime import kernel as kernel_mod
from neptune_fusion.runtime import loader, torch_ops
from neptune_fusion.schedule.schedule import Schedule

SPLIT = Schedule(block_m=16, block_n=64, num_warps=4, strategy="split", splits=8)


class _NoLaunch:
    """A generated kernel whose launches do nothing: ``fn[grid](*args, **opts)``."""

    def __getitem__(self, grid):
        return _nothing


def _nothing(*args, **kwargs):
    return None


@contextlib.contextmanager
def stubbed_launches():
    """Every generated kernel loaded from here on launches nothing."""
    saved = (kernel_mod.Kernel._function, kernel_mod.interpreted_launch,
             loader.interpreted_launch)
    stub = _NoLaunch()
    kernel_mod.Kernel._function = lambda self, k, interpret: stub
    kernel_mod.interpreted_launch = loader.interpreted_launch = contextlib.nullcontext
    try:
        yield
    finally:
        (kernel_mod.Kernel._function, kernel_mod.interpreted_launch,
         loader.interpreted_launch) = saved


@contextlib.contextmanager
def unbound(cache: AttentionCache):
    """Eager calls and the op on their general paths (no bound call)."""
    bound = getattr(cache, "bound", None)   # None: code from before the bound call
    saved_max = attention_mod.OP_PREPARED_MAX_QUERIES
    if bound is not None:
        bound.call = lambda *a, **k: None
    attention_mod.OP_PREPARED_MAX_QUERIES = -1
    try:
        yield
    finally:
        if bound is not None:
            del bound.call   # the method again
        attention_mod.OP_PREPARED_MAX_QUERIES = saved_max


def per_call_us(fn, calls: int, repeats: int = 5, sync=lambda: None) -> float:
    """The best of ``repeats`` loops of ``calls`` calls, per call; ``sync`` runs after
    the warm-up and after each loop (on a GPU: wall time per call when it is the bound)."""
    for _ in range(20):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def run_op(name: str, seq: int, calls: int, profile: bool) -> None:
    (op,) = select_operators([name])
    kw = attention_options(op, seq, "cpu")
    q, k, v = make_inputs(op, seq, torch.float16, "cpu")
    cache = AttentionCache(store=False)
    kw["schedule"] = SPLIT

    def eager():
        return ops.attention(q, k, v, cache=cache, **kw)
    nkw = ops._keywords(q, k, kw["scale"], kw["causal"], kw["q_start"],
                        kw["alibi_slopes"], kw["softcap"], kw["window"], cache, SPLIT)

    # the ops as a compiled graph calls them: the handle is the graph's constant
    key = torch_ops.constant_key
    names = None if nkw["buffers"] is None else tuple(nkw["buffers"])
    bufs = [] if names is None else [nkw["buffers"][n] for n in names]
    h = torch_ops.handle(attention_mod._OpEntry, key(nkw["score_mod"]), key(nkw["mask_mod"]),
                         nkw["scale"], nkw["enable_gqa"], nkw["q_offset"], names, key(cache),
                         key(SPLIT), (False, False))

    def op_call():   # the custom op, with its autograd wrapper (what training traces)
        return torch.ops.neptune_fusion.attention(q, k, v, bufs, h)

    def infer_call():   # what a graph traced without gradients calls
        return torch.ops.neptune_fusion.attention_infer(q, k, v, bufs, h)
    eager()
    launches = len(cache.kernels()[0].specs) if hasattr(cache.kernels()[0], "specs") \
        else "?"
    print(f"{op.name} S={seq} fp16 q {tuple(q.shape)} k {tuple(k.shape)}, {launches} "
          "launches per call (stubbed)")
    with unbound(cache):
        general = per_call_us(eager, calls)
    bound = per_call_us(eager, calls)
    prepared = ops.prepare(q, k, v, cache=cache, **kw)
    prep = per_call_us(lambda: prepared(q, k, v), calls)
    op_bound = per_call_us(op_call, calls)
    infer_bound = per_call_us(infer_call, calls)
    run = torch_ops.entry(h).run
    entry_bound = per_call_us(lambda: run([q, k, v, *bufs]), calls)
    print(f"  eager, general path (before) {general:7.1f} us/call")
    hits = cache.bound.hits if hasattr(cache, "bound") else "no"
    print(f"  eager, bound (after)         {bound:7.1f} us/call  ({hits} bound calls)")
    print(f"  prepared call                {prep:7.1f} us/call")
    print(f"  torch op attention           {op_bound:7.1f} us/call  (bound launch)")
    print(f"  torch op attention_infer     {infer_bound:7.1f} us/call  (bound launch)")
    print(f"  the ops' Python (entry.run)  {entry_bound:7.1f} us/call")
    if profile:
        for label, fn in (("eager", eager), ("prepared", lambda: prepared(q, k, v))):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(calls):
                fn()
            pr.disable()
            print(f"  --- {label}: {calls} calls")
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="DC-GQA,DC-Causal,DC-ALiBi")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}; Python per call with launches stubbed "
          "(CPU tensors, interpreter path)")
    with stubbed_launches():
        for name in args.ops.split(","):
            run_op(name, args.seq, args.calls, args.profile)


if __name__ == "__main__":
    main()
