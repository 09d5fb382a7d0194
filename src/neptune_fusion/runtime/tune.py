"""Measuring candidate schedules on the GPU: the autotuner's inner loop.

:func:`measure` takes the cost model's best few schedules and, for each: builds the kernel
(a schedule the code generator or the device refuses is dropped with its reason), checks
it once against the float64 reference on a small fresh random problem of the same shape
class (a wrong candidate may never win), runs it on the caller's tensors -- comparing its
output with the first candidate's -- and times it as GPU time: replayed from a CUDA graph
(``triton.testing.do_bench_cudagraph``, median), so host launch overhead, the same for
every schedule, does not drown the differences of short (decode) kernels; then once more
in reverse order, each candidate's time the mean of its two (a clock drifting over the
tuning cancels). The fastest correct candidate wins.

The check problem keeps every symbolic size that is at most 96 and replaces a larger one
by ``80 + size % 16``: tiles still end ragged, and Triton's integer specialisation
(divisible by 16 or not) is the same as at the real size, so the check launches the very
binary that is timed. Static sizes (Python ints) cannot shrink -- the program is compiled
for them -- so the float64 reference is never evaluated whole on the host: it is computed
once, before the candidates run, at a sample of output elements within a fixed element
budget (:mod:`neptune_fusion.reference.sample`: the whole output when it fits, else a few
indices per output axis, always the last one), and each candidate's output is compared
there. The inputs of the check are drawn on the candidates' device and read element by
element, so host memory stays bounded whatever the problem size.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace

from ..errors import NeptuneError
from ..schedule.schedule import Schedule

# relative tolerance of a candidate against float64, by the precision it computes in
# (fp32 accumulation; see check_dtypes)
TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 2e-3}


def check_dtypes(outputs) -> list[str]:
    """Per output, the dtype whose tolerance it is checked at: the least precise of its
    own and of the floating inputs it reads. A float32 output of 16-bit inputs is
    computed with 16-bit operands inside (attention's gradients round ``p`` and ``dS``
    to the inputs' dtype for the tensor cores): checked at float32's tolerance, the
    bfloat16 gradient kernels failed it on 5 of 6 random check problems (2026-12-06)."""
    from ..ir.graph import placeholders
    got = []
    for o in outputs:
        names = [o.dtype.name] + [p.dtype.name for p in placeholders([o])]
        known = [n for n in names if n in TOLERANCE]
        got.append(max(known, key=TOLERANCE.__getitem__) if known else o.dtype.name)
    return got


@dataclass(frozen=True)
class Trial:
    """One candidate: the model's estimate, and what measuring it gave."""

    schedule: Schedule
    predicted_s: float
    measured_s: float | None = None   # None: not measured (CPU, or it failed)
    error: str | None = None          # why it was dropped
    spent_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # build+compile, checks, timing
    note: str | None = None           # e.g. why the reference check was skipped


def check_sizes(sizes: dict) -> dict:
    """The sizes of the small check problem (see module docstring)."""
    return {s: (v if v <= 96 else 80 + v % 16) for s, v in sizes.items()}


def random_inputs(inputs, sizes: dict, device, seed: int):
    """Fresh random tensors for ``inputs`` under ``sizes`` (floats N(0, 1), ints 0/1),
    drawn on ``device`` (a full-size static input never passes through the host)."""
    import torch
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for p in inputs:
        shape = tuple(sizes[d] if not isinstance(d, int) else d for d in p.shape)
        dt = getattr(torch, p.dtype.name)
        if dt.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dt)
        else:
            t = torch.randint(0, 2, shape, generator=gen, device=device).to(dt)
        out.append(t)
    return out


def reference_sample(outputs, inputs, tensors, seed: int, budget: int | None = None):
    """The float64 reference of ``outputs`` on ``tensors`` at a sample of output elements
    (:func:`~neptune_fusion.reference.sample.sampled_reference`: bounded host work and
    memory, ``.elements`` says how much)."""
    from ..reference.sample import ELEMENT_BUDGET, TorchSource, sampled_reference
    sources = {p: TorchSource(t) for p, t in zip(inputs, tensors)}
    return sampled_reference(list(outputs), sources, seed=seed,
                             budget=ELEMENT_BUDGET if budget is None else budget)


def taken(tensor, grid):
    """``tensor`` at the sub-grid ``grid`` (one index array per dimension), on the host."""
    import torch
    if not grid:
        return tensor.detach().to("cpu")
    nd = len(grid)
    idx = tuple(torch.as_tensor(g, device=tensor.device).reshape(
        (-1,) + (1,) * (nd - 1 - d)) for d, g in enumerate(grid))
    return tensor[idx].detach().to("cpu")


