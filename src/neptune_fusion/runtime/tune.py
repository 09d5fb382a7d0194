"""Measuring candidate schedules on the GPU: the autotuner's inner loop.

:func:`measure` takes the cost model's best few schedules and, for each: builds the kernel
(a schedule the code generator or the device refuses is dropped with its reason), checks
it once against the float64 reference on a small fresh random problem of the same shape
class (a wrong candidate may never win), runs it on the caller's tensors -- comparing its
output with the first candidate's -- and times it as GPU time: replayed from a CUDA graph
(``triton.testing.do_bench_cudagraph``, median), so host launch overhead, the same for
every schedule, does not drown the differences of short (decode) kernels. The fastest
correct candidate wins.

The small check problem keeps every size that is at most 96 and replaces a larger one by
``80 + size % 16``: tiles still end ragged, and Triton's integer specialisation (divisible
by 16 or not) is the same as at the real size, so the check launches the very binary that
is timed.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from ..errors import NeptuneError
from ..schedule.schedule import Schedule

# relative tolerance of a candidate against float64, by input dtype (fp32 accumulation)
TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 2e-3}


@dataclass(frozen=True)
class Trial:
    """One candidate: the model's estimate, and what measuring it gave."""

    schedule: Schedule
    predicted_s: float
    measured_s: float | None = None   # None: not measured (CPU, or it failed)
    error: str | None = None          # why it was dropped
    spent_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # build+compile, checks, timing


def check_sizes(sizes: dict) -> dict:
    """The sizes of the small check problem (see module docstring)."""
    return {s: (v if v <= 96 else 80 + v % 16) for s, v in sizes.items()}


def random_inputs(inputs, sizes: dict, device, seed: int):
    """Fresh random tensors for ``inputs`` under ``sizes`` (floats N(0, 1), ints 0/1)."""
    import torch
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for p in inputs:
        shape = tuple(sizes[d] if not isinstance(d, int) else d for d in p.shape)
        dt = getattr(torch, p.dtype.name)
        if dt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dt)
        else:
            t = torch.randint(0, 2, shape, generator=gen).to(dt)
        out.append(t.to(device))
    return out


def reference_outputs(outputs, inputs, tensors) -> list:
    """The float64 reference (``nf.evaluate``) of ``outputs`` on ``tensors``."""
    from ..api import evaluate
    got = evaluate(list(outputs), dict(zip(inputs, tensors)))
    return list(got)


def _close(got, want, dtype: str) -> str | None:
    """None when ``got`` matches ``want`` to the dtype's tolerance, else why not."""
    import torch
    g = got.detach().to("cpu", torch.float64)
    w = torch.as_tensor(want, dtype=torch.float64)
    if g.shape != w.shape:
        return f"shape {tuple(g.shape)} != {tuple(w.shape)}"
    finite = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), finite):
        return "non-finite values where the reference has finite ones (or the reverse)"
    tol = TOLERANCE.get(dtype, 2e-2)
    scale = max(1.0, float(w[finite].abs().max()) if finite.any() else 1.0)
    err = float((g[finite] - w[finite]).abs().max()) if finite.any() else 0.0
    return None if err <= tol * scale else f"max error {err:.3g} > {tol * scale:.3g}"


def _agree(got, want, dtype: str) -> str | None:
    """Like :func:`_close` for two candidates' outputs, computed on their device (the
    real-size outputs are large: copying them to the host cost seconds per candidate)."""
    import torch
    g, w = got.float(), want.float()
    finite = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), finite):
        return "non-finite values where the other has finite ones (or the reverse)"
    tol = TOLERANCE.get(dtype, 2e-2)
    g, w = g.masked_fill(~finite, 0.0), w.masked_fill(~finite, 0.0)
    scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
    err = float((g - w).abs().max()) if w.numel() else 0.0
    return None if err <= tol * scale else f"max difference {err:.3g} > {tol * scale:.3g}"


def measure(build, ranked, tensors, *, inputs, outputs, sizes: dict, top_k: int,
            on_step=None) -> list[Trial]:
    """Measure the first ``top_k`` of ``ranked`` (cost-model estimates) on ``tensors``.

    ``build(schedule)`` returns a :class:`~neptune_fusion.runtime.kernel.Kernel`;
    ``on_step(trial)`` is called after each candidate (the progress bar). Returns one
    :class:`Trial` per candidate, in the order tried.
    """
    import torch
    from triton.testing import do_bench_cudagraph
    device = tensors[0].device
    small = check_sizes(sizes)
    feeds = random_inputs(inputs, small, device, seed=int(time.time_ns() % (1 << 31)))
    want = reference_outputs(outputs, inputs, feeds)
    dtypes = [o.dtype.name for o in outputs]
    trials: list[Trial] = []
    first = None
    for est in ranked[:top_k]:
        s, error, secs = est.schedule, None, None
        marks = [time.perf_counter()]
        try:
            kern = build(s)
            got = kern.launch(*feeds).outputs       # the first launch compiles
            torch.cuda.synchronize(device)
            marks.append(time.perf_counter())
            error = _first(f"reference check: {e}" for g, w, dt in zip(got, want, dtypes)
                           if (e := _close(g, w, dt)))
            if error is None:
                out = kern.launch(*tensors).outputs
                first = out if first is None else first
                error = _first(f"disagrees with the first candidate: {e}"
                               for a, b, dt in zip(out, first, dtypes)
                               if (e := _agree(a, b, dt)))
            torch.cuda.synchronize(device)
            marks.append(time.perf_counter())
            if error is None:
                secs = do_bench_cudagraph(lambda k=kern: k.launch(*tensors), rep=20,
                                          return_mode="median") * 1e-3
        except NeptuneError as err:
            error = str(err)
        except Exception as err:  # noqa: BLE001 - e.g. Triton out of resources
            text = str(err).strip().splitlines()
            error = f"{type(err).__name__}: {text[0] if text else ''}"
        marks += [time.perf_counter()] * (4 - len(marks))
        spent = tuple(b - a for a, b in zip(marks, marks[1:]))
        trial = Trial(s, est.seconds, secs if error is None else None, error, spent)
        trials.append(trial)
        if on_step is not None:
            on_step(trial)
    torch.cuda.synchronize(device)
    return trials


def _first(items):
    return next(iter(items), None)


def best(trials: list[Trial]) -> Trial | None:
    ok = [t for t in trials if t.measured_s is not None and math.isfinite(t.measured_s)]
    return min(ok, key=lambda t: t.measured_s) if ok else None


def log_trials(title: str, trials: list[Trial], chosen: Schedule, stream=None) -> None:
    """Print the candidates and their times (``NEPTUNE_FUSION_LOG=1``)."""
    from rich.console import Console
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for col in ("", "strategy", "block_m", "block_n", "splits", "warps", "stages",
                "model ms", "measured ms", "compile s", "check s", "time s", "note"):
        table.add_column(col, justify="right" if col.endswith("ms") else "left")
    for t in trials:
        s = t.schedule
        table.add_row("*" if s == chosen else "", s.strategy, str(s.block_m),
                      str(s.block_n), str(s.splits), str(s.num_warps), str(s.num_stages),
                      f"{t.predicted_s * 1e3:.4f}",
                      "" if t.measured_s is None else f"{t.measured_s * 1e3:.4f}",
                      *(f"{x:.2f}" for x in t.spent_s), t.error or "")
    Console(file=stream or sys.stderr, width=160).print(table)
