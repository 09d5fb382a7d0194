"""Timers and the hardware ceilings measured in the same run, shared by the harness and
the scripts in ``benchmarks/``.

On a GPU every harness time is the median of ``triton.testing.do_bench`` (which runs the
callable once, estimates its time, warms up for ``warmup`` ms and clears the L2 cache
before each of the timed repetitions within ``rep`` ms): :func:`gpu_timer`.
:func:`graph_timer` times GPU work alone (CUDA-graph replay, no host overhead), for the
scripts that separate the two. The CPU smoke run uses a wall-clock timer whose numbers
mean nothing and are never printed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .providers.base import Timer

MATMUL_N = 8192
COPY_BYTES = 1 << 30  # 1 GiB source: far beyond the 60 MiB L2 of an H200.


def gpu_timer(warmup_ms: int = 25, rep_ms: int = 100) -> Timer:
    """Median milliseconds from ``triton.testing.do_bench``."""
    from triton.testing import do_bench

    def timer(fn: Callable[[], object]) -> float:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return timer


TIMERS = {"bench": "median of triton's do_bench over eager calls (L2 cleared before each, "
                   "launch included)",
          "graph": "median of CUDA-graph replays (GPU time alone, no launch or host work)"}
"""The ``--timer`` kinds and how a report names them."""


def graph_timer(rep_ms: int = 100) -> Timer:
    """Median milliseconds of ``fn`` replayed from a CUDA graph
    (``triton.testing.do_bench_cudagraph``): GPU time only, no launch or Python overhead."""
    from triton.testing import do_bench_cudagraph

    def timer(fn: Callable[[], object]) -> float:
        return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    return timer


def wall_timer(repeats: int = 1) -> Timer:
    """Median wall-clock milliseconds of ``repeats`` calls, no warm-up (CPU smoke: the
    runner's first call already compiled, and these numbers are never reported as speed)."""
    def timer(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return timer


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class Ceilings:
    """Measured peak rates: fp16 matmul (TFLOP/s) and device-to-device copy (TB/s)."""

    matmul_tflops: float | None
    copy_tbps: float | None
    matmul_shape: tuple[int, int, int] = (MATMUL_N, MATMUL_N, MATMUL_N)
    copy_bytes: int = COPY_BYTES


def matmul_tflops(timer: Timer, device: torch.device, n: int = MATMUL_N) -> float:
    """TFLOP/s of an n x n x n fp16 matmul (2 n^3 FLOP) with fp32 accumulation."""
    a = torch.randn((n, n), device=device, dtype=torch.float16)
    b = torch.randn((n, n), device=device, dtype=torch.float16)
    ms = timer(lambda: a @ b)
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def copy_tbps(timer: Timer, device: torch.device, nbytes: int = COPY_BYTES) -> float:
    """TB/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2.0 * nbytes / (ms * 1e-3) / 1e12


def measure_ceilings(timer: Timer, device: torch.device) -> Ceilings:
    """Both ceilings, measured with the same timer as the operators."""
    return Ceilings(matmul_tflops(timer, device), copy_tbps(timer, device))