def check_sample(got, sample, dtypes) -> str | None:
    """None when the outputs ``got`` match the reference ``sample`` where it was taken."""
    return _first(f"reference check: {e}" for g, grid, w, dt
                  in zip(got, sample.grids, sample.values, dtypes)
                  if (e := _close(taken(g, grid), w, dt)))


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
    seed = int(time.time_ns() % (1 << 31))
    feeds = random_inputs(inputs, small, device, seed=seed)
    want = reference_sample(outputs, inputs, feeds, seed)
    dtypes = check_dtypes(outputs)
    trials: list[Trial] = []
    timed = []   # (trial index, kernel) of the candidates timed once
    first = None
    warm = first_launches(build, [e.schedule for e in ranked[:top_k]], feeds,
                          threads=device.type == "cuda")
    for est in ranked[:top_k]:
        s, error, secs = est.schedule, None, None
        marks = [time.perf_counter()]
        try:
            done = warm.get(s)
            if isinstance(done, BaseException):
                raise done
            if done is None:
                kern = build(s)
                got = kern.launch(*feeds).outputs       # the first launch compiles
            else:
                kern, got, compile_s = done
                marks[0] -= compile_s                   # its share of the pooled compile
            torch.cuda.synchronize(device)
            marks.append(time.perf_counter())
            error = None if want.skipped else check_sample(got, want, dtypes)
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
                timed.append((len(trials), kern))
        except NeptuneError as err:
            error = str(err)
        except Exception as err:  # noqa: BLE001 - e.g. Triton out of resources
            text = str(err).strip().splitlines()
            error = f"{type(err).__name__}: {text[0] if text else ''}"
        marks += [time.perf_counter()] * (4 - len(marks))
        spent = tuple(b - a for a, b in zip(marks, marks[1:]))
        trial = Trial(s, est.seconds, secs if error is None else None, error, spent,
                      want.skipped)
        trials.append(trial)
        if on_step is not None:
            on_step(trial)
    # a second timing in reverse order, each candidate's time the mean of its two: a
    # drift of the GPU's clock over the tuning (it warms up) cancels out instead of
    # favouring the candidates timed first (docs/scheduling.md, "Timing order")
    for i, kern in reversed(timed):
        try:
            again = do_bench_cudagraph(lambda k=kern: k.launch(*tensors), rep=20,
                                       return_mode="median") * 1e-3
        except Exception:  # noqa: BLE001 - it ran once; keep that time
            continue
        t = trials[i]
        trials[i] = replace(t, measured_s=(t.measured_s + again) / 2)
    torch.cuda.synchronize(device)
    return trials


def first_launches(build, schedules, feeds, threads: bool = True) -> dict:
    """Build every candidate (here: lowering is Python), then run the first launch of
    each generated kernel -- Triton's compile -- in a thread each (``threads``; on the
    interpreter the caller launches them in order): Triton compiles outside the GIL for
    most of the time (LLVM, ptxas), so four GEMM-shaped candidates took 2.6-2.9 s
    together instead of 5.7-6.6 s one after another on the H200 host, four softmax
    candidates 2.0 s instead of 2.7-3.0 s (benchmarks/results/2026-12-01-h200-projections).
    ``{schedule: (kernel, outputs, compile seconds) or the exception}``; a kernel of
    another kind (a library schedule, whose first call tunes its own operands) is left to
    the caller (absent)."""
    from concurrent.futures import ThreadPoolExecutor
    built: dict = {}
    for s in schedules:
        try:
            built[s] = build(s)
        except Exception as err:  # noqa: BLE001 - reported by the caller, per candidate
            built[s] = err
    pooled = [s for s, k in built.items() if hasattr(k, "specs")]

    def launch(s):
        t0 = time.perf_counter()
        try:
            return built[s], built[s].launch(*feeds).outputs, time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - reported by the caller, per candidate
            return err
    out = {s: k for s, k in built.items() if isinstance(k, BaseException)}
    if threads and len(pooled) > 1:
        with ThreadPoolExecutor(len(pooled)) as pool:
            out.update(zip(pooled, pool.map(launch, pooled)))
    return out


def _first(items):
    return next(iter(items), None)


class SlowKernelWarning(UserWarning):
    """The fastest measured schedule ran far slower than the cost model predicts: a sign
    of a code-generation problem, not of a poor tile (:func:`far_off`)."""


SLOW_FACTOR = 4.0    # measured over predicted beyond which a choice is reported
SLOW_FLOOR_S = 5e-5  # below it a launch's fixed cost can be the whole of a kernel


def far_off(t: Trial) -> bool:
    """Whether ``t`` (the chosen trial) took over :data:`SLOW_FACTOR` times the model's
    estimate and over 50 us. Of the 248 choices in the tuner logs kept under
    ``benchmarks/results`` (2026-11-30 to 12-05), every one of sound code measured
    within 2x of its estimate; the five beyond 4x were each a code-generation bug found
    later by other means: a ragged batch's masked ``P @ V`` emulated in fp32 (6x), the
    backward's d_q through a 1 GiB workspace (5.7x), and a training forward's epilogue
    that stored one column a step (39-74x, an H100, 2026-12-05)."""
    return t.measured_s is not None and t.predicted_s > 0 and \
        t.measured_s > SLOW_FLOOR_S and t.measured_s > SLOW_FACTOR * t.predicted_s


def failures(trials: list[Trial]) -> str:
    """Why every trial failed, one clause per distinct reason with the schedules it hit
    (four candidates refused for one reason read as one clause, not four)."""
    by_reason: dict[str, list[str]] = {}
    for t in trials:
        by_reason.setdefault(t.error or "not measured", []).append(t.schedule.brief())
    return "; ".join(f"{why} ({', '.join(briefs)})" for why, briefs in by_reason.items())


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
        table.add_row("*" if s == chosen else "",
                      s.strategy + (" (walks rows)" if s.row_programs else "")
                      + ("" if s.dialect == "triton" else f", {s.dialect}"), str(s.block_m),
                      str(s.block_n), str(s.splits), str(s.num_warps), str(s.num_stages),
                      f"{t.predicted_s * 1e3:.4f}",
                      "" if t.measured_s is None else f"{t.measured_s * 1e3:.4f}",
                      *(f"{x:.2f}" for x in t.spent_s), t.error or t.note or "")
    Console(file=stream or sys.stderr, width=160).print(table)
