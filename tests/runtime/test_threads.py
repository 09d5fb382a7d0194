"""Threads (issue 15, finding 2): building definitions, planning and compiling attention
from several threads at once neither deadlocks nor compiles a kernel twice.

Every thread is joined with a timeout, so a hang fails the test instead of hanging CI.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading

import torch

import neptune_fusion as nf
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.ir import nodes
from neptune_fusion.runtime.kernel import Kernel
from neptune_fusion.schedule.schedule import Schedule

TIMEOUT = 120.0  # seconds per join: far above the work's time, far below CI's patience
SMALL = Schedule(block_m=16, block_n=16)


def run_threads(target, args_list) -> list:
    """Run ``target(*args)`` per entry in its own (daemon) thread; the results in order.
    A thread still alive after TIMEOUT fails the test; an exception is re-raised."""
    results: list = [None] * len(args_list)
    errors: list = []
    start = threading.Barrier(len(args_list))

    def body(k, args):
        try:
            start.wait(TIMEOUT)
            results[k] = target(*args)
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k, a), daemon=True)
               for k, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads {hung} still running after {TIMEOUT} s: a deadlock"
    if errors:
        raise errors[0]
    return results


def test_ir_memos_take_no_lock():
    """``functools.cached_property`` (Python 3.11) locks per class attribute across all
    instances: nodes shared between threads deadlocked in it."""
    classes = [c for c in vars(nodes).values() if inspect.isclass(c)] + [Kernel]
    offenders = [f"{c.__name__}.{name}" for c in classes for name, v in vars(c).items()
                 if isinstance(v, functools.cached_property)]
    assert offenders == []


def _attention_definition(scale: float):
    N, M, D = nf.sizes("N M D")
    q = nf.placeholder((N, D), name="q")
    k = nf.placeholder((M, D), name="k")
    v = nf.placeholder((M, D), name="v")
    c, j = nf.reduce_axis(D, "c"), nf.reduce_axis(M, "j")
    s = nf.compute((N, M), lambda i, jj: nf.sum(q[i, c] * k[jj, c], c) * scale, name="s")
    m = nf.compute((N,), lambda i: nf.max(s[i, j], j), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(s[i, j] - m[i]), j), name="l")  # noqa: E741
    return nf.compute((N, D), lambda i, e: nf.sum(nf.exp(s[i, j] - m[i]) * v[j, e], j)
                      / l[i], name="o")


def _build_and_plan(seed: int, rounds: int) -> list[str]:
    return [str(nf.plan(_attention_definition(0.125 * (1 + seed + r))))
            for r in range(rounds)]


def test_threads_build_definitions_and_plan():
    """Four threads, each building definitions and planning them five times, many rounds
    (this hung within a few rounds when the IR memoised with cached_property)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per round
    try:
        for _ in range(8):
            got = run_threads(_build_and_plan, [(t, 5) for t in range(4)])
            assert all(len(p) == 5 for p in got)
    finally:
        sys.setswitchinterval(old)
    alone = _build_and_plan(0, 1)[0]
    assert got[0][0] == alone  # a plan made among threads is the plan made alone


def _reference(q, k, v, scale):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    return torch.softmax(s, -1) @ v.double()


def _attend(cache, scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 17, 16, generator=g) for _ in range(3))
    out = attention(q, k, v, scale=scale, cache=cache, schedule=SMALL)
    return float((out.double() - _reference(q, k, v, scale)).abs().max())


def test_threads_compile_new_attention_kernels():
    """Four threads each asking one shared cache for a new kernel (a new scale each)."""
    cache = AttentionCache(store=False)
    errs = run_threads(_attend, [(cache, 0.1 * (t + 1), t) for t in range(4)])
    assert max(errs) < 1e-4, errs
    assert (len(cache), cache.misses) == (4, 4)


def test_threads_asking_for_one_kernel_compile_it_once():
    cache = AttentionCache(store=False)
    errs = run_threads(_attend, [(cache, 0.3, t) for t in range(4)])
    assert max(errs) < 1e-4, errs
    info = cache.cache_info()
    assert (info.misses, info.hits, info.currsize) == (1, 3, 1)


def test_interning_is_one_node_across_threads():
    """Structural equality is identity: threads building the same node get one node."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for r in range(20):
            got = run_threads(lambda name: [nodes.Size(name) + k for k in range(50)],
                              [(f"T{r}",)] * 4)
            assert all(a is b for row in got[1:] for a, b in zip(got[0], row))
    finally:
        sys.setswitchinterval(old)
